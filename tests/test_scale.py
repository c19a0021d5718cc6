"""npufix's own work at scale: what a run does once, or not at all, on a model that needs it once or
not at all. Each test counts calls of the expensive step (the figures are in bench/results.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from helpers import conv_bn_relu
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _saved(tmp_path, model: onnx.ModelProto, name: str = "m.onnx") -> str:
    path = str(tmp_path / name)
    onnx.save(model, path)
    return path


def test_no_validate_asks_no_refusal_when_no_approximate_pass_can_change_the_model(tmp_path, monkeypatch):
    """The refusal is a constraint check of the whole model (a fifth of a --no-validate run at 10k nodes): a
    run with no restore points asks it before a declared-approximate pass only when that pass may change the
    model (resize-nearest has no Resize to change here)."""
    asked: list[int] = []
    real = api.target_refusal

    def counting(model, *, options):
        asked.append(len(model.graph.node))
        return real(model, options=options)

    monkeypatch.setattr(api, "target_refusal", counting)
    outcome = api.run(_saved(tmp_path, conv_bn_relu()), tmp_path / "o.onnx", FixOptions(validate="none"))
    assert outcome.ok and [p.name for p in outcome.report.passes if p.changes] == ["fold-batchnorm"]
    assert asked == []


@pytest.mark.parametrize("validate", ["none", "final", "each"])
def test_a_run_infers_shapes_once_and_checks_the_input_and_the_output_once_each(tmp_path, monkeypatch, validate):
    """onnx's shape inference (3 s at 100k nodes) runs once, on the prepared input, when every pass keeps the
    shapes it recorded (fold-batchnorm does); the checker (1.7 s at 100k nodes, both calls) once on the input
    and once on the output."""
    import onnx.checker
    import onnx.shape_inference

    path = _saved(tmp_path, conv_bn_relu())
    calls: list[str] = []

    def counting(real, name):
        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return call

    for module, name in ((onnx.checker, "check_model"), (onnx.shape_inference, "infer_shapes")):
        monkeypatch.setattr(module, name, counting(getattr(module, name), name))
    outcome = api.run(path, tmp_path / "o.onnx", FixOptions(validate=validate))
    assert outcome.ok and [p.name for p in outcome.report.passes if p.changes] == ["fold-batchnorm"]
    assert sorted(calls) == ["check_model", "check_model", "infer_shapes"]


_HEAP_PROBE = """
import sys
from onnx_npu_fix.host import heap
from onnx_npu_fix.io import load
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])
if sys.argv[2] == "kept":  # what the run would hold without handing the freed memory back
    load.release_freed_memory = lambda: None
before = rss()
model = load.read_model(sys.argv[1]).model
load.prepare(model, {})
print(rss() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim; /proc")
def test_what_the_checker_and_shape_inference_free_goes_back_to_the_system(tmp_path):
    """On a 10k-node graph the onnx checker's and shape inference's C++ copies leave their blocks in glibc's
    heap, which the next step's memory came on top of: read and prepared, it holds well under what it held."""
    nodes, weights, x = [], [], "x"
    for i in range(5000):
        weights.append(numpy_helper.from_array(np.full((4, 4, 1, 1), 0.1, np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 4, 4, 4])], weights)
    path = _saved(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    held = {how: int(subprocess.run([sys.executable, "-c", _HEAP_PROBE, path, how], capture_output=True, text=True,
                                    check=True, env={**os.environ, "PYTHONPATH": ROOT}).stdout)
            for how in ("trimmed", "kept")}
    assert held["trimmed"] < 0.7 * held["kept"], held


def test_shape_inference_gets_the_weightless_copy_as_bytes_and_no_proto_of_it(tmp_path, monkeypatch):
    """onnx's shape inference gets the bytes of a copy whose weights carry dims only, and the caller holds no proto
    of that copy while onnx builds its own (a 100k-node chain: the run's peak 868 -> 754 MB)."""
    import onnx.shape_inference

    seen: list[tuple[object, int, list[onnx.ModelProto]]] = []
    real = onnx.shape_inference.infer_shapes

    def recording(model, *args, **kwargs):
        held = [v for v in sys._getframe(1).f_locals.values() if isinstance(v, onnx.ModelProto)]
        seen.append((type(model), len(model) if isinstance(model, bytes) else -1, held))
        return real(model, *args, **kwargs)

    model = conv_bn_relu(16, 16)  # (the helper infers shapes too: before the recording)
    path = _saved(tmp_path, model)
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", recording)
    outcome = api.run(path, tmp_path / "o.onnx", FixOptions(validate="none"))
    assert outcome.ok
    (kind, size, held), = seen
    assert kind is bytes and size < 16 * 16 * 9 * 4  # the conv's weight alone is larger
    # the model being prepared is there, with its weights; no shape-only copy (its stubs are external)
    assert held and all(t.data_location != TensorProto.EXTERNAL for p in held for t in p.graph.initializer)


def test_a_candidate_is_checked_without_its_weights(tmp_path, monkeypatch):
    """The checker reads the candidate's scratch copy (its weights in the data file beside it, not in the model
    file): its copy of the model is kilobytes, not one more model size; the input is checked whole. (16 -> 16
    channels: a 9 KiB weight, which the scratch copy writes to its data file.)"""
    import onnx.checker

    checked: list[object] = []
    real = onnx.checker.check_model

    def recording(model, *args, **kwargs):
        checked.append(("file", os.path.getsize(model)) if isinstance(model, str) else ("bytes", len(model)))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(onnx.checker, "check_model", recording)
    path = _saved(tmp_path, conv_bn_relu(16, 16))
    outcome = api.run(path, tmp_path / "o.onnx", FixOptions())
    assert outcome.ok and [p.name for p in outcome.report.passes if p.changes] == ["fold-batchnorm"]
    assert checked[0] == ("bytes", os.path.getsize(path))
    assert checked[1][0] == "file" and checked[1][1] < 16 * 16 * 9 * 4 < checked[0][1]


def test_a_weight_whose_length_disagrees_with_its_dims_is_still_the_checker_s(tmp_path):
    """A pass that leaves a weight shorter than its dims say: the checker of the scratch copy judges it as the
    checker of the whole model does (the scratch copy keeps such a weight in the model file, where the checker
    reads it): onnx 1.23's names the raw_data size; an older one that does not check lengths lets onnxruntime
    refuse it."""
    from onnx_npu_fix.passes.base import Change, Pass, PassResult
    from onnx_npu_fix.pipeline.scheduler import prepare, run_passes
    from onnx_npu_fix.pipeline.validation.validator import check_structure

    def truncate(model):
        weight = next(t for t in model.graph.initializer if t.name == "w")
        weight.raw_data = weight.raw_data[:-4]

    class Truncate(Pass):
        name = "truncate"
        summary = "drop the last element of w's bytes"
        exact = True

        def run(self, model, options):
            truncate(model)
            return PassResult(changes=[Change("w", "initializer", "truncated")])

    model, options = conv_bn_relu(16, 16), FixOptions()
    prepare(model, options)
    whole = onnx.ModelProto()
    whole.CopyFrom(model)
    truncate(whole)
    complaint = check_structure(whole, whole.SerializeToString())  # the checker on the whole model's bytes
    report = run_passes(model, options, [Truncate()]).report
    assert report.failed_pass.name == "truncate"
    if complaint is not None:
        assert "raw_data size" in complaint
        assert report.failed_pass.error == f"the model fails the onnx checker after this pass: {complaint}"
    else:
        assert report.failed_pass.error.startswith("onnxruntime cannot run the model after this pass")
