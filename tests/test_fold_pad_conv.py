"""fold-pad-conv: a constant zero Pad folded into the following Conv's pads (float and QDQ forms), checked
against onnxruntime; what it must leave alone, with the reason; the Rockchip profiles enable it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import quantize_with_onnxruntime
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.config.targets import load_target
from onnx_npu_fix.passes.fold_pad_conv import FoldPadConvPass
from onnx_npu_fix.pipeline.inputs import make_inputs
from tests.helpers import apply_pass, assert_equivalent, ops, rng, run_model


def _pad_conv(pads=(0, 0, 1, 2, 0, 0, 1, 0), value: float | None = None, mode: str = "constant",
              conv_attrs: dict | None = None, pad_read_twice: bool = False, opset: int = 17) -> onnx.ModelProto:
    """x [1,3,9,8] -> Pad -> Conv 3x3 (4 filters) -> y; optionally the Pad's output is also a graph output."""
    r = rng(1)
    inits = [numpy_helper.from_array(np.asarray(pads, dtype=np.int64), "pads"),
             numpy_helper.from_array(r.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(r.standard_normal(4).astype(np.float32), "b")]
    pad_inputs = ["x", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), "value"))
        pad_inputs.append("value")
    nodes = [helper.make_node("Pad", pad_inputs, ["xp"], name="pad", mode=mode),
             helper.make_node("Conv", ["xp", "w", "b"], ["y"], name="conv", **(conv_attrs or {}))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if pad_read_twice:
        outputs.append(helper.make_tensor_value_info("xp", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _conv(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Conv")


def _pads(node: onnx.NodeProto) -> list[int]:
    return next(list(a.ints) for a in node.attribute if a.name == "pads")


@pytest.mark.parametrize("conv_attrs, expected", [
    ({}, [1, 2, 1, 0]),
    ({"pads": [1, 1, 1, 1]}, [2, 3, 2, 1]),
    ({"strides": [2, 2], "dilations": [2, 1], "pads": [0, 1, 0, 1]}, [1, 3, 1, 1]),
    ({"auto_pad": "SAME_UPPER"}, [2, 3, 2, 1]),  # resolved on the padded input [11, 10], then made explicit
])
def test_a_zero_pad_becomes_the_convs_pads_exactly(conv_attrs, expected):
    model = _pad_conv(conv_attrs=conv_attrs)
    fixed, result = apply_pass(model, FoldPadConvPass(), fold_pad_into_conv=True)
    assert ops(fixed) == ["Conv"]
    assert _pads(_conv(fixed)) == expected
    assert [c.detail["form"] for c in result.changes] == ["float"]
    assert "pads" not in {t.name for t in fixed.graph.initializer}
    assert_equivalent(model, fixed, rtol=0, atol=0)  # the same sums of the same values: bit for bit
    again, second = apply_pass(fixed, FoldPadConvPass(), fold_pad_into_conv=True)
    assert not second.changed and ops(again) == ["Conv"]


def test_opset_10_pads_attribute_and_opset_18_axes_input():
    old = _pad_conv()
    pad = old.graph.node[0]
    del pad.input[1:]
    pad.attribute.append(helper.make_attribute("pads", [0, 0, 1, 2, 0, 0, 1, 0]))
    old.opset_import[0].version = 10
    fixed, _ = apply_pass(old, FoldPadConvPass(), fold_pad_into_conv=True)
    assert ops(fixed) == ["Conv"] and _pads(_conv(fixed)) == [1, 2, 1, 0]
    assert_equivalent(old, fixed, rtol=0, atol=0)

    axes = _pad_conv(pads=(1, 2, 1, 0), opset=18)
    axes.graph.initializer.append(numpy_helper.from_array(np.array([2, -1], dtype=np.int64), "axes"))
    axes.graph.node[0].input.extend(["", "axes"])
    fixed, _ = apply_pass(axes, FoldPadConvPass(), fold_pad_into_conv=True)
    assert ops(fixed) == ["Conv"] and _pads(_conv(fixed)) == [1, 2, 1, 0]
    assert_equivalent(axes, fixed, rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, reason", [
    ({"value": 0.5}, "not 0"),
    ({"mode": "reflect"}, "mode 'reflect'"),
    ({"pads": (0, 1, 1, 1, 0, 0, 1, 1)}, "channel axis"),
    ({"pads": (0, 0, -1, 1, 0, 0, 1, 1)}, "negative pad"),
    ({"pad_read_twice": True}, None),
])
def test_what_it_leaves_alone_and_why(kwargs, reason):
    model = _pad_conv(**kwargs)
    fixed, result = apply_pass(model, FoldPadConvPass(), fold_pad_into_conv=True)
    assert ops(fixed) == ["Pad", "Conv"] and not result.changed
    if reason is not None:
        assert reason in result.rejections[0].reason
    else:  # its output is also read elsewhere: not a candidate at all
        assert not result.rejections


def test_off_unless_asked_and_the_rockchip_profiles_ask():
    fixed, result = apply_pass(_pad_conv(), FoldPadConvPass())
    assert ops(fixed) == ["Pad", "Conv"] and not result.changed
    for name in ("rv1106", "rk3566", "rk3588"):
        assert load_target(name).constraints["fold_pad_into_conv"] is True


# --- QDQ forms ---------------------------------------------------------------------------------------------

def _qdq(model: onnx.ModelProto, tmp_path, per_channel: bool) -> onnx.ModelProto:
    pytest.importorskip("onnxruntime.quantization")
    return quantize_with_onnxruntime(model, tmp_path, per_channel=per_channel)


@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_model_from_onnxruntimes_quantizer_folds_bit_exactly(tmp_path, per_channel):
    quantized = _qdq(_pad_conv(), tmp_path, per_channel)
    assert "Pad" in ops(quantized)
    fixed, result = apply_pass(quantized, FoldPadConvPass(), fold_pad_into_conv=True)
    assert "Pad" not in ops(fixed) and result.changes[0].detail["form"] == "QuantizeLinear+DequantizeLinear"
    # DQ -> Pad -> Q -> DQ -> Conv (one set of parameters) leaves DQ -> Conv: the Pad's Q -> DQ pair goes too
    assert len(fixed.graph.node) == len(quantized.graph.node) - 3
    assert _pads(_conv(fixed)) == [1, 2, 1, 0]
    feeds = make_inputs(quantized, 3, 0)
    for ref, got in zip(run_model(quantized, feeds), run_model(fixed, feeds)):
        for a, b in zip(ref.values() if isinstance(ref, dict) else ref, got.values() if isinstance(got, dict)
                        else got):
            np.testing.assert_array_equal(a, b)  # the same integers behind every output: 0 steps moved


def _integer_pad(value: int, zero_point: int) -> onnx.ModelProto:
    """xq uint8 -> Pad(value) -> DQ(scale 0.5, zp) -> Conv: a Pad on the integer tensor."""
    w = numpy_helper.from_array(rng(2).standard_normal((2, 1, 3, 3)).astype(np.float32), "w")
    inits = [w, numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64), "pads"),
             numpy_helper.from_array(np.array(value, dtype=np.uint8), "value"),
             numpy_helper.from_array(np.array(0.5, dtype=np.float32), "s"),
             numpy_helper.from_array(np.array(zero_point, dtype=np.uint8), "zp")]
    nodes = [helper.make_node("Pad", ["xq", "pads", "value"], ["xqp"], name="pad"),
             helper.make_node("DequantizeLinear", ["xqp", "s", "zp"], ["xp"], name="dq"),
             helper.make_node("Conv", ["xp", "w"], ["y"], name="conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, 1, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_integer_pad_with_the_zero_point_folds_and_another_value_is_refused():
    model = _integer_pad(128, 128)
    fixed, result = apply_pass(model, FoldPadConvPass(), fold_pad_into_conv=True)
    assert ops(fixed) == ["DequantizeLinear", "Conv"] and result.changes[0].detail["form"] == "DequantizeLinear"
    feeds = [{"xq": rng(s).integers(0, 256, (1, 1, 5, 5)).astype(np.uint8)} for s in range(3)]
    assert_equivalent(model, fixed, feeds=feeds, rtol=0, atol=0)
    kept, refused = apply_pass(_integer_pad(0, 128), FoldPadConvPass(), fold_pad_into_conv=True)
    assert ops(kept) == ["Pad", "DequantizeLinear", "Conv"]
    assert "not the zero point" in refused.rejections[0].reason


def test_a_float_pad_before_a_quantizer_keeps_the_q_dq_pair(tmp_path):
    """x -> Pad(0) -> Q -> DQ -> Conv becomes x -> Q -> DQ -> Conv(pads): Q(0) = zp and DQ(zp) = 0."""
    quantized = _qdq(_pad_conv(), tmp_path, False)
    pad = next(n for n in quantized.graph.node if n.op_type == "Pad")
    pad.input[0] = "x"  # the Pad reads the float input: no DequantizeLinear before it
    fixed, result = apply_pass(quantized, FoldPadConvPass(), fold_pad_into_conv=True)
    assert "Pad" not in ops(fixed) and len(fixed.graph.node) == len(quantized.graph.node) - 1
    conv = _conv(fixed)
    dq = next(n for n in fixed.graph.node if conv.input[0] in n.output)
    q = next(n for n in fixed.graph.node if dq.input[0] in n.output)
    assert (dq.op_type, q.op_type, q.input[0]) == ("DequantizeLinear", "QuantizeLinear", "x")
    assert_equivalent(quantized, fixed, rtol=0, atol=0)


def test_rv1106_run_folds_the_pad_fold_constants_made_constant():
    """The smp encoders' "same" padding: a Pad whose pads an exporter computed at run time (here a Cast of a
    constant) becomes a constant under fold-constants, then part of the Conv under the rv1106 profile: no Pad
    reaches rknn-toolkit2's own (crashing) Pad-into-Conv fusion."""
    from onnx_npu_fix import api
    from onnx_npu_fix.config.options import FixOptions
    from onnx_npu_fix.config.targets import apply_target

    model = _pad_conv()
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([0, 0, 1, 2, 0, 0, 1, 0], np.float32),
                                                                "pads_float"))
    model.graph.node.insert(0, helper.make_node("Cast", ["pads_float"], ["pads"], name="cast", to=TensorProto.INT64))
    result = api.fix(model, apply_target(load_target("rv1106"), FixOptions(), {}), api.select_passes())
    assert ops(result.model) == ["Conv"] and _pads(_conv(result.model)) == [1, 2, 1, 0]
    assert_equivalent(model, result.model, rtol=0, atol=0)


def test_a_symmetric_pads_target_keeps_a_pad_that_would_make_the_conv_asymmetric():
    fixed, result = apply_pass(_pad_conv(), FoldPadConvPass(), fold_pad_into_conv=True, symmetric_pads=True)
    assert ops(fixed) == ["Pad", "Conv"] and "asymmetrically" in result.rejections[0].reason
    even = _pad_conv(pads=(0, 0, 1, 2, 0, 0, 1, 2))
    folded, _ = apply_pass(even, FoldPadConvPass(), fold_pad_into_conv=True, symmetric_pads=True)
    assert ops(folded) == ["Conv"] and _pads(_conv(folded)) == [1, 2, 1, 2]
