"""The pass manager's state machine: scripted pass results -> each record's status, the groups validated
together, and the restore points the run went back to.

Every row runs the real manager (onnxruntime validation included) on a three-node model with passes whose result
is scripted; the restore points are observed where the model is restored (RestorePoint.restore), so a status
set in the wrong place, a group settled wrongly or a restore from the wrong point fails a row.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest
from helpers import as_if_above_two_gb, assert_equivalent, small_model
from onnx import helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import StrictRefused
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.passes.base import Change, Pass, PassResult
from onnx_npu_fix.pipeline import conditions
from onnx_npu_fix.pipeline import scheduler as pipeline
from onnx_npu_fix.pipeline.report import PassStatus
from onnx_npu_fix.pipeline.scheduler import STATUS_OF, Outcome, RestoreKind, RestorePoint, prepare, run_passes

_ADDED = {"ok": 0.0, "wrong": 100.0, "approx": 0.01, "far": 100.0, "sly": 0.01, "vague": 0.01, "none": 0.0}
"""What each scripted pass adds to the graph's output (0: an exact change)."""


class Scripted(Pass):
    """A pass whose result is its script:

    ok      exact, correct (adds 0 to the output)       wrong   declared exact, adds 100: fails the tolerance
    approx  approximate, adds 0.01 (within the bound)   far     approximate, adds 100: fails the bound
    sly     declared exact, reports this run approximate (metrics "exact": False), adds 0.01
    vague   declared exact, reports one change approximate (detail "exact": False), adds 0.01
    noop    changes nothing                             crash   raises
    shapes  makes the MatMul's shapes incompatible: strict shape inference fails after it
    none    adds 0 and returns None instead of a PassResult
    rename  renames the graph output (an exact change otherwise)
    lies    declares keeps_shapes and records another shape for the MatMul's output (nothing else changes)
    """

    summary = "scripted test pass"

    def __init__(self, script: str, index: int) -> None:
        self.script = script
        self.name = f"{script}{index}"
        self.exact = script not in ("approx", "far")
        self.keeps_shapes = script == "lies"

    def run(self, model, options):
        if self.script == "noop":
            return PassResult()
        if self.script == "rename":
            out = model.graph.output[0]
            GraphIndex(model).producer[out.name].output[0] = out.name = "renamed"
            return PassResult(changes=[Change("relu", "Relu", "renamed its output")])
        if self.script == "lies":
            recorded = next(vi for vi in model.graph.value_info if vi.name == "y")
            recorded.CopyFrom(helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 5]))
            return PassResult(changes=[Change("mm", "MatMul", "recorded a shape")])
        if self.script == "crash":
            raise RuntimeError("scripted crash")
        if self.script == "shapes":
            for t in model.graph.initializer:
                if t.name == "w":
                    t.CopyFrom(numpy_helper.from_array(np.zeros((5, 4), np.float32), "w"))
            return PassResult(changes=[Change("w", "initializer", "reshaped")])
        index = GraphIndex(model)
        out = model.graph.output[0].name
        producer = index.producer[out]
        before = index.unique_name(f"pre_{self.name}")
        producer.output[0] = before
        constant = index.unique_name(f"{self.name}_c")
        model.graph.initializer.append(numpy_helper.from_array(np.array(_ADDED[self.script], np.float32), constant))
        model.graph.node.append(helper.make_node("Add", [before, constant], [out], name=self.name))
        result = PassResult(changes=[Change(self.name, "Add", "added",
                                            detail={"exact": False} if self.script == "vague" else {})])
        if self.script == "sly":
            result.metrics["exact"] = False
        return None if self.script == "none" else result


@pytest.fixture
def restores(monkeypatch):
    """The restore points the run went back to, as (kind, pass index) in order."""
    seen: list[tuple[str, int]] = []
    restore = RestorePoint.restore

    def logged(self, model, reload, **kwargs):
        seen.append((self.kind.value, self.index))
        return restore(self, model, reload, **kwargs)

    monkeypatch.setattr(RestorePoint, "restore", logged)
    return seen


V, NV, F, RB, E, U = "validated", "not validated", "failed", "rolled back", "error", "unchanged"

# (scripts, options, expected statuses, expected validated_with per record, expected restores)
TABLE = [
    # grouped validation of exact passes: one session, one group
    ("ok ok", {}, [V, V], [["ok0", "ok1"], ["ok0", "ok1"]], []),
    ("noop ok", {}, [U, V], [[], []], []),
    # a failing group is replayed from its copy, pass by pass; the validated bytes are the next point
    ("ok wrong ok", {}, [V, F], [[], []], [("copy", 0)]),
    ("ok wrong ok", {"keep_going": True}, [V, RB, V], [[], [], []], [("copy", 0), ("bytes", 1)]),
    ("wrong", {}, [F], [[]], []),
    ("ok wrong wrong", {"keep_going": True}, [V, RB, RB], [[], [], []],
     [("copy", 0), ("bytes", 1), ("bytes", 2)]),  # restored from bytes: those bytes are the next point again
    ("wrong ok", {"keep_going": True}, [RB, V], [[], []], [("copy", 0), ("copy", 0)]),
    # a crash: its unvalidated group is not validated when the run stops, replayed with --keep-going
    ("ok crash ok", {}, [NV, E], [[], []], []),
    ("ok crash ok", {"keep_going": True}, [V, RB, V], [[], [], []], [("copy", 0), ("bytes", 1)]),
    ("crash ok ok", {"keep_going": True}, [RB, V, V], [[], ["ok1", "ok2"], ["ok1", "ok2"]], [("copy", 0)]),
    # broken shape inference names the pass, not its group
    ("ok shapes", {}, [NV, F], [[], []], []),
    ("ok shapes ok", {"keep_going": True}, [V, RB, V], [[], [], []], [("copy", 0), ("bytes", 1)]),
    # approximate passes are measured alone; the group before them is validated first
    ("ok approx ok", {}, [V, V, V], [[], [], []], []),
    ("ok ok approx", {}, [V, V, V], [["ok0", "ok1"], ["ok0", "ok1"], []], []),
    ("far", {}, [F], [[]], []),
    ("ok far ok", {"keep_going": True}, [V, RB, V], [[], [], []], [("bytes", 1)]),
    # declared exact, approximate this run: the group is undone, each pass runs alone
    ("ok sly", {}, [V, V], [[], []], [("copy", 0)]),
    ("ok vague", {}, [V, V], [[], []], [("copy", 0)]),
    # a broken contract (no PassResult, graph output renamed, a keeps_shapes claim broken) fails the pass,
    # whatever is validated: nothing downstream has to notice it
    ("ok none", {}, [NV, F], [[], []], []),
    ("ok none ok", {"keep_going": True}, [V, RB, V], [[], [], []], [("copy", 0), ("bytes", 1)]),
    ("ok rename", {"validate": "none"}, [NV, F], [[], []], []),
    ("ok rename ok", {"keep_going": True}, [V, RB, V], [[], [], []], [("copy", 0), ("bytes", 1)]),
    ("ok lies", {"validate": "none"}, [NV, F], [[], []], []),
    ("ok lies ok", {"keep_going": True}, [V, RB, V], [[], [], []], [("copy", 0), ("bytes", 1)]),
    # --validate final / none: nothing validated per pass, nothing replayed; --keep-going still rolls back
    ("ok wrong", {"validate": "final"}, [NV, NV], [[], []], []),
    ("ok crash ok", {"validate": "final"}, [NV, E], [[], []], []),
    ("ok crash ok", {"validate": "final", "keep_going": True}, [NV, RB, NV], [[], [], []], [("copy", 1)]),
    ("ok wrong noop", {"validate": "none"}, [NV, NV, U], [[], [], []], []),
]


@pytest.mark.parametrize(("scripts", "opts", "statuses", "groups", "restored"), TABLE,
                         ids=[f"{row[0]} {row[1]}" for row in TABLE])
def test_scripted_passes_end_in_their_statuses(scripts, opts, statuses, groups, restored, restores):
    options = FixOptions(**opts)
    model = small_model()
    prepare(model, options)
    passes = [Scripted(script, i) for i, script in enumerate(scripts.split())]
    result = run_passes(model, options, passes)
    records = result.report.passes
    assert [r.status for r in records] == statuses
    assert [r.validated_with for r in records] == groups
    assert restores == restored
    for record in records:
        assert isinstance(record.status, PassStatus)
        # only a validated record says it passed; a failed one keeps the comparison that refused it
        assert (record.validation is not None and record.validation.passed) == (record.status == V)
        assert (record.error is not None) == (record.status in (F, RB, E))
    # unvalidated changes are judged by the final comparison (none with --validate none)
    unvalidated_wrong = "wrong" in [p.script for p, r in zip(passes, records) if r.status == NV]
    assert result.ok == (F not in statuses and E not in statuses
                         and (options.validate == "none" or not unvalidated_wrong))
    if result.ok and options.validate != "none":
        assert_equivalent(small_model(), model, rtol=0, atol=0.011)


@pytest.mark.parametrize(("scripts", "statuses", "restored"), [
    # no pass changed the model yet: the input is read again instead of copied
    ("wrong ok", [RB, V], [("re-read", 0), ("re-read", 0)]),
    ("ok wrong", [V, RB], [("re-read", 0), ("bytes", 1)]),
    ("crash ok", [RB, V], [("re-read", 0)]),
])
def test_a_run_that_can_read_its_input_again_restores_by_reading(tmp_path, no_model_copies, restores,
                                                                scripts, statuses, restored):
    path = tmp_path / "m.onnx"
    onnx.save(small_model(), path)
    model = api.load_model(path)
    passes = [Scripted(script, i) for i, script in enumerate(scripts.split())]
    result = api.fix(model, FixOptions(keep_going=True), passes, source=path)
    assert [r.status for r in result.report.passes] == statuses
    assert restores == restored
    assert_equivalent(small_model(), model)


@pytest.mark.parametrize(("opts", "statuses", "restored"), [
    ({}, [V, F], []),  # nothing to go back to: no copy taken
    ({"keep_going": True}, [V, RB, V], [("copy", 1)]),  # a copy per pass (no bytes above 2 GB)
])
def test_above_two_gb_every_pass_is_validated_alone_from_a_copy(monkeypatch, restores, opts, statuses, restored):
    as_if_above_two_gb(monkeypatch)
    options = FixOptions(**opts)
    model = small_model()
    prepare(model, options)
    result = run_passes(model, options, [Scripted(s, i) for i, s in enumerate(["ok", "wrong", "ok"])])
    assert [r.status for r in result.report.passes] == statuses
    assert [r.validated_with for r in result.report.passes] == [[]] * len(statuses)
    assert restores == restored


@pytest.mark.parametrize(("script", "error"), [
    ("none", "the pass returned NoneType, not a PassResult"),
    ("rename", "the pass changed the graph outputs from [out] to [renamed]; a pass must keep the graph's input "
               "and output names"),
    ("lies", "the pass declares keeps_shapes but changed the recorded type of 'y' from float32[3, 4] to "
             "float32[3, 5]"),
])
def test_a_broken_contract_is_a_failed_pass_that_names_it(script, error):
    options = FixOptions(validate="none")
    model = small_model()
    prepare(model, options)
    result = run_passes(model, options, [Scripted(script, 0)])
    failed = result.report.failed_pass
    assert failed is not None and failed.name == f"{script}0" and failed.error == error


def test_strict_refuses_an_approximate_change_after_validating_the_group_before_it(restores):
    options = FixOptions(strict=True)
    model = small_model()
    prepare(model, options)
    with pytest.raises(StrictRefused, match="pass approx1 would change"):
        run_passes(model, options, [Scripted("ok", 0), Scripted("approx", 1)])
    assert restores == []
    # a pass declared exact whose run was approximate is refused too
    model = small_model()
    prepare(model, options)
    with pytest.raises(StrictRefused, match="pass sly0"):
        run_passes(model, options, [Scripted("sly", 0)])
    model = small_model()
    prepare(model, options)
    with pytest.raises(StrictRefused, match=r"pass vague0 would change 1 node\(s\) approximately \(vague0\)"):
        run_passes(model, options, [Scripted("vague", 0)])


def test_every_outcome_has_a_status_and_every_status_an_outcome():
    assert set(STATUS_OF) == set(Outcome)
    assert {s for s in STATUS_OF.values() if s is not None} == set(PassStatus)
    # the build record's strings (report_version 1): a status is its string, in JSON and in text
    assert [str(s) for s in PassStatus] == [U, V, NV, F, RB, E]
    assert all(s == str(s) and f"{s}" == s.value for s in PassStatus)


@pytest.mark.parametrize("owned", [False, True])
@pytest.mark.parametrize("kind", [RestoreKind.BYTES, RestoreKind.COPY, RestoreKind.REREAD, RestoreKind.FILE])
def test_a_restore_point_gives_back_the_model_it_was_taken_at(kind, owned, tmp_path):
    at = small_model()
    (tmp_path / "kept.onnx").write_bytes(at.SerializeToString())
    held = {RestoreKind.BYTES: at.SerializeToString(), RestoreKind.COPY: pipeline.copy_model(at),
            RestoreKind.FILE: (tmp_path / "kept.onnx").read_bytes}.get(kind)
    point = RestorePoint(kind, 2, 1, held)
    changed = small_model()
    changed.graph.node[2].op_type = "Sigmoid"
    restored = point.restore(changed, small_model, owned=owned)
    assert restored == at
    # in place for a caller's model; a new proto for a run that owns it, so that the old one's memory goes
    assert (restored is changed) != owned
    assert point.data == (at.SerializeToString() if kind in (RestoreKind.BYTES, RestoreKind.FILE) else None)


def test_an_owned_run_goes_on_from_a_fresh_proto_after_each_validated_group_and_holds_no_older_one(monkeypatch):
    """protobuf never gives back a replaced weight's bytes while the proto lives: a run handed its model
    (OwnedModel, as api.fix and api.run do) continues after each validated group from a proto parsed from the
    bytes it validated, and holds on to none of the earlier ones."""
    parsed: list[int] = []
    real = pipeline.parse_model
    monkeypatch.setattr(pipeline, "parse_model", lambda data: parsed.append(len(data)) or real(data))
    options = FixOptions()
    model = small_model()
    prepare(model, options)
    passes = [Scripted(script, i) for i, script in enumerate(["ok", "ok", "approx", "ok"])]
    handed = pipeline.OwnedModel(model)
    refs = sys.getrefcount(model)
    result = run_passes(handed, options, passes)
    assert [r.status for r in result.report.passes] == [V, V, V, V]
    assert len(parsed) == 3  # one fresh proto per validated group: ok0+ok1, approx2, ok3
    assert result.model is not model and result.serialized == result.model.SerializeToString()
    assert sys.getrefcount(model) == refs - 1  # only the holder let go: the run kept nothing of it
    assert handed.model is None
    assert_equivalent(small_model(), result.model, rtol=0, atol=0.011)

    # a caller's own proto (not handed over) is edited in place, as before
    model = small_model()
    prepare(model, options)
    result = run_passes(model, options, [Scripted("ok", 0), Scripted("approx", 1)])
    assert result.model is model and result.ok


def test_a_large_validated_model_waits_as_the_next_restore_point_on_disk_not_in_memory(monkeypatch, restores):
    """Above KEEP_ON_DISK the bytes a validation accepted are kept in the run's scratch directory (read back only
    for a replay or a rollback), not next to the next candidate's bytes and session; removed with it."""
    monkeypatch.setattr(pipeline, "KEEP_ON_DISK", 0)
    kept: list[str] = []
    real = pipeline.Validator.keep

    def spy(self, data, scratch=None):
        kept.append(real(self, data, scratch))
        assert [os.path.exists(path) for path in kept] == [False] * (len(kept) - 1) + [True]  # one at a time
        return kept[-1]

    monkeypatch.setattr(pipeline.Validator, "keep", spy)
    options = FixOptions(keep_going=True)
    model = small_model()
    prepare(model, options)
    scripts = ["ok", "approx", "far", "far", "ok"]
    result = run_passes(pipeline.OwnedModel(model), options, [Scripted(s, i) for i, s in enumerate(scripts)])
    assert [r.status for r in result.report.passes] == [V, V, RB, RB, V]
    assert restores == [("file", 2), ("file", 3)]  # the bytes validated after approx1, from its file both times
    assert len(kept) == 2 and not any(os.path.exists(path) for path in kept)  # gone with the scratch directory
    assert_equivalent(small_model(), result.model, rtol=0, atol=0.011)


def _with_large_weight(model: onnx.ModelProto, elements: int = 300_000) -> onnx.ModelProto:
    """``model`` whose output also adds 0 x the sum of a 1.2 MB weight: a weight the scratch data file holds."""
    out = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{out}/pre" if o == out else o for o in node.output]
    big = np.random.default_rng(5).standard_normal(elements).astype(np.float32)
    big.flat[0] = 0.5  # not all finite-negligible: the weight's bytes matter to the model
    model.graph.initializer.extend([numpy_helper.from_array(big, "big"),
                                    numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    model.graph.node.extend([helper.make_node("ReduceSum", ["big"], ["big/sum"], name="big/sum", keepdims=0),
                             helper.make_node("Mul", ["big/sum", "zero"], ["big/zero"], name="big/zero"),
                             helper.make_node("Add", [f"{out}/pre", "big/zero"], [out], name="big/add")])
    return model


def test_a_restore_point_leaves_out_the_weights_its_session_s_data_file_holds(monkeypatch, restores):
    """The bytes a validation accepted are kept as the next restore point without the raw weights that the
    candidate's scratch model already placed in the run's data file (a copy of the model per validated group
    otherwise: 0.2-0.4 s CPU for a 110 MB U-Net); read back, they are the bytes validated, byte for byte."""
    kept: list[tuple[str, int, bytes]] = []
    real_keep, real_read = pipeline.Validator.keep, pipeline.Validator.read_kept

    def keep(self, data, scratch=None):
        path = real_keep(self, data, scratch)
        kept.append((path, os.path.getsize(path), bytes(data)))
        return path

    read: list[bool] = []

    def read_kept(self, path):
        data = real_read(self, path)
        read.append(any(path == p and data == d for p, _, d in kept))
        return data

    monkeypatch.setattr(pipeline.Validator, "keep", keep)
    monkeypatch.setattr(pipeline.Validator, "read_kept", read_kept)
    options = FixOptions(keep_going=True)
    model = _with_large_weight(small_model())
    prepare(model, options)
    original = pipeline.copy_model(model)
    scripts = ["ok", "approx", "far", "ok"]
    result = run_passes(pipeline.OwnedModel(model), options, [Scripted(s, i) for i, s in enumerate(scripts)])
    assert [r.status for r in result.report.passes] == [V, V, RB, V]
    assert restores == [("file", 2)] and read == [True]
    assert kept and all(size < 100_000 < len(data) for _, size, data in kept)  # 1.2 MB of bytes, kB on disk
    assert_equivalent(original, result.model, rtol=0, atol=0.011)


def test_kept_bytes_come_back_whole_from_their_scratch_model_or_without_one(tmp_path, monkeypatch):
    from onnx_npu_fix.io.external import MappedWeights

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    model = _with_large_weight(small_model())
    model.graph.initializer[0].doc_string = "a field beside raw_data"  # kept as written, not rebuilt
    data = model.SerializeToString()
    store = MappedWeights()
    try:
        scratch = store.write_bytes(data)
        slim = store.keep(data, scratch)
        assert os.path.getsize(slim) < len(data) - 1_000_000 and store.read_kept(slim) == data
        other = bytes(bytearray(data))  # equal bytes, another object: nothing says where its weights are
        whole = store.keep(other, scratch)
        assert os.path.getsize(whole) == len(data) and store.read_kept(whole) == data
        assert not os.path.exists(slim)  # one restore point at a time
    finally:
        store.close()


def test_the_file_system_refusing_the_restore_point_keeps_it_in_memory(monkeypatch, restores):
    from onnx_npu_fix.io.external import MappedWeights

    monkeypatch.setattr(pipeline, "KEEP_ON_DISK", 0)

    def full(self, data, scratch=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MappedWeights, "keep", full)
    options = FixOptions(keep_going=True)
    model = small_model()
    prepare(model, options)
    result = run_passes(model, options, [Scripted("ok", 0), Scripted("far", 1), Scripted("ok", 2)])
    assert [r.status for r in result.report.passes] == [V, RB, V]
    assert restores == [("bytes", 1)]


class _KeepsNothing(Pass):
    """Declares keeps_shapes and changes nothing."""

    summary = "a keeps_shapes pass that changes nothing"
    keeps_shapes = True

    def __init__(self, index: int) -> None:
        self.name = f"keeps{index}"

    def run(self, model, options):
        return PassResult()


@pytest.mark.parametrize(("passes", "snapshots"), [
    (lambda: [_KeepsNothing(0), _KeepsNothing(1), Scripted("lies", 2)], 2),
    (lambda: [Scripted("ok", 0), _KeepsNothing(1), Scripted("noop", 2), Scripted("lies", 3)], 2),
])
def test_the_recorded_types_are_copied_once_across_passes_that_change_nothing(passes, snapshots, monkeypatch):
    """The manager's copy of every tensor's recorded type (for a keeps_shapes claim) is taken again only after a
    pass changed the model (a copy of a 100k-node model is not free), and the claim is still checked against the
    model as it was just before the lying pass."""
    taken: list[int] = []
    real = conditions.recorded_snapshot

    def counting(graph):
        taken.append(1)
        return real(graph)

    monkeypatch.setattr(conditions, "recorded_snapshot", counting)
    options = FixOptions(validate="none")
    model = small_model()
    prepare(model, options)
    chosen = passes()
    result = run_passes(model, options, chosen)
    failed = result.report.failed_pass
    assert failed is not None and failed.name == chosen[-1].name
    assert failed.error.startswith("the pass declares keeps_shapes but changed the recorded type of 'y'")
    assert len(taken) == snapshots  # before the first keeps_shapes pass after a change, and after the liar
