"""What a probe covers: without ``--like`` every limit to its default cap and every op of models.SINGLE_OPS;
with ``--like`` models only what they hold (their op types, each with its most ordinary node as the example to
probe; dilations, kernels and strides up to the largest they have; ranks; whether they are quantized)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix.judge.probe import models as probe_models

DEFAULT_DILATION_CAP = 256
"""Largest dilation tried without a ``--like`` model (the largest in the fixtures' TCNs is 128)."""
DEFAULT_STRIDE_CAP = 16
"""Largest ConvTranspose stride tried without a ``--like`` model."""
DEFAULT_KERNEL_CAP = 16
"""Largest Conv kernel tried without a ``--like`` model."""
DEFAULT_RANK_CAP = 6
"""Largest tensor rank tried without a ``--like`` model."""
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul"})
"""Op types that make a model quantized (the QDQ probes run for it)."""
LIMIT_OPS = frozenset({"Conv", "ConvTranspose", "Resize"})
"""Op types whose support the limit probes decide (their smallest value is the op's own probe)."""
NOT_PROBED = frozenset({"Constant", "Identity"})
"""Op types not probed alone: a model of one constant (or of a copy) says nothing about the compiler."""


@dataclass
class Focus:
    """What the probe covers: dilation caps per (depthwise, rank), the ConvTranspose stride cap (0: none), Resize,
    and the op types to probe alone with an example node of each (None: a probe_models.single_op model); the
    largest Conv kernel per spatial rank, the largest Conv stride (of a quantized model's Convs: ``qdq_stride_cap``),
    the largest tensor rank, and whether the models are quantized (QDQ)."""

    dilation_caps: dict[tuple[bool, int], int]
    stride_cap: int
    resize: bool
    conv: bool
    ops: dict[str, tuple[onnx.ModelProto, onnx.NodeProto] | None]
    kernel_caps: dict[int, int] = field(default_factory=dict)
    conv_stride_cap: int = 0
    rank_cap: int = 0
    qdq: bool = False
    qdq_stride_cap: int = 0
    node_names: set[str] = field(default_factory=set)
    """The names of the models' nodes (what npufix emitted for them is what a fixed model has besides)."""
    resize_factors: set[int] = field(default_factory=set)
    """The integer factors (equal on H and W) of the models' 4-D Resizes, from their inferred shapes."""
    others: dict[str, list[tuple[onnx.ModelProto, onnx.NodeProto]]] = field(default_factory=dict)
    """Per op type, the other models' examples (each model's most ordinary node of the type; the most ordinary
    first): an op the judge rejects in one model may run in another (ops.reconsider)."""


def full_focus() -> Focus:
    """Without ``--like``: every limit to its default cap, every op of probe_models.SINGLE_OPS."""
    caps = {(dw, rank): DEFAULT_DILATION_CAP for dw in (True, False) for rank in (1, 2)}
    return Focus(caps, DEFAULT_STRIDE_CAP, True, True,
                 {op: None for op in probe_models.SINGLE_OPS if op not in NOT_PROBED},
                 kernel_caps={2: DEFAULT_KERNEL_CAP}, conv_stride_cap=DEFAULT_STRIDE_CAP, rank_cap=DEFAULT_RANK_CAP,
                 qdq=True, qdq_stride_cap=DEFAULT_STRIDE_CAP)


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _ordinariness(node: onnx.NodeProto) -> int:
    """How unusual a node's attributes are (the example of an op type is its most ordinary node)."""
    return sum(abs(v) for a in node.attribute if a.type == onnx.AttributeProto.INTS for v in a.ints)


def focus_of(models: Sequence[onnx.ModelProto]) -> Focus:
    """What ``models`` (static shapes, inferred) hold (module docstring)."""
    focus = Focus({}, 0, False, False, {})
    for model in models:
        typed = list(model.graph.value_info) + list(model.graph.input)
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in typed + list(model.graph.output)}
        ranks = {v.name: len(shapes[v.name]) for v in typed}
        focus.rank_cap = max(focus.rank_cap, *ranks.values(), 0)
        quantized = any(node.op_type in QDQ_OPS for node in model.graph.node)
        focus.qdq = focus.qdq or quantized
        own: dict[str, tuple[onnx.ModelProto, onnx.NodeProto]] = {}
        for node in model.graph.node:
            focus.node_names.add(node.name)
            _note_node(focus, node, ranks, shapes)
            _offer(own, model, node)
            if quantized and node.op_type == "Conv":
                focus.qdq_stride_cap = max(focus.qdq_stride_cap, max(_attribute(node, "strides", [1]) or [1]))
        for op, example in own.items():
            focus.others.setdefault(op, []).append(example)
    for op, examples in focus.others.items():
        # Each model's most ordinary node of the type, the most ordinary first (a stable sort: on a tie the
        # earlier model's); the first is the type's example, the others are for ops.reconsider.
        examples.sort(key=lambda e: _ordinariness(e[1]))
        focus.ops[op] = examples.pop(0)
    return focus


def _note_node(focus: Focus, node: onnx.NodeProto, ranks: dict[str, int], shapes: dict[str, list[int]]) -> None:
    """The limits ``node`` asks to probe (``ranks`` / ``shapes``: of its model's typed tensors)."""
    op = node.op_type
    if op == "Conv":
        focus.conv = True
        rank = ranks.get(node.input[0], 3) - 2
        dilation = max(_attribute(node, "dilations", [1]) or [1])
        depthwise = _attribute(node, "group", 1) > 1
        key = (depthwise, 1 if rank <= 1 else 2)
        focus.dilation_caps[key] = max(focus.dilation_caps.get(key, 1), dilation)
        kernel = max(_attribute(node, "kernel_shape", [1]) or [1])
        focus.kernel_caps[key[1]] = max(focus.kernel_caps.get(key[1], 1), kernel)
        focus.conv_stride_cap = max(focus.conv_stride_cap, max(_attribute(node, "strides", [1]) or [1]))
    elif op == "ConvTranspose":
        focus.stride_cap = max(focus.stride_cap, max(_attribute(node, "strides", [1]) or [1]))
    elif op == "Resize":
        focus.resize = True
        focus.stride_cap = max(focus.stride_cap, 2)
        factor = _resize_factor(node, shapes)
        if factor is not None:
            focus.resize_factors.add(factor)


def _resize_factor(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> int | None:
    """The integer factor of a 4-D Resize that scales H and W alike (from the inferred shapes), else None."""
    before, after = shapes.get(node.input[0]), shapes.get(node.output[0])
    if not before or not after or len(before) != 4 or len(after) != 4 or 0 in before[2:]:
        return None
    factors = {after[axis] / before[axis] for axis in (2, 3)}
    factor = factors.pop() if len(factors) == 1 else 0
    return int(factor) if factor > 1 and factor == int(factor) else None


def _offer(examples: dict[str, Any], model: onnx.ModelProto, node: onnx.NodeProto) -> None:
    """Make ``node`` the example of its op type in ``examples`` where it is more ordinary than the one there (op
    types the limit probes decide, constants and other domains have none)."""
    op = node.op_type
    if op in LIMIT_OPS or op in NOT_PROBED or node.domain not in ("", "ai.onnx"):
        return
    known = examples.get(op)
    if known is None or _ordinariness(node) < _ordinariness(known[1]):
        examples[op] = (model, node)


def emitted_ops(models: Sequence[onnx.ModelProto], originals: set[str]) -> dict[str, tuple[onnx.ModelProto,
                                                                                          onnx.NodeProto]]:
    """The op types of the nodes npufix emitted in ``models`` (fixed models; a node whose name is not in
    ``originals``), each with its most ordinary such node, as :func:`focus_of` picks examples."""
    emitted: dict[str, tuple[onnx.ModelProto, onnx.NodeProto]] = {}
    for model in models:
        for node in model.graph.node:
            if node.name not in originals:
                _offer(emitted, model, node)
    return emitted
