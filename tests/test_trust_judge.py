"""The compiler loop and the data readers keep a plain run's promises under hostile judges and hostile files: a
judge's own exit status is its verdict however it leaves its helpers, its coloured output makes a valid profile,
and validation / freeze data that lies about its size, nests without end or never ends is a one-line usage error
(exit 2, nothing written) rather than a crash or a hang.

Calls that could hang run in a subprocess with a timeout far above the judge's: a hang fails the test instead of
stopping the suite."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
HANG = 120
"""Seconds a judge's helper lives; a call that waits for it outlives the subprocess timeout below."""
SUBPROCESS_TIMEOUT = 60


def _judge_in_subprocess(template: str, timeout: float | None) -> dict:
    """One Judge call on a few bytes, in a fresh interpreter: the verdict as a dict."""
    program = ("import json, sys\nfrom onnx_npu_fix.judge.command import Judge\n"
               "v = Judge(sys.argv[1], timeout=None if sys.argv[2] == 'none' else float(sys.argv[2])).judge(b'x')\n"
               "print(json.dumps({'kind': v.kind, 'exit_code': v.exit_code, 'signature': v.signature}))\n")
    proc = subprocess.run([sys.executable, "-c", program, template, str(timeout).lower()], capture_output=True,
                          text=True, timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _state(pid: int) -> str | None:
    """The process's state letter from /proc (Z: a zombie, dead), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _kill(pid_file) -> None:
    if pid_file.exists() and pid_file.read_text().strip():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")


@pytest.mark.skipif(not hasattr(os, "setsid") or not os.path.exists("/usr/bin/setsid")
                    and not any(os.path.exists(os.path.join(d, "setsid"))
                                for d in os.environ.get("PATH", "").split(os.pathsep)),
                    reason="needs the setsid program")
def test_a_judge_that_leaves_a_helper_in_its_own_session_is_judged_by_its_own_exit(tmp_path):
    """The helper keeps the judge's output open in a session the group kill cannot reach; the judge itself exits
    1 at once. That exit is the verdict (a fail), and the call does not wait for the helper."""
    pid_file = tmp_path / "helper.pid"
    script = tmp_path / "judge.sh"
    script.write_text(f"#!/bin/sh\nsetsid sh -c 'echo $$ > {shlex.quote(str(pid_file))}; exec sleep {HANG}' &\n"
                      f"echo 'error: layer 3 rejected'\nexit 1\n")
    script.chmod(0o755)
    try:
        verdict = _judge_in_subprocess(f"{shlex.quote(str(script))} {{model}}", timeout=2)
    finally:
        _kill(pid_file)
    assert verdict == {"kind": "fail", "exit_code": 1, "signature": "error: layer <n> rejected"}


@needs_proc
@pytest.mark.parametrize("timeout", [None, 1.0], ids=["no-timeout", "timeout"])
def test_a_judge_that_exits_in_time_is_judged_and_its_group_is_killed(tmp_path, timeout):
    """A child in the judge's process group holds its output; the judge exits 1 at once. Its exit is the verdict,
    with or without a deadline, and the child does not outlive the call."""
    pid_file = tmp_path / "child.pid"
    template = (f"sh -c 'sleep {HANG} & echo $! > {shlex.quote(str(pid_file))}; echo \"error: bad\"; exit 1' "
                f"{{model}}")
    try:
        verdict = _judge_in_subprocess(template, timeout=timeout)
        assert verdict["kind"] == "fail" and verdict["exit_code"] == 1
        assert _state(int(pid_file.read_text())) in (None, "Z")
    finally:
        _kill(pid_file)


@needs_proc
def test_a_judge_that_outlives_its_deadline_is_a_timeout_and_its_group_is_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    template = f"sh -c 'sleep {HANG} & echo $! > {shlex.quote(str(pid_file))}; sleep {HANG}' {{model}}"
    try:
        verdict = _judge_in_subprocess(template, timeout=1)
        assert verdict == {"kind": "timeout", "exit_code": None, "signature": None}
        assert _state(int(pid_file.read_text())) in (None, "Z")
    finally:
        _kill(pid_file)


COLOURING_JUDGE = """\
import subprocess, sys
proc = subprocess.run([sys.executable, {pattern_judge!r}, "pad3", sys.argv[1]], capture_output=True, text=True)
lines = (proc.stdout + proc.stderr).splitlines()
coloured = "".join(f"\\x1b[1;31m{{line}}\\x1b[0m\\x1b[K\\r\\n" for line in lines)
sys.stdout.write("\\x1b]0;compiler\\x07\\x1b(B" + coloured)
sys.exit(proc.returncode)
"""


def test_a_judge_that_colours_its_output_gives_a_profile_snippet_that_loads_as_a_target(tmp_path):
    """The judge prints every line in red (CSI), sets a window title (OSC) and ends lines with CR LF. Its
    signature and the record's profile_snippet hold none of it: the snippet is TOML, and a profile of it loads
    as a --target."""
    from click.testing import CliRunner

    from onnx_npu_fix.cli import main
    from onnx_npu_fix.config.targets import load_target
    from onnx_npu_fix.errors import EXIT_OK

    judge = tmp_path / "colouring_judge.py"
    judge.write_text(COLOURING_JUDGE.format(pattern_judge=os.path.join(HERE, "pattern_judge.py")))
    out, report = tmp_path / "fixed.onnx", tmp_path / "r.json"
    model = os.path.join(FIXTURES, "torch_convtasnet.onnx")
    result = CliRunner().invoke(main, [
        model, "-o", str(out), "--target", "bm1684x", "--remainder-pad", "pad", "--no-lift-conv1d",
        "--input-shape", "mix:1,1600", "--validation-inputs", "1", "--report", str(report),
        "--judge", f"{shlex.quote(sys.executable)} {shlex.quote(str(judge))} {{model}}"])
    assert result.exit_code == EXIT_OK, result.output
    judged = json.loads(report.read_text())["judge"]
    assert judged["signature"].startswith("<path>:<n>: getI<n>Array: Assertion"), judged["signature"]
    snippet = judged["profile_snippet"]
    assert all(c in "\t\n" or " " <= c != "\x7f" for c in snippet), repr(snippet)
    constraints = tomllib.loads(snippet)
    assert constraints == {key: change["to"] for key, change in judged["changed"].items()}
    profile = tmp_path / "judged.toml"
    profile.write_text('[target]\nname = "judged"\n\n[constraints]\n' + snippet + "\n", encoding="utf-8")
    assert load_target(str(profile)).constraints == constraints
    check = CliRunner().invoke(main, [model, "--check", "--target", str(profile), "--input-shape", "mix:1,1600"])
    assert check.exit_code in (0, 1), check.output  # 2 would be a profile that does not load


# --- user data files ---------------------------------------------------------------------------------------------

CLAIMED_ELEMENTS = 1 << 40
"""What a hostile .npy header claims: far more than any machine can allocate, in a file of a few hundred bytes."""


def _lying_npy() -> bytes:
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (CLAIMED_ELEMENTS,)})
    buffer.write(b"\0" * 64)
    return buffer.getvalue()


def _npz(path, members: dict[str, bytes]):
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _polygraphy_json(path, npy: bytes):
    import base64

    path.write_text(json.dumps([{"mix": {"array": base64.b64encode(npy).decode("ascii"),
                                         "polygraphy_class": "ndarray"}}]))
    return path


def _folder(path, npy: bytes):
    path.mkdir()
    (path / "mix.npy").write_bytes(npy)
    return path


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _fifo(path):
    os.mkfifo(path)
    return path


DATA_CASES = {
    # case: (option, how the file is made, what the one line says)
    "json-nested-200000-deep": ("--validation-data", lambda d: _write(d / "deep.json", b"[" * 200_000 + b"]" * 200_000),
                                "nested 200000 levels deep"),
    "json-array-claims-2^40": ("--validation-data", lambda d: _polygraphy_json(d / "inputs.json", _lying_npy()),
                               f"claims {CLAIMED_ELEMENTS} elements"),
    "npz-member-claims-2^40": ("--validation-data", lambda d: _npz(d / "inputs.npz", {"mix.npy": _lying_npy()}),
                               f"claims {CLAIMED_ELEMENTS} elements"),
    "npy-folder-claims-2^40": ("--validation-data", lambda d: _folder(d / "sets", _lying_npy()),
                               f"claims {CLAIMED_ELEMENTS} elements"),
    "freeze-npy-claims-2^40": ("--freeze-input", lambda d: _write(d / "mix.npy", _lying_npy()),
                               f"claims {CLAIMED_ELEMENTS} elements"),
    "freeze-fifo": ("--freeze-input", lambda d: _fifo(d / "mix.npy"), "not a regular file"),
    "validation-data-fifo": ("--validation-data", lambda d: _fifo(d / "inputs.npz"), "not a regular file"),
    "freeze-device": ("--freeze-input", lambda d: "/dev/zero", "not a regular file"),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_hostile_data_files_are_a_one_line_usage_error(tmp_path, case):
    """Exit 2 with one line naming the file and what to do: no traceback, no internal error, no hang, nothing
    written."""
    if "fifo" in case and not hasattr(os, "mkfifo") or case == "freeze-device" and not os.path.exists("/dev/zero"):
        pytest.skip("needs FIFOs and /dev/zero")
    option, make, says = DATA_CASES[case]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data = str(make(data_dir))
    value = f"mix={data}" if option == "--freeze-input" else data
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = subprocess.run([sys.executable, "-m", "onnx_npu_fix", os.path.join(FIXTURES, "tcn.onnx"), "-o",
                           str(out_dir / "fixed.onnx"), "--report", str(out_dir / "r.json"), option, value],
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT, stdin=subprocess.DEVNULL)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and data in lines[0] and says in lines[0], lines
    assert "Traceback" not in proc.stderr and "internal error" not in lines[0]
    assert os.listdir(out_dir) == []
