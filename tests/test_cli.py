"""The npufix command: exit codes, one-line errors, no output on failure, the summary, the report file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import assert_equivalent

from onnx_npu_fix.cli import main


def invoke(*args):
    runner = CliRunner()
    return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)


def assert_one_line_error(result, code=2):
    assert result.exit_code == code, result.output
    text = result.output.strip()
    assert "Traceback" not in text
    assert len(text.splitlines()) == 1, text
    return text


def test_fixes_tcn_fixture_and_matches(tmp_path, fixture_path):
    out = tmp_path / "out.onnx"
    report = tmp_path / "report.json"
    result = invoke(fixture_path("tcn.onnx"), "-o", out, "--max-dilation", "4", "--align", "8",
                    "--report", report)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1] == f"wrote {out}"
    assert lines[0].startswith("fold-constants") and lines[1].startswith("cleanup")
    assert_equivalent(onnx.load(fixture_path("tcn.onnx")), onnx.load(out))
    data = json.loads(report.read_text())
    assert data["report_version"] == 1
    assert data["exit_code"] == 0
    assert data["input"]["sha256"] and data["output"]["sha256"]
    assert data["options"]["max_dilation"] == 4
    assert [p["name"] for p in data["passes"]][:2] == ["fold-constants", "cleanup"]
    removed = [c["node"] for c in data["passes"][1]["changes"] if c["action"] == "removed"]
    assert removed == ["encoder.dropout_4"]


def test_input_file_is_never_modified(tmp_path, fixture_path):
    src = tmp_path / "in.onnx"
    shutil.copy(fixture_path("unet.onnx"), src)
    before = src.read_bytes()
    assert invoke(src, "-o", tmp_path / "o.onnx").exit_code in (0, 1)
    assert src.read_bytes() == before


@pytest.mark.parametrize("content,expect", [
    (None, "no such file"),
    (b"", "empty file"),
    (b"\x8f\x03garbage\xff\xff\xff\xff" * 10, "not an ONNX model"),
])
def test_bad_input_files(tmp_path, content, expect):
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    out = tmp_path / "o.onnx"
    text = assert_one_line_error(invoke(path, "-o", out))
    assert expect in text
    assert not out.exists()


def test_random_bytes_and_truncated_model(tmp_path, fixture_path):
    rng = np.random.default_rng(0)
    for name, data in [("random.onnx", rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()),
                       ("trunc.onnx", open(fixture_path("unet.onnx"), "rb").read()[:20000])]:
        path = tmp_path / name
        path.write_bytes(data)
        out = tmp_path / "o.onnx"
        assert_one_line_error(invoke(path, "-o", out))
        assert not out.exists()
        assert not [p for p in os.listdir(tmp_path) if p.startswith(".o.onnx")]


def test_directory_as_model(tmp_path):
    text = assert_one_line_error(invoke(tmp_path, "-o", tmp_path / "o.onnx"))
    assert "is a directory" in text


def test_dynamic_shape_without_input_shape(tmp_path, fixture_path):
    out = tmp_path / "o.onnx"
    text = assert_one_line_error(invoke(fixture_path("tcn_dynamic.onnx"), "-o", out))
    assert "--input-shape mix:" in text
    assert not out.exists()
    ok = invoke(fixture_path("tcn_dynamic.onnx"), "-o", out, "--input-shape", "mix:1,1,300")
    assert ok.exit_code == 0, ok.output
    fixed = onnx.load(out)
    assert not [n for n in fixed.graph.node if n.op_type in ("Shape", "Gather", "Concat")]
    dims = [d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [1, 1, 300]


def test_bad_option_values(tmp_path, fixture_path):
    out = tmp_path / "o.onnx"
    for args, expect in [(["--input-shape", "mix"], "NAME:D1"), (["--passes", "nope"], "unknown pass"),
                         (["--max-dilation", "0"], "max-dilation")]:
        result = invoke(fixture_path("tcn.onnx"), "-o", out, *args)
        assert result.exit_code == 2, result.output
        assert expect in result.output
        assert "Traceback" not in result.output
    assert not out.exists()


def test_output_path_problems(tmp_path, fixture_path):
    src = tmp_path / "in.onnx"
    shutil.copy(fixture_path("tcn.onnx"), src)
    assert "is the input" in assert_one_line_error(invoke(src, "-o", src))
    assert "does not exist" in assert_one_line_error(invoke(src, "-o", tmp_path / "nope" / "o.onnx"))


def test_missing_output_option(fixture_path):
    result = invoke(fixture_path("tcn.onnx"))
    assert result.exit_code == 2
    assert "-o" in result.output


def test_list_passes_and_help():
    result = invoke("--list-passes")
    assert result.exit_code == 0
    assert result.output.splitlines()[0].startswith("fold-constants")
    help_text = invoke("--help").output
    assert "npufix model.onnx -o fixed.onnx --max-dilation 4 --align 8" in help_text


def test_quiet_prints_nothing_on_success(tmp_path, fixture_path):
    result = invoke(fixture_path("unet.onnx"), "-o", tmp_path / "o.onnx", "-q")
    assert result.output == ""


def test_failed_validation_exits_1_and_writes_nothing(tmp_path, fixture_path, monkeypatch):
    from onnx_npu_fix.passes.cleanup import CleanupPass

    original_run = CleanupPass.run

    def broken(self, model, options):
        result = original_run(self, model, options)
        model.graph.initializer[0].float_data[:] = []
        arr = onnx.numpy_helper.to_array(model.graph.initializer[0])
        model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(arr + 1, model.graph.initializer[0].name))
        return result

    monkeypatch.setattr(CleanupPass, "run", broken)
    out = tmp_path / "o.onnx"
    report = tmp_path / "r.json"
    result = invoke(fixture_path("tcn.onnx"), "-o", out, "--report", report)
    assert result.exit_code == 1
    assert "pass cleanup failed" in result.output
    assert not out.exists()
    data = json.loads(report.read_text())
    assert [p["status"] for p in data["passes"] if p["name"] == "cleanup"] == ["failed"]
    assert data["output"] is None


def test_console_script_subprocess(tmp_path, fixture_path):
    exe = shutil.which("npufix", path=os.path.dirname(sys.executable))
    assert exe, "the npufix console script is installed with the package"
    out = tmp_path / "o.onnx"
    proc = subprocess.run([exe, fixture_path("unet.onnx"), "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    assert proc.stdout == ""
    assert f"wrote {out}" in proc.stderr
    bad = subprocess.run([sys.executable, "-m", "onnx_npu_fix", str(tmp_path / "missing.onnx"), "-o", str(out)],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "no such file" in bad.stderr


def test_external_data_model_round_trips_and_reruns(tmp_path, fixture_path, monkeypatch):
    """Input with external data -> output with external data next to it; a second run over the same output
    works (onnx's own writer refuses when the data file exists in the working directory)."""
    monkeypatch.chdir(tmp_path)
    model = onnx.load(fixture_path("unet.onnx"))
    onnx.save(model, "in.onnx", save_as_external_data=True, location="in.onnx.data", size_threshold=1024)
    for _ in range(2):
        result = invoke("in.onnx", "-o", "out.onnx", "--resize-mode", "exact", "-q")
        assert result.exit_code == 0, result.output
    assert os.path.exists("out.onnx.data")
    assert sorted(os.listdir(tmp_path)) == ["in.onnx", "in.onnx.data", "out.onnx", "out.onnx.data"]
    assert_equivalent(onnx.load("in.onnx"), onnx.load("out.onnx"))


@pytest.mark.parametrize("fixture", ["tcn.onnx", "tcn_causal.onnx", "unet.onnx", "lraspp.onnx", "dilated2d.onnx",
                                     "torch_convtasnet.onnx", "torch_unet.onnx"])
def test_check_raw_fixture_fails_and_its_fixed_output_passes(tmp_path, fixture_path, fixture):
    constraints = ["--max-dilation", "4", "--align", "8"]
    shape = ["--input-shape", "mix:1,4000"] if fixture == "torch_convtasnet.onnx" else []
    raw = invoke(fixture_path(fixture), "--check", *constraints, *shape)
    assert raw.exit_code == 1
    assert "-> fixed by" in raw.output
    out = tmp_path / "fixed.onnx"
    fixed = invoke(fixture_path(fixture), "-o", out, *constraints, *shape, "-q")
    assert fixed.exit_code == 0, fixed.output
    again = invoke(out, "--check", *constraints)
    assert again.exit_code == 0, again.output
    assert "no violations" in again.output


def test_check_json_and_dump_shapes(fixture_path):
    result = invoke(fixture_path("unet.onnx"), "--check", "--format", "json", "--dump-shapes", "--sram", "100KiB",
                    "--act-bytes", "1")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["clean"] is False
    assert {v["constraint"] for v in data["violations"]} >= {"batchnorm", "resize-mode", "out-channels-align",
                                                             "leftover-op", "sram"}
    assert data["memory"]["sram"] == {"bytes": 102400, "fits": False,
                                      "miss_bytes": data["memory"]["peak"]["bytes"] - 102400}
    assert len(data["shapes"]) == len(onnx.load(fixture_path("unet.onnx")).graph.node)


def test_garbage_collector_is_back_on_after_an_in_process_run(tmp_path, fixture_path):
    import gc

    assert gc.isenabled()
    assert invoke(fixture_path("tcn.onnx"), "-o", tmp_path / "o.onnx", "-q").exit_code == 0
    assert gc.isenabled()
    assert invoke(tmp_path / "missing.onnx", "-o", tmp_path / "p.onnx").exit_code == 2
    assert gc.isenabled()


def test_onnxruntime_never_sees_a_file_the_checker_refused(tmp_path, monkeypatch):
    from onnx import helper

    from onnx_npu_fix import api

    started = []
    real = api.start_reference
    monkeypatch.setattr(api, "start_reference", lambda *a, **k: started.append(a) or real(*a, **k))
    not_ssa = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Relu", ["x"], ["y"], name="b")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])]))
    onnx.save(not_ssa, tmp_path / "bad.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x01junk")
    for name in ("bad.onnx", "junk.onnx"):
        assert_one_line_error(invoke(tmp_path / name, "-o", tmp_path / "out.onnx"))
    assert started == []
    assert not (tmp_path / "out.onnx").exists()
