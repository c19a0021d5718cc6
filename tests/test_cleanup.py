"""Pass cleanup: Identity / Dropout / dead nodes / unused initializers; graph I/O names kept."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import apply_pass, assert_equivalent, ops, prepared
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.ir.graph import GraphIndex
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


# --- no-op ops: removed only when they provably return their input ------------------------------

def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def chain(op_node, inits=(), out_shape=(2, 3), in_shape=(2, 3), opset=17, elem=TensorProto.FLOAT):
    """x -> Relu -> op -> Sigmoid -> out (the op between two real ops, so removal is a rename)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), op_node,
             helper.make_node("Sigmoid", ["b"], ["out"], name="sig")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, list(in_shape))],
                              [helper.make_tensor_value_info("out", elem, list(out_shape))], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


NO_OPS = [
    pytest.param(helper.make_node("Pad", ["a", "p"], ["b"], name="op"), [_ints("p", [0, 0, 0, 0])], id="pad-zero"),
    pytest.param(helper.make_node("Pad", ["a", "p"], ["b"], name="op", mode="reflect"), [_ints("p", [0] * 4)],
                 id="pad-zero-reflect"),
    pytest.param(helper.make_node("Slice", ["a", "s", "e"], ["b"], name="op"),
                 [_ints("s", [0, 0]), _ints("e", [2, 3])], id="slice-full"),
    pytest.param(helper.make_node("Slice", ["a", "s", "e", "ax", "st"], ["b"], name="op"),
                 [_ints("s", [-3]), _ints("e", [2**63 - 1]), _ints("ax", [-1]), _ints("st", [1])],
                 id="slice-full-clamped"),
    pytest.param(helper.make_node("Reshape", ["a", "sh"], ["b"], name="op"), [_ints("sh", [2, -1])],
                 id="reshape-same"),
    pytest.param(helper.make_node("Transpose", ["a"], ["b"], name="op", perm=[0, 1]), [], id="transpose-id"),
    pytest.param(helper.make_node("Cast", ["a"], ["b"], name="op", to=TensorProto.FLOAT), [], id="cast-same"),
]

REAL_OPS = [
    pytest.param(helper.make_node("Pad", ["a", "p"], ["b"], name="op"), [_ints("p", [0, 0, 0, 1])], (2, 4),
                 id="pad-one"),
    pytest.param(helper.make_node("Slice", ["a", "s", "e"], ["b"], name="op"),
                 [_ints("s", [0, 0]), _ints("e", [2, 2])], (2, 2), id="slice-crop"),
    pytest.param(helper.make_node("Slice", ["a", "s", "e", "ax", "st"], ["b"], name="op"),
                 [_ints("s", [-1]), _ints("e", [-(2**63)]), _ints("ax", [1]), _ints("st", [-1])], (2, 3),
                 id="slice-reversed"),
    pytest.param(helper.make_node("Reshape", ["a", "sh"], ["b"], name="op"), [_ints("sh", [3, 2])], (3, 2),
                 id="reshape-other"),
    pytest.param(helper.make_node("Transpose", ["a"], ["b"], name="op", perm=[1, 0]), [], (3, 2), id="transpose"),
    pytest.param(helper.make_node("Transpose", ["a"], ["b"], name="op"), [], (3, 2), id="transpose-default"),
]


@pytest.mark.parametrize(("node", "inits"), NO_OPS)
def test_no_op_is_removed_and_reported(node, inits):
    model = chain(node, inits)
    fixed, result = apply_pass(model, CleanupPass())
    assert ops(fixed) == ["Relu", "Sigmoid"]
    (change,) = [c for c in result.changes if c.node == "op"]
    assert change.action == "removed no-op" and change.detail["why"]
    assert not fixed.graph.initializer  # the op's constants went with it
    assert [i.name for i in fixed.graph.input] == ["x"] and [o.name for o in fixed.graph.output] == ["out"]
    assert_equivalent(model, fixed)
    again, second = apply_pass(fixed, CleanupPass())
    assert not second.changed


@pytest.mark.parametrize(("node", "inits", "out_shape"), REAL_OPS)
def test_op_that_changes_something_stays(node, inits, out_shape):
    model = chain(node, inits, out_shape=out_shape)
    fixed, result = apply_pass(model, CleanupPass())
    assert ops(fixed) == ["Relu", node.op_type, "Sigmoid"]
    assert not result.changes and not result.rejections


def test_cast_to_another_type_and_dynamic_reshape_stay():
    cast = chain(helper.make_node("Cast", ["a"], ["b"], name="op", to=TensorProto.FLOAT16), out_shape=(2, 3))
    cast.graph.node[2].op_type = "Identity"  # float16 output: keep the graph valid without a Sigmoid
    cast.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    fixed, result = apply_pass(cast, CleanupPass())
    assert "Cast" in ops(fixed)
    # A Reshape whose shape is computed (not a constant) is kept even when it happens to be the identity.
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Shape", ["a"], ["sh"], name="shape"),
             helper.make_node("Reshape", ["a", "sh"], ["b"], name="op"),
             helper.make_node("Sigmoid", ["b"], ["out"], name="sig")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    fixed, _ = apply_pass(model, CleanupPass())
    assert "Reshape" in ops(fixed)


def test_no_op_chain_ending_at_a_graph_output_keeps_the_output_name():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Identity", ["a"], ["i1"], name="id"),
             helper.make_node("Transpose", ["i1"], ["i2"], name="tr", perm=[0, 1]),
             helper.make_node("Cast", ["i2"], ["out"], name="cast", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    fixed, result = apply_pass(model, CleanupPass())
    assert ops(fixed) == ["Relu"] and fixed.graph.node[0].output[0] == "out"
    assert sorted(c.node for c in result.changes) == ["cast", "id", "tr"]
    assert_equivalent(model, fixed)


def test_asteroid_zero_pad_goes_once_its_pads_are_constant(fixture_path):
    """The asteroid ConvTasNet export ends with pad_x_to_y: a Pad whose pads are all 0 at 8000 samples."""
    from onnx_npu_fix.config.options import FixOptions
    from onnx_npu_fix.passes.fold_constants import FoldConstantsPass
    from onnx_npu_fix.pipeline.scheduler import prepare

    model = onnx.load(fixture_path("torch_convtasnet.onnx"))
    prepare(model, FixOptions(input_shapes={"mix": (1, 8000)}))
    folded, _ = apply_pass(model, FoldConstantsPass())
    (pad,) = [n for n in folded.graph.node if n.op_type == "Pad"]
    assert not GraphIndex(folded).const_value(pad.input[1]).any()
    fixed, result = apply_pass(folded, CleanupPass())
    assert "Pad" not in ops(fixed)
    assert [c.detail["why"] for c in result.changes if c.op == "Pad"] == ["every pad is 0"]
    assert [o.name for o in fixed.graph.output] == [o.name for o in model.graph.output]
    assert_equivalent(folded, fixed)



def _removals_model():
    # Two independent pass-throughs, a dead branch and an initializer only the dead branch reads.
    return make([
        helper.make_node("Identity", ["x"], ["a"], name="id"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Transpose", ["b"], ["c"], name="noop_t", perm=[0, 1]),
        helper.make_node("Sigmoid", ["c"], ["out"], name="sig"),
        helper.make_node("Add", ["x", "w"], ["unused"], name="dead_add"),
    ], inits=[numpy_helper.from_array(np.ones((2, 3), np.float32), "w")])


def test_find_only_reads_and_plans_every_removal():
    from onnx_npu_fix.config.options import FixOptions
    from onnx_npu_fix.passes.cleanup import RemoveDeadNode, RemoveInitializer, RemovePassThrough

    work = prepared(_removals_model())
    before = work.SerializeToString()
    found = CleanupPass().find(work, FixOptions())
    assert work.SerializeToString() == before
    kinds = [(type(p), p.nodes) for p in found.plans]
    assert kinds == [(RemovePassThrough, ("id",)), (RemovePassThrough, ("noop_t",)),
                     (RemoveDeadNode, ("dead_add",)), (RemoveInitializer, ("w",))]
    assert found.plans[1].why == "perm [0, 1] is the identity"
    result = CleanupPass().rewrite(work, FixOptions(), found)
    assert [c.node for c in result.changes] == ["id", "noop_t", "dead_add", "w"]
    assert ops(work) == ["Relu", "Sigmoid"] and not work.graph.initializer


def test_rewrite_applies_only_the_plans_it_is_given():
    from onnx_npu_fix.config.options import FixOptions
    from onnx_npu_fix.passes.cleanup import RemoveDeadNode

    model = _removals_model()
    work = prepared(model)
    found = CleanupPass().find(work, FixOptions())
    found.plans = [p for p in found.plans if p.nodes in (("noop_t",),) or isinstance(p, RemoveDeadNode)]
    result = CleanupPass().rewrite(work, FixOptions(), found)
    assert [c.node for c in result.changes] == ["noop_t", "dead_add"]
    assert ops(work) == ["Identity", "Relu", "Sigmoid"]
    assert [t.name for t in work.graph.initializer] == ["w"]  # its plan was left out: it stays
    onnx.checker.check_model(work)
    assert_equivalent(model, work)
