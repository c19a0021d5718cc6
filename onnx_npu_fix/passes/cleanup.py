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
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import (
    GraphEditor,
    GraphIndex,
    get_attr,
    has_subgraphs,
    opset_version,
    remove_unused,
)
from onnx_npu_fix.ir.ops import is_default_domain
from onnx_npu_fix.passes.base import Change, PassResult, Rejection, ScratchFindPass

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


class CleanupPass(ScratchFindPass):
    """Pass-through and no-op removal. ``find`` rewrites a scratch copy (:class:`ScratchFindPass`): removing a
    pass-through renames its readers to its input, and whether the next one may hand a graph output's name to its
    input depends on the renames made before it."""
    name = "cleanup"
    summary = ("remove Identity / inference Dropout / no-op Pad, Slice, Reshape, Transpose, Cast, dead nodes and "
               "unused initializers")
    exact = True
    keeps_shapes = True

    def apply(self, model: onnx.ModelProto, options: FixOptions) -> PassResult:
        result = PassResult()
        graph = model.graph
        if any(n.op_type in _PASS_THROUGH_OPS for n in graph.node):
            self._remove_no_ops(model, result)
        dead, unused = remove_unused(model)
        for node in dead:
            result.changes.append(Change(node.name, node.op_type, "removed dead node"))
        for name in unused:
            result.changes.append(Change(name, "initializer", "removed unused initializer"))
        return result

    def _remove_no_ops(self, model: onnx.ModelProto, result: PassResult) -> None:
        graph = model.graph
        index = GraphIndex(model)
        rename: dict[str, str] = {}  # tensor name -> the name its readers should use instead

        def resolve(name: str) -> str:
            while name in rename:
                name = rename[name]
            return name

        output_renames: dict[str, tuple[onnx.NodeProto, str]] = {}  # graph output name -> (producer, old)
        removed: set[int] = set()
        opset = opset_version(model)
        for node in graph.node:
            if node.op_type not in _PASS_THROUGH_OPS or not is_default_domain(node):
                continue
            why_no_op = None
            if node.op_type in _NO_OP_CHECKS:
                why_no_op = _NO_OP_CHECKS[node.op_type](index, node, opset)
                if why_no_op is None:
                    continue  # does something: not a candidate
            reason = self._why_kept(index, node)
            if reason:
                result.rejections.append(Rejection(node.name, node.op_type, reason))
                continue
            src, dst = resolve(node.input[0]), node.output[0]
            if dst in index.output_set:
                producer = index.producer.get(src)
                blocked = (
                    producer is None or src in index.output_set or src in index.initializers
                    or len(index.consumers_of(src)) != 1 or has_subgraphs(producer)
                )
                if blocked:
                    result.rejections.append(Rejection(
                        node.name, node.op_type,
                        "its output is a graph output and its input cannot take that name "
                        "(graph input, initializer, graph output or read elsewhere)"))
                    continue
                output_renames[dst] = (producer, src)
                rename[src] = dst
            else:
                rename[dst] = src
            removed.add(id(node))
            if why_no_op is None:
                result.changes.append(Change(node.name, node.op_type, "removed"))
            else:
                result.changes.append(Change(node.name, node.op_type, "removed no-op", detail={"why": why_no_op}))

        if removed:
            for producer, old in output_renames.values():
                for i, out in enumerate(producer.output):
                    if out == old:
                        producer.output[i] = rename[old]
            for node in graph.node:
                if id(node) in removed:
                    continue
                for i, name in enumerate(node.input):
                    if name:
                        node.input[i] = resolve(name)
            editor = GraphEditor(index)
            for node in graph.node:
                if id(node) in removed:
                    editor.remove(node)
            editor.commit()

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
