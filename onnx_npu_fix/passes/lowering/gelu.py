"""Gelu (opset 20) lowered: ``Gelu(x) = x * (1 + erf(x / sqrt 2)) / 2`` (``approximate = "none"``, the default)
and ``Gelu(x) = x * (1 + tanh(u)) / 2`` with ``u = sqrt(2 / pi) * (x + 0.044715 x^3)`` (``approximate = "tanh"``),
the operator's two definitions.

``approximate = "none"``, three forms, tried in order:

    x -> Mul(1/sqrt 2) -> Erf -> Add(1) -> Mul(x, .) -> Mul(1/2)           Erf accepted: the definition, exact
    the same with Erf by Abramowitz & Stegun 7.1.26 (passes/lowering/erf.py)        bound 3 x Erf's, 1.5e-6
    the same with Erf by its tanh approximation (Gelu's own ``tanh`` form, for erf)  bound 3 x Erf's, 1.2e-3

The approximations' bounds are on the Gelu's output, which is off by ``|x| / 2`` times Erf's error at
``x / sqrt 2``: that error is within Erf's bound, and beyond ``|z|`` = 4 (``|x|`` about 5.7) both forms round to
erf = +-1 in float32, as onnxruntime's Erf does, but for a last step of 1 the polynomial's tail leaves just past
it; so ``|x| / 2`` stays under 3 where the error is more than that step. The test measures them against
onnxruntime's Gelu on a dense grid reaching 1e4.

``approximate = "tanh"``, three forms, each the definition in exact arithmetic (``(1 + tanh(u)) / 2 = Sigmoid(2u)``):

    u -> Tanh -> Add(1) -> Mul(x, .) -> Mul(1/2)                           Tanh accepted
    2u -> Sigmoid -> Mul(x, .)                                             Sigmoid accepted
    2u -> Neg -> Exp -> Add(1) -> Div(1, .) -> Mul(x, .)                   otherwise (passes/lowering/sigmoid.py)

with ``u`` computed as ``x + 0.044715 * x * x * x``, then times ``sqrt(2 / pi)`` (or twice that). Both sides are
as float32 computes them, so the forms agree with onnxruntime's Gelu to float rounding, which the test measures.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import onnx

from onnx_npu_fix.passes.lowering import erf as erf_rules
from onnx_npu_fix.passes.lowering.emit import attribute, float_match, scalar
from onnx_npu_fix.passes.lowering.erf import erf_polynomial, erf_tanh
from onnx_npu_fix.passes.lowering.sigmoid import sigmoid_exp
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View

CUBIC = 0.044715
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


class _Gelu(Rule):
    op = "Gelu"
    min_opset = 20
    approximate = "none"
    """The value of the anchor's ``approximate`` attribute this rule rewrites (another is no candidate)."""

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        if attribute(node, "approximate", b"none") not in (self.approximate, self.approximate.encode()):
            return None
        return float_match(node, view)


def _erf(out: Emit, match: Match, z: str) -> str:
    return out.node("Erf", [z])


class _ErfGelu(_Gelu):
    erf: Callable[[Emit, Match, str], str]
    """The builder of erf(z): Erf itself or one of its approximations (passes/lowering/erf.py)."""

    def build(self, match: Match, out: Emit) -> None:
        x = match.input(0)
        z = out.node("Mul", [x, scalar(out, match, 1 / math.sqrt(2), "inv_sqrt2")])
        grown = out.node("Add", [type(self).erf(out, match, z), scalar(out, match, 1.0, "one")])
        out.node("Mul", [out.node("Mul", [x, grown]), scalar(out, match, 0.5, "half")], outputs=match.outputs())


class ViaErf(_ErfGelu):
    name = "gelu-erf"
    emits = ("Mul", "Erf", "Add")
    erf = _erf


class ViaErfPolynomial(_ErfGelu):
    name = "gelu-erf-polynomial"
    emits = ("Mul", "Add", "Abs", "Div", "Exp", "Neg", "Sub", "Sign")
    exact = False
    bound = 3 * erf_rules.ViaPolynomial.bound
    erf = erf_polynomial


class ViaErfTanh(_ErfGelu):
    name = "gelu-erf-tanh"
    emits = ("Mul", "Add", "Tanh")
    exact = False
    bound = 3 * erf_rules.ViaTanh.bound
    erf = erf_tanh


class _TanhGelu(_Gelu):
    approximate = "tanh"

    @staticmethod
    def inner(out: Emit, match: Match, factor: float) -> str:
        """``factor * (x + 0.044715 * x^3)``."""
        x = match.input(0)
        cube = out.node("Mul", [out.node("Mul", [x, x]), x])
        grown = out.node("Add", [x, out.node("Mul", [cube, scalar(out, match, CUBIC, "cubic")])])
        return out.node("Mul", [grown, scalar(out, match, factor, "scale")])


class ViaTanh(_TanhGelu):
    name = "gelu-tanh"
    emits = ("Mul", "Add", "Tanh")

    def build(self, match: Match, out: Emit) -> None:
        x = match.input(0)
        tanh = out.node("Tanh", [self.inner(out, match, SQRT_2_OVER_PI)])
        grown = out.node("Add", [tanh, scalar(out, match, 1.0, "one")])
        out.node("Mul", [out.node("Mul", [x, grown]), scalar(out, match, 0.5, "half")], outputs=match.outputs())


class ViaSigmoid(_TanhGelu):
    name = "gelu-tanh-sigmoid"
    emits = ("Mul", "Add", "Sigmoid")

    def build(self, match: Match, out: Emit) -> None:
        gate = out.node("Sigmoid", [self.inner(out, match, 2 * SQRT_2_OVER_PI)])
        out.node("Mul", [match.input(0), gate], outputs=match.outputs())


class ViaExp(_TanhGelu):
    name = "gelu-tanh-exp"
    emits = ("Mul", "Add", "Neg", "Exp", "Div")

    def build(self, match: Match, out: Emit) -> None:
        gate = sigmoid_exp(out, match, self.inner(out, match, 2 * SQRT_2_OVER_PI))
        out.node("Mul", [match.input(0), gate], outputs=match.outputs())


RULES = (ViaErf(), ViaErfPolynomial(), ViaErfTanh(), ViaTanh(), ViaSigmoid(), ViaExp())
