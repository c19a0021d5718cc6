"""``npufix probe`` against tpu-mlir (marker ``vendor``; skips unless ``NPUFIX_TPU_MLIR`` names the directory
holding model_transform and model_deploy): it learns the BM1684X depthwise dilation limit of 15 (the built-in
bm1684x profile's, from the npufix authors' compiles) from the compiler's verdicts alone.

A short version of the probe docs/unknown-compiler.md runs on the ConvTasNet: the --like model here is one
depthwise Conv1d of dilation 32, so only the dilation bisection, the channel probe, the ops npufix emits for it
and the fixed model are judged (about a dozen calls)."""

from __future__ import annotations

import json
import os

import onnx
import pytest
from click.testing import CliRunner

from onnx_npu_fix.cli import main
from onnx_npu_fix.config.targets import load_target
from onnx_npu_fix.judge import probe_models

pytestmark = pytest.mark.vendor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU_MLIR = os.environ.get("NPUFIX_TPU_MLIR", "")
requires_tpu_mlir = pytest.mark.skipif(
    not all(os.access(os.path.join(TPU_MLIR, tool), os.X_OK) for tool in ("model_transform", "model_deploy")),
    reason="tpu-mlir not installed (set NPUFIX_TPU_MLIR to the dir holding model_deploy)")


@requires_tpu_mlir
def test_probe_learns_the_bm1684x_depthwise_dilation_limit(tmp_path):
    model = tmp_path / "dilated.onnx"
    onnx.save(probe_models.dilated_conv(depthwise=True, rank=1, dilation=32), str(model))
    profile, report = tmp_path / "bm.toml", tmp_path / "probe.json"
    judge = os.path.join(ROOT, "vendor", "judge_tpu_mlir.sh") + " {model}"
    result = CliRunner().invoke(main, ["probe", "--judge", judge, "--like", str(model), "-o", str(profile),
                                       "--report", str(report), "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    learned = load_target(str(profile)).constraints
    assert learned["max_dilation"] == load_target("bm1684x").constraints["max_dilation"] == 15
    record = json.loads(report.read_text())
    assert record["checks"] and all(c["verdict"] == "pass" for c in record["checks"])
