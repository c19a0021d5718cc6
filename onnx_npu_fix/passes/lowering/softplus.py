"""Softplus lowered: ``Softplus(x) = log(1 + exp(x)) = max(x, 0) + log(1 + exp(-|x|))`` (the operator's
definition, and the same function written so that no exp overflows: for x > 0, ``log(1 + e^x) = x + log(e^-x +
1)``).

One form (exact: the identity in exact arithmetic; it agrees with onnxruntime's Softplus, which computes
``log1p(exp(-|x|))``, to float rounding — where ``exp(-|x|)`` is below half a float step of 1 the sum rounds to 1
and the log term is 0 where log1p gives that small value, an absolute difference below 2^-24; the test measures it):

    x -> Relu;  x -> Abs -> Neg -> Exp -> Add(1) -> Log;  Add

The plain ``Log(1 + Exp(x))`` is not offered: ``exp(x)`` overflows to infinity above x = 88 (float32), where
Softplus is x.
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.passes.lowering.emit import BROADCAST_OPSET, float_match, scalar
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


def softplus_stable(out: Emit, match: Match, x: str, outputs: list[str] | None = None) -> str:
    """``Relu(x) + Log(1 + Exp(-Abs(x)))`` (Mish reuses it)."""
    decay = out.node("Exp", [out.node("Neg", [out.node("Abs", [x])])])
    tail = out.node("Log", [out.node("Add", [decay, scalar(out, match, 1.0, "one")])])
    return out.node("Add", [out.node("Relu", [x]), tail], outputs=outputs)


class ViaRelu(Rule):
    op = "Softplus"
    name = "softplus-relu-log"
    emits = ("Relu", "Abs", "Neg", "Exp", "Add", "Log")
    min_opset = BROADCAST_OPSET

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        return float_match(node, view)

    def build(self, match: Match, out: Emit) -> None:
        softplus_stable(out, match, match.input(0), match.outputs())


RULES = (ViaRelu(),)
