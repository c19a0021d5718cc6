"""What a pass promises about the graph, checked by the pass manager around every pass it runs — the instruments
of onnx_ir's pass infrastructure (its ``requires`` / ``ensures``) and TVM's ``PassInstrument``, here one class per
promise:

- :class:`KeepsInterface` — every pass: the graph's input and output names, in order, and each one's element type
  and every dimension that was known (an unknown or symbolic one may become known);
- :class:`EmitsNoForbiddenOp` — under a target's ``forbidden_ops``: no op type it forbids more often than before
  (a pass may remove such nodes, never add them);
- :class:`KeepsRecordedShapes` — a ``keeps_shapes`` pass: every surviving tensor's recorded type and shape as it
  was (the manager then skips inference).

Each condition records what it needs before the pass runs, cheaply (names, types, op counts; the recorded types
only for a ``keeps_shapes`` pass), and says after it what the pass broke, in one line, or None. The manager asks
the :data:`AFTER_RUN` ones as soon as the pass returns and the :data:`AFTER_CLEANUP` ones once what the pass left
unused is dropped; a pass that breaks one fails, named, like a pass that fails validation.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Sequence
from typing import ClassVar

import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.passes.base import Pass

AFTER_RUN, AFTER_CLEANUP = "after run", "after cleanup"
"""When a condition is checked: as soon as the pass returns, or once the unused nodes and initializers it left are
dropped (a pass's dead leftovers are not its output)."""


class Condition:
    """One promise of a pass run: recorded before it (``__init__``), checked after it (:meth:`broken`)."""

    stage: ClassVar[str] = AFTER_RUN

    def broken(self, model: onnx.ModelProto) -> str | None:  # pragma: no cover - abstract
        """Why ``model`` (after the pass) breaks the promise, in one line, or None."""
        raise NotImplementedError


class KeepsInterface(Condition):
    """The graph's inputs and outputs: names in order, element types, every known dimension."""

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.inputs = [i.name for i in graph.input]
        self.outputs = [o.name for o in graph.output]
        # Copies: the pass edits these very protos in place.
        self.io_types = {vi.name: _copy_type(vi.type) for vi in itertools.chain(graph.input, graph.output)}

    def broken(self, model: onnx.ModelProto) -> str | None:
        graph = model.graph
        for kind, before, after in (("inputs", self.inputs, [i.name for i in graph.input]),
                                    ("outputs", self.outputs, [o.name for o in graph.output])):
            if after != before:
                return (f"the pass changed the graph {kind} from {_names(before)} to {_names(after)}; a pass "
                        f"must keep the graph's input and output names")
        for kind, values in (("input", graph.input), ("output", graph.output)):
            for vi in values:
                before = self.io_types[vi.name]
                if not _keeps_interface(before, vi.type):
                    return (f"the pass changed the type of graph {kind} '{vi.name}' from "
                            f"{_type_text(before.SerializeToString())} to {_type_text(vi.type.SerializeToString())}"
                            f"; a pass must keep the graph's input and output types and shapes")
        return None


class EmitsNoForbiddenOp(Condition):
    """No op type of ``forbidden_ops`` more often after the pass than before it."""

    def __init__(self, model: onnx.ModelProto, forbidden: Sequence[str]) -> None:
        self.forbidden = frozenset(forbidden)
        self.counts = self._count(model)

    def _count(self, model: onnx.ModelProto) -> collections.Counter[str]:
        return collections.Counter(n.op_type for n in model.graph.node if n.op_type in self.forbidden)

    def broken(self, model: onnx.ModelProto) -> str | None:
        grown = {op: n - self.counts[op] for op, n in self._count(model).items() if n > self.counts[op]}
        if not grown:
            return None
        added = ", ".join(f"{n} {op}" for op, n in sorted(grown.items()))
        return f"the pass emitted {added}, which the target forbids (forbidden_ops); a pass must not emit them"


class KeepsRecordedShapes(Condition):
    """A ``keeps_shapes`` pass: every surviving tensor's recorded type and shape as it was."""

    stage = AFTER_CLEANUP

    def __init__(self, model: onnx.ModelProto, recorded: onnx.GraphProto | None) -> None:
        self.types = recorded if recorded is not None else recorded_snapshot(model.graph)

    def broken(self, model: onnx.ModelProto) -> str | None:
        now = recorded_snapshot(model.graph)
        if now.SerializeToString() == self.types.SerializeToString():
            return None  # every record as it was (the usual case): no per-tensor comparison
        types = _recorded_types(self.types.value_info)
        for name, after in _recorded_types(now.value_info).items():
            before = types.get(name)
            if before is not None and before != after:
                return (f"the pass declares keeps_shapes but changed the recorded type of '{name}' from "
                        f"{_type_text(before)} to {_type_text(after)}")
        return None


class Conditions:
    """The conditions of one pass run, recorded on ``model`` before ``pass_`` runs."""

    def __init__(self, pass_: Pass, model: onnx.ModelProto, options: FixOptions,
                 recorded: onnx.GraphProto | None = None) -> None:
        """``recorded``: a :func:`recorded_snapshot` of ``model`` as it is now, when the manager holds one."""
        self.conditions: list[Condition] = [KeepsInterface(model)]
        if options.forbidden_ops:
            self.conditions.append(EmitsNoForbiddenOp(model, options.forbidden_ops))
        self.recorded: onnx.GraphProto | None = None
        """The recorded types before the pass (a ``keeps_shapes`` pass only): the manager keeps them when the pass
        changes nothing."""
        if pass_.keeps_shapes:
            shapes = KeepsRecordedShapes(model, recorded)
            self.conditions.append(shapes)
            self.recorded = shapes.types

    def broken(self, model: onnx.ModelProto, stage: str) -> str | None:
        """The first condition of ``stage`` that ``model`` breaks, in one line, or None."""
        for condition in self.conditions:
            if condition.stage == stage:
                problem = condition.broken(model)
                if problem is not None:
                    return problem
        return None


def recorded_snapshot(graph: onnx.GraphProto) -> onnx.GraphProto:
    """A copy of what is on record of every tensor's type and shape (graph inputs, value_info, graph outputs, in
    that order, as the value_info of a new graph): what the next pass reads as the tensor's shape when the
    manager skips inference. Copied in bulk: two snapshots are compared as one message each."""
    snapshot = onnx.GraphProto()
    for records in (graph.input, graph.value_info, graph.output):
        snapshot.value_info.extend(records)
    return snapshot


def _copy_type(type_proto: onnx.TypeProto) -> onnx.TypeProto:
    copy = onnx.TypeProto()
    copy.CopyFrom(type_proto)
    return copy


def _keeps_interface(before: onnx.TypeProto, after: onnx.TypeProto) -> bool:
    """Whether ``after`` is the graph input's or output's type ``before`` (a tensor: the same element type; the
    same rank and every known dimension the same when both have a shape; an unknown dimension may become known).
    Non-tensor types must be identical."""
    if not (before.HasField("tensor_type") and after.HasField("tensor_type")):
        return before == after
    old, new = before.tensor_type, after.tensor_type
    if old.elem_type != new.elem_type:
        return False
    if not (old.HasField("shape") and new.HasField("shape")):
        return True
    if len(old.shape.dim) != len(new.shape.dim):
        return False
    return all(not a.HasField("dim_value") or (b.HasField("dim_value") and a.dim_value == b.dim_value)
               for a, b in zip(old.shape.dim, new.shape.dim))


def _recorded_types(records: Iterable[onnx.ValueInfoProto]) -> dict[str, bytes]:
    """Every tensor's type and shape in ``records`` (a :func:`recorded_snapshot`), serialized, by name."""
    return {vi.name: vi.type.SerializeToString() for vi in records}


def _type_text(serialized: bytes) -> str:
    type_proto = onnx.TypeProto()
    type_proto.ParseFromString(serialized)
    if not type_proto.HasField("tensor_type"):
        return str(type_proto).strip() or "(none)"
    tensor = type_proto.tensor_type
    dims = ([str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
            if tensor.HasField("shape") else None)
    elem = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else "?"
    return f"{elem}[{', '.join(dims)}]" if dims is not None else f"{elem} (no shape)"


def _names(names: Sequence[str]) -> str:
    return "[" + ", ".join(names) + "]"
