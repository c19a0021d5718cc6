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
from helpers import assert_equivalent, signal_when
from onnx import TensorProto, helper

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
    for args, expect in [(["--input-shape", "mix"], "[NAME:]D1"), (["--passes", "nope"], "unknown pass"),
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


def test_dump_shapes_without_output_is_check_dump_shapes(tmp_path, fixture_path, monkeypatch):
    """The first debugging step needs no -o: `npufix model.onnx --dump-shapes` prints what `--check --dump-shapes`
    prints, exits as it does, and writes nothing."""
    model = os.path.abspath(fixture_path("unet.onnx"))
    monkeypatch.chdir(tmp_path)
    shapes = invoke(model, "--dump-shapes", "--target", "stm32n6")
    checked = invoke(model, "--check", "--dump-shapes", "--target", "stm32n6")
    assert shapes.exit_code == checked.exit_code == 1  # the U-Net violates stm32n6's constraints
    assert shapes.output == checked.output and "enc1.conv_2" in shapes.output and "[1,20,32,32]" in shapes.output
    assert invoke(model, "--dump-shapes", "--format", "json").output == \
        invoke(model, "--check", "--dump-shapes", "--format", "json").output
    assert os.listdir(tmp_path) == []


def test_list_passes_and_help():
    result = invoke("--list-passes")
    assert result.exit_code == 0
    assert result.output.splitlines()[0].startswith("fold-constants")
    help_text = invoke("--help").output
    assert "npufix model.onnx -o fixed.onnx --max-dilation 4 --align 8" in help_text


def test_quiet_prints_nothing_on_success(tmp_path, fixture_path):
    result = invoke(fixture_path("unet.onnx"), "-o", tmp_path / "o.onnx", "-q", "--resize-mode", "exact")
    assert result.exit_code == 0 and result.output == ""
    # the default approximates the U-Net's bilinear Resizes: that one line stays
    result = invoke(fixture_path("unet.onnx"), "-o", tmp_path / "o.onnx", "-q")
    assert result.output.startswith("APPROXIMATE: ") and result.output.count("\n") == 1, result.output


def test_failed_validation_exits_3_and_writes_nothing(tmp_path, fixture_path, monkeypatch):
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
    assert result.exit_code == 3
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


def test_check_imports_nothing_a_later_step_needs(fixture_path):
    """``--check`` is the fast path (near the cost of onnx.load + onnx.save): it loads neither onnxruntime
    nor the judge, the graphsurgeon adapter, matplotlib or jsonschema, which only other steps use."""
    heavy = ("onnxruntime", "onnx_npu_fix.judge", "onnx_graphsurgeon", "onnx_npu_fix.plugins.graphsurgeon",
             "matplotlib", "jsonschema")
    code = ("import atexit\natexit.register(lambda: print(sorted(m for m in sys.modules if "
            f"m.startswith({heavy!r})), file=sys.stderr))")
    proc = _npufix(fixture_path("unet.onnx"), "--check", "-q", code=code)
    assert proc.returncode in (0, 1), proc.stderr
    assert proc.stderr.decode().strip().splitlines()[-1] == "[]"


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
def test_check_raw_fixture_fails_and_its_fixed_output_passes(fixture_path, fixed_fixture, fixture):
    constraints = ["--max-dilation", "4", "--align", "8"]
    shape = ["--input-shape", "mix:1,4000"] if fixture == "torch_convtasnet.onnx" else []
    raw = invoke(fixture_path(fixture), "--check", *constraints, *shape)
    assert raw.exit_code == 1
    assert "-> fixed by" in raw.output
    fixed = fixed_fixture(fixture, *constraints, *shape)  # the same run test_real_models checks
    assert fixed.result.exit_code == 0, fixed.result.output
    again = invoke(fixed.out, "--check", *constraints)
    assert again.exit_code == 0, again.output
    assert "no violations" in again.output


def test_check_json_and_dump_shapes(fixture_path):
    result = invoke(fixture_path("unet.onnx"), "--check", "--format", "json", "--dump-shapes", "--sram", "100KiB",
                    "--act-bytes", "1")
    assert result.exit_code == 1
    data = json.loads(result.output)["models"][0]
    assert data["clean"] is False and data["path"] == fixture_path("unet.onnx")
    # Only --sram was asked for: the default constraints are findings that do not count.
    assert {v["constraint"] for v in data["violations"]} == {"sram", "sram-layer"}  # a layer alone is above 100 KiB
    assert {v["constraint"] for v in data["not_requested"]} >= {"batchnorm", "resize-mode", "out-channels-align",
                                                                "leftover-op"}
    assert {v["reason"] for v in data["not_requested"]} == {"not requested"}
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


# --- exit codes, end to end (README, docs/cli.md): each code means one thing ------------------------------------

def _npufix(*args, code: str = "", timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """npufix in a real process; ``code`` runs first in it (e.g. a monkeypatch that breaks a pass)."""
    program = f"import sys\n{code}\nfrom onnx_npu_fix.cli import main\nsys.argv[0] = 'npufix'\nmain()\n"
    return subprocess.run([sys.executable, "-c", program, *map(str, args)], capture_output=True, timeout=timeout,
                          **kwargs)


_BREAK_CLEANUP = """
import numpy as np, onnx
from onnx_npu_fix.passes.cleanup import CleanupPass
_run = CleanupPass.run
def broken(self, model, options):
    result = _run(self, model, options)
    init = model.graph.initializer[0]
    init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) + 1, init.name))
    return result
CleanupPass.run = broken
"""
_STRICT = """
from onnx_npu_fix import api, errors
def refuse(*a, **k):
    raise errors.StrictRefused("--strict: resize-nearest would change 3 Resize nodes approximately; nothing written")
api._fix_in_place = refuse
"""
_BUG = """
from onnx_npu_fix import constraints
def bug(*a, **k):
    raise ZeroDivisionError("a bug")
constraints.check_model = bug
"""


def _stderr_lines(proc) -> list[str]:
    return proc.stderr.decode("utf-8", "replace").strip().splitlines()


@pytest.mark.parametrize("args,code,phrase,real_process", [
    (["--max-dilation", "4", "--align", "8"], 0, "wrote", True),
    (["--passes", "cleanup"], 0, "not counted", False),  # the default align 8 / BN / nearest are not constraints
    (["--skip", "dilated-conv", "--max-dilation", "4"], 0, "pass dilated-conv was not run", False),
    (["--max-rank", "2"], 1, "unfixed: mix (graph input): max-rank: 3 vs max 2", True),
    (["--target", "k210", "--passes", "cleanup"], 1, "unfixed:", False),
    (["--sram", "1KiB"], 1, "unfixed: ", False),  # reorder-memory is opt-in: not running it skips nothing
    (["--rtol", "nan"], 2, "--rtol", True),
    (["--seed", "-1"], 2, "--seed", False),
])
def test_fixing_run_exit_codes(tmp_path, fixture_path, args, code, phrase, real_process):
    """Each case through click's runner; one case per exit code also in a real process, where the code is the
    process's exit status (the runner has shown which case gives which code)."""
    out = tmp_path / "o.onnx"
    result = invoke(fixture_path("tcn.onnx"), "-o", out, *args)
    assert result.exit_code == code, result.output
    assert phrase in result.output
    assert out.exists() == (code in (0, 1))
    if real_process:
        proc = _npufix(fixture_path("tcn.onnx"), "-o", tmp_path / "p.onnx", *args)
        assert proc.returncode == code, proc.stderr
        assert b"Traceback" not in proc.stderr


def test_passes_cleanup_exits_0_on_every_static_fixture(tmp_path, fixture_path):
    for name in ("tcn.onnx", "tcn_causal.onnx", "unet.onnx", "lraspp.onnx", "dilated2d.onnx", "torch_unet.onnx"):
        result = invoke(fixture_path(name), "-o", tmp_path / "o.onnx", "--passes", "cleanup")
        assert result.exit_code == 0, (name, result.output)
        assert "unfixed:" not in result.output


def test_skipped_pass_constraint_counts_when_the_target_requires_it(tmp_path, fixture_path):
    result = invoke(fixture_path("tcn.onnx"), "-o", tmp_path / "o.onnx", "--target", "mstar-ipu",
                    "--skip", "dilated-conv")
    assert result.exit_code == 1, result.output
    assert "unfixed: block3.depth_conv_138 (Conv): dilation: [8] vs max 4" in result.output


def test_check_mode_says_which_defaults_it_checks(fixture_path):
    plain = invoke(fixture_path("unet.onnx"), "--check")
    assert plain.exit_code == 1
    assert plain.output.splitlines()[0].startswith("checking npufix's default constraints (align 8")
    asked = invoke(fixture_path("unet.onnx"), "--check", "--max-dilation", "4")
    assert asked.exit_code == 0, asked.output  # unet has no dilation: the defaults are listed as not counted
    assert "checking npufix's default" not in asked.output
    assert "findings of constraints not asked for are not counted" in asked.output
    target = invoke(fixture_path("unet.onnx"), "--check", "--target", "stm32n6")
    assert target.exit_code == 1 and "batchnorm" in target.output


def test_failed_pass_exits_3_in_a_real_process(tmp_path, fixture_path):
    out = tmp_path / "o.onnx"
    proc = _npufix(fixture_path("tcn.onnx"), "-o", out, "-q", code=_BREAK_CLEANUP)
    assert proc.returncode == 3, proc.stderr
    assert _stderr_lines(proc)[-1].startswith("error: pass cleanup failed")
    assert os.listdir(tmp_path) == []


def test_strict_refusal_exits_4(tmp_path, fixture_path, monkeypatch):
    from onnx_npu_fix import api, errors
    assert errors.StrictRefused.exit_code == 4 and issubclass(errors.StrictRefused, errors.NpufixError)

    def refuse(*args, **kwargs):
        raise errors.StrictRefused("--strict: an approximate change would be needed")

    monkeypatch.setattr(api, "_fix_in_place", refuse)
    text = assert_one_line_error(invoke(fixture_path("unet.onnx"), "-o", tmp_path / "o.onnx"), code=4)
    assert "--strict" in text
    proc = _npufix(fixture_path("unet.onnx"), "-o", tmp_path / "o.onnx", code=_STRICT)
    assert proc.returncode == 4 and len(_stderr_lines(proc)) == 1, proc.stderr
    assert os.listdir(tmp_path) == []


def test_internal_error_exits_5_in_one_line(tmp_path, fixture_path, monkeypatch):
    from onnx_npu_fix import constraints
    monkeypatch.setattr(constraints, "check_model", lambda *a, **k: 1 / 0)
    result = invoke(fixture_path("tcn.onnx"), "-o", tmp_path / "o.onnx", "-q")
    assert result.exit_code == 5
    assert "internal error (ZeroDivisionError" in result.output
    proc = _npufix(fixture_path("tcn.onnx"), "-o", tmp_path / "o.onnx", "-q", code=_BUG)
    assert proc.returncode == 5, proc.stderr
    assert len(_stderr_lines(proc)) == 1 and b"Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == []


_HANG_AFTER_EARLY_WRITE = """
import os, time
from onnx_npu_fix import api
_start = api.EarlyWrite.start
def start(self, data):
    _start(self, data)
    open(os.environ["NPUFIX_MARK"], "w").close()
    time.sleep(60)
api.EarlyWrite.start = start
"""


@pytest.mark.parametrize("signum,code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_removes_the_temporary_files(tmp_path, fixture_path, signum, code):
    """Cancelled while the output is being written early (a .npufix-*.tmp next to it): the temporary file goes,
    nothing is written, and the exit code says which signal."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    mark = tmp_path / "mark"
    program = f"import sys\n{_HANG_AFTER_EARLY_WRITE}\nfrom onnx_npu_fix.cli import main\nmain()\n"
    proc = subprocess.Popen([sys.executable, "-c", program, fixture_path("tcn.onnx"), "-o", str(out_dir / "o.onnx"),
                             "--report", str(out_dir / "r.json"), "-q"],
                            stderr=subprocess.PIPE, env={**os.environ, "NPUFIX_MARK": str(mark)})
    err = signal_when(proc, mark.exists, signum, meanwhile=lambda: _early_write_under_way(out_dir))
    assert proc.returncode == code, err
    assert b"Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert os.listdir(out_dir) == []


def _early_write_under_way(out_dir) -> None:
    assert [p for p in os.listdir(out_dir) if p.startswith(".npufix-")]  # a temporary file next to the output


def test_closed_stdout_ends_quietly(fixture_path):
    """`npufix --check a b ... | head -1`: the reader goes away; no BrokenPipeError traceback, exit 141."""
    models = [fixture_path(n) for n in ("unet.onnx", "tcn.onnx", "lraspp.onnx", "torch_unet.onnx")] * 8
    proc = subprocess.Popen([sys.executable, "-m", "onnx_npu_fix", "--check", "--dump-shapes", *models],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # more than a pipe buffer of output is still to come
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert first.startswith(b"checking npufix's default") or first.startswith(fixture_path("unet.onnx").encode())
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err
    assert proc.returncode == 141


def test_check_several_models_one_json_document_and_prefixed_text(fixture_path):
    tcn, unet = fixture_path("tcn.onnx"), fixture_path("unet.onnx")
    result = invoke(tcn, unet, "--check", "--format", "json", "--max-dilation", "4")
    assert result.exit_code == 1
    data = json.loads(result.output)["models"]  # one document, not concatenated objects
    assert [d["path"] for d in data] == [tcn, unet]
    assert [d["clean"] for d in data] == [False, True]
    text = invoke(tcn, unet, "--check", "--max-dilation", "4", "-q")
    assert text.exit_code == 1
    lines = text.output.splitlines()
    assert lines and all(line.startswith(f"{tcn}: ") for line in lines)  # -q: only the findings
    assert f"{tcn}: block3.depth_conv_138 (Conv): dilation: [8] vs max 4 -> fixed by dilated-conv" in lines
    broken = invoke(tcn, "/nonexistent/m.onnx", "--check", "--format", "json", "--max-dilation", "4")
    assert broken.exit_code == 2
    document = json.loads(broken.output[broken.output.index("{"):])
    assert "no such file" in document["models"][1]["error"] and document["exit_code"] == 2


# --- files: nothing the run writes is anything it reads or writes ------------------------------------------------

def _external_copy(tmp_path, fixture_path, name="in.onnx"):
    model = onnx.load(fixture_path("unet.onnx"))
    onnx.save(model, str(tmp_path / name), save_as_external_data=True, location=name + ".data",
              size_threshold=1024)
    return tmp_path / name


def test_report_cannot_be_the_outputs_external_data(tmp_path, fixture_path):
    src = _external_copy(tmp_path, fixture_path)
    before = sorted(os.listdir(tmp_path))
    out = tmp_path / "o.onnx"
    text = assert_one_line_error(invoke(src, "-o", out, "--report", f"{out}.data"))
    assert f"--report {out}.data" in text and "the output's external data" in text
    text = assert_one_line_error(invoke(src, "-o", out, "--report", f"{src}.data"))
    assert "the input's external data" in text and f"{src}.data" in text
    assert sorted(os.listdir(tmp_path)) == before


def test_report_temp_name_never_clobbers_another_file(tmp_path, fixture_path):
    """The report was written through '<report>.tmp': an input of that name was destroyed, an output of that name
    vanished. Now its temporary file has a unique name."""
    src = tmp_path / "r.json.tmp"
    shutil.copy(fixture_path("tcn.onnx"), src)
    before = src.read_bytes()
    result = invoke(src, "-o", tmp_path / "o.onnx", "--report", tmp_path / "r.json", "-q")
    assert result.exit_code == 0, result.output
    assert src.read_bytes() == before
    result = invoke(fixture_path("tcn.onnx"), "-o", tmp_path / "x.json.tmp", "--report", tmp_path / "x.json", "-q")
    assert result.exit_code == 0, result.output
    assert_equivalent(onnx.load(fixture_path("tcn.onnx")), onnx.load(tmp_path / "x.json.tmp"))
    assert json.loads((tmp_path / "x.json").read_text())["exit_code"] == 0
    assert sorted(os.listdir(tmp_path)) == ["o.onnx", "r.json", "r.json.tmp", "x.json", "x.json.tmp"]


def test_output_naming_a_directory_or_with_a_data_directory(tmp_path, fixture_path):
    (tmp_path / "out").mkdir()
    text = assert_one_line_error(invoke(fixture_path("tcn.onnx"), "-o", f"{tmp_path}/out/new.onnx/"))
    assert "names a directory" in text
    (tmp_path / "out" / "m.onnx.data").mkdir()
    result = invoke(fixture_path("tcn.onnx"), "-o", tmp_path / "out" / "m.onnx")
    text = assert_one_line_error(result)
    assert f"{tmp_path / 'out' / 'm.onnx'}.data is a directory" in text  # found before any pass ran
    assert sorted(os.listdir(tmp_path / "out")) == ["m.onnx.data"]


def test_non_utf8_file_names(tmp_path, fixture_path):
    """File names that are not UTF-8, in real processes: how the process's streams carry such names is the
    behaviour (click's runner replaces the streams, and click 8.0's refuses the surrogates a real stderr escapes)."""
    src = os.path.join(os.fsencode(tmp_path), b"\xff\xfe.onnx")
    shutil.copy(fixture_path("tcn.onnx"), src)
    out = os.path.join(os.fsencode(tmp_path), b"out\xff.onnx")
    proc = subprocess.run([sys.executable, "-m", "onnx_npu_fix", src, "-o", out, "--max-dilation", "4",
                           "--report", os.path.join(os.fsencode(tmp_path), b"r\xff.json")],
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert os.path.exists(os.path.join(os.fsencode(tmp_path), b"r\xff.json"))
    assert_equivalent(onnx.load(fixture_path("tcn.onnx")), onnx.load(out))
    check = subprocess.run([sys.executable, "-m", "onnx_npu_fix", src, "--check", "-q"], capture_output=True,
                           timeout=120)
    assert check.returncode == 1 and b"Traceback" not in check.stderr, check.stderr
    assert b"\\udcff\\udcfe.onnx: " in check.stdout  # escaped, one finding per line


def test_onnxruntime_log_lines_do_not_reach_stderr(tmp_path):
    """A model onnx accepts and onnxruntime fails to run (a Gather index out of range, seen only at run time):
    onnxruntime logs the failure itself, in colour, unless told not to. stderr holds npufix's lines only."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(  # the Identity makes cleanup change something, so the original is run
        [helper.make_node("Identity", ["x"], ["t"], name="id"),
         helper.make_node("Gather", ["t", "i"], ["y"], axis=1, name="g")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])],
        [onnx.numpy_helper.from_array(np.array([10], np.int64), "i")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, tmp_path / "m.onnx")
    proc = subprocess.run([sys.executable, "-m", "onnx_npu_fix", str(tmp_path / "m.onnx"), "-o",
                           str(tmp_path / "o.onnx")], capture_output=True, timeout=120)
    assert b"out of data bounds" in proc.stderr  # npufix says what onnxruntime found (whatever the exit code)
    assert b"onnxruntime:" not in proc.stderr and b"\x1b[" not in proc.stderr, proc.stderr
    assert b"Traceback" not in proc.stderr


def test_an_option_named_like_its_field_needs_no_mapping():
    from onnx_npu_fix.cli import _OPTION_FIELDS, _option_fields

    mapping = _option_fields({"keep_going": False, "align": 8, "sram": None, "not_a_field": 1})
    assert mapping["keep_going"] == "keep_going" and mapping["sram"] == "sram_bytes"
    assert "not_a_field" not in mapping
    assert set(mapping) >= set(_OPTION_FIELDS)
    assert [p for p, field_name in _OPTION_FIELDS.items() if p == field_name] == []  # renames only


def test_choices_are_those_fixoptions_accepts():
    """Every click.Choice of a FixOptions field lists options.CHOICES (not a copy that could drift), and every field
    with CHOICES that is a command-line option is a click.Choice."""
    import click

    from onnx_npu_fix.cli import _option_fields
    from onnx_npu_fix.config.options import CHOICES

    fields = _option_fields({p.name: None for p in main.params})
    choices = {fields[p.name]: list(p.type.choices) for p in main.params
               if isinstance(p.type, click.Choice) and p.name in fields}
    assert choices == {name: list(values) for name, values in CHOICES.items() if name in fields.values()}
    assert set(choices) == {"s2b_layout", "bn_standalone", "resize_mode", "validate", "remainder_pad"}


def test_a_zero_dimension_is_refused_with_fixoptions_message(tmp_path, fixture_path):
    """--input-shape only parses NAME:D1,...; the dims' range is FixOptions' rule, with its message."""
    result = invoke(fixture_path("tcn_dynamic.onnx"), "-o", tmp_path / "o.onnx", "--input-shape", "mix:1,0,300")
    assert result.exit_code == 2, result.output
    assert "--input-shape" in result.output and "input_shapes: input 'mix' has a dimension < 1: [1, 0, 300]" \
        in result.output
    assert not (tmp_path / "o.onnx").exists()


def test_a_pass_that_crashes_is_a_failed_pass(tmp_path, fixture_path, monkeypatch):
    from onnx_npu_fix.passes.cleanup import CleanupPass

    def crash(self, model, options):
        raise RuntimeError("boom")

    monkeypatch.setattr(CleanupPass, "run", crash)
    result = invoke(fixture_path("tcn.onnx"), "-o", tmp_path / "o.onnx", "-q")
    assert result.exit_code == 3, result.output
    assert result.output.startswith("error: pass cleanup failed") and "boom" in result.output
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("external", [False, True])
def test_record_hashes_are_those_of_the_files(tmp_path, fixture_path, external):
    """The record's input hash is the digest of the bytes read and its output hash that of the bytes written
    (taken from memory when the run has them): both must equal the files' own SHA-256."""
    import hashlib

    src = _external_copy(tmp_path, fixture_path) if external else fixture_path("tcn.onnx")
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    assert invoke(src, "-o", out, "--report", report, "-q").exit_code == 0
    record = json.loads(report.read_text())
    assert record["input"]["sha256"] == hashlib.sha256(open(src, "rb").read()).hexdigest()
    assert record["output"]["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()


def _small_model(path):
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("args, message", [
    (("--max-approx-error", "nan"), "--max-approx-error"),
    (("--rtol", "inf"), "--rtol"),
    (("--seed", "-1"), "--seed"),
    (("--sram", "nanKiB"), "--sram"),
    (("--validation-inputs", "0"), "--validation-inputs"),
    (("--no-such-option",), "No such option"),
    (("{model}", "--check", "--report", "r.json"), "several MODELs"),
])
def test_usage_errors_are_one_line(tmp_path, args, message):
    # click printed three lines (Usage:, Try ..., Error: ...); the docs promise one.
    model = _small_model(tmp_path / "m.onnx")
    args = [str(model) if a == "{model}" else a for a in args]
    result = invoke(model, "-o", tmp_path / "o.onnx", *args)
    text = assert_one_line_error(result)
    assert text.startswith("Error: ") and message in text
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("args, message", [
    (("-o", "{out}", "--freeze-input", "x=1", "--freeze-input", "x=2"), "gives input 'x' two values (1 and 2)"),
    (("--check", "--freeze-input", "x=1"), "--freeze-input does not apply to --check"),
    (("{model}", "--check", "--memory-plot", "{plot}"), "--memory-plot draws one model"),
])
def test_options_that_cannot_all_hold_are_refused(tmp_path, args, message):
    # The last --freeze-input won silently; --check ignored --freeze-input; --check of two models with
    # --memory-plot drew nothing and said nothing.
    model = _small_model(tmp_path / "m.onnx")
    names = {"{model}": str(model), "{out}": str(tmp_path / "o.onnx"), "{plot}": str(tmp_path / "p.png")}
    result = invoke(model, *[names.get(a, a) for a in args])
    assert message in assert_one_line_error(result)
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_input_shape_without_a_name_freezes_the_one_input(tmp_path, fixture_path):
    """onnxsim's nameless form: --input-shape 1,1,300 on a model with one input is that input's shape."""
    out = tmp_path / "o.onnx"
    result = invoke(fixture_path("tcn_dynamic.onnx"), "-o", out, "--input-shape", "1,1,300", "--report",
                    tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    dims = [d.dim_value for d in onnx.load(out).graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 1, 300]
    named = invoke(fixture_path("tcn_dynamic.onnx"), "--check", "--input-shape", "mix:1,1,300")
    nameless = invoke(fixture_path("tcn_dynamic.onnx"), "--check", "--input-shape", "1,1,300")
    assert nameless.output == named.output and nameless.exit_code == named.exit_code


def test_input_shape_without_a_name_on_several_inputs_names_them(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "two",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    text = assert_one_line_error(invoke(path, "-o", tmp_path / "o.onnx", "--input-shape", "2,4"))
    assert "--input-shape without a name needs a model with one input; this one has 2 (a, b)" in text
    assert not (tmp_path / "o.onnx").exists()
    twice = assert_one_line_error(invoke(path, "--check", "--input-shape", "2,4", "--input-shape", "3,4"))
    assert "given twice" in twice


@pytest.mark.parametrize(("size", "says"), [("3.1MiB", "not whole bytes"), ("384KB", "the binary units are B, KiB"),
                                            ("0.5", "e.g. 0.5KiB or 0.5MiB")])
def test_sram_size_errors_say_why(fixture_path, size, says):
    text = assert_one_line_error(invoke(fixture_path("tcn.onnx"), "--check", "--sram", size))
    assert says in text and "--sram" in text


def test_declared_minus_one_dims_mean_any_size(tmp_path):
    """Paddle2ONNX writes ``dim_value: -1`` for "any size" (PP-OCR's classifier, shipped in rapidocr's wheel): with
    the input frozen by --input-shape, strict shape inference met the output's -1 and fold-constants failed
    (exit 3). Such a dimension is unknown: the run fixes and validates the model, and the output declares the
    real size."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3, 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["i"], name="identity"),
                               helper.make_node("Relu", ["i"], ["y"], name="relu")], "paddle", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    source, out = tmp_path / "paddle.onnx", tmp_path / "out.onnx"
    onnx.save(model, source)
    result = invoke(source, "-o", out, "--input-shape", "x:1,3,4")
    assert result.exit_code == 0, result.output
    assert [d.dim_value for d in onnx.load(out).graph.output[0].type.tensor_type.shape.dim] == [1, 3, 4]
