"""How a candidate's outputs are judged (validation that discriminates): outputs computed
from a dequantized tensor by float ops in the steps of their quantizer, per-output tolerances as polygraphy
takes them, the statistics of every output in the record, and approximate verdicts near their bound."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import quantize_with_onnxruntime
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.cli import main
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.ir.qdq import output_step_bound
from onnx_npu_fix.passes.base import Change, Pass, PassResult

quantization = pytest.importorskip("onnxruntime.quantization")

# --- outputs computed from a dequantized tensor by float ops -------------------------------------------------


def _float_conv_tanh(tail: tuple[str, ...] = ("Tanh",)) -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> ``tail`` ops -> y: after onnxruntime's QDQ quantizer, the tail (which it does not
    quantize) reads the second conv's DequantizeLinear."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (5, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, (5,)).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(0, 0.5, (3, 5, 3, 3)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4, name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1] * 4, name="conv2")]
    x = "c2"
    for i, op in enumerate(tail):
        nodes.append(helper.make_node(op, [x], [f"t{i}"], name=f"tail{i}"))
        x = f"t{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 12, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _quantized(tmp_path, tail: tuple[str, ...] = ("Tanh",)) -> onnx.ModelProto:
    """The model quantized by onnxruntime's own quantizer (QDQ, uint8 activations, int8 weights)."""
    quantized = quantize_with_onnxruntime(_float_conv_tanh(tail), tmp_path)
    assert [n.op_type for n in quantized.graph.node][-1 - len(tail)] == "DequantizeLinear"
    return quantized


class FlipRounding(Pass):
    """Declared exact; adds ``NUDGE`` quantization steps of conv2's output quantizer to the conv's result before
    it is quantized — what a changed float summation order does to a value near a rounding boundary (with a
    small nudge, only values that close to a boundary flip: whether any does depends on the input set)."""

    name = "flip-rounding"
    summary = "moves conv2's result by a fraction of its quantization step"
    exact = True
    NUDGE = 0.0

    def run(self, model, options):
        index = GraphIndex(model)
        quantizer = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "c2")
        scale = float(index.const_value(quantizer.input[1]))
        model.graph.initializer.append(numpy_helper.from_array(np.array(self.NUDGE * scale, np.float32), "nudge"))
        quantizer.input[0] = "c2_nudged"
        at = list(model.graph.node).index(quantizer)
        model.graph.node.insert(at, helper.make_node("Add", ["c2", "nudge"], ["c2_nudged"], name="nudge"))
        return PassResult(changes=[Change("nudge", "Add", "inserted")])


def _flipped(model: onnx.ModelProto, nudge: float, seed: int):
    cls = type("Flip", (FlipRounding,), {"NUDGE": nudge})
    return api.fix(model, FixOptions(seed=seed, align=0), [cls()])


def test_tanh_after_a_dequantizer_is_judged_in_its_steps_whatever_the_seed(tmp_path):
    """A flip of one rounding before the DequantizeLinear moves Tanh's output by up to one step of it: judged
    by the float tolerance that failed on the seeds whose inputs had a value near a boundary (exit 3) and
    passed on the others. In steps it passes on every seed; two steps fail on every seed."""
    model = _quantized(tmp_path)
    flipped = 0
    for seed in range(6):
        result = _flipped(model, 0.05, seed)
        assert result.ok, (seed, result.report.failed_pass)
        diff = result.report.final.outputs[0]
        assert diff.metric == "steps" and diff.through == ["Tanh"] and diff.quantizer, diff
        assert diff.max_steps <= 1 + 1e-5
        flipped += diff.moved_elements > 0
    assert flipped >= 1  # some seed did flip a rounding (else this test shows nothing)
    for seed in range(3):
        result = _flipped(model, 2.5, seed)  # every value moves by two or three steps: a wrong model
        assert not result.ok
        assert result.report.passes[-1].validation.outputs[0].max_steps >= 2


def test_the_step_bound_follows_lipschitz_ops_and_stops_at_ones_that_amplify(tmp_path):
    model = _quantized(tmp_path, ("Tanh", "HardSigmoid", "Neg"))
    index = GraphIndex(model)
    bound = output_step_bound(index, "y")
    assert bound is not None and bound.through == ("Tanh", "HardSigmoid", "Neg")
    own = output_step_bound(index, index.producer["y"].input[0])  # ... -> Tanh -> HardSigmoid
    dequantized = output_step_bound(index, model.graph.node[-4].output[0])
    assert dequantized.through == () and own.through == ("Tanh", "HardSigmoid")
    assert float(bound.steps) == pytest.approx(0.2 * float(dequantized.steps))  # HardSigmoid's slope: alpha 0.2
    amplified = _quantized(tmp_path, ("Exp",))
    assert output_step_bound(GraphIndex(amplified), "y") is None  # Exp has no bounded slope: float tolerance


# --- per-output tolerances and the statistics of every output -----------------------------------------------------

SCALE_ONE_OUTPUT = '''
import numpy as np
import onnx
from onnx_npu_fix.passes.base import Change, Pass, PassResult


class ScaleOne(Pass):
    """Multiplies graph output 'near' by 1 + 3e-4: beyond the default rtol (1e-4), within 1e-3."""
    name = "scale-one"
    summary = "scales one output by 1 + 3e-4"
    exact = True

    def run(self, model, options):
        for node in model.graph.node:
            node.output[:] = ["near/pre" if o == "near" else o for o in node.output]
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(1 + 3e-4, np.float32), "k"))
        model.graph.node.append(onnx.helper.make_node("Mul", ["near/pre", "k"], ["near"], name="scale"))
        return PassResult(changes=[Change("scale", "Mul", "inserted")])
'''


def _two_outputs(path) -> str:
    """x -> Relu -> near (the plugin scales it), x -> Neg -> far (untouched)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["near"], name="relu"), helper.make_node("Neg", ["x"], ["far"], name="neg")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8]) for n in ("near", "far")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


def _run(tmp_path, *args: str):
    plugin = tmp_path / "scale_one.py"
    plugin.write_text(SCALE_ONE_OUTPUT)
    model = _two_outputs(tmp_path / "m.onnx")
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    for stale in (out, report):
        stale.unlink(missing_ok=True)
    result = CliRunner().invoke(main, [model, "-o", str(out), "--report", str(report), "--plugin", str(plugin),
                                       "--align", "0", *args])
    return result, (json.loads(report.read_text()) if report.exists() else None)


def test_a_per_output_rtol_applies_to_that_output_only(tmp_path):
    failed, record = _run(tmp_path)
    assert failed.exit_code == 3, failed.output  # 3e-4 relative: beyond the default rtol 1e-4
    passed, record = _run(tmp_path, "--rtol", "near:1e-3")
    assert passed.exit_code == 0, passed.output
    outputs = {o["name"]: o for o in record["final_validation"]["outputs"]}
    assert outputs["near"]["rtol"] == 1e-3 and outputs["far"]["rtol"] == 1e-4
    assert "near: rtol 0.001" in record["final_validation"]["criterion"]
    # the statistics users compare with, and the one the verdict used with its bound
    near = outputs["near"]
    assert near["max_rel"] == pytest.approx(3e-4, rel=0.05) and 0 < near["mean_abs"] < near["max_abs"]
    assert near["metric"] == "atol_needed" and near["value"] <= near["bound"] == near["atol"] == 1e-5
    assert outputs["far"]["max_abs"] == 0 and outputs["far"]["value"] == 0
    tighter, _ = _run(tmp_path, "--rtol", "1e-3", "--rtol", "near:1e-5")  # the named output keeps its own
    assert tighter.exit_code == 3, tighter.output
    by_atol, _ = _run(tmp_path, "--atol", "near:1e-2")
    assert by_atol.exit_code == 0, by_atol.output


@pytest.mark.parametrize("args, phrase", [
    (("--rtol", "nearr:1e-3"), "--rtol names 'nearr', which is not a graph output (outputs: near, far)"),
    (("--atol", "near:-1"), "'near:-1': must be a finite number >= 0"),
    (("--rtol", "near:nan"), "must be a finite number"),
    (("--rtol", "near:x"), "expected a number or OUTPUT:NUMBER"),
    (("--rtol", "near:1e-3", "--rtol", "near:2e-3"), "two values for output 'near'"),
    (("--atol", "1e-3", "--atol", "1e-4"), "two values for the default"),
])
def test_bad_tolerances_are_one_line_usage_errors(tmp_path, args, phrase):
    result, _ = _run(tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert phrase in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "o.onnx").exists()


def test_tolerances_split_at_the_last_colon():
    from onnx_npu_fix.config.options import parse_tolerances

    assert parse_tolerances("--rtol", ["1e-3", "out:0:2e-3", "y:0"]) == (1e-3, {"out:0": 2e-3, "y": 0.0})
    assert parse_tolerances("--atol", []) == (None, {})


# --- an approximate verdict near its bound ------------------------------------------------------------------------


def _approximate_final(bound: float):
    from test_validate_policy import _resize_model

    result = api.fix(_resize_model(), FixOptions(max_approx_error=bound))  # linear -> nearest: approximate
    comparison = result.report.passes[-1].validation if not result.ok else result.report.final
    return result.ok, comparison, comparison.outputs[0]


def test_an_approximate_verdict_near_its_bound_is_measured_on_more_sets_and_needs_its_confidence():
    """Far from the bound the verdict is the estimate on the run's sets. Within 10% of it, more seeded sets are
    measured and the bound must hold for the 95% upper confidence bound of the error: an estimate just below the
    bound (0.504 against 0.5 passed on one seed's sets, failed on another's) is no longer written as within it."""
    ok, far, diff = _approximate_final(5.0)
    assert ok and diff.metric == "rel_l2" and diff.rel_l2_upper is not None and diff.rel_l2_upper > diff.rel_l2
    first_sets, estimate = diff.sets, diff.rel_l2
    assert "confidence" not in far.criterion

    ok, near, diff = _approximate_final(estimate * 1.05)  # near the bound: measured again, on more sets
    assert diff.sets > first_sets and diff.metric == "rel_l2_upper" and diff.value == diff.rel_l2_upper
    assert f"confidence bound over {diff.sets} input sets" in near.criterion
    widened, upper = diff.rel_l2, diff.rel_l2_upper
    assert widened < upper and ok == (upper <= estimate * 1.05)

    ok, _, diff = _approximate_final(widened * 1.0005)  # the estimate is within, its confidence bound is not
    assert widened * 1.0005 < upper and not ok and not diff.passed and diff.rel_l2 < diff.bound
    ok, _, diff = _approximate_final(upper * 1.001)  # the bound holds with 95% confidence: written
    assert ok and diff.passed and diff.sets > first_sets


def test_the_summary_gives_the_approximate_error_with_its_bound_and_sample(tmp_path):
    from test_validate_policy import _resize_model

    onnx.save(_resize_model(), tmp_path / "m.onnx")
    args = [str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx")]
    far = CliRunner().invoke(main, args)
    assert far.exit_code == 0 and "(bound 0.5; 586 input sets)" in far.output, far.output
    near = CliRunner().invoke(main, [*args, "--max-approx-error", "0.46"])
    line = next(t for t in near.output.splitlines() if t.startswith("output vs input"))
    assert near.exit_code == 0 and "95% upper confidence" in line and "over 1024 input sets" in line, line


def test_the_upper_confidence_bound_of_a_pooled_relative_error():
    from onnx_npu_fix.pipeline.validation.comparison import rel_l2_upper

    assert rel_l2_upper([1.0], [4.0]) is None  # one set: no spread to estimate
    assert rel_l2_upper([1.0, 1.0, 1.0], [4.0, 4.0, 4.0]) == pytest.approx(0.5)  # no spread: the estimate
    rng = np.random.default_rng(0)
    ref = rng.uniform(1, 2, 40)
    wide = rel_l2_upper(list(ref * rng.uniform(0.1, 0.4, 40)), list(ref))
    narrow = rel_l2_upper(list(ref * rng.uniform(0.24, 0.26, 40)), list(ref))
    assert wide > narrow > 0.5  # the estimate (~0.5) plus a margin that grows with the spread
