"""squeeze-reshape: a Squeeze (axes as an input) that keeps a size-1 axis becomes a Reshape to its static output
shape, for a target whose importer ignores the axes (k210: nncase 1.9); exact against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import assert_equivalent
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.config.targets import apply_target, load_target
from onnx_npu_fix.constraints import find_violations


def squeezes(tmp_path, input_shape=(1, 128, 1)) -> str:
    """x [1,128,1] -> Relu -> Squeeze(axes [2]) (keeps the size-1 axis 0) and Squeeze(axes [0, 2]) (removes every
    one) -> two outputs."""
    inits = [numpy_helper.from_array(np.array([2], np.int64), "keep_axes"),
             numpy_helper.from_array(np.array([0, 2], np.int64), "all_axes")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Squeeze", ["r", "keep_axes"], ["kept"], name="keeps_one"),
             helper.make_node("Squeeze", ["r", "all_axes"], ["flat"], name="removes_all")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
                              [helper.make_tensor_value_info("kept", TensorProto.FLOAT, list(input_shape[:2])),
                               helper.make_tensor_value_info("flat", TensorProto.FLOAT, [input_shape[1]])], inits)
    path = str(tmp_path / "squeeze.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_the_squeeze_that_keeps_a_size_one_axis_becomes_an_exact_reshape(tmp_path):
    path = squeezes(tmp_path)
    options = apply_target(load_target("k210"), FixOptions(), {})
    assert [v.node for v in find_violations(onnx.load(path), options) if v.constraint == "squeeze-axes"] == \
        ["keeps_one"]
    result = api.fix(path, options)
    ops = {n.name: n.op_type for n in result.model.graph.node}
    assert ops["keeps_one"] == "Reshape" and ops["removes_all"] == "Squeeze"
    assert assert_equivalent(onnx.load(path), result.model).passed
    assert not [v for v in find_violations(result.model, options) if v.constraint == "squeeze-axes"]
    record = next(p for p in result.report.passes if p.name == "squeeze-reshape")
    assert record.exact and [c.node for c in record.changes if c.op == "Squeeze"] == ["keeps_one"]


def test_without_the_target_fact_or_with_a_dynamic_shape_nothing_changes(tmp_path):
    path = squeezes(tmp_path)
    plain = api.fix(path, FixOptions())
    assert [n.op_type for n in plain.model.graph.node].count("Squeeze") == 2
    dynamic = squeezes(tmp_path, ("n", 128, 1))
    from onnx_npu_fix.passes.squeeze_reshape import SqueezeReshapePass

    found = SqueezeReshapePass().find(onnx.shape_inference.infer_shapes(onnx.load(dynamic)),
                                      FixOptions(squeeze_axes_ignored=True))
    assert not found.plans and [r.node for r in found.rejections] == ["keeps_one", "removes_all"]
    assert "not static" in found.rejections[0].reason
