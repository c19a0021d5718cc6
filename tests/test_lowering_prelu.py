"""PRelu lowered (passes/lowering/prelu.py): each form bit for bit on float models (per-channel slopes within
[0, 1] and beyond), within a quantization step inside the Q/DQ unit of a model onnxruntime's quantizer made, and
refused with its reason when every form needs another forbidden op."""

from __future__ import annotations

import helpers
import numpy as np
import pytest
from onnx import helper, numpy_helper

SLOPES = {"within": [0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 0.05, 0.3], "beyond": [-0.5, 0.1, 2.0, 0.25, 1.5, 0.0, -3, 1]}


def _model(slopes):
    slope = numpy_helper.from_array(np.array(slopes, np.float32).reshape(8, 1, 1), "slope")
    return helpers.between_convs(lambda x, y: [helper.make_node("PRelu", [x, "slope"], [y], name="prelu")],
                                 extra_inits=[slope])


def _elementwise(slope):
    """x -> PRelu(x, slope) -> y on the wide grid, with one scalar slope."""
    const = helper.make_node("Constant", [], ["slope"], value=numpy_helper.from_array(np.array(slope, np.float32)))
    return lambda x, y: [const, helper.make_node("PRelu", [x, "slope"], [y], name="prelu")]


@pytest.mark.parametrize("slopes, forbidden, emitted", [
    ("within", ["PRelu"], ["Mul", "Max"]),
    ("within", ["PRelu", "Max"], ["Neg", "Relu", "Mul", "Relu", "Sub"]),
    ("beyond", ["PRelu"], ["Neg", "Relu", "Mul", "Relu", "Sub"]),
])
def test_each_form_is_bit_exact(slopes, forbidden, emitted):
    result = helpers.assert_lowered(_model(SLOPES[slopes]), forbidden, bitwise=True)
    assert helpers.ops(result.model) == ["Conv", *emitted, "Conv"]


@pytest.mark.parametrize("slope, forbidden", [(0.2, ["PRelu"]), (0.2, ["PRelu", "Max"]), (-1.7, ["PRelu"])])
def test_bit_exact_on_the_wide_grid(slope, forbidden):
    assert helpers.lowered_error(_elementwise(slope), forbidden) == 0.0


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    helpers.assert_lowered_quantized(_model(SLOPES["within"]), ["PRelu"], tmp_path)


def test_every_form_forbidden_is_refused_with_the_reason_and_check_says_so():
    helpers.assert_refused(_model(SLOPES["beyond"]), ["PRelu", "Sub"], "prelu-max needs a constant slope within [0, 1]",
                           "prelu-relu would emit Sub")


def test_check_names_lower_ops_for_a_prelu_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(SLOPES["within"]), ["PRelu"])
