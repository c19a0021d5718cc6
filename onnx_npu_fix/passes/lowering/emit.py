"""What lowering rules share to write their replacements: the match of a float op, constants in the anchor's
element type, and Clip / Min-Max in the form the model's opset reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnx_npu_fix.passes.rules import Emit, Match, View

BROADCAST_OPSET = 8
"""The opset from which Add, Mul, Div, Sub (7) and Max, Min (8) broadcast a scalar constant: where lowering rules
begin (``min_opset``)."""


def float_type(view: View, name: str) -> np.dtype | None:
    """The numpy dtype of float tensor ``name`` (float32 / float16 / float64), or None (another or unknown type:
    a lowering with float constants does not apply)."""
    elem = view.index.elem_type(name)
    if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
        return None
    return helper.tensor_dtype_to_np_dtype(elem)


def float_match(node: onnx.NodeProto, view: View, **found: Any) -> Match | str:
    """The match of ``node`` alone when its first input is a float tensor of known type (``dtype``, ``opset`` and
    ``found`` on the Match), else the reason it is refused."""
    dtype = float_type(view, node.input[0])
    if dtype is None:
        return "its input is not a float tensor of known type"
    return Match((node,), dtype=dtype, opset=view.opset, **found)


def attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    """The value of attribute ``name`` of ``node``, or ``default``."""
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def scalar(out: Emit, match: Match, value: float, suffix: str) -> str:
    """A scalar constant of the match's element type (``match.dtype``)."""
    return out.const(np.array(value, match.dtype), suffix)


def affine(out: Emit, match: Match, x: str, scale: float, shift: float) -> str:
    """``scale * x + shift``, the product rounded first (as HardSigmoid computes it)."""
    scaled = out.node("Mul", [x, scalar(out, match, scale, "alpha")])
    return out.node("Add", [scaled, scalar(out, match, shift, "beta")])


def clip(out: Emit, match: Match, x: str, low: float, high: float, *, outputs: list[str] | None = None) -> str:
    """Clip(x, low, high): bounds as inputs from opset 11, as attributes before (``match.opset``)."""
    if match.opset >= 11:
        return out.node("Clip", [x, scalar(out, match, low, "low"), scalar(out, match, high, "high")],
                        outputs=outputs)
    return out.node("Clip", [x], outputs=outputs, min=float(low), max=float(high))


def min_max(out: Emit, match: Match, x: str, low: float | None, high: float | None, *,
            outputs: list[str] | None = None) -> str:
    """``min(max(x, low), high)``, a side left out where its bound is None (Clip's order: the low bound first)."""
    steps = [(op, bound, suffix) for op, bound, suffix in (("Max", low, "low"), ("Min", high, "high"))
             if bound is not None]
    for k, (op, bound, suffix) in enumerate(steps):
        x = out.node(op, [x, scalar(out, match, bound, suffix)], outputs=outputs if k == len(steps) - 1 else None)
    return x



def reduce_mean(out: Emit, match: Match, x: str, axes: list[int]) -> str:
    """ReduceMean(x) over ``axes``, dims kept: axes as an input from opset 18, as an attribute before."""
    if match.opset >= 18:
        return out.node("ReduceMean", [x, out.const(np.array(axes, np.int64), "axes")], keepdims=1)
    return out.node("ReduceMean", [x], axes=list(axes), keepdims=1)


@dataclass(frozen=True)
class ChannelConstant:
    """A per-channel parameter ([C]) to broadcast against [N, C, ...] as [C, 1, ...]: a float constant, or the
    quantized constant of a DequantizeLinear (a quantized model's), which is re-emitted reshaped behind a
    DequantizeLinear of the same scale and zero point, so that it rounds as the original did."""

    value: np.ndarray
    dequantize: onnx.NodeProto | None = None


def channel_constant(view: View, name: str) -> ChannelConstant | None:
    """``name`` as a :class:`ChannelConstant`, or None (neither a constant nor a constant's DequantizeLinear)."""
    value = view.index.const_value(name)
    if value is not None:
        return ChannelConstant(value.reshape(-1))
    node = view.index.producer.get(name)
    if node is None or node.op_type != "DequantizeLinear":
        return None
    quantized, scale = (view.index.const_value(n) for n in node.input[:2])
    if quantized is None or scale is None or (len(node.input) > 2 and node.input[2]
                                              and view.index.const_value(node.input[2]) is None):
        return None
    if scale.size != 1 and (quantized.ndim != 1 or attribute(node, "axis", 1) not in (0, -1)):
        return None  # per-axis over another axis than the channels': not a [C] parameter
    return ChannelConstant(quantized.reshape(-1), node)


def channel_input(out: Emit, constant: ChannelConstant, rank: int, suffix: str) -> str:
    """``constant`` as a [C, 1, ...] tensor of ``rank`` dims, read by the replacement."""
    shaped = out.const(constant.value.reshape((-1,) + (1,) * (rank - 2)), suffix)
    node = constant.dequantize
    if node is None:
        return shaped
    return out.node("DequantizeLinear", [shaped, *node.input[1:]], axis=0)


def per_channel_affine(out: Emit, match: Match, y: str, scale: ChannelConstant, bias: ChannelConstant,
                       rank: int) -> str:
    """``y * scale + bias``, both per channel of a rank-``rank`` tensor, written to the match's outputs (the last
    step of InstanceNormalization and GroupNormalization)."""
    scaled = out.node("Mul", [y, channel_input(out, scale, rank, "scale")])
    return out.node("Add", [scaled, channel_input(out, bias, rank, "bias")], outputs=match.outputs())
