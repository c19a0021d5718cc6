"""HardSwish lowered (passes/lowering/hardswish.py): each form bit for bit on float models, within a quantization
step inside the Q/DQ unit of a model onnxruntime's quantizer made, and refused with its reason when every form
needs another forbidden op."""

from __future__ import annotations

import pytest
from helpers import assert_lowered, assert_lowered_quantized, between_convs, ops
from onnx import helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints import find_violations


def _model(opset=17):
    return between_convs(lambda x, y: [helper.make_node("HardSwish", [x], [y], name="hs")], opset=opset)


@pytest.mark.parametrize("forbidden, emitted", [
    (["HardSwish"], ["HardSigmoid", "Mul"]),
    (["HardSwish", "HardSigmoid"], ["Mul", "Add", "Clip", "Mul"]),
    (["HardSwish", "HardSigmoid", "Clip"], ["Mul", "Add", "Max", "Min", "Mul"]),
])
def test_each_form_is_bit_exact(forbidden, emitted):
    result = assert_lowered(_model(), forbidden, bitwise=True)
    assert ops(result.model) == ["Conv", *emitted, "Conv"]


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    assert_lowered_quantized(_model(), ["HardSwish", "HardSigmoid"], tmp_path)


def test_every_form_forbidden_is_refused_with_the_reason_and_check_says_so():
    options = FixOptions(forbidden_ops=("HardSwish", "HardSigmoid", "Clip", "Min"), align=0)
    (violation,) = [v for v in find_violations(_model(), options) if v.constraint == "forbidden-op"]
    assert violation.fixed_by is None
    assert "lower-ops: hardswish-hardsigmoid would emit HardSigmoid" in violation.message
    assert "hardswish-min-max would emit Min" in violation.message


def test_check_names_lower_ops_for_a_hardswish_it_can_lower():
    (violation,) = find_violations(_model(), FixOptions(forbidden_ops=("HardSwish",), align=0))
    assert violation.fixed_by == "lower-ops"
