"""What npufix measures and reports without rewriting: the constraint checks (``--check``), the
activation-memory estimate and schedules, ``--split`` planning, the cost table and the memory plot.
"""
