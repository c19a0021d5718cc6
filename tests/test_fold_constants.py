"""Pass fold-constants: Shape chains become constants once shapes are static; limits respected."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import apply_pass, assert_equivalent, ops, prepared
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import set_input_shapes
from onnx_npu_fix.passes.fold_constants import FoldConstantsPass


def shape_chain_model(dims=(1, 4, 6)):
    idx = numpy_helper.from_array(np.array(2, np.int64), "idx")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    head = numpy_helper.from_array(np.array([1, -1], np.int64), "head")
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "idx"], ["t"], axis=0, name="gather"),
        helper.make_node("Unsqueeze", ["t", "axes"], ["t1"], name="unsqueeze"),
        helper.make_node("Concat", ["head", "t1"], ["target"], axis=0, name="concat"),
        helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
        helper.make_node("Relu", ["r"], ["out"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              [idx, axes, head])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_shape_chain_folds_and_output_shape_refreshed():
    model = shape_chain_model()
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert ops(fixed) == ["Reshape", "Relu"]
    folded = {c.node for c in result.changes if c.action == "folded to constant"}
    assert folded == {"shape", "gather", "unsqueeze", "concat"}
    target = [t for t in fixed.graph.initializer if t.name == fixed.graph.node[0].input[1]][0]
    assert numpy_helper.to_array(target).tolist() == [1, -1, 6]  # [1, -1] ++ [x.shape[2]]
    dims = [d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [1, 4, 6]  # the output had no declared shape; now it is static
    assert_equivalent(model, fixed)
    _, again = apply_pass(fixed, FoldConstantsPass())
    assert not again.changed


def test_dynamic_shape_is_not_folded_until_frozen():
    model = shape_chain_model(dims=(1, 4, "time"))
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert "Shape" in ops(fixed)
    set_input_shapes(model, {"x": (1, 4, 9)})
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert "Shape" not in ops(fixed)


def test_large_results_are_not_materialised():
    shape = numpy_helper.from_array(np.array([512, 1024], np.int64), "shape")
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"], name="cos",
                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0, name="sum"),
        helper.make_node("Add", ["x", "s"], ["out"], name="add"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    fixed, result = apply_pass(model, FoldConstantsPass(), large_tensor_bytes=1 << 20)
    assert "ConstantOfShape" in ops(fixed)  # 2 MiB of ones is not written into the model
    assert [(r.node, r.reason) for r in result.rejections] == [
        ("cos", "its constant result has 2097152 bytes, above --large-tensor 1048576")]
    fixed, result = apply_pass(model, FoldConstantsPass(), large_tensor_bytes=4 << 20)
    assert ops(fixed) == ["Add"]
    assert_equivalent(model, fixed)


def test_random_and_qdq_nodes_are_not_folded():
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    zp = numpy_helper.from_array(np.array(0, np.int8), "zp")
    wq = numpy_helper.from_array(np.array([1, 2], np.int8), "wq")
    nodes = [
        helper.make_node("DequantizeLinear", ["wq", "scale", "zp"], ["w"], name="dq"),
        helper.make_node("Add", ["x", "w"], ["out"], name="add"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])], [scale, zp, wq])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert ops(fixed) == ["DequantizeLinear", "Add"]
    assert not result.changed


def test_a_node_the_reference_evaluator_cannot_run_stays_with_the_reason(monkeypatch):
    """A failure of the evaluator is not swallowed: the node stays, and the rejection says why."""
    import onnx.reference

    def refuse(self, *args, **kwargs):
        raise NotImplementedError("no kernel")

    monkeypatch.setattr(onnx.reference.ReferenceEvaluator, "run", refuse)
    model = shape_chain_model()
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert "Gather" in ops(fixed)  # Shape folds without the evaluator; Gather needs it
    gather = next(r for r in result.rejections if r.node == "gather")
    assert gather.reason == "onnx's reference evaluator cannot evaluate it (NotImplementedError: no kernel)"



def test_find_only_reads_and_plans_the_whole_chain_in_one_round():
    from onnx_npu_fix.config.options import FixOptions
    from onnx_npu_fix.passes.fold_constants import FoldNode

    work = prepared(shape_chain_model())
    before = work.SerializeToString()
    found = FoldConstantsPass().find(work, FixOptions())
    assert work.SerializeToString() == before
    assert all(isinstance(p, FoldNode) for p in found.plans)
    assert [p.nodes[0] for p in found.plans] == ["shape", "gather", "unsqueeze", "concat"]
    assert found.plans[-1].values[0].tolist() == [1, -1, 6]  # propagated through find's own table


def test_rewrite_applies_only_the_plans_it_is_given():
    from onnx_npu_fix.config.options import FixOptions

    model = shape_chain_model()
    work = prepared(model)
    found = FoldConstantsPass().find(work, FixOptions())
    found.plans = found.plans[:1]  # fold only Shape: the Gather chain stays, reading the new constant
    result = FoldConstantsPass().rewrite(work, FixOptions(), found)
    assert [c.node for c in result.changes] == ["shape"]
    assert ops(work) == ["Gather", "Unsqueeze", "Concat", "Reshape", "Relu"]
    assert_equivalent(model, work)


def test_folded_pads_are_stored_typed_and_read_identically():
    """A folded shape-like integer tensor (here a Pad's pads) is stored in ``int64_data``, not raw bytes: rknn-
    toolkit2 2.5.0 writes into the pads it reads from raw bytes and crashes. onnx reads the typed form
    as the same values, onnxruntime computes the same outputs; a large integer result stays raw."""
    begin = helper.make_tensor("begin", TensorProto.INT64, [4], [0, 0, 1, 2])
    end = helper.make_tensor("end", TensorProto.INT64, [4], [0, 0, 3, 1])
    big = numpy_helper.from_array(np.arange(100, dtype=np.int64), "big")
    nodes = [helper.make_node("Concat", ["begin", "end"], ["pads"], name="cat", axis=0),
             helper.make_node("Pad", ["x", "pads"], ["padded"], name="pad"),
             helper.make_node("Relu", ["padded"], ["out"], name="relu"),
             helper.make_node("Neg", ["big"], ["big_neg"], name="neg"),
             helper.make_node("Gather", ["t", "big_neg"], ["picked"], name="gather")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5]),
                                           helper.make_tensor_value_info("t", TensorProto.FLOAT, [200])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("picked", TensorProto.FLOAT, None)], [begin, end, big])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    fixed, _ = apply_pass(model, FoldConstantsPass(), large_tensor_bytes=1 << 20)
    inits = {t.name: t for t in fixed.graph.initializer}
    pads = inits["pads"]
    assert not pads.raw_data and list(pads.int64_data) == [0, 0, 1, 2, 0, 0, 3, 1]
    assert numpy_helper.to_array(pads).dtype == np.int64 and list(pads.dims) == [8]
    assert inits["big_neg"].raw_data and not inits["big_neg"].int64_data  # 100 elements: not shape-like
    assert np.array_equal(numpy_helper.to_array(inits["big_neg"]), -np.arange(100))
    assert_equivalent(model, fixed)


def test_constant_read_by_an_initializer_inputs_op_is_stored_as_an_initializer(tmp_path):
    """k210's initializer_inputs (nncase 1.9 reads Unsqueeze's axes only from an initializer): fold-constants
    stores the Constant node an Unsqueeze reads as an initializer of the same name, which onnxruntime computes
    the same from; a Constant no listed op reads, and any Constant without the option, stay nodes."""
    const = [helper.make_node("Constant", [], [name], name=f"{name}_node",
                              value=numpy_helper.from_array(np.array([axis], np.int64)))
             for name, axis in (("axes_u", 1), ("axes_s", 1))]
    nodes = [*const, helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Unsqueeze", ["r", "axes_u"], ["u"], name="unsqueeze"),
             helper.make_node("Squeeze", ["u", "axes_s"], ["y"], name="squeeze")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    source = tmp_path / "in.onnx"
    onnx.save(model, source)
    result = api.fix(str(source), FixOptions(initializer_inputs=("Unsqueeze",)))
    assert result.ok
    left = [n.output[0] for n in result.model.graph.node if n.op_type == "Constant"]
    assert left == ["axes_s"] and "axes_u" in {t.name for t in result.model.graph.initializer}
    assert assert_equivalent(model, result.model).passed
    plain = api.fix(str(source), FixOptions())
    assert sum(n.op_type == "Constant" for n in plain.model.graph.node) == 2
