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
    fixed = tmp_path / "tcn.npu.onnx"
    subprocess.run(["npufix", fixture_path("tcn.onnx"), "-o", str(fixed), "--max-dilation", "4", "--align", "8",
                    "-q"], check=True, env=_npufix_env())
    clean = subprocess.run(command + [str(fixed)], capture_output=True, text=True, env=_npufix_env())
    assert clean.returncode == 0, clean.stdout + clean.stderr


@pytest.mark.parametrize("target", ["stm32n6", "mstar-ipu"])
def test_github_actions_steps(tmp_path, fixture_path, target):
    text = open(os.path.join(ROOT, "examples", "github-actions.yml"), encoding="utf-8").read()
    steps = [m.group(1) for m in re.finditer(r"^\s*run: (npufix .+)$", text, re.M)]
    assert len(steps) == 2
    env = _npufix_env() | {"MODEL": fixture_path("tcn.onnx"), "TARGET": target}
    for step in steps:
        subprocess.run(["bash", "-euo", "pipefail", "-c", step], cwd=tmp_path, env=env, check=True)
    report = json.loads((tmp_path / "npufix-report.json").read_text())
    check = json.loads((tmp_path / "npufix-check.json").read_text())
    assert report["exit_code"] == 0 and report["output"]["sha256"]
    assert check["clean"] is True and check["violations"] == []
