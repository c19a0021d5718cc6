"""GroupNormalization (opset 18) lowered: the channels of ``x`` [N, C, ...] in ``num_groups`` groups of C / G,
each group normalized over its channels and the spatial axes, then ``* scale + bias`` per channel (opset 21; per
group in opset 18, where each group's value stands for its C / G channels), the operator's definition:

    x -> Reshape [N, G, -1] -> the normalization over axis 2 (passes/lowering/layernorm.py) -> Reshape [N, C, ...]
      -> Mul(scale [C, 1, ...]) -> Add(bias [C, 1, ...])
    the same with Div in place of Reciprocal and Mul                                   Reciprocal forbidden

Exact in float32 terms (the standard's function body, in the same order; onnxruntime agrees to float rounding,
which the test measures). Left alone, with the reason: an input whose shape is not static but for the batch
(the Reshape back needs it), C not a multiple of G, scale / bias that are not constants (in a quantized model, a
DequantizeLinear of a constant counts: ``emit.channel_constant``), or an input that is not float32.
"""

from __future__ import annotations

import numpy as np
import onnx

from onnx_npu_fix.passes.lowering.emit import ChannelConstant, attribute, channel_constant, per_channel_affine
from onnx_npu_fix.passes.lowering.layernorm import DEFAULT_EPSILON, float32_match, normalized
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


def _per_channel(constant: ChannelConstant | None, channels: int, groups: int) -> ChannelConstant | str:
    """``constant`` for each channel: as it is ([C]), or each group's value repeated C / G times ([G])."""
    if constant is None:
        return "its scale or bias is not a constant"
    if constant.value.size == channels:
        return constant
    if constant.value.size != groups:
        return "its scale or bias has neither C nor num_groups values"
    if constant.dequantize is not None:
        return "its scale or bias is quantized per group (opset 18): its channels' DequantizeLinear is not made"
    return ChannelConstant(np.repeat(constant.value, channels // groups), constant.dequantize)


class _GroupNorm(Rule):
    op = "GroupNormalization"
    min_opset = 18
    divide = False

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        shape = view.index.shape(node.input[0])
        if shape is None or len(shape) < 3 or not all(isinstance(d, int) and d > 0 for d in shape[1:]):
            return "its input's shape is not static but for the batch"
        groups, channels = attribute(node, "num_groups", 0), shape[1]
        if groups <= 0 or channels % groups:
            return f"its {channels} channels are not a multiple of num_groups {groups}"
        scale, bias = (_per_channel(channel_constant(view, name), channels, groups) for name in node.input[1:3])
        problem = next((p for p in (scale, bias) if isinstance(p, str)), None)
        if problem is not None:
            return problem
        return float32_match(node, view, shape=[0, *shape[1:]], groups=groups, scale=scale, bias=bias,
                             epsilon=attribute(node, "epsilon", DEFAULT_EPSILON))

    def build(self, match: Match, out: Emit) -> None:
        grouped = out.node("Reshape", [match.input(0), out.const(np.array([0, match.groups, -1], np.int64),
                                                                  "grouped_shape")])
        norm = normalized(out, match, grouped, [2], match.epsilon, self.divide)
        back = out.node("Reshape", [norm, out.const(np.array(match.shape, np.int64), "shape")])
        per_channel_affine(out, match, back, match.scale, match.bias, len(match.shape))


class ViaReciprocal(_GroupNorm):
    name = "groupnorm-reciprocal"
    emits = ("Reshape", "ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Reciprocal", "DequantizeLinear")


class ViaDiv(_GroupNorm):
    name = "groupnorm-div"
    emits = ("Reshape", "ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div", "DequantizeLinear")
    divide = True


RULES = (ViaReciprocal(), ViaDiv())
