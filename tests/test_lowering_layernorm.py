"""LayerNormalization lowered (passes/lowering/layernorm.py): its standard function body equals onnxruntime's
kernel to float rounding (with and without a bias, a negative and a positive axis, opset 17's ReduceMean axes
attribute and opset 18's axes input), within a quantization step inside the Q/DQ unit of a model onnxruntime's
quantizer made, and left with the reason where its form needs another forbidden op or its Mean output is named."""

from __future__ import annotations

import helpers
import numpy as np
import pytest
from onnx import helper, numpy_helper

CHANNELS, SIZE = 8, 16
GEN = np.random.default_rng(5)
SCALE = numpy_helper.from_array(GEN.uniform(0.5, 2, SIZE).astype(np.float32), "ln_scale")
BIAS = numpy_helper.from_array(GEN.standard_normal(SIZE).astype(np.float32), "ln_bias")


def _model(axis=-1, bias=True, opset=17, outputs=("b",)):
    def make(x, y):
        inputs = [x, "ln_scale", "ln_bias"] if bias else [x, "ln_scale"]
        return [helper.make_node("LayerNormalization", inputs, [y, *outputs[1:]], name="ln", axis=axis,
                                 epsilon=1e-5)]
    return helpers.between_convs(make, CHANNELS, SIZE, opset=opset, extra_inits=[SCALE, BIAS])


@pytest.mark.parametrize("axis, bias, opset", [(-1, True, 17), (3, False, 17), (-1, True, 18)])
def test_matches_onnxruntime_to_float_rounding(axis, bias, opset):
    result = helpers.assert_lowered(_model(axis, bias, opset), ["LayerNormalization"])
    assert "ReduceMean" in helpers.ops(result.model) and "Reciprocal" in helpers.ops(result.model)


def test_the_div_form_where_reciprocal_is_forbidden():
    result = helpers.assert_lowered(_model(), ["LayerNormalization", "Reciprocal"])
    assert "Div" in helpers.ops(result.model)


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    helpers.assert_lowered_quantized(_model(), ["LayerNormalization"], tmp_path)


def test_every_form_forbidden_or_a_named_mean_is_refused_with_the_reason():
    helpers.assert_refused(_model(), ["LayerNormalization", "ReduceMean"],
                           "layernorm-reciprocal would emit ReduceMean", "layernorm-div would emit ReduceMean")
    helpers.assert_refused(_model(outputs=("b", "mean")), ["LayerNormalization"], "Mean / InvStdDev outputs")


def test_check_names_lower_ops_for_a_layernorm_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(), ["LayerNormalization"])
