"""LayerNormalization (opset 17) lowered: its function body in the ONNX standard, over the axes from ``axis`` on,

    mean = ReduceMean(x),  d = x - mean,  var = ReduceMean(d * d)
    y = d * Reciprocal(Sqrt(var + epsilon)) * scale + bias          (bias optional)

Two forms, tried in order, each that definition in float32 (exact: onnxruntime's own kernel accumulates the two
moments its own way, so they agree to float rounding, which the test measures):

    ... Sqrt -> Reciprocal -> Mul(d, .) ...                           Reciprocal accepted
    ... Sqrt -> Div(d, .) ...                                         otherwise

Left alone, with the reason: a LayerNormalization whose Mean / InvStdDev outputs are named (training graphs), or
whose input is not float32 (the standard computes in float32 for every input type, ``stash_type``), or whose
``axis`` counts from the front of an input of unknown rank. The normalization is a builder InstanceNormalization
and GroupNormalization reuse.
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.passes.lowering.emit import attribute, float_match, reduce_mean, scalar
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View

DEFAULT_EPSILON = 1e-5


def normalized(out: Emit, match: Match, x: str, axes: list[int], epsilon: float, divide: bool) -> str:
    """``(x - mean) / sqrt(var + epsilon)`` over ``axes``: times the Reciprocal, or divided by the Sqrt."""
    d = out.node("Sub", [x, reduce_mean(out, match, x, axes)])
    var = reduce_mean(out, match, out.node("Mul", [d, d]), axes)
    std = out.node("Sqrt", [out.node("Add", [var, scalar(out, match, epsilon, "epsilon")])])
    return out.node("Div", [d, std]) if divide else out.node("Mul", [d, out.node("Reciprocal", [std])])


def float32_match(node: onnx.NodeProto, view: View, **found) -> Match | str:
    """:func:`float_match` of a float32 input only (a norm the standard computes in float32)."""
    match = float_match(node, view, **found)
    if not isinstance(match, str) and match.dtype.itemsize != 4:
        return "its input is not float32 (the standard computes the norm in float32)"
    return match


class _LayerNorm(Rule):
    op = "LayerNormalization"
    min_opset = 17
    divide = False

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        if any(node.output[1:]):
            return "its Mean / InvStdDev outputs are named (a training graph's)"
        axis = attribute(node, "axis", -1)
        if axis >= 0:
            shape = view.index.shape(node.input[0])
            if shape is None:
                return "its axis counts from the front of an input of unknown rank"
            axis -= len(shape)
        return float32_match(node, view, axes=list(range(axis, 0)),
                             epsilon=attribute(node, "epsilon", DEFAULT_EPSILON))

    def build(self, match: Match, out: Emit) -> None:
        norm = normalized(out, match, match.input(0), match.axes, match.epsilon, self.divide)
        bias = match.input(2) if len(match.anchor.input) > 2 else ""
        if not bias:
            out.node("Mul", [norm, match.input(1)], outputs=match.outputs())
        else:
            out.node("Add", [out.node("Mul", [norm, match.input(1)]), bias], outputs=match.outputs())


class ViaReciprocal(_LayerNorm):
    name = "layernorm-reciprocal"
    emits = ("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Reciprocal")


class ViaDiv(_LayerNorm):
    name = "layernorm-div"
    emits = ("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div")
    divide = True


RULES = (ViaReciprocal(), ViaDiv())
