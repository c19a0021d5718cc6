"""One input set when nothing moved: an exact candidate whose outputs on the first generated set are
bit-identical to its predecessor's is not run on the others (after an approximate change too: the final comparison
then carries the sets it skipped); anything that moved, loaded data and small inputs run every set, and the records
say which."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import conv_bn_relu
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.cli import main
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.passes.base import Change, Pass, PassResult
from onnx_npu_fix.passes.fold_batchnorm import FoldBatchNormPass
from onnx_npu_fix.passes.resize_nearest import ResizeNearestPass
from onnx_npu_fix.pipeline.scheduler import prepare, run_passes
from onnx_npu_fix.pipeline.validation.comparison import sets_summary
from onnx_npu_fix.pipeline.validation.session import Runner


def _append_at_the_output(model: onnx.ModelProto, op: str, extra_inputs: list[str], name: str) -> PassResult:
    """The graph output, computed as before under another name, passed through one more ``op`` node."""
    out = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{out}/pre" if o == out else o for o in node.output]
    model.graph.node.append(helper.make_node(op, [f"{out}/pre", *extra_inputs], [out], name=name))
    return PassResult(changes=[Change(name, op, "inserted")])


class IdentityTail(Pass):
    """Exact and bit-identical: the graph output is computed as before and passed through an Identity."""

    name = "identity-tail"
    summary = "route the output through an Identity"
    exact = True

    def run(self, model: onnx.ModelProto, options: FixOptions) -> PassResult:
        return _append_at_the_output(model, "Identity", [], "tail/id")


class HalfWrong(Pass):
    """Declared exact, wrong only where the output exceeds 2 (a Clip that should not be there): a bug that a
    small input set can miss and a large one cannot."""

    name = "half-wrong"
    summary = "clip the output at 2"
    exact = True

    def run(self, model: onnx.ModelProto, options: FixOptions) -> PassResult:
        model.graph.initializer.append(numpy_helper.from_array(np.array(2.0, np.float32), "clip/max"))
        return _append_at_the_output(model, "Clip", ["", "clip/max"], "clip")


def _conv_bn(channels: int = 8, size: int = 32) -> onnx.ModelProto:
    """Conv 3x3 -> BatchNormalization -> Relu on [1, channels, size, size] (8 x 32 x 32 = 8,192 input elements:
    enough for one set, validation.validator.ONE_SET_MIN_ELEMENTS)."""
    return conv_bn_relu(channels, 8, size)


@pytest.fixture
def runs(monkeypatch) -> dict[int, int]:
    """How many input sets each onnxruntime session ran, in the order the sessions first ran (the original's on
    the reference thread first: the first candidate waits for it)."""
    counts: dict[int, int] = {}
    run = Runner.run
    serials = itertools.count()

    def counted(self, feeds):
        if not hasattr(self, "serial"):  # id() would not do: a closed session's address is reused
            self.serial = next(serials)
        counts[self.serial] = counts.get(self.serial, 0) + 1
        return run(self, feeds)

    monkeypatch.setattr(Runner, "run", counted)
    return counts


def _fix(model: onnx.ModelProto, passes, **options):
    options = FixOptions(**options)
    prepare(model, options)
    return run_passes(model, options, passes).report


def test_an_exact_change_that_moves_no_bit_runs_one_set(runs):
    report = _fix(_conv_bn(), [IdentityTail()])
    record = report.passes[0]
    assert record.status == "validated", record
    assert list(runs.values()) == [1, 1]  # the original and the candidate, one set each
    assert record.validation.sets_not_run == 2 and record.validation.outputs[0].sets == 1
    assert report.final.sets_not_run == 2 and report.final.passed
    assert report.final.to_json()["sets_not_run"] == 2


def test_an_exact_change_that_moves_runs_every_set(runs):
    report = _fix(_conv_bn(), [FoldBatchNormPass(), IdentityTail()])
    folded, tail = report.passes
    assert folded.validation.max_abs > 0, "the fold must move a rounding for this test to mean anything"
    assert folded.validation.sets_not_run == 0 and folded.validation.outputs[0].sets == 3
    # Checked as one group, which moved: the original's first set, the candidate's three, then the original's
    # other two from its scratch copy.
    assert list(runs.values()) == [1, 3, 2]
    assert report.final.sets_not_run == 0 and report.final.outputs[0].sets == 3


def test_a_wrong_exact_pass_is_caught_on_a_large_set_and_on_every_small_one():
    # 8,192 N(0, 1) elements: outputs above 2 in every set, so the first set already shows the Clip.
    report = _fix(_conv_bn(), [HalfWrong()])
    assert report.failed_pass.name == "half-wrong" and report.passes[0].validation.sets_not_run == 0
    # 2 x 4 x 4 = 32 elements: a set may hold nothing the Clip touches; every set runs, as before.
    small = _fix(_conv_bn(channels=2, size=4), [HalfWrong()])
    assert small.failed_pass.name == "half-wrong" and small.passes[0].validation.sets_not_run == 0
    assert small.passes[0].validation.outputs[0].sets == 3


def test_small_inputs_and_loaded_data_run_every_set(tmp_path, runs):
    report = _fix(_conv_bn(channels=2, size=8), [IdentityTail()])  # 128 input elements per set
    assert report.passes[0].validation.sets_not_run == 0 and list(runs.values()) == [3, 3]
    runs.clear()
    data = tmp_path / "sets"
    data.mkdir()
    gen = np.random.default_rng(3)
    for k in range(2):
        np.savez(data / f"{k}.npz", x=gen.standard_normal((1, 8, 32, 32)).astype(np.float32))
    report = _fix(_conv_bn(), [IdentityTail()], validation_data=str(data))
    assert report.passes[0].validation.sets_not_run == 0 and list(runs.values()) == [2, 2]


def _upsampler() -> onnx.ModelProto:
    """A linear Resize (resize-nearest makes it approximate) on [1, 8, 32, 32]: 8,192 input elements a set."""
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", name="resize")]
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 64, 64])], [scales])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_after_an_approximate_change_an_unmoved_exact_pass_runs_one_set(runs):
    report = _fix(_upsampler(), [ResizeNearestPass(), IdentityTail()], max_approx_error=1.0)  # rel L2 0.8 on noise
    resize, tail = report.passes
    assert resize.status == "validated" and not resize.validation.exact and resize.validation.outputs[0].sets == 3
    assert tail.status == "validated" and tail.validation.sets_not_run == 2 and tail.validation.outputs[0].sets == 1
    assert list(runs.values()) == [3, 3, 1]  # the original, resize-nearest's candidate, the tail's
    # The approximate verdict on the output is made on all three sets: the tail's own first, resize-nearest's
    # candidate's (which the tail left bit for bit) on the others; the same numbers as resize-nearest's own.
    final = report.final
    assert not final.exact and final.passed and final.outputs[0].sets == 3
    assert final.sets_not_run == 2 and final.sets_carried == 2 and final.to_json()["sets_carried"] == 2
    assert final.outputs[0].rel_l2 == resize.validation.outputs[0].rel_l2 > 0.1
    assert "2 of 3 input sets carried from the last model that ran them" in sets_summary(final)


def test_after_an_approximate_change_a_wrong_exact_pass_is_still_caught():
    report = _fix(_upsampler(), [ResizeNearestPass(), HalfWrong()], max_approx_error=1.0)
    assert report.passes[0].status == "validated" and report.failed_pass.name == "half-wrong"
    assert report.passes[1].validation.sets_not_run == 0 and report.passes[1].validation.outputs[0].sets == 3


def test_validate_final_runs_the_output_model_on_one_set_when_it_moved_no_bit(runs):
    report = _fix(_conv_bn(), [IdentityTail()], validate="final")
    assert report.final.passed and report.final.sets_not_run == 2
    assert list(runs.values()) == [1, 1]
    runs.clear()
    report = _fix(_conv_bn(), [FoldBatchNormPass()], validate="final")
    assert report.final.passed and report.final.sets_not_run == 0 and report.final.outputs[0].sets == 3
    assert list(runs.values()) == [1, 3, 2]


def test_the_summary_says_how_many_sets_were_not_run(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_conv_bn(), path)
    plugin = tmp_path / "tail.py"
    plugin.write_text(
        "from onnx import helper\n"
        "from onnx_npu_fix.passes.base import Change, Pass, PassResult\n\n"
        "class Tail(Pass):\n"
        "    '''Route the output through an Identity.'''\n"
        "    name = 'tail'\n"
        "    summary = 'route the output through an Identity'\n"
        "    exact = True\n\n"
        "    def run(self, model, options):\n"
        "        out = model.graph.output[0].name\n"
        "        for node in model.graph.node:\n"
        "            node.output[:] = [out + '/pre' if o == out else o for o in node.output]\n"
        "        model.graph.node.append(helper.make_node('Identity', [out + '/pre'], [out], name='tail/id'))\n"
        "        return PassResult(changes=[Change('tail/id', 'Identity', 'inserted')])\n")
    result = CliRunner().invoke(main, [str(path), "-o", str(tmp_path / "o.onnx"), "--plugin", str(plugin),
                                       "--passes", "tail"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "bit-identical on the first of 3 input sets (2 not run)"
             in line]
    assert [line.split()[0] for line in lines] == ["tail", "output"], result.output


def test_the_original_s_other_sets_take_the_frozen_inputs_too(runs):
    # --freeze-input: the original keeps the input, so the runs of its other sets need its value as well.
    model = _conv_bn()
    model.graph.input.append(helper.make_tensor_value_info("gain", TensorProto.FLOAT, []))
    model.graph.node[-1].output[0] = "z/pre"
    model.graph.node.append(helper.make_node("Mul", ["z/pre", "gain"], ["z"], name="gain"))
    result = api.fix(model, FixOptions(freeze_inputs={"gain": "2"}))
    assert result.ok and [p.name for p in result.report.passes if p.changes] == ["fold-batchnorm"]
    assert result.report.final.sets_not_run == 0 and list(runs.values()) == [1, 3, 2]
