"""Mish lowered: ``Mish(x) = x * tanh(Softplus(x))`` (the operator's definition), with Softplus itself or its form
(passes/lowering/softplus.py: ``Relu(x) + log(1 + exp(-|x|))``, no exp that overflows).

Two forms, tried in order (exact: the definition in exact arithmetic, which onnxruntime's Mish agrees with to float
rounding; through Softplus's form, whose log term rounds to 0 or 2^-23 where Softplus(x) ~ e^x is below 2^-24,
Mish moves by up to |x| * 2^-24, about 1e-6 near x = -16.6; the test measures both):

    x -> Softplus -> Tanh -> Mul(x, .)                                                   Softplus accepted
    x -> Relu;  x -> Abs -> Neg -> Exp -> Add(1) -> Log;  Add -> Tanh -> Mul(x, .)         otherwise
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from onnx_npu_fix.passes.lowering.emit import BROADCAST_OPSET, float_match
from onnx_npu_fix.passes.lowering.softplus import softplus_stable
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


class _Mish(Rule):
    op = "Mish"
    min_opset = max(18, BROADCAST_OPSET)
    softplus: Callable[[Emit, Match, str], str]

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        return float_match(node, view)

    def build(self, match: Match, out: Emit) -> None:
        x = match.input(0)
        out.node("Mul", [x, out.node("Tanh", [type(self).softplus(out, match, x)])], outputs=match.outputs())


def _softplus(out: Emit, match: Match, x: str) -> str:
    return out.node("Softplus", [x])


class ViaSoftplus(_Mish):
    name = "mish-softplus"
    emits = ("Softplus", "Tanh", "Mul")
    softplus = _softplus


class ViaRelu(_Mish):
    name = "mish-relu-log"
    emits = ("Relu", "Abs", "Neg", "Exp", "Add", "Log", "Tanh", "Mul")
    softplus = softplus_stable


RULES = (ViaSoftplus(), ViaRelu())
