"""Softplus lowered (passes/lowering/softplus.py): equal to onnxruntime's Softplus to float rounding on float
models, with no overflow where exp(x) would (measured on a wide grid reaching 1e4), within a quantization step
inside the Q/DQ unit of a model onnxruntime's quantizer made, and refused with its reason when its form needs
another forbidden op."""

from __future__ import annotations

import helpers
import numpy as np
from onnx import helper

ROUNDING = 4 * np.finfo(np.float32).eps


def _node(x, y):
    return [helper.make_node("Softplus", [x], [y], name="softplus")]


def test_matches_to_float_rounding_without_overflow():
    result = helpers.assert_lowered(helpers.between_convs(_node), ["Softplus"])
    assert helpers.ops(result.model) == ["Conv", "Abs", "Neg", "Exp", "Add", "Log", "Relu", "Add", "Conv"]
    assert helpers.lowered_error(_node, ["Softplus"]) <= ROUNDING


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    helpers.assert_lowered_quantized(helpers.between_convs(_node), ["Softplus"], tmp_path)


def test_its_form_forbidden_is_refused_with_the_reason_and_check_says_so():
    helpers.assert_refused(helpers.between_convs(_node), ["Softplus", "Log"], "softplus-relu-log would emit Log")


def test_check_names_lower_ops_for_a_softplus_it_can_lower():
    helpers.assert_check_names_lower_ops(helpers.between_convs(_node), ["Softplus"])
