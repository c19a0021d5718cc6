"""Max and Min with a constant scalar lowered (passes/lowering/minmax.py): Relu, Clip and the Max -> Min pair as one
Clip, each bit for bit equal to the original under onnxruntime on a wide grid (Clip's bounds as inputs from opset
11, attributes before), inside the Q/DQ unit of a model onnxruntime's quantizer made, and a Max of two tensors left
with the reason."""

from __future__ import annotations

import helpers
import numpy as np
import pytest
from onnx import helper, numpy_helper

from onnx_npu_fix.api import fix
from onnx_npu_fix.config.options import FixOptions

BOUNDS = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("zero", 0.0), ("low", -1.5),
                                                                            ("six", 6.0))]


def _chain(*steps):
    """x -> each (op, bound) in turn -> y."""
    def make(x, y):
        names = [x, *(f"t{k}" for k in range(len(steps) - 1)), y]
        return [helper.make_node(op, [names[k], bound], [names[k + 1]], name=f"{op.lower()}{k}")
                for k, (op, bound) in enumerate(steps)]
    return make


def _op_model(make, opset=17):
    values = helpers.wide_values()
    nodes = make("x", "y")
    return helpers.op_model(nodes, [("x", list(values.shape))], [("y", list(values.shape))], BOUNDS, opset)


@pytest.mark.parametrize("steps, forbidden, emitted, opset", [
    ([("Max", "zero")], ["Max"], ["Relu"], 17),
    ([("Max", "low")], ["Max"], ["Clip"], 17),
    ([("Max", "zero"), ("Min", "six")], ["Max", "Min"], ["Clip"], 17),
    ([("Max", "zero"), ("Min", "six")], ["Max"], ["Clip"], 9),
    ([("Min", "six")], ["Min"], ["Clip"], 17),
])
def test_each_form_is_bit_exact(steps, forbidden, emitted, opset):
    model = _op_model(_chain(*steps), opset)
    values = helpers.wide_values()
    result = fix(model, FixOptions(forbidden_ops=tuple(forbidden), align=0))
    assert result.ok, result.report.to_json()
    assert helpers.ops(result.model) == emitted
    ref, got = (helpers.run_model(m, [{"x": values}])[0]["y"] for m in (model, result.model))
    assert np.array_equal(ref, got)


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    model = helpers.between_convs(_chain(("Max", "zero"), ("Min", "six")), extra_inits=BOUNDS)
    helpers.assert_lowered_quantized(model, ["Max", "Min"], tmp_path)


def test_a_max_of_two_tensors_is_left_with_the_reason():
    model = helpers.between_convs(lambda x, y: [helper.make_node("Max", [x, x], [y], name="max")])
    helpers.assert_refused(model, ["Max"], "neither input is a constant scalar")


def test_check_names_lower_ops_for_a_max_it_can_lower():
    helpers.assert_check_names_lower_ops(helpers.between_convs(_chain(("Max", "low")), extra_inits=BOUNDS), ["Max"])
