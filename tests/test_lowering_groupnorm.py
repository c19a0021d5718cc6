"""GroupNormalization lowered (passes/lowering/groupnorm.py): equal to onnxruntime's to float rounding with opset
21's per-channel and opset 18's per-group scale and bias, within a quantization step inside the Q/DQ unit of a model
onnxruntime's quantizer made, and left with the reason where C is no multiple of num_groups or every form needs
another forbidden op."""

from __future__ import annotations

import helpers
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

CHANNELS, GROUPS = 8, 2
GEN = np.random.default_rng(8)


def _model(opset=21, groups=GROUPS):
    values = CHANNELS if opset >= 21 else groups
    params = [numpy_helper.from_array(GEN.uniform(0.5, 2, values).astype(np.float32), "gn_scale"),
              numpy_helper.from_array(GEN.standard_normal(values).astype(np.float32), "gn_bias")]

    def make(x, y):
        return [helper.make_node("GroupNormalization", [x, "gn_scale", "gn_bias"], [y], name="gnorm",
                                 num_groups=groups, epsilon=1e-5)]
    return helpers.between_convs(make, CHANNELS, opset=opset, extra_inits=params)


@pytest.mark.parametrize("opset", [21, 18])
def test_matches_onnxruntime_to_float_rounding(opset):
    result = helpers.assert_lowered(_model(opset), ["GroupNormalization"])
    assert {"Reshape", "ReduceMean"} <= set(helpers.ops(result.model))


def test_the_div_form_where_reciprocal_is_forbidden():
    assert "Div" in helpers.ops(helpers.assert_lowered(_model(), ["GroupNormalization", "Reciprocal"]).model)


def _infers_a_scalar_after_groupnorm(qdq) -> bool:
    """onnx 1.16 infers a scalar for the DequantizeLinear of the GroupNormalization's output (onnx infers no shape
    for GroupNormalization), which prepare then records as the graph output's shape: the lowered graph's true
    rank conflicts with it, and lower-ops fails (rolled back) on such a model there."""
    (output,) = onnx.shape_inference.infer_shapes(qdq).graph.output
    return output.type.tensor_type.HasField("shape") and not output.type.tensor_type.shape.dim


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    if _infers_a_scalar_after_groupnorm(helpers.quantize_with_onnxruntime(_model(), tmp_path)):
        pytest.skip(f"onnx {onnx.__version__} infers a scalar output shape after GroupNormalization")
    helpers.assert_lowered_quantized(_model(), ["GroupNormalization"], tmp_path)


def test_every_form_forbidden_or_channels_not_in_groups_is_refused_with_the_reason():
    helpers.assert_refused(_model(), ["GroupNormalization", "Reshape"], "groupnorm-reciprocal would emit Reshape",
                           "groupnorm-div would emit Reshape")
    helpers.assert_refused(_model(opset=18, groups=3), ["GroupNormalization"],
                           "8 channels are not a multiple of num_groups 3")


def test_check_names_lower_ops_for_a_groupnorm_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(), ["GroupNormalization"])
