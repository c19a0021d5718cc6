"""The compiler loop keeps every promise a plain run keeps: the paths a run writes checked in one place (after
making them absolute) in every mode, the input read once and every later read compared with it, the requested
options kept for the final check, and the judge's copy of the model refused with one line when it cannot be
written. Every case runs the real command line on a model the tests did not write (fixtures/tcn.onnx) and a
judge run as a subprocess (tests/pattern_judge.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from onnx_npu_fix.cli import main
from onnx_npu_fix.errors import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS

HERE = Path(__file__).resolve().parent
TCN = HERE.parent / "fixtures" / "tcn.onnx"
UNET = HERE.parent / "fixtures" / "unet.onnx"
PATTERN_JUDGE = f"{shlex.quote(sys.executable)} {shlex.quote(str(HERE / 'pattern_judge.py'))}"


def _invoke(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def _files(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` and the SHA-256 of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and not p.is_symlink()}


def _one_line_error(result, *, after_work: bool = False) -> str:
    """The one error line (exit 2); ``after_work``: the last line, after the lines of passes and judge calls
    that ran, else the only line (refused before any work)."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == EXIT_USAGE, result.output
    assert "Traceback" not in result.output, result.output
    assert [line for line in lines if line.startswith("Error")] == lines[-1:], result.output
    assert after_work or len(lines) == 1, result.output
    return lines[-1]


def _external_input(work: Path) -> Path:
    """tcn.onnx with every weight in ``m.bin`` beside it."""
    model = onnx.load(str(TCN))
    onnx.save(model, str(work / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.bin", size_threshold=0)
    assert (work / "m.bin").stat().st_size > 0
    return work / "m.onnx"


# --- one write plan for every mode --------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["-o", "--min-good", "--report"])
def test_reduce_never_writes_over_the_inputs_external_data(tmp_path, option):
    """`reduce in/m.onnx -o in/m.bin` where m.bin holds the input's weights: refused before any work, as a fixing
    run refuses it, and the weights are untouched."""
    model = _external_input(tmp_path)
    before = _files(tmp_path)
    paths = {"-o": tmp_path / "min.onnx", "--min-good": None, "--report": None}
    paths[option] = tmp_path / "m.bin"
    args = [a for key, value in paths.items() if value is not None for a in (key, value)]
    result = _invoke("reduce", model, "--judge", f"{PATTERN_JUDGE} op:Conv {{model}}", *args)
    assert "external data" in _one_line_error(result)
    assert _files(tmp_path) == before


PLUGIN = textwrap.dedent("""
    import os
    from onnx_npu_fix.passes.base import Pass, PassResult

    class Wander(Pass):
        '''Changes nothing but the working directory.'''
        name = "wander"
        summary = "calls os.chdir()"
        exact = True
        TO = {to!r}

        def run(self, model, options):
            os.chdir(self.TO)
            return PassResult()
""")


def test_a_plugin_that_changes_directory_moves_no_output(tmp_path, monkeypatch):
    """Relative -o and --report land where they were given, not in the directory a plugin pass moved to."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    plugin = tmp_path / "wander.py"
    plugin.write_text(PLUGIN.format(to=str(elsewhere)))
    monkeypatch.chdir(work)
    result = _invoke(TCN, "-o", "o.onnx", "--report", "r.json", "--plugin", f"{plugin}:Wander")
    assert result.exit_code == EXIT_OK, result.output
    assert sorted(os.listdir(work)) == ["o.onnx", "r.json"]
    assert os.listdir(elsewhere) == []
    assert json.loads((work / "r.json").read_text())["output"]["path"] == "o.onnx"  # as given


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_split_into_a_broken_symlink_is_refused_up_front(tmp_path, kind):
    """--split DIR that is a looping or dangling symlink: one line naming DIR, before any work (no pass ran),
    nothing written."""
    split = tmp_path / "seg"
    os.symlink(split if kind == "loop" else tmp_path / "nowhere", split)
    before = sorted(os.listdir(tmp_path))
    result = _invoke(TCN, "-o", tmp_path / "o.onnx", "--sram", "1MiB", "--split", split)
    line = _one_line_error(result)
    assert str(split) in line and ".npufix-split" not in line, line
    assert sorted(os.listdir(tmp_path)) == before


# --- the input read once ------------------------------------------------------------------------------------


def test_an_input_replaced_during_the_judge_loop_stops_the_run(tmp_path):
    """The judge replaces the input by another model at each call; the candidates the form search fixes read
    it again: exit 2 (validation.md), nothing written, no record naming the bytes first read."""
    model = tmp_path / "in.onnx"
    model.write_bytes(TCN.read_bytes())
    other = tmp_path / "other.onnx"
    other.write_bytes(UNET.read_bytes())
    judge = f"sh -c 'cp \"$1\" \"$2\"; echo \"error: rejected\"; exit 1' judge {other} {model} {{model}}"
    result = _invoke(model, "-o", tmp_path / "o.onnx", "--report", tmp_path / "r.json", "--max-dilation", "4",
                     "--judge", judge)
    assert "changed while npufix ran" in _one_line_error(result, after_work=True)
    assert sorted(os.listdir(tmp_path)) == ["in.onnx", "other.onnx"]


# --- the requested options kept for the final check --------------------------------------------------------


@pytest.mark.parametrize("request_args", [("--align", "8"), ("--target", "stm32n6")])
def test_a_form_that_gives_up_a_requested_constraint_is_reported(tmp_path, request_args):
    """A judge that rejects align-channels' Slice accepts the form "align 8 -> 0"; the output is then checked
    against what was asked (--align 8), so it reports the unaligned convs (exit 1) as --check on it does; the
    record names the accepted form's options."""
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    result = _invoke(TCN, "-o", out, "--report", report, *request_args, "--judge",
                     f"{PATTERN_JUDGE} op:Slice {{model}}")
    record = json.loads(report.read_text())
    assert record["judge"]["accepted"], result.output
    assert record["judge"]["changed"]["align"]["to"] == 0, record["judge"]
    assert record["options"]["align"] == 0
    checked = _invoke("--check", out, *request_args)
    assert checked.exit_code == EXIT_VIOLATIONS, checked.output
    assert result.exit_code == EXIT_VIOLATIONS, result.output
    assert {v["constraint"] for v in record["violations"]} >= {"in-channels-align", "out-channels-align"}


# --- the judge's copy of the model ---------------------------------------------------------------------------


def _small_file_limit() -> None:
    """In the child: no file may grow past 2,000 bytes (a full TMPDIR, as write() sees it: EFBIG)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))


@pytest.mark.parametrize("mode", ["reduce", "judge"])
def test_a_full_tmpdir_while_writing_the_judges_copy_is_one_line(tmp_path, mode):
    work = tmp_path / "work"
    work.mkdir()
    judge = ["--judge", f"{PATTERN_JUDGE} op:Conv {{model}}"]
    args = (["reduce", TCN, "-o", work / "min.onnx", *judge] if mode == "reduce"
            else [TCN, "-o", work / "o.onnx", "--validate", "none", *judge])
    proc = subprocess.run([sys.executable, "-m", "onnx_npu_fix", *map(str, args)], capture_output=True, text=True,
                          preexec_fn=_small_file_limit, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if "rror" in line or "cannot" in line]
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "Traceback" not in proc.stderr and len(errors) == 1 and "judge's copy" in errors[0], proc.stderr
    assert os.listdir(work) == []


@pytest.mark.parametrize("mode", ["reduce", "judge"])
def test_a_model_over_the_one_file_limit_is_refused_with_one_line(tmp_path, monkeypatch, mode):
    """A model protobuf cannot serialize in one piece (the limit lowered to below tcn.onnx's size): exit 2, one
    line, nothing written, instead of the serializer's crash."""
    from onnx_npu_fix.judge import candidates

    monkeypatch.setattr(candidates, "JUDGE_FILE_LIMIT", 1000)
    model = _external_input(tmp_path)  # as a model over 2 GB is read: its weights beside it
    before = _files(tmp_path)
    judge = ["--judge", f"{PATTERN_JUDGE} op:Conv {{model}}"]
    args = (["reduce", model, "-o", tmp_path / "min.onnx", *judge] if mode == "reduce"
            else [model, "-o", tmp_path / "o.onnx", *judge])
    assert "one ONNX file" in _one_line_error(_invoke(*args), after_work=True)
    assert _files(tmp_path) == before


def test_a_quoted_model_placeholder_with_a_space_in_tmpdir_names_the_real_file(tmp_path):
    """TMPDIR holds a space and the template quotes "{model}" itself: the judge must get the path of the file
    written, so that a grep-style judge (passes unless the model holds a Conv) rejects tcn.onnx."""
    scratch = tmp_path / "a b"
    scratch.mkdir()
    out = tmp_path / "min.onnx"
    judge = "sh -c '! grep -q Conv \"$1\"' judge \"{model}\""
    proc = subprocess.run([sys.executable, "-m", "onnx_npu_fix", "reduce", str(TCN), "-o", str(out), "--judge",
                           judge], capture_output=True, text=True, env={**os.environ, "TMPDIR": str(scratch)},
                          timeout=300)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert out.exists()


@pytest.mark.parametrize("path", ["/tmp/a b/model.onnx", "/tmp/it's/m $x `y` \"z\".onnx", "/tmp/plain/model.onnx"])
@pytest.mark.parametrize("template", ["printf %s {model}", 'printf %s "{model}"', "printf %s '{model}'",
                                      'printf %s "x={model}"'])
def test_the_placeholder_is_quoted_for_where_it_stands(template, path):
    """Bare, inside the template's double quotes or its single quotes: the shell sees the path as written."""
    from onnx_npu_fix.judge.command import substitute

    command = substitute(template, {"{model}": path, "{dir}": "/unused"})
    printed = subprocess.run(command, shell=True, capture_output=True, text=True, check=True).stdout
    assert printed == ("x=" if "x=" in template else "") + path
