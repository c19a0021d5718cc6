"""Control flow: fold-constants inlines If with a constant condition and unrolls bounded Loops; --freeze-input;
the control-flow constraint; and Silero VAD (a model shipped in a PyPI wheel) end to end."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import apply_pass, assert_equivalent, ops, run_model
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.cli import main
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints import check_model
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.ir.graph import set_input_shapes
from onnx_npu_fix.ir.subgraph import subgraphs
from onnx_npu_fix.passes.fold_constants import FoldConstantsPass
from onnx_npu_fix.pipeline.freeze import freeze_inputs, read_value

F = TensorProto.FLOAT
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def _vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _const_bool(name, value):
    return helper.make_node("Constant", [], [name], name=f"{name}_const",
                            value=numpy_helper.from_array(np.array(value), name))


def _all_ops(model):
    """Op types in every scope (the main graph and every subgraph)."""
    found = []

    def walk(graph):
        for node in graph.node:
            found.append(node.op_type)
            for g in subgraphs(node):
                walk(g)

    walk(model.graph)
    return found


def _rng(seed=0):
    return np.random.default_rng(seed)


# --- If ---------------------------------------------------------------------------------------------


def outer_scope_if(cond: bool | None):
    """y = If(c) then Relu(a) * w_then (a branch initializer) else Neg(a) + b, where a = x + 1 and b = x * 2 are
    outer tensors; the If output is a graph output. ``cond`` None: c is a graph input."""
    then_g = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["t_relu"], name="t_relu"),
         helper.make_node("Mul", ["t_relu", "w_then"], ["t_out"], name="t_mul")],
        "then", [], [_vi("t_out", [2, 3])],
        [numpy_helper.from_array(_rng().standard_normal((2, 3)).astype(np.float32), "w_then")])
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["a"], ["e_neg"], name="e_neg"),
         helper.make_node("Add", ["e_neg", "b"], ["e_out"], name="e_add")],
        "else", [], [_vi("e_out", [2, 3])])
    nodes = [helper.make_node("Add", ["x", "one"], ["a"], name="add_one"),
             helper.make_node("Mul", ["x", "two"], ["b"], name="mul_two")]
    inputs = [_vi("x", [2, 3])]
    if cond is None:
        inputs.append(_vi("c", [], TensorProto.BOOL))
    else:
        nodes.append(_const_bool("c", cond))
    nodes.append(helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then_g, else_branch=else_g))
    inits = [numpy_helper.from_array(np.array(1, np.float32), "one"),
             numpy_helper.from_array(np.array(2, np.float32), "two")]
    return _model(nodes, inputs, [_vi("y", [2, 3])], inits)


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_constant_condition_is_inlined_and_reads_outer_tensors(cond):
    model = outer_scope_if(cond)
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert "If" not in _all_ops(fixed)
    # b = x * 2 only served the else-branch: dead once the then-branch is chosen
    expected = ["Add", "Relu", "Mul"] if cond else ["Add", "Mul", "Neg", "Add"]
    assert ops(fixed) == expected
    assert [o.name for o in fixed.graph.output] == ["y"]  # the graph output keeps its name ...
    assert fixed.graph.node[-1].output[0] == "y"  # ... written by the branch's own last node (no Identity)
    assert [c.action for c in result.changes if c.node == "choose"] == [f"inlined {'then' if cond else 'else'}_branch"]
    assert result.metrics["control_flow"]["ifs_inlined"] == 1
    assert not result.rejections
    assert_equivalent(model, fixed)
    _, again = apply_pass(fixed, FoldConstantsPass())
    assert not again.changed


def test_if_on_a_graph_input_is_kept_with_the_input_that_would_fold_it():
    model = outer_scope_if(None)
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert "If" in ops(fixed)
    [rejection] = result.rejections
    assert rejection.node == "choose"
    assert "depends on graph input c" in rejection.reason and "--freeze-input c=<value>" in rejection.reason
    assert not rejection.blocking  # no target forbids control flow here
    _, blocked = apply_pass(model, FoldConstantsPass(), allow_control_flow=False)
    assert blocked.rejections[0].blocking


def branch_output_is_outer_tensor(graph_output: bool):
    """then-branch: Identity of the outer tensor a (what exporters emit for a branch that passes a value
    through); else: Neg(a). The If output feeds Relu (or is a graph output)."""
    then_g = helper.make_graph([helper.make_node("Identity", ["a"], ["t_id"], name="t_id")], "then", [],
                               [_vi("t_id", [2, 3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["a"], ["e"], name="e_neg")], "else", [], [_vi("e", [2, 3])])
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="double"), _const_bool("c", True),
             helper.make_node("If", ["c"], ["i"], name="choose", then_branch=then_g, else_branch=else_g)]
    outputs = [_vi("i", [2, 3])]
    if not graph_output:
        nodes.append(helper.make_node("Relu", ["i"], ["y"], name="relu"))
        outputs = [_vi("y", [2, 3])]
    return _model(nodes, [_vi("x", [2, 3])], outputs)


def test_branch_output_that_is_an_outer_tensor_is_aliased():
    model = branch_output_is_outer_tensor(graph_output=False)
    fixed, _ = apply_pass(model, FoldConstantsPass())
    assert ops(fixed) == ["Add", "Relu"]  # Relu reads a directly, no Identity
    assert fixed.graph.node[1].input[0] == "a"
    assert_equivalent(model, fixed)


def test_branch_output_that_is_an_outer_tensor_and_a_graph_output_gets_one_identity():
    # The graph output 'i' must keep its name, and its value is the outer tensor 'a', which is not produced inside
    # the branch: renaming Add's output to 'i' is what cleanup does when nothing else reads 'a' — so the Identity
    # fold-constants adds is removed again by the cleanup it runs after inlining.
    model = branch_output_is_outer_tensor(graph_output=True)
    fixed, _ = apply_pass(model, FoldConstantsPass())
    assert [o.name for o in fixed.graph.output] == ["i"]
    assert "If" not in ops(fixed)
    assert ops(fixed) == ["Add"] and fixed.graph.node[0].output[0] == "i"
    assert_equivalent(model, fixed)


def test_graph_output_fed_by_a_graph_input_through_a_branch_keeps_an_identity():
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t_id"], name="t_id")], "then", [],
                               [_vi("t_id", [2, 3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="e_neg")], "else", [], [_vi("e", [2, 3])])
    model = _model([_const_bool("c", True),
                    helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then_g, else_branch=else_g)],
                   [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    fixed, _ = apply_pass(model, FoldConstantsPass())
    # y = x: a graph output cannot take a graph input's name, so the one Identity is unavoidable.
    assert ops(fixed) == ["Identity"] and list(fixed.graph.node[0].input) == ["x"]
    assert [o.name for o in fixed.graph.output] == ["y"]
    assert_equivalent(model, fixed)


def test_branch_local_names_that_clash_are_derived_from_the_if_name():
    # Both branches define the tensor 'tmp', and the then-branch's node 'sum' shares the outer node's name: the
    # spliced ones become choose/tmp and choose/sum; names used once keep their names.
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["tmp"], name="sum"),
                                helper.make_node("Add", ["tmp", "tmp"], ["t_out"], name="t_add")],
                               "then", [], [_vi("t_out", [2, 3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["tmp"], name="e_neg"),
                                helper.make_node("Abs", ["tmp"], ["e_out"], name="e_abs")],
                               "else", [], [_vi("e_out", [2, 3])])
    nodes = [_const_bool("c", True),
             helper.make_node("If", ["c"], ["i"], name="choose", then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["i", "x"], ["y"], name="sum")]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    fixed, _ = apply_pass(model, FoldConstantsPass())
    produced = [o for n in fixed.graph.node for o in n.output]
    assert produced == ["choose/tmp", "i", "y"]  # t_out took the If's output name 'i'
    names = [n.name for n in fixed.graph.node]
    assert names == ["choose/sum", "t_add", "sum"]
    assert_equivalent(model, fixed)


def nested_if_model():
    """outer If (constant true) -> then: computes cond2 = (Shape(x)[1] == 3) and holds an inner If on it whose
    then-branch holds another If on a Constant; every branch reads x from two scopes up."""
    innermost_then = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["deep"], name="deep_sig")],
                                       "deep_then", [], [_vi("deep", [2, 3])])
    innermost_else = helper.make_graph([helper.make_node("Tanh", ["x"], ["deep_e"], name="deep_tanh")],
                                       "deep_else", [], [_vi("deep_e", [2, 3])])
    inner_then = helper.make_graph(
        [_const_bool("c3", False),
         helper.make_node("If", ["c3"], ["inner_if3"], name="third", then_branch=innermost_then,
                          else_branch=innermost_else),
         helper.make_node("Add", ["inner_if3", "x"], ["inner_t"], name="inner_add")],
        "inner_then", [], [_vi("inner_t", [2, 3])])
    inner_else = helper.make_graph([helper.make_node("Neg", ["x"], ["inner_e"], name="inner_neg")],
                                   "inner_else", [], [_vi("inner_e", [2, 3])])
    outer_then = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
         helper.make_node("Gather", ["shape", "idx1"], ["dim1"], name="gather", axis=0),
         helper.make_node("Equal", ["dim1", "three"], ["c2"], name="equal"),
         helper.make_node("If", ["c2"], ["inner"], name="second", then_branch=inner_then, else_branch=inner_else),
         helper.make_node("Mul", ["inner", "x"], ["outer_t"], name="outer_mul")],
        "outer_then", [], [_vi("outer_t", [2, 3])],
        [numpy_helper.from_array(np.array(1, np.int64), "idx1"),
         numpy_helper.from_array(np.array(3, np.int64), "three")])
    outer_else = helper.make_graph([helper.make_node("Abs", ["x"], ["outer_e"], name="outer_abs")],
                                   "outer_else", [], [_vi("outer_e", [2, 3])])
    nodes = [_const_bool("c1", True),
             helper.make_node("If", ["c1"], ["y"], name="first", then_branch=outer_then, else_branch=outer_else)]
    return _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def test_nested_ifs_fold_to_a_fixed_point():
    model = nested_if_model()
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert "If" not in _all_ops(fixed)
    assert ops(fixed) == ["Tanh", "Add", "Mul"]  # (tanh(x) + x) * x
    inlined = [(c.node, c.action) for c in result.changes if c.op == "If"]
    assert inlined == [("first", "inlined then_branch"), ("second", "inlined then_branch"),
                       ("third", "inlined else_branch")]
    assert_equivalent(model, fixed)
    x = _rng().standard_normal((2, 3)).astype(np.float32)
    [got] = run_model(fixed, [{"x": x}])
    np.testing.assert_allclose(got["y"], (np.tanh(x) + x) * x, rtol=1e-6)


def test_batchnorm_and_dilated_conv_inside_a_branch_are_fixed_by_the_later_passes():
    rng = _rng(3)
    w = rng.standard_normal((8, 8, 3)).astype(np.float32)
    bn = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in
          (("s", rng.uniform(0.5, 2, 8)), ("bias", rng.standard_normal(8)), ("m", rng.standard_normal(8)),
           ("v", rng.uniform(0.5, 2, 8)))]
    then_g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["conv"], name="dilated", dilations=[8], pads=[8, 8],
                          kernel_shape=[3]),
         helper.make_node("BatchNormalization", ["conv", "s", "bias", "m", "v"], ["t_out"], name="bn")],
        "then", [], [_vi("t_out", [1, 8, 64])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="e_neg")], "else", [],
                               [_vi("e", [1, 8, 64])])
    model = _model([helper.make_node("Equal", ["sr", "k16"], ["c"], name="is16k"),
                    helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then_g, else_branch=else_g)],
                   [_vi("x", [1, 8, 64]), _vi("sr", [], TensorProto.INT64)], [_vi("y", [1, 8, 64])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(16000, np.int64), "k16"),
                    *bn])
    work = onnx.ModelProto()
    work.CopyFrom(model)
    result = api.fix(work, FixOptions(max_dilation=4, freeze_inputs={"sr": "16000"}))
    assert result.ok, result.report.to_json()
    out = result.model
    assert not {"If", "BatchNormalization"} & set(_all_ops(out))
    assert all(max(a.ints) <= 4 for n in out.graph.node if n.op_type == "Conv" for a in n.attribute
               if a.name == "dilations")
    assert [i.name for i in out.graph.input] == ["x"]
    by_pass = {p.name: p for p in result.report.passes}
    assert by_pass["fold-batchnorm"].changes and by_pass["dilated-conv"].changes
    feeds = [{"x": rng.standard_normal((1, 8, 64)).astype(np.float32)} for _ in range(3)]
    ref = run_model(model, [{**f, "sr": np.array(16000, np.int64)} for f in feeds])
    got = run_model(out, feeds)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g["y"], r["y"], rtol=1e-4, atol=1e-4)
    assert result.report.frozen_inputs == {"sr": {"dtype": "int64", "shape": [], "value": 16000}}
    assert result.report.final is not None and result.report.final.passed


# --- Loop -------------------------------------------------------------------------------------------


def loop_model(trip=4, *, cond_from_data=False, trip_from_input=False, scan=True, opset=17):
    """acc_t = acc_{t-1} * 0.5 + x * i (x read from the outer scope), scan_t = acc_t + 1; body cond passed through
    (or computed from the data: ReduceSum(acc) < 100)."""
    body_nodes = [helper.make_node("Cast", ["i"], ["i_f"], name="cast", to=F),
                  helper.make_node("Mul", ["acc_in", "half"], ["acc_half"], name="halve"),
                  helper.make_node("Mul", ["x", "i_f"], ["x_i"], name="scale"),
                  helper.make_node("Add", ["acc_half", "x_i"], ["acc_out"], name="accumulate")]
    outputs = [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [2, 3])]
    if cond_from_data:
        body_nodes += [helper.make_node("ReduceSum", ["acc_out"], ["total"], name="total", keepdims=0),
                       helper.make_node("Less", ["total", "limit"], ["cond_out"], name="keep_going")]
    else:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"], name="pass_cond"))
    if scan:
        body_nodes.append(helper.make_node("Add", ["acc_out", "one"], ["scan_out"], name="plus_one"))
        outputs.append(_vi("scan_out", [2, 3]))
    body = helper.make_graph(body_nodes, "body",
                             [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL),
                              _vi("acc_in", [2, 3])], outputs)
    inits = [numpy_helper.from_array(np.array(True), "keep"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(1, np.float32), "one"),
             numpy_helper.from_array(np.array(100, np.float32), "limit"),
             numpy_helper.from_array(np.zeros((2, 3), np.float32), "acc0")]
    inputs = [_vi("x", [2, 3])]
    if trip_from_input:
        inputs.append(_vi("trip", [], TensorProto.INT64))
    else:
        inits.append(numpy_helper.from_array(np.array(trip, np.int64), "trip"))
    loop_outputs = ["acc", "scans"] if scan else ["acc"]
    nodes = [helper.make_node("Loop", ["trip", "keep", "acc0"], loop_outputs, name="loop", body=body),
             helper.make_node("Relu", ["acc"], ["y"], name="relu")]
    outputs = [_vi("y", [2, 3])] + ([_vi("scans", [trip, 2, 3])] if scan and not trip_from_input else
                                    [_vi("scans", ["n", 2, 3])] if scan else [])
    return _model(nodes, inputs, outputs, inits, opset=opset)


@pytest.mark.parametrize("opset", [11, 17])  # Unsqueeze's axes: an attribute before opset 13, an input after
def test_loop_with_constant_trip_count_is_unrolled_with_its_scan_output(opset):
    model = loop_model(4, opset=opset)
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert "Loop" not in _all_ops(fixed)
    assert ops(fixed).count("Unsqueeze") == 4 and ops(fixed).count("Concat") == 1
    [change] = [c for c in result.changes if c.op == "Loop"]
    assert change.action == "unrolled" and change.new["trip_count"] == 4
    metrics = result.metrics["control_flow"]
    assert metrics["loops_unrolled"] == 1 and metrics["max_trip_count"] == 64 and metrics["max_unrolled_nodes"] == 4096
    assert [o.name for o in fixed.graph.output] == ["y", "scans"]
    assert_equivalent(model, fixed)
    x = _rng(1).standard_normal((2, 3)).astype(np.float32)
    acc, scans = np.zeros((2, 3), np.float32), []
    for i in range(4):
        acc = acc * 0.5 + x * i
        scans.append(acc + 1)
    [got] = run_model(fixed, [{"x": x}])
    np.testing.assert_allclose(got["scans"], np.stack(scans), rtol=1e-6)
    np.testing.assert_allclose(got["y"], np.maximum(acc, 0), rtol=1e-6)


def test_loop_of_one_iteration_and_without_scan_outputs():
    for trip, scan in ((1, True), (3, False)):
        model = loop_model(trip, scan=scan)
        fixed, _ = apply_pass(model, FoldConstantsPass())
        assert "Loop" not in ops(fixed)
        assert_equivalent(model, fixed)


@pytest.mark.parametrize(("kwargs", "phrase"), [
    ({"cond_from_data": True}, "its body computes the loop condition"),
    ({"trip_from_input": True}, "--freeze-input trip=<value>"),
    ({"trip": 65}, "above the unroll bound (trip count <= 64"),
])
def test_loops_that_are_not_unrolled_say_why(kwargs, phrase):
    model = loop_model(**kwargs)
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert "Loop" in ops(fixed)
    [rejection] = result.rejections
    assert rejection.node == "loop" and phrase in rejection.reason, rejection.reason


def test_hostile_corpus_loop_with_a_nested_if_unrolls_completely():
    """The hostile corpus's Loop (3 iterations, a Dropout and a nested If on i < 1, reading outer tensors two
    scopes up): unrolled, the nested Ifs fold per iteration, and cleanup's leftovers go."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "hostile"))
    from build_hostile import loop_subgraph

    model = loop_subgraph(np.random.default_rng(0))
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert not {"Loop", "If", "Identity", "Dropout"} & set(_all_ops(fixed))
    assert result.metrics["control_flow"]["ifs_inlined"] == 3
    assert_equivalent(model, fixed)


# --- --freeze-input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("16000", 16000), ("0.5", 0.5), ("true", True), ("1,2,3", [1, 2, 3]), ("[[1,2],[3,4]]", [[1, 2], [3, 4]])])
def test_freeze_values_are_read(text, expected):
    assert read_value("v", text).tolist() == expected


def test_freeze_value_from_an_npy_file(tmp_path):
    path = tmp_path / "x.npy"
    value = _rng().standard_normal((2, 3)).astype(np.float32)
    np.save(path, value)
    model = outer_scope_if(None)
    frozen = freeze_inputs(model, {"x": str(path)})
    assert [i.name for i in model.graph.input] == ["c"]
    assert np.array_equal(numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "x")), value)
    assert frozen["x"].to_json() == {"dtype": "float32", "shape": [2, 3], "value": value.tolist()}
    big = _model([helper.make_node("Relu", ["z"], ["y"], name="relu")], [_vi("z", [4, 8])], [_vi("y", [4, 8])])
    np.save(path, np.ones((4, 8)))
    record = freeze_inputs(big, {"z": str(path)})["z"].to_json()
    assert record["dtype"] == "float32" and record["shape"] == [4, 8] and len(record["sha256"]) == 64


@pytest.mark.parametrize(("values", "phrase"), [
    ({"nope": "1"}, "'nope', which is not a graph input (inputs: x, c)"),
    ({"x": "1,2,3"}, "the value has shape [3], the input is declared [2,3]"),
    ({"c": "2"}, "the input is bool"),
    ({"x": "abc"}, "cannot read 'abc'"),
])
def test_bad_freeze_values_are_input_errors(values, phrase):
    with pytest.raises(InputError, match=None) as info:
        freeze_inputs(outer_scope_if(None), values)
    assert phrase in str(info.value)


def test_integer_input_refuses_fractions_and_out_of_range():
    model = _model([helper.make_node("Cast", ["n"], ["y"], name="cast", to=F)], [_vi("n", [], TensorProto.UINT8)],
                   [_vi("y", [])])
    for text, phrase in (("1.5", "not whole numbers"), ("300", "outside the range of uint8")):
        with pytest.raises(InputError) as info:
            freeze_inputs(model, {"n": text})
        assert phrase in str(info.value)


def test_cli_freeze_input_folds_the_if_and_records_the_change(tmp_path):
    src, out, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    model = outer_scope_if(None)
    onnx.save(model, src)
    result = CliRunner().invoke(main, [str(src), "-o", str(out), "--freeze-input", "c=false", "--report", str(report)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "frozen input c = False (bool []): the model no longer takes it" in result.output
    record = json.loads(report.read_text())
    assert record["frozen_inputs"] == {"c": {"dtype": "bool", "shape": [], "value": False}}
    assert record["options"]["freeze_inputs"] == {"c": "false"}
    assert record["final_validation"]["passed"]
    fixed = onnx.load(str(out))
    assert [i.name for i in fixed.graph.input] == ["x"] and "If" not in ops(fixed)
    # The written model is the original run with c = false.
    feeds = [{"x": _rng(s).standard_normal((2, 3)).astype(np.float32)} for s in range(3)]
    ref = run_model(model, [{**f, "c": np.array(False)} for f in feeds])
    for r, g in zip(ref, run_model(fixed, feeds)):
        np.testing.assert_allclose(g["y"], r["y"], rtol=1e-6)


@pytest.mark.parametrize(("spec", "phrase"), [
    ("c", "is not NAME=VALUE"), ("k=1", "not a graph input"), ("x=1,2", "the input is declared [2,3]")])
def test_cli_bad_freeze_input_is_a_one_line_usage_error(tmp_path, spec, phrase):
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(outer_scope_if(None), src)
    result = CliRunner().invoke(main, [str(src), "-o", str(out), "--freeze-input", spec], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert phrase in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_validation_compares_with_the_original_fed_the_frozen_value():
    """With a reference started from the original file (the CLI's path), the frozen value is fed to it: freezing
    c = true but feeding the reference its own random c would make the comparison fail half the time."""
    model = outer_scope_if(None)
    data = model.SerializeToString()
    for value in ("true", "false"):
        work = onnx.ModelProto()
        work.ParseFromString(data)
        reference = api.Reference(data)
        try:
            result = api.fix(work, FixOptions(freeze_inputs={"c": value}, n_inputs=4), reference=reference)
        finally:
            reference.close()
        assert result.ok and result.report.final is not None and result.report.final.passed


# --- the control-flow constraint --------------------------------------------------------------------


def test_check_names_control_flow_with_the_input_that_would_fold_it():
    options = FixOptions(allow_control_flow=False)
    [violation] = [v for v in check_model(outer_scope_if(None), options).violations if v.constraint == "control-flow"]
    assert violation.node == "choose" and violation.fixed_by == "--freeze-input c=<value>"
    assert "fixed by --freeze-input c=<value>" in violation.text()
    [constant] = [v for v in check_model(outer_scope_if(True), options).violations if v.constraint == "control-flow"]
    assert constant.fixed_by == "fold-constants"
    [loop] = [v for v in check_model(loop_model(cond_from_data=True), options).violations
              if v.constraint == "control-flow"]
    assert loop.fixed_by is None and "depends on data" in loop.message
    # Not a constraint unless a target or option asks for it.
    assert not [v for v in check_model(outer_scope_if(None), FixOptions()).violations if v.constraint == "control-flow"]


# --- Silero VAD (MIT, from the silero-vad wheel: fixtures/fetch_silero_vad.py) -----------------------

SILERO = os.path.join(FIXTURES, "silero_vad.onnx")
SILERO_SHAPES = ("--input-shape", "input:1,512", "--input-shape", "state:2,1,128")


def _speech_like_chunks(n: int) -> list[np.ndarray]:
    """Consecutive 512-sample chunks of 16 kHz audio in [-1, 1]: a 220 Hz tone with harmonics switched on and off
    (speech-like bursts), plus low noise."""
    rng = np.random.default_rng(16000)
    t = np.arange(512 * n) / 16000.0
    envelope = (np.sin(2 * np.pi * 1.5 * t) > 0).astype(np.float64)
    voice = sum(np.sin(2 * np.pi * 220 * k * t) / k for k in (1, 2, 3))
    audio = 0.3 * envelope * voice + 0.01 * rng.standard_normal(t.shape)
    audio = np.clip(audio, -1, 1).astype(np.float32)
    return [audio[i * 512:(i + 1) * 512][None, :] for i in range(n)]


def _stream(model: onnx.ModelProto, chunks, sr: int | None):
    """Run the VAD over consecutive chunks, feeding the state back as an application does."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), np.float32)
    probabilities = []
    for chunk in chunks:
        feeds = {"input": chunk, "state": state}
        if sr is not None:
            feeds["sr"] = np.array(sr, np.int64)
        prob, state = session.run(["output", "stateN"], feeds)
        probabilities.append(prob)
    return np.concatenate(probabilities), state


@pytest.fixture(scope="module")
def silero_fixed(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("silero")
    out, report = out_dir / "silero_16k.onnx", out_dir / "r.json"
    result = CliRunner().invoke(main, [SILERO, "-o", str(out), "--freeze-input", "sr=16000", *SILERO_SHAPES,
                                       "--target", "tidl", "--report", str(report)], catch_exceptions=False)
    return result, out, json.loads(report.read_text())


def test_silero_with_sr_frozen_has_no_if_and_the_target_check_is_clean(silero_fixed):
    result, out, record = silero_fixed
    assert result.exit_code == 0, result.output
    fixed = onnx.load(str(out))
    assert not {"If", "Loop", "Scan"} & set(_all_ops(fixed))
    assert [i.name for i in fixed.graph.input] == ["input", "state"]
    assert [o.name for o in fixed.graph.output] == ["output", "stateN"]
    assert record["frozen_inputs"] == {"sr": {"dtype": "int64", "shape": [], "value": 16000}}
    assert record["violations"] == [] and record["final_validation"]["passed"]
    fold = next(p for p in record["passes"] if p["name"] == "fold-constants")
    assert fold["metrics"]["control_flow"]["ifs_inlined"] >= 7 and not fold["rejections"]
    check = CliRunner().invoke(main, [str(out), "--check", "--target", "tidl"], catch_exceptions=False)
    assert check.exit_code == 0, check.output


def test_silero_outputs_equal_the_originals_at_16k_on_streamed_audio(silero_fixed):
    _, out, _ = silero_fixed
    chunks = _speech_like_chunks(24)
    ref_prob, ref_state = _stream(onnx.load(SILERO), chunks, sr=16000)
    got_prob, got_state = _stream(onnx.load(str(out)), chunks, sr=None)
    assert ref_prob.max() - ref_prob.min() > 0.1  # the audio moves the detector: the comparison means something
    np.testing.assert_allclose(got_prob, ref_prob, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_state, ref_state, rtol=1e-4, atol=1e-5)


def test_silero_check_names_the_if_and_the_input_that_folds_it():
    result = CliRunner().invoke(main, [SILERO, "--check", "--target", "stm32n6", *SILERO_SHAPES],
                                catch_exceptions=False)
    assert result.exit_code == 1
    assert "If_0 (If): control-flow: If vs no control flow -> fixed by --freeze-input sr=<value>" in result.output
    # Its outputs' unknown shapes (what the issue saw as "no pass fixes this") point to the same fix.
    assert "If_0 (If): unknown-shape: [unk__50,1] vs static -> fixed by --freeze-input sr=<value>" in result.output
    # So do the Identity nodes that carry its outputs to the graph outputs (cleanup cannot rename an If's output).
    assert ("Introduce_0_id0 (Identity): leftover-op: present vs removed -> fixed by --freeze-input sr=<value>"
            in result.output)


# --- random nests of Ifs -------------------------------------------------------------------------------


def random_if_model(seed: int) -> onnx.ModelProto:
    """Random nests of Ifs (up to 3 deep) over [2,3] floats: every scope computes a few elementwise ops on tensors
    of any enclosing scope, some Ifs read a graph input (they stay), the rest a Constant; sibling branches often
    reuse the same local names (as exporters do), and branch outputs are Identity of enclosing tensors half the
    time."""
    rng = np.random.default_rng(seed)
    unary = ("Relu", "Neg", "Sigmoid", "Tanh", "Abs")

    def scope(prefix: str, available: list[str], depth: int, n_out: int):
        nodes, local = [], list(available)
        for i in range(int(rng.integers(2, 5))):
            name = f"{prefix}n{i}"
            kind = int(rng.choice(3, p=[0.45, 0.25, 0.3])) if depth < 3 else int(rng.integers(1, 3))
            if kind == 0:
                n = int(rng.integers(1, 3))
                then_nodes, then_outs = scope(f"{name}t_", local, depth + 1, n)
                else_prefix = f"{name}t_" if rng.random() < 0.5 else f"{name}e_"  # same local names, or not
                else_nodes, else_outs = scope(else_prefix, local, depth + 1, n)
                if rng.random() < 0.25:
                    cond = "g"
                else:
                    cond = f"{name}c"
                    nodes.append(_const_bool(cond, bool(rng.random() < 0.5)))
                outs = [f"{name}o{k}" for k in range(n)]
                nodes.append(helper.make_node(
                    "If", [cond], outs, name=name,
                    then_branch=helper.make_graph(then_nodes, f"{name}_then", [], [_vi(o, [2, 3]) for o in then_outs]),
                    else_branch=helper.make_graph(else_nodes, f"{name}_else", [], [_vi(o, [2, 3]) for o in else_outs])))
                local += outs
            elif kind == 1:
                op = unary[int(rng.integers(len(unary)))]
                nodes.append(helper.make_node(op, [str(rng.choice(local))], [name], name=name))
                local.append(name)
            else:
                a, b = (str(v) for v in rng.choice(local, 2))
                nodes.append(helper.make_node("Add" if rng.random() < 0.5 else "Mul", [a, b], [name], name=name))
                local.append(name)
        outs = []
        for k in range(n_out):
            src, out = str(rng.choice(local)), f"{prefix}out{k}"
            op = "Identity" if rng.random() < 0.5 else "Tanh"
            nodes.append(helper.make_node(op, [src], [out], name=out))
            outs.append(out)
        return nodes, outs

    nodes, outs = scope("m_", ["x"], 0, 2)
    return _model(nodes, [_vi("x", [2, 3]), _vi("g", [], TensorProto.BOOL)], [_vi(o, [2, 3]) for o in outs])


@pytest.mark.parametrize("seed", range(40))
def test_random_if_nests_fold_exactly(seed):
    model = random_if_model(seed)
    fixed, result = apply_pass(model, FoldConstantsPass())
    # What is left: only Ifs on the graph input g (inside them nothing is touched).
    assert all(n.input[0] == "g" for n in fixed.graph.node if n.op_type == "If")
    kept = {n.name for n in fixed.graph.node if n.op_type == "If"}
    assert {r.node for r in result.rejections if r.op == "If"} == kept
    produced = [o for n in fixed.graph.node for o in n.output]
    assert len(produced) == len(set(produced))
    assert [o.name for o in fixed.graph.output] == [o.name for o in model.graph.output]
    feeds = [{"x": np.random.default_rng(seed * 10 + k).standard_normal((2, 3)).astype(np.float32),
              "g": np.array(bool(k % 2))} for k in range(4)]
    assert_equivalent(model, fixed, feeds=feeds)
    _, again = apply_pass(fixed, FoldConstantsPass())
    assert not [c for c in again.changes if c.op == "If"]


def test_loop_inside_the_chosen_branch_is_unrolled_after_inlining():
    inner = loop_model(3, scan=False)
    loop = next(n for n in inner.graph.node if n.op_type == "Loop")
    then_g = helper.make_graph([loop, helper.make_node("Sigmoid", ["acc"], ["t_out"], name="t_sig")], "then", [],
                               [_vi("t_out", [2, 3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="e_neg")], "else", [], [_vi("e", [2, 3])])
    model = _model([_const_bool("c", True),
                    helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then_g, else_branch=else_g)],
                   [_vi("x", [2, 3])], [_vi("y", [2, 3])], list(inner.graph.initializer))
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert not {"If", "Loop"} & set(_all_ops(fixed))
    assert [c.op for c in result.changes if c.op in ("If", "Loop")] == ["If", "Loop"]
    assert_equivalent(model, fixed)


def test_check_of_a_condition_computed_from_constants_points_to_fold_constants():
    """Before any pass has run (--check), Equal(Constant, Constant) is not a constant yet, but folding makes it one;
    a condition from a random op is data."""
    model = outer_scope_if(None)
    graph = model.graph
    del graph.input[1]
    graph.node.insert(0, helper.make_node("Equal", ["two", "two"], ["c"], name="always"))
    [violation] = [v for v in check_model(model, FixOptions(allow_control_flow=False)).violations
                   if v.constraint == "control-flow"]
    assert violation.fixed_by == "fold-constants" and "computed from constants only" in violation.message
    fixed, _ = apply_pass(model, FoldConstantsPass())
    assert "If" not in ops(fixed)
    graph.node[0].CopyFrom(helper.make_node("RandomUniform", [], ["u"], name="coin", shape=[1]))
    graph.node.insert(1, helper.make_node("Less", ["u", "half"], ["c"], name="flip"))
    graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    [violation] = [v for v in check_model(model, FixOptions(allow_control_flow=False)).violations
                   if v.constraint == "control-flow"]
    assert violation.fixed_by is None and "depends on data computed in the graph" in violation.message


def test_a_rollback_to_the_input_freezes_it_again(tmp_path):
    """keep_going after a failing first pass restores the model by reading the input again: frozen again too, so
    the passes after it see the frozen model and validation still feeds the original the frozen value."""
    from onnx_npu_fix.passes.base import Change, Pass, PassResult

    class Break(Pass):
        name = "break"
        summary = "test pass that changes the outputs"

        def run(self, model, options):
            for t in model.graph.initializer:
                if t.name == "one":
                    t.CopyFrom(numpy_helper.from_array(np.array(5, np.float32), "one"))
            return PassResult(changes=[Change("one", "initializer", "changed")])

    path = tmp_path / "m.onnx"
    onnx.save(outer_scope_if(None), path)
    model = api.load_model(path)
    result = api.fix(model, FixOptions(freeze_inputs={"c": "true"}, keep_going=True), [Break(), FoldConstantsPass()],
                     source=path)
    assert [p.status for p in result.report.passes] == ["rolled back", "validated"]
    assert result.ok and result.report.final.passed
    assert [i.name for i in result.model.graph.input] == ["x"] and "If" not in ops(result.model)


def test_branch_output_that_is_a_branch_initializer():
    """then-branch returns its own initializer (no node): it moves to the main graph, and the graph output keeps
    its name through one Identity (an initializer is not a computed tensor)."""
    k = np.arange(6, dtype=np.float32).reshape(2, 3)
    then_g = helper.make_graph([], "then", [], [_vi("k_branch", [2, 3])], [numpy_helper.from_array(k, "k_branch")])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="e_neg")], "else", [], [_vi("e", [2, 3])])
    model = _model([_const_bool("c", True),
                    helper.make_node("If", ["c"], ["i"], name="choose", then_branch=then_g, else_branch=else_g),
                    helper.make_node("Add", ["i", "x"], ["y"], name="add")],
                   [_vi("x", [2, 3])], [_vi("y", [2, 3]), _vi("i", [2, 3])])
    fixed, _ = apply_pass(model, FoldConstantsPass())
    assert ops(fixed) == ["Identity", "Add"] and list(fixed.graph.node[0].input) == ["k_branch"]
    assert [o.name for o in fixed.graph.output] == ["y", "i"]
    assert_equivalent(model, fixed)


def test_loop_that_runs_zero_times_returns_its_initial_values():
    model = loop_model(0, scan=False)
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert "Loop" not in ops(fixed)
    assert_equivalent(model, fixed)
    with_scan = loop_model(0, scan=True)
    _, refused = apply_pass(with_scan, FoldConstantsPass())
    assert "runs 0 times and has scan outputs" in refused.rejections[0].reason


def test_a_condition_from_a_dynamic_shape_points_to_input_shape():
    """cond = Shape(x)[1] == 3 on x [2, T]: the shape decides it, so --input-shape folds it (and does, in the pass)."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="t_relu")], "then", [],
                               [_vi("t", [2, "T"])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="e_neg")], "else", [], [_vi("e", [2, "T"])])
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "idx"], ["t_len"], name="gather", axis=0),
             helper.make_node("Equal", ["t_len", "three"], ["c"], name="is3"),
             helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then_g, else_branch=else_g)]
    inits = [numpy_helper.from_array(np.array(1, np.int64), "idx"),
             numpy_helper.from_array(np.array(3, np.int64), "three")]
    model = _model(nodes, [_vi("x", [2, "T"])], [_vi("y", [2, "T"])], inits)
    [violation] = [v for v in check_model(model, FixOptions(allow_control_flow=False)).violations
                   if v.constraint == "control-flow"]
    assert violation.fixed_by == "--input-shape x:<dims>" and "the shape of x" in violation.message
    _, result = apply_pass(model, FoldConstantsPass())
    assert "--input-shape x:<dims>" in result.rejections[0].reason
    for length, kept in ((3, "Relu"), (5, "Neg")):
        frozen = onnx.ModelProto()
        frozen.CopyFrom(model)
        set_input_shapes(frozen, {"x": (2, length)})
        fixed, _ = apply_pass(frozen, FoldConstantsPass())
        assert ops(fixed) == [kept]
        assert_equivalent(frozen, fixed)


def test_the_unroll_budget_holds_for_the_whole_pass():
    """Two Loops of 60 x 40 body nodes: each is under the per-Loop bound (2400 <= 4096), together they are not
    (nested Loops would multiply), so the second stays, saying the budget is spent."""
    def loop(name, src, dst):
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="pass_cond")]
            + [helper.make_node("Relu", [f"v{k}" if k else "acc_in"], [f"v{k + 1}" if k < 38 else "acc_out"],
                                name=f"relu{k}") for k in range(39)],
            "body", [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("acc_in", [2, 3])],
            [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [2, 3])])
        return helper.make_node("Loop", ["trip", "", src], [dst], name=name, body=body)

    model = _model([loop("first", "x", "a"), loop("second", "a", "y")], [_vi("x", [2, 3])], [_vi("y", [2, 3])],
                   [numpy_helper.from_array(np.array(60, np.int64), "trip")])
    fixed, result = apply_pass(model, FoldConstantsPass())
    assert [n.name for n in fixed.graph.node if n.op_type == "Loop"] == ["second"]
    [rejection] = [r for r in result.rejections if r.op == "Loop"]
    # 60 copies of the 39 Relus were written (the condition's Identity is an alias, not a node).
    assert "budget of 4096 unrolled nodes (2340 used" in rejection.reason
    assert_equivalent(model, fixed)


def test_cost_counts_the_nodes_and_weights_inside_branches():
    """Before the fix the branches hold nodes and weights too: the cost table must not show them appearing
    from nothing once fold-constants inlines the chosen branch."""
    from onnx_npu_fix.analysis.cost import model_cost
    from onnx_npu_fix.ir.graph import infer_shapes

    model = outer_scope_if(None)
    infer_shapes(model)
    cost = model_cost(model)
    assert cost.ops == {"Add": 2, "Mul": 2, "If": 1, "Relu": 1, "Neg": 1}
    assert cost.weight_bytes == 4 + 4 + 2 * 3 * 4  # one, two, and the then-branch's w_then


def test_find_plans_an_if_whose_condition_its_own_folds_decide_and_only_reads():
    from onnx_npu_fix.ir.graph import infer_shapes
    from onnx_npu_fix.passes.fold_constants import FoldConstantsPass, FoldNode, InlineIf

    vi = helper.make_tensor_value_info
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")], "then", [],
                             [vi("t", TensorProto.FLOAT, [1, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [],
                              [vi("e", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("Not", ["c0"], ["c"], name="not"),
             helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [1, 4])], [vi("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(np.array(False), "c0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    infer_shapes(model)
    before = model.SerializeToString()
    found = FoldConstantsPass().find(model, FixOptions())
    assert model.SerializeToString() == before
    assert [(type(p), p.nodes) for p in found.plans] == [(FoldNode, ("not",)), (InlineIf, ("branch",))]
    assert found.plans[1].branch == "then_branch"  # Not(False): decided by the fold in the same find
    FoldConstantsPass().rewrite(model, FixOptions(), found)
    assert ops(model) == ["Relu"]
