"""npufix's own work at scale (issue 23): what a run does once, or not at all, on a model that needs it once or
not at all. Each test counts calls of the expensive step (the figures are in bench/results.md)."""

from __future__ import annotations

import onnx
import pytest
from helpers import conv_bn_relu

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions


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
