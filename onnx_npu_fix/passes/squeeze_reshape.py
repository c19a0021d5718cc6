"""Pass ``squeeze-reshape``: a Squeeze whose axes are an input becomes a Reshape to its static output shape.

    X [1,128,1] -> Squeeze(axes = [2]) -> Y [1,128]      becomes   X -> Reshape(shape = [1,128]) -> Y

Squeeze removes size-1 axes and moves no element: its output holds X's elements in X's order, under the shape
with those axes gone. Reshape to that same shape does the same (exact, bit for bit). Conditions, each refused with
its reason otherwise: a default-domain Squeeze whose input and output shapes are static, and no output dimension
is 0 (Reshape would read a 0 as "copy this input dimension").

Why a pass for it: nncase 1.9 (K210) ignores a Squeeze's ``axes`` input (opset 13 on) and removes every size-1
axis ("Shapes must be same" once the next op sees the wrong rank; Silero VAD's [1,128,1] squeezed on axis 2); it
imports the Reshape. It runs only for a target that says so (``squeeze_axes_ignored``, the k210 profile), and only
on the Squeezes that keep a size-1 axis (the ``squeeze-axes`` violations): the others mean the same either way.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.passes.base import Fixes
from onnx_npu_fix.passes.rules import Emit, Match, Rule, RulePass, View


def keeps_a_size_one_axis(before: tuple[int, ...], after: tuple[int, ...]) -> bool:
    """A Squeeze from ``before`` to ``after`` kept a size-1 axis: an importer that removes every one differs."""
    return len(after) != len(before) - list(before).count(1)


class SqueezeToReshape(Rule):
    """Squeeze (axes as an input) that keeps a size-1 axis -> Reshape of its data to its static output shape."""

    op = "Squeeze"
    name = "made a Reshape"
    emits = ("Reshape",)
    min_opset = 13

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        if len(node.input) < 2 or not node.input[1]:
            return None  # axes as an attribute (opset < 13) or none: the target reads those
        before, after = view.index.static_shape(node.input[0]), view.index.static_shape(node.output[0])
        if before is None or after is None:
            return "its input or output shape is not static"
        if not keeps_a_size_one_axis(tuple(before), tuple(after)):
            return None  # removes every size-1 axis: what the target's importer does anyway
        if 0 in after:
            return "its output has a zero-size axis, which Reshape would read as 'copy the input dimension'"
        return Match((node,), shape=tuple(int(d) for d in after))

    def build(self, match: Match, out: Emit) -> None:
        # The Reshape takes the Squeeze's name and place; the axes go if nothing else reads them.
        shape = out.const(np.array(match.shape, np.int64), name=f"{match.anchor.output[0]}_shape")
        out.node("Reshape", [match.input(0), shape], outputs=match.outputs(), name=match.anchor.name)

    def record(self, match: Match, ops: list[str]) -> dict:
        return {"new": list(match.shape)}


class SqueezeReshapePass(RulePass):
    """Squeeze (axes as an input) that keeps a size-1 axis -> Reshape to its static output shape (exact)."""

    name = "squeeze-reshape"
    summary = "a Squeeze that keeps a size-1 axis becomes a Reshape to its static shape (squeeze_axes_ignored)"
    exact = True
    fixes = (Fixes("squeeze-axes", note="a Reshape to the static output shape"),)
    rules = (SqueezeToReshape(),)

    def applies(self, options: FixOptions) -> bool:
        return options.squeeze_axes_ignored
