"""The build record holds every field docs/record.md documents, and the docs document every pass and option."""

from __future__ import annotations

import json
import os
import re

import pytest
from click.testing import CliRunner

from onnx_npu_fix.cli import main
from onnx_npu_fix.passes import PASSES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _page(name: str) -> str:
    with open(os.path.join(ROOT, "docs", name), encoding="utf-8") as f:
        return f.read()


def _record_rows() -> list[tuple[list[str], str]]:
    """(documented top-level fields, the rest of the row) for each row of the Build record table."""
    rows = []
    for line in _page("record.md").splitlines():
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
    table = _page("passes.md")
    for name in PASSES:
        assert f"| `{name}` |" in table, name


def test_fixture_files_are_what_the_build_script_writes(tmp_path):
    import subprocess
    import sys

    subprocess.run([sys.executable, os.path.join(ROOT, "fixtures", "build_fixtures.py"), "--out", str(tmp_path)],
                   check=True)
    for name in os.listdir(tmp_path):
        committed = open(os.path.join(ROOT, "fixtures", name), "rb").read()
        assert committed == (tmp_path / name).read_bytes(), f"{name} is stale: run make fixtures"


# --- one JSON contract: the shipped schemas hold for the real outputs --------------------------------------------

jsonschema = pytest.importorskip("jsonschema")


def _validator(name: str):
    """The shipped schema ``name``, with the shared parts resolvable (as a user's validator would load them)."""
    from referencing import Registry, Resource

    from onnx_npu_fix.pipeline.report import SCHEMAS, schema

    registry = Registry().with_resources((schema(n)["$id"], Resource.from_contents(schema(n))) for n in SCHEMAS)
    cls = jsonschema.validators.validator_for(schema(name))
    cls.check_schema(schema(name))
    return cls(schema(name), registry=registry)


def test_the_schemas_are_package_data():
    pyproject = open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read()
    assert '"onnx_npu_fix.pipeline" = ["schemas/*.schema.json"]' in pyproject
    from onnx_npu_fix.pipeline.report import CHECK_VERSION, REPORT_VERSION, schema

    assert schema("record")["properties"]["report_version"] == {"const": REPORT_VERSION}
    assert schema("check")["properties"]["check_version"] == {"const": CHECK_VERSION}


@pytest.mark.parametrize("mode", ["fix", "check", "split"])
def test_the_build_record_holds_its_schema(tmp_path, fixture_path, mode):
    report = tmp_path / "r.json"
    args = [fixture_path("unet.onnx"), "--report", str(report), "-q"]
    args += {"check": ["--check", "--sram", "64KiB"], "fix": ["-o", str(tmp_path / "o.onnx"), "--sram", "64KiB"],
             "split": ["-o", str(tmp_path / "o.onnx"), "--split", str(tmp_path / "seg"), "--sram", "200KiB",
                       "--align", "0", "--split-at", "pool1_10_out", "--save-inputs", str(tmp_path / "in.json")]}[mode]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    record = json.loads(report.read_text())
    _validator("record").validate(record)
    assert record["exit_code"] == result.exit_code
    if mode == "split":  # the optional parts filled in
        assert len(record["split"]["segments"]) == 2 and record["saved_inputs"]["sets"] >= 3
    assert set(record) <= set(_validator("record").schema["properties"])
    broken = dict(record, passes=[{"name": "x"}])  # the schema can fail: a pass without its fields
    assert not _validator("record").is_valid(broken)


def _stdout_apart() -> CliRunner:
    """A runner whose stdout is stdout alone: click before 8.2 mixes stderr into it unless told not to (the
    minimum-pins suite runs click 8.0), and 8.2 removed the option with the mixing."""
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()


def test_check_json_is_one_object_whatever_the_number_of_models(fixture_path):
    tcn, unet = fixture_path("tcn.onnx"), fixture_path("unet.onnx")
    documents = []
    for models in ([tcn], [tcn, unet], [tcn, "/nonexistent/m.onnx"], ["/nonexistent/m.onnx"]):
        result = _stdout_apart().invoke(main, [*models, "--check", "--format", "json",
                                                "--max-dilation", "4", "--dump-shapes"])
        document = json.loads(result.stdout)
        _validator("check").validate(document)
        assert [m["path"] for m in document["models"]] == models
        assert document["exit_code"] == result.exit_code
        documents.append(document)
    assert [m["clean"] for m in documents[1]["models"]] == [False, True]
    assert documents[3]["exit_code"] == 2 and "no such file" in documents[3]["models"][0]["error"]
    assert documents[0]["models"][0] == documents[1]["models"][0]  # an entry does not depend on the others
