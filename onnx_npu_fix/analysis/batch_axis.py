"""Where the batch axis is: the tensors whose axis 0 is the model's batch, for the ``batch-one`` constraint.

Axis 0 of an arbitrary tensor is not a batch: ConvTasNet reshapes [1, 2·64, T] to [2, 64, T] to decode two
sources, PP-OCR transposes axis 0 away, silero's LSTM state [2, 1, 128] has directions on axis 0. So the batch
is traced, never assumed:

* **Sources.** A graph input of rank >= 2 whose axis 0 reaches, through batch-keeping ops, the data input of
  an op that defines a batch axis (Conv, ConvTranspose, pools, BatchNormalization, InstanceNormalization,
  LRN, GroupNormalization, DepthToSpace, SpaceToDepth and their quantized forms). An input that reaches none
  (a state fed to an LSTM, a mask fed to a MatMul) has no batch axis.
* **Batch-keeping ops** carry axis 0 from a traced input to an output: element-wise ops (a traced input of
  the output's rank), the batch-defining ops themselves, Softmax / normalizations / reductions / ArgMax /
  Gather / Concat / Split not over axis 0, Transpose with ``perm[0] == 0``, Reshape / Flatten / Squeeze /
  Unsqueeze / Slice / Pad / Resize / Upsample whose output keeps axis 0's size (and Unsqueeze / Squeeze whose
  axes do not include 0), MatMul on a traced left operand of rank >= 3, Gemm's A, Expand and Tile (which may
  grow the batch: that is where batch > 1 starts). Anything else ends the trace (LSTM/GRU/RNN: their batch is
  axis 1).
"""

from __future__ import annotations

from collections.abc import Container

import onnx

from onnx_npu_fix.ir.graph import GraphIndex, Shape, get_attr
from onnx_npu_fix.ir.ops import is_default_domain

BATCH_DEFINING = frozenset({
    "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
    "GlobalMaxPool", "GlobalLpPool", "BatchNormalization", "InstanceNormalization", "LRN", "GroupNormalization",
    "DepthToSpace", "SpaceToDepth", "MaxUnpool", "DeformConv",
})
_ELEMENTWISE = frozenset({
    "Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus",
    "Softsign", "Clip", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Gelu", "Mish", "Cast",
    "CastLike", "Identity", "Dropout", "Floor", "Ceil", "Round", "Sign", "Not", "IsNaN", "IsInf", "Sin", "Cos",
    "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "ThresholdedRelu", "Shrink",
    "QuantizeLinear", "DequantizeLinear", "PRelu", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum",
    "Mean", "Where", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Mod",
    "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "QLinearAdd", "QLinearMul",
})
_AXIS_OPS = frozenset({"Softmax", "LogSoftmax", "Hardmax", "Concat", "Split", "Gather", "GatherElements",
                       "ArgMax", "ArgMin", "CumSum", "LayerNormalization", "Flatten"})
_SIZE_KEEPING = frozenset({"Reshape", "Slice", "Pad", "Resize", "Upsample", "Expand", "Tile"})
_REDUCE_PREFIX = "Reduce"


def batch_tensors(index: GraphIndex) -> tuple[set[str], set[str]]:
    """(source graph inputs, every traced tensor including them): the tensors whose axis 0 is the batch.

    One pass over the nodes (topologically sorted): each tensor carries the candidate inputs its axis 0 comes
    from; the sources are the candidates that reach a batch-defining op."""
    shape = index.shape
    origin: dict[str, frozenset[str]] = {}
    for name in index.graph_inputs:
        s = shape(name)
        if s is not None and len(s) >= 2:
            origin[name] = frozenset((name,))
    if not origin:
        return set(), set()
    sources: set[str] = set()
    _trace_nodes(index.graph.node, origin, sources, index)
    traced = {name for name, came_from in origin.items() if came_from & sources}
    return sources, traced


def _trace_nodes(nodes, origin: dict[str, frozenset[str]], sources: set[str], index: GraphIndex) -> None:
    """Extend ``origin`` over ``nodes`` in order; add to ``sources`` the inputs that reach a batch-defining op.
    An If's branches read outer tensors by name: they are traced in place, and an If output keeps the batch
    when a branch output it comes from does (exported audio models pick their Conv stack by sample rate)."""
    for node in nodes:
        if not is_default_domain(node):
            continue
        if node.op_type == "If":
            branches = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
            for branch in branches:
                _trace_nodes(branch.node, origin, sources, index)
            for k, out in enumerate(node.output):
                came = [origin[b.output[k].name] for b in branches if k < len(b.output) and b.output[k].name in origin]
                if out and came:
                    origin[out] = frozenset().union(*came)
            continue
        if not node.input:
            continue
        found = [origin[i] for i in node.input if i in origin]
        if not found:
            continue
        if node.op_type in BATCH_DEFINING and node.input[0] in origin:
            sources |= origin[node.input[0]]
        outs = _keeping_outputs(node, origin, index)
        if outs:
            merged = found[0].union(*found[1:]) if len(found) > 1 else found[0]
            for out in outs:
                origin[out] = merged


def _rank(shape: Shape | None) -> int | None:
    return None if shape is None else len(shape)


def _dim0(shape: Shape | None):
    return None if not shape else shape[0]


def _axis(node: onnx.NodeProto, default: int, rank: int | None) -> int | None:
    axis = get_attr(node, "axis", default)
    if axis is None or rank is None:
        return axis
    return axis + rank if axis < 0 else axis


def _keeping_outputs(node: onnx.NodeProto, traced: Container[str], index: GraphIndex) -> list[str]:
    """The outputs of ``node`` whose axis 0 is its traced input's axis 0."""
    shape = index.shape
    op = node.op_type
    data = node.input[0]
    outs = [o for o in node.output if o]
    if op in _ELEMENTWISE:
        ranks = {_rank(shape(i)) for i in node.input if i in traced}
        return [o for o in outs[:1] if _rank(shape(o)) in ranks or _rank(shape(o)) is None]
    if data not in traced:
        return []
    in_shape = shape(data)
    rank = _rank(in_shape)
    if op in BATCH_DEFINING:
        return outs[:1]
    if op == "Transpose":
        perm = get_attr(node, "perm")
        return outs if perm and perm[0] == 0 else []
    if op in _AXIS_OPS:
        return _keeping_along_axis(node, outs, rank)
    if op.startswith(_REDUCE_PREFIX) or op in ("Squeeze", "Unsqueeze"):
        return _keeping_axes(node, index, outs, rank)
    if op in _SIZE_KEEPING:
        return _keeping_size(node, index, outs, in_shape)
    if op == "MatMul":
        return outs[:1] if rank is not None and rank >= 3 else []
    if op == "Gemm":
        return outs[:1] if not get_attr(node, "transA", 0) else []
    return []


def _keeping_along_axis(node: onnx.NodeProto, outs: list[str], rank: int | None) -> list[str]:
    """An op of ``_AXIS_OPS``: it keeps axis 0 unless its axis is 0 (or unknown)."""
    op = node.op_type
    default = {"Flatten": 1, "LayerNormalization": -1, "Softmax": -1, "LogSoftmax": -1, "Hardmax": -1,
               "CumSum": None}.get(op, 0)
    axis = _axis(node, default, rank)
    if op == "CumSum":
        return outs[:1]  # its axis is an input; the size of axis 0 is kept either way
    if axis is None or axis == 0:
        return []
    return outs if op == "Split" else outs[:1]


def _keeping_axes(node: onnx.NodeProto, index: GraphIndex, outs: list[str], rank: int | None) -> list[str]:
    """A Reduce*, Squeeze or Unsqueeze: it keeps axis 0 when its axes are known, exclude 0 and keep the rank."""
    op = node.op_type
    axes = _axes(node, index)
    if op.startswith(_REDUCE_PREFIX) and (not axes or not get_attr(node, "keepdims", 1)):
        return []  # all axes (batch included) reduced, or the rank changes
    if axes is None or (op == "Squeeze" and not axes):
        return []  # unknown axes, or a Squeeze of every size-1 axis (a batch of 1 included)
    base = _rank(index.shape(outs[0])) if op == "Unsqueeze" and outs else rank
    if base is None or any((a + base if a < 0 else a) == 0 for a in axes):
        return []
    return outs[:1]


def _keeping_size(node: onnx.NodeProto, index: GraphIndex, outs: list[str], in_shape: Shape | None) -> list[str]:
    """An op of ``_SIZE_KEEPING``: it keeps axis 0 when the output's size 0 is the input's (or unknown)."""
    op = node.op_type
    rank = _rank(in_shape)
    out_shape = index.shape(outs[0]) if outs else None
    if op in ("Expand", "Tile"):
        return outs[:1] if _rank(out_shape) in (rank, None) else []
    if op == "Reshape" and _rank(out_shape) is not None and _rank(out_shape) < 2:
        return []
    if op == "Pad" and len(node.input) > 1 and node.input[1] and rank is not None:
        pads = index.const_value(node.input[1])
        if pads is not None and len(node.input) < 4 and pads.size == 2 * rank:
            return outs[:1] if int(pads[0]) == 0 and int(pads[rank]) == 0 else []
    d0, o0 = _dim0(in_shape), _dim0(out_shape)
    # An unknown size (a shape inference could not resolve on the unfolded model) continues the trace.
    return outs[:1] if d0 == o0 or not isinstance(o0, int) else []


def _axes(node: onnx.NodeProto, index: GraphIndex) -> list[int] | None:
    """The ``axes`` of a Reduce / Squeeze / Unsqueeze: the attribute, or the constant second input (None when
    neither says; [] for an empty list)."""
    axes = get_attr(node, "axes")
    if axes is not None:
        return [int(a) for a in axes]
    if len(node.input) > 1 and node.input[1]:
        value = index.const_value(node.input[1])
        return None if value is None else [int(a) for a in value.ravel()]
    return []
