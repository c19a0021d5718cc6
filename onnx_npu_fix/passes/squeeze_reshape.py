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

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import GraphIndex, opset_version
from onnx_npu_fix.passes.base import Change, Fixes, Found, Pass, PassResult, Plan
from onnx_npu_fix.passes.fold_constants import folded_tensor


@dataclass(kw_only=True)
class SqueezeToReshape(Plan):
    """Replace Squeeze ``node`` by a Reshape of its data input to ``shape`` (its static output shape)."""

    node: onnx.NodeProto
    shape: tuple[int, ...]


def keeps_a_size_one_axis(before: tuple[int, ...], after: tuple[int, ...]) -> bool:
    """A Squeeze from ``before`` to ``after`` kept a size-1 axis: an importer that removes every one differs."""
    return len(after) != len(before) - list(before).count(1)


class SqueezeReshapePass(Pass):
    """Squeeze (axes as an input) that keeps a size-1 axis -> Reshape to its static output shape (exact)."""

    name = "squeeze-reshape"
    summary = "a Squeeze that keeps a size-1 axis becomes a Reshape to its static shape (squeeze_axes_ignored)"
    exact = True
    fixes = (Fixes("squeeze-axes", note="a Reshape to the static output shape"),)

    def may_change(self, model: onnx.ModelProto, options: FixOptions) -> bool:
        return options.squeeze_axes_ignored and opset_version(model) >= 13 and \
            any(n.op_type == "Squeeze" for n in model.graph.node)

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        return self.find_each(model, options, "Squeeze", self._plan)

    @staticmethod
    def _plan(index: GraphIndex, node: onnx.NodeProto) -> SqueezeToReshape | str | None:
        """The plan for a Squeeze whose axes are an input, or why not; None for one that is no candidate."""
        if len(node.input) < 2 or not node.input[1]:
            return None  # axes as an attribute (opset < 13) or none: the target reads those
        before, after = index.static_shape(node.input[0]), index.static_shape(node.output[0])
        if before is None or after is None:
            return "its input or output shape is not static"
        if not keeps_a_size_one_axis(tuple(before), tuple(after)):
            return None  # removes every size-1 axis: what the target's importer does anyway
        if 0 in after:
            return "its output has a zero-size axis, which Reshape would read as 'copy the input dimension'"
        return SqueezeToReshape((node.name,), "made a Reshape", node=node, shape=tuple(int(d) for d in after))

    def rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        result = found.report()
        index = GraphIndex(model) if found.plans else None
        for plan in found.plans:
            assert isinstance(plan, SqueezeToReshape) and index is not None
            node = plan.node
            shape_name = index.unique_name(f"{node.output[0]}_shape")
            model.graph.initializer.append(folded_tensor(np.array(plan.shape, np.int64), shape_name))
            reshape = helper.make_node("Reshape", [node.input[0], shape_name], list(node.output), name=node.name)
            node.CopyFrom(reshape)  # in place: the node keeps its position and name; the axes go if unread
            result.changes.append(Change(node.name, "Squeeze", plan.action, new=list(plan.shape)))
        return result
