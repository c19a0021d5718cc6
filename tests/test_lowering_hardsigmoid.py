"""HardSigmoid lowered (passes/lowering/hardsigmoid.py): each form bit for bit on float models (the default and
other alpha / beta), within a quantization step inside the Q/DQ unit of a model onnxruntime's quantizer made, and
refused with its reason when every form needs another forbidden op."""

from __future__ import annotations

import helpers
import pytest
from onnx import helper


def _node(alpha=None, beta=None):
    attrs = {k: v for k, v in (("alpha", alpha), ("beta", beta)) if v is not None}
    return lambda x, y: [helper.make_node("HardSigmoid", [x], [y], name="hsig", **attrs)]


def _model(alpha=None, beta=None, opset=17):
    return helpers.between_convs(_node(alpha, beta), opset=opset)


@pytest.mark.parametrize("forbidden, emitted", [
    (["HardSigmoid"], ["Mul", "Add", "Clip"]),
    (["HardSigmoid", "Clip"], ["Mul", "Add", "Max", "Min"]),
])
@pytest.mark.parametrize("alpha, beta", [(None, None), (1 / 6, 0.5), (0.7, -0.1)])
def test_each_form_is_bit_exact(forbidden, emitted, alpha, beta):
    result = helpers.assert_lowered(_model(alpha, beta), forbidden, bitwise=True)
    assert helpers.ops(result.model) == ["Conv", *emitted, "Conv"]
    assert helpers.lowered_error(_node(alpha, beta), forbidden) == 0.0


def test_opset_10_clip_takes_its_bounds_as_attributes():
    result = helpers.assert_lowered(_model(opset=10), ["HardSigmoid"], bitwise=True)
    (clip,) = [n for n in result.model.graph.node if n.op_type == "Clip"]
    assert len(clip.input) == 1 and {a.name for a in clip.attribute} == {"min", "max"}


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    helpers.assert_lowered_quantized(_model(), ["HardSigmoid"], tmp_path)


def test_every_form_forbidden_is_refused_with_the_reason_and_check_says_so():
    helpers.assert_refused(_model(), ["HardSigmoid", "Clip", "Max"], "hardsigmoid-clip would emit Clip",
                           "hardsigmoid-min-max would emit Max")


def test_check_names_lower_ops_for_a_hardsigmoid_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(), ["HardSigmoid"])


def test_before_opset_8_where_max_and_min_do_not_broadcast_it_is_left_alone():
    helpers.assert_refused(_model(opset=7), ["HardSigmoid"])
