"""The build record holds every field the README documents, and the README documents every pass and option."""

from __future__ import annotations

import json
import os
import re

import pytest
from click.testing import CliRunner

from onnx_npu_fix.cli import main
from onnx_npu_fix.passes import PASSES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def _section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end != -1 else None]


def _record_rows() -> list[tuple[list[str], str]]:
    """(documented top-level fields, the rest of the row) for each row of the Build record table."""
    rows = []
    for line in _section("Build record").splitlines():
        if not line.startswith("| `"):
            continue
        first, rest = line.split("|")[1], "|".join(line.split("|")[2:])
        rows.append((re.findall(r"`([a-z_\[\].]+)`", first), rest))
    return rows


def _get(record: dict, dotted: str):
    node = record
    for part in dotted.replace("[]", "").split("."):
        if node is None:  # documented as "or null" (e.g. output in check mode)
            return None
        assert part in node, f"documented field {dotted} missing"
        node = node[part]
    return node


@pytest.mark.parametrize("mode", ["fix", "check"])
def test_record_has_every_documented_field(tmp_path, fixture_path, mode):
    report = tmp_path / "r.json"
    args = [fixture_path("unet.onnx"), "--report", str(report), "-q", "--sram", "64KiB"]
    args += ["--check"] if mode == "check" else ["-o", str(tmp_path / "o.onnx")]
    CliRunner().invoke(main, args, catch_exceptions=False)
    record = json.loads(report.read_text())
    documented = set()
    for fields, _rest in _record_rows():
        for field in fields:
            _get(record, field)
            documented.add(field.split(".")[0].replace("[]", ""))
    assert set(record) <= documented, f"undocumented fields: {set(record) - documented}"
    assert record["mode"] == mode
    if mode == "fix":
        entry = next(p for p in record["passes"] if p["name"] == "fold-batchnorm")  # one that changed and validated
        sub = re.search(r"per pass: (.*)", [r for f, r in _record_rows() if "passes[]" in f][0]).group(1)
        for key in ("name", "exact", "status", "changes", "rejections", "metrics", "warnings", "validation",
                    "error", "seconds", "validate_seconds"):
            assert (f"`{key}`" in sub or f"`{key}[]`" in sub) and key in entry
        for key in ("passed", "criterion", "max_abs", "max_rel", "worst_output", "outputs"):
            assert key in entry["validation"]
    memory = record["memory"]
    for key in ("assumptions", "act_bytes", "peak", "live_at_peak", "largest_tensor", "sram", "reordered"):
        assert key in memory
    assert memory["sram"]["fits"] is False and memory["sram"]["miss_bytes"] > 0


def test_every_pass_is_documented():
    table = _section("Passes")
    for name in PASSES:
        assert f"| `{name}` |" in table, name


def test_every_option_is_documented():
    reference = _section("CLI reference")
    for param in main.params:
        for opt in param.opts:
            if opt.startswith("--") and opt not in ("--help",):
                assert opt in reference, opt


def test_fixture_files_are_what_the_build_script_writes(tmp_path):
    import subprocess
    import sys

    subprocess.run([sys.executable, os.path.join(ROOT, "fixtures", "build_fixtures.py"), "--out", str(tmp_path)],
                   check=True)
    for name in os.listdir(tmp_path):
        committed = open(os.path.join(ROOT, "fixtures", name), "rb").read()
        assert committed == (tmp_path / name).read_bytes(), f"{name} is stale: run make fixtures"
