"""Clip lowered: ``Clip(x, low, high) = min(max(x, low), high)`` (the operator's definition, a missing bound
leaving its side open), and with ``low = 0`` — Relu6 is ``Clip(x, 0, 6)`` — ``min(Relu(x), high)``.

Two forms, tried in order, each exact bit for bit (the forms pick an input or a bound, as Clip does, in its order,
the low bound first):

    x -> Relu -> [Min(high)]                                   a constant low bound of 0 (Relu6, Relu)
    x -> [Max(low)] -> [Min(high)]                             any bounds, constants or tensors

The bounds are inputs from opset 11 (each may be left out), attributes before it (opset 8 to 10).
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.passes.lowering.emit import BROADCAST_OPSET, attribute, float_match, scalar
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View

Bound = str | float | None
"""A bound as a tensor name (opset 11 on), a number (an attribute before), or None where it is left out."""


def _bounds(node: onnx.NodeProto, view: View) -> tuple[Bound, Bound]:
    if view.opset >= 11:
        low, high = (node.input[k] if len(node.input) > k and node.input[k] else None for k in (1, 2))
        return low, high
    return attribute(node, "min", None), attribute(node, "max", None)


def _is_zero(bound: Bound, view: View) -> bool:
    if isinstance(bound, str):
        value = view.index.const_value(bound)
        return value is not None and value.size == 1 and float(value.reshape(())) == 0.0
    return bound == 0.0


class _Clip(Rule):
    op = "Clip"
    min_opset = BROADCAST_OPSET

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        low, high = _bounds(node, view)
        if low is None and high is None:
            return "a Clip without bounds is no clamp to lower"
        return float_match(node, view, low=low, high=high, low_is_zero=_is_zero(low, view))

    @staticmethod
    def _chain(out: Emit, match: Match, steps: list[tuple[str, Bound]]) -> None:
        """Each step ``(op, bound)`` applied in turn to x (a bound of None: a unary op), the last writing the
        Clip's output."""
        x = match.input(0)
        for k, (op, bound) in enumerate(steps):
            inputs = [x] if bound is None else [x, bound if isinstance(bound, str) else scalar(out, match, bound, op)]
            x = out.node(op, inputs, outputs=match.outputs() if k == len(steps) - 1 else None)


class ViaRelu(_Clip):
    name = "clip-relu"
    emits = ("Relu", "Min")

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        found = super().match(node, view)
        if isinstance(found, Match) and not found.low_is_zero:
            return f"{self.name} needs a constant low bound of 0"
        return found

    def build(self, match: Match, out: Emit) -> None:
        self._chain(out, match, [("Relu", None), *([("Min", match.high)] if match.high is not None else [])])


class ViaMinMax(_Clip):
    name = "clip-min-max"
    emits = ("Max", "Min")

    def build(self, match: Match, out: Emit) -> None:
        steps = [(op, bound) for op, bound in (("Max", match.low), ("Min", match.high)) if bound is not None]
        self._chain(out, match, steps)


RULES = (ViaRelu(), ViaMinMax())
