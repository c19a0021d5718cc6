"""QDQ pattern helpers shared by every pass: one implementation of "what quantizes this tensor".

A QDQ model (onnxruntime's ``quantize_static(..., QuantFormat.QDQ)``, ST's and most vendors' quantizers) keeps
float ops and wraps every quantized tensor in a QuantizeLinear / DequantizeLinear pair::

    x_q -> DequantizeLinear(scale, zp) -> x -> Op -> y -> QuantizeLinear(scale', zp') -> y_q -> DequantizeLinear

and stores weights as ``DequantizeLinear(W_q, scale, zp, axis)`` over an int8/uint8 constant (per-tensor: a
scalar scale; per-channel: one scale per slice of ``axis``) and a bias as ``DequantizeLinear(b_q int32,
in_scale * w_scale, 0)``.

The facts a rewrite of such a model relies on, all exact in float32:

- ``DQ(zp) = (zp - zp) * s = 0``: a pad weight / pad channel stored as the zero point dequantizes to exactly 0,
  and ``Q(0) = round(0 / s) + zp = zp``.
- ``Q(DQ(q)) = q`` for every integer q of the type (|q - zp| <= 255, so ``(q - zp) * s / s`` rounds back to
  ``q - zp``): a Q -> DQ pair inserted on a tensor that is already on that quantization grid changes nothing. That
  is why an op a pass inserts on a quantized tensor can be wrapped in the tensor's own Q/DQ (:func:`wrap_inserted`)
  and stay exact, as long as the op only moves or zero-fills values (Pad with 0, Slice, Gather, Reshape,
  Transpose, Concat of tensors with the same quantization).

QOperator models (QLinearConv, ConvInteger, ...) carry the arithmetic in integer ops the passes do not rewrite:
:data:`QOPERATOR_OPS` lists them so each pass can refuse them with a reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from onnx_npu_fix.ir.graph import GraphEditor, GraphIndex, get_attr, set_attr
from onnx_npu_fix.ir.ops import is_default_domain
from onnx_npu_fix.ir.weights import tensor_value

QOPERATOR_OPS = frozenset({
    "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QGemm", "QLinearAdd", "QLinearMul",
    "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearSigmoid", "QLinearLeakyRelu",
})
"""Integer-arithmetic ops of the QOperator form: no pass rewrites them (refused with :func:`qoperator_reason`)."""

_QUANT_TYPES = {
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.INT16: np.int16,
    onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.INT32: np.int32,
}


def is_qoperator(node: onnx.NodeProto) -> bool:
    return node.op_type in QOPERATOR_OPS and (is_default_domain(node) or node.domain == "com.microsoft")


def qoperator_reason(node: onnx.NodeProto) -> str:
    """Why a pass leaves a QOperator node alone (one wording for every pass)."""
    return (f"{node.op_type} is a QOperator-form quantized op (integer arithmetic, its weights and "
            f"requantization inside the node): npufix rewrites QDQ models only; re-quantize the float model with "
            f"quant_format=QuantFormat.QDQ")


@dataclass
class QuantParams:
    """The constant scale and zero point of one QuantizeLinear / DequantizeLinear."""

    scale: np.ndarray
    zero_point: np.ndarray
    """Same shape as ``scale``; zeros of ``dtype`` when the node has no zero-point input."""
    axis: int | None
    """The quantized axis for a per-channel scale, None for a per-tensor one."""
    dtype: np.dtype
    """The integer type (the zero point's, uint8 when absent as the spec says)."""
    scale_name: str
    zero_point_name: str

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    def same_as(self, other: QuantParams) -> bool:
        return (self.axis == other.axis and self.dtype == other.dtype
                and np.array_equal(self.scale, other.scale) and np.array_equal(self.zero_point, other.zero_point))

    def steps(self, rank: int) -> np.ndarray:
        """The scale shaped to broadcast against a tensor of ``rank`` (one quantization step per element)."""
        scale = self.scale.astype(np.float64)
        if self.axis is None:
            return scale.reshape(())
        shape = [1] * rank
        shape[self.axis % rank] = scale.size
        return scale.reshape(shape)


QUANTIZERS = frozenset({"QuantizeLinear", "DequantizeLinear"})
"""The ops that make a model quantized (QDQ form)."""


def quant_params(index: GraphIndex, node: onnx.NodeProto) -> QuantParams | None:
    """The constant parameters of a QuantizeLinear / DequantizeLinear ``node``, or None when its scale or zero
    point is computed at run time or it uses a form the passes do not handle (blocked quantization)."""
    if node.op_type not in QUANTIZERS or not is_default_domain(node):
        return None
    if int(get_attr(node, "block_size", 0) or 0):
        return None
    if len(node.input) < 2:
        return None
    scale = index.const_value(node.input[1])
    if scale is None:
        return None
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if zp_name:
        zero_point = index.const_value(zp_name)
        if zero_point is None:
            return None
    else:
        out_type = int(get_attr(node, "output_dtype", 0) or 0)
        zero_point = np.zeros(scale.shape, dtype=_QUANT_TYPES.get(out_type, np.uint8))
    if zero_point.dtype.type not in _QUANT_TYPES.values():
        return None  # float8 / int4 forms: not handled
    axis = None
    if scale.ndim == 1 and scale.size > 1:
        axis = int(get_attr(node, "axis", 1))
    elif scale.ndim > 1:
        return None
    return QuantParams(np.asarray(scale), np.asarray(zero_point).reshape(scale.shape), axis, zero_point.dtype,
                       node.input[1], zp_name)


@dataclass
class QuantizedConst:
    """A constant stored quantized: ``value = DequantizeLinear(q, params)`` with ``q`` an initializer."""

    dq: onnx.NodeProto
    q: np.ndarray
    params: QuantParams

    def dequantized(self) -> np.ndarray:
        """The float value, exactly as onnxruntime's DequantizeLinear computes it (float32)."""
        return dequantize(self.q, self.params)


def dequantize(q: np.ndarray, params: QuantParams) -> np.ndarray:
    steps = params.steps(q.ndim) if q.ndim else params.scale.astype(np.float64).reshape(())
    zp = params.zero_point.astype(np.int64)
    zp = zp.reshape(steps.shape) if params.axis is not None else zp.reshape(())
    scale32 = steps.astype(params.scale.dtype)
    return ((q.astype(np.int64) - zp).astype(np.float32) * scale32).astype(params.scale.dtype)


def quantized_const(index: GraphIndex, name: str) -> QuantizedConst | None:
    """``name`` as a DequantizeLinear of a constant integer tensor with constant parameters, else None."""
    dq = index.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    params = quant_params(index, dq)
    if params is None:
        return None
    q = index.const_value(dq.input[0])
    if q is None:
        return None
    if params.axis is not None and q.ndim:
        params.axis = params.axis % q.ndim
    return QuantizedConst(dq, q, params)


def is_dequantized_const(index: GraphIndex, name: str) -> bool:
    """Float tensor ``name`` is a DequantizeLinear of a constant (a QDQ weight); no value is read, so this works on
    a shape-only copy."""
    dq = index.producer.get(name)
    return dq is not None and dq.op_type == "DequantizeLinear" and index.is_const(dq.input[0])


def dequantizer_of(index: GraphIndex, name: str) -> tuple[onnx.NodeProto, QuantParams] | None:
    """The DequantizeLinear producing float tensor ``name`` (from a run-time quantized tensor) and its params."""
    dq = index.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear" or index.is_const(dq.input[0]):
        return None
    params = quant_params(index, dq)
    return None if params is None else (dq, params)


def activation_params(index: GraphIndex, name: str) -> QuantParams | None:
    """The quantization grid float tensor ``name`` lives on: its producer's when a DequantizeLinear makes it,
    else the common parameters of its readers when every one is a QuantizeLinear (a Conv output about to be
    quantized). None for a float tensor of the model."""
    found = dequantizer_of(index, name)
    if found is not None:
        return found[1]
    readers = index.consumers_of(name)
    if not readers or name in index.output_set:
        return None
    params: QuantParams | None = None
    for reader in readers:
        if reader.op_type != "QuantizeLinear" or reader.input[0] != name:
            return None
        mine = quant_params(index, reader)
        if mine is None or (params is not None and not params.same_as(mine)):
            return None
        params = mine
    return params


def wrap_inserted(index: GraphIndex, editor: GraphEditor, nodes: Sequence[onnx.NodeProto],
                  params: QuantParams | None) -> list[onnx.NodeProto]:
    """Keep ops a pass inserts on a quantized tensor in QDQ form: ``DQ -> Op -> Q -> DQ``, as onnxruntime's
    quantizer emits them, so an integer compiler never meets a float island.

    ``nodes``: the inserted chain, in order, each reading the previous one's first output (the first reads the
    quantized tensor); ``params``: that tensor's quantization (:func:`activation_params`), None to leave the chain
    as it is (a float model). Every node's first output gets a QuantizeLinear + DequantizeLinear with the same
    per-tensor parameters; the DequantizeLinear output keeps the node's output name, so the readers are
    untouched. Exact when each op only moves or zero-fills values (see the module docstring). Per-channel
    activation parameters are not repeated here: a caller that changes the channel count must pass None and
    handle them itself. The chain's first node must read a DequantizeLinear output (the caller places a Q -> DQ
    before it otherwise, with :func:`requantize`)."""
    if params is None or params.per_channel:
        return list(nodes)
    out: list[onnx.NodeProto] = []
    for node in nodes:
        out.append(node)
        name = node.output[0]
        floating = index.unique_name(f"{name}_float")
        quantized = index.unique_name(f"{name}_quantized")
        node.output[0] = floating
        out.extend(_q_dq(editor, floating, quantized, name, params, node.name))
    return out


MOVE_OPS = frozenset({"Pad", "Slice", "Gather", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
                      "Concat", "Split", "Identity", "SpaceToDepth", "DepthToSpace"})
"""Ops that only move values or fill zeros / edge copies: their output stays on the input's quantization grid."""


def wrap_moves(index: GraphIndex, editor: GraphEditor, tensor: str,
               nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """For a rewrite that replaces an op on DequantizeLinear output ``tensor`` by ``nodes`` (the last one
    writing the replaced op's output): every intermediate output of a :data:`MOVE_OPS` node before the first
    arithmetic op gets ``tensor``'s own Q -> DQ (exact: it is still on that grid). From the first arithmetic op on
    (an interpolation stage) the values are off the grid and stay float: requantizing them would add a rounding."""
    found = dequantizer_of(index, tensor)
    if found is None or found[1].per_channel or len(nodes) < 2:
        return list(nodes)
    # Moves after the last arithmetic op (a crop) read values the replaced op's readers quantize: the arithmetic
    # result goes through those readers' own Q -> DQ first (exact: Q(DQ(Q(y))) = Q(y)), and so does every move
    # output up to the last node, which still feeds the readers' QuantizeLinear.
    arithmetic = [i for i, node in enumerate(nodes[:-1]) if node.op_type not in MOVE_OPS]
    readers = activation_params(index, nodes[-1].output[0]) if nodes[-1].op_type in MOVE_OPS else None
    if readers is not None and readers.per_channel:
        readers = None
    out: list[onnx.NodeProto] = []
    for i, node in enumerate(nodes[:-1]):
        if not arithmetic or i < arithmetic[0]:
            params: QuantParams | None = found[1]  # still on the input's grid
        elif i >= arithmetic[-1]:
            params = readers
        else:
            params = None  # between interpolation stages: off any grid
        out.extend(wrap_inserted(index, editor, [node], params))
    out.append(nodes[-1])
    return out


def requantize(index: GraphIndex, editor: GraphEditor, name: str, params: QuantParams,
               base: str) -> tuple[str, list[onnx.NodeProto]]:
    """A ``Q -> DQ`` pair on float tensor ``name`` with ``params``: the new float tensor's name and the nodes (the
    caller places them). Used where an inserted op reads a tensor that is quantized only by its readers (a Conv
    output before its QuantizeLinear)."""
    quantized = index.unique_name(f"{name}_quantized")
    dequantized = index.unique_name(f"{name}_dequantized")
    return dequantized, _q_dq(editor, name, quantized, dequantized, params, base)


def _q_dq(editor: GraphEditor, source: str, quantized: str, target: str, params: QuantParams,
          base: str) -> list[onnx.NodeProto]:
    inputs = [params.scale_name] + ([params.zero_point_name] if params.zero_point_name else [])
    q = editor.make_node("QuantizeLinear", [source, *inputs], [quantized], f"{base}_quantize")
    dq = editor.make_node("DequantizeLinear", [quantized, *inputs], [target], f"{base}_dequantize")
    return [q, dq]


def walk_non_qdq(model: onnx.ModelProto, ignore: Sequence[str] = ()) -> list[str]:
    """Nodes of a QDQ model that compute on a float tensor outside the QDQ form: a float op (not Q, DQ, a
    Constant or a shape op) whose float data input is not a DequantizeLinear output, or whose output is neither
    quantized by every reader nor a graph output made by a DequantizeLinear. Returns "name (op): why" lines; the
    test of "the output stays in QDQ form"."""
    index = GraphIndex(model)
    problems: list[str] = []
    skip = {"QuantizeLinear", "DequantizeLinear", "Constant", "Shape", *ignore}
    for node in model.graph.node:
        if node.op_type in skip:
            continue
        for slot, name in enumerate(node.input):
            if not name or index.is_const(name) or name not in index.producer:
                continue
            if index.elem_type(name) not in (onnx.TensorProto.FLOAT, onnx.TensorProto.UNDEFINED):
                continue
            if slot > 0 and node.op_type in ("Reshape", "Resize", "Slice", "Pad", "Expand", "Tile", "Upsample"):
                continue  # shape / index operands
            producer = index.producer[name]
            if producer.op_type not in ("DequantizeLinear", "Constant"):
                problems.append(f"{node.name} ({node.op_type}): input {name} comes from {producer.op_type}, "
                                f"not a DequantizeLinear")
        for name in node.output:
            if not name or index.elem_type(name) not in (onnx.TensorProto.FLOAT, onnx.TensorProto.UNDEFINED):
                continue
            readers = index.consumers_of(name)
            if name in index.output_set or not readers:
                continue
            if any(r.op_type != "QuantizeLinear" for r in readers):
                problems.append(f"{node.name} ({node.op_type}): output {name} is read unquantized by "
                                f"{', '.join(sorted({r.op_type for r in readers if r.op_type != 'QuantizeLinear'}))}")
    return problems


def wrap_chain(index: GraphIndex, editor: GraphEditor, tensor: str,
               nodes: Sequence[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The QDQ form of a chain of ops a pass inserts on tensor ``tensor`` (its name in ``index``; the chain's
    first node reads it, or its renamed padded form): unchanged on a float tensor; on a DequantizeLinear output
    every op is followed by a Q -> DQ with that tensor's parameters (:func:`wrap_inserted`); on a tensor that is
    quantized only by its readers (a Conv output before its QuantizeLinear), a Q -> DQ first brings it onto the
    grid and the last op's output goes on to those readers' QuantizeLinear as before."""
    if not nodes:
        return []
    found = dequantizer_of(index, tensor)
    if found is not None:
        return wrap_inserted(index, editor, nodes, found[1])
    params = activation_params(index, tensor)
    if params is None or params.per_channel:
        return list(nodes)
    first = nodes[0]
    on_grid, pair = requantize(index, editor, first.input[0], params, first.name)
    first.input[0] = on_grid
    return [*pair, *wrap_inserted(index, editor, nodes[:-1], params), nodes[-1]]


def store_quantized(index: GraphIndex, editor: GraphEditor, consumer: onnx.NodeProto, slot: int,
                    const: QuantizedConst, q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, *,
                    axis: int | None = None) -> onnx.NodeProto:
    """Give ``consumer`` input ``slot`` the quantized constant ``DQ(q, scale, zero_point)`` (same axis), editing
    the existing DequantizeLinear's initializers when nothing else reads them, else through a private copy of
    the DequantizeLinear: a weight shared with another node is never changed under it. ``axis``: set the
    DequantizeLinear's axis (a per-tensor scale that becomes per-channel). Returns the DequantizeLinear used."""
    from onnx_npu_fix.ir.graph import private_initializer

    dq = const.dq
    has_zp = len(dq.input) > 2 and bool(dq.input[2])
    if not has_zp and np.any(zero_point != 0):
        raise ValueError("a DequantizeLinear without zero point cannot take a non-zero one")
    readers = index.consumers_of(dq.output[0])
    if len(readers) == 1 and dq.output[0] not in index.output_set:
        private_initializer(index, editor, dq, 0, q)
        private_initializer(index, editor, dq, 1, scale)
        if has_zp:
            private_initializer(index, editor, dq, 2, zero_point)
        if axis is not None:
            set_attr(dq, "axis", axis)
        return dq
    inputs = [editor.add_initializer(f"{dq.input[0]}_private", q),
              editor.add_initializer(f"{dq.input[1]}_private", scale)]
    if has_zp:
        inputs.append(editor.add_initializer(f"{dq.input[2]}_private", zero_point))
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in dq.attribute}
    if axis is not None:
        attrs["axis"] = axis
    copy = editor.make_node("DequantizeLinear", inputs, [index.unique_name(f"{dq.output[0]}_private")],
                            f"{dq.name}_private", **attrs)
    editor.prepend([copy])
    consumer.input[slot] = copy.output[0]
    return copy


def qdq_conv_weight_problem(weight: QuantizedConst, transpose: bool, group: int) -> str | None:
    """Why align-channels cannot pad this DequantizeLinear weight of a Conv / ConvTranspose, or None: it pads
    int8/uint8 weights quantized per tensor or per output channel (axis 0 of a Conv's [M, C/g, k...], axis 1 of
    a ConvTranspose's [C, M/g, k...])."""
    params = weight.params
    if params.dtype not in (np.int8, np.uint8):
        return f"the weight is quantized to {params.dtype}, not int8/uint8"
    if params.axis is None:
        return None
    if params.axis != (1 if transpose else 0):
        return f"the weight is quantized per channel on axis {params.axis}, not its output-channel axis"
    if transpose and group != 1:
        return "a grouped ConvTranspose weight quantized per channel is not handled"
    return None


def conv_weight_problem(index: GraphIndex, node: onnx.NodeProto) -> str | None:
    """Why align-channels cannot pad ``node``'s weights (None: a constant, or a DequantizeLinear of one it
    handles). The one rule --check uses to say whether align-channels fixes a conv's channels."""
    if node.op_type in QOPERATOR_OPS:
        return qoperator_reason(node)
    if len(node.input) < 2 or index.is_const(node.input[1]):
        return None
    dq = index.producer.get(node.input[1])
    if (dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 2
            or not all(index.is_const(name) for name in dq.input if name)
            or int(get_attr(dq, "block_size", 0) or 0)):
        return "weights are not constant (nor a DequantizeLinear of a constant)"
    # Only types and shapes are read: a --check model carries no data for large initializers.
    scale_shape = index.shape(dq.input[1]) or ()
    rank = len(index.shape(dq.input[0]) or ())
    axis = None
    if len(scale_shape) == 1 and scale_shape[0] != 1:
        axis = int(get_attr(dq, "axis", 1))
        axis = axis % rank if rank else axis
    onnx_type = index.elem_type(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else onnx.TensorProto.UINT8
    dtype = np.dtype(_QUANT_TYPES.get(onnx_type, np.float32))
    empty = np.empty((0,), np.float32)
    weight = QuantizedConst(dq, empty, QuantParams(empty, empty, axis, dtype, dq.input[1], ""))
    return qdq_conv_weight_problem(weight, node.op_type == "ConvTranspose", int(get_attr(node, "group", 1)))


def power_of_two_int8(value: np.ndarray) -> tuple[np.ndarray, float] | None:
    """``value`` exactly as ``q * 2**-p`` with int8 ``q`` in [-127, 127] (the smallest such p <= 24), or None.
    Interpolation weights (1/4, 3/4, 9/16, cubic's k/256, ...) usually are; a power-of-two scale makes the
    DequantizeLinear of ``q`` reproduce the float weights bit for bit."""
    value = np.asarray(value, dtype=np.float64)
    for p in range(25):
        scaled = value * (1 << p)
        if np.abs(scaled).max(initial=0) > 127:
            return None
        if np.array_equal(scaled, np.round(scaled)):
            return scaled.astype(np.int8), 2.0 ** -p
    return None


def quantize_new_weights(index: GraphIndex, editor: GraphEditor, nodes: Sequence[onnx.NodeProto],
                         ops: Sequence[str] = ("Conv", "ConvTranspose", "MatMul")) -> list[onnx.NodeProto]:
    """In a QDQ model, the float weights a pass just created for ``ops`` nodes (pending initializers) become
    ``DequantizeLinear(int8 q, 2**-p, 0)`` with the same float values (:func:`power_of_two_int8`), so an integer
    compiler sees a quantized weight. Returns the DequantizeLinear nodes to place before ``nodes``; weights
    that are not exactly representable are left float (the caller checked that while planning)."""
    added: list[onnx.NodeProto] = []
    for node in nodes:
        if node.op_type not in ops:
            continue
        for slot, name in enumerate(node.input):
            tensor = editor.pending_initializer(name) if name else None
            if tensor is None or tensor.data_type != onnx.TensorProto.FLOAT:
                continue
            exact = power_of_two_int8(tensor_value(tensor))
            if exact is None:
                continue
            q, scale = exact
            inputs = [editor.add_initializer(f"{name}_quantized", q),
                      editor.add_initializer(f"{name}_scale", np.array(scale, dtype=np.float32)),
                      editor.add_initializer(f"{name}_zero_point", np.array(0, dtype=np.int8))]
            dq = editor.make_node("DequantizeLinear", inputs, [index.unique_name(f"{name}_dequantized")],
                                  f"{node.name}_weight_dequantize")
            node.input[slot] = dq.output[0]
            added.append(dq)
    return added


# --- how far a one-step flip upstream can move a float tensor ----------------------------------------------------
# An exact rewrite of a QDQ model may flip a rounding inside a QuantizeLinear (float summation order moves), which
# moves the DequantizeLinear's output by one step. A float op after it carries that move on: an op with Lipschitz
# constant L (in the max norm: |f(a) - f(b)| <= L * max|a - b|) moves its output by at most L steps. The constants
# below are the suprema of |f'| (or of the row sums of the Jacobian), so the bound is sound, not a guess.

_LIPSCHITZ: dict[str, float] = {
    "Identity": 1.0, "Relu": 1.0, "Tanh": 1.0, "Softsign": 1.0, "Softplus": 1.0, "Abs": 1.0, "Neg": 1.0,
    "Sin": 1.0, "Cos": 1.0, "Atan": 1.0, "Clip": 1.0, "Celu": 1.0, "Sigmoid": 0.25,
    "Erf": 1.1284,  # 2 / sqrt(pi), at 0
    "Gelu": 1.1289,  # x * Phi(x): the largest slope, at x = sqrt(2)
    "HardSwish": 1.5,  # x * relu6(x + 3) / 6: slope (2x + 3) / 6, at x = 3
    # each output an average, a maximum or a minimum of inputs (a convex combination or an order statistic)
    "MaxPool": 1.0, "AveragePool": 1.0, "GlobalMaxPool": 1.0, "GlobalAveragePool": 1.0, "ReduceMax": 1.0,
    "ReduceMin": 1.0, "ReduceMean": 1.0,
    "Softmax": 0.5,  # row sums of diag(p) - p p^T: 2 p_i (1 - p_i) <= 1/2
    "LogSoftmax": 2.0,  # x_i - logsumexp(x): 1 + 1
}
"""Unary float ops and their Lipschitz constants in the max norm (attribute-dependent ones: :func:`_lipschitz`)."""

_ELEMENTWISE = frozenset({"Identity", "Relu", "Tanh", "Softsign", "Softplus", "Abs", "Neg", "Sin", "Cos", "Atan",
                          "Clip", "Celu", "Sigmoid", "Erf", "Gelu", "HardSwish", "LeakyRelu", "Elu", "Selu",
                          "HardSigmoid", "Add", "Sub", "Max", "Min"})
"""Ops whose output element i depends on input element i only: a per-channel step keeps its place."""

_MOVES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Gather", "Expand", "Tile",
                    "DepthToSpace", "SpaceToDepth", "Concat", "Split", "Pad"})
"""Ops that only move values (the data operand): each output element is some input element (or a constant pad)."""

_MAX_DEPTH = 128  # three frames a level: well inside the interpreter's recursion limit


@dataclass
class StepBound:
    """How far a float tensor can move when the quantized values it is computed from move by one step."""

    steps: np.ndarray
    """The bound per element, shaped to broadcast against the tensor (per channel where that is known)."""
    sources: tuple[str, ...]
    """The DequantizeLinear nodes whose steps these are."""
    through: tuple[str, ...] = ()
    """The float ops between them and the tensor, nearest the quantizer first (empty: a DequantizeLinear's
    output)."""


def _lipschitz(node: onnx.NodeProto) -> float | None:
    op = node.op_type
    if op == "LeakyRelu":
        return max(1.0, abs(float(get_attr(node, "alpha", 0.01))))
    if op == "Elu":
        return max(1.0, float(get_attr(node, "alpha", 1.0)))
    if op == "Selu":
        return float(get_attr(node, "gamma", 1.0507)) * max(1.0, float(get_attr(node, "alpha", 1.67326)))
    if op == "HardSigmoid":
        return abs(float(get_attr(node, "alpha", 0.2)))
    if op == "Resize":  # nearest picks an input, linear a convex combination; cubic weights can exceed 1
        mode = get_attr(node, "mode", "nearest")
        return 1.0 if mode in ("nearest", "linear") else None
    return _LIPSCHITZ.get(op)


def output_step_bound(index: GraphIndex, name: str) -> StepBound | None:
    """The :class:`StepBound` of float tensor ``name``: its DequantizeLinear's step, or carried through float
    ops with a known Lipschitz constant (unary ops in ``_LIPSCHITZ``, value moves, Add / Sub / Max / Min of
    bounded operands, Mul / Div by a constant). None when ``name`` does not come from a quantizer that way (a
    float tensor of the model, or one behind an op that can amplify a step without bound: Exp, Conv, MatMul...)."""
    found = _bound(index, name, {}, 0)
    return found if found is not None and found.sources else None


def _scalar(bound: StepBound) -> np.ndarray:
    return np.asarray(np.max(bound.steps), dtype=np.float64).reshape(())


def _bound(index: GraphIndex, name: str, seen: dict[str, StepBound | None], depth: int) -> StepBound | None:
    if name in seen:
        return seen[name]
    if depth > _MAX_DEPTH:
        return None
    seen[name] = None  # a cycle (not in a valid graph) or a failed walk: no bound
    if index.has_value(name) or name in index.graph_inputs:
        found: StepBound | None = StepBound(np.zeros(()), ())  # the same values in both models
    else:
        found = _bound_of_producer(index, name, seen, depth)
    seen[name] = found
    return found


def _bound_of_producer(index: GraphIndex, name: str, seen: dict[str, StepBound | None],
                       depth: int) -> StepBound | None:
    node = index.producer.get(name)
    if node is None or not is_default_domain(node):
        return None
    if node.op_type == "DequantizeLinear":
        found = dequantizer_of(index, name)
        if found is None:
            return None
        params = found[1]
        shape = index.shape(name)
        if params.per_channel and shape is None:  # the channel axis cannot be placed: the largest step
            return StepBound(np.asarray(np.max(params.scale), np.float64).reshape(()), (found[0].name,))
        return StepBound(params.steps(len(shape) if shape is not None else 0), (found[0].name,))
    operands = [i for i in node.input if i]
    if node.op_type in ("Add", "Sub", "Max", "Min", "Concat"):
        return _combined(index, node, operands, seen, depth)
    if node.op_type in ("Mul", "Div") and len(operands) == 2:
        if node.op_type == "Mul" and index.const_value(operands[1]) is None:
            operands = operands[::-1]
        constant = index.const_value(operands[1])
        if constant is None or constant.size == 0 or not np.all(np.isfinite(constant)):
            return None
        magnitude = np.abs(constant.astype(np.float64))
        if node.op_type == "Div" and np.min(magnitude) == 0:
            return None
        factor = 1.0 / float(np.min(magnitude)) if node.op_type == "Div" else float(np.max(magnitude))
        return _carried(index, node, operands, factor, seen, depth, keep_shape=False)
    factor = 1.0 if node.op_type in _MOVES else _lipschitz(node)
    if factor is None or not operands:
        return None
    return _carried(index, node, operands, factor, seen, depth, keep_shape=node.op_type in _ELEMENTWISE)


def _combined(index: GraphIndex, node: onnx.NodeProto, operands: Sequence[str], seen: dict[str, StepBound | None],
              depth: int) -> StepBound | None:
    """Add / Sub: the operands' bounds add up; Max / Min: the larger of them, per element; Concat: the largest."""
    parts = [_bound(index, i, seen, depth + 1) for i in operands]
    if not parts or any(p is None for p in parts):
        return None
    steps = parts[0].steps
    for part in parts[1:]:
        if node.op_type == "Concat":
            steps = np.maximum(np.max(steps), np.max(part.steps))
        else:
            steps = (np.add if node.op_type in ("Add", "Sub") else np.maximum)(steps, part.steps)
    if node.op_type == "Concat":
        steps = np.max(steps)
    sources = tuple(dict.fromkeys(s for p in parts for s in p.sources))
    through = tuple(dict.fromkeys(t for p in parts for t in p.through))
    return StepBound(np.asarray(steps, np.float64), sources, (*through, node.op_type))


def _carried(index: GraphIndex, node: onnx.NodeProto, operands: Sequence[str], factor: float,
             seen: dict[str, StepBound | None], depth: int, *, keep_shape: bool) -> StepBound | None:
    """The data operand's (the first) bound times ``factor``: per element where ``node`` is elementwise, else its
    largest. Every other operand (a shape, indices, a clip limit) must be the same in both models (a constant or
    a graph input): one that moves too could move the output anywhere."""
    before = _bound(index, operands[0], seen, depth + 1)
    if before is None:
        return None
    for other in operands[1:]:
        fixed = _bound(index, other, seen, depth + 1)
        if fixed is None or fixed.sources:
            return None
    steps = before.steps if keep_shape else _scalar(before)
    return StepBound(steps * factor, before.sources, (*before.through, node.op_type))
