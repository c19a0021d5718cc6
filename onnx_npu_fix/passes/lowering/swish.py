"""Swish (opset 24) lowered: ``Swish(x; alpha) = x * Sigmoid(alpha * x)`` (the operator's definition; alpha 1 by
default, SiLU), with Sigmoid itself or one of its forms (passes/lowering/sigmoid.py).

Three forms, tried in order (exact: the definition, with Sigmoid or with Sigmoid's own forms; onnxruntime's Swish
is an approximation of its own that leaves the definition by a few 1e-6 around x = -16, which the test measures):

    x -> [Mul(alpha)] -> Sigmoid -> Mul(x, .)                                   Sigmoid accepted
    x -> [Mul(alpha)] -> Neg -> Exp -> Add(1) -> Div(1, .) -> Mul(x, .)           Exp accepted
    x -> [Mul(alpha)] -> Mul(1/2) -> Tanh -> Mul(1/2) -> Add(1/2) -> Mul(x, .)   otherwise

The SiLU an exporter writes before opset 24, ``x * Sigmoid(x)`` as two nodes, needs no rule of its own: where the
target forbids Sigmoid, the Sigmoid inside the Mul is lowered and the Mul stays. An onnx without the Swish op
(before 1.19) gets no Swish rule: none is offered, and lower-ops does not list Swish among the ops it lowers.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from onnx_npu_fix.passes.lowering.emit import attribute, float_match, scalar
from onnx_npu_fix.passes.lowering.sigmoid import sigmoid_exp, sigmoid_tanh
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


class _Swish(Rule):
    op = "Swish"
    min_opset = 24
    gate: Callable[[Emit, Match, str], str]

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        return float_match(node, view, alpha=attribute(node, "alpha", 1.0))

    def build(self, match: Match, out: Emit) -> None:
        x = match.input(0)
        scaled = x if match.alpha == 1.0 else out.node("Mul", [x, scalar(out, match, match.alpha, "alpha")])
        out.node("Mul", [x, type(self).gate(out, match, scaled)], outputs=match.outputs())


def _sigmoid(out: Emit, match: Match, x: str) -> str:
    return out.node("Sigmoid", [x])


class ViaSigmoid(_Swish):
    name = "swish-sigmoid"
    emits = ("Mul", "Sigmoid")
    gate = _sigmoid


class ViaExp(_Swish):
    name = "swish-exp"
    emits = ("Mul", "Neg", "Exp", "Add", "Div")
    gate = sigmoid_exp


class ViaTanh(_Swish):
    name = "swish-tanh"
    emits = ("Mul", "Tanh", "Add")
    gate = sigmoid_tanh


RULES = (ViaSigmoid(), ViaExp(), ViaTanh()) if onnx.defs.has("Swish") else ()
