"""Swish lowered (passes/lowering/swish.py): each form equal to onnxruntime's Swish to float rounding on float
models (alpha 1 and another), within a quantization step inside the Q/DQ unit of a model onnxruntime's quantizer
made, refused with its reason when every form needs another forbidden op; and the SiLU of older exports,
``x * Sigmoid(x)``, lowered by its Sigmoid with the Mul kept."""

from __future__ import annotations

import helpers
import onnx
import pytest
from onnx import helper

from onnx_npu_fix.passes.lower_ops import lowered_ops

# onnxruntime's Swish is an approximation of its own that leaves x * Sigmoid(x) by up to 2.3e-6 near x = -16 (it
# gives 0 at -15.985, where the product is -1.8e-6); the forms are held to the exact criterion's atol.
ROUNDING = 1e-5

needs_swish = pytest.mark.skipif(not onnx.defs.has("Swish"), reason=f"onnx {onnx.__version__} has no Swish op "
                                 "(opset 24, onnx 1.19 on)")


def _node(alpha=None):
    attrs = {} if alpha is None else {"alpha": alpha}
    return lambda x, y: [helper.make_node("Swish", [x], [y], name="swish", **attrs)]


def _model(alpha=None):
    return helpers.between_convs(_node(alpha), opset=24)


def _silu(x, y):
    return [helper.make_node("Sigmoid", [x], ["gate"], name="sig"), helper.make_node("Mul", [x, "gate"], [y],
                                                                                      name="silu")]


@needs_swish
@pytest.mark.parametrize("forbidden, emitted", [
    (["Swish"], ["Sigmoid", "Mul"]),
    (["Swish", "Sigmoid"], ["Neg", "Exp", "Add", "Div", "Mul"]),
    (["Swish", "Sigmoid", "Exp"], ["Mul", "Tanh", "Mul", "Add", "Mul"]),
])
@pytest.mark.parametrize("alpha", [None, 1.7])
def test_each_form_matches_to_float_rounding(forbidden, emitted, alpha):
    result = helpers.assert_lowered(_model(alpha), forbidden)
    assert helpers.ops(result.model) == ["Conv", *([] if alpha is None else ["Mul"]), *emitted, "Conv"]
    assert helpers.lowered_error(_node(alpha), forbidden, opset=24) <= ROUNDING


@needs_swish
def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    helpers.assert_lowered_quantized(_model(), ["Swish", "Sigmoid"], tmp_path)


def test_silu_of_older_exports_lowers_its_sigmoid_and_keeps_the_mul(tmp_path):
    result = helpers.assert_lowered(helpers.between_convs(_silu), ["Sigmoid"])
    assert helpers.ops(result.model) == ["Conv", "Neg", "Exp", "Add", "Div", "Mul", "Conv"]
    assert next(n for n in result.model.graph.node if n.op_type == "Mul").name == "silu"
    helpers.assert_lowered_quantized(helpers.between_convs(_silu), ["Sigmoid"], tmp_path)


@needs_swish
def test_every_form_forbidden_is_refused_with_the_reason_and_check_says_so():
    helpers.assert_refused(_model(), ["Swish", "Sigmoid", "Exp", "Tanh"], "swish-sigmoid would emit Sigmoid",
                           "swish-exp would emit Exp", "swish-tanh would emit Tanh")


@needs_swish
def test_check_names_lower_ops_for_a_swish_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(), ["Swish"])


def test_a_swish_rule_is_offered_only_where_onnx_has_the_op():
    assert ("Swish" in lowered_ops()) is onnx.defs.has("Swish")
