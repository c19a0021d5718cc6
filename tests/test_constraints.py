"""Constraint checking (onnx_npu_fix/constraints/): each violation kind on a small inline model, none on a
clean one, the one-line text form, JSON, the shape listing, and that the caller's model is never modified."""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints import (
    CONSTRAINT,
    CONSTRAINT_TABLE,
    CONSTRAINTS,
    check_model,
    find_violations,
    render_check,
    render_shapes,
    render_violations,
    shape_listing,
    violations_summary,
)

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def _w(name, shape):
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


def _conv_chain(c_in=8, c_mid=8, c_out=8, hw=8, **conv2_attrs):
    """x [1,c_in,hw,hw] -> conv1 (c_in->c_mid, 3x3) -> relu -> conv2 (c_mid->c_out) -> y."""
    k = conv2_attrs.pop("kernel", 3)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", **conv2_attrs),
    ]
    return _model(nodes, [_vi("x", [1, c_in, hw, hw])], [_vi("y", None)],
                  [_w("w1", (c_mid, c_in, 3, 3)), _w("w2", (c_out, c_mid, k, k))])


STRICT = dict(max_dilation=4, align=8, concat_align=8, batch_one=True, max_rank=4, forbidden_ops=("Gather",),
              max_kernel=7, max_stride=2, sram_bytes=1 << 20, act_bytes=1)


def kinds(violations):
    return [(v.node, v.constraint) for v in violations]


def test_clean_model_has_no_violations():
    model = _conv_chain(pads=[2, 2, 2, 2], dilations=[2, 2])
    report = check_model(model, FixOptions(**STRICT))
    assert report.violations == [] and report.clean
    assert render_violations(report.violations) == "no violations"
    assert violations_summary(report.violations) == "no violations"
    assert report.memory is not None and report.memory.fits


def test_summary_is_the_last_line_of_the_rendered_violations():
    violations = check_model(_conv_chain(c_in=3, c_mid=12, dilations=[8, 8], pads=[8, 8, 8, 8]),
                             FixOptions(**STRICT)).violations
    lines = render_violations(violations).splitlines()
    assert lines[:-1] == [v.text() for v in violations]
    assert lines[-1] == violations_summary(violations)
    assert lines[-1].startswith(f"{len(violations)} violations: ") and "align-channels" in lines[-1]


def test_model_is_not_modified():
    model = _conv_chain(c_mid=12, pads=[8, 8, 8, 8], dilations=[8, 8])
    model.graph.node[1].name = ""  # unnamed nodes get names in the analysis copy only
    before = model.SerializeToString()
    violations = find_violations(model, FixOptions(**STRICT))
    assert violations
    assert model.SerializeToString() == before


# --- dilation -------------------------------------------------------------------------------------


def test_dilation_above_limit():
    model = _conv_chain(pads=[8, 8, 8, 8], dilations=[8, 8])
    violations = find_violations(model, FixOptions(max_dilation=4))
    assert kinds(violations) == [("conv2", "dilation")]
    v = violations[0]
    assert (v.value, v.limit, v.fixed_by) == ([8, 8], 4, "dilated-conv")
    assert v.text() == "conv2 (Conv): dilation: [8,8] vs max 4 -> fixed by dilated-conv"
    assert find_violations(model, FixOptions(max_dilation=8)) == []
    assert find_violations(model, FixOptions()) == []  # no limit given: nothing to check


def test_dilation_outside_allowed_set():
    model = _conv_chain(pads=[6, 6, 6, 6], dilations=[6, 6])
    violations = find_violations(model, FixOptions(allowed_dilations=(2, 4, 8)))
    assert kinds(violations) == [("conv2", "dilation-allowed")]
    assert violations[0].limit == [1, 2, 4, 8] and violations[0].fixed_by == "dilated-conv"
    ok = _conv_chain(pads=[4, 4, 4, 4], dilations=[4, 4])
    assert find_violations(ok, FixOptions(allowed_dilations=(2, 4, 8))) == []


def test_dilated_conv_transpose_is_not_claimed_fixable():
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv", dilations=[8, 8])]
    model = _model(nodes, [_vi("x", [1, 8, 8, 8])], [_vi("y", None)], [_w("w", (8, 8, 3, 3))])
    violations = find_violations(model, FixOptions(max_dilation=4))
    assert [(v.constraint, v.fixed_by) for v in violations] == [("dilation", None)]


# --- channels -------------------------------------------------------------------------------------


def test_unaligned_intermediate_channels_are_fixed_by_align_channels():
    model = _conv_chain(c_mid=12, pads=[1, 1, 1, 1])
    violations = find_violations(model, FixOptions(align=8))
    assert [(v.node, v.constraint, v.value, v.fixed_by) for v in violations] == [
        ("conv1", "out-channels-align", 12, "align-channels"),
        ("conv2", "in-channels-align", 12, "align-channels"),
    ]
    assert violations[0].text() == "conv1 (Conv): out-channels-align: 12 vs multiple of 8 -> fixed by align-channels"
    assert find_violations(model, FixOptions(align=4)) == []
    assert find_violations(model, FixOptions(align=0)) == []


def test_graph_input_channels_need_align_io_but_output_channels_do_not():
    # align-channels keeps channels a graph input fixes (also through channel-local ops such as this Relu)
    # unless align_io; an unaligned Conv output is padded and sliced back, graph output or not.
    nodes = [helper.make_node("Relu", ["x"], ["xr"], name="pre"),
             helper.make_node("Conv", ["xr", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    model = _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", None)], [_w("w1", (8, 3, 3, 3)), _w("w2", (3, 8, 3, 3))])
    report = check_model(model, FixOptions(align=8))
    # the graph input's channel count is the user's interface: reported as exempt, not a violation
    assert [(v.node, v.constraint, v.fixed_by) for v in report.violations] == [
        ("conv2", "out-channels-align", "align-channels")]
    assert [(v.node, v.constraint, v.fixed_by) for v in report.exempt] == [("conv1", "in-channels-align", None)]
    assert "--align-io" in report.exempt[0].message
    with_io = find_violations(model, FixOptions(align=8, align_io=True))
    assert [v.fixed_by for v in with_io] == ["align-channels", "align-channels"]


def test_grouped_conv_is_aligned_per_group_and_depthwise_on_totals():
    # group 4 over 16 channels: 4 channels per group, not a multiple of 8
    grouped = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="g4", group=4, pads=[1, 1, 1, 1])],
                     [_vi("x", [1, 16, 8, 8])], [_vi("y", None)], [_w("w", (16, 4, 3, 3))])
    report = check_model(grouped, FixOptions(align=8))
    assert [(v.constraint, v.value) for v in report.violations] == [("out-channels-align", 4)]
    assert [(v.constraint, v.value) for v in report.exempt] == [("in-channels-align", 4)]
    assert "per group" in report.exempt[0].message
    # depthwise over 16 channels: aligned (16), even though each group has one channel
    dw16 = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="dw", group=16, pads=[1, 1, 1, 1])],
                  [_vi("x", [1, 16, 8, 8])], [_vi("y", None)], [_w("w", (16, 1, 3, 3))])
    assert find_violations(dw16, FixOptions(align=8)) == []
    dw12 = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="dw", group=12, pads=[1, 1, 1, 1])],
                  [_vi("x", [1, 12, 8, 8])], [_vi("y", None)], [_w("w", (12, 1, 3, 3))])
    assert [(v.constraint, v.value) for v in find_violations(dw12, FixOptions(align=8, align_io=True))] == [
        ("in-channels-align", 12), ("out-channels-align", 12)]


def test_conv_transpose_channels_read_from_its_weight_layout():
    # ConvTranspose weight is [C_in, C_out/group, k, k]: 8 in, 12 out
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["t"], name="deconv", strides=[2, 2]),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    model = _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None)], [_w("w", (8, 12, 2, 2))])
    violations = find_violations(model, FixOptions(align=8))
    assert [(v.constraint, v.value) for v in violations] == [("out-channels-align", 12)]


def concat_model(c1, c2):
    nodes = [helper.make_node("Relu", ["x1"], ["a"], name="r1"), helper.make_node("Relu", ["x2"], ["b"], name="r2"),
             helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=1)]
    return _model(nodes, [_vi("x1", [1, c1, 4, 4]), _vi("x2", [1, c2, 4, 4])], [_vi("y", None)])


def test_concat_alignment():
    violations = find_violations(concat_model(8, 12), FixOptions(concat_align=8))
    assert [(v.node, v.constraint, v.value, v.limit, v.fixed_by) for v in violations] == [
        ("cat", "concat-align", [8, 12], 8, None)]
    assert "b (12)" in violations[0].message
    assert find_violations(concat_model(8, 12), FixOptions(concat_align=4)) == []
    assert find_violations(concat_model(8, 12), FixOptions(concat_align=0)) == []
    assert find_violations(concat_model(8, 16), FixOptions(concat_align=8)) == []


def conv_concat_model():
    """x -> conv a (12 ch) -> relu ┐
       x -> conv b (8 ch) ---------┴-> Concat (20 ch) -> conv c -> y"""
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"], name="relu_a"),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b", pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["ar", "b"], ["k"], name="cat", axis=1),
             helper.make_node("Conv", ["k", "wc"], ["y"], name="conv_c", pads=[1, 1, 1, 1])]
    return _model(nodes, [_vi("x", [1, 8, 6, 6])], [_vi("y", None)],
                  [_w("wa", (12, 8, 3, 3)), _w("wb", (8, 8, 3, 3)), _w("wc", (8, 20, 3, 3))])


def test_concat_of_conv_outputs_is_fixed_by_align_channels_when_align_covers_it():
    violations = find_violations(conv_concat_model(), FixOptions(align=8, concat_align=8))
    assert [(v.node, v.constraint, v.fixed_by) for v in violations] == [
        ("conv_a", "out-channels-align", "align-channels"),
        ("cat", "concat-align", "align-channels"),
        ("conv_c", "in-channels-align", "align-channels")]
    # padding to multiples of 8 does not make 16-multiples
    coarse = find_violations(conv_concat_model(), FixOptions(align=8, concat_align=16))
    assert [(v.constraint, v.fixed_by) for v in coarse if v.node == "cat"] == [("concat-align", None)]
    assert [(v.constraint, v.fixed_by) for v in find_violations(conv_concat_model(), FixOptions(
        align=0, concat_align=8))] == [("concat-align", None)]


def test_concat_of_shape_vectors_is_not_a_feature_map():
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Concat", ["s", "k"], ["t"], name="cat", axis=0),
             helper.make_node("Reshape", ["x", "t"], ["y"], name="reshape")]
    k = numpy_helper.from_array(np.array([], np.int64), "k")
    model = _model(nodes, [_vi("x", [1, 12, 4, 4])], [_vi("y", None)], [k])
    assert find_violations(model, FixOptions(concat_align=8, align=8)) == []


# --- ops ------------------------------------------------------------------------------------------


def bn_model():
    params = [numpy_helper.from_array(np.full(8, v, np.float32), n) for n, v in
              (("s", 2.0), ("b", 1.0), ("m", 0.0), ("v", 1.0))]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")]
    return _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None)], params)


def test_batchnorm_present():
    violations = find_violations(bn_model(), FixOptions())
    assert [(v.node, v.constraint, v.fixed_by) for v in violations] == [("bn", "batchnorm", "fold-batchnorm")]
    assert find_violations(bn_model(), FixOptions(allow_batchnorm=True)) == []
    # forbidden as well: still one line for the node
    assert len(find_violations(bn_model(), FixOptions(forbidden_ops=("BatchNormalization",)))) == 1


def resize_model(mode, op="Resize", opset=17):
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    inputs = ["x", "", "scales"] if op == "Resize" else ["x", "scales"]
    nodes = [helper.make_node(op, inputs, ["y"], name="up", mode=mode)]
    return _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None)], [scales], opset=opset)


def test_resize_not_nearest():
    violations = find_violations(resize_model("linear"), FixOptions())
    assert [(v.constraint, v.value, v.fixed_by) for v in violations] == [("resize-mode", "linear", "resize-nearest")]
    assert find_violations(resize_model("nearest"), FixOptions()) == []
    assert find_violations(resize_model("linear"), FixOptions(require_nearest_resize=False)) == []


def test_upsample_not_nearest():
    violations = find_violations(resize_model("linear", op="Upsample", opset=9), FixOptions())
    assert [(v.op, v.constraint) for v in violations] == [("Upsample", "resize-mode")]


def test_dropout_and_identity_left():
    nodes = [helper.make_node("Dropout", ["x"], ["d"], name="drop"),
             helper.make_node("Identity", ["d"], ["i"], name="ident"),
             helper.make_node("Relu", ["i"], ["y"], name="relu")]
    model = _model(nodes, [_vi("x", [1, 8])], [_vi("y", None)])
    violations = find_violations(model, FixOptions())
    assert [(v.node, v.constraint, v.fixed_by) for v in violations] == [
        ("drop", "leftover-op", "cleanup"), ("ident", "leftover-op", "cleanup")]


def test_identity_from_graph_input_to_graph_output_cannot_be_cleaned():
    model = _model([helper.make_node("Identity", ["x"], ["y"], name="ident")], [_vi("x", [1, 8])],
                   [_vi("y", [1, 8])])
    violations = find_violations(model, FixOptions())
    assert [(v.constraint, v.fixed_by) for v in violations] == [("leftover-op", None)]


def test_forbidden_ops():
    model = _conv_chain()
    violations = find_violations(model, FixOptions(forbidden_ops=("Relu", "Gather")))
    assert [(v.node, v.constraint, v.value, v.fixed_by) for v in violations] == [
        ("relu", "forbidden-op", "Relu", None)]
    assert find_violations(model, FixOptions(forbidden_ops=("Gather",))) == []


def test_kernel_and_stride_limits():
    model = _conv_chain(kernel=7, strides=[4, 4], pads=[3, 3, 3, 3])
    violations = find_violations(model, FixOptions(max_kernel=5, max_stride=2))
    assert [(v.node, v.constraint, v.value, v.limit) for v in violations] == [
        ("conv2", "max-kernel", [7, 7], 5), ("conv2", "max-stride", [4, 4], 2)]
    assert find_violations(model, FixOptions(max_kernel=7, max_stride=4)) == []


# --- shapes ---------------------------------------------------------------------------------------


def test_dynamic_graph_input_and_output():
    model = _conv_chain()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    violations = find_violations(model, FixOptions())
    assert [(v.node, v.op, v.constraint, v.value, v.fixed_by) for v in violations] == [
        ("x", "graph input", "dynamic-shape", "[N,8,8,8]", "--input-shape"),
        ("y", "graph output", "dynamic-shape", "[N,8,6,6]", "--input-shape"),
    ]
    # freezing the input (as --input-shape does) makes the output static too
    assert find_violations(model, FixOptions(input_shapes={"x": (1, 8, 8, 8)})) == []


def test_output_declared_symbolic_but_inferred_static_is_clean():
    model = _conv_chain()
    model.graph.output[0].CopyFrom(_vi("y", ["N", 8, "H", "W"]))
    assert find_violations(model, FixOptions()) == []


def test_unknown_intermediate_shape_where_it_starts():
    # Shape -> Abs is opaque to onnx's data propagation, so Reshape's output shape is unknown; fold-constants
    # evaluates Shape -> Abs into a constant. The Relu after it inherits the unknown shape and is not reported.
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Abs", ["s"], ["s_abs"], name="abs"),
             helper.make_node("Reshape", ["x", "s_abs"], ["r"], name="reshape"),
             helper.make_node("Relu", ["r"], ["q"], name="relu"),
             helper.make_node("Relu", ["q"], ["y"], name="relu2")]
    model = _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", [1, 8, 4, 4])])
    violations = find_violations(model, FixOptions())
    assert [(v.node, v.constraint, v.fixed_by) for v in violations] == [("reshape", "unknown-shape", "fold-constants")]


def test_data_dependent_shape_is_not_fixable():
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
             helper.make_node("Cast", ["nz"], ["y"], name="cast", to=F)]
    model = _model(nodes, [_vi("x", [1, 8])], [_vi("y", [2, 3])])
    violations = find_violations(model, FixOptions())
    assert [(v.node, v.constraint, v.fixed_by) for v in violations] == [("nonzero", "unknown-shape", None)]


def test_unknown_shape_is_reported_where_it_starts_not_again_at_the_output():
    # a custom op without shape inference: its output and everything after it are unknown
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Foo", ["a"], ["b"], name="foo", domain="com.vendor"),
             helper.make_node("Relu", ["b"], ["y"], name="relu2")]
    graph = helper.make_graph(nodes, "g", [_vi("x", [1, 8])], [_vi("y", None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.vendor", 1)],
                              ir_version=8)
    violations = find_violations(model, FixOptions())
    assert [(v.node, v.constraint, v.fixed_by) for v in violations] == [("foo", "unknown-shape", None)]


def test_data_dependent_graph_output():
    model = _model([helper.make_node("NonZero", ["x"], ["y"], name="nonzero")], [_vi("x", [1, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    violations = find_violations(model, FixOptions())
    assert [(v.node, v.op, v.constraint, v.fixed_by) for v in violations] == [
        ("y", "graph output", "dynamic-shape", None)]


def test_rank_above_limit():
    shape5 = numpy_helper.from_array(np.array([1, 2, 4, 4, 4], np.int64), "shape5")
    shape4 = numpy_helper.from_array(np.array([1, 8, 4, 4], np.int64), "shape4")
    nodes = [helper.make_node("Reshape", ["x", "shape5"], ["r5"], name="to5d"),
             helper.make_node("Relu", ["r5"], ["q5"], name="relu5d"),
             helper.make_node("Reshape", ["q5", "shape4"], ["y"], name="to4d")]
    model = _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None)], [shape5, shape4])
    violations = find_violations(model, FixOptions(max_rank=4))
    assert [(v.node, v.constraint, v.value, v.fixed_by) for v in violations] == [
        ("to5d", "max-rank", 5, None), ("relu5d", "max-rank", 5, None)]
    assert find_violations(model, FixOptions(max_rank=5)) == []
    assert find_violations(model, FixOptions(max_rank=None)) == []


def test_batch_above_one_where_it_starts():
    # x [1,8,4,4] -> conv -> Tile [4,1,1,1] (batch 4 starts here) -> Relu (inherits, not reported again)
    repeats = numpy_helper.from_array(np.array([4, 1, 1, 1], np.int64), "repeats")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Tile", ["c", "repeats"], ["b"], name="tile"),
             helper.make_node("Relu", ["b"], ["y"], name="relu")]
    model = _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None)], [_w("w", (8, 8, 3, 3)), repeats])
    violations = find_violations(model, FixOptions(batch_one=True))
    assert [(v.node, v.constraint, v.value) for v in violations] == [("tile", "batch-one", 4)]
    assert find_violations(model, FixOptions(batch_one=False)) == []
    two = _conv_chain()
    two.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    assert [(v.node, v.op, v.constraint) for v in find_violations(two, FixOptions(batch_one=True))] == [
        ("x", "graph input", "batch-one")]


def _batch_findings(model, **options):
    return [v for v in find_violations(model, FixOptions(batch_one=True, **options)) if v.constraint == "batch-one"]


def _batch_free_model(last):
    """x [1,8,4,4] -> conv -> ``last`` nodes (whose output axis 0 is no batch) -> y."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]), *last]
    return nodes, [_w("w", (8, 8, 3, 3))]


def test_batch_one_ignores_axis_0_that_is_not_the_batch():
    # ConvTasNet's decoder: [1,8,4,4] -> Reshape [2,4,16] (two sources) -> ConvTranspose (runs on each source)
    nodes, inits = _batch_free_model([
        helper.make_node("Reshape", ["c", "two"], ["s"], name="sources"),
        helper.make_node("ConvTranspose", ["s", "wt"], ["y"], name="decoder")])
    inits += [numpy_helper.from_array(np.array([2, 4, 16], np.int64), "two"), _w("wt", (4, 1, 3))]
    model = _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None)], inits)
    assert _batch_findings(model) == []
    # a Transpose that moves axis 0 away: [1,8,4,4] -> [4,8,1,4] -> Relu
    nodes, inits = _batch_free_model([
        helper.make_node("Transpose", ["c"], ["t"], name="moves_axis0", perm=[2, 1, 0, 3]),
        helper.make_node("Relu", ["t"], ["y"], name="relu")])
    model = _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None)], inits)
    assert _batch_findings(model) == []
    # ... while one that keeps axis 0 keeps the batch: Tile after it is still reported
    nodes, inits = _batch_free_model([
        helper.make_node("Transpose", ["c"], ["t"], name="keeps_axis0", perm=[0, 2, 1, 3]),
        helper.make_node("Tile", ["t", "rep"], ["y"], name="tile")])
    inits.append(numpy_helper.from_array(np.array([3, 1, 1, 1], np.int64), "rep"))
    model = _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None)], inits)
    assert [(v.node, v.value) for v in _batch_findings(model)] == [("tile", 3)]


def test_a_state_input_that_reaches_no_conv_has_no_batch():
    # silero-like: a recurrent state [2,1,128] (directions on axis 0) next to a batch-1 audio input
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 4 * 128, 16)).astype(np.float32), "lw")
    r = numpy_helper.from_array(rng.standard_normal((1, 4 * 128, 128)).astype(np.float32), "lr")
    nodes = [helper.make_node("Conv", ["audio", "cw"], ["feat"], name="conv", kernel_shape=[1]),
             helper.make_node("Transpose", ["feat"], ["seq"], name="to_seq", perm=[2, 0, 1]),
             helper.make_node("Slice", ["state", "s0", "s1"], ["h0"], name="h0"),
             helper.make_node("LSTM", ["seq", "lw", "lr", "", "", "h0", "h0"], ["y", "h", "c"], name="lstm",
                              hidden_size=128)]
    inits = [_w("cw", (16, 1, 1)), w, r, numpy_helper.from_array(np.array([0], np.int64), "s0"),
             numpy_helper.from_array(np.array([1], np.int64), "s1")]
    model = _model(nodes, [_vi("audio", [1, 1, 32]), _vi("state", [2, 1, 128])],
                   [_vi("y", None), _vi("h", None), _vi("c", None)], inits)
    assert _batch_findings(model) == []
    # the same audio input with batch 2 is reported (it reaches the Conv)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    assert [(v.node, v.op) for v in _batch_findings(model)] == [("audio", "graph input")]


def test_batch_one_on_the_exported_convtasnet(fixture_path):
    # torch's ConvTasNet reshapes [1, 2*64, T] to [2, 64, T] to decode its two sources: not a batch
    model = onnx.load(fixture_path("torch_convtasnet.onnx"))
    assert _batch_findings(model, input_shapes={"mix": (1, 16000)}) == []
    found = [(v.node, v.op) for v in _batch_findings(model, input_shapes={"mix": (2, 16000)})]
    assert found == [("mix", "graph input")]


def test_inconsistent_model_reports_shape_inference_without_crashing():
    nodes = [helper.make_node("Add", ["x", "z"], ["y"], name="add")]
    model = _model(nodes, [_vi("x", [1, 3]), _vi("z", [1, 4])], [_vi("y", None)])
    violations = find_violations(model, FixOptions())
    assert violations[0].constraint == "shape-inference" and violations[0].fixed_by is None


# --- memory ---------------------------------------------------------------------------------------


def two_branch_model():
    """Same two-branch graph as test_memory.py: stored peak 1088 B, a depth-first order peaks at 640 B."""
    def conv(name, src, w):
        return helper.make_node("Conv", [src, w], [name], name=name, pads=[1, 1, 1, 1])

    nodes = [conv("a1", "x", "wa1"), conv("b1", "x", "wb1"), conv("a2", "a1", "wa2"), conv("b2", "b1", "wb2"),
             helper.make_node("Concat", ["a2", "b2"], ["y"], name="cat", axis=1)]
    return _model(nodes, [_vi("x", [1, 1, 8, 8])], [_vi("y", [1, 2, 8, 8])],
                  [_w("wa1", (8, 1, 3, 3)), _w("wb1", (8, 1, 3, 3)), _w("wa2", (1, 8, 3, 3)),
                   _w("wb2", (1, 8, 3, 3))])


def test_sram_overflow():
    model = two_branch_model()
    fits_after_reorder = find_violations(model, FixOptions(align=0, sram_bytes=700))
    assert [(v.node, v.constraint, v.value, v.limit, v.fixed_by) for v in fits_after_reorder] == [
        ("b1", "sram", 1088, 700, "reorder-memory")]
    assert fits_after_reorder[0].text() == "b1 (Conv): sram: 1.1 KiB vs SRAM 700 B -> fixed by reorder-memory"
    too_small = find_violations(model, FixOptions(align=0, sram_bytes=600))
    # every single layer fits 600 B (the largest, a Conv 8x8 -> 8x8x8, needs 64 + 512): --split can fit it
    assert [(v.constraint, v.fixed_by) for v in too_small] == [("sram", "--split")]
    below_floor = find_violations(model, FixOptions(align=0, sram_bytes=500))
    assert [(v.constraint, v.fixed_by) for v in below_floor] == [("sram", None), ("sram-layer", None)]
    assert find_violations(model, FixOptions(align=0, sram_bytes=1088)) == []
    assert find_violations(model, FixOptions(align=0, sram_bytes=None)) == []
    # act_bytes 4: the peak is 4 * 1088
    assert find_violations(model, FixOptions(align=0, sram_bytes=4 * 1088, act_bytes=4)) == []
    # the claim holds: after reorder-memory the model fits in 700 bytes
    from helpers import apply_pass

    from onnx_npu_fix.passes.reorder_memory import ReorderMemoryPass

    reordered, _ = apply_pass(model, ReorderMemoryPass(), align=0, sram_bytes=700)
    assert find_violations(reordered, FixOptions(align=0, sram_bytes=700)) == []


# --- output forms ---------------------------------------------------------------------------------


def test_report_json_and_text():
    model = _conv_chain(c_mid=12, pads=[8, 8, 8, 8], dilations=[8, 8])
    report = check_model(model, FixOptions(max_dilation=4, align=8, sram_bytes=100), shapes=True)
    data = json.loads(json.dumps(report.to_json()))
    assert data["clean"] is False
    assert {v["constraint"] for v in data["violations"]} == {"dilation", "out-channels-align", "in-channels-align",
                                                            "sram", "sram-layer"}  # 100 B is below any layer
    assert set(data["violations"][0]) == {"node", "op", "constraint", "value", "limit", "fixed_by", "message"}
    assert all(v["constraint"] in CONSTRAINTS for v in data["violations"])
    assert data["memory"]["peak"]["bytes"] == report.memory.peak_bytes
    assert [s["name"] for s in data["shapes"]] == ["conv1", "relu", "conv2"]
    text = render_check(report)
    lines = text.splitlines()
    assert lines[len(report.violations)] == (
        "5 violations: 3 fixable (align-channels 2, dilated-conv 1); 2 that no pass fixes")
    assert "Activation memory" in text


def test_shape_listing():
    model = _conv_chain(c_mid=12, pads=[1, 1, 1, 1])
    model.graph.node[1].name = ""
    listing = shape_listing(model)
    assert [(n.name, n.op) for n in listing] == [("conv1", "Conv"), ("Relu_1", "Relu"), ("conv2", "Conv")]
    assert render_shapes(listing).splitlines() == [
        "conv1 (Conv): x [1,8,8,8], w1 [12,8,3,3] (const) -> a [1,12,8,8]",
        "Relu_1 (Relu): a [1,12,8,8] -> r [1,12,8,8]",
        "conv2 (Conv): r [1,12,8,8], w2 [8,12,3,3] (const) -> y [1,8,8,8]",
    ]
    assert listing[0].to_json()["inputs"][0] == {"name": "x", "shape": [1, 8, 8, 8], "dtype": "float",
                                                 "const": False}


def test_input_shape_for_unknown_name_is_an_input_error():
    from onnx_npu_fix.errors import InputError

    with pytest.raises(InputError):
        find_violations(_conv_chain(), FixOptions(input_shapes={"nope": (1,)}))


def _long_chain(n_blocks):
    w = _w("w", (8, 8, 3, 3))
    nodes, prev = [], "x"
    for i in range(n_blocks):
        nodes += [helper.make_node("Conv", [prev, "w"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
                  helper.make_node("Add", [f"r{i}", prev], [f"a{i}"], name=f"add{i}")]
        prev = f"a{i}"
    return _model(nodes, [_vi("x", [1, 8, 8, 8])], [_vi(prev, [1, 8, 8, 8])], [w])


def _calls_made(check, model):
    """How many functions (Python and C) ``check(model)`` calls: the work it does, counted, not timed."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        check(model)
    finally:
        sys.setprofile(None)
    return count


def test_check_scales_linearly():
    # One pass over the graph: every block of nodes added costs the same number of calls, however many there
    # are already (a per-node walk of the graph would double the cost of a block with every doubling).
    options = FixOptions(**STRICT)
    calls = [_calls_made(lambda m: find_violations(m, options), _long_chain(n)) for n in (100, 200, 400)]
    per_block_small = (calls[1] - calls[0]) / 100
    per_block_large = (calls[2] - calls[1]) / 200
    assert per_block_small > 0 and per_block_large <= 1.02 * per_block_small, calls


# --- the fixed_by claims against the real passes ----------------------------------------------------


def test_violations_claimed_fixable_are_fixed_by_the_named_passes():
    from helpers import apply_pass

    from onnx_npu_fix.passes.align_channels import AlignChannelsPass
    from onnx_npu_fix.passes.cleanup import CleanupPass
    from onnx_npu_fix.passes.dilated_conv import DilatedConvPass
    from onnx_npu_fix.passes.fold_batchnorm import FoldBatchNormPass
    from onnx_npu_fix.passes.fold_constants import FoldConstantsPass
    from onnx_npu_fix.passes.resize_nearest import ResizeNearestPass

    bn = [numpy_helper.from_array(np.full(12, v, np.float32), n) for n, v in
          (("s", 2.0), ("b", 1.0), ("m", 0.5), ("v", 4.0))]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),         # in 3: input-fixed
        helper.make_node("BatchNormalization", ["a", "s", "b", "m", "v"], ["bn"], name="bn"),
        helper.make_node("Identity", ["bn"], ["i"], name="ident"),
        helper.make_node("Conv", ["i", "w2"], ["d"], name="conv2", pads=[8, 8, 8, 8], dilations=[8, 8]),
        helper.make_node("Relu", ["d"], ["r"], name="relu"),
        helper.make_node("Conv", ["x", "w3"], ["e"], name="conv3", pads=[1, 1, 1, 1]),          # 4 channels out
        helper.make_node("Concat", ["r", "e"], ["k"], name="cat", axis=1),
        helper.make_node("Resize", ["k", "", "scales"], ["u"], name="up", mode="linear"),
        helper.make_node("Conv", ["u", "w4"], ["y"], name="conv4", pads=[1, 1, 1, 1]),          # 16 -> 5
    ]
    model = _model(nodes, [_vi("x", [1, 3, 16, 16])], [_vi("y", None)],
                   [_w("w1", (12, 3, 3, 3)), _w("w2", (12, 12, 3, 3)), _w("w3", (4, 3, 3, 3)),
                    _w("w4", (5, 16, 3, 3)), scales] + bn)
    options = dict(max_dilation=4, align=8, concat_align=8)
    before = find_violations(model, FixOptions(**options))
    claimed = {v.fixed_by for v in before if v.fixable}
    assert claimed == {"fold-batchnorm", "cleanup", "dilated-conv", "align-channels", "resize-nearest"}
    for pass_cls in (CleanupPass, FoldConstantsPass, FoldBatchNormPass, ResizeNearestPass, AlignChannelsPass,
                     DilatedConvPass, CleanupPass):
        model, _ = apply_pass(model, pass_cls(), **options)
    after = check_model(model, FixOptions(**options))
    assert {(v.node, v.constraint) for v in after.violations} == {
        (v.node, v.constraint) for v in before if not v.fixable} == set()
    assert {(v.node, v.constraint) for v in after.exempt} == {("conv1", "in-channels-align"),
                                                              ("conv3", "in-channels-align")}


# --- the one table of constraints -------------------------------------------------------------------------


def test_the_table_names_real_options_and_passes():
    """A constraint asked for by a field FixOptions does not have would never count under an explicit option; a
    pass declaring it fixes a constraint the table does not have would never be asked."""
    from onnx_npu_fix.constraints.table import declared_fixes, fixed_by_text

    fields = set(FixOptions.__dataclass_fields__)
    assert len(CONSTRAINT) == len(CONSTRAINT_TABLE)  # names are unique
    for c in CONSTRAINT_TABLE:
        assert set(c.asked_by) <= fields, c
        assert c.limit.count("{}") == 1 and c.violated_when and fixed_by_text(c), c
    assert set(declared_fixes()) <= set(CONSTRAINT), sorted(set(declared_fixes()) - set(CONSTRAINT))


def _constraint_names_in_checks():
    """Every constraint name the checks report (constraints/checks.py, and the judge's in constraints/report.py):
    the literal constraint argument of each Violation(...), ctx.add(...) and ctx.add_fixable(...) (both sides of a
    conditional)."""
    import ast
    import inspect

    from onnx_npu_fix.constraints import checks, report

    def literals(node):
        if isinstance(node, ast.IfExp):
            return literals(node.body) | literals(node.orelse)
        if isinstance(node, ast.Name) and node.id == "constraint":
            return set()  # _Context.add passes on its caller's name, which is counted at that caller
        assert isinstance(node, ast.Constant) and isinstance(node.value, str), ast.dump(node)
        return {node.value}

    def constraint_argument(call):
        func = call.func
        if isinstance(func, ast.Name) and func.id == "Violation":
            slot = 2
        elif (isinstance(func, ast.Attribute) and func.attr in ("add", "add_fixable")
              and isinstance(func.value, ast.Name) and func.value.id == "ctx"):
            slot = 1
        else:
            return None
        return call.args[slot]

    names = set()
    for node in (n for module in (checks, report) for n in ast.walk(ast.parse(inspect.getsource(module)))):
        argument = constraint_argument(node) if isinstance(node, ast.Call) else None
        if argument is not None:
            names |= literals(argument)
    return names


def test_every_reported_constraint_has_a_row_and_every_row_a_check():
    assert _constraint_names_in_checks() == set(CONSTRAINTS)


def _readme_constraint_rows():
    """The constraint table of docs/constraints.md: constraint -> (violated when, fixed by)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "constraints.md").read_text(encoding="utf-8")
    lines = text[text.index("| constraint | violated when | fixed by |"):].splitlines()
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        name, violated, fixed = (cell.strip() for cell in line.strip("|").split(" | "))
        assert name.startswith("`") and name.endswith("`"), line
        assert name.strip("`") not in rows, f"two rows for {name} in docs/constraints.md"
        rows[name.strip("`")] = (violated, fixed)
    return rows


def test_docs_table_is_the_constraint_table_both_ways():
    readme = _readme_constraint_rows()
    from onnx_npu_fix.constraints.table import fixed_by_text

    table = {c.name: (c.violated_when, fixed_by_text(c)) for c in CONSTRAINT_TABLE}
    assert not set(readme) - set(table), f"docs rows without a constraint: {sorted(set(readme) - set(table))}"
    assert not set(table) - set(readme), f"constraints without a docs row: {sorted(set(table) - set(readme))}"
    for name, texts in table.items():
        assert readme[name] == texts, f"docs/constraints.md row of {name} differs; markdown_table() prints the table"


def test_the_lookups_are_the_table():
    """LIMIT_TEXT and ASKED_BY say what the rows say; responsible() what the passes declare (the forbidden-op
    declaration of fold-batchnorm narrowed to one op)."""
    from onnx_npu_fix.constraints import ASKED_BY, LIMIT_TEXT, responsible

    assert LIMIT_TEXT["dilation"] == "max {}" and ASKED_BY["sram-layer"] == ("sram_bytes",)
    assert ASKED_BY["leftover-op"] == () and responsible("leftover-op") == ("cleanup",)
    assert "fold-batchnorm" in responsible("forbidden-op", "BatchNormalization")
    assert "fold-batchnorm" not in responsible("forbidden-op", "PRelu") and responsible("max-rank") == ()
    assert set(LIMIT_TEXT) == set(ASKED_BY) == set(CONSTRAINTS)


def test_batch_is_traced_through_if_branches_and_unresolved_sizes():
    # x [2,4,8] -> If (Relu | Neg) -> Pad with pads only known at run time (sizes unknown) -> Conv: x is a batch
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="relu")], "then", [], [_vi("t", None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="neg")], "else", [], [_vi("e", None)])
    nodes = [helper.make_node("If", ["cond"], ["branch"], name="pick", then_branch=then, else_branch=other),
             helper.make_node("Pad", ["branch", "pads"], ["padded"], name="pad"),
             helper.make_node("Conv", ["padded", "w"], ["y"], name="conv")]
    inputs = [_vi("x", [2, 4, 8]), helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
              helper.make_tensor_value_info("pads", TensorProto.INT64, [6])]
    model = _model(nodes, inputs, [_vi("y", None)], [_w("w", (4, 4, 3))])
    assert [(v.node, v.op) for v in _batch_findings(model)] == [("x", "graph input")]


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_concat_off_the_channel_axis_is_no_channel_concat(axis):
    # Silero VAD concatenates its two [1, 1, 128] state halves on axis 0: no channel count is summed there.
    nodes = [helper.make_node("Relu", ["x1"], ["a"], name="r1"), helper.make_node("Relu", ["x2"], ["b"], name="r2"),
             helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=axis)]
    model = _model(nodes, [_vi("x1", [1, 12, 4, 4]), _vi("x2", [1, 12, 4, 4])], [_vi("y", None)])
    assert find_violations(model, FixOptions(concat_align=8)) == []
    assert [v.constraint for v in find_violations(concat_model(12, 12), FixOptions(concat_align=8))] == \
        ["concat-align"]  # the same inputs on axis 1 are a channel concat


def test_unknown_shape_verdict_comes_from_fold_constants_itself():
    """Whether an unknown shape becomes static is fold-constants' answer (its find, judged by the result), not a
    rule of constraints/: a data-dependent NonZero carries fold-constants' own 'no' in its message."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nonzero"),
             helper.make_node("Cast", ["nz"], ["y"], name="cast", to=F)]
    model = _model(nodes, [_vi("x", [1, 8])], [_vi("y", [2, 3])])
    (violation,) = find_violations(model, FixOptions())
    assert violation.fixed_by is None and "fold-constants:" in violation.message


# --- the constraints the real compiler runs showed missing -----------------------------------------------------

def _strided(in_shape, w_shape, strides, group=1):
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv_s", strides=list(strides), group=group)
    return _model([node], [_vi("x", list(in_shape))], [_vi("y", None)], [_w("w", w_shape)])


@pytest.mark.parametrize("in_shape, w_shape, strides, group, flagged", [
    ((1, 1, 8000), (64, 1, 16), (8,), 1, False),       # the ConvTasNet encoder Vela 5.2 runs on its NPU
    ((1, 1, 8001), (16, 1, 16), (7,), 1, False),       # 1-D stride 7: on the NPU too
    ((1, 4, 64, 64), (8, 4, 4, 1), (4, 1), 1, False),  # 2-D stride 4 on the height: on the NPU too
    ((1, 4, 64, 64), (4, 1, 3, 3), (4, 4), 4, True),   # depthwise stride 4: Vela 5.2 runs it on the CPU
])
def test_vela_stride_rule_flags_only_what_vela_keeps_off_the_npu(in_shape, w_shape, strides, group, flagged):
    options = FixOptions(max_stride=3, stride_limit_depthwise_only=True)
    model = _strided(in_shape, w_shape, strides, group)
    assert bool([v for v in find_violations(model, options) if v.constraint == "max-stride"]) is flagged
    # without the exemption every stride above 3 is flagged, as before
    assert [v.constraint for v in find_violations(model, FixOptions(max_stride=3))] == ["max-stride"]


def test_k210_kernel_shapes_and_asymmetric_pads():
    """k210's allowed_kernels: 1x3 / 3x1 are not 1x1 or 3x3 (nncase 1.9 runs them on the CPU). symmetric_pads is a
    key for a target that needs it (nncase 1.9 ran asymmetric pads on the KPU: the k210 profile does not set it)."""
    from onnx_npu_fix.config.targets import apply_target, load_target

    options = apply_target(load_target("k210"), FixOptions(), {"symmetric_pads": True})
    nodes = [helper.make_node("Conv", ["x", "w13"], ["a"], name="conv_1x3", pads=[0, 1, 0, 1]),
             helper.make_node("Conv", ["a", "w33"], ["b"], name="conv_asym", pads=[0, 0, 1, 1]),
             helper.make_node("Conv", ["b", "w33"], ["y"], name="conv_same", pads=[1, 1, 1, 1])]
    model = _model(nodes, [_vi("x", [1, 8, 16, 16])], [_vi("y", None)],
                   [_w("w13", (8, 8, 1, 3)), _w("w33", (8, 8, 3, 3))])
    found = find_violations(model, options)
    assert kinds(found) == [("conv_1x3", "kernel-allowed"), ("conv_asym", "asymmetric-pads")]
    assert "[(0, 1), (0, 1)]" in found[1].message


def test_k210_unsqueeze_axes_from_a_constant_node():
    """k210's initializer_inputs: nncase 1.9 fails ("bad optional access") on an Unsqueeze whose axes a Constant node
    makes, not on the same axes as an initializer. fold-constants fixes both forms: it stores the Constant as an
    initializer, and folds an Unsqueeze computed from constants only (a shape chain); the finding names it."""
    from onnx_npu_fix.config.targets import apply_target, load_target

    const = [helper.make_node("Constant", [], [f"axes{k}"], name=f"const{k}",
                              value=numpy_helper.from_array(np.array([axis], np.int64)))
             for k, axis in enumerate((1, 0, 0))]
    nodes = [*const,
             helper.make_node("Unsqueeze", ["x", "axes0"], ["a"], name="from_constant"),
             helper.make_node("Unsqueeze", ["a", "axes_init"], ["b"], name="from_initializer"),
             helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["g"], name="gather"),
             helper.make_node("Unsqueeze", ["g", "axes1"], ["g1"], name="shape_chain"),
             helper.make_node("Concat", ["g1", "minus_one"], ["target_shape"], name="concat", axis=0),
             helper.make_node("Reshape", ["b", "target_shape"], ["y"], name="reshape"),
             helper.make_node("Squeeze", ["y", "axes2"], ["z"], name="squeeze")]  # Squeeze is not listed
    inits = [numpy_helper.from_array(np.array([2], np.int64), "axes_init"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    model = _model(nodes, [_vi("x", [1, 8, 16])], [_vi("z", None)], inits)
    options = apply_target(load_target("k210"), FixOptions(), {})
    found = [(v.node, v.fixed_by) for v in find_violations(model, options) if v.constraint == "constant-node-input"]
    assert found == [("from_constant", "fold-constants"), ("shape_chain", "fold-constants")]
    assert not [v for v in find_violations(model, FixOptions()) if v.constraint == "constant-node-input"]


def test_k210_squeeze_that_keeps_a_size_one_axis():
    """k210's squeeze_axes_ignored: nncase 1.9 removes every size-1 axis of an opset-13 Squeeze, so [1,8,1] squeezed
    on axis 2 (keeping axis 0) fails there (squeeze-reshape makes it a Reshape); [2,8,1] on axis 2 and the opset-11
    attribute form do not count."""
    from onnx_npu_fix.config.targets import apply_target, load_target

    options = apply_target(load_target("k210"), FixOptions(), {})
    axes = numpy_helper.from_array(np.array([2], np.int64), "axes")

    def squeeze(batch, opset):
        inputs = ["x", "axes"] if opset >= 13 else ["x"]
        node = helper.make_node("Squeeze", inputs, ["y"], name="squeeze", **({} if opset >= 13 else {"axes": [2]}))
        return _model([node], [_vi("x", [batch, 8, 1])], [_vi("y", None)], [axes] if opset >= 13 else [], opset)

    found = [v for v in find_violations(squeeze(1, 17), options) if v.constraint == "squeeze-axes"]
    assert [(v.node, v.value, v.fixed_by) for v in found] == [("squeeze", "[1,8,1] -> [1,8]", "squeeze-reshape")]
    for model in (squeeze(2, 17), squeeze(1, 11)):
        assert not [v for v in find_violations(model, options) if v.constraint == "squeeze-axes"]
    assert not [v for v in find_violations(squeeze(1, 17), FixOptions()) if v.constraint == "squeeze-axes"]


def _qdq_relu():
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"], name="quant"),
             helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"], name="dequant"),
             helper.make_node("Relu", ["xd"], ["y"], name="relu")]
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "zp")]
    return _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", [1, 8, 4, 4])], inits)


def test_check_target_bm1684x_refuses_a_qdq_model_with_exit_1(tmp_path):
    from click.testing import CliRunner

    from onnx_npu_fix.cli import main

    path = tmp_path / "q.onnx"
    onnx.save(_qdq_relu(), path)
    result = CliRunner().invoke(main, [str(path), "--check", "--target", "bm1684x"])
    assert result.exit_code == 1, result.output
    assert "quant (QuantizeLinear): quantized-input: 2 quantized ops vs float model" in result.output
    float_model = _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [_vi("x", [1, 8, 4, 4])],
                         [_vi("y", [1, 8, 4, 4])])
    onnx.save(float_model, path)
    assert CliRunner().invoke(main, [str(path), "--check", "--target", "bm1684x"]).exit_code == 0


def _resize(h, out, coord, mode="linear"):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="up", mode=mode,
                            coordinate_transformation_mode=coord)
    sizes = numpy_helper.from_array(np.array([1, 4, out, out], np.int64), "sizes")
    return _model([node], [_vi("x", [1, 4, h, h])], [_vi("y", None)], [sizes])


@pytest.mark.parametrize("h, out, coord, before, after_mode", [
    (8, 64, "half_pixel", "fixed by resize-nearest", "nearest"),  # LR-ASPP x8: Vela runs nearest x8 on its NPU
    (8, 16, "half_pixel", None, "linear"),                         # x2 half-pixel linear: on the NPU as it is
    (6, 22, "align_corners", "no pass fixes this", "linear"),      # DeepLabV3+ x4.2: on the CPU in either mode
])
def test_ethos_u55_resize_factor_rule_and_what_resize_nearest_does(h, out, coord, before, after_mode):
    from onnx_npu_fix import api
    from onnx_npu_fix.config.targets import apply_target, load_target

    options = apply_target(load_target("ethos-u55"), FixOptions(), {})
    model = _resize(h, out, coord)
    found = [v.text() for v in find_violations(model, options)]
    assert (found[0].endswith(before) if before else not found), found
    fixed = api.fix(model, options, api.select_passes()).model
    resize = next(n for n in fixed.graph.node if n.op_type == "Resize")
    assert helper.get_attribute_value(next(a for a in resize.attribute if a.name == "mode")).decode() == after_mode
    assert [v.constraint for v in find_violations(fixed, options)] == (["resize-factor"] if coord ==
                                                                        "align_corners" else [])


@pytest.mark.parametrize("stride", [7, 8])
def test_rv1106_limits_the_stride_of_quantized_convs_only(tmp_path, stride):
    """rv1106's max_stride_quantized: rknn-toolkit2 2.5.0 refuses a QDQ Conv1d with stride 8 (its own split makes a
    float16 Conv), builds stride 7, and builds the float Conv with stride 8 (it quantizes it itself). The model is
    a Conv1d on [1,1,8000] quantized by onnxruntime's quantizer here."""
    from helpers import quantize_with_onnxruntime

    from onnx_npu_fix.config.targets import apply_target, load_target

    rng = np.random.default_rng(3)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="encoder", strides=[stride])
    weight = numpy_helper.from_array(rng.standard_normal((16, 1, 16)).astype(np.float32), "w")
    float_model = _model([conv], [_vi("x", [1, 1, 8000])], [_vi("y", [1, 16, (8000 - 16) // stride + 1])], [weight])
    qdq = quantize_with_onnxruntime(float_model, tmp_path)
    options = apply_target(load_target("rv1106"), FixOptions(), {})
    flagged = [(v.node, v.limit) for v in find_violations(qdq, options) if v.constraint == "max-stride"]
    assert flagged == ([("encoder", 7)] if stride > 7 else [])
    assert not [v for v in find_violations(float_model, options) if v.constraint == "max-stride"]
