"""``npufix MODEL -o OUT --judge CMD``, with judges run as real subprocesses: the output is
judged; when rejected, npufix reduces it, tries the other emission forms for that region and writes the first the
judge accepts (or the output with a ``judge`` violation, exit 1)."""

from __future__ import annotations

import json
import os
import shlex
import sys

import numpy as np
import onnx
from click.testing import CliRunner
from helpers import prepared, rng
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.cli import main
from onnx_npu_fix.errors import EXIT_OK, EXIT_USAGE, EXIT_VIOLATIONS
from onnx_npu_fix.judge.command import Judge

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
PATTERN_JUDGE = f"{shlex.quote(sys.executable)} {shlex.quote(os.path.join(HERE, 'pattern_judge.py'))}"


def _fix(*args: str):
    return CliRunner().invoke(main, list(args))


def _rank3_pads(path) -> list[str]:
    model = prepared(onnx.load(str(path)))
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in [*model.graph.input, *model.graph.value_info]}
    return [n.name for n in model.graph.node if n.op_type == "Pad" and ranks.get(n.input[0]) == 3]


def test_a_judge_that_rejects_rank3_pads_gets_another_remainder_form(tmp_path):
    """The tpu-mlir case: ConvTasNet forced to emit rank-3 Pads is rejected; npufix finds a form it accepts."""
    out, report = tmp_path / "fixed.onnx", tmp_path / "r.json"
    result = _fix(os.path.join(FIXTURES, "torch_convtasnet.onnx"), "-o", str(out), "--target", "bm1684x",
                  "--remainder-pad", "pad", "--no-lift-conv1d", "--input-shape", "mix:1,1600",
                  "--validation-inputs", "1", "--report", str(report),
                  "--judge", f"{PATTERN_JUDGE} pad3 {{model}}")
    assert result.exit_code == EXIT_OK, result.output
    record = json.loads(report.read_text())
    judged = record["judge"]
    assert judged["accepted"] and "Assertion" in judged["signature"]
    assert record["seconds"] >= judged["seconds"] > 0  # the run's time includes its judge calls
    assert judged["reduction"]["nodes_after"] < judged["reduction"]["nodes_before"]
    assert [n["op"] for n in judged["reduction"]["nodes"]] == ["Pad"]
    (key, change), = judged["changed"].items()
    assert (key, change["from"]) in {("remainder_pad", "pad"), ("lift_conv1d", False)}, judged["changed"]
    assert judged["attempts"][-1] == {"changes": {key: change["to"]}, "outcome": "pass", "exact": True}
    assert judged["profile_snippet"].startswith(f"{key} = {json.dumps(change['to'])}  # judge: ")
    assert "profile: " + judged["profile_snippet"] in result.output
    # the written model is the accepted one: the judge passes it, and the record's options are its options
    assert _rank3_pads(out) == []
    assert Judge(f"{PATTERN_JUDGE} pad3 {{model}}").judge(out.read_bytes()).kind == "pass"
    assert json.loads(report.read_text())["options"][key] == change["to"]
    row = next(line for line in open(os.path.join(HERE, "..", "docs", "record.md"), encoding="utf-8")
               if line.startswith("| `judge` |"))
    assert all(f"`{field}`" in row or f"`{field}[]`" in row for field in [*judged, *judged["reduction"]])


def test_a_judge_that_rejects_everything_writes_the_output_with_a_judge_violation(tmp_path):
    out, report = tmp_path / "fixed.onnx", tmp_path / "r.json"
    result = _fix(os.path.join(FIXTURES, "tcn.onnx"), "-o", str(out), "--max-dilation", "4", "--report",
                  str(report), "--judge", "sh -c 'echo \"error: layer 7 rejected\"; exit 1' {model}")
    assert result.exit_code == EXIT_VIOLATIONS, result.output
    record = json.loads(report.read_text())
    judged = record["judge"]
    assert not judged["accepted"] and judged["signature"] == "error: layer <n> rejected"
    assert judged["changed"] == {} and judged["attempts"]
    assert all(a["outcome"].startswith("fail: ") for a in judged["attempts"])
    assert judged["reduction"]["nodes_after"] == 1  # everything fails: one node is the smallest failing model
    violation = record["violations"][-1]
    assert violation["constraint"] == "judge" and violation["node"] == judged["reduction"]["nodes"][0]["name"]
    assert "unfixed: " in result.output and out.exists()  # written, not accepted
    reduced = 1 + judged["reduction"]["judge_calls"]  # the output, then the reduction; then one per new form
    assert reduced < judged["judge_calls"] <= reduced + len(judged["attempts"])


def test_a_judge_that_accepts_the_output_is_called_once(tmp_path):
    calls = tmp_path / "calls"
    out, report = tmp_path / "fixed.onnx", tmp_path / "r.json"
    result = _fix(os.path.join(FIXTURES, "tcn.onnx"), "-o", str(out), "--max-dilation", "4", "--report",
                  str(report), "--judge", f"sh -c 'echo call >> {calls}' {{model}}")
    assert result.exit_code == EXIT_OK, result.output
    judged = json.loads(report.read_text())["judge"]
    assert judged["accepted"] and judged["judge_calls"] == 1 and judged["changed"] == {}
    assert calls.read_text() == "call\n"
    plain = tmp_path / "plain.onnx"
    assert _fix(os.path.join(FIXTURES, "tcn.onnx"), "-o", str(plain), "--max-dilation", "4").exit_code == EXIT_OK
    assert plain.read_bytes() == out.read_bytes()  # opt-in: an accepted output is the output without --judge


def test_judge_options_need_a_fixing_run_with_judge(tmp_path):
    source = os.path.join(FIXTURES, "tcn.onnx")
    for args, message in ((["--check", "--judge", "true {model}"], "not with --check"),
                          (["-o", str(tmp_path / "o.onnx"), "--fail-regex", "x"], "need --judge CMD"),
                          (["-o", str(tmp_path / "o.onnx"), "--judge", "true"], "has no {model}")):
        result = _fix(source, *args)
        assert result.exit_code == EXIT_USAGE and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == []


def test_the_forms_tried_for_a_region_npufix_did_not_rewrite_cheapest_first():
    """A dilated 1-D conv with 12 channels and a rank-3 constant Pad before it, neither rewritten: each key the
    region names, cheapest form first (the passes' declared costs), each value once, then pairs; bounded."""
    from onnx_npu_fix.config.options import FixOptions
    from onnx_npu_fix.judge.forms import MAX_CANDIDATES, candidates, relevant_keys
    from onnx_npu_fix.pipeline.report import FixReport

    weight = numpy_helper.from_array(np.ones((12, 12, 3), np.float32), "w")
    pads = numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 1], np.int64), "pads")
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads"], ["p"], name="pad"),
         helper.make_node("Conv", ["p", "w"], ["y"], name="conv", dilations=[6], pads=[6, 6])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 34])], [weight, pads])
    region = prepared(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    options = FixOptions(max_dilation=8)
    why = relevant_keys(region, FixReport(), options)
    assert set(why) == {"fold_pad_into_conv", "remainder_pad", "lift_conv1d", "max_dilation", "align"}, why
    tried = candidates(why, options, region.graph.node)
    singles = [{"fold_pad_into_conv": True}, {"remainder_pad": "pad4d"}, {"remainder_pad": "pad"},
               {"lift_conv1d": True}, {"max_dilation": 5},
               {"max_dilation": 4}, {"align": 0}, {"align": 16}]
    assert tried[:len(singles)] == singles
    assert tried[len(singles)] == {"fold_pad_into_conv": True, "remainder_pad": "pad4d"}
    assert len(tried) == MAX_CANDIDATES


def test_a_judge_that_crashes_on_a_pad_before_a_conv_gets_it_folded(tmp_path):
    """The rknn-toolkit2 2.5.0 case (its own Pad-into-Conv fusion crashes on npufix's folded pads): the reduced
    region is the Pad before the Conv, and the fix is fold-pad-conv, recorded as a profile key."""
    weight = numpy_helper.from_array(rng().standard_normal((8, 8, 3, 3)).astype("float32"), "w")
    pads = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], "int64"), "pads")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Pad", ["r", "pads"], ["p"], name="pad"),
         helper.make_node("Conv", ["p", "w"], ["y"], name="conv")], "pad_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [weight, pads])
    src, out, report = tmp_path / "m.onnx", tmp_path / "fixed.onnx", tmp_path / "r.json"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    result = _fix(str(src), "-o", str(out), "--validation-inputs", "1", "--report", str(report),
                  "--judge", f"{PATTERN_JUDGE} pad-conv {{model}}")
    assert result.exit_code == EXIT_OK, result.output
    judged = json.loads(report.read_text())["judge"]
    assert "read-only" in judged["signature"] and [n["op"] for n in judged["reduction"]["nodes"]] == ["Pad", "Conv"]
    (key, change), = judged["changed"].items()
    assert (key, change["from"], change["to"]) == ("fold_pad_into_conv", False, True) and "Pad" in change["why"]
    assert len(judged["attempts"]) == 1  # the cheapest form first
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["Relu", "Conv"]


# --- the whole form space: every key a rejected node's forms name, exact forms first -----------------------------


def _bilinear_x8(path):
    """Conv (21 channels) -> bilinear half-pixel Resize x8, as LR-ASPP's head upsamples back to the input."""
    weight = numpy_helper.from_array(rng().standard_normal((21, 8, 3, 3)).astype("float32"), "w")
    scales = numpy_helper.from_array(np.array([1, 1, 8, 8], "float32"), "scales")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["a"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Resize", ["a", "", "scales"], ["y"], name="up", mode="linear",
                          coordinate_transformation_mode="half_pixel")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 21, 64, 64])], [weight, scales])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_a_convtranspose_stride_the_judge_refuses_is_staged_exactly(tmp_path):
    """The emitted ConvTranspose (x8) is also changed by align-channels: every pass that touched it, and the forms
    that emit its op type, name their keys; the first accepted form is exact (x4 x2 stages), not an alignment."""
    out, report = tmp_path / "fixed.onnx", tmp_path / "r.json"
    result = _fix(_bilinear_x8(tmp_path / "up8.onnx"), "-o", str(out), "--resize-mode", "exact", "--report",
                  str(report), "--judge", f"{PATTERN_JUDGE} convt-stride {{model}}")
    assert result.exit_code == EXIT_OK, result.output
    judged = json.loads(report.read_text())["judge"]
    assert judged["accepted"] and judged["changed"]["max_convtranspose_stride"]["to"] == 4, judged
    assert judged["attempts"][-1]["exact"] is True
    assert Judge(f"{PATTERN_JUDGE} convt-stride {{model}}").judge(out.read_bytes()).kind == "pass"
    assert "APPROXIMATE" not in result.output


def _with_hardswish(path):
    weight = numpy_helper.from_array(rng().standard_normal((8, 8, 3, 3)).astype("float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["a"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("HardSwish", ["a"], ["y"], name="act")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_an_op_the_judge_does_not_support_is_lowered_and_its_refused_form_gets_the_next(tmp_path):
    """"Op not supported: HardSwish": forbidding it lowers it to HardSigmoid + Mul, which the judge refuses for
    another reason; that candidate is reduced again and HardSigmoid forbidden too: the Clip form is accepted."""
    out, report = tmp_path / "fixed.onnx", tmp_path / "r.json"
    judge = f"{PATTERN_JUDGE} op:HardSwish,op:HardSigmoid {{model}}"
    result = _fix(_with_hardswish(tmp_path / "hs.onnx"), "-o", str(out), "--align", "0", "--report", str(report),
                  "--judge", judge)
    assert result.exit_code == EXIT_OK, result.output
    judged = json.loads(report.read_text())["judge"]
    assert judged["changed"]["forbidden_ops"]["to"] == ["HardSwish", "HardSigmoid"], judged
    assert [a["changes"] for a in judged["attempts"]][:2] == [{"forbidden_ops": ["HardSwish"]},
                                                               {"forbidden_ops": ["HardSwish", "HardSigmoid"]}]
    assert {n.op_type for n in onnx.load(str(out)).graph.node} == {"Conv", "Mul", "Add", "Clip"}
    assert Judge(judge).judge(out.read_bytes()).kind == "pass"


def test_an_approximate_form_is_tried_only_after_every_exact_one_and_never_under_strict(tmp_path):
    """A judge that refuses every exact Resize form (ConvTranspose, MatMul) accepts the nearest one, which is
    judged last (its bound raised: nearest x8 on random inputs is far from bilinear); --strict leaves it unjudged
    and the run ends with the judge violation (exit 1)."""
    source = _bilinear_x8(tmp_path / "up8.onnx")
    judge = f"{PATTERN_JUDGE} op:ConvTranspose,op:MatMul {{model}}"
    report = tmp_path / "r.json"
    result = _fix(source, "-o", str(tmp_path / "a.onnx"), "--resize-mode", "exact", "--max-approx-error", "2",
                  "--report", str(report), "--judge", judge)
    assert result.exit_code == EXIT_OK, result.output
    attempts = json.loads(report.read_text())["judge"]["attempts"]
    assert attempts[-1] == {"changes": {"resize_mode": "nearest"}, "outcome": "pass", "exact": False}
    deferred = next(k for k, a in enumerate(attempts) if a["outcome"] == "deferred: approximate")
    assert all(a["exact"] is not False for a in attempts[:deferred]) and deferred < len(attempts) - 1
    strict = _fix(source, "-o", str(tmp_path / "s.onnx"), "--resize-mode", "exact", "--max-approx-error", "2",
                  "--strict", "--report", str(report), "--judge", judge)
    assert strict.exit_code == EXIT_VIOLATIONS, strict.output
    judged = json.loads(report.read_text())["judge"]
    assert not judged["accepted"]
    assert {"changes": {"resize_mode": "nearest"}, "outcome": "not judged: approximate (--strict)",
            "exact": False} in judged["attempts"]
