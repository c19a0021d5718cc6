"""Erf lowered where it feeds a Gelu (passes/lowering/erf.py): each approximation within its declared bound on
Erf's own output against onnxruntime's Erf (measured on a dense grid), recorded as not exact and measured by the
pass manager, refused by ``--strict``, within a quantization step inside the Q/DQ unit of a model onnxruntime's
quantizer made (a factor behind a DequantizeLinear counts within one quantization step of its constant); an Erf
that feeds no Gelu is left alone with that reason."""

from __future__ import annotations

import math

import helpers
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_npu_fix.api import fix
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import StrictRefused
from onnx_npu_fix.passes.lowering import erf

CONSTS = [numpy_helper.from_array(np.array(v, np.float32), n)
          for n, v in (("inv_sqrt2", 1 / math.sqrt(2)), ("one", 1.0), ("half", 0.5))]


def _gelu(x, y, *, scale="inv_sqrt2"):
    """The Gelu of exports before opset 20: x * (1 + erf(x / sqrt 2)) * 1/2."""
    return [helper.make_node("Mul", [x, scale], ["z"], name="scale"),
            helper.make_node("Erf", ["z"], ["e"], name="erf"),
            helper.make_node("Add", ["e", "one"], ["e1"], name="plus_one"),
            helper.make_node("Mul", [x, "e1"], ["xe"], name="times_x"),
            helper.make_node("Mul", ["xe", "half"], [y], name="halve")]


def _model(**kwargs):
    return helpers.between_convs(lambda x, y: _gelu(x, y, **kwargs), extra_inits=CONSTS)


def _erf_error(forbidden) -> float:
    """The largest difference on Erf's output ``e`` between the Gelu and its fix, on the wide grid."""
    values = helpers.wide_values() / 4  # z = x / sqrt 2 spans where erf moves
    model = helpers.op_model(_gelu("x", "y"), [("x", list(values.shape))], [("y", list(values.shape))], CONSTS)
    result = fix(model, FixOptions(forbidden_ops=tuple(forbidden), align=0))
    assert result.ok, result.report.to_json()
    outputs = []
    for m in (model, result.model):
        m.graph.output.append(helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, list(values.shape)))
        outputs.append(helpers.run_model(m, [{"x": values}])[0]["e"].astype(np.float64))
    return float(np.abs(outputs[0] - outputs[1]).max())


@pytest.mark.parametrize("forbidden, rule", [(["Erf"], erf.ViaPolynomial), (["Erf", "Sign"], erf.ViaTanh)])
def test_each_approximation_is_within_its_bound_and_recorded_as_not_exact(forbidden, rule):
    result = helpers.assert_lowered(_model(), forbidden, exact=False)
    (change,) = next(r for r in result.report.passes if r.name == "lower-ops").changes
    assert change.action == rule.name and change.detail["bound"] == rule.bound
    assert _erf_error(forbidden) <= rule.bound


def test_strict_refuses_the_approximation():
    with pytest.raises(StrictRefused, match="lower-ops would change 1 node"):
        fix(_model(), FixOptions(forbidden_ops=("Erf",), align=0, strict=True))


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    helpers.assert_lowered_quantized(_model(), ["Erf"], tmp_path)


def test_an_erf_that_feeds_no_gelu_is_left_with_the_reason():
    helpers.assert_refused(helpers.between_convs(lambda x, y: [helper.make_node("Erf", [x], [y], name="erf")]), ["Erf"],
                           "erf-polynomial: this Erf feeds no Gelu")
    wrong = numpy_helper.from_array(np.array(0.5, np.float32), "not_sqrt2")
    model = helpers.between_convs(lambda x, y: _gelu(x, y, scale="not_sqrt2"), extra_inits=[*CONSTS, wrong])
    helpers.assert_refused(model, ["Erf"], "this Erf feeds no Gelu")


def _dequantized_scale(steps_off: int):
    """x / sqrt 2's factor behind a DequantizeLinear as onnxruntime 1.19's quantizer writes a constant (uint8 over
    [-c, c]: scale c / 127.5, zero point 128, the top of the grid half a step below c), ``steps_off`` steps lower."""
    c = 1 / math.sqrt(2)
    inits = [numpy_helper.from_array(np.array(255 - steps_off, np.uint8), "q_scale"),
             numpy_helper.from_array(np.array(c / 127.5, np.float32), "q_scale_scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "q_scale_zero")]
    node = helper.make_node("DequantizeLinear", ["q_scale", "q_scale_scale", "q_scale_zero"], ["dq_scale"])
    return helpers.between_convs(lambda x, y: [node, *_gelu(x, y, scale="dq_scale")], extra_inits=[*CONSTS, *inits])


def test_a_quantized_factor_stands_for_its_constant_within_one_step():
    helpers.assert_lowered(_dequantized_scale(0), ["Erf"], exact=False)
    helpers.assert_refused(_dequantized_scale(2), ["Erf"], "this Erf feeds no Gelu")


def test_check_names_lower_ops_for_an_erf_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(), ["Erf"])
