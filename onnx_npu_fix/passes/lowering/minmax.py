"""Max and Min with a constant scalar lowered to the clamp they are: ``max(x, 0) = Relu(x)``,
``max(x, low) = Clip(x, low)``, ``min(x, high) = Clip(x, -, high)``, and the pair ``min(max(x, low), high)`` —
how a Relu6 or a HardSigmoid's clamp is written without Clip — ``= Clip(x, low, high)`` (Clip's definition).

Forms, tried in order, each exact bit for bit (Clip and Relu pick the input or the bound as Max and Min do):

    Max(x, 0) -> Relu                                         a bound of 0, no Min after it
    Max(x, low) [-> Min(., high)] -> Clip(x, low[, high])     the Min read by nothing else, its bound a scalar too
    Min(x, high) -> Clip(x, -, high)

The bounds are Clip's inputs from opset 11, its attributes before; a Max or Min of a tensor, of more than two
inputs, or of a bound that is not a constant scalar, is left alone with that reason.
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.passes.lowering.emit import BROADCAST_OPSET, float_match, scalar
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


def _bound(node: onnx.NodeProto, view: View) -> tuple[str, float] | str:
    """(x, the bound) of ``node`` = Max / Min of x and a constant scalar, or why not."""
    if len(node.input) != 2:
        return f"its {node.op_type} has {len(node.input)} inputs, not a tensor and a bound"
    for x, other in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
        value = view.index.const_value(other)
        if value is not None and value.size == 1 and view.index.const_value(x) is None:
            return x, float(value.reshape(()))
    return "neither input is a constant scalar"


def _clip(out: Emit, match: Match, x: str, low: float | None, high: float | None) -> None:
    if match.opset >= 11:
        inputs = [x, scalar(out, match, low, "low") if low is not None else "",
                  *([scalar(out, match, high, "high")] if high is not None else [])]
        out.node("Clip", inputs, outputs=match.outputs())
    else:
        out.node("Clip", [x], outputs=match.outputs(),
                 **({"min": low} if low is not None else {}), **({"max": high} if high is not None else {}))


class _MaxMin(Rule):
    op = "Max"
    min_opset = BROADCAST_OPSET

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        found = _bound(node, view)
        if isinstance(found, str):
            return found
        x, low = found
        after = view.index.single_consumer(node.output[0])
        high = _bound(after, view) if after is not None and after.op_type == "Min" else None
        chain = isinstance(high, tuple) and high[0] == node.output[0] and view.only_reader(node.output[0], after)
        match = float_match(node, view, x=x, low=low, high=high[1] if chain else None)
        if chain and isinstance(match, Match):
            match.nodes = (node, after)
        return match


class ViaRelu(_MaxMin):
    name = "max-relu"
    emits = ("Relu",)

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        match = super().match(node, view)
        if isinstance(match, Match) and (match.low != 0.0 or match.high is not None):
            return f"{self.name} needs a bound of 0 and no Min after it"
        return match

    def build(self, match: Match, out: Emit) -> None:
        out.node("Relu", [match.x], outputs=match.outputs())


class MaxViaClip(_MaxMin):
    name = "max-clip"
    emits = ("Clip",)

    def build(self, match: Match, out: Emit) -> None:
        _clip(out, match, match.x, match.low, match.high)


class MinViaClip(Rule):
    op = "Min"
    min_opset = BROADCAST_OPSET
    name = "min-clip"
    emits = ("Clip",)

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        found = _bound(node, view)
        if isinstance(found, str):
            return found
        return float_match(node, view, x=found[0], high=found[1])

    def build(self, match: Match, out: Emit) -> None:
        _clip(out, match, match.x, None, match.high)


RULES = (ViaRelu(), MaxViaClip(), MinViaClip())
