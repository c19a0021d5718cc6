"""Gelu lowered (passes/lowering/gelu.py): both definitions' exact forms equal onnxruntime's Gelu to float
rounding, the erf approximations within their declared bounds on the Gelu's output (measured on a wide grid reaching
1e4) and recorded as not exact, each within a quantization step inside the Q/DQ unit of a model onnxruntime's
quantizer made, refused with the reason when every form needs another forbidden op."""

from __future__ import annotations

import helpers
import numpy as np
import pytest
from onnx import helper

from onnx_npu_fix.passes.lowering import gelu

OPSET = 20
ROUNDING = 8 * np.finfo(np.float32).eps


def _node(approximate="none"):
    def make(x, y):
        return [helper.make_node("Gelu", [x], [y], name="gelu", approximate=approximate)]
    return make


def _model(approximate="none"):
    return helpers.between_convs(_node(approximate), opset=OPSET)


def _absolute_error(approximate, forbidden) -> float:
    """The largest absolute difference on the Gelu's output, on the wide grid (the bounds are absolute)."""
    return helpers.lowered_error(_node(approximate), forbidden, opset=OPSET, absolute=True)


@pytest.mark.parametrize("approximate, forbidden, emitted", [
    ("none", ["Gelu"], "Erf"),
    ("tanh", ["Gelu"], "Tanh"),
    ("tanh", ["Gelu", "Tanh"], "Sigmoid"),
    ("tanh", ["Gelu", "Tanh", "Sigmoid"], "Exp"),
])
def test_each_exact_form_matches_to_float_rounding(approximate, forbidden, emitted):
    result = helpers.assert_lowered(_model(approximate), forbidden)
    assert emitted in helpers.ops(result.model)
    assert helpers.lowered_error(_node(approximate), forbidden, opset=OPSET) <= ROUNDING


@pytest.mark.parametrize("forbidden, rule", [(["Gelu", "Erf"], gelu.ViaErfPolynomial),
                                             (["Gelu", "Erf", "Sign"], gelu.ViaErfTanh)])
def test_each_erf_approximation_is_within_its_bound_and_recorded_as_not_exact(forbidden, rule):
    result = helpers.assert_lowered(_model(), forbidden, exact=False)
    (change,) = next(r for r in result.report.passes if r.name == "lower-ops").changes
    assert change.action == rule.name and change.detail["bound"] == rule.bound
    assert _absolute_error("none", forbidden) <= rule.bound


@pytest.mark.parametrize("approximate, forbidden", [("none", ["Gelu"]), ("tanh", ["Gelu", "Tanh"])])
def test_inside_the_qdq_unit_of_a_quantized_model(approximate, forbidden, tmp_path):
    helpers.assert_lowered_quantized(_model(approximate), forbidden, tmp_path)


def test_every_form_forbidden_is_refused_with_the_reason_and_check_says_so():
    helpers.assert_refused(_model("tanh"), ["Gelu", "Tanh", "Sigmoid", "Exp"], "gelu-tanh would emit Tanh",
                           "gelu-tanh-sigmoid would emit Sigmoid", "gelu-tanh-exp would emit Exp")


def test_check_names_lower_ops_for_a_gelu_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(), ["Gelu"])
