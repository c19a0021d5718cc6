"""align-channels: every Conv / ConvTranspose channel count a multiple of --align, outputs unchanged."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import onnx
import pytest
from helpers import apply_pass, assert_equivalent, ops, prepared, run_model
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import get_attr, infer_shapes, shape_of_value_info
from onnx_npu_fix.passes.align_channels import AlignChannelsPass, CarryPlan, Layout, PadConvPlan
from onnx_npu_fix.passes.base import PassResult

PASS = AlignChannelsPass()
L = 16  # sequence length of the 1-D models


class _Builder:
    """Inline model building with one seeded generator; weights scaled so activations stay O(1)."""

    def __init__(self, seed: int = 0, integer: bool = False) -> None:
        self.rng = np.random.default_rng(seed)
        self.integer = integer
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def rand(self, name: str, shape, fan_in: int = 1) -> str:
        if self.integer:
            value = self.rng.integers(-2, 3, shape).astype(np.float32)
        else:
            value = (self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
        return self.const(name, value)

    def op(self, op_type: str, inputs, name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attrs))
        return name

    def conv(self, name: str, x: str, c_in: int, c_out: int, k: int = 3, group: int = 1, bias: bool = True,
             dims: int = 1, **attrs) -> str:
        w = self.rand(f"{name}_w", (c_out, c_in // group) + (k,) * dims, fan_in=c_in // group * k ** dims)
        inputs = [x, w] + ([self.rand(f"{name}_b", (c_out,))] if bias else [])
        attrs.setdefault("pads", [k // 2] * (2 * dims))
        if group != 1:
            attrs["group"] = group
        return self.op("Conv", inputs, name, **attrs)

    def model(self, inputs: dict[str, tuple[int, ...]], outputs: list[str], opset: int = 17) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
        infer_shapes(model)
        onnx.checker.check_model(model)
        return model


# --- checks ---------------------------------------------------------------------------------------------------


def _input_fixed(model: onnx.ModelProto) -> set[str]:
    """Tensors whose channel count a graph input fixes: reached from graph inputs without a weighted op."""
    inits = {t.name for t in model.graph.initializer}
    fixed = {i.name for i in model.graph.input if i.name not in inits}
    for node in model.graph.node:
        if node.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
            continue
        data = [i for i in node.input if i and i not in inits]
        if data and all(i in fixed for i in data):
            fixed.update(node.output)
    return fixed


def conv_channel_violations(model: onnx.ModelProto, align: int) -> list[str]:
    """Every Conv/ConvTranspose channel count (as the NPU sees it) that is not a multiple of ``align``,
    except input channels that come straight from a graph input."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    fixed = _input_fixed(model)
    bad = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose"):
            continue
        w = inits[node.input[1]]
        g = get_attr(node, "group", 1)
        c_in, c_out = (w.shape[0], w.shape[1] * g) if node.op_type == "ConvTranspose" else (w.shape[1] * g,
                                                                                               w.shape[0])
        if g == 1 or g == c_in:
            counts = {"in": c_in, "out": c_out}
        else:
            counts = {"in per group": c_in // g, "out per group": c_out // g}
        depthwise = g == c_in and g > 1
        for what, count in counts.items():
            # A depthwise conv's output count is its input count (times the multiplier).
            if node.input[0] in fixed and (what.startswith("in") or depthwise):
                continue
            if count % align:
                bad.append(f"{node.name} {what} {count}")
    return bad


def assert_aligned(model: onnx.ModelProto, align: int) -> None:
    bad = conv_channel_violations(model, align)
    assert not bad, bad


def _weight(model: onnx.ModelProto, node_name: str, slot: int = 1) -> np.ndarray:
    node = next(n for n in model.graph.node if n.name == node_name)
    init = next(t for t in model.graph.initializer if t.name == node.input[slot])
    return numpy_helper.to_array(init)


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def _io(model: onnx.ModelProto):
    return ([(v.name, shape_of_value_info(v)) for v in model.graph.input],
            [(v.name, shape_of_value_info(v)) for v in model.graph.output])


def _shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    return {v.name: shape_of_value_info(v) for v in list(model.graph.value_info) + list(model.graph.output)}


def fix(model: onnx.ModelProto, align: int = 8, **options):
    """Run the pass, then check what every test needs: checker (apply_pass), equivalence on three seeds,
    alignment, unchanged graph I/O, and a second run that changes nothing."""
    fixed, result = apply_pass(model, PASS, align=align, **options)
    assert_equivalent(model, fixed)
    assert_aligned(fixed, align)
    assert _io(fixed) == _io(model)
    _, second = apply_pass(fixed, PASS, align=align, **options)
    assert second.changes == [], [c.to_json() for c in second.changes]
    assert not any(r.blocking for r in result.rejections), [r.to_json() for r in result.rejections]
    return fixed, result


# --- models ---------------------------------------------------------------------------------------------------


def conv_conv(c_mid: int = 60, c_in: int = 8, c_out: int = 16) -> onnx.ModelProto:
    b = _Builder()
    h = b.conv("conv1", "x", c_in, c_mid)
    b.conv("conv2", h, c_mid, c_out)
    return b.model({"x": (1, c_in, L)}, ["conv2"])


# --- tests ----------------------------------------------------------------------------------------------------


def test_60_channels_then_conv_pads_producer_and_scatters_consumer():
    model = conv_conv(60)
    fixed, result = fix(model)
    assert ops(fixed) == ["Conv", "Conv"]
    w1, b1, w2 = _weight(fixed, "conv1"), _weight(fixed, "conv1", 2), _weight(fixed, "conv2")
    assert w1.shape == (64, 8, 3) and b1.shape == (64,) and w2.shape == (16, 64, 3)
    assert not w1[60:].any() and not b1[60:].any() and not w2[:, 60:].any()
    np.testing.assert_array_equal(w2[:, :60], _weight(model, "conv2"))
    by_node = {c.node: c for c in result.changes if c.action == "pad-channels"}
    assert by_node["conv1"].old["out"] == 60 and by_node["conv1"].new["out"] == 64
    assert by_node["conv2"].old["in"] == 60 and by_node["conv2"].new["in"] == 64
    # 4 zero filters of 8*3 taps at L positions, plus 4 zero input channels of 16 filters of 3 taps
    assert result.metrics["extra_macs"] == 4 * 8 * 3 * L + 16 * 4 * 3 * L
    assert result.metrics["extra_weight_bytes"] == 4 * (4 * 8 * 3 + 4 + 16 * 4 * 3)
    assert result.metrics["macs_before"] == 60 * 8 * 3 * L + 16 * 60 * 3 * L


def test_bit_exact_with_integer_data():
    b = _Builder(integer=True)
    h = b.conv("conv1", "x", 8, 20)
    h = b.op("Relu", [h], "relu")
    b.conv("conv2", h, 20, 12)
    model = b.model({"x": (1, 8, L)}, ["conv2"])
    fixed, _ = fix(model)
    x = np.random.default_rng(3).integers(-3, 4, (1, 8, L)).astype(np.float32)
    (ref,), (got,) = run_model(model, [{"x": x}]), run_model(fixed, [{"x": x}])
    np.testing.assert_array_equal(ref["conv2"], got["conv2"])


@pytest.mark.parametrize("align, expected", [(16, 80), (8, 72)])
def test_72_channels(align, expected):
    model = conv_conv(72, c_in=16)
    fixed, result = fix(model, align=align)
    assert _weight(fixed, "conv1").shape[0] == expected
    assert _weight(fixed, "conv2").shape[1] == expected
    assert bool(result.changes) == (expected != 72)


def test_already_aligned_changes_nothing():
    model = conv_conv(32, c_in=16, c_out=16)
    fixed, result = fix(model, align=16)
    assert result.changes == [] and result.rejections == []
    assert [n.SerializeToString() for n in fixed.graph.node] == [n.SerializeToString() for n in model.graph.node]
    assert {t.name for t in fixed.graph.initializer} == {t.name for t in model.graph.initializer}


def test_align_zero_disables():
    model = conv_conv(60)
    fixed, result = apply_pass(model, PASS, align=0)
    assert result.changes == [] and result.rejections == []
    assert _weight(fixed, "conv1").shape[0] == 60


@pytest.mark.parametrize("align", [8, 16])
@pytest.mark.parametrize("skip_first", [True, False])
def test_unet_skip_concat(align, skip_first):
    # 2-D U-Net step: skip (36 ch) and up (64 ch) concatenated, then a conv.
    b = _Builder()
    skip = b.conv("enc", "x", 8, 36, dims=2)
    down = b.op("MaxPool", [skip], "pool", kernel_shape=[2, 2], strides=[2, 2])
    mid = b.conv("mid", down, 36, 64, dims=2)
    up = b.op("Resize", [mid, "", b.const("scales", np.array([1, 1, 2, 2], np.float32))], "up", mode="nearest")
    cat = b.op("Concat", [skip, up] if skip_first else [up, skip], "cat", axis=1)
    b.conv("dec", cat, 100, 16, dims=2)
    model = b.model({"x": (1, 8, 8, 8)}, ["dec"])
    fixed, _ = fix(model, align=align)
    assert ops(fixed) == ["Conv", "MaxPool", "Conv", "Resize", "Concat", "Conv"]  # nothing sliced or padded
    p = -(-36 // align) * align
    w = _weight(fixed, "dec")
    assert w.shape[1] == p + 64
    pad_cols = slice(36, p) if skip_first else slice(64 + 36, 64 + p)
    assert not w[:, pad_cols].any()
    assert _weight(fixed, "mid").shape[1] == p


def test_concat_with_non_contiguous_map_restored_by_gather():
    # The concat result is also a graph output: its real channels are not one block, so a Gather restores it.
    b = _Builder()
    a = b.conv("a", "x", 8, 36)
    c = b.conv("c", "x", 8, 64)
    cat = b.op("Concat", [a, c], "cat", axis=1)
    b.conv("dec", cat, 100, 16)
    model = b.model({"x": (1, 8, L)}, ["dec", "cat"])
    fixed, _ = fix(model)
    gather = next(n for n in fixed.graph.node if n.op_type == "Gather")
    assert gather.output[0] == "cat"
    assert ops(fixed).count("Slice") == 0


def test_conv_relu_maxpool_conv():
    b = _Builder()
    h = b.conv("conv1", "x", 8, 20, dims=2)
    h = b.op("Relu", [h], "relu")
    h = b.op("MaxPool", [h], "pool", kernel_shape=[2, 2], strides=[2, 2])
    b.conv("conv2", h, 20, 24, dims=2)
    model = b.model({"x": (1, 8, 8, 8)}, ["conv2"])
    fixed, _ = fix(model)
    assert ops(fixed) == ["Conv", "Relu", "MaxPool", "Conv"]
    assert _shapes(fixed)[_node(fixed, "pool").output[0]] == (1, 24, 4, 4)


@pytest.mark.parametrize("align", [8, 16])
def test_convtasnet_block_prelu_depthwise(align):
    b = _Builder()
    h = b.conv("pw", "x", 8, 20, k=1)
    h = b.op("PRelu", [h, b.rand("slope", (20, 1))], "prelu")
    b.conv("dw", h, 20, 20, group=20, dilations=[2], pads=[2, 2])
    model = b.model({"x": (1, 8, L)}, ["dw"])
    fixed, _ = fix(model, align=align)
    p = -(-20 // align) * align
    assert ops(fixed) == ["Conv", "PRelu", "Conv", "Slice"]  # real channels restored for the graph output
    assert _weight(fixed, "prelu").shape == (p, 1)
    assert get_attr(_node(fixed, "dw"), "group") == p
    dw = _weight(fixed, "dw")
    assert dw.shape == (p, 1, 3) and not dw[20:].any()


def test_depthwise_channel_multiplier():
    b = _Builder()
    h = b.conv("pw", "x", 8, 12, k=1)
    b.conv("dw", h, 12, 24, group=12)
    model = b.model({"x": (1, 8, L)}, ["dw"])
    fixed, _ = fix(model)
    assert get_attr(_node(fixed, "dw"), "group") == 16
    assert _weight(fixed, "dw").shape == (32, 1, 3)


def test_global_layer_norm_sees_only_real_channels():
    # ConvTasNet gLN from primitives: mean and variance over (C, L).
    b = _Builder()
    h = b.conv("conv1", "x", 8, 20)
    mean = b.op("ReduceMean", [h], "mean", axes=[1, 2], keepdims=1)
    centred = b.op("Sub", [h, mean], "centred")
    var = b.op("ReduceMean", [b.op("Mul", [centred, centred], "sq")], "var", axes=[1, 2], keepdims=1)
    std = b.op("Sqrt", [b.op("Add", [var, b.const("eps", np.float32(1e-8))], "var_eps")], "std")
    normed = b.op("Div", [centred, std], "normed")
    scaled = b.op("Mul", [normed, b.rand("gamma", (20, 1))], "gamma_mul")
    shifted = b.op("Add", [scaled, b.rand("beta", (20, 1))], "beta_add")
    b.conv("conv2", shifted, 20, 16)
    model = b.model({"x": (1, 8, L)}, ["conv2"])
    fixed, _ = fix(model)
    shapes = _shapes(fixed)
    for name in ("mean", "var"):
        reduce_input = _node(fixed, name).input[0]
        assert shapes[reduce_input][1] == 20, (name, shapes[reduce_input])
    assert _weight(fixed, "gamma_mul").shape == (24, 1)
    assert _weight(fixed, "conv2").shape[1] == 24


def test_conv_flatten_gemm_slices_right_after_conv():
    b = _Builder()
    h = b.conv("conv1", "x", 8, 12)
    h = b.op("Relu", [h], "relu")
    h = b.op("Flatten", [h], "flat")
    b.op("Gemm", [h, b.rand("fc_w", (12 * L, 10), fan_in=12 * L)], "fc")
    model = b.model({"x": (1, 8, L)}, ["fc"])
    fixed, _ = fix(model)
    # The padding reaches no conv, so it is not carried through the Relu.
    assert ops(fixed) == ["Conv", "Slice", "Relu", "Flatten", "Gemm"]
    assert _shapes(fixed)["relu"] == (1, 12, L)


def test_one_channel_output_head():
    b = _Builder()
    h = b.conv("conv1", "x", 8, 16)
    b.conv("head", h, 16, 1)
    model = b.model({"x": (1, 8, L)}, ["head"])
    fixed, _ = fix(model)
    assert ops(fixed) == ["Conv", "Conv", "Slice"]
    assert _weight(fixed, "head").shape == (8, 16, 3)
    assert fixed.graph.node[-1].output[0] == "head"


def test_output_also_feeding_a_conv_keeps_its_name():
    b = _Builder()
    h = b.conv("conv1", "x", 8, 20)
    b.conv("conv2", h, 20, 16)
    model = b.model({"x": (1, 8, L)}, ["conv2", "conv1"])
    fixed, _ = fix(model)
    assert ops(fixed) == ["Conv", "Slice", "Conv"]
    assert _node(fixed, "conv2").input[0] == _node(fixed, "conv1").output[0] != "conv1"


@pytest.mark.parametrize("align", [8, 16])
def test_conv_transpose_decoder(align):
    b = _Builder()
    h = b.conv("enc", "x", 8, 20)
    w = b.rand("dec_w", (20, 12, 4), fan_in=20 * 4)
    b.op("ConvTranspose", [h, w, b.rand("dec_b", (12,))], "dec", strides=[2], pads=[1, 1])
    model = b.model({"x": (1, 8, L)}, ["dec"])
    fixed, _ = fix(model, align=align)
    p_in, p_out = -(-20 // align) * align, -(-12 // align) * align
    wt = _weight(fixed, "dec")
    assert wt.shape == (p_in, p_out, 4)
    assert not wt[20:].any() and not wt[:, 12:].any()
    assert ops(fixed) == ["Conv", "ConvTranspose", "Slice"]


def test_grouped_conv_transpose():
    b = _Builder()
    h = b.conv("enc", "x", 8, 12)
    w = b.rand("dec_w", (12, 5, 4), fan_in=6 * 4)
    b.op("ConvTranspose", [h, w], "dec", strides=[2], pads=[1, 1], group=2)
    model = b.model({"x": (1, 8, L)}, ["dec"])
    fixed, _ = fix(model)
    assert _weight(fixed, "dec").shape == (16, 8, 4)


def test_grouped_conv_producer_emits_block_layout():
    b = _Builder()
    h = b.conv("conv1", "x", 8, 24)
    h = b.op("Relu", [h], "relu")
    b.conv("grouped", h, 24, 20, group=2)  # 12 in / 10 out per group
    model = b.model({"x": (1, 8, L)}, ["grouped"])
    fixed, _ = fix(model)
    # conv1 (24 ch, aligned itself) emits group blocks of 16 so no conversion is needed before the grouped conv.
    assert ops(fixed) == ["Conv", "Relu", "Conv", "Gather"]
    w1 = _weight(fixed, "conv1")
    assert w1.shape[0] == 32 and not w1[12:16].any() and not w1[28:].any()
    assert _weight(fixed, "grouped").shape == (32, 16, 3)


def test_grouped_conv_input_fixed_and_align_io():
    b = _Builder()
    b.conv("grouped", "x", 24, 32, group=2)
    model = b.model({"x": (1, 24, L)}, ["grouped"])
    fixed, result = fix(model)
    assert _weight(fixed, "grouped").shape == (32, 12, 3)  # output per group 16 already, input fixed
    assert [r.blocking for r in result.rejections] == [False]
    fixed, result = fix(model, align_io=True)
    assert ops(fixed) == ["Pad", "Gather", "Conv"]
    assert _weight(fixed, "grouped").shape == (32, 16, 3)
    assert conv_channel_violations(fixed, 8) == []


def test_graph_input_channels_reported_or_padded_with_align_io():
    b = _Builder()
    h = b.op("Mul", ["x", b.const("scale", np.float32(0.5))], "scale_in")
    b.conv("conv1", h, 3, 16)
    model = b.model({"x": (1, 3, L)}, ["conv1"])
    fixed, result = fix(model)
    assert result.changes == []
    assert [(r.node, r.blocking) for r in result.rejections] == [("conv1", False)]
    assert "graph input" in result.rejections[0].reason
    fixed, result = fix(model, align_io=True)
    assert ops(fixed) == ["Mul", "Pad", "Conv"]
    assert _weight(fixed, "conv1").shape == (16, 8, 3)
    assert fixed.graph.input[0] == model.graph.input[0]


def test_unaligned_tensor_from_non_conv_gets_a_pad():
    # A Reshape (not a channel-local op, not a graph input) hands 60 channels to a conv.
    b = _Builder()
    h = b.conv("conv1", "x", 8, 16, k=1)
    h = b.op("Reshape", [h, b.const("shape", np.array([1, 60, 4], np.int64))], "reshape")
    b.conv("conv2", h, 60, 16)
    model = b.model({"x": (1, 8, 15)}, ["conv2"])
    fixed, _ = fix(model)
    assert ops(fixed) == ["Conv", "Reshape", "Pad", "Conv"]


@pytest.mark.parametrize("align", [8, 16])
def test_sigmoid_makes_pad_channels_nonzero(align):
    b = _Builder()
    h = b.conv("conv1", "x", 8, 20)
    h = b.op("Sigmoid", [h], "sig")
    b.conv("conv2", h, 20, 16)
    model = b.model({"x": (1, 8, L)}, ["conv2", "sig"])
    fixed, _ = fix(model, align=align)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 8, L)).astype(np.float32)}
    pad_values = run_model(_expose(fixed, _node(fixed, "sig").output[0]), [feeds])[0]["probe"][:, 20:]
    np.testing.assert_allclose(pad_values, 0.5)  # sigmoid(0): the zero weights of conv2 are what matters
    assert not _weight(fixed, "conv2")[:, 20:].any()


def _expose(model: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.node.append(helper.make_node("Identity", [tensor], ["probe"]))
    probe.graph.output.append(helper.make_tensor_value_info("probe", TensorProto.FLOAT, None))
    return probe


def test_residual_add_of_two_padded_tensors():
    b = _Builder()
    x1 = b.conv("conv1", "x", 8, 20)
    h = b.op("Relu", [x1], "relu")
    y = b.conv("conv2", h, 20, 20)
    s = b.op("Add", [x1, y], "res")
    b.conv("conv3", s, 20, 8)
    model = b.model({"x": (1, 8, L)}, ["conv3"])
    fixed, _ = fix(model)
    assert ops(fixed) == ["Conv", "Relu", "Conv", "Add", "Conv"]


def test_add_of_different_layouts_is_regathered():
    b = _Builder()
    cat = b.op("Concat", [b.conv("a", "x", 8, 36), b.conv("c", "x", 8, 64)], "cat", axis=1)
    other = b.conv("other", "x", 8, 100)
    s = b.op("Add", [cat, other], "sum")
    b.conv("dec", s, 100, 8)
    model = b.model({"x": (1, 8, L)}, ["dec"])
    fixed, _ = fix(model)
    assert ops(fixed).count("Gather") == 1


def test_channel_local_chain_is_carried():
    b = _Builder()
    h = b.conv("conv1", "x", 8, 20, bias=False)
    h = b.op("BatchNormalization", [h, b.rand("bn_s", (20,)), b.rand("bn_b", (20,)), b.rand("bn_m", (20,)),
                                    b.const("bn_v", np.full(20, 0.7, np.float32))], "bn")
    h = b.op("Resize", [h, "", "", b.const("sizes", np.array([1, 20, 2 * L], np.int64))], "up", mode="nearest")
    h = b.op("Pad", [h, b.const("tpads", np.array([0, 0, 2, 0, 0, 0], np.int64))], "tpad")
    h = b.op("Slice", [h, b.const("s0", np.array([0], np.int64)), b.const("s1", np.array([2 * L], np.int64)),
                       b.const("s2", np.array([2], np.int64))], "chomp")
    h = b.op("Clip", [h, b.const("lo", np.float32(-1)), b.const("hi", np.float32(1))], "clip")
    h = b.op("Div", [h, b.const("divisor", np.linspace(1, 2, 20, dtype=np.float32).reshape(1, 20, 1))], "div")
    h = b.op("Mul", [h, b.rand("gate", (20, 1))], "mul")
    h = b.op("ReduceMean", [h], "tmean", axes=[2], keepdims=1)
    h = b.op("Concat", [b.const("zeros", np.zeros((1, 20, 2), np.float32)), h], "state", axis=2)
    b.conv("conv2", h, 20, 16)
    model = b.model({"x": (1, 8, L)}, ["conv2"])
    fixed, _ = fix(model)
    assert ops(fixed) == ops(model)  # nothing restored or padded in between
    assert _weight(fixed, "div").shape == (1, 24, 1)
    assert (_weight(fixed, "div")[:, 20:] == 1).all()  # finite pad channels
    assert _weight(fixed, "state", 0).shape == (1, 24, 2)
    assert list(_weight(fixed, "up", 3)) == [1, 24, 2 * L]


def test_shared_weights_are_not_corrupted():
    b = _Builder()
    w = b.rand("w", (20, 8, 3), fan_in=24)
    a = b.op("Conv", ["x", w], "a", pads=[1, 1])
    c = b.op("Conv", ["x", w], "c", pads=[1, 1])
    b.op("Add", [a, c], "sum")
    model = b.model({"x": (1, 8, L)}, ["sum"])
    fixed, _ = fix(model)
    assert _node(fixed, "a").input[1] != _node(fixed, "c").input[1]
    assert numpy_helper.to_array(next(t for t in fixed.graph.initializer if t.name == "w")).shape == (20, 8, 3)


def test_dynamic_weights_are_a_blocking_rejection():
    b = _Builder()
    h = b.conv("conv1", "x", 8, 20)
    b.op("Conv", [h, "w"], "conv2", pads=[1, 1])
    model = b.model({"x": (1, 8, L), "w": (12, 20, 3)}, ["conv2"])
    fixed, result = apply_pass(model, PASS, align=8)
    assert [(r.node, r.blocking) for r in result.rejections] == [("conv2", True)]
    assert _node(fixed, "conv2").input[0] == "conv1"  # reads the real 20 channels
    assert_equivalent(model, fixed)


def test_non_channel_local_ops_stop_the_padding():
    b = _Builder()
    h = b.conv("conv1", "x", 8, 20)
    t = b.op("Transpose", [h], "t", perm=[0, 2, 1])
    sm = b.op("Softmax", [h], "sm", axis=1)
    b.conv("conv2", sm, 20, 8)
    part = b.op("Slice", [h, b.const("c0", np.array([5], np.int64)), b.const("c1", np.array([15], np.int64)),
                          b.const("c_ax", np.array([1], np.int64))], "part")
    b.conv("conv3", part, 10, 8)
    b.conv("conv4", b.op("ReduceMean", [h], "cmean", axes=[1], keepdims=1), 1, 8)
    model = b.model({"x": (1, 8, L)}, ["conv2", "conv3", "conv4", t])
    fixed, _ = fix(model)
    shapes = _shapes(fixed)
    assert shapes[_node(fixed, "part").input[0]][1] == 20
    assert shapes[_node(fixed, "cmean").input[0]][1] == 20
    assert shapes[_node(fixed, "t").input[0]][1] == 20
    assert shapes[_node(fixed, "sm").input[0]][1] == 20


def test_depthwise_on_graph_input():
    b = _Builder()
    h = b.conv("dw", "x", 12, 12, group=12)
    b.conv("pw", h, 12, 16, k=1)
    model = b.model({"x": (1, 12, L)}, ["pw"])
    fixed, result = fix(model)
    assert [(r.node, r.blocking) for r in result.rejections] == [("dw", False)]
    assert ops(fixed) == ["Conv", "Pad", "Conv"]  # the dw output is a conv output: padded for pw
    fixed, result = fix(model, align_io=True)
    assert ops(fixed) == ["Pad", "Conv", "Conv"]
    assert get_attr(_node(fixed, "dw"), "group") == 16
    assert conv_channel_violations(fixed, 8) == [] and result.rejections == []


def test_opset_10_is_a_blocking_rejection():
    b = _Builder()
    b.conv("aligned", b.conv("conv1", "x", 8, 20), 20, 16)
    model = b.model({"x": (1, 8, L)}, ["aligned"], opset=10)
    fixed, result = apply_pass(model, PASS, align=8)
    assert result.changes == []
    assert [(r.node, r.blocking) for r in result.rejections] == [("conv1", True), ("aligned", True)]


def _random_model(seed: int) -> onnx.ModelProto:
    """A random DAG of convs (dense, depthwise, grouped, transposed) and the ops between them, all 1-D with
    the sequence length preserved, so any two tensors with the same channel count can be added."""
    b = _Builder(seed)
    rng = b.rng
    tensors: list[tuple[str, int]] = [("x", int(rng.choice([3, 8, 12])))]
    for i in range(int(rng.integers(6, 14))):
        name, c = tensors[int(rng.integers(len(tensors)))] if rng.random() < 0.4 else tensors[-1]
        choice = rng.choice(["conv", "conv", "dw", "grouped", "convt", "unary", "binary", "concat", "bn", "stop"])
        n = f"n{i}"
        if choice == "conv":
            out = int(rng.choice([1, 4, 6, 12, 16, 20, 36]))
            tensors.append((b.conv(n, name, c, out, k=int(rng.choice([1, 3]))), out))
        elif choice == "dw" and c > 1:
            m = int(rng.choice([1, 2]))
            tensors.append((b.conv(n, name, c, c * m, group=c, dilations=[2], pads=[2, 2]), c * m))
        elif choice == "grouped" and c % 2 == 0 and c > 2:
            out = 2 * int(rng.choice([3, 5, 8]))
            tensors.append((b.conv(n, name, c, out, group=2), out))
        elif choice == "convt":
            out = int(rng.choice([5, 12, 16]))
            w = b.rand(f"{n}_w", (c, out, 3), fan_in=3 * c)
            tensors.append((b.op("ConvTranspose", [name, w, b.rand(f"{n}_b", (out,))], n, pads=[1, 1]), out))
        elif choice == "unary":
            op = str(rng.choice(["Relu", "Sigmoid", "Tanh", "PRelu", "MaxPool"]))
            if op == "PRelu":
                tensors.append((b.op(op, [name, b.rand(f"{n}_s", (c, 1))], n), c))
            elif op == "MaxPool":
                tensors.append((b.op(op, [name], n, kernel_shape=[3], pads=[1, 1]), c))
            else:
                tensors.append((b.op(op, [name], n), c))
        elif choice == "binary":
            same = [t for t, tc in tensors if tc == c and t != name]
            if same and rng.random() < 0.6:
                tensors.append((b.op(str(rng.choice(["Add", "Mul"])), [name, same[-1]], n), c))
            else:
                op = str(rng.choice(["Add", "Mul", "Div", "Sub"]))
                const = (np.abs(b.rng.standard_normal((1, c, 1))) + 0.5).astype(np.float32)
                tensors.append((b.op(op, [name, b.const(f"{n}_c", const)], n), c))
        elif choice == "concat":
            other, oc = tensors[int(rng.integers(len(tensors)))]
            tensors.append((b.op("Concat", [name, other], n, axis=1), c + oc))
        elif choice == "bn":
            params = [b.rand(f"{n}_s", (c,)), b.rand(f"{n}_b", (c,)), b.rand(f"{n}_m", (c,)),
                      b.const(f"{n}_v", np.full(c, 0.5, np.float32))]
            tensors.append((b.op("BatchNormalization", [name, *params], n), c))
        else:
            mean = b.op("ReduceMean", [name], f"{n}_mean", axes=[1, 2], keepdims=1)
            tensors.append((b.op("Sub", [name, mean], n), c))
    outputs = sorted({tensors[-1][0], tensors[int(rng.integers(1, len(tensors)))][0]})
    return b.model({"x": (1, tensors[0][1], L)}, outputs)


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("align", [8, 16])
def test_random_graphs(seed, align):
    model = _random_model(seed)
    fix(model, align=align)
    fix(model, align=align, align_io=True)


def test_grouped_block_layout_requested_through_depthwise():
    # dense -> depthwise -> grouped: the dense producer emits the grouped conv's blocks, the depthwise keeps them.
    b = _Builder()
    h = b.conv("pw", "x", 8, 24, k=1)
    h = b.conv("dw", h, 24, 24, group=24)
    b.conv("grouped", h, 24, 16, group=2)
    model = b.model({"x": (1, 8, L)}, ["grouped"])
    fixed, _ = fix(model)
    assert ops(fixed) == ["Conv", "Conv", "Conv"]
    assert get_attr(_node(fixed, "dw"), "group") == 32
    dw = _weight(fixed, "dw")
    assert not dw[12:16].any() and not dw[28:].any()


def test_squeeze_excitation_block():
    # x * sigmoid(conv(relu(conv(gap(x))))) with 20 channels: everything stays padded, no Slice / Pad.
    b = _Builder()
    x = b.op("Relu", [b.conv("stem", "x", 8, 20, dims=2)], "stem_relu")
    s = b.op("GlobalAveragePool", [x], "gap")
    s = b.op("Relu", [b.conv("squeeze", s, 20, 12, k=1, dims=2)], "sq_relu")
    s = b.op("Sigmoid", [b.conv("excite", s, 12, 20, k=1, dims=2)], "gate")
    y = b.op("Mul", [x, s], "scaled")
    b.conv("proj", y, 20, 16, k=1, dims=2)
    model = b.model({"x": (1, 8, 6, 6)}, ["proj"])
    fixed, _ = fix(model)
    assert ops(fixed) == ops(model)
    assert _shapes(fixed)[_node(fixed, "scaled").output[0]][1] == 24


def test_more_channel_local_ops_are_carried():
    b = _Builder()
    h = b.conv("conv1", "x", 8, 12)
    h = b.op("LayerNormalization", [h, b.rand("ln_s", (L,)), b.rand("ln_b", (L,))], "ln", axis=-1)
    h = b.op("Softmax", [h], "sm", axis=2)
    h = b.op("InstanceNormalization", [h, b.rand("in_s", (12,)), b.rand("in_b", (12,))], "inorm")
    b.nodes.append(helper.make_node("Split", [h, b.const("halves", np.array([L // 2, L // 2], np.int64))],
                                    ["left", "right"], name="split", axis=2))
    h = b.op("Concat", ["right", "left"], "swap", axis=2)
    h = b.op("Add", [h, b.op("ReduceMax", [h, b.const("ax2", np.array([2], np.int64))], "tmax")], "addmax")
    b.conv("conv2", h, 12, 8)
    model = b.model({"x": (1, 8, L)}, ["conv2", "left"], opset=18)
    fixed, _ = fix(model)
    assert sorted(ops(fixed)) == sorted(ops(model) + ["Slice"])  # only the graph output "left" is restored
    assert next(n for n in fixed.graph.node if n.op_type == "Slice").output[0] == "left"
    assert _weight(fixed, "inorm").shape == (16,)


def test_padded_divisor_is_not_carried():
    # Pad channels of the divisor are 0 (0 / 0 = NaN, and 0 * NaN poisons conv3): Div must see real channels.
    b = _Builder()
    num = b.conv("num", "x", 8, 20)
    den = b.op("Add", [b.op("Abs", [b.conv("den", "x", 8, 20)], "abs"), b.const("one", np.float32(1))], "den_pos")
    b.conv("conv3", b.op("Div", [num, den], "ratio"), 20, 8)
    model = b.model({"x": (1, 8, L)}, ["conv3"])
    fixed, _ = fix(model)
    assert _shapes(fixed)[_node(fixed, "ratio").input[1]][1] == 20


def test_maxpool_indices_need_real_channels():
    b = _Builder()
    h = b.conv("conv1", "x", 8, 20)
    b.nodes.append(helper.make_node("MaxPool", [h], ["pooled", "where"], name="pool", kernel_shape=[2],
                                    strides=[2]))
    b.conv("conv2", "pooled", 20, 8)
    b.op("Cast", ["where"], "where_f", to=TensorProto.FLOAT)  # flat indices count the channels
    model = b.model({"x": (1, 8, L)}, ["conv2", "where_f"])
    fixed, _ = fix(model)
    assert _shapes(fixed)[_node(fixed, "pool").input[0]][1] == 20


def test_resize_with_axes():
    b = _Builder()
    c = b.conv("conv1", "x", 8, 20)
    h = b.op("Resize", [c, "", "", b.const("sizes", np.array([20, 2 * L], np.int64))], "up", axes=[1, 2],
             mode="nearest")
    h = b.op("Resize", [h, "", b.const("scales", np.array([2.0], np.float32))], "up2", axes=[2], mode="nearest")
    b.conv("conv2", h, 20, 8)
    # Resizing the channel axis duplicates channels: a stop.
    h = b.op("Resize", [c, "", b.const("cscales", np.array([1.0, 2.0, 1.0], np.float32))], "chan_up",
             mode="nearest")
    b.conv("conv3", h, 40, 8)
    model = b.model({"x": (1, 8, L)}, ["conv2", "conv3"], opset=18)
    fixed, _ = fix(model)
    assert list(_weight(fixed, "up", 3)) == [24, 2 * L]
    assert _shapes(fixed)[_node(fixed, "chan_up").input[0]][1] == 20


@pytest.mark.parametrize("name", ["tcn.onnx", "tcn_causal.onnx", "unet.onnx", "lraspp.onnx"])
@pytest.mark.parametrize("align", [8, 16])
def test_fixtures(fixture_path, name, align):
    path = fixture_path(name)
    if not os.path.exists(path):
        pytest.skip(f"{name} not built")
    model = onnx.load(path)
    assert conv_channel_violations(model, align)  # something to fix
    fixed, result = fix(model, align=align)
    padded = [c for c in result.changes if c.action == "pad-channels"]
    assert padded and all(c.new["out"] >= c.old["out"] and c.new["in"] >= c.old["in"] for c in padded)
    assert result.metrics["extra_macs"] > 0 and result.metrics["extra_weight_bytes"] > 0


def test_idempotent_second_run_leaves_the_model_identical():
    model = _random_model(5)
    fixed, _ = apply_pass(model, PASS, align=8)
    again, result = apply_pass(fixed, PASS, align=8)
    assert result.changes == []
    assert [n.SerializeToString() for n in again.graph.node] == [n.SerializeToString() for n in fixed.graph.node]
    assert [t.SerializeToString() for t in again.graph.initializer] == [
        t.SerializeToString() for t in fixed.graph.initializer]


def test_tf_crop_and_resize_with_a_roi_is_not_carried():
    # A channel roi [0.1, 0.9] in tf_crop_and_resize mode: channel c samples at 0.1 * (C-1) + 0.8 * c under the
    # spec, which padding C would move (onnxruntime reads it otherwise and agrees); the padding is sliced off
    # before the Resize.
    b = _Builder()
    h = b.conv("conv1", "x", 8, 20)
    roi = b.const("roi", np.array([0, 0.1, 0, 1, 0.9, 1], np.float32))
    h = b.op("Resize", [h, roi, b.const("scales", np.array([1, 1, 2], np.float32))], "crop",
             mode="linear", coordinate_transformation_mode="tf_crop_and_resize")
    b.conv("conv2", h, 20, 16)
    model = b.model({"x": (1, 8, L)}, ["conv2"])
    fixed, result = fix(model)
    assert [r.reason for r in result.rejections if r.node == "crop"] == [
        "tf_crop_and_resize with a roi on the channel axis: its crop depends on the channel count, so the "
        "padding is sliced off before this Resize"]
    crop = _node(fixed, "crop")
    assert _shapes(fixed)[crop.input[0]][1] == 20  # the real channels reach it
    # both readings of the Resize agree on the fixed model as on the original
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(0).standard_normal((1, 8, L)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = ReferenceEvaluator(fixed).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# --- find reads, rewrite applies exactly the plans ------------------------------------------------------------


@pytest.mark.parametrize("seed", range(0, 16, 3))
def test_find_leaves_the_model_byte_identical(seed):
    work = prepared(_random_model(seed))
    before = work.SerializeToString()
    found = PASS.find(work, FixOptions(align=8))
    assert found.plans  # something was planned, so the find really looked
    assert work.SerializeToString() == before


def test_plans_are_typed_and_carry_every_decision():
    # conv1 emits 60 of 64 channels, the Relu carries them, conv2 reads them; the graph input's 12 channels stay.
    b = _Builder()
    h = b.conv("conv1", "x", 12, 60)
    h = b.op("Relu", [h], "relu")
    b.conv("conv2", h, 60, 16)
    model = prepared(b.model({"x": (1, 12, L)}, ["conv2"]))
    found = PASS.find(model, FixOptions(align=8))
    conv1, relu, conv2 = found.plans
    padded = Layout.prefix(60, 64)
    assert isinstance(conv1, PadConvPlan) and (conv1.nodes, conv1.target, conv1.out) == (("conv1",), None, padded)
    assert isinstance(relu, CarryPlan) and (relu.nodes, relu.out) == (("relu",), padded)
    assert isinstance(conv2, PadConvPlan) and (conv2.target, conv2.out, conv2.cg_new) == (padded, None, 64)
    # the graph input's channels are refused in find, not discovered while rewriting
    assert [(r.node, r.blocking) for r in found.rejections] == [("conv1", False)]
    assert "fixed by a graph input" in found.rejections[0].reason


# What rewrite(find()) gave on these generated models when find still rewrote a scratch copy (the
# ScratchFindPass version, commit 352de0f): sha256 of the fixed model's bytes + its changes, rejections and
# metrics as JSON, first 16 hex digits. A change here means the pass's output changed.
_SCRATCH_FIND_DIGESTS = {
    (0, 8): "e5052be271a252a3", (0, 16): "9def1727760cc843", (1, 8): "17b2c3adecfb3ff0", (1, 16): "8cca39242e8afe05",
    (2, 8): "8bd890b15d9adcc8", (2, 16): "34a1b00119160a03", (3, 8): "888af6f21a1f61fe", (3, 16): "84d13ac2e00e451f",
    (4, 8): "990b4239f439ab9e", (4, 16): "f46739d6cecef86b", (5, 8): "0c6edfcb5d119a6f", (5, 16): "d85466e2981a4c7b",
    (6, 8): "63d70e505b7c09bf", (6, 16): "c44150bd5748793e", (7, 8): "e450af3f13a98b1e", (7, 16): "b542ab8dcafc8069",
}


@pytest.mark.parametrize("seed, align", sorted(_SCRATCH_FIND_DIGESTS))
def test_rewrite_of_find_gives_what_the_scratch_find_version_gave(seed, align):
    work = prepared(_random_model(seed))
    options = FixOptions(align=align)
    result = PASS.rewrite(work, options, PASS.find(work, options))
    onnx.checker.check_model(work)
    infer_shapes(work)  # as apply_pass did when the digests were taken
    record = json.dumps([[c.to_json() for c in result.changes], [r.to_json() for r in result.rejections],
                         result.metrics], sort_keys=True)
    digest = hashlib.sha256(work.SerializeToString() + record.encode()).hexdigest()[:16]
    assert digest == _SCRATCH_FIND_DIGESTS[(seed, align)]


def _two_branches() -> onnx.ModelProto:
    """x -> conv_a (12) -> relu_a -> conv_a2 -> ya  and  x -> conv_b (20) -> conv_b2 -> yb."""
    b = _Builder()
    h = b.conv("conv_a", "x", 8, 12)
    h = b.op("Relu", [h], "relu_a")
    b.conv("conv_a2", h, 12, 8)
    h = b.conv("conv_b", "x", 8, 20)
    b.conv("conv_b2", h, 20, 8)
    return b.model({"x": (1, 8, L)}, ["conv_a2", "conv_b2"])


def _rewrite_only(model: onnx.ModelProto, keep: set[str]) -> tuple[onnx.ModelProto, PassResult]:
    work = prepared(model)
    options = FixOptions(align=8)
    found = PASS.find(work, options)
    assert {name for plan in found.plans for name in plan.nodes} >= keep  # the filter really drops plans
    found.plans = [plan for plan in found.plans if set(plan.nodes) <= keep]
    result = PASS.rewrite(work, options, found)
    onnx.checker.check_model(work)
    infer_shapes(work)
    assert_equivalent(model, work)
    return work, result


def test_rewrite_applies_only_the_plans_it_is_given():
    model = _two_branches()
    fixed, result = _rewrite_only(model, {"conv_a", "relu_a", "conv_a2"})
    edited = {c.node for c in result.changes if c.action != "insert"}
    assert edited == {"conv_a", "relu_a", "conv_a2"}
    assert conv_channel_violations(fixed, 8) == ["conv_b out 20", "conv_b2 in 20"]
    for name in ("conv_b", "conv_b2"):
        np.testing.assert_array_equal(_weight(fixed, name), _weight(model, name))


@pytest.mark.parametrize("keep", [{"conv_a", "conv_a2"}, {"relu_a", "conv_a2"}, {"conv_a"}],
                         ids=["without-the-carry", "without-the-producer", "without-the-consumer"])
def test_a_filtered_found_still_gives_an_equivalent_model(keep):
    # A plan whose neighbour's plan was left out converts what actually arrives (Pad / Slice), so the outputs
    # stay the same (_rewrite_only checks them with onnxruntime).
    _, result = _rewrite_only(_two_branches(), keep)
    assert {c.node for c in result.changes if c.action == "pad-channels"} == keep - {"relu_a"}


@pytest.mark.parametrize("concat_align, leaves", [(8, frozenset()), (16, frozenset({"concat-align"}))])
def test_a_carry_across_a_concat_says_which_constraint_it_leaves(concat_align, leaves):
    # conv_a (4 -> 8) and conv_b (8) meet in a Concat read by a Conv: inputs of 8 are multiples of 8, not of 16.
    b = _Builder()
    a = b.conv("conv_a", "x", 8, 4, k=1)
    c = b.conv("conv_b", "x", 8, 8, k=1)
    h = b.op("Concat", [a, c], "cat", axis=1)
    b.conv("conv_c", h, 12, 8, k=1)
    model = prepared(b.model({"x": (1, 8, L)}, ["conv_c"]))
    found = PASS.find(model, FixOptions(align=8, concat_align=concat_align))
    cat = next(plan for plan in found.plans if plan.nodes == ("cat",))
    assert isinstance(cat, CarryPlan) and cat.leaves == leaves
    assert cat.inputs == (Layout.prefix(4, 8), None) and cat.out == Layout(16, (0, 1, 2, 3, 8, 9, 10, 11, 12, 13,
                                                                                14, 15))
    assert (("cat", "concat-align") in found.left_violated()) == bool(leaves)


def test_rewrite_of_a_found_it_did_not_make_plans_as_find_did():
    """rewrite takes find's all-aligned answer from its AlignFound; a plain Found (a caller's own) is judged by
    the same scan, with the same result."""
    from onnx_npu_fix.passes.base import Found

    options = FixOptions(align=8)
    outputs = []
    for wrap in (lambda f: f, lambda f: Found(f.plans, f.rejections)):
        work = prepared(_two_branches())
        result = PASS.rewrite(work, options, wrap(PASS.find(work, options)))
        outputs.append((work.SerializeToString(), [c.to_json() for c in result.changes], result.metrics))
    assert outputs[0] == outputs[1] and outputs[0][1]
    aligned = prepared(_two_branches())
    found = PASS.find(aligned, FixOptions(align=4))
    assert found.all_aligned and not found.plans
    assert not PASS.rewrite(aligned, FixOptions(align=4), Found()).changes
