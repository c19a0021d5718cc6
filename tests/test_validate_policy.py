"""Validation policy: no run ends "fine" with nothing validated, invalid models are caught at load,
the reference comes from the bytes read, real validation data, measured approximations and --strict."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import conv_bn_relu
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.cli import main
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import InputError, StrictRefused
from onnx_npu_fix.passes.resize_nearest import ResizeNearestPass
from onnx_npu_fix.pipeline.inputs import (
    APPROX_MIN_ELEMENTS,
    load_validation_data,
    make_inputs,
    parse_input_ranges,
    shape_inputs,
    validation_feeds,
)
from onnx_npu_fix.pipeline.scheduler import prepare, run_passes


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _conv_model(*, weight_shape=(8, 4, 3, 3), group=1, bias=8, channels=4):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(weight_shape).astype(np.float32), "w")]
    inputs = ["x", "w"]
    if bias is not None:
        inits.append(numpy_helper.from_array(np.zeros(bias, np.float32), "b"))
        inputs.append("b")
    conv = helper.make_node("Conv", inputs, ["y"], name="conv", group=group, pads=[1, 1, 1, 1])
    relu = helper.make_node("Relu", ["y"], ["out"], name="relu")
    return _model([conv, relu], [_vi("x", [1, channels, 8, 8])], [_vi("out", [1, weight_shape[0], 8, 8])], inits)


def _save(model, path):
    onnx.save(model, str(path))
    return path


def _relu_reshape_model():
    """x [2,6] -> Identity -> Relu -> Reshape(target = the int64 graph input 'shape') -> out: a shape set by an
    input (its output shape is data-dependent, hence the dynamic-shape finding of a fixing run)."""
    nodes = [helper.make_node("Identity", ["x"], ["xi"], name="id"),
             helper.make_node("Relu", ["xi"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["out"], name="reshape")]
    return _model(nodes, [_vi("x", [2, 6]), _vi("shape", [2], TensorProto.INT64)], [_vi("out", ["a", "b"])])


def _resize_model(n_in=4, n_out=7, scales=None, mode="linear"):
    """A linear Resize of x [1,1,1,n_in] to n_out elements (or by constant ``scales``)."""
    if scales is not None:
        inits = [numpy_helper.from_array(np.array(scales, np.float32), "scales")]
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode=mode)
        out_shape = ["n", "c", "h", "w"]
    else:
        inits = [numpy_helper.from_array(np.array([1, 1, 1, n_out], np.int64), "sizes")]
        node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="up", mode=mode)
        out_shape = [1, 1, 1, n_out]
    return _model([node], [_vi("x", [1, 1, 1, n_in])], [_vi("y", out_shape)], inits, opset=13)


# --- 1. an original onnxruntime cannot run, and invalid models -----------------------------------------------


@pytest.mark.parametrize("kwargs,phrase", [
    (dict(bias=5), "bias b has shape [5], expected [8]"),
    (dict(weight_shape=(8, 4, 3, 3), group=2, channels=4), "input x has 4 channels, but weight w"),
    (dict(weight_shape=(6, 2, 3, 3), group=4, channels=8, bias=6), "6 filters, not a multiple of group 4"),
])
def test_conv_the_checker_accepts_but_no_runtime_runs_is_refused_at_load(tmp_path, kwargs, phrase):
    model = _conv_model(**kwargs)
    onnx.checker.check_model(model)  # the checker alone does not see it
    path = _save(model, tmp_path / "bad.onnx")
    with pytest.raises(InputError, match="Conv 'conv'"):
        api.read_model(path)
    result = invoke(path, "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2, result.output
    assert phrase in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "o.onnx").exists()
    assert invoke(path, "--check").exit_code == 2  # read_model refuses it in check mode too


def test_resize_scale_zero_is_refused_at_load(tmp_path):
    path = _save(_resize_model(scales=[1, 1, 0, 2]), tmp_path / "r.onnx")
    result = invoke(path, "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2
    assert "Resize 'up': scales [1.0, 1.0, 0.0, 2.0] must all be finite and > 0" in result.output


def test_gemm_bias_that_does_not_broadcast_is_refused_at_load(tmp_path):
    def gemm(bias_shape):
        inits = [numpy_helper.from_array(np.ones((2, 4), np.float32), "w"),
                 numpy_helper.from_array(np.ones(bias_shape, np.float32), "b")]
        return _model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc")], [_vi("x", [3, 2])],
                      [_vi("y", [3, 4])], inits)
    for good in ((4,), (1,), (3, 4), (1, 4), (3, 1)):
        api.read_model(_save(gemm(good), tmp_path / "ok.onnx"))
    path = _save(gemm((3,)), tmp_path / "bad.onnx")
    result = invoke(path, "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2
    assert "Gemm 'fc': bias b has shape [3], which does not broadcast to the output [3, 4]" in result.output


def test_valid_conv_passes_the_load_checks(tmp_path):
    for kwargs in (dict(), dict(weight_shape=(8, 1, 3, 3), group=4, channels=4), dict(bias=None)):
        api.read_model(_save(_conv_model(**kwargs), tmp_path / "ok.onnx"))


def test_bilinear_resize_on_the_batch_axis_stops_with_exit_2(tmp_path):
    # Valid ONNX; onnxruntime's linear Resize only interpolates the inner axes, so the original cannot run.
    model = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="linear")],
                   [_vi("x", [1, 2, 4, 4])], [_vi("y", [2, 2, 8, 8])],
                   [numpy_helper.from_array(np.array([2, 1, 2, 2], np.float32), "scales")], opset=13)
    path = _save(model, tmp_path / "m.onnx")
    result = invoke(path, "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2, result.output
    assert "onnxruntime cannot run the original model" in result.output
    assert "--validate none" in result.output
    assert not (tmp_path / "o.onnx").exists()


def test_validate_none_writes_and_says_so_last_and_in_the_record(tmp_path):
    model = _conv_model()
    model.graph.node[1].domain = "com.example"  # a custom op: onnxruntime cannot run it
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    path = _save(model, tmp_path / "m.onnx")
    assert invoke(path, "-o", tmp_path / "o.onnx").exit_code == 2
    result = invoke(path, "-o", tmp_path / "o.onnx", "--validate", "none", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].startswith("validation: none (requested)")
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["validation_note"].startswith("validation: none (requested)")
    assert record["final_validation"] is None


# --- 2. the reference comes from the bytes read ---------------------------------------------------------------


def _fix_with_reference(path, change_file=None):
    loaded = api.read_model(path, keep_bytes=True)
    assert loaded.data is not None
    if change_file is not None:
        change_file(path)  # e.g. the next CI step's download, after the model was read
    options = FixOptions(align=8)
    reference = api.start_reference(loaded, options)
    assert loaded.data is None  # handed over: no second copy of the bytes stays alive
    try:
        return api.fix(loaded.model, options, reference=reference)
    finally:
        reference.close()


def test_the_reference_is_the_model_that_was_read(tmp_path):
    path = _save(_conv_model(weight_shape=(6, 4, 3, 3), bias=6), tmp_path / "m.onnx")
    result = _fix_with_reference(path)
    align = next(p for p in result.report.passes if p.name == "align-channels")
    assert result.ok and align.status == "validated" and align.validation.passed
    other = _conv_model(weight_shape=(6, 4, 3, 3), bias=6)
    other.graph.initializer[0].float_data[:] = []
    other.graph.initializer[0].raw_data = (np.ones((6, 4, 3, 3), np.float32)).tobytes()
    changes = {
        "garbage": lambda p: p.write_bytes(b"garbage, written after the model was read"),
        "another valid model": lambda p: onnx.save(other, str(p)),
        "removed": lambda p: p.unlink(),
    }
    for what, change in changes.items():
        path = _save(_conv_model(weight_shape=(6, 4, 3, 3), bias=6), tmp_path / f"{what}.onnx")
        # never validated against another model, never unvalidated: the run stops
        with pytest.raises(InputError, match="changed while npufix ran"):
            _fix_with_reference(path, change)


def test_repeated_node_names_are_validated_on_the_renamed_model(tmp_path):
    model = _conv_model()
    model.graph.node[1].name = "conv"  # two nodes called conv: onnxruntime refuses the file as it is
    path = _save(model, tmp_path / "m.onnx")
    result = invoke(path, "-o", tmp_path / "o.onnx", "--align", "16", "--report", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["final_validation"]["passed"]


# --- 3. validation data and input ranges ----------------------------------------------------------------------


def test_an_integer_input_that_sets_a_shape_asks_for_data(tmp_path):
    model = _relu_reshape_model()
    assert set(shape_inputs(model)) == {"shape"}
    path = _save(model, tmp_path / "m.onnx")
    result = invoke(path, "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2, result.output
    assert "input 'shape' decides a shape (Reshape 'reshape' input 1)" in result.output
    assert "--validation-data" in result.output
    data = tmp_path / "d.npz"
    x = np.arange(12, dtype=np.float32).reshape(2, 6) - 6
    np.savez(data, x=x, shape=np.array([3, 4], np.int64))
    result = invoke(path, "-o", tmp_path / "o.onnx", "--validation-data", data, "--report", tmp_path / "r.json")
    assert (tmp_path / "o.onnx").exists(), result.output
    record = json.loads((tmp_path / "r.json").read_text())
    cleanup = next(p for p in record["passes"] if p["name"] == "cleanup")
    assert cleanup["name"] == "cleanup" and cleanup["status"] == "validated"  # the Identity, removed on the data
    assert record["final_validation"]["passed"]


def test_an_integer_input_that_picks_a_branch_asks_for_data(tmp_path):
    # silero-vad's sample rate: Equal(sr, 16000) -> If; a random sr in [0, 8) validates the wrong branch
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="relu")], "then", [],
                             [_vi("t", [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="neg")], "else", [], [_vi("e", [4])])
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["is16k"], name="is16k"),
             helper.make_node("If", ["is16k"], ["y"], name="pick", then_branch=then, else_branch=other)]
    model = _model(nodes, [_vi("x", [4]), _vi("sr", [], TensorProto.INT64)], [_vi("y", [4])],
                   [numpy_helper.from_array(np.array(16000, np.int64), "rate")])
    path = _save(model, tmp_path / "m.onnx")
    result = invoke(path, "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2
    assert "input 'sr' decides a branch (If 'pick' input 0)" in result.output, result.output
    np.savez(tmp_path / "d.npz", x=np.arange(4, dtype=np.float32) - 2, sr=np.array(16000, np.int64))
    assert invoke(path, "-o", tmp_path / "o.onnx", "--validation-data", tmp_path / "d.npz").exit_code != 2


def test_shape_inputs_follow_values_through_ops_but_not_through_shape():
    # idx -> Add -> Reshape target (flagged); n -> Shape -> Reshape target (only its shape is used: not flagged)
    nodes = [helper.make_node("Add", ["idx", "one"], ["idx1"], name="add"),
             helper.make_node("Reshape", ["x", "idx1"], ["a"], name="r1"),
             helper.make_node("Shape", ["n"], ["n_shape"], name="shape"),
             helper.make_node("Reshape", ["a", "n_shape"], ["out"], name="r2"),
             helper.make_node("Gather", ["x", "k"], ["g"], name="gather", axis=0)]
    model = _model(nodes, [_vi("x", [6]), _vi("idx", [1], TensorProto.INT64), _vi("n", [6], TensorProto.INT64),
                           _vi("k", [2], TensorProto.INT64)], [_vi("out", ["a"]), _vi("g", [2])],
                   [numpy_helper.from_array(np.array([0], np.int64), "one")])
    found = shape_inputs(model)
    assert {name: (node.name, k) for name, (node, k) in found.items()} == {"idx": ("r1", 1)}


def test_validation_data_folder_of_npz_and_npy(tmp_path):
    model = _conv_model()
    rng = np.random.default_rng(1)
    folder = tmp_path / "data"
    folder.mkdir()
    sets = [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(3)]
    np.savez(folder / "a.npz", x=sets[0])
    np.savez(folder / "b.npz", x=sets[1])
    np.save(folder / "x.npy", sets[2])
    feeds = load_validation_data(model, str(folder))
    assert len(feeds) == 3
    for got, want in zip(feeds, sets):
        np.testing.assert_array_equal(got["x"], want)
    feeds = validation_feeds(model, n_inputs=5, seed=0, data=str(folder / "a.npz"))
    assert len(feeds) == 1  # data replaces generated inputs


@pytest.mark.parametrize("arrays,phrase", [
    (dict(), "no array for graph input 'x'"),
    (dict(x=np.zeros((1, 4, 8, 8), np.float64)), "input 'x' is float64, the model takes FLOAT"),
    (dict(x=np.zeros((1, 4, 8, 9), np.float32)), "input 'x' has shape [1, 4, 8, 9], the model takes [1,4,8,8]"),
    (dict(x=np.zeros((1, 4, 8, 8), np.float32), y=np.zeros(2)), "'y' is not a graph input (inputs: x)"),
])
def test_validation_data_problems_are_one_line_errors(tmp_path, arrays, phrase):
    path = _save(_conv_model(), tmp_path / "m.onnx")
    data = tmp_path / "d.npz"
    np.savez(data, **arrays)
    result = invoke(path, "-o", tmp_path / "o.onnx", "--validation-data", data)
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert len(text.splitlines()) == 1 and phrase in text, text
    assert not (tmp_path / "o.onnx").exists()


def test_validation_data_feeds_a_string_input(tmp_path):
    model = _model([helper.make_node("Identity", ["s"], ["si"], name="id"),
                    helper.make_node("Reshape", ["si", "shape"], ["y"], name="reshape")],
                   [_vi("s", [3], TensorProto.STRING)], [_vi("y", [3, 1], TensorProto.STRING)],
                   [numpy_helper.from_array(np.array([3, 1], np.int64), "shape")])
    path = _save(model, tmp_path / "m.onnx")
    result = invoke(path, "-o", tmp_path / "o.onnx")
    assert result.exit_code == 2 and "--validation-data" in result.output, result.output
    np.savez(tmp_path / "d.npz", s=np.array(["a", "ÄÖ", ""]))
    result = invoke(path, "-o", tmp_path / "o.onnx", "--validation-data", tmp_path / "d.npz",
                    "--report", tmp_path / "r.json")
    assert (tmp_path / "o.onnx").exists(), result.output
    record = json.loads((tmp_path / "r.json").read_text())
    changed = [p for p in record["passes"] if p["changes"]]
    assert changed and all(p["status"] == "validated" for p in changed) and record["final_validation"]["passed"]


def test_validation_data_that_is_not_npz(tmp_path):
    path = _save(_conv_model(), tmp_path / "m.onnx")
    for name, content in (("d.npz", b"not a zip"), ("missing.npz", None)):
        data = tmp_path / name
        if content is not None:
            data.write_bytes(content)
        result = invoke(path, "-o", tmp_path / "o.onnx", "--validation-data", data)
        assert result.exit_code == 2 and "--validation-data" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_input_range_bounds_generated_values():
    model = _model([helper.make_node("Cast", ["i"], ["c"], name="cast", to=TensorProto.FLOAT),
                    helper.make_node("Add", ["x", "c"], ["out"], name="add")],
                   [_vi("x", [64]), _vi("i", [64], TensorProto.INT32)], [_vi("out", [64])])
    feeds = make_inputs(model, 3, 0, ranges=parse_input_ranges(["x:2,3", "i:-4,-2"]))
    for feed in feeds:
        assert feed["x"].dtype == np.float32 and (feed["x"] >= 2).all() and (feed["x"] < 3).all()
        assert set(np.unique(feed["i"])) <= {-4, -3, -2}
    assert len(set(np.unique(np.concatenate([f["i"] for f in feeds])))) == 3  # inclusive of both ends
    # no range: the generator is unchanged (same values as before --input-range existed)
    np.testing.assert_array_equal(make_inputs(model, 1, 0)[0]["x"], make_inputs(model, 1, 0, ranges={})[0]["x"])


@pytest.mark.parametrize("spec,phrase", [("x:1", "NAME:LO,HI"), ("x:2,1", "LO <= HI"), ("x:nan,1", "finite"),
                                         ("nope:0,1", "not a graph input")])
def test_bad_input_ranges_are_usage_errors(tmp_path, spec, phrase):
    path = _save(_conv_model(), tmp_path / "m.onnx")
    result = invoke(path, "-o", tmp_path / "o.onnx", "--input-range", spec)
    assert result.exit_code == 2, result.output
    assert phrase in result.output, result.output


# --- 4. approximations: measured on enough elements, --strict, said loudly -----------------------------------


def _approximate_verdict(seed: int):
    model = _resize_model()
    options = FixOptions(seed=seed)
    prepare(model, options)
    record = run_passes(model, options, [ResizeNearestPass()]).report.passes[0]
    return record.status, record.validation.outputs[0].rel_l2


def test_approximate_verdict_does_not_depend_on_the_seed():
    # A 7-element output: on 3 input sets (21 elements) the relative L2 error of linear -> nearest ranged
    # 0.28-0.60 over seeds 0-3 and seed 3 failed the 0.5 bound; measured on >= 4096 elements it is 0.43-0.45.
    verdicts = [_approximate_verdict(seed) for seed in range(4)]
    assert {status for status, _ in verdicts} == {"validated"}, verdicts
    errors = [rel for _, rel in verdicts]
    assert max(errors) - min(errors) < 0.05, errors
    model = _resize_model()
    prepare(model, FixOptions())
    feeds = validation_feeds(model, n_inputs=3, seed=0, approximate=True)
    assert len(feeds) * 7 >= APPROX_MIN_ELEMENTS
    assert len(validation_feeds(model, n_inputs=3, seed=0)) == 3  # exact runs keep --validation-inputs


def test_strict_refuses_an_approximate_change(tmp_path):
    path = _save(_resize_model(n_in=4, n_out=8), tmp_path / "m.onnx")
    model = api.load_model(path)
    with pytest.raises(StrictRefused, match="--strict: pass resize-nearest would change 1 node"):
        api.fix(model, FixOptions(strict=True))
    result = invoke(path, "-o", tmp_path / "o.onnx", "--strict")
    assert result.exit_code == 4, result.output
    assert "--resize-mode exact" in result.output and not (tmp_path / "o.onnx").exists()
    # the exact form passes --strict; without --strict the approximate output is written and named last
    assert invoke(path, "-o", tmp_path / "o.onnx", "--strict", "--resize-mode", "exact").exit_code == 0
    result = invoke(path, "-o", tmp_path / "o2.onnx")
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("APPROXIMATE: resize-nearest changed 1 Resize (rel L2 "), last
    assert last.endswith("use --resize-mode exact or --strict")


def test_quiet_keeps_the_approximate_line_and_the_unfixed_lines(tmp_path):
    """-q prints only what the user must not miss: the APPROXIMATE verdict, and every requested constraint left
    violated (here: its rank-4 tensors against --max-rank 3, which no pass fixes — so the Resize is not
    approximated at all: the model is rejected anyway, docs/validation.md)."""
    path = _save(_resize_model(n_in=4, n_out=8), tmp_path / "m.onnx")
    result = invoke(path, "-o", tmp_path / "o.onnx", "-q")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("APPROXIMATE: resize-nearest changed 1 Resize (rel L2 "), lines
    result = invoke(path, "-o", tmp_path / "o2.onnx", "-q", "--max-rank", "3")
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert [x for x in lines if x.startswith("unfixed: ")] and all(
        x.startswith(("unfixed: ", "  why: ")) for x in lines), lines


def test_extra_sets_stay_within_the_memory_budget():
    # a 1-element output next to a 4 MiB one: 4096 sets would keep 16 GiB of outputs; the budget caps them
    from onnx_npu_fix.pipeline.inputs import MAX_EXTRA_BYTES, sets_for_approximate

    nodes = [helper.make_node("ReduceMax", ["x"], ["peak"], name="peak", keepdims=0),
             helper.make_node("Relu", ["x"], ["big"], name="relu")]
    model = _model(nodes, [_vi("x", [1 << 20])], [_vi("peak", []), _vi("big", [1 << 20])], opset=13)
    n = sets_for_approximate(model)
    assert 1 <= n and n * 2 * (4 << 20) <= MAX_EXTRA_BYTES


class _BreakAndReplaceInput:
    """A failing pass (doubles the weight) that also replaces the input file with another valid model, as a
    concurrent download would, once the reference has been built and checked: the rollback to the input must
    not restore that other model."""

    name = "break-and-replace"
    summary = "test pass"
    exact = True
    keeps_shapes = False

    def __init__(self, path, other, reference):
        self.path, self.other, self.reference = path, other, reference

    def may_change(self, model, options):
        return True

    def run(self, model, options):
        from onnx_npu_fix.passes.base import Change, PassResult

        self.reference.outputs()  # built from the file, checked against the bytes read, run
        onnx.save(self.other, str(self.path))
        w = model.graph.initializer[0]
        w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 2, w.name))
        return PassResult(changes=[Change("w", "initializer", "doubled")])


def test_a_rollback_never_restores_a_replaced_input(tmp_path):
    path = _save(_conv_model(weight_shape=(8, 4, 3, 3)), tmp_path / "m.onnx")
    other = _conv_model(weight_shape=(8, 4, 3, 3))
    other.graph.node[1].op_type = "Sigmoid"  # valid, and computes something else
    loaded = api.read_model(path, keep_bytes=True)
    options = FixOptions(keep_going=True)
    reference = api.start_reference(loaded, options)
    try:
        with pytest.raises(InputError, match="changed while npufix ran"):
            api.fix(loaded.model, options, [_BreakAndReplaceInput(path, other, reference)], reference=reference,
                    source=path)
    finally:
        reference.close()


def test_a_file_name_that_is_not_utf8_is_still_validated(tmp_path):
    name = os.fsdecode(b"m\xff.onnx")  # a surrogate-escaped byte: onnxruntime cannot open this path
    path = tmp_path / name
    try:
        _save(_conv_model(weight_shape=(6, 4, 3, 3), bias=6), path)
    except (OSError, UnicodeEncodeError):
        pytest.skip("the file system does not take a non-UTF-8 name")
    result = _fix_with_reference(path)
    assert result.ok and result.report.final is not None and result.report.final.passed


# --- counts and bounds the summary prints agree ----------------------------------------------------------------


def test_pass_line_and_approximate_line_count_the_same_changes():
    """A pass with 3 changes of which 1 is exact: the pass line says 2 of 3 are approximate, as the APPROXIMATE
    line counts 2 (it said "[approximate]" after "3 linear->nearest" while the last line said "changed 2")."""
    from onnx_npu_fix.passes.base import Change
    from onnx_npu_fix.pipeline.report import FixReport, PassRecord, approximation_summary, render_pass_line

    changes = [Change(f"up{k}", "Resize", "linear->nearest", detail={"exact": k == 0}) for k in range(3)]
    record = PassRecord("resize-nearest", exact=False, status="validated", changes=changes)
    line = render_pass_line(record)
    assert "3 linear->nearest [approximate: 2 of 3]" in line, line
    assert "changed 2 Resize" in approximation_summary(FixReport(passes=[record]))
    record.changes = changes[1:]
    assert "2 linear->nearest [approximate] " in render_pass_line(record)


def test_a_pass_by_the_scaled_atol_names_the_bound():
    """max rel 1.0 passes as exact because the atol term, scaled to the output's magnitude, covers it: the line
    says which bound passed it instead of showing a relative error 10^4 times rtol with no word."""
    from onnx_npu_fix.passes.base import Change
    from onnx_npu_fix.pipeline.report import PassRecord, render_pass_line
    from onnx_npu_fix.pipeline.validation.comparison import compare

    ref = [{"y": np.array([50.0, 1e-6], np.float32)}]
    cand = [{"y": np.array([50.0, 2e-6], np.float32)}]
    comparison = compare(ref, cand, exact=True, rtol=1e-4, atol=1e-5, max_approx_error=0.5)
    assert comparison.passed and comparison.max_rel > 0.5
    record = PassRecord("cleanup", exact=True, status="validated", validation=comparison,
                        changes=[Change("n", "Identity", "removed")])
    assert "max rel 1.00e+00 (passed by |a-b| <= 1e-05*max(1,max|ref|) + 0.0001*|ref|: atol needed " \
        in render_pass_line(record)
    same = compare(ref, ref, exact=True, rtol=1e-4, atol=1e-5, max_approx_error=0.5)
    assert "passed by" not in render_pass_line(PassRecord("cleanup", exact=True, status="validated",
                                                          validation=same, changes=record.changes))


def test_one_finding_is_singular(tmp_path):
    path = _save(_resize_model(n_in=4, n_out=8), tmp_path / "m.onnx")
    result = invoke(path, "-o", tmp_path / "o.onnx", "--passes", "cleanup")
    assert "note: 1 finding of constraints not asked for remains (" in result.output, result.output


WRONG_PLUGIN = """
import numpy as np
import onnx
from onnx_npu_fix.passes.base import Change, Pass, PassResult

class Wrong(Pass):
    '''Declared exact, multiplies the graph output by 1.5: any input with a finite element shows it.'''
    name = "wrong"
    summary = "multiply the output by 1.5"
    exact = True

    def run(self, model, options):
        out = model.graph.output[0].name
        for node in model.graph.node:
            node.output[:] = [out + "/pre" if o == out else o for o in node.output]
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(1.5, np.float32), "wrong/k"))
        model.graph.node.append(onnx.helper.make_node("Mul", [out + "/pre", "wrong/k"], [out], name="wrong/mul"))
        return PassResult(changes=[Change("wrong/mul", "Mul", "inserted")])
"""


def _relu_add(shape):
    return _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                   helper.make_node("Add", ["r", "x"], ["y"], name="add")], [_vi("x", shape)], [_vi("y", shape)])


@pytest.mark.parametrize("fill", [np.nan, np.inf, -np.inf])
def test_validation_data_without_a_finite_value_is_not_called_exact(tmp_path, fill):
    # All-NaN (or all-inf) inputs made a deliberately wrong pass "exact: max abs 0.00e+00", exit 0.
    model = _save(_relu_add([1, 4, 8]), tmp_path / "m.onnx")
    plugin = tmp_path / "wrong.py"
    plugin.write_text(WRONG_PLUGIN)
    data = tmp_path / "d.npz"
    np.savez(data, x=np.full((1, 4, 8), fill, np.float32))
    out = tmp_path / "o.onnx"
    result = invoke(model, "-o", out, "--plugin", plugin, "--validation-data", data)
    assert result.exit_code == 2, result.output
    assert ("validation cannot tell a wrong model from a right one: output 'y' has no finite value (only NaN / "
            "±inf) on the --validation-data inputs") in result.output
    assert "exact" not in result.output and not out.exists()
    # With one finite element the wrong pass is caught as before.
    values = np.full((1, 4, 8), fill, np.float32)
    values[0, 0, 0] = 1.0
    np.savez(data, x=values)
    assert invoke(model, "-o", out, "--plugin", plugin, "--validation-data", data).exit_code == 3


def test_zero_element_input_is_not_called_exact(tmp_path):
    # A batch-0 input: every output is empty, so any model "matches"; exit 0 with "exact" before.
    model = _save(_relu_add([0, 4, 8]), tmp_path / "m.onnx")
    plugin = tmp_path / "wrong.py"
    plugin.write_text(WRONG_PLUGIN)
    out = tmp_path / "o.onnx"
    result = invoke(model, "-o", out, "--plugin", plugin)
    assert result.exit_code == 2, result.output
    assert "output 'y' has no elements on the generated validation inputs" in result.output
    assert not out.exists()
    unvalidated = invoke(model, "-o", out, "--plugin", plugin, "--validate", "none")
    assert unvalidated.exit_code == 0 and "validation: none" in unvalidated.output


@pytest.mark.parametrize("bounds", ["-1e39,1e39", "0,1e39", "-1.7e308,1.7e308"])
def test_input_range_beyond_the_input_type_is_refused(tmp_path, bounds):
    # float32 inputs from -1e39..1e39 are ±inf (a numpy overflow warning, then a validation of infinities).
    model = _save(_relu_add([1, 4, 8]), tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    result = invoke(model, "-o", out, "--input-range", f"x:{bounds}")
    assert result.exit_code == 2, result.output
    assert "exceeds the float32 range" in result.output and not out.exists()
    assert "RuntimeWarning" not in result.output


def test_random_op_is_refused_by_name_not_blamed_on_a_pass(tmp_path):
    # An unseeded RandomNormalLike after a conv that align-channels pads: "pass align-channels failed" before (an
    # exact, correct pass blamed for the noise).
    rng = np.random.default_rng(0)
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv1"),
                    helper.make_node("RandomNormalLike", ["c"], ["n"], name="noise"),
                    helper.make_node("Add", ["n", "c"], ["a"], name="add"),
                    helper.make_node("Conv", ["a", "w2"], ["y"], name="conv2")],
                   [_vi("x", [1, 3, 8])], [_vi("y", [1, 3, 8])],
                   [numpy_helper.from_array(rng.standard_normal((5, 3, 1)).astype(np.float32), "w"),
                    numpy_helper.from_array(rng.standard_normal((3, 5, 1)).astype(np.float32), "w2")])
    path = _save(model, tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    result = invoke(path, "-o", out)
    assert result.exit_code == 2, result.output
    assert "node 'noise' (RandomNormalLike) draws random values" in result.output
    assert "align-channels" not in result.output and not out.exists()
    unvalidated = invoke(path, "-o", out, "--validate", "none")
    assert unvalidated.exit_code == 0 and "validation: none" in unvalidated.output


def _npz_with_members(path, members: dict[str, bytes]) -> None:
    import zipfile
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _npy_bytes(array) -> bytes:
    import io
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_validation_data_directory_is_checked_before_any_member_is_read(tmp_path):
    # An unknown key was read whole first (889 MiB for an 800 MB member) before the "not a graph input" error;
    # a member that cannot even be read shows the order: its name is refused, its bytes never parsed.
    model = _save(_relu_add([1, 4, 8]), tmp_path / "m.onnx")
    data = tmp_path / "d.npz"
    broken = b"\x93NUMPY\x01\x00\x10\x00{broken header}"  # .npy magic, then a header too short to parse
    _npz_with_members(data, {"x.npy": _npy_bytes(np.zeros((1, 4, 8), np.float32)), "junk.npy": broken})
    result = invoke(model, "-o", tmp_path / "o.onnx", "--validation-data", data)
    assert result.exit_code == 2, result.output
    assert "'junk' is not a graph input" in result.output
    # A known input whose member is larger than its static shape can take: refused from the directory's size.
    _npz_with_members(data, {"x.npy": _npy_bytes(np.zeros((1, 4, 8 + 20000), np.float32))[:-8] + b"truncate"})
    result = invoke(model, "-o", tmp_path / "o.onnx", "--validation-data", data)
    assert result.exit_code == 2, result.output
    assert "'x' holds" in result.output and "more than input 'x' [1,4,8] float32 can take (128 bytes)" in result.output
    assert not (tmp_path / "o.onnx").exists()


def test_validation_data_that_is_a_fifo_is_refused(tmp_path):
    # np.load on a FIFO waited for a writer forever. Here a writer thread stands by, so the old code read an
    # empty stream instead of hanging; the new one never opens the FIFO (the writer is released at the end).
    import threading
    model = _save(_relu_add([1, 4, 8]), tmp_path / "m.onnx")
    fifo = tmp_path / "d.npz"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: open(fifo, "wb").close(), daemon=True)
    writer.start()
    try:
        result = invoke(model, "-o", tmp_path / "o.onnx", "--validation-data", fifo)
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # lets a still-waiting writer go
        writer.join()
    assert result.exit_code == 2, result.output
    assert "not a regular file" in result.output and not (tmp_path / "o.onnx").exists()


# --- long graphs run in segments; the input proven unchanged by its identity -------------------------------------


def _bn_chain(blocks=6, channels=6):
    """``blocks`` x (Conv 3x3 -> BatchNormalization -> Relu), the first block's output also added at the end (a
    tensor read by a node many segments later), 6 channels (align-channels pads them): every default pass has
    work, on a graph long enough to cut into several segments."""
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        inits.append(numpy_helper.from_array(
            (0.3 * rng.standard_normal((channels, channels, 3, 3))).astype(np.float32), f"w{i}"))
        bn = [numpy_helper.from_array(v.astype(np.float32), f"{n}{i}") for n, v in (
            ("g", 1 + 0.1 * rng.standard_normal(channels)), ("b", 0.1 * rng.standard_normal(channels)),
            ("m", 0.1 * rng.standard_normal(channels)), ("v", 0.5 + rng.random(channels)))]
        inits.extend(bn)
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{i}", *(t.name for t in bn)], [f"n{i}"], name=f"bn{i}"),
                  helper.make_node("Relu", [f"n{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    nodes.append(helper.make_node("Add", [x, "r0"], ["out"], name="skip"))
    shape = [1, channels, 6, 6]
    return _model(nodes, [_vi("x", shape)], [_vi("out", shape)], inits)


def test_a_long_graph_runs_in_segments_with_the_outputs_of_the_whole(monkeypatch):
    from onnx_npu_fix.pipeline.validation import runs

    model = _bn_chain()
    feeds = make_inputs(model, 3, 0)
    whole = runs.run_model(None, feeds, data=model.SerializeToString())
    monkeypatch.setattr(runs, "SEGMENT_NODES", 4)
    assert runs.segmented(model) and len(runs.plan_segments(model)) == 5
    cut = runs.run_model(model, feeds)
    for a, b in zip(whole, cut):
        assert list(a) == list(b) == ["out"]
        assert a["out"].tobytes() == b["out"].tobytes()  # bit-identical, not merely close


def test_a_long_graph_is_cut_into_segments_shorter_than_the_threshold(monkeypatch):
    # When to cut (SEGMENT_NODES) and how long a segment is (SEGMENT_LENGTH: shorter sessions cost onnxruntime
    # less per node) are two settings; the outputs are the same bytes either way.
    from onnx_npu_fix.pipeline.validation import runs

    model = _bn_chain()
    feeds = make_inputs(model, 2, 0)
    whole = runs.run_model(None, feeds, data=model.SerializeToString())
    monkeypatch.setattr(runs, "SEGMENT_NODES", 10)
    monkeypatch.setattr(runs, "SEGMENT_LENGTH", 3)
    segments = runs.plan_segments(model)
    assert runs.segmented(model) and len(segments) == 7
    assert all(s.stop - s.start <= 3 for s in segments)
    for a, b in zip(whole, runs.run_model(model, feeds)):
        assert a["out"].tobytes() == b["out"].tobytes()


def _record_of(path, tmp_path, tag):
    report = tmp_path / f"{tag}.json"
    result = CliRunner().invoke(main, [str(path), "-o", str(tmp_path / f"{tag}.onnx"), "--align", "8",
                                       "--report", str(report)])
    assert result.exit_code == 0, result.output
    record = json.loads(report.read_text())

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if k not in ("seconds", "validate_seconds", "command", "path", "output_sha256")}
        return [strip(v) for v in value] if isinstance(value, list) else value
    return strip(record), (tmp_path / f"{tag}.onnx").read_bytes()


def test_a_run_validated_in_segments_writes_what_a_whole_run_writes(tmp_path, monkeypatch):
    from onnx_npu_fix.pipeline.validation import runs

    path = _save(_bn_chain(), tmp_path / "chain.onnx")
    whole = _record_of(path, tmp_path, "whole")
    monkeypatch.setattr(runs, "SEGMENT_NODES", 4)
    cut = _record_of(path, tmp_path, "cut")
    assert [p["status"] for p in cut[0]["passes"] if p["status"] == "validated"]
    assert cut == whole  # same record (every max abs error included), same bytes


def test_a_settled_input_is_proven_unchanged_by_its_identity_not_a_second_hash(tmp_path, monkeypatch):
    from onnx_npu_fix.io import load
    from onnx_npu_fix.pipeline.validation import reference

    monkeypatch.setattr(load, "SETTLED_NS", 0)  # as if the file had been written long ago

    def no_second_hash(path):
        raise AssertionError("the input file was hashed again")
    monkeypatch.setattr(reference, "file_digest", no_second_hash)
    path = _save(_conv_model(weight_shape=(6, 4, 3, 3), bias=6), tmp_path / "m.onnx")
    result = _fix_with_reference(path)
    assert result.ok and result.report.final is not None and result.report.final.passed
    other = _conv_model(weight_shape=(6, 4, 3, 3), bias=6)
    other.graph.initializer[0].raw_data = np.ones((6, 4, 3, 3), np.float32).tobytes()
    for what, change in {"rewritten in place": lambda p: (time.sleep(0.05), onnx.save(other, str(p))),
                         "replaced": lambda p: (onnx.save(other, str(p) + ".new"), os.replace(str(p) + ".new", p))
                         }.items():
        path = _save(_conv_model(weight_shape=(6, 4, 3, 3), bias=6), tmp_path / f"{what}.onnx")
        with pytest.raises(InputError, match="changed while npufix ran"):
            _fix_with_reference(path, change)


def test_a_file_changed_a_moment_ago_has_no_identity(tmp_path):
    from onnx_npu_fix.io import load

    path = _save(_conv_model(), tmp_path / "m.onnx")
    assert api.read_model(path, keep_bytes=True).identity is None  # its timestamps cannot tell a rewrite yet
    old = os.stat(path)
    assert load.file_identity(str(path)) is None
    assert load.file_identity(str(path), old) is None


# --- validation sessions map their weights from one run-owned scratch file -----------------------------------


def test_mapped_weights_write_each_weight_once_at_page_offsets(tmp_path, monkeypatch):
    import onnxruntime as ort

    from onnx_npu_fix.io.external import PAGE, MappedWeights

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    model = _conv_model(weight_shape=(8, 4, 3, 3), bias=8)  # w: 1152 bytes (mapped), b: 32 bytes (inline)
    changed = _conv_model(weight_shape=(8, 4, 3, 3), bias=8)
    w = changed.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 2, w.name))
    store = MappedWeights()
    try:
        first, same, other = store.write(model), store.write(model), store.write(changed)
        data = os.path.join(store.directory, "weights.data")
        refs = [onnx.load(p, load_external_data=False).graph.initializer for p in (first, same, other)]
        offsets = [int({e.key: e.value for e in r[0].external_data}["offset"]) for r in refs]
        assert offsets[0] == offsets[1] and offsets[2] != offsets[0]  # unchanged: written once; changed: again
        assert all(o % PAGE == 0 for o in offsets) and os.path.getsize(data) == offsets[2] + 1152
        assert refs[0][1].data_location != TensorProto.EXTERNAL  # below the threshold: stays in the model
        x = {"x": np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)}
        for path, proto in ((first, model), (other, changed)):
            mapped = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, x)[0]
            inline = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]
            assert np.array_equal(mapped, inline)
    finally:
        directory = store.directory
        store.close()
    assert not os.path.exists(directory) and os.listdir(tmp_path) == []


def _unet_like() -> onnx.ModelProto:
    """Convs whose weights straddle io.serialize's chunk and io.external's mapping thresholds (set small by the
    tests), a name and a doc string on the graph, and a value_info after the initializers in field order."""
    gen = np.random.default_rng(3)
    inits, nodes, x = [], [], "x"
    for i, (cout, cin) in enumerate([(8, 3), (16, 8), (4, 16)]):
        inits.append(numpy_helper.from_array(gen.standard_normal((cout, cin, 3, 3)).astype(np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array(gen.standard_normal(cout).astype(np.float32), f"b{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"))
        x = f"c{i}"
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 4, 8, 8])], inits,
                              doc_string="after the initializers in field order",
                              value_info=[helper.make_tensor_value_info("c0", TensorProto.FLOAT, [1, 8, 8, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, producer_name="t")


def _raw_tensor_with_every_kind_of_field() -> onnx.TensorProto:
    """A raw tensor with fields numbered below and above raw_data (9): segment (3), name (8), doc_string (12),
    metadata_props (16): protobuf writes them in number order around the bytes."""
    tensor = numpy_helper.from_array(np.arange(300, dtype=np.float32), "fields")
    tensor.segment.begin, tensor.segment.end = 0, 300
    tensor.doc_string = "after raw_data"
    tensor.metadata_props.add(key="k", value="v")
    return tensor


@pytest.mark.parametrize("chunk,raw_entry", [(1, 1 << 30), (700, 1 << 30), (1 << 20, 1 << 30), (1 << 20, 1)])
def test_serialized_parts_join_to_the_bytes_protobuf_writes(monkeypatch, fixture_path, chunk, raw_entry):
    """The pieces an owned run serializes a model in (a transient of one run of weights, not protobuf's ~2.4 model
    sizes) are byte for byte SerializeToString, with runs of any size and large raw tensors written field by field
    (RAW_ENTRY); a model with unknown fields of its own is serialized whole."""
    from onnx_npu_fix.io import serialize

    monkeypatch.setattr(serialize, "SERIALIZE_CHUNK", chunk)
    monkeypatch.setattr(serialize, "RAW_ENTRY", raw_entry)
    fields = _unet_like()
    fields.graph.initializer.append(_raw_tensor_with_every_kind_of_field())
    for model in (_unet_like(), fields, api.load_model(fixture_path("tcn.onnx")),
                  api.load_model(fixture_path("unet.onnx"))):
        parts = serialize.serialized_parts(model)
        assert b"".join(parts) == model.SerializeToString()
        assert len(parts) > 4  # really in pieces: shell head, graph tag, initializer runs, tail
    unknown = _unet_like()
    unknown.ParseFromString(unknown.SerializeToString() + b"\xb8\x06\x01")  # field 103: unknown to onnx
    assert serialize.serialized_parts(unknown) == [unknown.SerializeToString()]


def test_mapped_weights_written_from_bytes_are_those_written_from_the_proto(tmp_path, monkeypatch):
    """A candidate's session maps weights written straight from its bytes (no proto beside them): the same
    scratch model and data file as from the proto; a layout it does not take apart (a graph given twice, which
    protobuf merges) is parsed instead, with the same result."""
    from onnx_npu_fix.io.external import MappedWeights
    from onnx_npu_fix.pipeline.validation.session import write_scratch

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    model = _unet_like()
    data = model.SerializeToString()
    stores = [MappedWeights(threshold=100) for _ in range(3)]
    try:
        shells = [stores[0].write(model), stores[1].write_bytes(data)]
        split = onnx.ModelProto()
        split.CopyFrom(model)
        del split.graph.initializer[:]
        # the graph without its weights, then a second graph field holding them: protobuf merges the two
        twice = split.SerializeToString() + onnx.ModelProto(
            graph=onnx.GraphProto(initializer=model.graph.initializer)).SerializeToString()
        with pytest.raises(ValueError, match="2 graph fields"):
            MappedWeights().write_bytes(twice)
        shells.append(write_scratch(stores[2], twice))
        protos = [onnx.load(p, load_external_data=False) for p in shells]
        assert protos[0] == protos[1] == protos[2]
        assert sum(t.data_location == TensorProto.EXTERNAL for t in protos[1].graph.initializer) == 3
        datas = [open(os.path.join(s.directory, "weights.data"), "rb").read() for s in stores]
        assert datas[0] == datas[1] == datas[2]
    finally:
        for store in stores:
            store.close()
    assert os.listdir(tmp_path) == []


def test_an_owned_run_holds_no_proto_while_a_candidate_s_session_runs(monkeypatch, fixture_path):
    """Between the checker and the end of a candidate's runs the run holds its bytes only: onnxruntime gets them
    (mapped weights written from the bytes), and the proto the passes go on with is parsed afterwards (one model
    size off the peak of a validated run)."""
    from onnx_npu_fix.pipeline.validation import validator

    given: list[tuple[bool, bool]] = []
    real = validator.run_model

    def spy(model, feeds, **kwargs):
        given.append((model is None, isinstance(kwargs.get("data"), bytes)))
        return real(model, feeds, **kwargs)

    monkeypatch.setattr(validator, "run_model", spy)
    result = api.fix(fixture_path("tcn.onnx"), FixOptions(max_dilation=4, align=8))
    assert result.ok and result.report.final.passed
    assert given and all(pair == (True, True) for pair in given)


class _SeesScratch:
    """An exact pass that changes nothing but records the validation scratch directories present when it runs
    (once the original's session was built), then optionally interrupts the run."""

    name = "sees-scratch"
    summary = "test pass"
    exact = True
    keeps_shapes = True

    def __init__(self, where, reference, interrupt=False):
        self.where, self.reference, self.interrupt, self.seen = where, reference, interrupt, None

    def may_change(self, model, options):
        return True

    def run(self, model, options):
        from onnx_npu_fix.passes.base import PassResult

        self.reference.outputs()  # the original's session was built on the worker thread (and has run)
        self.seen = {d: {f: os.path.getsize(os.path.join(self.where, d, f))
                         for f in os.listdir(os.path.join(self.where, d))} for d in os.listdir(self.where)}
        if self.interrupt:
            raise KeyboardInterrupt
        return PassResult(changes=[])


@pytest.mark.parametrize("interrupt", [False, True])
def test_validation_scratch_holds_the_mapped_weights_and_is_removed_on_every_exit(tmp_path, monkeypatch, interrupt):
    from onnx_npu_fix.passes.align_channels import AlignChannelsPass

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    path = _save(_conv_model(weight_shape=(12, 4, 3, 3), bias=12), tmp_path / "m.onnx")  # w: 1728 bytes
    loaded = api.read_model(path, keep_bytes=True)
    options = FixOptions(align=8)
    reference = api.start_reference(loaded, options)
    seer = _SeesScratch(str(scratch), reference, interrupt)
    try:
        if interrupt:
            with pytest.raises(KeyboardInterrupt):
                api.fix(loaded.model, options, [AlignChannelsPass(), seer], reference=reference, source=path)
        else:
            result = api.fix(loaded.model, options, [AlignChannelsPass(), seer], reference=reference, source=path)
            assert result.ok and result.report.passes[0].status == "validated"
    finally:
        reference.close()
    # One directory for the run; the original's session was built from it, its weight in the data file (the
    # candidate of the exact group is validated after this pass).
    (name, files), = seer.seen.items()
    assert name.startswith("npufix-validate-") and sorted(files) == ["model-1.onnx", "weights.data"]
    assert files["weights.data"] == 1728
    assert os.listdir(scratch) == []


def test_the_reference_writes_its_scratch_model_from_the_bytes_read_and_lets_them_go_before_its_session(
        tmp_path, monkeypatch):
    """The original's outputs start from the bytes read: its scratch model is written from them as they are (no
    proto parsed: no second copy of the weights beside them), and the input file is what onnxruntime loads if it
    refuses the scratch model, so the bytes are not held while the session is built and run."""
    from onnx_npu_fix.io.load import file_identity
    from onnx_npu_fix.pipeline.validation import reference as reference_module

    path = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu(), path)
    os.utime(path, (time.time() - 10, time.time() - 10))  # settled: its identity can prove it unchanged
    held = [path.read_bytes()]
    written: list[type] = []
    refs: list[int] = []
    real_write, real_runner = reference_module.write_scratch, reference_module.Reference._runner_of_scratch
    built = threading.Event()

    def writing(weights, model):
        written.append(type(model))
        return real_write(weights, model)

    def counting(self, scratch, digest, *, refused):
        built.wait(60)  # the constructor's own reference to its argument is gone
        refs.append(sys.getrefcount(held[0]))
        return real_runner(self, scratch, digest, refused=refused)

    monkeypatch.setattr(reference_module, "write_scratch", writing)
    monkeypatch.setattr(reference_module.Reference, "_runner_of_scratch", counting)
    reference = reference_module.Reference(held[0], read_from=str(path), identity=file_identity(str(path)))
    built.set()
    try:
        reference.run(make_inputs(conv_bn_relu(), 1, 0))
        assert len(reference.outputs()) == 1
    finally:
        reference.close()
    assert written == [bytes]
    assert refs == [2]  # this test's list and getrefcount's argument: the reference holds no copy
