"""ReduceMean lowered (passes/lowering/reducemean.py): each form equals onnxruntime's ReduceMean to float rounding
(axes as an attribute before opset 18, as an input from 18), inside the Q/DQ unit of a model onnxruntime's quantizer
made, and left with the reason where a form's axes do not fit or every form needs another forbidden op; a
LayerNormalization written out by hand (the ReduceMean-based norm of older exports) keeps its values."""

from __future__ import annotations

import helpers
import numpy as np
import pytest
from onnx import helper, numpy_helper

CHANNELS, SIZE = 8, 16


def _model(axes, opset=17, keepdims=1):
    def make(x, y):
        if opset >= 18:
            return [helper.make_node("ReduceMean", [x, "rm_axes"], ["m"], name="mean", keepdims=keepdims),
                    helper.make_node("Sub", [x, "m"], [y], name="centre")]
        return [helper.make_node("ReduceMean", [x], ["m"], name="mean", axes=axes, keepdims=keepdims),
                helper.make_node("Sub", [x, "m"], [y], name="centre")]
    inits = [numpy_helper.from_array(np.array(axes, np.int64), "rm_axes")] if opset >= 18 else []
    return helpers.between_convs(make, CHANNELS, SIZE, opset=opset, extra_inits=inits)


@pytest.mark.parametrize("axes, opset, forbidden, emitted", [
    ([2, 3], 17, ["ReduceMean"], "ReduceSum"),
    ([1], 18, ["ReduceMean"], "ReduceSum"),
    ([2, 3], 17, ["ReduceMean", "ReduceSum"], "GlobalAveragePool"),
    ([-1], 18, ["ReduceMean", "ReduceSum"], "MatMul"),
])
def test_each_form_matches_to_float_rounding(axes, opset, forbidden, emitted):
    result = helpers.assert_lowered(_model(axes, opset), forbidden)
    assert emitted in helpers.ops(result.model)


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    helpers.assert_lowered_quantized(_model([2, 3]), ["ReduceMean"], tmp_path)


def test_a_form_whose_axes_do_not_fit_is_refused_with_the_reason():
    helpers.assert_refused(_model([1], 17), ["ReduceMean", "ReduceSum"], "reducemean-reducesum would emit ReduceSum",
                           "reducemean-globalaveragepool needs the axes from 2 on",
                           "reducemean-matmul needs the last axis alone")


def test_a_hand_written_layernorm_keeps_its_values():
    eps = numpy_helper.from_array(np.array(1e-5, np.float32), "eps")

    def make(x, y):
        return [helper.make_node("ReduceMean", [x], ["mu"], name="mean", axes=[-1]),
                helper.make_node("Sub", [x, "mu"], ["d"], name="centre"),
                helper.make_node("Mul", ["d", "d"], ["dd"], name="square"),
                helper.make_node("ReduceMean", ["dd"], ["var"], name="variance", axes=[-1]),
                helper.make_node("Add", ["var", "eps"], ["ve"], name="plus_eps"),
                helper.make_node("Sqrt", ["ve"], ["sd"], name="std"),
                helper.make_node("Div", ["d", "sd"], [y], name="normalize")]
    model = helpers.between_convs(make, CHANNELS, SIZE, extra_inits=[eps])
    for forbidden in (["ReduceMean"], ["ReduceMean", "ReduceSum"]):
        helpers.assert_lowered(model, forbidden)


def test_check_names_lower_ops_for_a_reducemean_it_can_lower():
    helpers.assert_check_names_lower_ops(_model([2, 3]), ["ReduceMean"])


def test_a_torch_convtasnet_export_keeps_its_values(fixture_path):
    """A torch ConvTasNet export, whose global layer norms are written with ReduceMean."""
    helpers.assert_lowered_export(fixture_path("torch_convtasnet.onnx"), ["ReduceMean"], {"mix": (1, 16000)})
