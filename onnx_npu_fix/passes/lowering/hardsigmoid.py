"""HardSigmoid lowered: ``HardSigmoid(x; alpha, beta) = max(0, min(1, alpha * x + beta))`` (the operator's
definition; alpha 0.2 and beta 0.5 by default).

Two forms, tried in order, each the definition computed step by step (exact: the same float operations in the same
order, the product rounded, then the sum, then the clamp):

    x -> Mul(alpha) -> Add(beta) -> Clip(0, 1)                 Clip accepted
    x -> Mul(alpha) -> Add(beta) -> Max(0) -> Min(1)           otherwise
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.passes.lowering.emit import BROADCAST_OPSET, affine, attribute, clip, float_match, min_max
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


class _HardSigmoid(Rule):
    op = "HardSigmoid"
    min_opset = BROADCAST_OPSET

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        return float_match(node, view, alpha=attribute(node, "alpha", 0.2), beta=attribute(node, "beta", 0.5))

    def _gate(self, match: Match, out: Emit) -> str:
        return affine(out, match, match.input(0), match.alpha, match.beta)


class ViaClip(_HardSigmoid):
    name = "hardsigmoid-clip"
    emits = ("Mul", "Add", "Clip")

    def build(self, match: Match, out: Emit) -> None:
        clip(out, match, self._gate(match, out), 0.0, 1.0, outputs=match.outputs())


class ViaMinMax(_HardSigmoid):
    name = "hardsigmoid-min-max"
    emits = ("Mul", "Add", "Max", "Min")

    def build(self, match: Match, out: Emit) -> None:
        min_max(out, match, self._gate(match, out), 0.0, 1.0, outputs=match.outputs())


RULES = (ViaClip(), ViaMinMax())
