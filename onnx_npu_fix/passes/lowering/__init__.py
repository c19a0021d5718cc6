"""The lowering rules of ``lower-ops`` (passes/lower_ops.py): one module per op, each with its identity in its
docstring and its rules in ``RULES`` (the forms to try, in order); what they share to write their replacements is
in ``emit.py``."""
