"""What a check finds, as data and as text: a :class:`Violation` per violated constraint at a node, the
:class:`CheckReport` of a model (violations, exempt findings, the memory estimate, the shape listing), their
one-line and summary renderings, which of them count in a run (:func:`split_requested`), and the shape listing
of ``--dump-shapes``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix.analysis.memory import MemoryEstimate, analysis_copy, render_memory
from onnx_npu_fix.analysis.schedule import constant_names
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints.table import ASKED_BY, LIMIT_TEXT
from onnx_npu_fix.ir.graph import GraphIndex, Shape, format_bytes, format_shape


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    return str(value)


@dataclass
class Violation:
    """One violated constraint at one node (or graph input/output).

    ``fixed_by`` is the pass that would fix it, an option such as ``--input-shape``, or None (no pass fixes
    this). ``value`` and ``limit`` are JSON values (numbers, strings, lists).
    """

    node: str
    op: str
    constraint: str
    value: Any
    limit: Any
    fixed_by: str | None
    message: str = ""

    @property
    def fixable(self) -> bool:
        return self.fixed_by is not None

    def text(self) -> str:
        """``node (op): constraint: value vs limit -> fixed by <pass> | no pass fixes this``"""
        if self.constraint in ("sram", "sram-layer"):
            value, limit = format_bytes(self.value), LIMIT_TEXT["sram"].format(format_bytes(self.limit))
        else:
            value = _fmt(self.value)
            limit = LIMIT_TEXT.get(self.constraint, "{}").format(_fmt(self.limit))
        fix = f"fixed by {self.fixed_by}" if self.fixed_by else "no pass fixes this"
        if self.constraint == "sram-layer":  # what would fit is the point of this line
            fix += f"; {self.message}"
        return f"{self.node} ({self.op}): {self.constraint}: {value} vs {limit} -> {fix}"

    __str__ = text

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "constraint": self.constraint, "value": self.value,
                "limit": self.limit, "fixed_by": self.fixed_by, "message": self.message}


@dataclass
class TensorShape:
    name: str
    shape: Shape | None
    dtype: str
    const: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape) if self.shape is not None else None,
                "dtype": self.dtype, "const": self.const}


@dataclass
class NodeShapes:
    """A node with the shapes of what it reads and writes (``--dump-shapes``)."""

    name: str
    op: str
    inputs: list[TensorShape] = field(default_factory=list)
    outputs: list[TensorShape] = field(default_factory=list)

    def text(self) -> str:
        def one(t: TensorShape) -> str:
            return f"{t.name} {format_shape(t.shape)}" + (" (const)" if t.const else "")

        return (f"{self.name} ({self.op}): {', '.join(one(t) for t in self.inputs) or '-'} -> "
                f"{', '.join(one(t) for t in self.outputs) or '-'}")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "op": self.op, "inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs]}


@dataclass
class CheckReport:
    """The result of checking one model: violations, the memory estimate, optionally the shape listing."""

    violations: list[Violation]
    memory: MemoryEstimate | None = None
    shapes: list[NodeShapes] | None = None
    exempt: list[Violation] = field(default_factory=list)
    """Findings reported but not counted: channel counts a graph input fixes (without align_io)."""

    @property
    def clean(self) -> bool:
        return not self.violations

    @property
    def unfixable(self) -> list[Violation]:
        return [v for v in self.violations if not v.fixable]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "clean": self.clean,
            "violations": [v.to_json() for v in self.violations],
            "exempt": [v.to_json() for v in self.exempt],
            "memory": self.memory.to_json() if self.memory else None,
        }
        if self.shapes is not None:
            out["shapes"] = [s.to_json() for s in self.shapes]
        return out


# --- shapes ----------------------------------------------------------------------------------------


def _dtype(index: GraphIndex, name: str) -> str:
    elem = index.elem_type(name)
    return onnx.TensorProto.DataType.Name(elem).lower() if elem else "?"


def listing(index: GraphIndex, const: set[str]) -> list[NodeShapes]:
    listing: list[NodeShapes] = []
    for node in index.graph.node:
        entry = NodeShapes(node.name, node.op_type)
        for name in node.input:
            if name:
                entry.inputs.append(TensorShape(name, index.shape(name), _dtype(index, name), name in const))
        for name in node.output:
            if name:
                entry.outputs.append(TensorShape(name, index.shape(name), _dtype(index, name), name in const))
        listing.append(entry)
    return listing


def shape_listing(model: onnx.ModelProto,
                  input_shapes: dict[str, Sequence[int]] | None = None) -> list[NodeShapes]:
    """Every node with its input and output shapes, after shape inference on a copy (``--dump-shapes``)."""
    light, _ = analysis_copy(model, input_shapes)
    index = GraphIndex(light)
    return listing(index, constant_names(index))


def render_shapes(listing: Sequence[NodeShapes]) -> str:
    """One line per node: ``name (op): in [shape], w [shape] (const) -> out [shape]``."""
    return "\n".join(entry.text() for entry in listing)


# --- text ------------------------------------------------------------------------------------------


def render_violations(violations: Sequence[Violation]) -> str:
    """One line per violation, then a summary line; 'no violations' when clean."""
    if not violations:
        return "no violations"
    return "\n".join([*(v.text() for v in violations), violations_summary(violations)])


def violations_summary(violations: Sequence[Violation]) -> str:
    """The last line of :func:`render_violations`: how many, and which pass fixes how many."""
    if not violations:
        return "no violations"
    by_fix: dict[str, int] = {}
    for v in violations:
        if v.fixed_by:
            by_fix[v.fixed_by] = by_fix.get(v.fixed_by, 0) + 1
    unfixable = sum(1 for v in violations if not v.fixed_by)
    fixable = len(violations) - unfixable
    parts = []
    if fixable:
        parts.append(f"{fixable} fixable (" + ", ".join(f"{k} {n}" for k, n in by_fix.items()) + ")")
    if unfixable:
        parts.append(f"{unfixable} that no pass fixes")
    noun = "violation" if len(violations) == 1 else "violations"
    return f"{len(violations)} {noun}: " + "; ".join(parts)


def render_check(report: CheckReport) -> str:
    """Violations, then the memory estimate: the text output of ``--check``."""
    parts = [render_violations(report.violations)]
    if report.exempt:
        parts.append("\n".join(f"exempt: {v.text()} ({v.message})" for v in report.exempt))
    if report.memory is not None:
        parts.append(render_memory(report.memory))
    if report.shapes is not None:
        parts.append(render_shapes(report.shapes))
    return "\n\n".join(parts)


def judge_violation(node: str, op: str, signature: str | None, tried: int) -> Violation:
    """The ``judge`` constraint: ``--judge`` rejects the output (``signature``) and the ``tried`` other forms;
    ``node``: the first node of the region it was reduced to. It is asked for by ``--judge`` itself (the caller
    counts it; no FixOptions field asks for it)."""
    return Violation(node, op, "judge", signature, "accepted by --judge", None,
                     f"no form npufix knows was accepted ({tried} tried)")


# --- which constraints count --------------------------------------------------------------------------------

# A constraint counts when one of its ``asked_by`` fields was requested (FixOptions.requested: by a target or an
# explicit option); the ones without a field of their own count under any target. Built-in defaults (align 8,
# nearest Resize, no BatchNormalization) drive the passes but are not constraints unless asked for.


def split_requested(violations: Sequence[Violation], options: FixOptions,
                    passes: Sequence[str] | None = None) -> tuple[list[Violation], list[tuple[Violation, str]]]:
    """(the violations that count, the others with why they do not).

    With ``options.requested`` None every violation counts. Otherwise one counts when a target or an explicit
    option asked for its constraint (``ASKED_BY``), except that the constraint of a pass left out of ``passes``
    (--skip / --passes: a pass of the default order that is not in ``passes``) is only a warning, unless the target
    asked for it. An opt-in pass (reorder-memory) that was not asked for skips nothing: its constraint counts."""
    if options.requested is None:
        return list(violations), []
    requested = options.requested
    counted: list[Violation] = []
    others: list[tuple[Violation, str]] = []
    from onnx_npu_fix.passes import DEFAULT_ORDER

    default_passes = {cls.name for cls in DEFAULT_ORDER}
    for violation in violations:
        fields = ASKED_BY.get(violation.constraint, ())
        asked: set[str] = {requested[f] for f in fields if f in requested}
        if not fields and options.target is not None:
            asked.add("target")
        if not asked:
            others.append((violation, "not requested"))
        elif (passes is not None and violation.fixed_by in default_passes and violation.fixed_by not in passes
              and "target" not in asked):
            others.append((violation, f"pass {violation.fixed_by} was not run"))
        else:
            counted.append(violation)
    return counted, others
