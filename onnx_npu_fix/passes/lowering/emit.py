"""What lowering rules share to write their replacements: the match of a float op, constants in the anchor's
element type, and Clip / Min-Max in the form the model's opset reads."""

from __future__ import annotations

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

