"""Clip lowered (passes/lowering/clip.py): each form bit for bit on float models — Relu6, one-sided bounds,
bounds as tensors, the opset-10 attribute form —, within a quantization step inside the Q/DQ unit of a model
onnxruntime's quantizer made, and refused with its reason when every form needs another forbidden op."""

from __future__ import annotations

import helpers
import numpy as np
import pytest
from onnx import helper, numpy_helper


def _node(low, high, opset=17):
    """Clip(x, low, high); a bound of None is left out, a string is a graph tensor of that name."""
    if opset < 11:
        attrs = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
        return lambda x, y: [helper.make_node("Clip", [x], [y], name="clip", **attrs)]
    consts = [helper.make_node("Constant", [], [f"c_{k}"], value=numpy_helper.from_array(np.array(v, np.float32)))
              for k, v in (("low", low), ("high", high)) if isinstance(v, float)]
    names = ["" if v is None else v if isinstance(v, str) else f"c_{k}" for k, v in (("low", low), ("high", high))]
    return lambda x, y: [*consts, helper.make_node("Clip", [x, *names], [y], name="clip")]


def _model(low, high, opset=17):
    return helpers.between_convs(_node(low, high, opset), opset=opset)


def _tensor_bounds(x, y):
    """Clip whose bounds are computed (ReduceMin / ReduceMax of x, scaled): no constant to read."""
    return [helper.make_node("ReduceMin", [x], ["m"], keepdims=0),
            helper.make_node("Mul", ["m", "half"], ["low"]),
            helper.make_node("ReduceMax", [x], ["n"], keepdims=0),
            helper.make_node("Mul", ["n", "half"], ["high"]),
            helper.make_node("Clip", [x, "low", "high"], [y], name="clip")]


CASES = [  # low, high, opset, forbidden, emitted
    (0.0, 6.0, 17, ["Clip"], ["Relu", "Min"]),
    (0.0, 6.0, 17, ["Clip", "Relu"], ["Max", "Min"]),
    (0.0, None, 17, ["Clip"], ["Relu"]),
    (-1.5, None, 17, ["Clip"], ["Max"]),
    (None, 0.5, 17, ["Clip"], ["Min"]),
    (-1.0, 2.0, 17, ["Clip"], ["Max", "Min"]),
    (0.0, 6.0, 10, ["Clip"], ["Relu", "Min"]),
    (-1.0, 2.0, 10, ["Clip"], ["Max", "Min"]),
]


@pytest.mark.parametrize("low, high, opset, forbidden, emitted", CASES)
def test_each_form_is_bit_exact(low, high, opset, forbidden, emitted):
    result = helpers.assert_lowered(_model(low, high, opset), forbidden, bitwise=True)
    assert [op for op in helpers.ops(result.model) if op != "Constant"] == ["Conv", *emitted, "Conv"]
    assert helpers.lowered_error(_node(low, high, opset), forbidden, opset=opset) == 0.0


def test_bounds_that_are_tensors_are_read_as_they_are():
    model = helpers.between_convs(_tensor_bounds, extra_inits=[_half()])
    result = helpers.assert_lowered(model, ["Clip"], bitwise=True)
    (low,) = [n for n in result.model.graph.node if n.op_type == "Max" and "low" in n.input]
    assert low.input[0] == "a"


def _half():
    return numpy_helper.from_array(np.array(0.5, np.float32), "half")


def test_inside_the_qdq_unit_of_a_quantized_model(tmp_path):
    # onnxruntime's quantizer folds a Clip with constant bounds into the Q before it; computed bounds keep it
    helpers.assert_lowered_quantized(helpers.between_convs(_tensor_bounds, extra_inits=[_half()]), ["Clip"], tmp_path)


def test_every_form_forbidden_is_refused_with_the_reason_and_check_says_so():
    helpers.assert_refused(_model(-1.0, 2.0), ["Clip", "Min"], "clip-relu needs a constant low bound of 0",
                           "clip-min-max would emit Min")


def test_check_names_lower_ops_for_a_relu6_it_can_lower():
    helpers.assert_check_names_lower_ops(_model(0.0, 6.0), ["Clip"])
