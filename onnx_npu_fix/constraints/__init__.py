"""Constraint checking for ``--check`` and for the re-check after a fixing run: every violation, as data.

- ``table.py``: the one table of constraints (name, limit text, the options that ask for it, its documentation)
  and which of them count in a run; which passes fix each is derived from the passes' own ``fixes``.
- ``checks.py``: the walk over the nodes that finds every violation (:func:`check_model`).
- ``fixed_by.py``: which pass fixes a violation, asked from the candidate passes' read-only finds.
- ``report.py``: violations and the check report as data and text; the shape listing (``--dump-shapes``).

The constraints by ``constraint`` name (stable: they appear in the JSON report), what violates each -> what fixes
it (appended from the table at import):

"""

from __future__ import annotations

from onnx_npu_fix.constraints.checks import check_model, find_violations
from onnx_npu_fix.constraints.report import (
    CheckReport,
    NodeShapes,
    TensorShape,
    Violation,
    judge_violation,
    render_check,
    render_shapes,
    render_violations,
    shape_listing,
    split_requested,
    violations_summary,
)
from onnx_npu_fix.constraints.table import (
    ASKED_BY,
    CONSTRAINT,
    CONSTRAINT_TABLE,
    CONSTRAINTS,
    LIMIT_TEXT,
    Constraint,
    fixed_by_text,
    markdown_table,
    plain_list,
    responsible,
)

__all__ = [
    "ASKED_BY", "CONSTRAINT", "CONSTRAINTS", "CONSTRAINT_TABLE", "LIMIT_TEXT", "CheckReport", "Constraint",
    "NodeShapes", "TensorShape", "Violation", "check_model", "find_violations", "fixed_by_text", "judge_violation",
    "markdown_table", "plain_list", "render_check", "render_shapes", "render_violations", "responsible",
    "shape_listing", "split_requested", "violations_summary",
]

if __doc__:  # None under python -OO
    __doc__ += plain_list() + "\n"
