"""The pass manager: order, skip, validation, failure and rollback, report contents."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from helpers import as_if_above_two_gb, assert_equivalent, small_model
from onnx import helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io.atomic import current_umask
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.passes import DEFAULT_ORDER, PASSES
from onnx_npu_fix.passes.base import Change, Found, Pass, PassResult
from onnx_npu_fix.pipeline.scheduler import prepare, run_passes


class ScaleWeights(Pass):
    """A deliberately wrong pass: doubles every initializer (changes the outputs)."""

    name = "scale-weights"
    summary = "test pass that breaks the model"

    def run(self, model, options):
        result = PassResult()
        for t in model.graph.initializer:
            data = numpy_helper.to_array(t)  # numpy < 2 makes float64 of a 0-d float32 array times 2: keep the type
            t.CopyFrom(numpy_helper.from_array(np.asarray(data * 2, dtype=data.dtype), t.name))
            result.changes.append(Change(t.name, "initializer", "doubled"))
        return result


class RenameRelu(Pass):
    """A correct pass: turns Relu into Max(x, 0) — exact."""

    name = "relu-to-max"
    summary = "test pass"

    def run(self, model, options):
        result = PassResult()
        index = GraphIndex(model)
        for node in model.graph.node:
            if node.op_type == "Relu":
                zero = index.unique_name("zero")
                model.graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), zero))
                node.op_type = "Max"
                node.input.append(zero)
                result.changes.append(Change(node.name, "Relu", "replaced", "Relu", "Max"))
        return result


class Crash(Pass):
    name = "crash"
    summary = "test pass that raises"

    def run(self, model, options):
        raise RuntimeError("boom\nsecond line")


class Approximate(Pass):
    """Adds a small constant to the output: approximate, within a relative-L2 bound of 0.5."""

    name = "nudge"
    summary = "approximate test pass"
    exact = False

    def __init__(self, amount: float = 0.01) -> None:
        self.amount = amount

    def run(self, model, options):
        index = GraphIndex(model)
        out = model.graph.output[0].name
        node = index.producer[out]
        tmp = index.unique_name("pre_nudge")
        node.output[0] = tmp
        c = index.unique_name("nudge_c")
        model.graph.initializer.append(numpy_helper.from_array(np.array(self.amount, np.float32), c))
        name = index.unique_name(self.name)
        model.graph.node.append(helper.make_node("Add", [tmp, c], [out], name=name))
        return PassResult(changes=[Change(name, "Add", "added")])


def run(model, passes, **opts):
    options = FixOptions(**opts)
    prepare(model, options)
    return run_passes(model, options, passes)


def test_default_order_is_one_tuple_and_registry_matches():
    assert isinstance(DEFAULT_ORDER, tuple)
    names = [cls.name for cls in DEFAULT_ORDER]
    assert len(names) == len(set(names))
    assert names[:2] == ["fold-constants", "cleanup"]
    for cls in DEFAULT_ORDER:
        assert PASSES[cls.name] is cls


@pytest.mark.parametrize("cls", list(PASSES.values()), ids=lambda c: c.name)
def test_each_pass_module_states_its_op_chain(cls):
    """The pass's own module docstring (not the package's) names the pass on its first line and writes out a
    before -> after chain of ONNX ops."""
    import re

    doc = sys.modules[cls.__module__].__doc__ or ""
    assert cls.name in doc.split("\n", 1)[0], doc[:200]
    onnx_ops = {schema.name for schema in onnx.defs.get_all_schemas()}
    chains = [line for line in doc.splitlines()
              if ("->" in line or "=>" in line) and onnx_ops & set(re.findall(r"\b[A-Z][A-Za-z]+\b", line))]
    assert chains, f"{cls.__module__} states no op chain"


def test_correct_pass_is_validated_and_reported():
    original = small_model()
    model = small_model()
    result = run(model, [RenameRelu()])
    assert result.ok
    record = result.report.passes[0]
    assert record.status == "validated"
    assert record.validation.passed and record.validation.max_abs == 0.0
    assert [c.node for c in record.changes] == ["relu"]
    assert result.report.final.passed
    assert "Max" in [n.op_type for n in model.graph.node]
    assert_equivalent(original, model)


def test_wrong_pass_fails_names_pass_and_output():
    result = run(small_model(), [ScaleWeights()])
    assert not result.ok
    failed = result.report.failed_pass
    assert failed.name == "scale-weights"
    assert failed.status == "failed"
    assert "output 'out'" in failed.error
    assert result.report.final is None


def test_failure_stops_later_passes():
    result = run(small_model(), [ScaleWeights(), RenameRelu()])
    assert [p.name for p in result.report.passes] == ["scale-weights"]


def test_keep_going_rolls_back_and_continues():
    original = small_model()
    model = small_model()
    result = run(model, [ScaleWeights(), RenameRelu()], keep_going=True)
    assert result.ok
    assert [p.status for p in result.report.passes] == ["rolled back", "validated"]
    assert result.report.final.passed
    assert_equivalent(original, model)


def test_crashing_pass_is_reported_not_raised():
    result = run(small_model(), [Crash()])
    assert not result.ok
    assert result.report.failed_pass.error == "RuntimeError: boom"


def test_unchanged_pass_is_not_validated():
    model = small_model()
    for node in model.graph.node:
        if node.op_type == "Relu":
            node.op_type = "Sigmoid"
    result = run(model, [RenameRelu()])
    assert result.report.passes[0].status == "unchanged"
    assert result.report.passes[0].validation is None
    assert result.report.final is None


def test_approximate_pass_measured_against_its_bound():
    ok = run(small_model(), [Approximate(0.01)])
    record = ok.report.passes[0]
    assert record.status == "validated" and not record.exact
    assert 0 < record.validation.max_abs <= 0.0101
    assert "relative L2" in record.validation.criterion
    too_far = run(small_model(), [Approximate(100.0)])
    assert too_far.report.failed_pass.name == "nudge"
    # the same nudge, declared exact, fails the exact tolerance
    exact_nudge = Approximate(0.01)
    exact_nudge.exact = True
    assert not run(small_model(), [exact_nudge]).ok


def test_validate_final_and_none_policies():
    final = run(small_model(), [RenameRelu()], validate="final")
    assert final.report.passes[0].status == "not validated"
    assert final.report.final.passed
    broken = run(small_model(), [ScaleWeights()], validate="final")
    assert not broken.ok and not broken.report.final.passed
    none = run(small_model(), [RenameRelu()], validate="none")
    assert none.report.final is None and none.ok


def test_dynamic_input_needs_input_shape():
    model = small_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.raises(InputError, match="--input-shape x:"):
        run(model, [RenameRelu()])
    fixed = small_model()
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    assert run(fixed, [RenameRelu()], input_shapes={"x": (3, 2)}).ok


def test_input_shape_for_unknown_input_is_an_input_error():
    with pytest.raises(InputError, match="not a graph input"):
        run(small_model(), [], input_shapes={"nope": (1,)})


def test_select_passes_only_and_skip():
    all_names = [p.name for p in api.select_passes()]
    assert all_names == [cls.name for cls in DEFAULT_ORDER]
    assert [p.name for p in api.select_passes(skip=["fold-constants"])] == all_names[1:]
    assert [p.name for p in api.select_passes(only=["cleanup", "fold-constants"])] == ["fold-constants",
                                                                                       "cleanup"]
    with pytest.raises(InputError, match="unknown pass 'nope'"):
        api.select_passes(only=["nope"])


def test_report_json_contents():
    result = run(small_model(), [RenameRelu()])
    data = result.report.to_json()
    entry = data["passes"][0]
    assert entry["name"] == "relu-to-max"
    assert entry["changes"][0] == {"node": "relu", "op": "Relu", "action": "replaced", "old": "Relu",
                                   "new": "Max"}
    assert entry["validation"]["passed"] is True
    assert entry["validation"]["worst_output"] == "out"
    assert set(entry["validation"]["outputs"][0]) >= {"name", "max_abs", "max_rel", "rel_l2", "cosine"}
    assert data["final_validation"]["passed"] is True


def test_unrunnable_original_stops_the_run_unless_validation_is_off():
    model = small_model()
    # A custom-domain op onnxruntime does not know: the original cannot run, so nothing can be validated.
    model.graph.node[2].domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    for passes in ([], [ScaleWeights()]):  # whether or not a pass changes anything
        with pytest.raises(InputError, match="onnxruntime cannot run the original model.*--validate none"):
            run(model, passes)
    result = run(model, [ScaleWeights()], validate="none")
    assert result.report.validation_note.startswith("validation: none (requested)")
    assert result.report.passes[0].status == "not validated"


class AddZero(Approximate):
    """A correct pass: appends `+ 0` after the output's producer (exact)."""

    name = "add-zero"
    summary = "test pass"
    exact = True

    def __init__(self) -> None:
        super().__init__(0.0)


class BreakShapes(Pass):
    """Makes the graph inconsistent for shape inference (MatMul of incompatible shapes)."""

    name = "break-shapes"
    summary = "test pass"

    def run(self, model, options):
        for t in model.graph.initializer:
            if t.name == "w":
                t.CopyFrom(numpy_helper.from_array(np.zeros((5, 4), np.float32), "w"))
        return PassResult(changes=[Change("w", "initializer", "reshaped")])


@pytest.fixture
def sessions(monkeypatch):
    """Counts the onnxruntime sessions the pass manager builds (its validation's and the original's)."""
    from onnx_npu_fix.pipeline.validation.session import Runner

    built = []
    real = Runner.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        real(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "__init__", counting)  # every module's sessions, the original's on its thread too
    return built


def test_consecutive_exact_passes_share_one_session(sessions):
    original = small_model()
    model = small_model()
    result = run(model, [RenameRelu(), AddZero()])
    assert result.ok
    assert [p.status for p in result.report.passes] == ["validated", "validated"]
    assert [p.validated_with for p in result.report.passes] == [["relu-to-max", "add-zero"]] * 2
    assert len(sessions) == 2  # the original and the model after both passes
    assert result.serialized is not None  # the validated bytes are what save_model writes
    reread = onnx.ModelProto()
    reread.ParseFromString(result.serialized)
    assert reread == model
    assert_equivalent(original, model)


def test_failing_group_is_replayed_and_the_wrong_pass_named(sessions):
    result = run(small_model(), [RenameRelu(), ScaleWeights(), AddZero()])
    assert not result.ok
    assert [(p.name, p.status) for p in result.report.passes] == [("relu-to-max", "validated"),
                                                                   ("scale-weights", "failed")]
    assert result.report.passes[0].validated_with == []  # validated alone in the replay
    assert "output 'out'" in result.report.failed_pass.error


def test_keep_going_in_a_group_rolls_back_only_the_wrong_pass():
    original = small_model()
    model = small_model()
    result = run(model, [RenameRelu(), ScaleWeights(), AddZero()], keep_going=True)
    assert result.ok
    assert [p.status for p in result.report.passes] == ["validated", "rolled back", "validated"]
    assert "Max" in [n.op_type for n in model.graph.node] and "Add" in [n.op_type for n in model.graph.node]
    assert_equivalent(original, model)


def test_crash_inside_a_group_with_keep_going_replays_the_group():
    original = small_model()
    model = small_model()
    result = run(model, [RenameRelu(), Crash(), AddZero()], keep_going=True)
    assert result.ok
    assert [(p.name, p.status) for p in result.report.passes] == [
        ("relu-to-max", "validated"), ("crash", "rolled back"), ("add-zero", "validated")]
    assert_equivalent(original, model)


def test_pass_that_breaks_shape_inference_is_named_not_its_group():
    result = run(small_model(), [RenameRelu(), BreakShapes()])
    assert [(p.name, p.status) for p in result.report.passes] == [("relu-to-max", "not validated"),
                                                                   ("break-shapes", "failed")]
    assert "shape inference fails" in result.report.failed_pass.error
    kept = run(small_model(), [RenameRelu(), BreakShapes(), AddZero()], keep_going=True)
    assert kept.ok
    assert [p.status for p in kept.report.passes] == ["validated", "rolled back", "validated"]


def test_an_approximate_pass_is_measured_alone(sessions):
    result = run(small_model(), [RenameRelu(), Approximate(0.01), AddZero()])
    assert result.ok
    records = result.report.passes
    assert [p.validated_with for p in records] == [[], [], []]
    assert not records[1].exact and records[1].validation.max_abs <= 0.0101
    assert records[0].validation.max_abs == 0.0 and records[2].validation.max_abs == 0.0
    assert len(sessions) == 4


def _identity_and_batchnorm_model() -> onnx.ModelProto:
    """Conv -> BN (folds) -> Identity -> out, and Relu -> BN (cannot fold: lowered to Mul+Add) -> out2."""
    r = np.random.default_rng(3)
    c = 4
    inits = [numpy_helper.from_array(r.standard_normal((c, 2, 3, 3)).astype(np.float32), "w")]
    for prefix in ("bn1", "bn2"):
        inits += [numpy_helper.from_array(r.uniform(0.5, 1.5, c).astype(np.float32), f"{prefix}_s"),
                  numpy_helper.from_array(r.standard_normal(c).astype(np.float32), f"{prefix}_b"),
                  numpy_helper.from_array(r.standard_normal(c).astype(np.float32), f"{prefix}_m"),
                  numpy_helper.from_array(r.uniform(0.5, 1.5, c).astype(np.float32), f"{prefix}_v")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["y", "bn1_s", "bn1_b", "bn1_m", "bn1_v"], ["z"], name="bn1"),
        helper.make_node("Identity", ["z"], ["out"], name="id"),
        helper.make_node("Relu", ["y"], ["r"], name="relu"),
        helper.make_node("BatchNormalization", ["r", "bn2_s", "bn2_b", "bn2_m", "bn2_v"], ["out2"], name="bn2"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [1, c, 6, 6]),
         helper.make_tensor_value_info("out2", onnx.TensorProto.FLOAT, [1, c, 6, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("source", ["identity-bn", "unet.onnx", "torch_unet.onnx", "lraspp.onnx", "tcn.onnx"])
@pytest.mark.parametrize("cls", [cls for cls in PASSES.values() if cls.keeps_shapes], ids=lambda c: c.name)
def test_passes_that_keep_shapes_do(cls, source):
    """The Pass.keeps_shapes claim: after the pass, every recorded shape equals a fresh inference's."""
    import os

    from onnx_npu_fix.ir.graph import infer_shapes, keep_inferred_shapes

    if source == "identity-bn":
        model = _identity_and_batchnorm_model()
    else:
        model = onnx.load(os.path.join(os.path.dirname(__file__), "..", "fixtures", source))
    options = FixOptions()
    prepare(model, options)
    result = cls().run(model, options)
    if not keep_inferred_shapes(model.graph):
        assert result.changed  # only new tensors may lack a shape, and only a changing pass makes them
        return
    recorded = {vi.name: vi for vi in model.graph.value_info}
    fresh = onnx.ModelProto()
    fresh.CopyFrom(model)
    infer_shapes(fresh)
    inferred = {vi.name: vi for vi in fresh.graph.value_info}
    assert set(recorded) <= set(inferred) | {o.name for o in model.graph.output}
    for name, vi in recorded.items():
        if name in inferred:
            assert vi.type == inferred[name].type, name


def test_reference_started_from_the_file_before_parsing(tmp_path, sessions):
    path = tmp_path / "m.onnx"
    onnx.save(small_model(), path)
    options = FixOptions()
    reference = api.start_reference(path, options)
    try:
        model = api.load_model(path)
        result = api.fix(model, options, [RenameRelu()], reference=reference)
    finally:
        reference.close()
    assert result.ok and result.report.passes[0].status == "validated"
    assert result.report.final.passed
    assert len(sessions) == 2  # the file's session and the rewritten model's; the original was not serialized
    assert api.start_reference(path, FixOptions(validate="none")) is None
    assert api.start_reference(path, FixOptions(input_shapes={"x": (3, 2)})) is None


def test_an_unused_or_broken_reference_closes_without_hanging(tmp_path):
    from onnx_npu_fix.pipeline.validation.reference import Reference
    from onnx_npu_fix.pipeline.validation.session import runtime_errors

    never_fed = Reference(str(tmp_path / "missing.onnx"))
    never_fed.close()
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    reference = Reference(str(broken))
    reference.run([{}])
    with pytest.raises(runtime_errors()):
        reference.outputs()
    reference.close()


def test_models_above_two_gb_validate_each_pass_alone(monkeypatch, sessions):
    as_if_above_two_gb(monkeypatch)
    original = small_model()
    model = small_model()
    result = run(model, [RenameRelu(), AddZero()])
    assert result.ok
    assert [p.validated_with for p in result.report.passes] == [[], []]
    assert len(sessions) == 3
    assert_equivalent(original, model)


def test_a_pass_declared_exact_that_was_approximate_is_not_grouped():
    class SometimesApproximate(Approximate):
        name = "sometimes"
        exact = True  # declared exact; this run says otherwise

        def run(self, model, options):
            result = super().run(model, options)
            result.metrics["exact"] = False
            return result

    result = run(small_model(), [RenameRelu(), SometimesApproximate(0.01)])
    assert result.ok
    first, second = result.report.passes
    assert first.validated_with == [] and first.validation.exact and first.validation.max_abs == 0.0
    assert not second.exact and not second.validation.exact and 0 < second.validation.max_abs <= 0.0101


def test_early_write_commits_only_the_bytes_it_wrote(tmp_path):
    import os
    import stat

    target = tmp_path / "out.onnx"
    early = api.EarlyWrite(target)
    data = small_model().SerializeToString()
    early.start(data)
    assert not early.commit(data[:1] + data[1:])  # equal bytes, another object: not what was handed over
    assert not target.exists() and os.listdir(tmp_path) == []
    early.start(data)
    assert early.commit(data)
    assert target.read_bytes() == data
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o666 & ~current_umask()
    early.start(b"second")
    early.close()  # nothing committed: the temporary file is gone, the output untouched
    assert os.listdir(tmp_path) == ["out.onnx"] and target.read_bytes() == data


def test_the_output_bytes_are_handed_over_before_their_last_validation(tmp_path):
    seen = []
    options = FixOptions()
    model = small_model()
    prepare(model, options)
    result = run_passes(model, options, [RenameRelu(), AddZero()], on_serialized=seen.append)
    assert result.ok and len(seen) == 1 and seen[0] is result.serialized
    failing = small_model()
    prepare(failing, options)
    seen.clear()
    assert not run_passes(failing, options, [ScaleWeights()], on_serialized=seen.append).ok
    assert len(seen) == 1  # handed over, then not used: the CLI discards the early file
    model = small_model()
    prepare(model, FixOptions(validate="final"))
    seen.clear()
    result = run_passes(model, FixOptions(validate="final"), [RenameRelu()], on_serialized=seen.append)
    assert result.ok and seen == [result.serialized]


class ClaimsNoChange(Approximate):
    """An approximate pass whose cheap look says it changes nothing; ``really`` makes it change anyway."""

    name = "claims-no-change"

    def __init__(self, really: bool) -> None:
        super().__init__(0.01)
        self.really = really

    def may_change(self, model, options):
        return False

    def run(self, model, options):
        return super().run(model, options) if self.really else PassResult()


def test_an_approximate_pass_that_changes_nothing_does_not_split_a_group(sessions):
    result = run(small_model(), [RenameRelu(), ClaimsNoChange(really=False), AddZero()])
    assert result.ok
    assert [p.validated_with for p in result.report.passes] == [["relu-to-max", "add-zero"], [],
                                                                 ["relu-to-max", "add-zero"]]
    assert len(sessions) == 2


def test_an_approximate_change_is_measured_alone_even_when_announced_as_none():
    result = run(small_model(), [RenameRelu(), ClaimsNoChange(really=True), AddZero()])
    assert result.ok
    first, second, third = result.report.passes
    assert [p.validated_with for p in result.report.passes] == [[], [], []]
    assert first.validation.exact and first.validation.max_abs == 0.0
    assert not second.validation.exact and 0 < second.validation.max_abs <= 0.0101
    assert third.validation.exact and third.validation.max_abs == 0.0


def test_resize_nearest_may_change_only_graphs_with_a_resize(fixture_path):
    from onnx_npu_fix.passes.resize_nearest import ResizeNearestPass

    assert not ResizeNearestPass().may_change(onnx.load(fixture_path("tcn.onnx")), FixOptions())
    assert ResizeNearestPass().may_change(onnx.load(fixture_path("unet.onnx")), FixOptions())


def test_a_failure_before_any_change_is_undone_by_reading_the_input_again(tmp_path, no_model_copies):
    path = tmp_path / "m.onnx"
    onnx.save(small_model(), path)
    model = api.load_model(path)
    result = api.fix(model, FixOptions(keep_going=True), [RenameRelu(), ScaleWeights(), AddZero()], source=path)
    assert result.ok
    assert [p.status for p in result.report.passes] == ["validated", "rolled back", "validated"]
    assert_equivalent(small_model(), model)
    crashed = api.load_model(path)
    result = api.fix(crashed, FixOptions(keep_going=True), [RenameRelu(), Crash()], source=path)
    assert [p.status for p in result.report.passes] == ["validated", "rolled back"]
    assert_equivalent(small_model(), crashed)


def test_a_plugin_that_returns_no_result_is_a_failed_pass_with_exit_3(tmp_path):
    """The manager checks the contract (a PassResult, the graph's I/O names kept): a plugin breaking it is a
    failed pass that names it (exit 3), not an internal error (exit 5)."""
    from click.testing import CliRunner

    from onnx_npu_fix.cli import main

    plugin = tmp_path / "forgetful.py"
    plugin.write_text(
        "from onnx_npu_fix.passes.base import Pass\n\n\n"
        "class Forgetful(Pass):\n"
        "    name = 'forgetful'\n"
        "    summary = 'renames the graph output and returns nothing'\n\n"
        "    def run(self, model, options):\n"
        "        model.graph.node[-1].output[0] = model.graph.output[0].name = 'renamed'\n")
    model, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(small_model(), model)
    result = CliRunner().invoke(main, [str(model), "-o", str(out), "--plugin", str(plugin)], catch_exceptions=False)
    assert result.exit_code == 3, result.output
    assert "pass forgetful failed: the pass returned NoneType, not a PassResult" in result.output
    assert not out.exists()


# --- no approximate change for a target that rejects the model anyway -------------------------------------


def _conv_bn_relu_qdq(tmp_path) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu quantized by onnxruntime (QDQ: the BN stays between its own Q/DQ, so
    folding it removes a rounding step), then an Identity before the graph output (an exact cleanup first)."""
    from helpers import conv_bn_relu, quantize_with_onnxruntime

    model = quantize_with_onnxruntime(conv_bn_relu(), tmp_path)
    last = next(n for n in model.graph.node if "z" in n.output)
    last.output[list(last.output).index("z")] = "z_pre"
    model.graph.node.append(helper.make_node("Identity", ["z_pre"], ["z"], name="out_identity"))
    return model


def test_a_target_that_rejects_a_qdq_model_gets_no_approximate_bn_fold(tmp_path):
    """bm1684x refuses QDQ input (quantized-input: no pass fixes it), so folding a quantized BN — a measured,
    approximate change — buys it nothing: fold-batchnorm's run is undone with the reason, the exact cleanup
    before it (validated in the same group until then) stays, and the output computes what the input does.
    rv1106 takes QDQ models: there the fold happens (the control)."""
    from onnx_npu_fix.config.targets import apply_target, load_target
    from onnx_npu_fix.pipeline.report import render_pass_line

    original = _conv_bn_relu_qdq(tmp_path)
    result = api.fix(original, apply_target(load_target("bm1684x"), FixOptions(), {}))
    assert result.ok
    records = {r.name: r for r in result.report.passes}
    bn = records["fold-batchnorm"]
    assert bn.status == "unchanged" and bn.changes == [] and bn.exact
    assert "quantized-input" in bn.metrics["skipped"] and "no pass fixes it" in bn.metrics["skipped"]
    assert "skipped: no approximate change: the target rejects the model anyway" in render_pass_line(bn)
    ops = [n.op_type for n in result.model.graph.node]
    assert "BatchNormalization" in ops and "Identity" not in ops  # cleanup's exact change kept
    assert records["cleanup"].status == "validated"
    assert_equivalent(original, result.model)

    folded = api.fix(original, apply_target(load_target("rv1106"), FixOptions(), {}))
    assert "BatchNormalization" not in [n.op_type for n in folded.model.graph.node]
    assert {r.name: r for r in folded.report.passes}["fold-batchnorm"].quantized_tolerance


@pytest.mark.parametrize("validate", ["each", "none"])
def test_a_declared_approximate_pass_is_skipped_when_an_unfixable_constraint_rejects_the_model(validate):
    """resize-nearest's approximate rewrite (a bilinear Resize made nearest) is undone when a forbidden op no pass
    removes makes the target reject the model anyway; without that op it is kept (the control). Also without
    per-pass validation (no restore point otherwise: the reason is asked before the first pass)."""
    def model(tail_op):
        nodes = [helper.make_node("Resize", ["x", "", "scales"], ["r"], name="up", mode="linear"),
                 helper.make_node(tail_op, ["r"], ["y"], name="tail")]
        vi = helper.make_tensor_value_info
        graph = helper.make_graph(nodes, "g", [vi("x", onnx.TensorProto.FLOAT, [1, 4, 8, 8])],
                                  [vi("y", onnx.TensorProto.FLOAT, [1, 4, 16, 16])],
                                  [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    options = FixOptions(forbidden_ops=("Relu",), validate=validate, align=0)
    refused = api.fix(model("Relu"), options)
    record = {r.name: r for r in refused.report.passes}["resize-nearest"]
    assert "forbidden-op at tail" in record.metrics["skipped"] and record.changes == [] and record.exact
    assert [n.op_type for n in refused.model.graph.node] == ["Resize", "Relu"]
    assert onnx.helper.get_attribute_value(refused.model.graph.node[0].attribute[0]) == b"linear"
    rewritten = api.fix(model("Sigmoid"), options)
    assert "skipped" not in {r.name: r for r in rewritten.report.passes}["resize-nearest"].metrics
    assert any(n.op_type == "Resize" and b"nearest" in n.SerializeToString() for n in rewritten.model.graph.node) \
        or "Resize" not in [n.op_type for n in rewritten.model.graph.node]


# --- the post-condition of a target's forbidden ops ---------------------------------------------------------------


class _DoubleNegation(Pass):
    """Writes Relu's input through Neg -> Neg (the same values): a pass that emits two Negs."""

    name = "double-negation"
    summary = "test"

    def run(self, model, options):
        relu = next(n for n in model.graph.node if n.op_type == "Relu")
        source = relu.input[0]
        relu.input[0] = "twice"
        model.graph.node.extend([helper.make_node("Neg", [source], ["once"], name="neg1"),
                                 helper.make_node("Neg", ["once"], ["twice"], name="neg2")])
        nodes = list(model.graph.node)
        order = [n for n in nodes if n.op_type != "Relu"] + [relu]
        del model.graph.node[:]
        model.graph.node.extend(order)
        return PassResult(changes=[Change("neg1", "Neg", "inserted")])


@pytest.mark.parametrize("forbidden, fails", [(("Neg",), True), (("Sigmoid",), False), ((), False)])
def test_a_pass_that_emits_a_forbidden_op_fails_named(forbidden, fails):
    options = FixOptions(forbidden_ops=forbidden, validate="none")
    model = small_model()
    prepare(model, options)
    failed = run_passes(model, options, [_DoubleNegation()]).report.failed_pass
    if fails:
        assert failed is not None and failed.name == "double-negation"
        assert failed.error == ("the pass emitted 2 Neg, which the target forbids (forbidden_ops); a pass must not "
                                "emit them")
    else:
        assert failed is None


class _Looks(Pass):
    """Finds with GraphIndex.of and records the index; changes nothing."""

    summary = "test pass that reads an index"

    def __init__(self, name: str, seen: list[GraphIndex]) -> None:
        self.name, self.seen = name, seen

    def find(self, model, options):
        self.seen.append(GraphIndex.of(model))
        return Found()

    def rewrite(self, model, options, found):
        return found.report()


class _LooksInItsOwnRun(_Looks):
    """The same, with a run of its own (as fold-constants' rounds): it reads no shared index."""

    def run(self, model, options):
        return self.rewrite(model, options, self.find(model, options))


def test_the_passes_finds_share_one_index_until_a_pass_changes_the_model():
    """The pass manager hands the index a find built to the next passes' finds while none changes the model
    (one walk of the graph for them all), through a pass with a run of its own that changes nothing too, and lets it
    go when one changes the model: the next find reads a fresh index of the changed graph. A run that changes
    nothing hands its index to FixResult (the cost table's and the final check's)."""
    seen: list[GraphIndex] = []
    model = small_model()
    options = FixOptions(validate="none")
    prepare(model, options)
    result = run_passes(model, options, [_Looks("a", seen), _LooksInItsOwnRun("b", seen), _Looks("c", seen),
                                         RenameRelu(), _Looks("d", seen)])
    assert result.ok
    a, b, c, d = seen
    assert c is a and b is not a  # (b's own run built its own)
    assert d is not a and d.model is result.model and "Max" in d.ops and "Relu" not in d.ops
    assert result.graph_index() is not a  # the model changed after a
    unchanged = small_model()
    prepare(unchanged, options)
    seen.clear()
    result = run_passes(unchanged, options, [_Looks("a", seen), _Looks("c", seen)])
    assert seen[0] is seen[1] and result.graph_index() is seen[0]
