"""Pass ``resize-scales``: a Resize given its output ``sizes`` is given the ``scales`` they stand for instead.

    X [1,C,28,28] -> Resize(roi, scales = "", sizes = [1,C,224,224]) -> Y   becomes
    X [1,C,28,28] -> Resize(roi, scales = [1,1,8,8]) -> Y                   (Y [1,C,224,224] either way)

A Resize given sizes computes its scale per axis as ``scale = float32(out) / float32(in)`` (the ONNX operator's
definition; onnxruntime's code), then resizes exactly as with that scale; its output size is ``out``. Given
``scales`` instead, the output size is ``floor(in * scale)``. So the rewrite gives each axis that same float32
quotient, and is made only where ``floor(in * scale) == out`` in float32 and in float64 arithmetic (else the
output size would change): the same scales, the same output size, the same values (exact, bit for bit).
Conditions, each refused with its reason otherwise: a default-domain Resize (opset 11 on) whose sizes are a
constant and whose input shape is static; no ``axes`` attribute and ``keep_aspect_ratio_policy`` "stretch" (the
forms whose sizes are not one per axis, or not the output size); no output size of 0.

Why a pass for it: nncase 1.9 (K210) reads a Resize's size only from its ``scales`` input, and refuses the sizes
form torchvision's and smp's exports use ("Can't pull input data for <> : only constant initialization is
supported": the omitted scales); it imports the scales form. It runs only for a target that says so
(``resize_scales_only``, the k210 profile), on the ``resize-sizes`` violations.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import GraphIndex, get_attr
from onnx_npu_fix.passes.base import Fixes
from onnx_npu_fix.passes.rules import Emit, Match, Rule, RulePass, View


def given_sizes(index: GraphIndex, node: onnx.NodeProto) -> bool:
    """A Resize whose output size comes from its ``sizes`` input (the fourth), its ``scales`` omitted or empty."""
    return len(node.input) > 3 and bool(node.input[3]) and (not node.input[2] or index.shape(node.input[2]) == (0,))


def scales_for(before: tuple[int, ...], sizes: np.ndarray) -> np.ndarray | str:
    """The float32 scales a Resize from shape ``before`` to ``sizes`` computes, or why they do not give the same
    output size."""
    if sizes.shape != (len(before),):
        return f"sizes {sizes.tolist()} do not give one size per axis of the input {list(before)}"
    if 0 in before or 0 in sizes.tolist():
        return "an axis of size 0"
    out = sizes.astype(np.float32)
    scales = out / np.asarray(before, np.float32)
    for dtype in (np.float32, np.float64):
        if not np.array_equal(np.floor(np.asarray(before, dtype) * scales.astype(dtype)), out.astype(dtype)):
            return f"floor(in x scale) misses sizes {sizes.tolist()} in {np.dtype(dtype).name}"
    return scales


class SizesToScales(Rule):
    """A Resize given by constant sizes -> the same Resize given by the float32 scales they stand for."""

    op = "Resize"
    name = "given scales"
    emits = ("Resize",)
    min_opset = 11

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        index = view.index
        if not given_sizes(index, node):
            return None  # given scales: no candidate
        if get_attr(node, "axes") is not None:
            return "its sizes cover only the axes of its axes attribute"
        policy = get_attr(node, "keep_aspect_ratio_policy", "stretch") or "stretch"
        if policy not in ("stretch", b"stretch"):
            return f"keep_aspect_ratio_policy {policy!r}: its sizes are a bound, not the output size"
        before, sizes = index.static_shape(node.input[0]), index.const_value(node.input[3])
        if before is None:
            return "its input shape is not static"
        if sizes is None:
            return "its sizes are computed at run time"
        scales = scales_for(tuple(before), np.asarray(sizes).astype(np.int64))
        if isinstance(scales, str):
            return scales
        return Match((node,), scales=scales)

    def build(self, match: Match, out: Emit) -> None:
        # The same node with the scales in the third input and no fourth; the sizes go if nothing else reads them.
        node = match.anchor
        scales = out.const(match.scales, name=f"{node.output[0]}_scales")
        out.like(node, inputs=[node.input[0], node.input[1], scales])

    def record(self, match: Match, ops: list[str]) -> dict:
        return {"old": match.anchor.input[3], "new": [float(s) for s in match.scales]}


class ResizeScalesPass(RulePass):
    """Resize given by constant sizes -> the same Resize given by the float32 scales they stand for (exact)."""

    name = "resize-scales"
    summary = "a Resize given its output sizes is given the scales they stand for (resize_scales_only)"
    exact = True
    fixes = (Fixes("resize-sizes",
                   note="the float32 scales the sizes stand for, where they give the same output size"),)
    rules = (SizesToScales(),)

    def applies(self, options: FixOptions) -> bool:
        return options.resize_scales_only
