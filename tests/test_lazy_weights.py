"""Weights left in the input's external data file (ir.weights): read lazily, a run's output and every byte it
serializes are those of the model read with its weights loaded, the bytes never leave the process by accident,
and a data file that changes under the run stops it."""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import assert_equivalent, file_state, save_external
from onnx import helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import InputChanged
from onnx_npu_fix.io.external import MappedWeights, SpillFile
from onnx_npu_fix.io.load import read_model
from onnx_npu_fix.io.serialize import model_bytes, serialize_model
from onnx_npu_fix.ir import weights
from onnx_npu_fix.ir.graph import GraphIndex, overwrite_tensor, tensor_from_array
from onnx_npu_fix.pipeline.validation.validator import Validator


def _conv_bn_model(channels: int = 48, seed: int = 3) -> onnx.ModelProto:
    """Conv 3x3 (a weight above LAZY_MIN_BYTES) -> BatchNormalization -> Relu -> Conv 1x1 (a smaller one)."""
    rng = np.random.default_rng(seed)
    big = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.1
    small = rng.standard_normal((8, channels, 1, 1)).astype(np.float32) * 0.1
    assert big.nbytes >= weights.LAZY_MIN_BYTES > small.nbytes
    inits = [numpy_helper.from_array(big, "w_big"), numpy_helper.from_array(small, "w_small")]
    for name, value in (("scale", rng.uniform(0.5, 1.5, channels)), ("shift", rng.uniform(-0.2, 0.2, channels)),
                        ("mean", rng.uniform(-0.1, 0.1, channels)), ("var", rng.uniform(0.5, 1.0, channels))):
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
    inits[0].doc_string = "the 3x3 kernel"  # a field after raw_data: serialized in its place
    nodes = [helper.make_node("Conv", ["x", "w_big"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w_small"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                           [1, channels, 12, 12])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 12, 12])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(params=["conv_bn", "torch_unet"])
def external_model(request, tmp_path, fixture_path) -> str:
    model = _conv_bn_model() if request.param == "conv_bn" else onnx.load(fixture_path("torch_unet.onnx"))
    return save_external(model, tmp_path / "in")


def test_large_weights_stay_in_the_file_and_read_as_stored(external_model):
    eager = read_model(external_model).model
    lazy = read_model(external_model, lazy_weights=True).model
    left = [t for t in lazy.graph.initializer if weights.is_lazy(t)]
    assert left, "no weight was left in the data file"
    assert all(weights.needed_bytes(t) >= weights.LAZY_MIN_BYTES for t in left)
    assert not any(weights.is_lazy(t) for t in eager.graph.initializer)
    # the proto holds references, not the bytes: smaller by at least the weights left out
    assert lazy.ByteSize() <= eager.ByteSize() - sum(weights.needed_bytes(t) for t in left) + 200 * len(left)
    index = GraphIndex(lazy)
    for tensor in eager.graph.initializer:
        np.testing.assert_array_equal(index.const_value(tensor.name), numpy_helper.to_array(tensor), tensor.name)


def test_serialized_lazily_read_model_is_the_eagerly_read_one_byte_for_byte(external_model):
    eager = read_model(external_model).model
    lazy = read_model(external_model, lazy_weights=True).model
    assert serialize_model(lazy) == eager.SerializeToString()
    assert model_bytes(lazy) == eager.SerializeToString()


def test_a_lazy_reference_cannot_leave_the_process_unnoticed(external_model):
    """protobuf's own serialization keeps the absolute location, which the checker and onnxruntime refuse."""
    lazy = read_model(external_model, lazy_weights=True).model
    with pytest.raises(Exception, match="absolute path"):
        onnx.checker.check_model(lazy.SerializeToString())


def _lazy_run_is_eager_run(path: str, options: FixOptions, tmp_path, monkeypatch) -> None:
    """``path`` fixed with its weights left in the data file, then read eagerly (as a run with a judge reads
    it): the same exit, records (but timings) and files written, byte for byte."""
    for name in ("lazy", "eager"):
        (tmp_path / name).mkdir()
    lazy = api.run(path, tmp_path / "lazy" / "out.onnx", options)
    monkeypatch.setattr(api, "_weights_may_stay_on_disk", lambda job, chosen: False)
    eager = api.run(path, tmp_path / "eager" / "out.onnx", options)
    assert lazy.exit_code == eager.exit_code == 0, (lazy.error, eager.error)
    assert _records(lazy) == _records(eager)
    written = sorted(os.listdir(tmp_path / "eager"))
    assert sorted(os.listdir(tmp_path / "lazy")) == written and "out.onnx.data" in written
    for name in written:
        assert (tmp_path / "lazy" / name).read_bytes() == (tmp_path / "eager" / name).read_bytes(), name


def _records(outcome: api.RunOutcome) -> list[dict]:
    """The run's pass records without their timings."""
    return [{k: v for k, v in dataclasses.asdict(record).items() if k not in ("seconds", "validate_seconds")}
            for record in outcome.result.report.passes]


@pytest.mark.parametrize("validate", ["each", "final", "none"])
def test_run_writes_what_an_eager_run_writes(tmp_path, monkeypatch, validate):
    path = save_external(_conv_bn_model(), tmp_path / "in")
    before = file_state(tmp_path / "in")
    _lazy_run_is_eager_run(path, FixOptions(max_dilation=4, align=8, validate=validate), tmp_path, monkeypatch)
    assert file_state(tmp_path / "in") == before
    onnx.checker.check_model(str(tmp_path / "lazy" / "out.onnx"))


def test_final_validation_runs_the_copy_the_checker_read(tmp_path, monkeypatch):
    """--validate final on a model whose weights stay in the input's data file: the fixed model is written to
    the scratch directory once, for the checker, and the final session runs that copy (each copy of a large
    model's weights costs their size in writes); the verdict is a real comparison with the original."""
    written: list[list[str]] = []
    write = MappedWeights.write

    def counted(self, model):
        written.append([n.op_type for n in model.graph.node])
        return write(self, model)

    monkeypatch.setattr(MappedWeights, "write", counted)
    path = save_external(_conv_bn_model(), tmp_path / "in")
    outcome = api.run(path, tmp_path / "out.onnx", FixOptions(validate="final"))
    assert outcome.exit_code == 0, outcome.error
    fixed = [ops for ops in written if "BatchNormalization" not in ops]
    assert fixed == [["Conv", "Relu", "Conv"]], written
    final = outcome.result.report.final
    assert final is not None and final.passed and final.outputs, final
    assert_equivalent(onnx.load(path), onnx.load(str(tmp_path / "out.onnx")))


@pytest.mark.parametrize("copy_file_range", ["refuses", "copies nothing"])
def test_copy_through_a_buffer_where_the_system_does_not_copy_file_to_file(tmp_path, monkeypatch, copy_file_range):
    path = save_external(_conv_bn_model(), tmp_path / "in")
    options = FixOptions(validate="none")
    passes = api.select_passes(skip=["fold-batchnorm"])  # the large weight stays in the file
    for name in ("direct", "buffered"):
        (tmp_path / name).mkdir()
    direct = api.run(path, tmp_path / "direct" / "out.onnx", options, passes=passes)

    def refuse(*args, **kwargs):
        if copy_file_range == "refuses":
            raise OSError(18, "Invalid cross-device link")
        return 0

    monkeypatch.setattr(os, "copy_file_range", refuse)
    buffered = api.run(path, tmp_path / "buffered" / "out.onnx", options, passes=passes)
    assert direct.exit_code == buffered.exit_code  # 1: the BatchNormalization left is reported; both written
    data = (tmp_path / "direct" / "out.onnx.data").read_bytes()
    assert data == (tmp_path / "buffered" / "out.onnx.data").read_bytes()
    expected = numpy_helper.to_array(_conv_bn_model().graph.initializer[0]).tobytes()
    assert expected in data


@pytest.mark.parametrize("change", ["rewritten", "truncated"])
def test_a_data_file_changed_under_the_run_stops_it(tmp_path, change):
    path = save_external(_conv_bn_model(), tmp_path / "in")
    lazy = read_model(path, lazy_weights=True).model
    tensor = next(t for t in lazy.graph.initializer if weights.is_lazy(t))
    data_file = path + ".data"
    content = open(data_file, "rb").read()
    with open(data_file, "wb") as f:
        f.write(content if change == "rewritten" else content[: len(content) // 2])
    st = os.stat(data_file)
    os.utime(data_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(InputChanged, match="changed while npufix ran"):
        weights.lazy_bytes(tensor)
    with pytest.raises(InputChanged):
        serialize_model(lazy)


@pytest.mark.parametrize("fixture,shapes", [
    ("tcn.onnx", {}), ("unet.onnx", {}), ("lraspp.onnx", {}), ("dilated2d.onnx", {}), ("torch_unet.onnx", {}),
    ("torchaudio_convtasnet.onnx", {"mix": [1, 1, 4096]}),
])
def test_every_weight_read_lazily_gives_the_eager_output(tmp_path, monkeypatch, fixture_path, fixture, shapes):
    """With every external tensor of 1 KiB or more left in the file, every pass's reads and the writers go
    through ir.weights: the output is still the eagerly read model's, byte for byte."""
    path = save_external(onnx.load(fixture_path(fixture)), tmp_path / "in")
    monkeypatch.setattr(weights, "LAZY_MIN_BYTES", 1024)
    _lazy_run_is_eager_run(path, FixOptions(max_dilation=4, align=8, input_shapes=shapes), tmp_path, monkeypatch)


def test_weights_the_passes_compute_stay_out_of_memory_too(tmp_path, monkeypatch):
    """fold-batchnorm's new 3x3 kernel goes to the run's spill file: the model the output is written from holds
    no large weight, and the spill directory is gone once the run ends."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    path = save_external(_conv_bn_model(), tmp_path / "in")
    staged = []
    real_stage = api._stage_output
    monkeypatch.setattr(api, "_stage_output", lambda job, outcome, early: (
        staged.append([(len(t.raw_data), weights.lazy_span(t)[0] if weights.is_lazy(t) else None)
                       for t in outcome.result.model.graph.initializer]),
        real_stage(job, outcome, early)))
    outcome = api.run(path, tmp_path / "out.onnx", FixOptions(max_dilation=4, align=8))
    assert outcome.exit_code == 0, outcome.error
    (held,) = staged
    assert all(size < weights.LAZY_MIN_BYTES for size, _ in held)
    files = [file for _, file in held if file is not None]
    assert len(files) == 1 and files[0].startswith(str(tmp_path / "tmp"))  # the folded kernel, in the spill
    assert os.listdir(tmp_path / "tmp") == []
    fixed = onnx.load(str(tmp_path / "out.onnx"))
    assert_equivalent(_conv_bn_model(), fixed)


def test_spilled_weight_reads_back_as_written(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spill = SpillFile()
    big = np.arange(weights.LAZY_MIN_BYTES // 4 + 3, dtype=np.float32).reshape(-1, 1)
    small = np.ones(4, dtype=np.float32)
    try:
        with weights.spilling(spill):
            made, overwritten = tensor_from_array(big, "made"), tensor_from_array(small, "small")
            overwrite_tensor(overwritten, big[::-1])  # not C-contiguous
        outside = tensor_from_array(big, "outside")
        assert weights.is_lazy(made) and weights.is_lazy(overwritten) and not weights.is_lazy(outside)
        np.testing.assert_array_equal(weights.tensor_value(made), big)
        np.testing.assert_array_equal(weights.tensor_value(overwritten), big[::-1])
        parsed = onnx.ModelProto.FromString(serialize_model(_with_initializers([made]))).graph.initializer[0]
        assert parsed.data_location == onnx.TensorProto.DEFAULT and not parsed.external_data
        np.testing.assert_array_equal(numpy_helper.to_array(parsed), big)
    finally:
        spill.close()
    assert os.listdir(tmp_path) == []


def _with_initializers(tensors: list[onnx.TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph([], "g", [], [], [])
    for tensor in tensors:
        graph.initializer.add().CopyFrom(tensor)
    graph.initializer[0].name = "t"
    return helper.make_model(graph)


def test_an_unvalidated_run_checks_the_model_without_copying_a_weight(tmp_path, monkeypatch):
    """--validate none: the checker reads a model file whose references point at sparse stand-ins of the data
    files (onnx refuses links); it still judges the graph, and no weight is copied for it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    lazy = read_model(save_external(_conv_bn_model(), tmp_path / "in"), lazy_weights=True).model
    validator = Validator(lazy, FixOptions(validate="none"))
    try:
        assert validator.check_on_disk(lazy) == (None, None)
        (scratch,) = os.listdir(tmp_path / "tmp")
        for name in os.listdir(tmp_path / "tmp" / scratch):
            if name.endswith(".data"):
                assert os.stat(tmp_path / "tmp" / scratch / name).st_blocks == 0, name  # sparse: no byte copied
        lazy.graph.node[2].input[0] = "nowhere"
        assert "nowhere" in validator.check_on_disk(lazy)[0]
    finally:
        validator.close()
    assert os.listdir(tmp_path / "tmp") == []


def test_check_reads_the_weights_it_needs_only(external_model):
    """``api.check`` and ``--check`` leave the weights in the file: the same findings as on the model read whole."""
    lazy = api.check(external_model, FixOptions(max_dilation=4, align=8))
    eager = api.check(read_model(external_model).model, FixOptions(max_dilation=4, align=8))
    assert [dataclasses.asdict(v) for v in lazy.violations] == [dataclasses.asdict(v) for v in eager.violations]
    assert lazy.violations  # the fixtures break alignment or keep BatchNormalization: something to compare


def test_a_weight_with_fields_protobuf_does_not_know_is_read_in(tmp_path):
    """Such fields survive only the tensor's own serialization: that weight is read into the model, and the model
    still serializes as the eagerly read one."""
    path = save_external(_conv_bn_model(), tmp_path / "in")
    stored = onnx.load(path, load_external_data=False)
    big = next(t for t in stored.graph.initializer if t.name == "w_big")
    big.MergeFromString(bytes([0xA8, 0x06, 0x01]))  # field 101, a varint: unknown to onnx's TensorProto
    with open(path, "wb") as f:
        f.write(stored.SerializeToString())
    lazy = read_model(path, lazy_weights=True).model
    assert not weights.is_lazy(next(t for t in lazy.graph.initializer if t.name == "w_big"))
    assert serialize_model(lazy) == read_model(path).model.SerializeToString()


def test_frozen_input_reference_is_written_from_the_file_not_serialized(tmp_path, monkeypatch):
    """``--freeze-input`` with ``--input-shape`` (no reference from the file): the original, before freezing, is
    copied to the reference's scratch file weight by weight; serializing it would read every weight in."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    model = _conv_bn_model()
    model.graph.input.append(helper.make_tensor_value_info("gain", onnx.TensorProto.FLOAT, []))
    model.graph.node[-1].output[0] = "head"
    model.graph.node.append(helper.make_node("Mul", ["head", "gain"], ["y"], name="scale_out"))
    path = save_external(model, tmp_path / "in")

    def refused(*args, **kwargs):
        raise AssertionError("the model with weights left on disk was serialized")

    monkeypatch.setattr(api, "model_bytes", refused)
    options = FixOptions(freeze_inputs={"gain": "2"}, input_shapes={"x": [1, 48, 12, 12]})
    outcome = api.run(path, tmp_path / "out.onnx", options)
    assert outcome.exit_code == 0, outcome.error
    assert outcome.result.report.final.passed
    assert os.listdir(tmp_path / "tmp") == []  # the reference's scratch copy went with it
    fixed = onnx.load(str(tmp_path / "out.onnx"))
    assert [i.name for i in fixed.graph.input] == ["x"]
    x = np.random.default_rng(0).standard_normal((1, 48, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "gain": np.array(2, np.float32)})[0]
    got = ort.InferenceSession(str(tmp_path / "out.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
