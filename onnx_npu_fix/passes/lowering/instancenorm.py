"""InstanceNormalization lowered: ``y = (x - mean) / sqrt(var + epsilon) * scale + B`` per sample and channel,
the moments over the spatial axes (2 on), scale and B per channel (the operator's definition), with the
normalization of passes/lowering/layernorm.py and scale, B as constants of shape [C, 1, ...] (in a quantized
model, their quantized values reshaped behind a DequantizeLinear of the same scale and zero point):

    x -> ReduceMean, Sub, Mul, ReduceMean, Add(eps), Sqrt -> Reciprocal -> Mul -> Mul(scale) -> Add(B)
    the same with Div in place of Reciprocal and Mul                               Reciprocal forbidden

Exact in float32 terms (onnxruntime's kernel accumulates the moments its own way: they agree to float rounding,
which the test measures). Left alone, with the reason: an input of unknown rank, or scale / B that are not
constants (their per-channel shape must be made [C, 1, ...] to broadcast), or an input that is not float32.
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.passes.lowering.emit import attribute, channel_constant, per_channel_affine
from onnx_npu_fix.passes.lowering.layernorm import DEFAULT_EPSILON, float32_match, normalized
from onnx_npu_fix.passes.rules import Emit, Match, Rule, View


class _InstanceNorm(Rule):
    op = "InstanceNormalization"
    min_opset = 6
    divide = False

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:
        shape = view.index.shape(node.input[0])
        if shape is None or len(shape) < 3:
            return "its input's rank is unknown (or below 3)"
        scale, bias = (channel_constant(view, name) for name in node.input[1:3])
        if scale is None or bias is None:
            return "its scale or B is not a constant"
        return float32_match(node, view, axes=list(range(2, len(shape))), rank=len(shape), scale=scale, bias=bias,
                             epsilon=attribute(node, "epsilon", DEFAULT_EPSILON))

    def build(self, match: Match, out: Emit) -> None:
        norm = normalized(out, match, match.input(0), match.axes, match.epsilon, self.divide)
        per_channel_affine(out, match, norm, match.scale, match.bias, match.rank)


class ViaReciprocal(_InstanceNorm):
    name = "instancenorm-reciprocal"
    emits = ("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Reciprocal", "DequantizeLinear")


class ViaDiv(_InstanceNorm):
    name = "instancenorm-div"
    emits = ("ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div", "DequantizeLinear")
    divide = True


RULES = (ViaReciprocal(), ViaDiv())
