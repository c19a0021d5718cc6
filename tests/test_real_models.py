"""npufix on models exported from PyTorch by torch.onnx.export, as users hand them over.

The fixtures come from `fixtures/export_torch.py` (needs torch, so it is not run here; see its docstring):
- torch_convtasnet.onnx         Asteroid's ConvTasNet (gLN, depthwise dilations 1 ... 128, ConvTranspose1d decoder,
                                pad_x_to_y), dynamic time axis: the classic exporter's Shape/Gather chains.
- torch_convtasnet_causal.onnx  the causal form (padding (K-1)*d, a Slice chopping the tail, cumulative LN with
                                CumSum/Range on the dynamic length), dilations 1 ... 32.
- torch_unet.onnx               an smp-style U-Net (Conv+BN+ReLU, MaxPool, bilinear F.interpolate x2, Concat skips,
                                20/36/60/72 channels, sigmoid head), BatchNorm kept by TrainingMode.PRESERVE.

Every test runs the real CLI with the issue's constraints (--max-dilation 4 --align 8) and checks the result
independently of what npufix says about it: onnxruntime against the original, the Conv attributes and weight shapes,
and `npufix --check` with the same constraints.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from click.testing import CliRunner, Result
from helpers import assert_equivalent, ops
from onnx import numpy_helper

from onnx_npu_fix.cli import main
from onnx_npu_fix.pipeline.inputs import make_inputs

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
CONSTRAINTS = ("--max-dilation", "4", "--align", "8")
MAX_DILATION = 4
ALIGN = 8
TIME = 4000  # any static length: the encoder (kernel 16, stride 8) and pad_x_to_y handle the remainder
SHAPE_ONLY = {"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity"}


@dataclass(frozen=True)
class Case:
    fixture: str
    args: tuple[str, ...]
    exact: bool


CASES = {
    "convtasnet": Case("torch_convtasnet.onnx", ("--input-shape", f"mix:1,{TIME}"), True),
    "convtasnet-causal": Case("torch_convtasnet_causal.onnx", ("--input-shape", f"mix:1,{TIME}"), True),
    "unet-exact": Case("torch_unet.onnx", ("--resize-mode", "exact"), True),
    "unet-nearest": Case("torch_unet.onnx", (), False),
}


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@dataclass
class Run:
    case: Case
    original: onnx.ModelProto
    fixed: onnx.ModelProto
    path: str
    result: Result
    report: dict


@pytest.fixture(scope="module")
def runs(fixed_fixture) -> dict[str, Run]:
    """One CLI run per case, shared by the tests (a run costs a few onnxruntime sessions; conftest's
    fixed_fixture shares it with test_cli too)."""
    done: dict[str, Run] = {}
    for key, case in CASES.items():
        fix = fixed_fixture(case.fixture, *CONSTRAINTS, *case.args)
        fixed = onnx.load(fix.out) if fix.out.exists() else None
        done[key] = Run(case, onnx.load(os.path.join(FIXTURES, case.fixture)), fixed, str(fix.out), fix.result,
                        fix.report)
    return done


def summary(run: Run) -> dict[str, str]:
    """Pass name -> its summary line (the unindented lines npufix prints, one per pass)."""
    lines = [line for line in run.result.output.splitlines() if line and not line.startswith(" ")]
    return {line.split()[0]: line for line in lines if len(line.split()) > 1}


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def conv_channels(node: onnx.NodeProto, weight: np.ndarray) -> tuple[int, int]:
    """(input channels, output channels) of a Conv / ConvTranspose from its weight and group."""
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    if node.op_type == "Conv":
        return weight.shape[1] * group, weight.shape[0]
    return weight.shape[0], weight.shape[1] * group


def fed_by_graph_input(model: onnx.ModelProto, tensor: str) -> bool:
    """True when `tensor` is a graph input, possibly through shape-only ops (ConvTasNet's wav.unsqueeze(1))."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inputs = {i.name for i in model.graph.input}
    while tensor not in inputs:
        node = producer.get(tensor)
        if node is None or node.op_type not in SHAPE_ONLY:
            return False
        tensor = node.input[0]
    return True


def dilations(node: onnx.NodeProto) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == "dilations"), [1])


def static_feeds(run: Run) -> list[dict[str, np.ndarray]]:
    """Inputs shaped like the fixed (frozen) model; the original accepts them through its dynamic axes."""
    return [f for seed in (0, 1, 2) for f in make_inputs(run.fixed, 1, seed)]


# --- the fixtures are what they claim to be (so the tests below test something) ---------------------------------


def test_convtasnet_export_has_dilations_up_to_128_and_shape_chains(runs):
    model = runs["convtasnet"].original
    depthwise = [n for n in model.graph.node if n.op_type == "Conv" and max(dilations(n)) > 1]
    assert sorted(max(dilations(n)) for n in depthwise) == [2, 4, 8, 16, 32, 64, 128]
    assert {"Shape", "Gather", "Concat", "ConvTranspose", "PRelu", "ReduceMean"} <= set(ops(model))
    dims = runs["convtasnet"].original.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["batch", "time"]


def test_causal_export_chops_the_tail_and_uses_cumulative_norm(runs):
    model = runs["convtasnet-causal"].original
    assert {"Slice", "CumSum", "Range", "Shape"} <= set(ops(model))
    assert max(max(dilations(n)) for n in model.graph.node if n.op_type == "Conv") == 32


def test_unet_export_keeps_batchnorm_and_bilinear_resize(runs):
    model = runs["unet-exact"].original
    assert ops(model).count("BatchNormalization") == 13
    modes = [a.s for n in model.graph.node if n.op_type == "Resize" for a in n.attribute if a.name == "mode"]
    assert modes == [b"linear"] * 3
    weights = initializers(model)
    outs = {conv_channels(n, weights[n.input[1]])[1] for n in model.graph.node if n.op_type == "Conv"}
    assert {20, 36, 60, 72} <= outs


@pytest.mark.parametrize("key,args", [("convtasnet", ("--input-shape", f"mix:1,{TIME}")), ("unet-exact", ())])
def test_check_on_the_original_reports_violations(runs, key, args):
    result = invoke(os.path.join(FIXTURES, runs[key].case.fixture), "--check", *CONSTRAINTS, *args,
                    "--format", "json")
    assert result.exit_code == 1, result.output
    found = json.loads(result.output)["models"][0]
    assert not found["clean"]
    kinds = {v["constraint"] for v in found["violations"]}
    assert ("dilation" in kinds) == (key == "convtasnet")
    assert kinds & {"in-channels-align", "out-channels-align"}


# --- what npufix makes of them -----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", CASES)
def test_run_succeeds_and_passes_report(runs, key):
    run = runs[key]
    assert run.result.exit_code == 0, run.result.output
    lines = run.result.output.strip().splitlines()
    if run.case.exact:
        assert lines[-1] == f"wrote {run.path}"
    else:  # an approximate output says so, loudly, last
        assert lines[-2] == f"wrote {run.path}"
        assert lines[-1].startswith("APPROXIMATE: resize-nearest changed 3 Resize (rel L2 "), lines[-1]
    assert run.report["exit_code"] == 0
    assert all(p["status"] in ("unchanged", "validated") for p in run.report["passes"]), run.report["passes"]
    onnx.checker.check_model(run.fixed, full_check=True)


@pytest.mark.parametrize("key", CASES)
def test_output_matches_the_original_under_onnxruntime(runs, key):
    run = runs[key]
    if run.case.exact:
        assert_equivalent(run.original, run.fixed, feeds=static_feeds(run))
    else:
        # bilinear -> nearest: approximate, within the default --max-approx-error bound, and not exact
        # (if it were, the pass would be mislabelled or would not have run).
        assert_equivalent(run.original, run.fixed, feeds=static_feeds(run), exact=False, max_approx_error=0.5)
        with pytest.raises(AssertionError):
            assert_equivalent(run.original, run.fixed, feeds=static_feeds(run))


@pytest.mark.parametrize("key", CASES)
def test_no_conv_dilation_above_the_limit(runs, key):
    convs = [n for n in runs[key].fixed.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    assert convs
    assert all(max(dilations(n)) <= MAX_DILATION for n in convs), [(n.name, dilations(n)) for n in convs]


@pytest.mark.parametrize("key", CASES)
def test_every_conv_channel_count_aligned_except_graph_input_channels(runs, key):
    model = runs[key].fixed
    weights = initializers(model)
    unaligned = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose"):
            continue
        cin, cout = conv_channels(node, weights[node.input[1]])
        if cin % ALIGN and not fed_by_graph_input(model, node.input[0]):
            unaligned.append((node.name, "in", cin))
        if cout % ALIGN:
            unaligned.append((node.name, "out", cout))
    assert not unaligned


@pytest.mark.parametrize("key", CASES)
def test_check_on_the_output_is_clean_but_for_the_graph_input_channels(runs, key):
    run = runs[key]
    result = invoke(run.path, "--check", *CONSTRAINTS, "--format", "json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)["models"][0]
    assert found["clean"] and not found["violations"]
    # the one exemption: the first conv reads the 1-channel graph input (--align-io would pad it in the graph)
    assert [(e["constraint"], e["value"]) for e in found["exempt"]] == [("in-channels-align", 1)]


@pytest.mark.parametrize("key", ["convtasnet", "convtasnet-causal"])
def test_convtasnet_shape_chains_fold_and_large_dilations_are_rewritten(runs, key):
    run = runs[key]
    assert not {"Shape", "Gather", "Range", "ConstantOfShape"} & set(ops(run.fixed))
    lines = summary(run)
    n_large = sum(max(dilations(n)) > MAX_DILATION for n in run.original.graph.node if n.op_type == "Conv")
    assert lines["dilated-conv"].split()[1] == str(n_large), lines["dilated-conv"]
    assert "no change" not in lines["fold-constants"]
    assert lines["output"].startswith("output vs input  exact")
    io = [(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim])
          for v in (*run.fixed.graph.input, *run.fixed.graph.output)]
    assert io == [("mix", [1, TIME]), ("est", [1, 2, TIME])]


@pytest.mark.parametrize("key", ["unet-exact", "unet-nearest"])
def test_unet_batchnorm_folds_and_bilinear_resize_goes(runs, key):
    run = runs[key]
    kinds = ops(run.fixed)
    assert "BatchNormalization" not in kinds
    assert kinds.count("Conv") == ops(run.original).count("Conv")
    resize_modes = [a.s for n in run.fixed.graph.node if n.op_type == "Resize" for a in n.attribute
                    if a.name == "mode"]
    if key == "unet-exact":
        assert resize_modes == []
        assert kinds.count("ConvTranspose") == 3
    else:
        assert resize_modes == [b"nearest"] * 3
        record = next(p for p in run.report["passes"] if p["name"] == "resize-nearest")
        assert record["exact"] is False and record["validation"]["passed"] is True
        assert record["validation"]["criterion"].startswith("relative L2")
        assert "[approximate]" in summary(run)["resize-nearest"]


# The U-Net cases once failed here: resize-nearest left the scales' Constant nodes dead and cleanup only runs
# first; the pass manager now drops dead nodes after every pass that changed the graph.
IDEMPOTENT = ["convtasnet", "convtasnet-causal", "unet-exact", "unet-nearest"]


@pytest.mark.parametrize("key", IDEMPOTENT)
def test_second_run_changes_nothing(runs, key, tmp_path):
    out, report = tmp_path / "again.onnx", tmp_path / "again.json"
    result = invoke(runs[key].path, "-o", out, *CONSTRAINTS, "--report", report)
    assert result.exit_code == 0, result.output
    changed = {p["name"]: p["changes"] for p in json.loads(report.read_text())["passes"] if p["changes"]}
    assert not changed
