"""Pass ``cleanup``: remove Identity, inference-time Dropout, no-op ops, dead nodes and unused initializers.

    X -> Identity -> Y -> f          becomes   X -> f          (Y renamed to X in its consumers)
    X -> Dropout(ratio) -> Y         becomes   X              (at inference Dropout is the identity; opset >= 12
                                                                training_mode must be absent or constant false)

No-op ops are removed the same way, each only when it provably returns its input unchanged (the reason is in
the report; vendor compilers trip over them, e.g. tpu-mlir 1.30.2 over the all-zero rank-3 Pad that asteroid's
ConvTasNet export ends with):

    Pad        every pad a constant 0 (any mode: nothing is added)
    Slice      constant starts/ends/axes/steps, static input shape, and on every sliced axis step 1 with the
               clamped range [start, end) = [0, dim)
    Reshape    constant shape input, and input and output have the same static shape
    Transpose  perm is the identity (0, 1, ..., r-1), or the tensor has rank <= 1
    Cast       ``to`` is the input's element type

Exact by construction. Graph input and output names and their order never change: when ``Y`` is a graph output,
the producer of ``X`` is renamed to write ``Y`` instead, which is only possible when ``X`` is neither a graph input,
an initializer, a graph output, nor read by anything else. A node is dead when none of its outputs reaches a graph
output; unused initializers (and the graph inputs that merely declared them) are dropped.

``find`` only reads: one sweep decides every pass-through removal (:class:`RemovePassThrough`, with the no-op's
reason), following the renames the removals before it would make, then the dead nodes (:class:`RemoveDeadNode`)
and unused initializers (:class:`RemoveInitializer`) the graph has once they are gone (``graph.unused_after``).
``rewrite`` applies exactly the plans it is given. fold-constants runs this pass again after inlining.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import (
    GraphIndex,
    drop_initializers,
    drop_nodes,
    get_attr,
    has_subgraphs,
    opset_version,
    unused_after,
)
from onnx_npu_fix.ir.ops import is_default_domain
from onnx_npu_fix.passes.base import Change, Fixes, Found, Pass, PassResult, Plan, Rejection

# --- no-op detection: each returns why the node returns its input unchanged, or None -------------------------


def _const_ints(index: GraphIndex, node: onnx.NodeProto, slot: int) -> list[int] | None:
    """A constant integer input as a list ([] when the optional input is absent), None when not constant."""
    if len(node.input) <= slot or not node.input[slot]:
        return []
    value = index.const_value(node.input[slot])
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


def _pad_no_op(index: GraphIndex, node: onnx.NodeProto, opset: int) -> str | None:
    pads = get_attr(node, "pads") if opset < 11 else _const_ints(index, node, 1)
    if pads is None or not list(pads) or any(int(p) for p in pads):
        return None
    return "every pad is 0"


def _slice_no_op(index: GraphIndex, node: onnx.NodeProto, opset: int) -> str | None:
    shape = index.static_shape(node.input[0])
    if shape is None:
        return None
    if opset < 10:
        starts, ends, axes = get_attr(node, "starts"), get_attr(node, "ends"), get_attr(node, "axes")
        steps: list[int] | None = []
    else:
        starts, ends = _const_ints(index, node, 1), _const_ints(index, node, 2)
        axes, steps = _const_ints(index, node, 3), _const_ints(index, node, 4)
    if starts is None or ends is None or axes is None or steps is None or len(starts) != len(ends):
        return None
    axes = list(axes) or list(range(len(starts)))
    steps = list(steps) or [1] * len(starts)
    if len(axes) != len(starts) or len(steps) != len(starts):
        return None
    rank = len(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = shape[axis + rank if axis < 0 else axis]
        start, end = int(start), int(end)
        start = min(max(start + dim if start < 0 else start, 0), dim)
        end = min(max(end + dim if end < 0 else end, 0), dim)
        if step != 1 or start != 0 or end != dim:
            return None
    return "every sliced axis keeps its full range [0, dim) with step 1"


def _reshape_no_op(index: GraphIndex, node: onnx.NodeProto, opset: int) -> str | None:
    if len(node.input) < 2 or index.const_value(node.input[1]) is None:
        return None
    shape_in, shape_out = index.static_shape(node.input[0]), index.static_shape(node.output[0])
    if shape_in is None or shape_in != shape_out:
        return None
    return f"input and output have the same static shape {list(shape_in)}"


def _transpose_no_op(index: GraphIndex, node: onnx.NodeProto, opset: int) -> str | None:
    shape = index.shape(node.input[0])
    perm = get_attr(node, "perm")
    if perm is None:
        return "rank <= 1: the default (reversing) perm is the identity" if shape is not None and len(shape) <= 1 \
            else None
    if [int(p) for p in perm] != list(range(len(perm))):
        return None
    return f"perm {list(perm)} is the identity"


def _cast_no_op(index: GraphIndex, node: onnx.NodeProto, opset: int) -> str | None:
    to = get_attr(node, "to")
    elem = index.elem_type(node.input[0])
    if to is None or elem == onnx.TensorProto.UNDEFINED or int(to) != elem:
        return None
    return f"casts {onnx.TensorProto.DataType.Name(elem)} to itself"


_NO_OP_CHECKS = {"Pad": _pad_no_op, "Slice": _slice_no_op, "Reshape": _reshape_no_op,
                 "Transpose": _transpose_no_op, "Cast": _cast_no_op}
_PASS_THROUGH_OPS = ("Identity", "Dropout", *_NO_OP_CHECKS)


@dataclass(kw_only=True)
class RemovePassThrough(Plan):
    """Remove ``node`` (Identity, inference Dropout, or a no-op: ``why`` says why it returns its input
    unchanged). Its readers read its input instead; when its output is a graph output (``takes_output_name``)
    the producer of its input writes that name instead."""

    node: onnx.NodeProto
    takes_output_name: bool = False
    why: str | None = None


@dataclass(kw_only=True)
class RemoveDeadNode(Plan):
    """Remove ``node``: none of its outputs reaches a graph output (once the pass-throughs are gone)."""

    node: onnx.NodeProto


@dataclass(kw_only=True)
class RemoveInitializer(Plan):
    """Remove the initializer ``name``: nothing reads it (once the removed nodes are gone)."""

    name: str


class _Renames:
    """Tensor renames of removed pass-throughs: the one rule find simulates and rewrite applies."""

    def __init__(self) -> None:
        self.to: dict[str, str] = {}  # tensor name -> the name its readers should use instead

    def resolve(self, name: str) -> str:
        while name in self.to:
            name = self.to[name]
        return name

    def add(self, node: onnx.NodeProto, takes_output_name: bool) -> str:
        """Record ``node``'s removal; return the name that disappears (its output, or with
        ``takes_output_name`` its resolved input, whose producer then writes the output's name)."""
        src, dst = self.resolve(node.input[0]), node.output[0]
        if takes_output_name:
            self.to[src] = dst
            return src
        self.to[dst] = src
        return dst


class CleanupPass(Pass):
    """Pass-through and no-op removal. ``find`` decides every removal in one read-only sweep, following the
    renames the removals before it would make (whether a pass-through may hand a graph output's name to its
    input depends on them), then the dead nodes and unused initializers that are left; ``rewrite`` applies
    exactly the plans it is given."""
    name = "cleanup"
    summary = ("remove Identity / inference Dropout / no-op Pad, Slice, Reshape, Transpose, Cast, dead nodes and "
               "unused initializers")
    exact = True
    fixes = (Fixes("leftover-op", note="behind a foldable If / Loop: fold-constants, which re-runs it"),)
    keeps_shapes = True

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        found = Found()
        # The pass manager's index, when it shares one: its fields, read once for the passes, instead of the nodes'.
        index = GraphIndex.shared(model)
        ops = index.ops if index is not None else (n.op_type for n in model.graph.node)
        if any(op in _PASS_THROUGH_OPS for op in ops):
            self._find_pass_throughs(model, found)
        bypassed = {id(p.node) for p in found.plans if isinstance(p, RemovePassThrough)}
        dead, unused = unused_after(model, bypassed=bypassed, index=index)
        found.plans += [RemoveDeadNode((n.name,), "removed dead node", node=n) for n in dead]
        found.plans += [RemoveInitializer((name,), "removed unused initializer", name=name) for name in unused]
        return found

    def _find_pass_throughs(self, model: onnx.ModelProto, found: Found) -> None:
        index = GraphIndex.of(model)
        renames = _Renames()
        opset = opset_version(model)
        for node in model.graph.node:
            if node.op_type not in _PASS_THROUGH_OPS or not is_default_domain(node):
                continue
            why_no_op = None
            if node.op_type in _NO_OP_CHECKS:
                why_no_op = _NO_OP_CHECKS[node.op_type](index, node, opset)
                if why_no_op is None:
                    continue  # does something: not a candidate
            reason = self._why_kept(index, node)
            takes_output_name = node.output[0] in index.output_set
            if not reason and takes_output_name:
                reason = self._why_input_cannot_take_the_name(index, renames.resolve(node.input[0]))
            if reason:
                found.rejections.append(Rejection(node.name, node.op_type, reason))
                continue
            renames.add(node, takes_output_name)
            action = "removed" if why_no_op is None else "removed no-op"
            found.plans.append(RemovePassThrough((node.name,), action, node=node,
                                                 takes_output_name=takes_output_name, why=why_no_op))

    @staticmethod
    def _why_input_cannot_take_the_name(index: GraphIndex, src: str) -> str | None:
        producer = index.producer.get(src)
        if (producer is None or src in index.output_set or src in index.initializers
                or len(index.consumers_of(src)) != 1 or has_subgraphs(producer)):
            return ("its output is a graph output and its input cannot take that name "
                    "(graph input, initializer, graph output or read elsewhere)")
        return None

    def rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        result = PassResult(rejections=list(found.rejections))
        removals = [p for p in found.plans if isinstance(p, RemovePassThrough)]
        if removals:
            self._remove_pass_throughs(model, removals)
        for plan in removals:
            detail = {"why": plan.why} if plan.why is not None else {}
            result.changes.append(Change(plan.node.name, plan.node.op_type, plan.action, detail=detail))
        dead = [p.node for p in found.plans if isinstance(p, RemoveDeadNode)]
        drop_nodes(model, dead)
        result.changes += [Change(node.name, node.op_type, "removed dead node") for node in dead]
        unused = [p.name for p in found.plans if isinstance(p, RemoveInitializer)]
        drop_initializers(model, unused)
        result.changes += [Change(name, "initializer", "removed unused initializer") for name in unused]
        return result

    @staticmethod
    def _remove_pass_throughs(model: onnx.ModelProto, removals: list[RemovePassThrough]) -> None:
        renames = _Renames()
        renamed: dict[str, onnx.NodeProto] = {}  # a removed input name -> the producer that writes it
        producers = {o: n for n in model.graph.node for o in n.output} if any(
            p.takes_output_name for p in removals) else {}
        for plan in removals:
            gone = renames.add(plan.node, plan.takes_output_name)
            if plan.takes_output_name:
                renamed[gone] = producers[gone]
        for old, producer in renamed.items():
            for i, out in enumerate(producer.output):
                if out == old:
                    producer.output[i] = renames.to[old]
        removed = {id(p.node) for p in removals}
        for node in model.graph.node:
            if id(node) in removed:
                continue
            for i, name in enumerate(node.input):
                if name:
                    node.input[i] = renames.resolve(name)
        drop_nodes(model, (p.node for p in removals))

    @staticmethod
    def _why_kept(index: GraphIndex, node: onnx.NodeProto) -> str | None:
        if node.op_type == "Dropout":
            if len(node.output) > 1 and node.output[1] and (index.consumers_of(node.output[1])
                                                            or node.output[1] in index.output_set):
                return "its mask output is used"
            if len(node.input) > 2 and node.input[2]:
                training = index.const_value(node.input[2])
                if training is None or bool(training.reshape(-1)[0]):
                    return "training_mode is not a constant false"
        if not node.input or not node.input[0]:
            return "it has no input"
        if any(has_subgraphs(user) for user in index.consumers_of(node.output[0])):
            return "its output is read inside a subgraph (If/Loop/Scan), which this pass does not rewrite"
        return None
