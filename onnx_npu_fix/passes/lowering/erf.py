"""Erf lowered where it feeds a Gelu — ``x * (1 + erf(x / sqrt 2)) / 2``, as exporters write Gelu before opset 20
— by an approximation, each labelled with its bound (the largest absolute difference on Erf's output, measured
against onnxruntime's Erf on a dense grid; not exact, so ``--strict`` refuses them):

    erf(z) ~ sign(z) * (1 - (a1 t + a2 t^2 + a3 t^3 + a4 t^4 + a5 t^5) * exp(-z^2)),  t = 1 / (1 + p |z|)
        Abramowitz & Stegun 7.1.26 (p = 0.3275911, a1..a5 below): |error| <= 1.5e-7 in exact arithmetic,
        float32 rounding adds a few steps of 1 (measured 4.25e-7)                           bound 5e-7
    erf(z) ~ tanh(2 / sqrt(pi) * (z + 0.044715 * 2 * z^3))
        the tanh approximation of Gelu (Gelu's ``approximate = "tanh"``) rewritten for erf(z), z = x / sqrt 2:
        largest near |z| = 1.83 (measured 3.58e-4)                                          bound 4e-4

An Erf elsewhere is left alone with that reason: where its argument is not x / sqrt 2 of the Gelu's x, nothing
holds the error to what Gelu's own tanh approximation is known to give. The forms are builders Gelu reuses.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from onnx_npu_fix.passes.lowering.emit import BROADCAST_OPSET, float_match, scalar
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View

P = 0.3275911
A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
TANH_CUBIC = 0.044715 * 2


def erf_polynomial(out: Emit, match: Match, z: str, outputs: list[str] | None = None) -> str:
    """Abramowitz & Stegun 7.1.26, the polynomial in t by Horner's rule."""
    magnitude = out.node("Abs", [z])
    grown = out.node("Add", [out.node("Mul", [magnitude, scalar(out, match, P, "p")]), scalar(out, match, 1, "one")])
    t = out.node("Div", [scalar(out, match, 1.0, "one"), grown])
    poly = scalar(out, match, A[-1], "a5")
    for k, a in reversed(list(enumerate(A[:-1], 1))):
        poly = out.node("Add", [out.node("Mul", [poly, t]), scalar(out, match, a, f"a{k}")])
    decay = out.node("Exp", [out.node("Neg", [out.node("Mul", [z, z])])])
    tail = out.node("Mul", [out.node("Mul", [poly, t]), decay])
    body = out.node("Sub", [scalar(out, match, 1.0, "one"), tail])
    return out.node("Mul", [out.node("Sign", [z]), body], outputs=outputs)


def erf_tanh(out: Emit, match: Match, z: str, outputs: list[str] | None = None) -> str:
    """``tanh(2 / sqrt(pi) * (z + 0.08943 * z^3))``."""
    cube = out.node("Mul", [out.node("Mul", [z, z]), z])
    inner = out.node("Add", [z, out.node("Mul", [cube, scalar(out, match, TANH_CUBIC, "cubic")])])
    scaled = out.node("Mul", [inner, scalar(out, match, 2 / math.sqrt(math.pi), "scale")])
    return out.node("Tanh", [scaled], outputs=outputs)


Constant = tuple[float, float]
"""A scalar constant's value and how far it may stand from the number it stands for: 0 for a float constant, one
quantization step (its scale) behind a DequantizeLinear, where a quantizer rounded it to its grid (onnxruntime
1.19's puts 1/sqrt 2 half a step below it: 127 steps of sqrt 2 / 255 above a zero point of 128)."""


def _value(view: View, name: str) -> Constant | None:
    """The scalar constant ``name``, also behind a DequantizeLinear of a constant (a quantized model's)."""
    value, step = view.index.const_value(name), 0.0
    node = view.index.producer.get(name)
    if value is None and node is not None and node.op_type == "DequantizeLinear":
        q, scale = (view.index.const_value(n) for n in node.input[:2])
        zero = view.index.const_value(node.input[2]) if len(node.input) > 2 and node.input[2] else 0
        if q is not None and scale is not None and zero is not None and scale.size == 1:
            value = (q.astype(np.float64) - np.asarray(zero, np.float64)) * scale
            step = abs(float(scale.reshape(())))
    return (float(value.reshape(())), step) if value is not None and value.size == 1 else None


def _is(found: Constant | None, number: float) -> bool:
    """``found`` stands for ``number``: within its step of it, or to float rounding."""
    return found is not None and abs(found[0] - number) <= max(found[1], 1e-6 * abs(number))


def _up(view: View, name: str) -> onnx.NodeProto | None:
    """The producer of ``name``, seen through a QuantizeLinear -> DequantizeLinear pair."""
    return view.index.producer.get(_source(view, name))


def _down(view: View, name: str) -> onnx.NodeProto | None:
    """The only reader of ``name``, seen through a QuantizeLinear -> DequantizeLinear pair."""
    node = view.index.single_consumer(name) if view.only_reader(name, view.index.single_consumer(name)) else None
    if node is not None and node.op_type == "QuantizeLinear":
        dequantize = view.index.single_consumer(node.output[0])
        if dequantize is not None and dequantize.op_type == "DequantizeLinear":
            return _down(view, dequantize.output[0])
    return node


def _scale_of(view: View, node: onnx.NodeProto | None) -> tuple[str, Constant] | None:
    """(x, the factor) where ``node`` is ``x * c`` or ``x / c`` with a constant scalar c (as x * 1/c, whose step is
    the most 1/c moves when c moves by its step)."""
    if node is None or node.op_type not in ("Mul", "Div") or len(node.input) != 2:
        return None
    c = _value(view, node.input[1])
    if c is None or abs(c[0]) <= c[1]:
        return None
    value, step = c
    return node.input[0], (c if node.op_type == "Mul" else (1 / value, step / (abs(value) * (abs(value) - step))))


def _source(view: View, name: str) -> str:
    """``name``, or the float tensor a QuantizeLinear -> DequantizeLinear pair producing it reads."""
    node = view.index.producer.get(name)
    if node is not None and node.op_type == "DequantizeLinear":
        quantize = view.index.producer.get(node.input[0])
        if quantize is not None and quantize.op_type == "QuantizeLinear":
            return quantize.input[0]
    return name


def feeds_a_gelu(node: onnx.NodeProto, view: View) -> bool:
    """``node`` is the Erf of ``x * (1 + erf(x / sqrt 2)) [* 1/2]``: its argument x / sqrt 2, its only reader
    Add(1), that Add's only reader a Mul by x (or by x / 2); Q/DQ pairs between them are seen through."""
    scaled = _scale_of(view, _up(view, node.input[0]))
    if scaled is None or not _is(scaled[1], 1 / math.sqrt(2)):
        return False
    x = _source(view, scaled[0])
    add = _down(view, node.output[0])
    if add is None or add.op_type != "Add" or len(add.input) != 2:
        return False
    one = next((_value(view, n) for n in add.input if _value(view, n) is not None), None)
    mul = _down(view, add.output[0])
    if not _is(one, 1.0) or mul is None or mul.op_type != "Mul":
        return False
    others = [_source(view, n) for n in mul.input]
    halves = [_scale_of(view, _up(view, n)) for n in mul.input]
    return x in others or any(h is not None and _source(view, h[0]) == x and _is(h[1], 0.5) for h in halves)


class _Erf(Rule):
    op = "Erf"
    min_opset = max(9, BROADCAST_OPSET)
    exact = False

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        if not feeds_a_gelu(node, view):
            return f"{self.name}: this Erf feeds no Gelu (x * (1 + erf(x / sqrt 2)) / 2), the only place its " \
                   "approximation is offered"
        return float_match(node, view)


class ViaPolynomial(_Erf):
    name = "erf-polynomial"
    emits = ("Abs", "Mul", "Add", "Div", "Neg", "Exp", "Sub", "Sign")
    bound = 5e-7

    def build(self, match: Match, out: Emit) -> None:
        erf_polynomial(out, match, match.input(0), match.outputs())


class ViaTanh(_Erf):
    name = "erf-tanh"
    emits = ("Mul", "Add", "Tanh")
    bound = 4e-4

    def build(self, match: Match, out: Emit) -> None:
        erf_tanh(out, match, match.input(0), match.outputs())


RULES = (ViaPolynomial(), ViaTanh())
