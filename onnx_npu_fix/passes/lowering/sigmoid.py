"""Sigmoid lowered: ``Sigmoid(x) = 1 / (1 + exp(-x)) = (1 + tanh(x / 2)) / 2`` (the operator's definition, and
the same function through tanh: ``tanh(u) = 2 / (1 + exp(-2u)) - 1``).

Two forms, tried in order, each the identity in exact arithmetic (exact: onnxruntime computes Sigmoid with its own
rational approximation, so the forms agree with it to float rounding, not bit for bit; the test measures it):

    x -> Neg -> Exp -> Add(1) -> Div(1, .)                     Exp accepted (exp(-x) = inf gives 1 / inf = 0)
    x -> Mul(1/2) -> Tanh -> Mul(1/2) -> Add(1/2)              otherwise

The forms are builders other lowerings reuse (Swish: ``x * Sigmoid(alpha * x)``).
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.passes.lowering.emit import BROADCAST_OPSET, float_match, scalar
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


def sigmoid_exp(out: Emit, match: Match, x: str, outputs: list[str] | None = None) -> str:
    """``1 / (1 + exp(-x))``."""
    grown = out.node("Add", [out.node("Exp", [out.node("Neg", [x])]), scalar(out, match, 1.0, "one")])
    return out.node("Div", [scalar(out, match, 1.0, "one"), grown], outputs=outputs)


def sigmoid_tanh(out: Emit, match: Match, x: str, outputs: list[str] | None = None) -> str:
    """``tanh(x / 2) / 2 + 1 / 2``."""
    tanh = out.node("Tanh", [out.node("Mul", [x, scalar(out, match, 0.5, "half")])])
    half = out.node("Mul", [tanh, scalar(out, match, 0.5, "half")])
    return out.node("Add", [half, scalar(out, match, 0.5, "half")], outputs=outputs)


class _Sigmoid(Rule):
    op = "Sigmoid"
    min_opset = BROADCAST_OPSET

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        return float_match(node, view)


class ViaExp(_Sigmoid):
    name = "sigmoid-exp"
    emits = ("Neg", "Exp", "Add", "Div")

    def build(self, match: Match, out: Emit) -> None:
        sigmoid_exp(out, match, match.input(0), match.outputs())


class ViaTanh(_Sigmoid):
    name = "sigmoid-tanh"
    emits = ("Mul", "Tanh", "Add")

    def build(self, match: Match, out: Emit) -> None:
        sigmoid_tanh(out, match, match.input(0), match.outputs())


RULES = (ViaExp(), ViaTanh())
