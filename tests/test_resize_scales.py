"""resize-scales: a Resize given its output sizes is given the float32 scales they stand for, for a target whose
importer reads scales only (k210: nncase 1.9); exact against onnxruntime, bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_equivalent, run_model
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.config.targets import apply_target, load_target
from onnx_npu_fix.constraints import find_violations
from onnx_npu_fix.passes.resize_scales import ResizeScalesPass

K210 = apply_target(load_target("k210"), FixOptions(), {})


def resizes(tmp_path, side=28, sizes=((56, "linear", "half_pixel"), (224, "nearest", "asymmetric"),
                                      (80, "cubic", "align_corners"))) -> str:
    """x [1,4,side,side] -> one Resize per (output side, mode, coordinate mode), each given sizes (scales
    omitted, as torchvision exports them) -> one output each."""
    nodes, inits, outputs = [], [], []
    for i, (out, mode, coord) in enumerate(sizes):
        inits.append(numpy_helper.from_array(np.array([1, 4, out, out], np.int64), f"sizes{i}"))
        nodes.append(helper.make_node("Resize", ["x", "", "", f"sizes{i}"], [f"y{i}"], name=f"resize{i}", mode=mode,
                                      coordinate_transformation_mode=coord))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, 4, out, out]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, side, side])],
                              outputs, inits)
    path = str(tmp_path / "resize.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_each_resize_given_sizes_is_given_its_scales_and_computes_the_same_bits(tmp_path):
    path = resizes(tmp_path)
    assert [(v.node, v.fixed_by) for v in find_violations(onnx.load(path), K210) if v.constraint == "resize-sizes"] \
        == [("resize0", "resize-scales"), ("resize1", "resize-scales"), ("resize2", "resize-scales")]
    result = api.fix(path, K210)
    for node in result.model.graph.node:
        assert len(node.input) == 3 and node.input[2]  # scales given, sizes gone
    scales = {t.name: numpy_helper.to_array(t).tolist() for t in result.model.graph.initializer}
    assert [scales[n.input[2]] for n in result.model.graph.node] == \
        [[1, 1, 2, 2], [1, 1, 8, 8], [1, 1, np.float32(80 / 28), np.float32(80 / 28)]]
    x = np.random.default_rng(0).standard_normal((1, 4, 28, 28)).astype(np.float32)
    [before], [after] = run_model(onnx.load(path), [{"x": x}]), run_model(result.model, [{"x": x}])
    for name in ("y0", "y1", "y2"):
        assert before[name].shape == after[name].shape and np.array_equal(before[name], after[name])
    assert not [v for v in find_violations(result.model, K210) if v.constraint == "resize-sizes"]
    record = next(p for p in result.report.passes if p.name == "resize-scales")
    assert record.exact and [c.node for c in record.changes if c.op == "Resize"] == ["resize0", "resize1", "resize2"]


def test_the_lraspp_fixtures_empty_scales_tensor_counts_as_omitted(fixture_path):
    model = onnx.load(fixture_path("lraspp.onnx"))
    assert [v.node for v in find_violations(model, K210) if v.constraint == "resize-sizes"] == ["upsample_39"]
    result = api.fix(model, K210)
    assert assert_equivalent(onnx.load(fixture_path("lraspp.onnx")), result.model).passed
    assert not [v for v in find_violations(result.model, K210) if v.constraint == "resize-sizes"]


@pytest.mark.parametrize(("side", "out", "reason"), [(3, 7, "floor(in x scale) misses sizes"),
                                                     (None, 56, "input shape is not static")])
def test_a_size_its_scale_would_miss_or_an_unknown_input_shape_is_refused_with_its_reason(tmp_path, side, out,
                                                                                          reason):
    path = resizes(tmp_path, side=side or 28, sizes=((out, "linear", "half_pixel"),))
    model = onnx.load(path)
    if side is None:
        model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    found = ResizeScalesPass().find(onnx.shape_inference.infer_shapes(model), FixOptions(resize_scales_only=True))
    assert not found.plans and [r.node for r in found.rejections] == ["resize0"]
    assert reason in found.rejections[0].reason


def test_without_the_target_fact_the_sizes_stay(tmp_path):
    path = resizes(tmp_path)
    assert not [v for v in find_violations(onnx.load(path), FixOptions()) if v.constraint == "resize-sizes"]
    plain = api.fix(path, FixOptions(require_nearest_resize=False))
    assert [len(n.input) for n in plain.model.graph.node] == [4, 4, 4]
    record = next(p for p in plain.report.passes if p.name == "resize-scales")
    assert not record.changes and not record.rejections
