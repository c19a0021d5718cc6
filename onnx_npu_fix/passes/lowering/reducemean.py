"""ReduceMean lowered: ``ReduceMean(x; axes) = ReduceSum(x; axes) / n``, n the number of elements reduced (the
operator's definition), the reduction a norm written out by hand (or lowered by lower-ops) stands on.

Three forms, tried in order (exact: the mean of the same elements, to float rounding; the test measures it):

    x -> ReduceSum(axes) -> Div(n)                         any axes, their sizes static
    x -> GlobalAveragePool                                 the axes are every axis from 2 on (NCHW spatial), dims kept
    x -> MatMul(ones [K, 1] / K)                           the last axis alone, of static size K, dims kept

The axes are the attribute before opset 18 and the constant second input from 18 on; a ReduceMean whose axes are
no constant, whose reduced sizes are not static, or that reduces nothing (``noop_with_empty_axes``) is left
alone with that reason.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from onnx_npu_fix.passes.lowering.emit import attribute, float_match, scalar
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


def _axes(node: onnx.NodeProto, view: View, rank: int) -> list[int] | str:
    """The axes ``node`` reduces, each in [0, rank), or why they are not known."""
    if view.opset >= 18 and len(node.input) > 1 and node.input[1]:
        value = view.index.const_value(node.input[1])
        if value is None:
            return "its axes are not a constant"
        axes = [int(a) for a in value.reshape(-1)]
    elif view.opset >= 18 or attribute(node, "axes", None) is None:
        if attribute(node, "noop_with_empty_axes", 0):
            return "it reduces nothing (noop_with_empty_axes)"
        axes = list(range(rank))
    else:
        axes = [int(a) for a in attribute(node, "axes", [])]
    return sorted(a % rank for a in axes)


class _ReduceMean(Rule):
    op = "ReduceMean"
    min_opset = 8

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        shape = view.index.shape(node.input[0])
        if shape is None:
            return "its input's rank is unknown"
        axes = _axes(node, view, len(shape))
        if isinstance(axes, str):
            return axes
        if not all(isinstance(shape[a], int) and shape[a] > 0 for a in axes):
            return "the sizes it reduces are not static"
        return float_match(node, view, axes=axes, rank=len(shape), keepdims=attribute(node, "keepdims", 1),
                           count=math.prod(shape[a] for a in axes), last=shape[-1])


class ViaReduceSum(_ReduceMean):
    name = "reducemean-reducesum"
    emits = ("ReduceSum", "Div")

    def build(self, match: Match, out: Emit) -> None:
        if match.opset >= 13:
            total = out.node("ReduceSum", [match.input(0), out.const(np.array(match.axes, np.int64), "axes")],
                             keepdims=match.keepdims)
        else:
            total = out.node("ReduceSum", [match.input(0)], axes=match.axes, keepdims=match.keepdims)
        out.node("Div", [total, scalar(out, match, match.count, "count")], outputs=match.outputs())


class ViaGlobalAveragePool(_ReduceMean):
    name = "reducemean-globalaveragepool"
    emits = ("GlobalAveragePool",)

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        match = super().match(node, view)
        if isinstance(match, Match) and (match.rank < 3 or match.axes != list(range(2, match.rank))
                                         or not match.keepdims):
            return f"{self.name} needs the axes from 2 on, dims kept"
        return match

    def build(self, match: Match, out: Emit) -> None:
        out.node("GlobalAveragePool", [match.input(0)], outputs=match.outputs())


class ViaMatMul(_ReduceMean):
    name = "reducemean-matmul"
    emits = ("MatMul",)

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        match = super().match(node, view)
        if isinstance(match, Match) and (match.axes != [match.rank - 1] or not match.keepdims):
            return f"{self.name} needs the last axis alone, dims kept"
        return match

    def build(self, match: Match, out: Emit) -> None:
        ones = out.const(np.full((match.last, 1), 1 / match.last, match.dtype), "mean_weights")
        out.node("MatMul", [match.input(0), ones], outputs=match.outputs())


RULES = (ViaReduceSum(), ViaGlobalAveragePool(), ViaMatMul())
