"""Cheap structural checks at load: models the onnx checker accepts but no runtime can run.

The checker does not compare the sizes of a node's operands with each other, so a Conv whose bias has the wrong
length, or whose weight does not match its group, passes it; onnxruntime then refuses the model and nothing can
be validated. These checks catch such a model when it is read, before any pass, with one line naming the node:

  Conv            weight rank >= 3; group >= 1; weight[0] % group == 0; bias length == weight[0];
                  input channels == weight[1] * group (when the input's channel count is declared)
  ConvTranspose   weight[0] % group == 0; bias length == weight[1] * group; input channels == weight[0]
  Resize/Upsample constant scales all finite and > 0
  BatchNormalization  scale, B, mean, var of one length (and the input's channel count, when declared)
  Gemm            bias C broadcastable to the output [M, N]

Sizes come from initializers, Constant nodes and declared shapes only (no shape inference: it runs later).
"""

from __future__ import annotations

import math

import onnx

from onnx_npu_fix.ir.graph import shape_of_value_info
from onnx_npu_fix.ir.ops import is_default_domain
from onnx_npu_fix.ir.weights import tensor_value


def structural_problem(model: onnx.ModelProto) -> str | None:
    """The first structural problem of the main graph, as one line naming the node, or None."""
    graph = model.graph
    checked, constant_nodes = [], []
    for i, node in enumerate(graph.node):  # one read of every op type (100k nodes)
        op = node.op_type
        if op in _CHECKS:
            checked.append((i, node))
        elif op == "Constant":
            constant_nodes.append(node)
    checked = [(i, node) for i, node in checked if is_default_domain(node)]
    if not checked:
        return None
    dims = _Dims(graph, constant_nodes)
    for i, node in checked:
        problem = _CHECKS[node.op_type](node, dims, dims)
        if problem:
            label = node.name or f"#{i}"
            return f"{node.op_type} '{label}': {problem}; the model cannot run as it is (fix the export)"
    return None


class _Dims:
    """Declared sizes by tensor name, read on demand (a 100k-node graph has 100k initializers): initializers,
    Constant nodes, then graph inputs and value_info. ``get`` gives a shape, ``constant`` a constant's value."""

    def __init__(self, graph: onnx.GraphProto, constant_nodes: list[onnx.NodeProto]) -> None:
        self._graph = graph
        self._inits = {t.name: t for t in graph.initializer}
        self._constants: dict[str, onnx.TensorProto] = {}
        for node in constant_nodes:
            if is_default_domain(node):
                for attr in node.attribute:
                    if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                        self._constants[node.output[0]] = attr.t
        self._infos: dict[str, onnx.ValueInfoProto] | None = None

    def tensor(self, name: str) -> onnx.TensorProto | None:
        found = self._inits.get(name)
        return found if found is not None else self._constants.get(name)

    def get(self, name: str):
        tensor = self._inits.get(name)
        if tensor is None:
            tensor = self._constants.get(name)
        if tensor is not None:
            return tensor.dims  # a repeated field: indexable, no copy (this runs for every Conv and BN)
        if self._infos is None:
            self._infos = {vi.name: vi for vi in [*self._graph.input, *self._graph.value_info]}
        info = self._infos.get(name)
        shape = shape_of_value_info(info) if info is not None else None
        return None if shape is None else list(shape)

    def __contains__(self, name: str) -> bool:
        return self.tensor(name) is not None

    def __getitem__(self, name: str) -> onnx.TensorProto:
        tensor = self.tensor(name)
        if tensor is None:
            raise KeyError(name)
        return tensor


def _shape(dims: _Dims, name: str):
    return dims.get(name) if name else None


def _channels(shape) -> int | None:
    if shape is None or len(shape) < 2 or not isinstance(shape[1], int) or shape[1] <= 0:
        return None
    return shape[1]


def _group(node: onnx.NodeProto) -> int:
    for attr in node.attribute:
        if attr.name == "group":
            return attr.i
    return 1


def _conv(node, dims, constants) -> str | None:
    inputs = list(node.input)  # one read of the repeated field (this runs for every Conv of the model)
    if len(inputs) < 2:
        return None
    weight = dims.get(inputs[1])
    group = _group(node)
    if group < 1:
        return f"group {group} must be >= 1"
    if weight is None or len(weight) < 1 or not all(isinstance(d, int) for d in weight):
        return None
    if len(weight) < 3:
        return f"weight {inputs[1]} has rank {len(weight)}, expected [M, C/group, k...]"
    if weight[0] % group:
        return f"weight {inputs[1]} has {weight[0]} filters, not a multiple of group {group}"
    if len(inputs) > 2 and inputs[2]:
        bias = dims.get(inputs[2])
        if bias is not None and (len(bias) != 1 or bias[0] != weight[0]):
            return f"bias {inputs[2]} has shape {list(bias)}, expected [{weight[0]}] (one per output channel)"
    channels = _channels(dims.get(inputs[0]))
    if channels is not None and channels != weight[1] * group:
        return (f"input {inputs[0]} has {channels} channels, but weight {inputs[1]} {list(weight)} with group "
                f"{group} takes {weight[1] * group}")
    return None


def _conv_transpose(node, dims, constants) -> str | None:
    weight = _shape(dims, node.input[1]) if len(node.input) > 1 else None
    group = _group(node)
    if group < 1:
        return f"group {group} must be >= 1"
    if weight is None or any(not isinstance(d, int) for d in weight) or len(weight) < 3:
        return None
    if weight[0] % group:
        return f"weight {node.input[1]} has {weight[0]} input channels, not a multiple of group {group}"
    if len(node.input) > 2 and node.input[2]:
        bias = _shape(dims, node.input[2])
        if bias is not None and (len(bias) != 1 or bias[0] != weight[1] * group):
            return f"bias {node.input[2]} has shape {bias}, expected [{weight[1] * group}] (one per output channel)"
    channels = _channels(_shape(dims, node.input[0]))
    if channels is not None and channels != weight[0]:
        return f"input {node.input[0]} has {channels} channels, but weight {node.input[1]} {weight} takes {weight[0]}"
    return None


def _resize(node, dims, constants) -> str | None:
    position = 1 if node.op_type == "Upsample" else 2
    if len(node.input) <= position or node.input[position] not in constants:
        return None
    scales = tensor_value(constants[node.input[position]])
    if scales.size and not all(math.isfinite(float(v)) and float(v) > 0 for v in scales.ravel()):
        return f"scales {[float(v) for v in scales.ravel()]} must all be finite and > 0"
    return None


def _batchnorm(node, dims, constants) -> str | None:
    inputs = list(node.input)
    get = dims.get
    expected = _channels(get(inputs[0]))
    for name in inputs[1:5]:
        shape = get(name)
        if shape is None or len(shape) != 1 or not isinstance(shape[0], int):
            continue
        if expected is None:
            expected = shape[0]
        elif shape[0] != expected:
            return f"{name} has {shape[0]} values, expected {expected} (one per channel)"
    return None


def _gemm(node, dims, constants) -> str | None:
    if len(node.input) < 3 or not node.input[2]:
        return None
    a, b, c = (_shape(dims, name) for name in node.input[:3])
    if b is None or c is None or len(b) != 2 or len(c) > 2 or not all(isinstance(d, int) for d in (*b, *c)):
        return None
    trans_a = any(attr.name == "transA" and attr.i for attr in node.attribute)
    trans_b = any(attr.name == "transB" and attr.i for attr in node.attribute)
    n = b[0] if trans_b else b[1]
    m = None
    if a is not None and len(a) == 2 and isinstance(a[1 if trans_a else 0], int):
        m = a[1 if trans_a else 0]
    wanted = [m, n][2 - len(c):]
    if any(got not in (1, want) for got, want in zip(c, wanted) if want is not None):
        return f"bias {node.input[2]} has shape {c}, which does not broadcast to the output [{m or 'M'}, {n}]"
    return None


_CHECKS = {"Conv": _conv, "ConvTranspose": _conv_transpose, "Resize": _resize, "Upsample": _resize,
           "BatchNormalization": _batchnorm, "Gemm": _gemm}
