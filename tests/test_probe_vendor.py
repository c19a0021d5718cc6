"""``npufix probe`` against real compilers (marker ``vendor``; each skips unless its toolchain is installed, as in
tests/test_vendor.py): from the compiler's verdicts alone it learns tpu-mlir's BM1684X depthwise dilation limit of
15 and the rv1106 limit of 31 (from 32 rknn-toolkit2's own rewrite leaves a Gather on the CPU), the built-in
profiles' values, measured by the npufix authors' compiles.

A short version of the probes docs/unknown-compiler.md runs on the ConvTasNet: the --like model here is one
depthwise Conv1d of dilation 64, so only the dilation bisection, the channel probe, the ops npufix emits for it
and the fixed model are judged (about a dozen calls)."""

from __future__ import annotations

import json
import os

import onnx
import pytest
from click.testing import CliRunner
from test_vendor import requires_rknn, requires_tpu_mlir

from onnx_npu_fix.cli import main
from onnx_npu_fix.config.targets import load_target
from onnx_npu_fix.judge.probe import models as probe_models

pytestmark = pytest.mark.vendor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _learned_dilation(tmp_path, judge: str) -> int:
    """Probe JUDGE with one depthwise Conv1d of dilation 64 as --like; the learned max_dilation (checks passed)."""
    model = tmp_path / "dilated.onnx"
    onnx.save(probe_models.dilated_conv(depthwise=True, rank=1, dilation=64), str(model))
    profile, report = tmp_path / "learned.toml", tmp_path / "probe.json"
    result = CliRunner().invoke(main, ["probe", "--judge", judge, "--like", str(model), "-o", str(profile),
                                       "--report", str(report), "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    record = json.loads(report.read_text())
    assert record["checks"] and all(c["verdict"] == "pass" for c in record["checks"])
    return load_target(str(profile)).constraints["max_dilation"]


@requires_tpu_mlir
def test_probe_learns_the_bm1684x_depthwise_dilation_limit(tmp_path):
    judge = os.path.join(ROOT, "vendor", "judge_tpu_mlir.sh") + " {model}"
    assert _learned_dilation(tmp_path, judge) == load_target("bm1684x").constraints["max_dilation"] == 15


@requires_rknn
def test_probe_learns_where_rknn_leaves_a_gather_on_the_cpu(tmp_path):
    judge = os.path.join(ROOT, "vendor", "judge_rknn.sh") + " {model} --platform rv1106 --fail-on-cpu"
    assert _learned_dilation(tmp_path, judge) == load_target("rv1106").constraints["max_dilation"] == 31
