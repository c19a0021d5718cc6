"""Mish lowered (passes/lowering/mish.py): each form equal to onnxruntime's Mish to float rounding on float models
(measured on a wide grid, relative beyond 1), within a quantization step inside the Q/DQ unit of a model
onnxruntime's quantizer made, and refused with its reason when every form needs another forbidden op."""

from __future__ import annotations

import helpers
import numpy as np
import pytest
from onnx import helper

ROUNDING = 4 * np.finfo(np.float32).eps
# Softplus's form rounds log(1 + e^-|x|) where onnxruntime takes log1p: below x = -16, 1 + e^x is 1 or one float
# step above it, so Softplus(x) ~ e^x comes out 0 or 2^-23, and Mish = x * tanh(.) is off by up to |x| * 2^-24 ~
# 1e-6 around x = -16.6 (0 or -2e-6 where Mish is -1e-6); beyond, e^x * |x| vanishes. Within the exact atol.
SOFTPLUS_FORM = 16 * 2.0**-24 * 2


def _node(x, y):
    return [helper.make_node("Mish", [x], [y], name="mish")]


def _model():
    return helpers.between_convs(_node, opset=18)


@pytest.mark.parametrize("forbidden, emitted, rounding", [
    (["Mish"], ["Softplus", "Tanh", "Mul"], ROUNDING),
    (["Mish", "Softplus"], ["Abs", "Neg", "Exp", "Add", "Log", "Relu", "Add", "Tanh", "Mul"], SOFTPLUS_FORM),
])
def test_each_form_matches_to_float_rounding(forbidden, emitted, rounding):
    result = helpers.assert_lowered(_model(), forbidden)
    assert helpers.ops(result.model) == ["Conv", *emitted, "Conv"]
    assert helpers.lowered_error(_node, forbidden, opset=18) <= rounding


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    helpers.assert_lowered_quantized(_model(), ["Mish", "Softplus"], tmp_path)


def test_every_form_forbidden_is_refused_with_the_reason_and_check_says_so():
    helpers.assert_refused(_model(), ["Mish", "Softplus", "Log"], "mish-softplus would emit Softplus",
                           "mish-relu-log would emit Log")


def test_check_names_lower_ops_for_a_mish_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(), ["Mish"])
