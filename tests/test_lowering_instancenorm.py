"""InstanceNormalization lowered (passes/lowering/instancenorm.py): equal to onnxruntime's kernel to float
rounding (1-D and 2-D, opset 17's and 18's ReduceMean), within a quantization step inside the Q/DQ unit of a model
onnxruntime's quantizer made, and left with the reason where its scale is no constant or every form needs another
forbidden op."""

from __future__ import annotations

import helpers
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

CHANNELS = 8
GEN = np.random.default_rng(6)
SCALE = numpy_helper.from_array(GEN.uniform(0.5, 2, CHANNELS).astype(np.float32), "in_scale")
BIAS = numpy_helper.from_array(GEN.standard_normal(CHANNELS).astype(np.float32), "in_bias")


def _node(x, y):
    return [helper.make_node("InstanceNormalization", [x, "in_scale", "in_bias"], [y], name="inorm", epsilon=1e-5)]


def _model(opset=17):
    return helpers.between_convs(_node, CHANNELS, opset=opset, extra_inits=[SCALE, BIAS])


def _model_1d():
    """[1, C, T]: Conv1d -> InstanceNormalization -> Conv1d, as an audio model has it."""
    w1 = numpy_helper.from_array(GEN.standard_normal((CHANNELS, CHANNELS, 3)).astype(np.float32) / 3, "w1")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1]), *_node("a", "y")]
    return helpers.op_model(nodes, [("x", [1, CHANNELS, 32])], [("y", None)], [w1, SCALE, BIAS])


@pytest.mark.parametrize("model", [_model(), _model(opset=18), _model_1d()], ids=["2d", "opset18", "1d"])
def test_matches_onnxruntime_to_float_rounding(model):
    result = helpers.assert_lowered(model, ["InstanceNormalization"])
    assert "ReduceMean" in helpers.ops(result.model)


def test_the_div_form_where_reciprocal_is_forbidden():
    assert "Div" in helpers.ops(helpers.assert_lowered(_model(), ["InstanceNormalization", "Reciprocal"]).model)


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    helpers.assert_lowered_quantized(_model(), ["InstanceNormalization"], tmp_path)


def test_a_scale_that_is_no_constant_or_every_form_forbidden_is_refused_with_the_reason():
    helpers.assert_refused(_model(), ["InstanceNormalization", "ReduceMean"],
                           "instancenorm-reciprocal would emit ReduceMean")
    model = _model()
    model.graph.input.append(helper.make_tensor_value_info("in_scale", onnx.TensorProto.FLOAT, [CHANNELS]))
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "in_scale"))
    helpers.assert_refused(model, ["InstanceNormalization"], "its scale or B is not a constant")


def test_check_names_lower_ops_for_an_instancenorm_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(), ["InstanceNormalization"])


def test_torchaudio_convtasnet_keeps_its_values(fixture_path):
    """torchaudio's ConvTasNet export: its 17 InstanceNormalization nodes (GroupNorm(1) as torch exports it)."""
    helpers.assert_lowered_export(fixture_path("torchaudio_convtasnet.onnx"), ["InstanceNormalization"],
                                  {"mix": (1, 1, 16000)})
