"""The small models ``npufix probe`` sends a judge: one op each, with the attribute under test set.

Every builder returns a model that has not been checked yet: the prober checks it (the onnx checker, strict shape
inference: judge.candidates.unbuildable) and never sends one that fails. Weights are small deterministic values
(no randomness: the same parameters give the same bytes, so the judge's cache by SHA-256 answers a repeat).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
"""The opset of every probe model but those of an op type the opset does not have yet (:func:`opset_of`)."""
CHANNELS = 16
"""Channels of the limit probes: a multiple of every alignment a compiler is known to ask for, so that a dilation
or stride probe is not refused for its channel count."""
KERNEL = 3


def _weights(shape: Sequence[int], name: str) -> onnx.TensorProto:
    count = int(np.prod(shape))
    values = ((np.arange(count) % 7) - 3).astype(np.float32) / 8.0
    return numpy_helper.from_array(values.reshape(shape), name)


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, Sequence[int]], outputs: Sequence[str],
           initializers: Sequence[onnx.TensorProto] = (), opset: int = OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "probe",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)) for name, shape in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="npufix-probe")
    return _with_output_shapes(model)


def _with_output_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its outputs typed by shape inference (the checker wants a shape on each); a model inference
    refuses is returned as it is, for the prober's check to refuse with the reason."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception:  # noqa: BLE001 - the prober's check (candidates.unbuildable) reports why
        return model
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model


def dilated_conv(*, depthwise: bool, rank: int, dilation: int, channels: int = CHANNELS) -> onnx.ModelProto:
    """A Conv (``depthwise``: group = channels) of kernel 3 on every spatial axis with ``dilation`` on each; the
    input is just long enough for a few outputs."""
    extent = (KERNEL - 1) * dilation + 4
    spatial = [extent] * rank
    group = channels if depthwise else 1
    weight = _weights([channels, channels // group] + [KERNEL] * rank, "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=group, kernel_shape=[KERNEL] * rank,
                            dilations=[dilation] * rank)
    return _model([node], {"x": [1, channels] + spatial}, ["y"], [weight])


def conv_transpose(*, stride: int, channels: int = CHANNELS) -> onnx.ModelProto:
    """A depthwise 2-D ConvTranspose of ``stride`` with kernel 2·stride, padded to an output of stride × input:
    the form of npufix's exact linear Resize (resize-nearest, --resize-mode exact)."""
    kernel = 2 * stride
    begin, end = stride // 2, stride - stride // 2
    weight = _weights([channels, 1, kernel, kernel], "w")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=channels, kernel_shape=[kernel, kernel],
                            strides=[stride, stride], pads=[begin, begin, end, end])
    return _model([node], {"x": [1, channels, 4, 4]}, ["y"], [weight])


def pointwise_conv(*, channels: int, batch: int = 1) -> onnx.ModelProto:
    """A 1x1 Conv from ``channels`` to ``channels`` channels on ``batch`` images (the channel-alignment and the
    batch probes)."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1])
    return _model([node], {"x": [batch, channels, 8, 8]}, ["y"], [_weights([channels, channels, 1, 1], "w")])


def conv(*, kernel: int = KERNEL, stride: int = 1, rank: int = 2, channels: int = CHANNELS) -> onnx.ModelProto:
    """A group-1 Conv of ``kernel`` and ``stride`` on every one of ``rank`` spatial axes (the kernel-size and
    stride probes), on an input long enough for a few outputs."""
    extent = kernel + 3 * stride
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[kernel] * rank, strides=[stride] * rank)
    return _model([node], {"x": [1, channels] + [extent] * rank}, ["y"],
                  [_weights([channels, channels] + [kernel] * rank, "w")])


def qdq_conv(*, stride: int = 1, channels: int = CHANNELS) -> onnx.ModelProto:
    """A quantized 3x3 Conv of ``stride`` as onnxruntime's QDQ quantizer writes one: the input through
    QuantizeLinear / DequantizeLinear (uint8), the weight an int8 initializer behind a DequantizeLinear, the output
    quantized again (the QDQ-acceptance and the quantized-stride probes)."""
    extent = KERNEL + 3 * stride
    count = channels * channels * KERNEL * KERNEL
    weight = numpy_helper.from_array(((np.arange(count) % 7) - 3).astype(np.int8).reshape(
        [channels, channels, KERNEL, KERNEL]), "w_q")
    scalars = [numpy_helper.from_array(np.array(value, dtype), name) for name, value, dtype in (
        ("x_scale", 1 / 64, np.float32), ("x_zero", 128, np.uint8), ("w_scale", 1 / 8, np.float32),
        ("w_zero", 0, np.int8), ("y_scale", 1 / 16, np.float32), ("y_zero", 128, np.uint8))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"]),
             helper.make_node("Conv", ["x_dq", "w"], ["c"], kernel_shape=[KERNEL, KERNEL], strides=[stride, stride]),
             helper.make_node("QuantizeLinear", ["c", "y_scale", "y_zero"], ["y_q"]),
             helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zero"], ["y"])]
    return _model(nodes, {"x": [1, channels, extent, extent]}, ["y"], [weight, *scalars])


def ranked(*, rank: int) -> onnx.ModelProto:
    """A Relu on a tensor of ``rank`` axes ([1, 16, 4, 4, ...]; the tensor-rank probe)."""
    node = helper.make_node("Relu", ["x"], ["y"])
    return _model([node], {"x": ([1, CHANNELS] + [4] * (rank - 2))[:rank]}, ["y"])


RESIZE_FORMS: dict[str, dict[str, str]] = {
    "linear": {"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
    "nearest": {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
}


def resize(*, form: str, factor: int = 2, channels: int = CHANNELS) -> onnx.ModelProto:
    """A Resize ×``factor`` of H and W in one of :data:`RESIZE_FORMS` (scales given, no sizes)."""
    scales = numpy_helper.from_array(np.array([1, 1, factor, factor], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **RESIZE_FORMS[form])
    return _model([node], {"x": [1, channels, 8, 8]}, ["y"], [scales])


# --- op support without a model to learn from: each op alone, on a [1, 16, 8, 8] input -------------------------

_SHAPE = [1, CHANNELS, 8, 8]
_CONST_LIKE_INPUT = "like-input"
_CHANNEL_VECTOR = "channel-vector"
SINGLE_OPS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    # op type: (attributes, extra constant inputs: a tensor shaped like the input or a per-channel vector)
    **{op: ({}, ()) for op in ("Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "LeakyRelu", "Elu",
                               "Softplus", "Exp", "Log", "Sqrt", "Abs", "Neg", "Erf", "Mish", "Softmax",
                               "GlobalAveragePool", "GlobalMaxPool", "Identity")},
    **{op: ({}, (_CONST_LIKE_INPUT,)) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")},
    "PRelu": ({}, ("prelu-slope",)),
    "Clip": ({}, ("scalar-min", "scalar-max")),
    "MaxPool": ({"kernel_shape": [2, 2], "strides": [2, 2]}, ()),
    "AveragePool": ({"kernel_shape": [2, 2], "strides": [2, 2]}, ()),
    "Transpose": ({"perm": [0, 2, 3, 1]}, ()),
    "ReduceMean": ({"axes": [1], "keepdims": 1}, ()),
    "InstanceNormalization": ({}, (_CHANNEL_VECTOR, _CHANNEL_VECTOR)),
    "LayerNormalization": ({"axis": -1}, ("last-axis-vector", "last-axis-vector")),
    "BatchNormalization": ({}, (_CHANNEL_VECTOR,) * 4),
    "MatMul": ({}, ("matmul-weight",)),
}
"""The op types probed when no ``--like`` model says which matter (each alone, every other input constant)."""


def _extra_input(kind: str, name: str) -> onnx.TensorProto:
    shapes = {_CONST_LIKE_INPUT: _SHAPE, _CHANNEL_VECTOR: [CHANNELS], "prelu-slope": [CHANNELS, 1, 1],
              "scalar-min": [], "scalar-max": [], "last-axis-vector": [_SHAPE[-1]],
              "matmul-weight": [_SHAPE[-1], _SHAPE[-1]]}
    tensor = _weights(shapes[kind], name)
    if kind == "scalar-max":
        tensor = numpy_helper.from_array(np.array(6.0, np.float32), name)
    elif kind == _CHANNEL_VECTOR and name.endswith("_3"):  # a BatchNormalization variance must be positive
        tensor = numpy_helper.from_array(np.ones([CHANNELS], np.float32), name)
    return tensor


def opset_of(op_type: str) -> int:
    """:data:`OPSET`, or the first opset that has ``op_type`` when it came later (Mish: 18); under an opset
    without the op, shape inference cannot type its output and the model is unbuildable."""
    return next((v for v in range(OPSET, onnx.defs.onnx_opset_version() + 1) if onnx.defs.has(op_type, v)), OPSET)


def single_op(op_type: str) -> onnx.ModelProto:
    """``op_type`` alone (an entry of :data:`SINGLE_OPS`) on a float input of shape [1, 16, 8, 8]."""
    attributes, extras = SINGLE_OPS[op_type]
    constants = [_extra_input(kind, f"c_{k}") for k, kind in enumerate(extras)]
    node = helper.make_node(op_type, ["x"] + [c.name for c in constants], ["y"], **attributes)
    return _model([node], {"x": _SHAPE}, ["y"], constants, opset=opset_of(op_type))


def extracted(model: onnx.ModelProto, node: onnx.NodeProto) -> onnx.ModelProto:
    """``node`` alone, as it occurs in ``model`` (static shapes, inferred): its constant inputs (initializers,
    Constant nodes) kept as initializers, the others graph inputs of their inferred type, its attributes as
    they are."""
    return subgraph(model, [node])


def neighbours(model: onnx.ModelProto, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The nodes of ``model`` next to ``node``: the producers of its non-constant inputs and the consumers of its
    outputs (Constant nodes are not neighbours: :func:`subgraph` keeps them as initializers)."""
    inputs, outputs = set(node.input) - {""}, set(node.output) - {""}
    return [other for other in model.graph.node if other is not node and other.op_type != "Constant"
            and (inputs & set(other.output) or outputs & set(other.input))]


def in_context(model: onnx.ModelProto, node: onnx.NodeProto) -> onnx.ModelProto:
    """``node`` with its :func:`neighbours`, as they occur in ``model``: what a compiler that places an op by
    its surroundings (a Reshape alone on the CPU, between two Convs on the NPU) decides for the op in a model."""
    around = {id(n) for n in neighbours(model, node)} | {id(node)}
    return subgraph(model, [n for n in model.graph.node if id(n) in around])


def subgraph(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> onnx.ModelProto:
    """``nodes`` (in ``model``'s order) as a model: the tensors they consume and do not produce are initializers
    where constant and graph inputs of their inferred type otherwise; the tensors they produce and do not consume
    are its outputs. Raises ValueError for a tensor with no inferred type."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant" and n.output}
    typed = {v.name: v for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
    produced = {name for n in nodes for name in n.output if name}
    consumed = {name for n in nodes for name in n.input if name}
    inputs, kept = [], []
    for name in dict.fromkeys(name for n in nodes for name in n.input if name and name not in produced):
        if name in initializers:
            kept.append(initializers[name])
        elif name in constants and constants[name].attribute and constants[name].attribute[0].name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(constants[name].attribute[0].t)
            tensor.name = name
            kept.append(tensor)
        elif name in typed:
            inputs.append(typed[name])
        else:
            raise ValueError(f"input '{name}' of {_node_with(nodes, name, 'input')} has no inferred type")
    names = [name for n in nodes for name in n.output if name and name not in consumed]
    missing = [name for name in names if name not in typed]
    if missing:
        raise ValueError(f"output '{missing[0]}' of {_node_with(nodes, missing[0], 'output')} has no inferred type")
    cut = helper.make_graph(list(nodes), "probe", inputs, [typed[name] for name in names], kept)
    return helper.make_model(cut, opset_imports=list(model.opset_import), producer_name="npufix-probe",
                             ir_version=model.ir_version)


def _node_with(nodes: Sequence[onnx.NodeProto], name: str, side: str) -> str:
    """The first of ``nodes`` with ``name`` among its ``side`` ("input" / "output"), as an error names it."""
    node = next(n for n in nodes if name in getattr(n, side))
    return f"{node.op_type} '{node.name}'"
