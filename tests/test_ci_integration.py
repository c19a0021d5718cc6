"""The CI integrations shipped with npufix run as documented: the pre-commit hook's entry and the GitHub Actions
steps, executed on the fixtures with the installed console script."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from onnx_npu_fix.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _npufix_env():
    env = dict(os.environ)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env


def _hook():
    """The entry and args of the npufix-check hook, read from .pre-commit-hooks.yaml (flat YAML, no parser)."""
    text = open(os.path.join(ROOT, ".pre-commit-hooks.yaml"), encoding="utf-8").read()
    entry = re.search(r"^\s*entry:\s*(.+)$", text, re.M).group(1)
    args = re.search(r"^\s*args:\s*\[(.*)\]$", text, re.M).group(1)
    return shlex.split(entry) + [a.strip().strip('"') for a in args.split(",")]


def test_pre_commit_hook_fails_on_raw_and_passes_on_fixed(tmp_path, fixture_path):
    assert shutil.which("npufix", path=BIN)
    command = _hook()
    assert command[:2] == ["npufix", "--check"]
    raw = subprocess.run(command + [fixture_path("tcn.onnx"), fixture_path("dilated2d.onnx")],
                         capture_output=True, text=True, env=_npufix_env())
    assert raw.returncode == 1, raw.stderr
    assert "dilation: [8] vs max 4 -> fixed by dilated-conv" in raw.stdout
    fixed = tmp_path / "tcn.npu.onnx"  # the fix is not what is tested here: click's runner makes it in-process
    made = CliRunner().invoke(main, [fixture_path("tcn.onnx"), "-o", str(fixed), "--max-dilation", "4", "--align",
                                     "8", "-q"], catch_exceptions=False)
    assert made.exit_code == 0, made.output
    clean = subprocess.run(command + [str(fixed)], capture_output=True, text=True, env=_npufix_env())
    assert clean.returncode == 0, clean.stdout + clean.stderr


def _workflow() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(job env, [(step name, run script)]) of examples/github-actions.yml, read without a YAML parser: the file
    keeps to ``env:`` key/value lines and ``run:`` lines or ``run: |`` blocks."""
    lines = open(os.path.join(ROOT, "examples", "github-actions.yml"), encoding="utf-8").read().splitlines()
    env: dict[str, str] = {}
    steps: list[tuple[str, str]] = []
    name = ""
    for i, line in enumerate(lines):
        if re.match(r"^    env:$", line):
            for entry in lines[i + 1:]:
                found = re.match(r"^      (\w+): (.+)$", entry)
                if not found:
                    break
                env[found.group(1)] = found.group(2)
        named = re.match(r"^\s*- name: (.+)$", line)
        if named:
            name = named.group(1)
        run = re.match(r"^(\s*)run: (.*)$", line)
        if not run:
            continue
        if run.group(2) != "|":
            steps.append((name, run.group(2)))
            continue
        indent = len(run.group(1)) + 2
        block = []
        for entry in lines[i + 1:]:
            if entry.strip() and len(entry) - len(entry.lstrip()) < indent:
                break
            block.append(entry[indent:])
        steps.append((name, "\n".join(block)))
    return env, steps


def _run_job(tmp_path, env_overrides) -> list[subprocess.CompletedProcess]:
    """Run the job's steps after the install (npufix is installed here already) in order, as Actions does: each in
    bash -e, stopping at the first failing step."""
    job_env, steps = _workflow()
    output = tmp_path / "github_output"
    env = _npufix_env() | job_env | {"GITHUB_OUTPUT": str(output)} | env_overrides
    done = []
    for _name, script in steps[1:]:
        proc = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        done.append(proc)
        if proc.returncode != 0:
            break
    return done


def test_github_actions_installs_from_the_checkout():
    _env, steps = _workflow()
    assert steps[0] == ("Install npufix", "pip install .")  # a real install line: this repository's pyproject
    assert os.path.exists(os.path.join(ROOT, "pyproject.toml"))
    assert "git+" not in open(os.path.join(ROOT, "examples", "github-actions.yml"), encoding="utf-8").read()


@pytest.mark.parametrize("target", ["stm32n6", "mstar-ipu"])
def test_github_actions_job_passes_on_a_model_it_can_fix(tmp_path, fixture_path, target):
    done = _run_job(tmp_path, {"MODEL": fixture_path("tcn.onnx"), "TARGET": target})
    assert [p.returncode for p in done] == [0, 0], [p.stderr for p in done]
    report = json.loads((tmp_path / "npufix-report.json").read_text())
    check = json.loads((tmp_path / "npufix-check.json").read_text())["models"][0]
    assert report["exit_code"] == 0 and report["output"]["sha256"]
    assert check["clean"] is True and check["violations"] == []
    assert (tmp_path / "github_output").read_text() == "exit_code=0\n"


def _conv_transpose(path) -> str:
    """x [1, 8, 8, 8] -> ConvTranspose stride 2 -> y: an op k210 forbids and no pass removes."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32) / 72, "w")
    graph = helper.make_graph([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", strides=[2, 2],
                                                 pads=[1, 1, 1, 1], output_padding=[1, 1])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 16, 16])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return str(path)


def test_github_actions_gate_fails_when_constraints_remain(tmp_path):
    """k210 forbids ConvTranspose, which no pass removes: the fix step writes the model (exit 1, tolerated), the
    gate fails the job, and the artifacts say why."""
    done = _run_job(tmp_path, {"MODEL": _conv_transpose(tmp_path / "up.onnx"), "TARGET": "k210"})
    assert [p.returncode for p in done] == [0, 1], [p.stderr for p in done]
    assert (tmp_path / "github_output").read_text() == "exit_code=1\n"
    check = json.loads((tmp_path / "npufix-check.json").read_text())["models"][0]
    assert check["clean"] is False and {v["constraint"] for v in check["violations"]} == {"forbidden-op"}


def test_github_actions_fix_step_stops_the_job_when_nothing_was_written(tmp_path):
    done = _run_job(tmp_path, {"MODEL": str(tmp_path / "missing.onnx")})
    assert [p.returncode for p in done] == [1]  # the step fails; the gate never runs on a stale model
    assert (tmp_path / "github_output").read_text() == "exit_code=2\n"
    assert not (tmp_path / "model.npu.onnx").exists()


def test_minimum_pins_are_the_declared_floors():
    """make test-min installs exactly the floors pyproject.toml declares (every runtime dependency and the test
    extra), so a floor that stops working fails CI instead of a user's install."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("min_requirements", os.path.join(ROOT, ".ci", "min_requirements.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    pins = module.floors(text)
    names = [p.split("==")[0] for p in pins]
    assert names == ["onnx", "onnxruntime", "numpy", "click", "tomli", "pytest", "pytest-xdist", "hypothesis",
                     "onnx-graphsurgeon", "matplotlib", "jsonschema", "polygraphy"]
    assert "onnxruntime==1.19" in pins  # 1.16-1.18 compute valid models wrongly
    assert "tomli==2.0; python_version < '3.11'" in pins
    with pytest.raises(SystemExit, match="no '>=' floor"):
        module.floors('dependencies = [\n    "onnx",\n]\n')
    makefile = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    assert ".ci/min_requirements.py" in makefile and "make test-min" in open(os.path.join(ROOT, ".ci", "run")).read()
