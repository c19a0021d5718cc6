"""LeakyRelu lowered: ``LeakyRelu(x; alpha) = x if x >= 0 else alpha * x`` (alpha 0.01 by default), which is
``max(x, alpha * x)`` for 0 <= alpha <= 1, ``min(x, alpha * x)`` for alpha >= 1, and
``Relu(x) - alpha * Relu(-x)`` for every alpha.

Three forms, tried in order, each exact bit for bit: the one product ``alpha * x`` the operator rounds is the one
the form rounds (``alpha * Relu(-x) = -(alpha * x)`` for x < 0, a negation being exact), and the Max / Min / Sub
only pick or pass it:

    x -> Mul(alpha) -> Max(x, .)                               0 <= alpha <= 1
    x -> Mul(alpha) -> Min(x, .)                               alpha >= 1
    x -> Relu, Neg -> Relu -> Mul(alpha) -> Sub                any alpha
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.passes.lowering.emit import BROADCAST_OPSET, attribute, float_match, scalar
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


def relu_difference(out: Emit, x: str, slope: str, outputs: list[str]) -> None:
    """``Relu(x) - slope * Relu(-x)`` (PRelu reuses it)."""
    negative = out.node("Mul", [out.node("Relu", [out.node("Neg", [x])]), slope])
    out.node("Sub", [out.node("Relu", [x]), negative], outputs=outputs)


class _LeakyRelu(Rule):
    op = "LeakyRelu"
    min_opset = BROADCAST_OPSET
    low, high = float("-inf"), float("inf")

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        alpha = attribute(node, "alpha", 0.01)
        if not self.low <= alpha <= self.high:
            return f"{self.name} needs alpha in [{self.low:g}, {self.high:g}], not {alpha:g}"
        return float_match(node, view, alpha=alpha)


class ViaMax(_LeakyRelu):
    name = "leakyrelu-max"
    emits = ("Mul", "Max")
    low, high = 0.0, 1.0

    def build(self, match: Match, out: Emit) -> None:
        scaled = out.node("Mul", [match.input(0), scalar(out, match, match.alpha, "alpha")])
        out.node("Max", [match.input(0), scaled], outputs=match.outputs())


class ViaMin(_LeakyRelu):
    name = "leakyrelu-min"
    emits = ("Mul", "Min")
    low = 1.0

    def build(self, match: Match, out: Emit) -> None:
        scaled = out.node("Mul", [match.input(0), scalar(out, match, match.alpha, "alpha")])
        out.node("Min", [match.input(0), scaled], outputs=match.outputs())


class ViaRelu(_LeakyRelu):
    name = "leakyrelu-relu"
    emits = ("Relu", "Neg", "Mul", "Sub")

    def build(self, match: Match, out: Emit) -> None:
        relu_difference(out, match.input(0), scalar(out, match, match.alpha, "alpha"), match.outputs())


RULES = (ViaMax(), ViaMin(), ViaRelu())
