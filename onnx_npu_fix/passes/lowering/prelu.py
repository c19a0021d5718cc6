"""PRelu lowered: ``PRelu(x, slope) = x if x >= 0 else slope * x`` (slope broadcast to x), which is
``max(x, slope * x)`` where every slope is within [0, 1], and ``Relu(x) - slope * Relu(-x)`` for any slope.

Two forms, tried in order, each exact bit for bit (the one product ``slope * x`` the operator rounds is the one the
form rounds, up to an exact negation; the test measures it on a wide grid):

    x -> Mul(slope) -> Max(x, .)                               a constant slope within [0, 1]
    x -> Relu, Neg -> Relu -> Mul(slope) -> Sub                any slope, a constant or a tensor
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx_npu_fix.passes.lowering.emit import BROADCAST_OPSET, float_match
from onnx_npu_fix.passes.lowering.leakyrelu import relu_difference
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


class ViaMax(Rule):
    op = "PRelu"
    min_opset = BROADCAST_OPSET
    name = "prelu-max"
    emits = ("Mul", "Max")

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        slope = view.index.const_value(node.input[1])
        if slope is None or not (np.all(slope >= 0) and np.all(slope <= 1)):
            return f"{self.name} needs a constant slope within [0, 1]"
        return float_match(node, view)

    def build(self, match: Match, out: Emit) -> None:
        scaled = out.node("Mul", [match.input(0), match.input(1)])
        out.node("Max", [match.input(0), scaled], outputs=match.outputs())


class ViaRelu(Rule):
    op = "PRelu"
    min_opset = BROADCAST_OPSET
    name = "prelu-relu"
    emits = ("Relu", "Neg", "Mul", "Sub")

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        return float_match(node, view)

    def build(self, match: Match, out: Emit) -> None:
        relu_difference(out, match.input(0), match.input(1), match.outputs())


RULES = (ViaMax(), ViaRelu())
