"""LeakyRelu lowered (passes/lowering/leakyrelu.py): each form bit for bit on float models, for the alphas it takes
(the default, one above 1, a negative one), within a quantization step inside the Q/DQ unit of a model
onnxruntime's quantizer made, and refused with its reason when every form needs another forbidden op."""

from __future__ import annotations

import helpers
import pytest
from onnx import helper


def _node(alpha=None):
    attrs = {} if alpha is None else {"alpha": alpha}
    return lambda x, y: [helper.make_node("LeakyRelu", [x], [y], name="leaky", **attrs)]


def _model(alpha=None):
    return helpers.between_convs(_node(alpha))


@pytest.mark.parametrize("alpha, forbidden, emitted", [
    (None, ["LeakyRelu"], ["Mul", "Max"]),
    (0.2, ["LeakyRelu", "Max"], ["Neg", "Relu", "Mul", "Relu", "Sub"]),
    (3.0, ["LeakyRelu"], ["Mul", "Min"]),
    (-0.5, ["LeakyRelu"], ["Neg", "Relu", "Mul", "Relu", "Sub"]),
])
def test_each_form_is_bit_exact(alpha, forbidden, emitted):
    result = helpers.assert_lowered(_model(alpha), forbidden, bitwise=True)
    assert helpers.ops(result.model) == ["Conv", *emitted, "Conv"]
    assert helpers.lowered_error(_node(alpha), forbidden) == 0.0


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    helpers.assert_lowered_quantized(_model(0.1), ["LeakyRelu"], tmp_path)


def test_every_form_forbidden_is_refused_with_the_reason_and_check_says_so():
    helpers.assert_refused(_model(), ["LeakyRelu", "Max", "Sub"], "leakyrelu-max would emit Max",
                           "leakyrelu-min needs alpha in [1, inf], not 0.01", "leakyrelu-relu would emit Sub")


def test_check_names_lower_ops_for_a_leakyrelu_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(), ["LeakyRelu"])
