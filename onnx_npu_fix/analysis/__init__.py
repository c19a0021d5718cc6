"""What npufix measures on a graph without rewriting it: activation liveness and the lowest-peak order
(``schedule``), the memory estimate, ``--split`` planning, where the batch axis is, the cost table and the memory
plot. Below the passes: reorder-memory uses the schedules.
"""
