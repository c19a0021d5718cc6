"""HardSwish (opset 14) lowered: ``HardSwish(x) = x * max(0, min(1, x / 6 + 1 / 2))`` (the operator's definition,
alpha = 1/6, beta = 1/2), that is ``x * HardSigmoid(x; 1/6, 1/2)``.

Three forms, tried in order, each the definition computed step by step (exact: the same float32 operations in the
same order, ``alpha * x + beta`` then the clamp, then the product):

    x -> HardSigmoid(alpha 1/6, beta 1/2) -> Mul(x, .)                        HardSigmoid accepted
    x -> Mul(1/6) -> Add(1/2) -> Clip(0, 1) -> Mul(x, .)                      Clip accepted
    x -> Mul(1/6) -> Add(1/2) -> Max(0) -> Min(1) -> Mul(x, .)                neither
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.passes.lowering.emit import affine, clip, float_match, min_max
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View

ALPHA, BETA = 1 / 6, 0.5


class _HardSwish(Rule):
    op = "HardSwish"
    min_opset = 14

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        return float_match(node, view)

    def _gate(self, match: Match, out: Emit) -> str:
        """alpha * x + beta, before the clamp."""
        return affine(out, match, match.input(0), ALPHA, BETA)


class ViaHardSigmoid(_HardSwish):
    name = "hardswish-hardsigmoid"
    emits = ("HardSigmoid", "Mul")

    def build(self, match: Match, out: Emit) -> None:
        gate = out.node("HardSigmoid", [match.input(0)], alpha=ALPHA, beta=BETA)
        out.node("Mul", [match.input(0), gate], outputs=match.outputs())


class ViaClip(_HardSwish):
    name = "hardswish-clip"
    emits = ("Mul", "Add", "Clip")

    def build(self, match: Match, out: Emit) -> None:
        gate = clip(out, match, self._gate(match, out), 0.0, 1.0)
        out.node("Mul", [match.input(0), gate], outputs=match.outputs())


class ViaMinMax(_HardSwish):
    name = "hardswish-min-max"
    emits = ("Mul", "Add", "Max", "Min")

    def build(self, match: Match, out: Emit) -> None:
        gate = min_max(out, match, self._gate(match, out), 0.0, 1.0)
        out.node("Mul", [match.input(0), gate], outputs=match.outputs())


RULES = (ViaHardSigmoid(), ViaClip(), ViaMinMax())
