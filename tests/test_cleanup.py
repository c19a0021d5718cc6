"""Pass cleanup: Identity / Dropout / dead nodes / unused initializers; graph I/O names kept."""

from __future__ import annotations

import numpy as np
from helpers import apply_pass, assert_equivalent, ops
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.passes.cleanup import CleanupPass


def make(nodes, inits=(), outputs=("out",), opset=17):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 3]) for o in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def test_identity_and_dropout_removed_outputs_kept():
    model = make([
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Identity", ["a"], ["b"], name="id"),
        helper.make_node("Dropout", ["b"], ["c"], name="drop"),
        helper.make_node("Sigmoid", ["c"], ["d"], name="sig"),
        helper.make_node("Identity", ["d"], ["out"], name="id_out"),
    ])
    fixed, result = apply_pass(model, CleanupPass())
    assert ops(fixed) == ["Relu", "Sigmoid"]
    assert [o.name for o in fixed.graph.output] == ["out"]
    assert sorted(c.node for c in result.changes) == ["drop", "id", "id_out"]
    assert_equivalent(model, fixed)
    again, second = apply_pass(fixed, CleanupPass())
    assert not second.changed


def test_identity_from_input_to_output_kept_with_reason():
    model = make([helper.make_node("Identity", ["x"], ["out"], name="passthrough")])
    fixed, result = apply_pass(model, CleanupPass())
    assert ops(fixed) == ["Identity"]
    assert result.rejections and "graph output" in result.rejections[0].reason


def test_output_feeding_two_outputs_keeps_identity():
    model = make([
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Identity", ["a"], ["out"], name="id"),
    ], outputs=("out", "a"))
    fixed, result = apply_pass(model, CleanupPass())
    assert ops(fixed) == ["Relu", "Identity"]
    assert [o.name for o in fixed.graph.output] == ["out", "a"]


def test_dropout_with_used_mask_kept():
    model = make([
        helper.make_node("Dropout", ["x"], ["a", "mask"], name="drop"),
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Add", ["a", "m"], ["out"], name="add"),
    ])
    fixed, result = apply_pass(model, CleanupPass())
    assert "Dropout" in ops(fixed)
    assert "mask" in result.rejections[0].reason


def test_dead_nodes_and_unused_initializers_removed():
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    unused = numpy_helper.from_array(np.ones((5,), np.float32), "unused")
    model = make([
        helper.make_node("Add", ["x", "w"], ["out"], name="add"),
        helper.make_node("Exp", ["x"], ["dead1"], name="exp"),
        helper.make_node("Log", ["dead1"], ["dead2"], name="log"),
    ], inits=[w, unused])
    fixed, result = apply_pass(model, CleanupPass())
    assert ops(fixed) == ["Add"]
    assert [t.name for t in fixed.graph.initializer] == ["w"]
    assert {c.node for c in result.changes} == {"exp", "log", "unused"}
    assert_equivalent(model, fixed)
