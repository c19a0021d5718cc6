"""Tests for the ``dilated-conv`` pass: exact space-to-batch rewrite of over-dilated Convs.

Every rewritten model is compared with onnxruntime against the original (or, for auto_pad SAME, which
onnxruntime refuses to run with a dilation, against an explicit-pads original built here from the ONNX spec
formula): on seeded Gaussian inputs with the exact tolerance, and bit for bit on small-integer inputs with
small-integer weights, where every float32 sum is exact whatever the summation order.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from helpers import apply_pass, assert_equivalent, ops, prepared, quantize_with_onnxruntime, run_model
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import GraphIndex, conv_macs, get_attr, infer_shapes, shape_of_value_info
from onnx_npu_fix.ir.qdq import walk_non_qdq
from onnx_npu_fix.passes.base import Found
from onnx_npu_fix.passes.dilated_conv import DilatedConvPass, LiftPlan, SpaceToBatchPlan, TrimPlan, block_size
from onnx_npu_fix.pipeline.scheduler import prepare, run_passes

LAYOUTS = ("auto", "spatial", "channel", "batch")
MAX_DILATIONS = (1, 2, 4, 7)
ALLOWED_OPS = {"Pad", "Concat", "Reshape", "Transpose", "Conv", "Slice"}


# --- model builders ------------------------------------------------------------------------------------


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def conv_model(in_shape, w_shape, *, group=1, bias=True, seed=0, opset=17, **attrs):
    """One Conv with small-integer weights and bias (every float32 sum exact)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.integers(-3, 4, w_shape).astype(np.float32), "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.integers(-3, 4, w_shape[0]).astype(np.float32), "b"))
        inputs.append("b")
    node = helper.make_node("Conv", inputs, ["y"], name="conv", group=group, **attrs)
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits, opset)


def int_feeds(model, seeds=(0, 1)):
    """Small-integer float inputs, so both models' sums are exact and must agree bit for bit."""
    feeds = []
    for seed in seeds:
        rng = np.random.default_rng(100 + seed)
        feed = {}
        for vi in model.graph.input:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            feed[vi.name] = rng.integers(-4, 5, shape).astype(np.float32)
        feeds.append(feed)
    return feeds


def assert_bit_exact(reference, fixed, feeds=None):
    feeds = feeds or int_feeds(reference)
    for want, got in zip(run_model(reference, feeds), run_model(fixed, feeds)):
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def conv_nodes(model):
    return [n for n in model.graph.node if n.op_type == "Conv"]


def max_dilation_of(model):
    return max((max(get_attr(n, "dilations") or [1]) for n in conv_nodes(model)), default=1)


def tensor_shapes(model):
    """Shapes of every non-initializer tensor after shape inference."""
    infer_shapes(model)
    return {vi.name: shape_of_value_info(vi) for vi in (*model.graph.value_info, *model.graph.output)}


def assert_graph_quality(original, fixed, layout, *, in_rank):
    """Every tensor static (and <= 4-D in the spatial/channel layouts), only NPU-friendly ops added, and no
    Transpose in the spatial layout."""
    shapes = tensor_shapes(fixed)
    for name, shape in shapes.items():
        assert shape is not None and all(isinstance(d, int) and d > 0 for d in shape), (name, shape)
        if layout in ("spatial", "channel") and in_rank <= 4:
            assert len(shape) <= 4, (name, shape)
    assert set(ops(fixed)) - set(ops(original)) <= ALLOWED_OPS, ops(fixed)
    if layout == "spatial":
        assert "Transpose" not in ops(fixed)


def explicit_same_pads(length, kernel, stride, dilation, upper):
    """ONNX spec for auto_pad SAME_*: the output is ceil(L / s); SAME_UPPER puts the odd unit at the end."""
    out = -(-length // stride)
    total = max(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - length)
    small, big = total // 2, total - total // 2
    return (small, big) if upper else (big, small)


# --- block size ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dilation, limit, k", [(8, 4, 2), (128, 4, 32), (5, 4, 5), (128, 1, 128), (12, 7, 2),
                                                (9, 2, 9), (16, 7, 4)])
def test_block_size_smallest_divisor(dilation, limit, k):
    # The examples of the original report, and the smallest k with D % k == 0 and D/k <= limit.
    assert block_size(dilation, max_dilation=limit) == k
    assert dilation % k == 0 and dilation // k <= limit
    assert all(dilation % j or dilation // j > limit for j in range(1, k))


def test_block_size_allowed_set_and_stride():
    assert block_size(6, max_dilation=None, allowed=(1, 2, 4, 8)) == 3  # 6/3 = 2 is allowed, 6/2 = 3 is not
    assert block_size(12, max_dilation=8, allowed=(1, 2, 4, 8)) == 3  # 4
    assert block_size(8, max_dilation=2, stride=2) == 4  # s | k
    assert block_size(4, max_dilation=4, stride=8) == 1
    assert block_size(2, max_dilation=1, stride=4) == 2  # k | s
    assert block_size(6, max_dilation=2, stride=4) is None  # k in {3, 6}: neither divides nor is divided by 4


# --- the coverage matrix -------------------------------------------------------------------------------

# (id, input shape, weight shape, group, bias, attrs)
CASES = [
    ("1d-depthwise-batch2", [2, 4, 37], [4, 1, 3], 4, True, dict(dilations=[8], pads=[8, 8])),
    ("1d-depthwise-multiplier", [1, 3, 32], [6, 1, 3], 3, True, dict(dilations=[6], pads=[6, 6])),
    ("1d-grouped-asym", [1, 4, 30], [6, 2, 3], 2, False, dict(dilations=[9], pads=[3, 5])),
    ("1d-dense-nopad", [1, 3, 40], [5, 3, 2], 1, True, dict(dilations=[16], pads=[0, 0])),
    ("1d-prime-dilation", [1, 2, 27], [2, 1, 3], 2, True, dict(dilations=[5], pads=[5, 5])),
    ("1x_k-as-2d", [1, 4, 1, 35], [4, 1, 1, 3], 4, True, dict(dilations=[1, 12], pads=[0, 12, 0, 12])),
    ("k_x1-as-2d", [1, 2, 33, 1], [3, 2, 3, 1], 1, False, dict(dilations=[10, 1], pads=[10, 0, 10, 0])),
    ("2d-w-only", [1, 3, 9, 26], [4, 3, 3, 3], 1, True, dict(dilations=[1, 8], pads=[1, 8, 1, 8])),
    ("2d-both-depthwise", [1, 3, 20, 23], [3, 1, 3, 3], 3, True, dict(dilations=[6, 8], pads=[2, 3, 4, 5])),
    ("2d-h-only-batch2", [2, 2, 24, 10], [4, 2, 3, 2], 1, False, dict(dilations=[5, 1], pads=[5, 0, 5, 1])),
    ("1d-stride2-s|k", [1, 4, 40], [4, 1, 3], 4, True, dict(dilations=[8], strides=[2], pads=[8, 8])),
    ("1d-stride4-k|s", [1, 2, 41], [2, 1, 3], 2, True, dict(dilations=[4], strides=[4], pads=[1, 0])),
    ("1d-stride3-floor", [1, 2, 50], [2, 2, 2], 1, True, dict(dilations=[6], strides=[3], pads=[0, 0])),
    # Floor mode drops the last 3 samples; with k = 2 dividing the stride the input is cropped first.
    ("1d-stride4-crop", [1, 2, 26], [2, 2, 2], 1, True, dict(dilations=[2], strides=[4], pads=[0, 0])),
    ("2d-stride-both", [1, 2, 21, 26], [2, 1, 3, 3], 2, True,
     dict(dilations=[4, 8], strides=[2, 2], pads=[4, 8, 4, 8])),
]


@pytest.mark.parametrize("max_dilation", MAX_DILATIONS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rewrite_matches_original(case, layout, max_dilation):
    _, in_shape, w_shape, group, bias, attrs = case
    original = conv_model(in_shape, w_shape, group=group, bias=bias, **attrs)
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=max_dilation, s2b_layout=layout)

    needs_rewrite = max(attrs["dilations"]) > max_dilation
    assert not [r for r in result.rejections if r.blocking]
    assert max_dilation_of(fixed) <= max_dilation
    assert bool(result.changes) == needs_rewrite
    assert_equivalent(original, fixed)
    assert_bit_exact(original, fixed)
    if not needs_rewrite:
        assert ops(fixed) == ["Conv"] and fixed.graph.node[0] == original.graph.node[0]
        return
    (change,) = result.changes
    assert change.node == "conv"
    assert change.old == {"dilations": attrs["dilations"]}
    assert all(d <= max_dilation for d in change.new["dilations"])
    for axis_name, k in change.detail["k"].items():
        axis = int(axis_name[4:]) - 2
        assert k == block_size(attrs["dilations"][axis], max_dilation=max_dilation,
                               stride=attrs.get("strides", [1] * 2)[axis])
    assert change.detail["nodes_added"] == len(fixed.graph.node) - 1
    used = change.detail["layout"]
    if used != "direct":  # "direct": every split axis was a plain subsampling (k divides the stride)
        # auto: the cheapest layout; a 2-D conv's weights tile in the channel layout, not in the batch one
        expected = layout if layout != "auto" else "spatial" if case[0].startswith(("1d", "1x", "k_x")) \
            else "batch"
        if layout == "spatial" and case[0].startswith("2d"):
            expected = "channel"  # a genuinely 2-D conv cannot take the transpose-free layout
            assert result.warnings and "spatial layout needs a 1-D conv" in result.warnings[0]
        assert used == expected
    assert_graph_quality(original, fixed, used, in_rank=len(in_shape))
    if layout == "spatial" and not case[0].startswith("2d"):
        assert "Transpose" not in ops(fixed)
    _check_layout_shape(fixed, used, in_shape, group, change)
    _check_macs(original, fixed, result)

    again, second = apply_pass(fixed, DilatedConvPass(), max_dilation=max_dilation, s2b_layout=layout)
    assert not second.changes and not second.rejections
    assert again.graph.node == fixed.graph.node


def _check_layout_shape(fixed, layout, in_shape, group, change):
    (conv,) = conv_nodes(fixed)
    index = GraphIndex(fixed)
    x_shape = index.static_shape(conv.input[0])
    phases = math.prod(change.detail["k"].values())
    if layout == "spatial":
        assert len(x_shape) == 4 and x_shape[0] == in_shape[0] and x_shape[1] == in_shape[1]
        assert get_attr(conv, "group") == group
        assert index.static_shape(conv.input[1])[2:] == (index.static_shape(conv.input[1])[2], 1)
    elif layout == "channel":
        strides = change.detail.get("strides", {})
        kept = math.prod(k // math.gcd(k, strides.get(a, [1])[0]) for a, k in change.detail["k"].items())
        assert x_shape[0] == in_shape[0] and x_shape[1] == in_shape[1] * kept
        assert get_attr(conv, "group") == group * kept
        assert change.detail.get("weight_tiling", 1) == kept
    elif layout == "batch":
        assert x_shape[1] == in_shape[1] and x_shape[0] % in_shape[0] == 0
        assert x_shape[0] <= in_shape[0] * phases
        assert get_attr(conv, "group") == group


def _check_macs(original, fixed, result):
    work = onnx.ModelProto()
    work.CopyFrom(original)
    infer_shapes(work)
    before, after = conv_macs(work), conv_macs(fixed)
    assert result.metrics["conv_macs_before"] == before
    assert result.metrics["conv_macs_after"] == after
    # The phase conv computes ceil(O/T) outputs per phase: fewer than T extra output positions per axis.
    assert before <= after
    (change,) = result.changes
    assert change.detail["macs"] == [before, after]


def test_macs_unchanged_when_phases_divide_output():
    # L = 48, k = 8 (max 2 of D=16) and O = L with "same" pads: the phase outputs tile O exactly.
    original = conv_model([1, 4, 48], [4, 1, 3], group=4, dilations=[16], pads=[16, 16])
    for layout in ("spatial", "channel", "batch"):
        fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=2, s2b_layout=layout)
        assert result.metrics["conv_macs_before"] == result.metrics["conv_macs_after"] == conv_macs(fixed)
        assert_bit_exact(original, fixed)


def test_spatial_structure_is_transpose_free_rank4():
    original = conv_model([1, 4, 64], [4, 1, 3], group=4, dilations=[32], pads=[32, 32])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=4, s2b_layout="spatial")
    # 64 is a multiple of k = 8 and so are the conv's own pads (32): those become 4 zero rows of every phase,
    # which the new conv pads itself. No Pad, no crop.
    assert ops(fixed) == ["Reshape", "Conv", "Reshape"]
    conv = conv_nodes(fixed)[0]
    shapes = tensor_shapes(fixed)
    assert shapes[conv.input[0]] == (1, 4, 8, 8)  # [B, C, 64/8, 8]
    assert get_attr(conv, "kernel_shape") == [3, 1]
    assert get_attr(conv, "dilations") == [4, 1]
    assert get_attr(conv, "pads") == [4, 0, 4, 0]
    assert numpy_helper.to_array(
        {t.name: t for t in fixed.graph.initializer}[conv.input[1]]).shape == (4, 1, 3, 1)
    assert result.changes[0].detail["k"] == {"axis2": 8}
    assert_bit_exact(original, fixed)


def test_channel_layout_tiles_weights_and_reports_growth():
    original = conv_model([1, 4, 32], [4, 1, 3], group=4, dilations=[8], pads=[8, 8])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=2, s2b_layout="channel")
    conv = conv_nodes(fixed)[0]
    assert get_attr(conv, "group") == 16
    inits = {t.name: numpy_helper.to_array(t) for t in fixed.graph.initializer}
    w0 = numpy_helper.to_array(original.graph.initializer[0])
    np.testing.assert_array_equal(inits[conv.input[1]], np.tile(w0, (4, 1, 1)))
    assert result.changes[0].detail["weight_bytes_added"] == 3 * (w0.nbytes + 4 * 4)  # weights + bias
    assert result.metrics["weight_bytes_added"] == 3 * (w0.nbytes + 4 * 4)


def test_shared_weight_is_not_corrupted():
    # Two dilated convs and one plain conv read one weight; the channel layout tiles it for the first two.
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.integers(-3, 4, (4, 1, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], name="c1", group=4, dilations=[8], pads=[8, 8]),
        helper.make_node("Conv", ["a", "w"], ["b"], name="c2", group=4, dilations=[4], pads=[4, 4]),
        helper.make_node("Conv", ["b", "w"], ["y"], name="c3", group=4, pads=[1, 1]),
    ]
    original = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 24])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=2, s2b_layout="channel")
    assert [c.node for c in result.changes] == ["c1", "c2"]
    assert conv_nodes(fixed)[-1].input[1] == "w"
    inits = {t.name: t for t in fixed.graph.initializer}
    assert inits["w"] == w
    assert_bit_exact(original, fixed)


# --- auto_pad --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("two_d", [False, True])
def test_auto_pad_becomes_explicit(auto_pad, layout, two_d):
    # onnxruntime refuses SAME_* with a dilation ("Dilation not supported for AutoPadType::SAME_UPPER"), so
    # the reference is the same conv with the explicit pads the ONNX spec prescribes.
    in_shape, w_shape, dil, stride = ([1, 3, 17, 21], [3, 1, 3, 2], [6, 8], [1, 2]) if two_d else \
        ([1, 3, 29], [3, 1, 3], [8], [1])
    original = conv_model(in_shape, w_shape, group=3, dilations=dil, strides=stride, auto_pad=auto_pad)
    pairs = [explicit_same_pads(length, k, s, d, auto_pad == "SAME_UPPER") if auto_pad != "VALID" else (0, 0)
             for length, k, s, d in zip(in_shape[2:], w_shape[2:], stride, dil)]
    reference = conv_model(in_shape, w_shape, group=3, dilations=dil, strides=stride,
                           pads=[p[0] for p in pairs] + [p[1] for p in pairs])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=2, s2b_layout=layout)
    assert result.changes and max_dilation_of(fixed) <= 2
    assert all(get_attr(n, "auto_pad") is None for n in conv_nodes(fixed))
    assert_equivalent(reference, fixed)
    assert_bit_exact(reference, fixed)


# --- causal Conv1DBlock and a TCN stack ------------------------------------------------------------------


def tcn_model(*, length=256, channels=4, causal=False, dilations=(1, 2, 4, 8, 16, 32, 64, 128), batch=1,
              seed=0):
    """A ConvTasNet-like TCN: per block 1x1 conv -> PRelu -> depthwise dilated conv (K=3) [-> causal Slice]
    -> PRelu -> 1x1 conv, with a residual Add. Causal blocks pad (K-1)*D on both sides and then chop the
    tail with a Slice, as Asteroid's Conv1DBlock does."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    cur = "x"
    for i, d in enumerate(dilations):
        h = f"b{i}"
        w_in = const(f"{h}_w_in", rng.integers(-2, 3, (channels, channels, 1)))
        b_in = const(f"{h}_b_in", rng.integers(-2, 3, channels))
        nodes.append(helper.make_node("Conv", [cur, w_in, b_in], [f"{h}_in"], name=f"{h}_in_conv"))
        nodes.append(helper.make_node("PRelu", [f"{h}_in", const(f"{h}_a1", np.full((channels, 1), 0.25))],
                                      [f"{h}_act1"], name=f"{h}_prelu1"))
        pad = 2 * d if causal else d
        nodes.append(helper.make_node(
            "Conv", [f"{h}_act1", const(f"{h}_w_dw", rng.integers(-2, 3, (channels, 1, 3))),
                     const(f"{h}_b_dw", rng.integers(-2, 3, channels))],
            [f"{h}_dw"], name=f"{h}_dw_conv", group=channels, dilations=[d], pads=[pad, pad]))
        dw = f"{h}_dw"
        if causal:
            inits.append(numpy_helper.from_array(np.array([-pad], np.int64), f"{h}_chop_end"))
            inits.append(numpy_helper.from_array(np.array([0], np.int64), f"{h}_chop_start"))
            inits.append(numpy_helper.from_array(np.array([2], np.int64), f"{h}_chop_axis"))
            nodes.append(helper.make_node("Slice", [dw, f"{h}_chop_start", f"{h}_chop_end", f"{h}_chop_axis"],
                                          [f"{h}_chop"], name=f"{h}_chop"))
            dw = f"{h}_chop"
        nodes.append(helper.make_node("PRelu", [dw, const(f"{h}_a2", np.full((channels, 1), 0.25))],
                                      [f"{h}_act2"], name=f"{h}_prelu2"))
        w_out = const(f"{h}_w_out", rng.integers(-2, 3, (channels, channels, 1)))
        nodes.append(helper.make_node("Conv", [f"{h}_act2", w_out], [f"{h}_out"], name=f"{h}_out_conv"))
        out = "y" if i == len(dilations) - 1 else f"{h}_res"
        nodes.append(helper.make_node("Add", [cur, f"{h}_out"], [out], name=f"{h}_add"))
        cur = out
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, length])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, channels, length])], inits)


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("max_dilation", MAX_DILATIONS)
def test_tcn_stack(max_dilation, layout, causal):
    original = tcn_model(causal=causal)
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=max_dilation, s2b_layout=layout)
    over = {n.name for n in original.graph.node if max(get_attr(n, "dilations") or [1]) > max_dilation}
    assert over and {c.node for c in result.changes} == over
    assert not result.rejections
    assert max_dilation_of(fixed) <= max_dilation
    # Nothing else touched: every node that was not rewritten is still there, unchanged.
    fixed_nodes = {n.name: n for n in fixed.graph.node}
    for node in original.graph.node:
        if node.name not in over:
            assert fixed_nodes[node.name] == node
    assert_graph_quality(original, fixed, "spatial" if layout == "auto" else layout, in_rank=3)
    if layout in ("auto", "spatial"):
        # Pads (K-1)*D/2 or (K-1)*D and L = 256 are whole rows of k: the new conv pads them, so each rewrite
        # is just Reshape -> Conv -> Reshape.
        assert ops(fixed).count("Reshape") == 2 * len(over)
        assert len(ops(fixed)) == len(ops(original)) + 2 * len(over)
    # Length 256 is a multiple of every k, and so is every output length: MACs exactly unchanged.
    assert result.metrics["conv_macs_before"] == result.metrics["conv_macs_after"] == conv_macs(fixed)
    assert_equivalent(original, fixed)
    assert_bit_exact(original, fixed)


def test_causal_chop_slice_still_reads_the_conv_output():
    original = tcn_model(causal=True, dilations=(16,), length=40)
    fixed, _ = apply_pass(original, DilatedConvPass(), max_dilation=4, s2b_layout="spatial")
    chop = next(n for n in fixed.graph.node if n.name == "b0_chop")
    assert chop.input[0] == "b0_dw"  # the rewritten chain ends in the conv's original output name
    assert "b0_dw" not in {o for n in fixed.graph.node if n.op_type == "Conv" for o in n.output}
    assert tensor_shapes(fixed)["b0_dw"] == (1, 4, 40 + 2 * 16 * 2 - 2 * 16)
    assert_bit_exact(original, fixed)


# --- QDQ -----------------------------------------------------------------------------------------------


def qdq_model(in_shape=(1, 4, 30), dilation=8, channels_out=4, group=4, bias_dq=False):
    """x -> Q -> DQ -> Conv(DQ(int8 weights, per-channel power-of-two scales), bias) -> Q -> DQ -> y.
    Power-of-two scales keep every product and sum exact, so the requantized outputs must be identical."""
    rng = np.random.default_rng(5)
    c_in = in_shape[1]
    w_q = rng.integers(-6, 7, (channels_out, c_in // group, 3)).astype(np.int8)
    w_scale = (2.0 ** -rng.integers(0, 3, channels_out)).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.array(0.125, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "x_zp"),
        numpy_helper.from_array(w_q, "w_q"),
        numpy_helper.from_array(w_scale, "w_scale"),
        numpy_helper.from_array(np.zeros(channels_out, np.int8), "w_zp"),
        numpy_helper.from_array(np.array(0.25, np.float32), "y_scale"),
        numpy_helper.from_array(np.array(100, np.uint8), "y_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q_x"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], name="dq_w", axis=0),
    ]
    if bias_dq:  # int32 bias with scale x_scale * w_scale, as quantizers emit it
        inits += [numpy_helper.from_array(rng.integers(-40, 40, channels_out).astype(np.int32), "b_q"),
                  numpy_helper.from_array((0.125 * w_scale).astype(np.float32), "b_scale")]
        nodes.append(helper.make_node("DequantizeLinear", ["b_q", "b_scale"], ["b"], name="dq_b", axis=0))
    else:
        inits.append(numpy_helper.from_array(rng.integers(-3, 4, channels_out).astype(np.float32), "b"))
    nodes += [
        helper.make_node("Conv", ["xd", "w", "b"], ["yc"], name="conv", group=group, dilations=[dilation],
                         pads=[dilation, dilation]),
        helper.make_node("QuantizeLinear", ["yc", "y_scale", "y_zp"], ["yq"], name="q_y"),
        helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["y"], name="dq_y"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def assert_no_integer_op(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Canonical QDQ: no op but QuantizeLinear / DequantizeLinear reads or writes an integer activation, and every
    float op's data input comes from a DequantizeLinear and its output goes to QuantizeLinear readers only."""
    index = GraphIndex(model)
    integer = {TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        names = [n for n in (*node.input, *node.output) if n and not index.is_const(n)]
        assert not [n for n in names if index.elem_type(n) in integer], f"{node.name} ({node.op_type})"
    before = {p.split(" ")[0] for p in walk_non_qdq(original)}
    assert [p for p in walk_non_qdq(model) if p.split(" ")[0] not in before] == []


@pytest.mark.parametrize("remainder_pad", ["pad", "pad4d", "concat"])
@pytest.mark.parametrize("bias_dq", [False, True], ids=["float-bias", "int32-bias"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_qdq_pattern_survives(layout, bias_dq, remainder_pad):
    original = qdq_model(bias_dq=bias_dq)
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=2, s2b_layout=layout,
                               remainder_pad=remainder_pad)
    assert max_dilation_of(fixed) <= 2
    (conv,) = conv_nodes(fixed)
    index = GraphIndex(fixed)
    # DQ -> Conv -> Q stays adjacent (what quantized compilers fuse); the weight still comes through a DQ.
    assert index.producer[conv.input[0]].op_type == "DequantizeLinear"
    assert index.producer[conv.input[1]].op_type == "DequantizeLinear"
    assert [n.op_type for n in index.consumers_of(conv.output[0])] == ["QuantizeLinear"]
    # The Pad (or Concat with constant blocks) is a canonical QDQ unit: DQ -> op (float zeros) -> Q, as every
    # other inserted op; none reads or writes the uint8 tensor (Qualcomm HTP rejects a Concat on one).
    if remainder_pad == "concat":
        pad = next(n for n in fixed.graph.node if n.op_type == "Concat")
        assert "Pad" not in ops(fixed)
        blocks = [index.const_value(i) for i in pad.input if index.const_value(i) is not None]
        assert blocks and all(b.dtype == np.float32 and (b == 0).all() for b in blocks)
    else:
        pad = next(n for n in fixed.graph.node if n.op_type == "Pad")
        assert len(pad.input) == 2  # zero padding: Q(0) is the zero point 128
        assert len(index.static_shape(pad.input[0])) == (3 if remainder_pad == "pad" else 4)
    data = pad.input[1] if remainder_pad == "concat" and index.const_value(pad.input[0]) is not None else pad.input[0]
    assert index.producer[data].op_type == "DequantizeLinear"
    assert [n.op_type for n in index.consumers_of(pad.output[0])] == ["QuantizeLinear"]
    assert_no_integer_op(fixed, original)
    assert result.changes[0].detail["qdq"] == {"input_moved_before_dq": True, "output_moved_after_q": True}
    if result.changes[0].detail["layout"] == "channel":
        # Per-channel scales tiled with the weights (k = 4); the bias' DQ too.
        assert index.const_value(index.producer[conv.input[1]].input[1]).shape == (4 * 4,)
        if bias_dq:
            assert index.producer[conv.input[2]].op_type == "DequantizeLinear"
            assert index.const_value(index.producer[conv.input[2]].input[0]).shape == (4 * 4,)
    assert_bit_exact(original, fixed)
    assert_equivalent(original, fixed)


@pytest.mark.parametrize("layout", ["spatial", "channel"])
def test_shared_weight_dq_gets_private_copies(layout):
    # Two convs read one weight DQ, and the activation DQ also feeds a graph output: both originals stay.
    base = qdq_model()
    nodes = list(base.graph.node)
    conv = next(n for n in nodes if n.op_type == "Conv")
    conv2 = helper.make_node("Conv", ["xd", "w"], ["y2"], name="conv2", group=4, dilations=[4], pads=[4, 4])
    nodes.insert(nodes.index(conv) + 1, conv2)
    outputs = [*base.graph.output, helper.make_tensor_value_info("y2", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("xd", TensorProto.FLOAT, None)]
    original = _model(nodes, list(base.graph.input), outputs, list(base.graph.initializer))
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=2, s2b_layout=layout)
    assert {c.node for c in result.changes} == {"conv", "conv2"}
    names = {n.name for n in fixed.graph.node}
    assert {"dq_w", "dq_x"} <= names
    inits = {t.name: t for t in fixed.graph.initializer}
    assert inits["w_q"] == next(t for t in original.graph.initializer if t.name == "w_q")
    assert_bit_exact(original, fixed)


def test_dynamic_weights_in_spatial_layout_get_a_reshape():
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", dilations=[8], pads=[8, 8])
    original = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 24]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 2, 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=2)
    assert result.changes[0].detail["layout"] == "spatial"
    conv = conv_nodes(fixed)[0]
    assert GraphIndex(fixed).producer[conv.input[1]].op_type == "Reshape"
    assert_equivalent(original, fixed)
    assert_bit_exact(original, fixed)


# --- what is left alone ----------------------------------------------------------------------------------


def test_nothing_without_a_limit():
    original = conv_model([1, 2, 30], [2, 1, 3], group=2, dilations=[16], pads=[16, 16])
    fixed, result = apply_pass(original, DilatedConvPass())
    assert not result.changes and not result.rejections and fixed.graph.node == original.graph.node


def test_dynamic_length_is_rejected_naming_input_shape():
    original = conv_model([1, 2, "L"], [2, 1, 3], group=2, dilations=[8], pads=[8, 8])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=4)
    (rej,) = result.rejections
    assert rej.blocking and rej.node == "conv" and "--input-shape" in rej.reason
    assert not result.changes and ops(fixed) == ["Conv"]


def test_stride_without_exact_split_is_rejected():
    # D = 6, stride 4, max 2: k would be 3 or 6, neither divides nor is a multiple of 4.
    original = conv_model([1, 2, 40], [2, 1, 3], group=2, dilations=[6], strides=[4], pads=[6, 6])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=2)
    (rej,) = result.rejections
    assert rej.blocking and "stride 4" in rej.reason
    assert not result.changes and fixed.graph.node == original.graph.node


def test_conv_transpose_over_limit_is_reported():
    w = numpy_helper.from_array(np.ones((2, 1, 3), np.float32), "w")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv", group=2, dilations=[8])
    original = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 10])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    _, result = apply_pass(original, DilatedConvPass(), max_dilation=4)
    (rej,) = result.rejections
    assert rej.blocking and rej.op == "ConvTranspose"


def test_forbidden_transpose_blocks_2d_but_not_1d():
    two_d = conv_model([1, 2, 12, 12], [2, 1, 3, 3], group=2, dilations=[4, 4], pads=[4, 4, 4, 4])
    _, result = apply_pass(two_d, DilatedConvPass(), max_dilation=2, forbidden_ops=("Transpose",))
    (rej,) = result.rejections
    assert rej.blocking and "Transpose" in rej.reason and not result.changes
    one_d = conv_model([1, 2, 12], [2, 1, 3], group=2, dilations=[4], pads=[4, 4])
    fixed, result = apply_pass(one_d, DilatedConvPass(), max_dilation=2, forbidden_ops=("Transpose",))
    assert result.changes and "Transpose" not in ops(fixed)
    assert_bit_exact(one_d, fixed)


def test_dynamic_weights_use_batch_layout_or_are_rejected():
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", dilations=[1, 8], pads=[0, 8, 0, 8])
    original = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 20]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 2, 2, 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=2)
    assert result.changes[0].detail["layout"] == "batch"  # channel would have to tile non-constant weights
    assert_equivalent(original, fixed)
    _, result = apply_pass(original, DilatedConvPass(), max_dilation=2, batch_one=True)
    (rej,) = result.rejections
    assert rej.blocking and "not constant" in rej.reason


def test_allowed_dilations_without_max():
    original = conv_model([1, 2, 36], [2, 1, 3], group=2, dilations=[6], pads=[6, 6])
    fixed, result = apply_pass(original, DilatedConvPass(), allowed_dilations=(1, 2, 4, 8))
    assert get_attr(conv_nodes(fixed)[0], "dilations") == [2, 1]  # k = 3 (6/2 = 3 is not allowed)
    assert result.changes[0].detail["k"] == {"axis2": 3}
    assert_bit_exact(original, fixed)


def test_kernel_one_axis_only_resets_dilation():
    original = conv_model([1, 2, 6, 20], [2, 2, 1, 3], dilations=[8, 2], pads=[0, 2, 0, 2])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=4)
    assert ops(fixed) == ["Conv"] and get_attr(fixed.graph.node[0], "dilations") == [1, 2]
    assert result.changes[0].new == {"dilations": [1, 2]}
    assert_bit_exact(original, fixed)


def test_old_opset_is_rejected():
    original = conv_model([1, 2, 20], [2, 1, 3], group=2, dilations=[8], pads=[8, 8], opset=10)
    _, result = apply_pass(original, DilatedConvPass(), max_dilation=4)
    (rej,) = result.rejections
    assert rej.blocking and "opset 10" in rej.reason


def test_chained_qdq_convs():
    # conv -> Q -> DQ -> conv2 -> Q -> DQ: the first conv's moved Q output feeds the second conv's moved DQ.
    base = qdq_model()
    nodes = list(base.graph.node)
    nodes[-1] = helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["yd"], name="dq_y")
    nodes += [
        helper.make_node("Conv", ["yd", "w"], ["zc"], name="conv2", group=4, dilations=[16], pads=[16, 16]),
        helper.make_node("QuantizeLinear", ["zc", "y_scale", "y_zp"], ["zq"], name="q_z"),
        helper.make_node("DequantizeLinear", ["zq", "y_scale", "y_zp"], ["y"], name="dq_z"),
    ]
    original = _model(nodes, list(base.graph.input), list(base.graph.output), list(base.graph.initializer))
    for layout in ("spatial", "channel"):
        fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=2, s2b_layout=layout)
        assert [c.node for c in result.changes] == ["conv", "conv2"]
        index = GraphIndex(fixed)
        for conv in conv_nodes(fixed):
            assert index.producer[conv.input[0]].op_type == "DequantizeLinear"
            assert [n.op_type for n in index.consumers_of(conv.output[0])] == ["QuantizeLinear"]
        assert_bit_exact(original, fixed)


@pytest.mark.parametrize("layout", ["channel", "batch"])
def test_3d_conv_dilated_on_three_axes(layout):
    original = conv_model([2, 2, 9, 10, 11], [4, 1, 3, 2, 3], group=2, dilations=[2, 4, 3],
                          pads=[1, 2, 3, 3, 2, 1])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=1, s2b_layout=layout)
    assert result.changes[0].detail["k"] == {"axis2": 2, "axis3": 4, "axis4": 3}
    assert max_dilation_of(fixed) == 1
    assert_equivalent(original, fixed)
    assert_bit_exact(original, fixed)


# --- dead taps: taps that only ever read zero padding are dropped (exact, fewer MACs) ----------------------


def single_conv(in_shape, w_shape, *, dilations, pads, group=1, seed=3):
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.integers(-3, 4, w_shape).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.integers(-3, 4, w_shape[0]).astype(np.float32), "b")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", dilations=list(dilations),
                            pads=list(pads), group=group)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def inferred_macs(model):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    infer_shapes(copy)
    return conv_macs(copy)


def test_aspp_conv_on_a_small_map_becomes_its_centre_tap():
    # DeepLab's ASPP: a dense 3x3 conv with dilation 12 on an 8x8 map reads only padding off the centre.
    original = single_conv((1, 6, 8, 8), (5, 6, 3, 3), dilations=(12, 12), pads=(12, 12, 12, 12))
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=4)
    assert ops(fixed) == ["Conv"]
    conv = fixed.graph.node[0]
    assert get_attr(conv, "kernel_shape") == [1, 1] and get_attr(conv, "dilations") == [1, 1]
    assert get_attr(conv, "pads") == [0, 0, 0, 0]
    assert [c.action for c in result.changes] == ["trim dead taps"]
    assert conv_macs(fixed) * 9 == inferred_macs(original) == result.changes[0].detail["macs"][0]
    assert_bit_exact(original, fixed)


def test_partly_dead_kernel_is_trimmed_then_split():
    # K=5, D=6 on length 10 with pads 12: taps 0 and 4 never reach the data; taps 1..3 keep dilation 6 > 4.
    original = single_conv((1, 4, 10), (4, 1, 5), dilations=(6,), pads=(12, 12), group=4)
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=4)
    assert [c.action for c in result.changes] == ["trim dead taps", "space-to-batch"]
    assert result.changes[0].new == {"kernel_shape": [3], "dilations": [6], "pads": [6, 6]}
    assert max_dilation_of(fixed) <= 4
    assert_bit_exact(original, fixed)


def test_live_taps_are_kept():
    # Length 40 > the dilated kernel: every tap reaches data, nothing is trimmed.
    original = single_conv((1, 4, 40), (4, 1, 3), dilations=(16,), pads=(16, 16), group=4)
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=4)
    assert [c.action for c in result.changes] == ["space-to-batch"]
    assert conv_macs(fixed) == inferred_macs(original)
    assert_bit_exact(original, fixed)


def test_a_non_finite_weight_in_a_dead_tap_is_not_trimmed():
    # 0 * NaN is NaN: the "dead" tap 0 (it only reads padding) still makes the original's channel 1 NaN, so
    # dropping it would change the outputs. The conv is split by space-to-batch instead, and validated.
    original = single_conv((1, 4, 10), (4, 1, 5), dilations=(6,), pads=(12, 12), group=4)
    weight = numpy_helper.to_array(original.graph.initializer[0]).copy()
    weight[1, 0, 0] = np.nan
    original.graph.initializer[0].CopyFrom(numpy_helper.from_array(weight, "w"))
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=4)
    assert [c.action for c in result.changes] == ["space-to-batch"]
    (rejection,) = result.rejections
    assert "NaN or infinity" in rejection.reason and not rejection.blocking
    options = FixOptions(max_dilation=4)
    model = onnx.ModelProto()
    model.CopyFrom(original)
    prepare(model, options)
    run = run_passes(model, options, [DilatedConvPass()])
    assert run.ok and run.report.passes[0].status == "validated", run.report.to_json()


# --- emission forms: remainder padding, 1-D -> 4-D lift, do no harm ------------------------------

REMAINDER_FORMS = ("concat", "pad4d", "pad")


def _pads_and_concats(model):
    index = GraphIndex(model)
    pads = [len(index.static_shape(n.input[0])) for n in model.graph.node if n.op_type == "Pad"]
    concats = [n for n in model.graph.node if n.op_type == "Concat"]
    return pads, concats


@pytest.mark.parametrize("remainder_pad", REMAINDER_FORMS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_remainder_pad_forms_are_exact(case, layout, remainder_pad):
    # max_dilation 1: every case needs a rewrite, most with remainders (lengths not multiples of k).
    _, in_shape, w_shape, group, bias, attrs = case
    original = conv_model(in_shape, w_shape, group=group, bias=bias, **attrs)
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=1, s2b_layout=layout,
                               remainder_pad=remainder_pad)
    assert result.changes and not [r for r in result.rejections if r.blocking]
    assert_bit_exact(original, fixed)
    assert_equivalent(original, fixed)
    pad_ranks, concats = _pads_and_concats(fixed)
    if remainder_pad == "concat":
        assert not pad_ranks  # zeros are constants concatenated along the padded axes
        index = GraphIndex(fixed)
        for node in concats:
            blocks = [index.const_value(i) for i in node.input if index.const_value(i) is not None]
            assert blocks and all((b == 0).all() for b in blocks)
    elif remainder_pad == "pad4d":
        assert not concats and all(rank >= 4 for rank in pad_ranks)
    else:
        assert not concats and all(rank == len(in_shape) for rank in pad_ranks)
    again, second = apply_pass(fixed, DilatedConvPass(), max_dilation=1, s2b_layout=layout,
                               remainder_pad=remainder_pad)
    assert not second.changes and again.graph.node == fixed.graph.node


def test_rank3_pad_needs_a_remainder():
    # The remainder path really is exercised: with the plain form, length 37 and dilation 8 leave a rank-3 Pad.
    original = conv_model([1, 4, 37], [4, 1, 3], group=4, dilations=[8], pads=[8, 8])
    fixed, _ = apply_pass(original, DilatedConvPass(), max_dilation=2, remainder_pad="pad")
    assert _pads_and_concats(fixed)[0] == [3]
    fixed, _ = apply_pass(original, DilatedConvPass(), max_dilation=2)  # the default form
    assert _pads_and_concats(fixed)[0] == [] and "Concat" in ops(fixed)


@pytest.mark.parametrize("remainder_pad", REMAINDER_FORMS)
@pytest.mark.parametrize("max_dilation", [None, 2, 15])
@pytest.mark.parametrize("case", [c for c in CASES if c[0].startswith("1d")], ids=lambda c: c[0])
def test_lift_conv1d(case, max_dilation, remainder_pad):
    _, in_shape, w_shape, group, bias, attrs = case
    original = conv_model(in_shape, w_shape, group=group, bias=bias, **attrs)
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=max_dilation, lift_conv1d=True,
                               remainder_pad=remainder_pad)
    assert not [r for r in result.rejections if r.blocking]
    assert result.changes[0].action == "lift 1-D conv to 4-D"
    assert_bit_exact(original, fixed)
    assert_equivalent(original, fixed)
    index = GraphIndex(fixed)
    for conv in conv_nodes(fixed):
        assert len(index.static_shape(conv.input[0])) == 4 and len(get_attr(conv, "kernel_shape")) == 2
    pad_ranks, _ = _pads_and_concats(fixed)
    assert all(rank == 4 for rank in pad_ranks)  # after the lift, even the plain Pad is 4-D
    # No Reshape feeds another one: the lift's view and the phase split's are merged.
    for node in fixed.graph.node:
        if node.op_type == "Reshape":
            producer = index.producer.get(node.input[0])
            assert producer is None or producer.op_type != "Reshape"
    again, second = apply_pass(fixed, DilatedConvPass(), max_dilation=max_dilation, lift_conv1d=True,
                               remainder_pad=remainder_pad)
    assert not second.changes and again.graph.node == fixed.graph.node


def test_lift_keeps_a_qdq_conv_fusable():
    original = qdq_model()
    fixed, result = apply_pass(original, DilatedConvPass(), lift_conv1d=True)
    (conv,) = conv_nodes(fixed)
    index = GraphIndex(fixed)
    assert index.producer[conv.input[0]].op_type == "DequantizeLinear"
    assert [n.op_type for n in index.consumers_of(conv.output[0])] == ["QuantizeLinear"]
    assert len(index.static_shape(conv.input[0])) == 4
    assert_bit_exact(original, fixed)


def aspp_like():
    """A genuinely 2-D conv with dilation 36: only the channel / batch layouts (Transpose) can split it."""
    return conv_model([1, 4, 40, 40], [4, 4, 3, 3], dilations=[36, 36], pads=[36, 36, 36, 36])


def test_do_no_harm_leaves_a_conv_whose_only_layouts_run_on_the_cpu():
    original = aspp_like()
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=31, s2b_layouts=("spatial",))
    assert not [c for c in result.changes if c.action == "space-to-batch"]
    (rejection,) = result.rejections
    assert rejection.node == "conv" and rejection.reason.startswith("do no harm")
    assert "channel, batch" in rejection.reason and "--force-rewrite" in rejection.reason
    assert max_dilation_of(fixed) == 36
    # --force-rewrite: rewritten anyway, with a warning that names the CPU.
    forced, forced_result = apply_pass(original, DilatedConvPass(), max_dilation=31, s2b_layouts=("spatial",),
                                       force_rewrite=True)
    assert max_dilation_of(forced) <= 31 and any("CPU" in w for w in forced_result.warnings)
    assert_bit_exact(original, forced)
    # A layout the target does run is still chosen for the same conv.
    ok, ok_result = apply_pass(original, DilatedConvPass(), max_dilation=31, s2b_layouts=("batch",))
    assert ok_result.changes[-1].detail["layout"] == "batch" and not ok_result.rejections
    assert_bit_exact(original, ok)


def test_do_no_harm_keeps_the_spatial_layout_of_1d_convs():
    original = conv_model([1, 4, 150], [4, 1, 3], group=4, dilations=[64], pads=[64, 64])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=31, s2b_layouts=("spatial",))
    assert result.changes[-1].detail["layout"] == "spatial" and "Transpose" not in ops(fixed)
    assert_bit_exact(original, fixed)


def test_an_explicit_layout_is_used_with_a_warning():
    original = conv_model([1, 4, 150], [4, 1, 3], group=4, dilations=[64], pads=[64, 64])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=31, s2b_layouts=("spatial",),
                               s2b_layout="channel")
    assert result.changes[-1].detail["layout"] == "channel"
    assert any("runs its ops on the CPU" in w for w in result.warnings)
    assert_bit_exact(original, fixed)


@pytest.mark.parametrize(("name", "shape"), [("torch_convtasnet.onnx", (1, 8000)),
                                           ("torch_convtasnet_causal.onnx", (1, 8000)),
                                           ("torchaudio_convtasnet.onnx", (1, 1, 8000))])
def test_convtasnet_exports_take_the_bm1684x_forms(fixture_path, name, shape):
    """The torch exports at 999 frames (8000 samples): remainders, lifted convs, no rank-3 Pad before a Reshape."""
    from onnx_npu_fix.api import fix
    from onnx_npu_fix.config.options import FixOptions
    from onnx_npu_fix.config.targets import apply_target, load_target

    options = apply_target(load_target("bm1684x"), FixOptions(input_shapes={"mix": shape}), {})
    outcome = fix(onnx.load(fixture_path(name)), options)
    assert outcome.ok
    fixed = outcome.model
    index = GraphIndex(fixed)
    assert max_dilation_of(fixed) <= 15
    for conv in conv_nodes(fixed):
        assert len(index.static_shape(conv.input[0])) == 4
    for node in fixed.graph.node:
        if node.op_type == "Pad":
            assert all(c.op_type != "Reshape" for c in index.consumers_of(node.output[0])) or \
                len(index.static_shape(node.input[0])) == 4
    assert "Concat" in ops(fixed) or "Pad" in ops(fixed)  # 999 frames: the remainder path ran


# --- find only reads; rewrite applies exactly the plans it is given ----------------------------------------



def two_dilated_convs():
    """x -> conv_a (dilation 8) -> conv_b (dilation 16), both depthwise on [1,4,40]: two independent plans."""
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.integers(-3, 4, (4, 1, 3)).astype(np.float32), n) for n in ("wa", "wb")]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", group=4, dilations=[8], pads=[8, 8]),
             helper.make_node("Conv", ["a", "wb"], ["y"], name="conv_b", group=4, dilations=[16], pads=[16, 16])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 40])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


FIND_MODELS = {
    "two-convs": (two_dilated_convs, dict(max_dilation=4)),
    "lift-trim-split": (lambda: single_conv((1, 4, 10), (4, 1, 5), dilations=(6,), pads=(12, 12), group=4),
                        dict(max_dilation=4, lift_conv1d=True)),
    "qdq-lifted": (qdq_model, dict(max_dilation=2, lift_conv1d=True, remainder_pad="pad4d")),
    "aspp-trim": (lambda: single_conv((1, 6, 8, 8), (5, 6, 3, 3), dilations=(12, 12), pads=(12, 12, 12, 12)),
                  dict(max_dilation=4)),
    "refused": (aspp_like, dict(max_dilation=31, s2b_layouts=("spatial",))),
}


@pytest.mark.parametrize("name", FIND_MODELS)
def test_find_leaves_the_model_byte_identical(name):
    build, options = FIND_MODELS[name]
    model = prepared(build())
    before = model.SerializeToString()
    found = DilatedConvPass().find(model, FixOptions(**options))
    assert model.SerializeToString() == before
    assert found.plans or found.rejections
    assert not hasattr(found, "after") and not hasattr(found, "state")  # no scratch copy, no untyped state
    # rewrite(find()) is what run does: the same model and result as a run on another copy.
    again = prepared(build())
    expected = DilatedConvPass().run(again, FixOptions(**options))
    result = DilatedConvPass().rewrite(model, FixOptions(**options), found)
    assert model.SerializeToString() == again.SerializeToString()
    assert [c.to_json() for c in result.changes] == [c.to_json() for c in expected.changes]


def test_find_plans_lift_trim_and_split_in_order_on_the_conv_each_leaves():
    model = prepared(FIND_MODELS["lift-trim-split"][0]())
    found = DilatedConvPass().find(model, FixOptions(max_dilation=4, lift_conv1d=True))
    lift, trim, split = found.plans
    assert isinstance(lift, LiftPlan) and isinstance(trim, TrimPlan) and isinstance(split, SpaceToBatchPlan)
    assert [p.nodes for p in found.plans] == [("conv",)] * 3 and not found.rejections
    assert not lift.lifted and trim.lifted and split.lifted  # the trim and split were made on the 4-D conv
    assert trim.new == {"kernel_shape": [1, 3], "dilations": [1, 6], "pads": [0, 6, 0, 6]}
    assert trim.weight.shape == (4, 1, 1, 3)
    assert split.old_dilations == [1, 6] and split.new_dilations() == [1, 3] and split.layout == "spatial"


def test_rewrite_applies_only_the_plans_it_is_given():
    original = prepared(two_dilated_convs())
    options = FixOptions(max_dilation=4)
    found = DilatedConvPass().find(original, options)
    assert found.planned() == {"conv_a", "conv_b"}
    only_a = Found([p for p in found.plans if p.nodes == ("conv_a",)], found.rejections)
    fixed = onnx.ModelProto()
    fixed.CopyFrom(original)
    result = DilatedConvPass().rewrite(fixed, options, only_a)
    assert [c.node for c in result.changes] == ["conv_a"]
    convs = {n.name: n for n in conv_nodes(fixed)}
    assert get_attr(convs["conv_a"], "dilations") == [4, 1]  # spatial layout: [D/k, 1] with k = 2
    assert convs["conv_b"] == next(n for n in original.graph.node if n.name == "conv_b")  # untouched
    assert result.metrics["convs_rewritten"] == 1
    assert_bit_exact(original, fixed)


def test_rewrite_applies_a_trim_without_the_split_planned_after_it():
    original = prepared(single_conv((1, 4, 10), (4, 1, 5), dilations=(6,), pads=(12, 12), group=4))
    options = FixOptions(max_dilation=4)
    found = DilatedConvPass().find(original, options)
    assert [type(p) for p in found.plans] == [TrimPlan, SpaceToBatchPlan]
    fixed = onnx.ModelProto()
    fixed.CopyFrom(original)
    result = DilatedConvPass().rewrite(fixed, options, Found(found.plans[:1]))
    assert [c.action for c in result.changes] == ["trim dead taps"] and ops(fixed) == ["Conv"]
    assert get_attr(fixed.graph.node[0], "kernel_shape") == [3] and max_dilation_of(fixed) == 6
    assert_bit_exact(original, fixed)


def test_a_split_planned_on_a_lifted_conv_needs_its_lift():
    original = prepared(conv_model([1, 4, 40], [4, 1, 3], group=4, dilations=[8], pads=[8, 8]))
    options = FixOptions(max_dilation=4, lift_conv1d=True)
    found = DilatedConvPass().find(original, options)
    without_lift = Found([p for p in found.plans if not isinstance(p, LiftPlan)])
    with pytest.raises(ValueError, match="LiftPlan"):
        DilatedConvPass().rewrite(original, options, without_lift)


def test_a_trim_whose_split_is_refused_fixes_nothing():
    # Dead taps go (taps 0 and 4 only read padding) but the 3x3 remainder at dilation 6 needs a Transpose.
    original = prepared(single_conv((1, 4, 10, 10), (4, 1, 5, 5), dilations=(6, 6), pads=(12, 12, 12, 12),
                                     group=4))
    options = FixOptions(max_dilation=4, forbidden_ops=("Transpose",))
    found = DilatedConvPass().find(original, options)
    (trim,) = found.plans
    assert isinstance(trim, TrimPlan) and trim.nodes == () and "conv" not in found.planned()
    assert "Transpose" in found.reason("conv")
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=4, forbidden_ops=("Transpose",))
    assert [c.action for c in result.changes] == ["trim dead taps"] and max_dilation_of(fixed) == 6
    assert_bit_exact(original, fixed)


def test_auto_takes_the_cheapest_layout_and_the_pass_line_shows_the_growth():
    """A 2-D conv dilated 2x2 over the limit 1: the channel layout tiles its weights 4x, the batch layout none.
    auto (no layout asked for, batch > 1 allowed) takes batch; where batch 1 is required only channel is left,
    and its weight growth is printed on the pass line, not only in the JSON."""
    from onnx_npu_fix.pipeline.report import PassRecord, render_pass_line

    original = conv_model([1, 8, 16, 16], [8, 8, 3, 3], dilations=[2, 2], pads=[2, 2, 2, 2])
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=1)
    assert result.changes[0].detail["layout"] == "batch" and "weight_bytes_added" not in result.changes[0].detail
    assert_equivalent(original, fixed)
    line = render_pass_line(PassRecord("dilated-conv", exact=True, status="unchanged", changes=result.changes,
                                       metrics=result.metrics))
    assert "weights" not in line
    fixed, result = apply_pass(original, DilatedConvPass(), max_dilation=1, batch_one=True)
    assert result.changes[0].detail["layout"] == "channel"
    assert_equivalent(original, fixed)
    before = result.metrics["weight_bytes_before"]
    assert before == 8 * 8 * 9 * 4 + 8 * 4 and result.metrics["weight_bytes_added"] == 3 * before
    line = render_pass_line(PassRecord("dilated-conv", exact=True, status="unchanged", changes=result.changes,
                                       metrics=result.metrics))
    assert "1 space-to-batch, weights +300% (2.3 KiB -> 9.1 KiB)" in line, line


@pytest.mark.parametrize("per_channel", [False, True])
def test_dead_taps_of_a_qdq_conv_are_trimmed_behind_its_dequantize(tmp_path, per_channel):
    """DeepLabV3 quantized by onnxruntime: an ASPP conv with dilation 36 on an 8x8 map is trimmed to its centre
    tap on the integer side (weights still int8 behind their DequantizeLinear), as the float export is — not
    split by space-to-batch, nor left over the limit on rv1106."""
    pytest.importorskip("onnxruntime.quantization")
    from onnx_npu_fix.pipeline.inputs import make_inputs

    float_model = conv_model([1, 6, 8, 8], [5, 6, 3, 3], dilations=[36, 36], pads=[36, 36, 36, 36])
    quantized = quantize_with_onnxruntime(float_model, tmp_path, per_channel=per_channel)
    for options in (dict(max_dilation=31, s2b_layouts=("spatial",)), dict(max_dilation=15)):  # rv1106, bm1684x
        fixed, result = apply_pass(quantized, DilatedConvPass(), **options)
        assert [c.action for c in result.changes] == ["trim dead taps"], result.rejections
        assert ops(fixed) == ops(quantized) and max_dilation_of(fixed) == 1
        conv = next(n for n in fixed.graph.node if n.op_type == "Conv")
        dq = next(n for n in fixed.graph.node if conv.input[1] in n.output)
        weight = numpy_helper.to_array(next(t for t in fixed.graph.initializer if t.name == dq.input[0]))
        assert dq.op_type == "DequantizeLinear" and weight.dtype == np.int8 and weight.shape == (5, 6, 1, 1)
        feeds = make_inputs(quantized, 3, 0)
        for ref, got in zip(run_model(quantized, feeds), run_model(fixed, feeds)):
            for name in ref:
                np.testing.assert_array_equal(ref[name], got[name])  # the same quantized outputs
