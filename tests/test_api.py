"""The library API (docs/api.md): one call for the whole use case, a fix() that leaves its argument alone,
options that check themselves, and the documented example, run as written."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import assert_equivalent

import onnx_npu_fix
from onnx_npu_fix import api, errors
from onnx_npu_fix.cli import main
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.config.targets import parse_profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_public_names_are_exported():
    for name in onnx_npu_fix.__all__:
        assert getattr(onnx_npu_fix, name) is not None, name
    assert onnx_npu_fix.run is api.run and onnx_npu_fix.FixOptions is FixOptions
    assert onnx_npu_fix.StrictRefused is errors.StrictRefused
    with pytest.raises(AttributeError):
        onnx_npu_fix.no_such_name  # noqa: B018


def test_run_does_what_the_cli_does(tmp_path, fixture_path):
    options = FixOptions(max_dilation=4, align=8)
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    outcome = api.run(fixture_path("tcn.onnx"), out, options, report_path=report, command=["test"])
    assert outcome.exit_code == errors.EXIT_OK and outcome.ok
    assert outcome.written == str(out) and outcome.error is None
    assert outcome.violations == [] and outcome.checked is not None
    assert outcome.report.final.passed
    assert_equivalent(onnx.load(fixture_path("tcn.onnx")), onnx.load(out))
    record = json.loads(report.read_text())
    assert record == json.loads(json.dumps(outcome.record))
    assert record["command"] == ["test"] and record["options"] == json.loads(json.dumps(dataclasses.asdict(options)))
    again = api.run(out, options=options, check=True)
    assert again.exit_code == 0 and again.mode == "check" and again.written is None


def test_run_decides_the_exit_code(tmp_path, fixture_path):
    asked = FixOptions(max_rank=2, requested={"max_rank": "option"})
    rank = api.run(fixture_path("tcn.onnx"), tmp_path / "o.onnx", asked, passes=api.select_passes(["cleanup"]))
    assert rank.exit_code == errors.EXIT_VIOLATIONS and rank.written
    assert {v.constraint for v in rank.violations} == {"max-rank"}
    assert rank.not_requested and {why for _, why in rank.not_requested} == {"not requested"}
    everything = api.run(fixture_path("tcn.onnx"), tmp_path / "p.onnx", FixOptions(max_rank=2))
    assert {v.constraint for v in everything.violations} >= {"max-rank"}  # requested None: every finding counts
    with pytest.raises(errors.InputError):
        api.run(tmp_path / "missing.onnx", tmp_path / "q.onnx")


def test_run_reports_a_failed_pass_without_raising(tmp_path, fixture_path, monkeypatch):
    from onnx_npu_fix.passes.cleanup import CleanupPass

    original = CleanupPass.run

    def broken(self, model, options):
        result = original(self, model, options)
        init = model.graph.initializer[0]
        init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) + 1, init.name))
        return result

    monkeypatch.setattr(CleanupPass, "run", broken)
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    outcome = api.run(fixture_path("tcn.onnx"), out, report_path=report)
    assert outcome.exit_code == errors.EXIT_PASS_FAILED
    assert outcome.error.startswith("pass cleanup failed") and outcome.written is None
    assert not out.exists()
    record = json.loads(report.read_text())
    assert record["exit_code"] == 3 and record["output"] is None and _by_name(record, "cleanup")["status"] == "failed"


def test_the_build_record_is_strict_json():
    """An output that overflowed has an infinite error; JSON has no Infinity: such numbers become strings."""
    from onnx_npu_fix.io.save import dumps

    def reject(token):
        raise AssertionError(f"{token} in the build record")

    text = dumps({"max_abs": math.inf, "outputs": [{"rel_l2": math.nan}], "low": -math.inf,
                  "np": np.float32("inf"), "fine": 1.5})
    assert json.loads(text, parse_constant=reject) == {"max_abs": "inf", "outputs": [{"rel_l2": "nan"}],
                                                      "low": "-inf", "np": "inf", "fine": 1.5}


def test_fix_leaves_the_given_model_alone_and_takes_a_path(fixture_path):
    model = onnx.load(fixture_path("unet.onnx"))
    before = model.SerializeToString()
    result = api.fix(model, FixOptions(resize_mode="exact"))
    assert result.ok and result.model is not model
    assert model.SerializeToString() == before
    assert any(p.changes for p in result.report.passes)
    from_path = api.fix(fixture_path("unet.onnx"), FixOptions(resize_mode="exact"))
    assert from_path.ok
    assert_equivalent(model, from_path.model)
    with pytest.raises(TypeError, match="export_onnx"):
        api.fix(object())


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(FixOptions) if f.type in ("float",)])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_no_float_option_takes_nan_or_infinity(field, value):
    with pytest.raises(errors.OptionError) as info:
        FixOptions(**{field: value})
    assert info.value.field == field and isinstance(info.value, ValueError) and info.value.exit_code == 2


@pytest.mark.parametrize("kwargs,expect", [
    ({"align": "8"}, "align must be an integer"),
    ({"align": 8.0}, "align must be an integer"),
    ({"seed": -1}, "seed must be >= 0"),
    ({"n_inputs": 0}, "n_inputs must be >= 1"),
    ({"keep_going": 1}, "keep_going must be true or false"),
    ({"validate": "sometimes"}, "validate must be one of each, final, none"),
    ({"allowed_dilations": (1, 0)}, "allowed_dilations must be >= 1"),
    ({"forbidden_ops": ("Conv", 3)}, "forbidden_ops must be a list of strings"),
    ({"input_shapes": {"x": (1, -2)}}, "input_shapes"),
    ({"rtol": -1e-4}, "rtol must be >= 0"),
])
def test_fixoptions_refuses_bad_values(kwargs, expect):
    with pytest.raises(errors.OptionError, match=re.escape(expect)):
        FixOptions(**kwargs)


def test_fixoptions_normalises_lists_and_ints():
    options = FixOptions(allowed_dilations=[1, 2], rtol=1)
    assert options.allowed_dilations == (1, 2) and isinstance(options.rtol, float)
    hash(options.allowed_dilations)


@pytest.mark.parametrize("line", ["rtol = nan", "max_approx_error = inf", "atol = -inf"])
def test_profiles_refuse_non_finite_values(line):
    with pytest.raises(errors.InputError, match="finite"):
        parse_profile(f"[constraints]\n{line}\n", where="p.toml", default_name="p")


@pytest.mark.parametrize("args,hint", [(["--rtol", "nan"], "--rtol"), (["--atol", "inf"], "--atol"),
                                       (["--max-approx-error", "nan"], "--max-approx-error"),
                                       (["--seed", "-1"], "--seed")])
def test_cli_refuses_the_same_values(tmp_path, fixture_path, args, hint):
    result = CliRunner().invoke(main, [fixture_path("tcn.onnx"), "-o", str(tmp_path / "o.onnx"), *args],
                                catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert hint in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o.onnx").exists()


def test_cli_hands_its_options_to_run_untouched(tmp_path, fixture_path, monkeypatch):
    seen = {}
    real = api.run

    def spy(*args, **kwargs):
        seen["options"] = args[2]
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "run", spy)
    result = CliRunner().invoke(main, [fixture_path("tcn.onnx"), "-o", str(tmp_path / "o.onnx"), "--target",
                                       "mstar-ipu", "--seed", "3", "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    options = seen["options"]
    assert (options.seed, options.align, options.max_dilation, options.target) == (3, 16, 4, "mstar-ipu")
    assert options.requested["max_dilation"] == "target" and options.requested["seed"] == "option"


def _documented_api_example() -> str:
    text = open(os.path.join(ROOT, "docs", "api.md"), encoding="utf-8").read()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_documented_api_example_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.symlink(os.path.join(ROOT, "fixtures"), "fixtures")
    namespace: dict = {}
    exec(compile(_documented_api_example(), "docs/api.md", "exec"), namespace)  # noqa: S102
    printed = capsys.readouterr().out
    assert namespace["outcome"].exit_code == 0
    assert printed.splitlines()[0] == "0 build/tcn_fixed.onnx"
    assert os.path.exists("build/tcn_fixed.onnx") and os.path.exists("build/tcn_report.json")
    assert namespace["report"].clean
    assert np.isfinite(namespace["result"].report.final.max_abs)


def _by_name(record: dict, name: str) -> dict:
    return next(p for p in record["passes"] if p["name"] == name)


@pytest.mark.parametrize("check", [False, True])
def test_an_unknown_input_shape_name_lists_the_inputs_when_fixing_and_checking(tmp_path, fixture_path, check):
    """One prepare (io.load.prepare) for the pass manager and the analyses: one message for the same mistake."""
    options = FixOptions(input_shapes={"nope": (1, 1, 16)})
    output = None if check else tmp_path / "o.onnx"
    with pytest.raises(errors.InputError) as raised:
        api.run(fixture_path("tcn.onnx"), output, options, check=check)
    assert str(raised.value) == "--input-shape names 'nope', which is not a graph input (inputs: mix)"
    assert os.listdir(tmp_path) == []


def test_the_cost_table_and_the_final_check_read_one_index_of_the_output(tmp_path, fixture_path, monkeypatch):
    """The output is indexed once for the cost table and the constraint check of a run (no rebuild
    per consumer); the figures are those of a fresh index."""
    from onnx_npu_fix.analysis.cost import model_cost
    from onnx_npu_fix.constraints import check_model
    from onnx_npu_fix.ir import graph

    built: list[int] = []
    real_init = graph.GraphIndex.__init__

    def counting(self, model):
        built.append(id(model))
        real_init(self, model)

    real_run_passes = api.run_passes

    def passes_then_count(*args, **kwargs):
        result = real_run_passes(*args, **kwargs)
        built.clear()  # what the passes built; from here on the output is read only
        return result

    monkeypatch.setattr(graph.GraphIndex, "__init__", counting)
    monkeypatch.setattr(api, "run_passes", passes_then_count)
    outcome = api.run(fixture_path("tcn.onnx"), tmp_path / "o.onnx", FixOptions(validate="none"))
    result = outcome.result
    assert built == [id(result.model)]
    monkeypatch.setattr(graph.GraphIndex, "__init__", real_init)
    assert result.report.cost[1] == model_cost(result.model)
    fresh = check_model(result.model, FixOptions(validate="none"), prepared=True, memory=False)
    assert [v.to_json() for v in outcome.checked.violations] == [v.to_json() for v in fresh.violations]


@pytest.mark.parametrize("how", ["run", "fix a path", "fix a proto"])
def test_the_model_is_handed_over_to_the_pass_manager_with_no_other_reference(tmp_path, fixture_path,
                                                                              monkeypatch, how):
    """api.run's model read and api.fix's copy are the pass manager's alone (scheduler.OwnedModel): nothing in the
    calls before it holds them, so the proto it replaces after a validated group (and every weight a pass rewrote
    in it, which protobuf never gives back while it lives) is freed then, not at the end of the run."""
    from onnx_npu_fix.pipeline.scheduler import OwnedModel

    refs: list[int] = []
    real_run_passes = api.run_passes

    def counting(model, *args, **kwargs):
        assert isinstance(model, OwnedModel)
        # The index handed over with it (the input's cost table built it) holds it too: the run's alone as well,
        # let go once a pass changes the model (test_pipeline).
        handed = model.index is not None and model.index.model is model.model
        refs.append(sys.getrefcount(model.model) - handed)
        return real_run_passes(model, *args, **kwargs)

    monkeypatch.setattr(api, "run_passes", counting)
    options = FixOptions(max_dilation=4, align=8)
    if how == "run":
        outcome = api.run(fixture_path("tcn.onnx"), tmp_path / "o.onnx", options)
        assert outcome.ok
    else:
        given = fixture_path("tcn.onnx") if how == "fix a path" else api.load_model(fixture_path("tcn.onnx"))
        assert api.fix(given, options).ok
    assert refs == [2]  # the holder's reference and getrefcount's argument
