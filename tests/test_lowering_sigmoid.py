"""Sigmoid lowered (passes/lowering/sigmoid.py): each form equal to onnxruntime's Sigmoid to float rounding on float
models (measured on a wide input grid), within a quantization step inside the Q/DQ unit of a model onnxruntime's
quantizer made, and refused with its reason when every form needs another forbidden op."""

from __future__ import annotations

import helpers
import numpy as np
import pytest
from onnx import helper

ROUNDING = 4 * np.finfo(np.float32).eps  # a few float32 steps of the output's largest value, 1


def _node(x, y):
    return [helper.make_node("Sigmoid", [x], [y], name="sig")]


def _model():
    return helpers.between_convs(_node)


@pytest.mark.parametrize("forbidden, emitted", [
    (["Sigmoid"], ["Neg", "Exp", "Add", "Div"]),
    (["Sigmoid", "Exp"], ["Mul", "Tanh", "Mul", "Add"]),
])
def test_each_form_matches_to_float_rounding(forbidden, emitted):
    result = helpers.assert_lowered(_model(), forbidden)
    assert helpers.ops(result.model) == ["Conv", *emitted, "Conv"]
    assert helpers.lowered_error(_node, forbidden) <= ROUNDING


@pytest.mark.parametrize("forbidden", [["Sigmoid"], ["Sigmoid", "Exp"]])
def test_inside_the_qdq_unit_of_a_quantized_model(forbidden, tmp_path):
    helpers.assert_lowered_quantized(_model(), forbidden, tmp_path)


def test_every_form_forbidden_is_refused_with_the_reason_and_check_says_so():
    helpers.assert_refused(_model(), ["Sigmoid", "Exp", "Tanh"], "sigmoid-exp would emit Exp",
                           "sigmoid-tanh would emit Tanh")


def test_check_names_lower_ops_for_a_sigmoid_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(), ["Sigmoid"])
