"""``npufix probe`` against a synthetic compiler (tests/synthetic_judge.py, run as a real judge command): the
learned profile loads as a target, and npufix's output under it is what that compiler accepts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import signal_when
from onnx import TensorProto, helper

from onnx_npu_fix.cli import main
from onnx_npu_fix.config.targets import load_target
from onnx_npu_fix.judge.candidates import unbuildable
from onnx_npu_fix.judge.probe import models as probe_models

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HIDDEN = {"depthwise_max_dilation": 6, "depthwise_deconv_max_stride": 2, "refused_ops": ["HardSwish"],
          "channel_multiple": 4, "linear_resize": False}
"""The synthetic compiler's limits: written to a file only the judge command names, never given to npufix."""
EXPORTS = {"torch_convtasnet": "mix:1,4000", "torchaudio_convtasnet": "mix:1,1,4000"}
"""The real exports probed with --like, and the shape each input is frozen to."""
CONVTASNET = os.path.join(ROOT, "fixtures", "torch_convtasnet.onnx")


def _judge_argv(limits: str) -> list[str]:
    return [sys.executable, os.path.join(HERE, "synthetic_judge.py"), "--limits", limits]


@pytest.fixture(scope="module")
def judge(tmp_path_factory) -> tuple[str, str]:
    """(the --judge command, the limits file it names) of the synthetic compiler with :data:`HIDDEN`."""
    limits = tmp_path_factory.mktemp("compiler") / "limits.json"
    limits.write_text(json.dumps(HIDDEN))
    return " ".join(_judge_argv(str(limits))) + " {model}", str(limits)


def _accepts(judge: tuple[str, str], path: str) -> bool:
    return subprocess.run([*_judge_argv(judge[1]), path], capture_output=True).returncode == 0


@pytest.fixture(scope="module", params=sorted(EXPORTS))
def export_probe(request, judge, tmp_path_factory):
    """One focused probe of a real ConvTasNet export: (model path, its input shape, profile path, report, result)."""
    where = tmp_path_factory.mktemp("probe")
    model = os.path.join(ROOT, "fixtures", f"{request.param}.onnx")
    shape = ["--input-shape", EXPORTS[request.param]]
    profile, report = where / "chip.toml", where / "probe.json"
    result = CliRunner().invoke(main, ["probe", "--judge", judge[0], "--like", model, *shape, "-o", str(profile),
                                       "--report", str(report)], catch_exceptions=False)
    return model, shape, profile, json.loads(report.read_text()), result


def test_the_learned_profile_is_the_compilers_limits(export_probe):
    _model, _shape, profile, report, result = export_probe
    assert result.exit_code == 0, result.output
    target = load_target(str(profile))
    assert target.constraints["max_dilation"] == HIDDEN["depthwise_max_dilation"]
    assert target.constraints["max_convtranspose_stride"] == HIDDEN["depthwise_deconv_max_stride"]
    assert target.constraints["align"] == HIDDEN["channel_multiple"]
    lines = [line for line in profile.read_text().splitlines() if line.startswith("max_dilation")]
    assert "accepted (sha256" in lines[0] and "rejected (sha256" in lines[0] and "dilation out of range" in lines[0]
    assert report["checks"] and all(c["verdict"] == "pass" for c in report["checks"])


def test_the_fixed_model_compiles_and_the_original_does_not(export_probe, judge, tmp_path):
    model, shape, profile, _report, _result = export_probe
    assert not _accepts(judge, model)
    out = tmp_path / "out.onnx"
    result = CliRunner().invoke(main, [model, *shape, "--target", str(profile), "-o", str(out), "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert _accepts(judge, str(out))


def test_no_model_is_judged_twice_and_the_record_holds_its_schema(export_probe):
    _model, _shape, _profile, report, _result = export_probe
    digests = [c["sha256"] for c in report["calls"]]
    assert report["judge_calls"] == len(digests) == len(set(digests))
    assert len(digests) <= 60  # a focused probe: tens of calls, not hundreds
    assert not report["unbuildable"]
    probes = {c["probe"] for c in report["calls"]}
    assert {"depthwise_conv1d_dilation", "op", "fixed_model"} <= probes
    emitted = {c["params"]["op"] for c in report["calls"] if c["params"].get("from") == "npufix output"}
    assert emitted, "the ops npufix emits for the model (space-to-batch) are probed too"
    jsonschema = pytest.importorskip("jsonschema")
    from onnx_npu_fix.pipeline.report import schema

    validator = jsonschema.Draft202012Validator(schema("probe"))
    validator.validate(report)
    assert not validator.is_valid(dict(report, calls=[{"probe": "x"}]))


def test_a_limit_the_judge_times_out_on_is_a_note_not_a_key(judge, tmp_path):
    """A compiler that hangs on large dilations: the dilation limit is undecided and left out, with the reason."""
    limits = tmp_path / "limits.json"
    limits.write_text(json.dumps({**HIDDEN, "hang_above_dilation": 3}))
    model = tmp_path / "dilated.onnx"
    onnx.save(probe_models.dilated_conv(depthwise=True, rank=1, dilation=16), str(model))
    profile = tmp_path / "chip.toml"
    command = " ".join(_judge_argv(str(limits))) + " {model}"
    result = CliRunner().invoke(main, ["probe", "--judge", command, "--judge-timeout", "2", "--like", str(model),
                                       "-o", str(profile), "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    target = load_target(str(profile))
    assert "max_dilation" not in target.constraints
    assert "timed out at 4" in target.notes["depthwise_conv1d_dilation"]


@pytest.mark.parametrize("build", [
    lambda: probe_models.dilated_conv(depthwise=True, rank=1, dilation=128),
    lambda: probe_models.dilated_conv(depthwise=False, rank=2, dilation=5),
    lambda: probe_models.conv_transpose(stride=3),
    lambda: probe_models.conv_transpose(stride=8),
    lambda: probe_models.pointwise_conv(channels=1),
    lambda: probe_models.resize(form="linear"),
    lambda: probe_models.resize(form="nearest"),
    lambda: probe_models.resize(form="linear", factor=8),
    lambda: probe_models.conv(kernel=7, stride=4),
    lambda: probe_models.conv(kernel=16, stride=8, rank=1),
    lambda: probe_models.qdq_conv(stride=4),
    lambda: probe_models.ranked(rank=6),
    lambda: probe_models.pointwise_conv(channels=16, batch=2),
    *[lambda op=op: probe_models.single_op(op) for op in sorted(probe_models.SINGLE_OPS)],
])
def test_every_probe_model_passes_the_checker_and_strict_inference(build):
    model = build()
    assert unbuildable(model) is None
    onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _hardswish_resize_model(path: str) -> None:
    """A Conv -> HardSwish -> linear Resize model (what a MobileNetV3 segmentation head holds)."""
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    scales = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["h"]),
             helper.make_node("Resize", ["h", "", "s"], ["y"], mode="linear",
                              coordinate_transformation_mode="half_pixel")]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32, 32])], [weight, scales])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_refused_op_and_linear_resize_are_learned(judge, tmp_path):
    model = tmp_path / "head.onnx"
    _hardswish_resize_model(str(model))
    profile = tmp_path / "chip.toml"
    result = CliRunner().invoke(main, ["probe", "--judge", judge[0], "--like", str(model), "-o", str(profile), "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    target = load_target(str(profile))
    assert list(target.constraints["forbidden_ops"]) == HIDDEN["refused_ops"]
    assert target.constraints["require_nearest_resize"] is True
    assert "max_dilation" not in target.constraints  # the model has no dilated conv: nothing was probed


def test_base_target_keys_stay_unless_learned(judge, tmp_path):
    model = tmp_path / "head.onnx"
    _hardswish_resize_model(str(model))
    profile = tmp_path / "chip.toml"
    result = CliRunner().invoke(main, ["probe", "--judge", judge[0], "--like", str(model), "--base-target", "bm1684x",
                                       "-o", str(profile), "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    learned, base = load_target(str(profile)).constraints, load_target("bm1684x").constraints
    assert learned["require_nearest_resize"] is True and base["require_nearest_resize"] is False
    assert learned["max_dilation"] == base["max_dilation"]
    assert "# from --base-target bm1684x" in profile.read_text()


def _strided_rank5_model(path: str) -> None:
    """A 7x7 stride-4 Conv, then a Reshape to five axes and back (a channel shuffle's form)."""
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((8, 3, 7, 7)).astype(np.float32), "w")
    five = onnx.numpy_helper.from_array(np.array([1, 8, 4, 4, 16], np.int64), "five")
    four = onnx.numpy_helper.from_array(np.array([1, 8, 16, 16], np.int64), "four")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[7, 7], strides=[4, 4], pads=[3, 3, 3, 3]),
             helper.make_node("Reshape", ["c", "five"], ["r"]), helper.make_node("Reshape", ["r", "four"], ["y"])]
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [weight, five, four])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _probed(limits: dict, like: str, where, *args: str):
    """The profile ``npufix probe --like LIKE ARGS`` learns from the synthetic compiler with ``limits`` (a
    TargetProfile), and the judge command."""
    path = where / "limits.json"
    path.write_text(json.dumps(limits))
    profile = where / "chip.toml"
    command = " ".join(_judge_argv(str(path))) + " {model}"
    result = CliRunner().invoke(main, ["probe", "--judge", command, "--like", like, *args, "-o", str(profile), "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return load_target(str(profile)), (command, str(path))


def _probe_with(limits: dict, like: str, where) -> dict:
    """The constraints ``npufix probe --like LIKE`` learns from the synthetic compiler with ``limits``."""
    return _probed(limits, like, where)[0].constraints


def test_an_op_rejected_alone_but_accepted_beside_a_conv_is_not_forbidden(tmp_path):
    """As rknn-toolkit2 places a Reshape or Unsqueeze alone in a model on the CPU and beside a Conv on the NPU: the
    op probes judge such an op inside its neighbours, so space-to-batch (which emits Reshapes) stays allowed and
    the fixed ConvTasNet compiles."""
    export = os.path.join(ROOT, "fixtures", "torchaudio_convtasnet.onnx")
    shape = ["--input-shape", EXPORTS["torchaudio_convtasnet"]]
    limits = {"depthwise_max_dilation": 6, "refused_alone_ops": ["Reshape", "Unsqueeze"]}
    target, judge = _probed(limits, export, tmp_path, *shape)
    assert not {"Reshape", "Unsqueeze"} & set(target.constraints.get("forbidden_ops", ()))
    assert target.notes["op_Reshape"].startswith("not forbidden: rejected alone")
    assert "accepted inside its neighbours" in target.notes["op_Reshape"]
    out = tmp_path / "out.onnx"
    result = CliRunner().invoke(main, [export, *shape, "--target", str(tmp_path / "chip.toml"), "-o", str(out), "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert not _accepts(judge, export) and _accepts(judge, str(out))
    assert "Reshape" in {n.op_type for n in onnx.load(str(out)).graph.node}


def test_a_rejection_inside_the_neighbours_that_names_a_neighbour_decides_nothing(tmp_path):
    """Unsqueeze is refused alone; beside its neighbours the judge refuses the Mul by name: not Unsqueeze's
    fault, so it is a note and not a forbidden op, while the Mul itself is forbidden."""
    export = os.path.join(ROOT, "fixtures", "torchaudio_convtasnet.onnx")
    limits = {"refused_alone_ops": ["Unsqueeze"], "refused_ops": ["Mul"]}
    target, _judge = _probed(limits, export, tmp_path, "--input-shape", EXPORTS["torchaudio_convtasnet"])
    forbidden = set(target.constraints["forbidden_ops"])
    assert "Mul" in forbidden and "Unsqueeze" not in forbidden
    assert target.notes["op_Unsqueeze"].startswith("not decided: rejected alone")
    assert "names /" in target.notes["op_Unsqueeze"] and "Mul" in target.notes["op_Unsqueeze"]


def test_kernel_stride_rank_and_batch_limits_are_learned(tmp_path):
    model = tmp_path / "stem.onnx"
    _strided_rank5_model(str(model))
    hidden = {"max_kernel": 5, "max_stride": 2, "max_rank": 4, "batch_one": True}
    learned = _probe_with(hidden, str(model), tmp_path)
    assert {key: learned.get(key) for key in hidden} == hidden
    assert "max_stride_quantized" not in learned and "allow_qdq" not in learned  # a float model: not probed
    roomy = _probe_with({"max_rank": 5}, str(model), tmp_path)
    assert roomy["batch_one"] is False
    assert not {"max_kernel", "max_stride", "max_rank"} & set(roomy)  # every value up to the model's accepted


def test_a_quantized_stride_limit_and_qdq_refusal_are_learned(tmp_path):
    """The --like model is quantized by onnxruntime's own quantizer (a stride-4 Conv)."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[4, 4])
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 19, 19])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 5, 5])], [weight])
    float_path, qdq_path = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(float_path))

    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": rng.standard_normal((1, 8, 19, 19)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantization.quantize_static(str(float_path), str(qdq_path), Reader(), quant_format=quantization.QuantFormat.QDQ)
    learned = _probe_with({"quantized_max_stride": 2}, str(qdq_path), tmp_path)
    assert learned["max_stride_quantized"] == 2 and learned["allow_qdq"] is True
    assert "max_stride" not in learned  # float Convs take every stride up to the model's
    refused = _probe_with({"qdq": False}, str(qdq_path), tmp_path)
    assert refused["allow_qdq"] is False
    assert "QuantizeLinear" not in refused.get("forbidden_ops", ())  # allow_qdq says it: a pass may keep QDQ units


def test_an_op_refused_in_the_model_but_not_as_npufix_emits_it_is_not_forbidden(tmp_path):
    """The compiler refuses the model's own Reshape (alone and beside its neighbours) but takes space-to-batch's:
    forbidding Reshape would stop the fix of every dilated conv, so it is a note, and the output has its
    space-to-batch."""
    export = os.path.join(ROOT, "fixtures", "torchaudio_convtasnet.onnx")
    shape = ["--input-shape", EXPORTS["torchaudio_convtasnet"]]
    own = "/mask_generator/input_norm/Reshape"
    target, judge = _probed({"depthwise_max_dilation": 6, "refused_nodes": [own]}, export, tmp_path, *shape)
    assert "Reshape" not in target.constraints.get("forbidden_ops", ())
    note = target.notes["op_Reshape"]
    assert note.startswith("not forbidden: npufix emits Reshape") and own in note and "cannot place" in note
    out = tmp_path / "out.onnx"
    result = CliRunner().invoke(main, [export, *shape, "--target", str(tmp_path / "chip.toml"), "-o", str(out), "-q"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    fixed = onnx.load(str(out))
    dilations = [max(a.ints) for n in fixed.graph.node if n.op_type == "Conv" for a in n.attribute
                 if a.name == "dilations"]
    assert max(dilations) <= 6 and sum(n.op_type == "Reshape" for n in fixed.graph.node) > 1


def _conv_div_model(path: str, div: str) -> None:
    """Conv -> Div by a constant, the Div named ``div``."""
    weight = onnx.numpy_helper.from_array(np.full((4, 4, 1, 1), 0.5, np.float32), "w")
    six = onnx.numpy_helper.from_array(np.array(6.0, np.float32), "six")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", kernel_shape=[1, 1]),
             helper.make_node("Div", ["c", "six"], ["y"], div)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight, six])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_an_op_refused_in_one_model_and_taken_in_another_is_not_forbidden(tmp_path):
    """Two --like models each with a Div; the compiler refuses one of them by name (as rknn runs a gLN's Div on
    the CPU and PP-OCR's on the NPU): the other is judged too, so Div is a note, not a forbidden op; refused
    everywhere, it is forbidden."""
    first, second = tmp_path / "first.onnx", tmp_path / "second.onnx"
    _conv_div_model(str(first), "first_div")
    _conv_div_model(str(second), "second_div")
    target, _judge = _probed({"refused_nodes": ["first_div"]}, str(first), tmp_path, "--like", str(second))
    assert "Div" not in target.constraints.get("forbidden_ops", ())
    note = target.notes["op_Div"]
    assert note.startswith("not forbidden: another model holds Div (second_div)") and "first_div" in note
    refused, _judge = _probed({"refused_ops": ["Div"]}, str(first), tmp_path, "--like", str(second))
    assert "Div" in refused.constraints["forbidden_ops"]
    timed_out, _judge = _probed({"refused_nodes": ["first_div"], "hang_nodes": ["second_div"]}, str(first), tmp_path,
                                "--like", str(second), "--judge-timeout", "3")
    assert "Div" in timed_out.constraints["forbidden_ops"]  # no verdict on the other Div: the rejection stands


def _resize_x4_x8_model(path: str) -> None:
    """Conv -> nearest Resize x4 -> linear half_pixel Resize x8 (a segmentation head's upsampling)."""
    weight = onnx.numpy_helper.from_array(np.full((8, 8, 1, 1), 0.25, np.float32), "w")
    four = onnx.numpy_helper.from_array(np.array([1, 1, 4, 4], np.float32), "four")
    eight = onnx.numpy_helper.from_array(np.array([1, 1, 8, 8], np.float32), "eight")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Resize", ["c", "", "four"], ["n"], "up4", mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Resize", ["n", "", "eight"], ["y"], "up8", mode="linear",
                              coordinate_transformation_mode="half_pixel")]
    graph = helper.make_graph(nodes, "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 128, 128])],
                              [weight, four, eight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_resize_factors_are_learned_at_the_models_factors(tmp_path):
    model = tmp_path / "up.onnx"
    _resize_x4_x8_model(str(model))
    learned = _probe_with({"resize_factors": [2, 8], "linear_factors": [2]}, str(model), tmp_path)
    assert learned["resize_factors"] == (2, 8) and learned["linear_half_pixel_factors"] == (2,)
    assert learned["require_nearest_resize"] is False
    roomy, _judge = _probed({}, str(model), tmp_path)
    assert not {"resize_factors", "linear_half_pixel_factors"} & set(roomy.constraints)
    assert roomy.notes["resize_factors"].startswith("every factor the models have accepted")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            return "\nState:\tZ" in f.read()  # a zombie has ended; only its exit status is left to reap
    except FileNotFoundError:
        return True


@pytest.mark.parametrize(("signum", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_leaves_the_partial_report_and_nothing_else(tmp_path, signum, code):
    """Stopped while the judge compiles (a hanging compiler, no --judge-timeout): the exit code says which
    signal, the report holds the calls made so far and says it is partial, no profile and no temporary file is
    left, and the judge's process is killed with npufix."""
    import time

    model, mark, out = tmp_path / "dilated.onnx", tmp_path / "judge.pid", tmp_path / "out"
    out.mkdir()
    onnx.save(probe_models.dilated_conv(depthwise=True, rank=1, dilation=16), str(model))
    limits = tmp_path / "limits.json"
    limits.write_text(json.dumps({"hang_above_dilation": 4, "hang_mark": str(mark)}))
    command = " ".join(_judge_argv(str(limits))) + " {model}"
    proc = subprocess.Popen([sys.executable, "-m", "onnx_npu_fix", "probe", "--judge", command, "--like", str(model),
                             "-o", str(out / "chip.toml"), "--report", str(out / "probe.json"), "-q"],
                            stderr=subprocess.PIPE)
    err = signal_when(proc, lambda: mark.exists() and bool(mark.read_text()), signum)
    assert proc.returncode == code, err
    assert b"Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert b"wrote only the partial record" in err, err
    assert sorted(os.listdir(out)) == ["probe.json"]
    report = json.loads((out / "probe.json").read_text())
    assert report["interrupted"] is True
    assert [c["params"]["dilation"] for c in report["calls"]] == [1, 2, 4]  # 8 was being judged: not a call
    judge_pid = int(mark.read_text())
    for _ in range(100):
        if _gone(judge_pid):
            break
        time.sleep(0.1)
    assert _gone(judge_pid)


@pytest.mark.parametrize(("args", "message"), [
    (["--like", "missing.onnx"], "missing.onnx"),
    (["--judge", ""], "--judge"),
    (["--like", CONVTASNET], "mix"),  # a dynamic input without --input-shape
])
def test_bad_input_is_exit_2_in_one_line(judge, tmp_path, args, message):
    profile = tmp_path / "chip.toml"
    command = [] if "--judge" in args else ["--judge", judge[0]]
    result = CliRunner().invoke(main, ["probe", *command, *args, "-o", str(profile)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output
    assert not profile.exists()


def test_the_console_script_probes(judge, tmp_path):
    """One real run of the installed command (the dispatch to the subcommand, the exit code)."""
    model = tmp_path / "head.onnx"
    _hardswish_resize_model(str(model))
    npufix = os.path.join(os.path.dirname(sys.executable), "npufix")
    done = subprocess.run([npufix, "probe", "--judge", judge[0], "--like", str(model), "-o", str(tmp_path / "c.toml")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "judge call 1:" in done.stderr and "wrote" in done.stderr
