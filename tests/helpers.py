"""Test helpers shared by the per-pass test modules."""

from __future__ import annotations

import hashlib
import importlib
import os
import pkgutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.io.load import prepare
from onnx_npu_fix.ir.graph import copy_model, infer_shapes
from onnx_npu_fix.passes.base import Pass, PassResult
from onnx_npu_fix.pipeline.inputs import make_inputs
from onnx_npu_fix.pipeline.validation.comparison import compare
from onnx_npu_fix.pipeline.validation.session import Runner


def apply_pass(model: onnx.ModelProto, pass_: Pass, **options) -> tuple[onnx.ModelProto, PassResult]:
    """Run one pass on a copy of ``model`` the way the pass manager does (named nodes, fresh shapes),
    then check the result with the onnx checker and strict shape inference."""
    work = prepared(model)
    result = pass_.run(work, FixOptions(**options))
    onnx.checker.check_model(work)
    infer_shapes(work)
    return work, result


def prepared(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy named and shape-inferred, as the pass manager hands models to a pass (io.load.prepare)."""
    work = copy_model(model)
    prepare(work)
    return work


def as_if_above_two_gb(monkeypatch) -> None:
    """Every model counts as "above 2 GB": to the scheduler and to every validation module that asks (no bytes,
    the original's outputs computed at once)."""
    from onnx_npu_fix.pipeline import scheduler, validation

    names = [f"{validation.__name__}.{found.name}" for found in pkgutil.iter_modules(validation.__path__)]
    for module in [scheduler, *map(importlib.import_module, names)]:
        if hasattr(module, "TWO_GB"):
            monkeypatch.setattr(module, "TWO_GB", 16)


def run_model(model: onnx.ModelProto, feeds):
    runner = Runner(model)
    try:
        return runner.run_all(feeds)
    finally:
        runner.close()  # a model counted as above 2 GB is run from a scratch directory the close removes


def assert_equivalent(original: onnx.ModelProto, fixed: onnx.ModelProto, *, seeds: Iterable[int] = (0, 1, 2),
                      exact: bool = True, rtol: float = 1e-4, atol: float = 1e-5,
                      max_approx_error: float = 0.5, feeds=None):
    """Outputs of ``fixed`` match ``original`` under onnxruntime on seeded random inputs; returns the comparison."""
    if feeds is None:
        feeds = [f for s in seeds for f in make_inputs(original, 1, s)]
    ref = run_model(original, feeds)
    got = run_model(fixed, feeds)
    cmp = compare(ref, got, exact=exact, rtol=rtol, atol=atol, max_approx_error=max_approx_error)
    assert cmp.passed, cmp.to_json()
    return cmp


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def small_model() -> onnx.ModelProto:
    """x [3, 2] -> MatMul(w) -> Identity -> Relu -> out [3, 4]: the pass manager tests' model."""
    w = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(2, 4) / 8, "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        helper.make_node("Identity", ["y"], ["y_id"], name="id"),
        helper.make_node("Relu", ["y_id"], ["out"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 2])],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [3, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def conv_bn_relu(channels_in: int = 3, channels_out: int = 8, size: int = 16) -> onnx.ModelProto:
    """Conv 3x3 (``channels_in`` -> ``channels_out``) -> BatchNormalization -> Relu on [1, channels_in, size,
    size], every tensor's shape in value_info."""
    gen = np.random.default_rng(0)
    inits = [numpy_helper.from_array(gen.standard_normal((channels_out, channels_in, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(gen.uniform(0.5, 1.5, channels_out).astype(np.float32), "gamma"),
             numpy_helper.from_array(gen.standard_normal(channels_out).astype(np.float32), "beta"),
             numpy_helper.from_array(gen.standard_normal(channels_out).astype(np.float32), "mean"),
             numpy_helper.from_array(gen.uniform(0.5, 1.5, channels_out).astype(np.float32), "var")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["y", "gamma", "beta", "mean", "var"], ["yb"]),
         helper.make_node("Relu", ["yb"], ["z"])], "conv_bn",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, channels_in, size, size])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, channels_out, size, size])], inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def quantize_with_onnxruntime(model: onnx.ModelProto, directory, *, sets: int = 4, seed: int = 7,
                              activation: str = "QUInt8", weight: str = "QInt8",
                              per_channel: bool = False) -> onnx.ModelProto:
    """``model`` quantized by onnxruntime's own quantizer (QDQ, ``weight`` weights — per output channel with
    ``per_channel`` —, ``activation`` activations), calibrated on ``sets`` seeded input sets; the float and
    quantized files are kept in ``directory`` as ``float.onnx`` and ``qdq.onnx``."""
    from onnxruntime import quantization

    src, dst = directory / "float.onnx", directory / "qdq.onnx"
    onnx.save(model, src)

    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self._sets = iter(make_inputs(model, sets, seed))

        def get_next(self):  # noqa: ANN201 - the quantizer's interface
            return next(self._sets, None)

    quantization.quantize_static(str(src), str(dst), Reader(), quant_format=quantization.QuantFormat.QDQ,
                                 per_channel=per_channel, activation_type=getattr(quantization.QuantType, activation),
                                 weight_type=getattr(quantization.QuantType, weight))
    return onnx.load(dst)


def break_cleanup(monkeypatch) -> None:
    """Make the cleanup pass change the model's first weight (a wrong pass that validation must catch)."""
    from onnx_npu_fix.passes.cleanup import CleanupPass

    original_run = CleanupPass.run

    def broken(self, model, options):
        result = original_run(self, model, options)
        weight = model.graph.initializer[0]
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) + 1, weight.name))
        return result

    monkeypatch.setattr(CleanupPass, "run", broken)


# --- lowering rules (passes/lowering/): each rule's test runs them through the whole pipeline --------------------


def op_model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    """A model of ``nodes``; ``inputs`` / ``outputs`` as (name, shape) float tensors (shape None: unknown)."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s)
                                           for n, s in inputs],
                              [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in outputs],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def between_convs(make_op, channels: int = 8, size: int = 16, opset: int = 17,
                  extra_inits=()) -> onnx.ModelProto:
    """x -> Conv 3x3 -> ``make_op(input, output)`` -> Conv 1x1 -> y: the op between two convs, where a quantizer
    puts it between a DequantizeLinear and a QuantizeLinear."""
    gen = np.random.default_rng(3)
    inits = [numpy_helper.from_array(gen.standard_normal((channels, channels, 3, 3)).astype(np.float32) / 3, "w1"),
             numpy_helper.from_array(gen.standard_normal((channels, channels, 1, 1)).astype(np.float32), "w2"),
             *extra_inits]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             *make_op("a", "b"),
             helper.make_node("Conv", ["b", "w2"], ["y"], name="conv2")]
    return op_model(nodes, [("x", [1, channels, size, size])], [("y", None)], inits, opset)


def assert_lowered(model: onnx.ModelProto, forbidden: Sequence[str], *, exact: bool = True,
                   bitwise: bool = False, **options):
    """Fix ``model`` with ``forbidden_ops`` (the whole pipeline, validated by onnxruntime): lower-ops rewrites
    every forbidden op away, its record says validated (exact) or measured, and independently of the pipeline the
    outputs match the original's on seeded inputs (bit for bit with ``bitwise``). Returns the FixResult."""
    from onnx_npu_fix.api import fix

    result = fix(model, FixOptions(forbidden_ops=tuple(forbidden), align=0, **options))
    assert result.ok, result.report.to_json()
    record = next(r for r in result.report.passes if r.name == "lower-ops")
    assert record.changes and record.status == "validated", record.to_json()
    assert record.exact is exact, record.to_json()
    assert not set(ops(result.model)) & set(forbidden), ops(result.model)
    onnx.checker.check_model(result.model, full_check=True)
    feeds = [f for s in (0, 1, 2) for f in make_inputs(model, 1, s)]
    if bitwise:
        for ref, got in zip(run_model(model, feeds), run_model(result.model, feeds)):
            for name in ref:
                assert np.array_equal(ref[name], got[name], equal_nan=True), name
    assert_equivalent(model, result.model, feeds=feeds, exact=exact)
    return result


def assert_lowered_quantized(model: onnx.ModelProto, forbidden: Sequence[str], directory, *, steps: float = 1.0,
                             **options):
    """``model`` quantized by onnxruntime's own quantizer, then fixed with ``forbidden_ops``: the lowered ops stand
    between the DequantizeLinear and the QuantizeLinear the op stood between (no Q / DQ added or removed), and the
    quantized output is within ``steps`` quantization steps of the quantized original's."""
    from onnx_npu_fix.api import fix

    qdq = quantize_with_onnxruntime(model, directory)
    assert set(forbidden) & set(ops(qdq)), "the quantized model lost the op under test"
    result = fix(qdq, FixOptions(forbidden_ops=tuple(forbidden), align=0, **options))
    assert result.ok, result.report.to_json()
    assert not set(ops(result.model)) & set(forbidden)
    for q in ("QuantizeLinear", "DequantizeLinear"):
        assert ops(result.model).count(q) == ops(qdq).count(q)
    output = result.model.graph.output[0].name
    producer = next(n for n in result.model.graph.node if output in n.output)
    assert producer.op_type == "DequantizeLinear"
    scale = float(numpy_helper.to_array(next(t for t in result.model.graph.initializer
                                             if t.name == producer.input[1])).max())
    feeds = [f for s in (0, 1, 2) for f in make_inputs(model, 1, s)]
    for ref, got in zip(run_model(qdq, feeds), run_model(result.model, feeds)):
        assert np.abs(ref[output] - got[output]).max() <= steps * scale * (1 + 1e-6)
    return result


def wide_values() -> np.ndarray:
    """float32 inputs over the range an activation meets: a dense grid of [-40, 40], magnitudes up to 1e4, and
    the zeros."""
    return np.concatenate([np.linspace(-40, 40, 16001), [-1e4, -100, 100, 1e4, 0.0, -0.0]]).astype(np.float32)


def lowered_error(make_op, forbidden: Sequence[str], values: np.ndarray | None = None, opset: int = 17,
                  absolute: bool = False, **options) -> float:
    """The largest difference, under onnxruntime, between ``x -> make_op(x, y) -> y`` and its fix with
    ``forbidden_ops`` (the whole pipeline, which must lower every forbidden op), on ``values`` (:func:`wide_values`
    by default) as the input's elements: absolute where the output is within [-1, 1], relative beyond (an
    activation that grows like x is as exact as its float rounding at every magnitude; ``absolute``: absolute
    everywhere, as an approximation's bound is stated). Infinite outputs must be the same."""
    from onnx_npu_fix.api import fix

    values = wide_values() if values is None else values
    model = op_model(make_op("x", "y"), [("x", list(values.shape))], [("y", list(values.shape))], opset=opset)
    result = fix(model, FixOptions(forbidden_ops=tuple(forbidden), align=0, **options))
    assert result.ok, result.report.to_json()
    assert not set(ops(result.model)) & set(forbidden), ops(result.model)
    ref, got = (run_model(m, [{"x": values}])[0]["y"] for m in (model, result.model))
    finite = np.isfinite(ref)
    assert np.array_equal(finite, np.isfinite(got)) and np.array_equal(ref[~finite], got[~finite], equal_nan=True)
    ref, got = ref[finite].astype(np.float64), got[finite].astype(np.float64)
    return float((np.abs(ref - got) / (1.0 if absolute else np.maximum(1.0, np.abs(ref)))).max())


def assert_refused(model: onnx.ModelProto, forbidden: Sequence[str], *reasons: str) -> None:
    """``--check`` with ``forbidden_ops`` names no pass for the forbidden-op violation of ``model`` and says each
    of ``reasons``."""
    from onnx_npu_fix.constraints import find_violations

    options = FixOptions(forbidden_ops=tuple(forbidden), align=0)
    (violation,) = [v for v in find_violations(model, options) if v.constraint == "forbidden-op"]
    assert violation.fixed_by is None, violation.text()
    for reason in reasons:
        assert reason in violation.message, violation.message


def assert_check_names_lower_ops(model: onnx.ModelProto, forbidden: Sequence[str]) -> None:
    """``--check`` with ``forbidden_ops`` finds a forbidden op in ``model`` and names lower-ops as fixing each (the
    forbidden-op findings: an op onnx infers no shape for, GroupNormalization, is an unknown-shape finding too)."""
    from onnx_npu_fix.constraints import find_violations

    violations = [v for v in find_violations(model, FixOptions(forbidden_ops=tuple(forbidden), align=0))
                  if v.constraint == "forbidden-op"]
    assert violations and all(v.fixed_by == "lower-ops" for v in violations), [v.text() for v in violations]


def assert_lowered_export(path: str, forbidden: Sequence[str], input_shapes: dict[str, tuple[int, ...]]):
    """A real export (a fixture the project did not write) fixed with ``forbidden_ops``: every forbidden op is
    lowered away, the run validates, and independently of it the outputs match the original's. Returns the
    FixResult."""
    from onnx_npu_fix.api import fix

    model = onnx.load(path)
    options = FixOptions(forbidden_ops=tuple(forbidden), input_shapes=input_shapes)
    result = fix(model, options)
    assert result.ok, result.report.to_json()
    assert set(forbidden) & set(ops(model)) and not set(forbidden) & set(ops(result.model)), ops(result.model)
    record = next(r for r in result.report.passes if r.name == "lower-ops")
    assert record.changes and record.status == "validated", record.to_json()
    reference = onnx.load(path)
    prepare(reference, input_shapes)
    assert_equivalent(reference, result.model)
    return result


def signal_when(proc: subprocess.Popen, ready: Callable[[], bool], signum: str,
                meanwhile: Callable[[], None] = lambda: None) -> bytes:
    """Wait (at most two minutes) until ``ready()``, check ``meanwhile()``, send ``proc`` the signal named
    ``signum``, and return its stderr once it ended; ``proc`` is killed if anything fails on the way."""
    try:
        for _ in range(1200):
            if ready() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ready(), proc.stderr.read()
        meanwhile()
        proc.send_signal(getattr(signal, signum))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return err


def save_external(model: onnx.ModelProto, directory, name: str = "m.onnx") -> str:
    """``model`` saved as ``name`` in ``directory`` (made if missing) with its weights of 256 bytes or more in one
    data file beside it, by onnx's own writer (``model`` itself not changed); returns the model file's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save's conversion to external data edits the model it is given
    onnx.save(copy, path, save_as_external_data=True, all_tensors_to_one_file=True, location=name + ".data",
              size_threshold=256)
    return path


def file_state(directory) -> dict[str, tuple[str, int]]:
    """Every file of ``directory``: its SHA-256 and modification time."""
    found = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            found[name] = (hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns)
    return found
