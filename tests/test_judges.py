"""vendor/judge_*.sh run the judges of onnx_npu_fix/judges/ with the toolchain's Python named by their variable, from
this checkout whatever the working directory (no toolchain needed: a judge reads its arguments before it imports
its compiler, and this test's own Python stands in for the toolchain's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

VENDOR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "vendor")
WRAPPERS = {"tpu_mlir": ("NPUFIX_TPU_MLIR", os.path.dirname(sys.executable)),
            "rknn": ("NPUFIX_RKNN_PYTHON", sys.executable), "nncase": ("NPUFIX_NNCASE_PYTHON", sys.executable),
            "vela": ("NPUFIX_VELA_PYTHON", sys.executable), "qnn": ("NPUFIX_QNN_PYTHON", sys.executable)}


def _wrapper(name: str, *args: str, cwd) -> subprocess.CompletedProcess:
    variable, value = WRAPPERS[name]
    return subprocess.run([os.path.join(VENDOR, f"judge_{name}.sh"), *args], capture_output=True, text=True,
                          cwd=cwd, env=dict(os.environ, **{variable: value}), timeout=120)


def test_every_judge_has_its_wrapper():
    judges = {f[:-3] for f in os.listdir(os.path.join(os.path.dirname(VENDOR), "onnx_npu_fix", "judges"))
              if f.endswith(".py") and f not in ("__init__.py", "common.py")}
    assert judges == set(WRAPPERS) == {f[6:-3] for f in os.listdir(VENDOR) if f.startswith("judge_")
                                       and f.endswith(".sh")}


def test_every_wrapper_runs_its_judge_through_run_judge():
    for name, (variable, _) in WRAPPERS.items():
        with open(os.path.join(VENDOR, f"judge_{name}.sh"), encoding="utf-8") as f:
            lines = f.read().splitlines()
        python = f"${variable}/python" if name == "tpu_mlir" else f"${variable}"  # NPUFIX_TPU_MLIR: a bin dir
        assert lines[-2:] == ['. "$(dirname "$0")/_judge.sh"', f'run_judge "{python}" {name} "$@"'], lines


@pytest.mark.parametrize("name", ["tpu_mlir", "rknn"])  # a toolchain's bin directory, a toolchain's Python
def test_the_wrapper_runs_the_packages_judge(name, tmp_path):
    """From a directory holding another onnx_npu_fix without the judge (as inside another checkout), the wrapper
    still runs this checkout's."""
    (tmp_path / "onnx_npu_fix").mkdir()
    (tmp_path / "onnx_npu_fix" / "__init__.py").write_text("")
    usage = _wrapper(name, cwd=tmp_path)  # no model: bad usage, exit 2, said by the judge's own parser
    assert usage.returncode == 2, usage.stderr
    assert usage.stderr.startswith(f"usage: {name}.py") and "required: model" in usage.stderr, usage.stderr

def test_a_wrapper_without_its_toolchain_says_what_to_set(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NPUFIX_RKNN_PYTHON"}
    done = subprocess.run([os.path.join(VENDOR, "judge_rknn.sh"), "m.onnx"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
    assert done.returncode != 0 and "set NPUFIX_RKNN_PYTHON" in done.stderr, done.stderr
