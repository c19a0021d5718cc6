"""The contract between a pass and the pass manager.

A pass is an object with ``name``, ``exact``, ``summary`` and ``run(model, options) -> PassResult``.
``run`` edits the model in place (the manager keeps what it needs for rollback), never runs onnxruntime and
never prints. It first *finds* candidates read-only — every candidate it leaves alone gets a
:class:`Rejection` with a reason — then rewrites what it matched and returns a :class:`Change` per edit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import onnx

from onnx_npu_fix.options import FixOptions


@dataclass
class Change:
    """One edit: which node, what kind of edit, and old -> new values where that means something."""

    node: str
    op: str
    action: str
    old: Any = None
    new: Any = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "op": self.op, "action": self.action}
        if self.old is not None:
            out["old"] = self.old
        if self.new is not None:
            out["new"] = self.new
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class Rejection:
    """A candidate the pass left alone, and why. ``blocking`` means a constraint stays violated."""

    node: str
    op: str
    reason: str
    blocking: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "reason": self.reason, "blocking": self.blocking}


@dataclass
class PassResult:
    changes: list[Change] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    """Pass-specific figures for the report (e.g. MACs before/after, weight bytes added)."""
    warnings: list[str] = field(default_factory=list)
    quantized_tolerance: bool = False
    """Set by an exact pass whose rewrite this run removed a rounding step of a quantized model (e.g. a BN folded
    into a QDQ conv's weight scale): each tensor it rewrote is within a quantization step of the original, not
    bit for bit, and the steps add up through the layers after it. The manager then never reports it exact:
    it is measured alone like an approximate pass (``max_approx_error``), with its outputs' step counts."""

    @property
    def changed(self) -> bool:
        return bool(self.changes)


class Pass:
    """Base class for passes; subclasses set the class attributes and implement :meth:`run`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    exact: ClassVar[bool] = True
    """False for approximate rewrites: validated against ``--max-approx-error`` instead of rtol/atol."""
    keeps_shapes: ClassVar[bool] = False
    """True when every tensor that survives the pass keeps its type and shape (removals and renames only, e.g.
    a BatchNorm folded into its Conv): the manager then reuses the recorded shapes instead of inferring them
    again, unless the pass created a tensor without one. tests/test_pipeline.py checks the claim."""

    def may_change(self, model: onnx.ModelProto, options: FixOptions) -> bool:
        """A cheap read-only look: False when :meth:`run` surely changes nothing here. The manager asks an
        approximate pass first, so that it validates the exact passes before it only when it must (and if a pass
        says False wrongly, its change is still measured alone)."""
        return True

    def run(self, model: onnx.ModelProto, options: FixOptions) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<pass {self.name}>"
