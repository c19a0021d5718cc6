"""The pass manager: runs passes in order, checks and validates them, rolls back or stops, and times it all.

After every pass, what it promises is checked (pipeline/conditions.py, as onnx_ir's pass infrastructure checks
pre- and post-conditions): it returned a PassResult, kept the graph's input and output names and types, emitted
no op type the target forbids, and, when it declares ``keeps_shapes``, left every surviving tensor's recorded type
and shape as it was; a pass that breaks one fails, named. After every pass that changed the graph: strict shape
inference (fresh shapes for the next pass; it also catches a pass that broke types or shapes), unless the pass
declares ``keeps_shapes`` and left no tensor without a shape.
Then, with ``validate="each"`` (the default):
  1. onnx checker on the new model;
  2. onnxruntime on the run's seeded inputs, every graph output compared with the outputs of the model before;
  3. exact passes must meet rtol/atol, approximate ones their relative-L2 bound (``--max-approx-error``); outputs
     made by a DequantizeLinear are judged in their quantization steps instead (``quant_steps``), and a pass that
     changed a rounding of a quantized model (``PassResult.quantized_tolerance``) is measured like an approximate one.
Consecutive exact passes are validated as one group (one session after the last of them); an approximate pass
is always measured alone; a failing group is replayed pass by pass so the failing pass is named (see _Run).
How a candidate is judged (the inputs, the original's outputs computed once in the background, the outputs of
the last validated model carried forward, the criteria) is validator.Validator's; this module is the scheduler:
order, grouping, replay, rollback, timing, and each pass's Outcome, from which its PassStatus follows.
Finally the output model is compared with the original (reusing the last outputs: no extra session). A failing
pass stops the run (nothing is written) unless ``keep_going`` is set, which restores the model as it was before
that pass and continues with the next one.

The inputs come from onnx_npu_fix.pipeline.inputs (loaded data, or seeded sets, more of them when an approximate change
may be measured). An original onnxruntime cannot run is an InputError, never a silently unvalidated run; with
``strict`` an approximate change is a StrictRefused.
"""

from __future__ import annotations

import functools
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import InputError, StrictRefused, first_line
from onnx_npu_fix.host.heap import release_freed_memory
from onnx_npu_fix.io import load
from onnx_npu_fix.io.serialize import model_bytes, serialized_parts
from onnx_npu_fix.ir.graph import (
    TWO_GB,
    GraphIndex,
    approx_model_bytes,
    copy_model,
    infer_shapes,
    keep_inferred_shapes,
    remove_unused,
    sharing_index,
)
from onnx_npu_fix.ir.qdq import QUANTIZERS
from onnx_npu_fix.ir.weights import has_lazy
from onnx_npu_fix.passes.base import Change, Pass, PassResult
from onnx_npu_fix.pipeline.conditions import AFTER_CLEANUP, AFTER_RUN, Conditions
from onnx_npu_fix.pipeline.inputs import Feeds
from onnx_npu_fix.pipeline.report import EXACT_ALTERNATIVE, FixReport, PassRecord, PassStatus
from onnx_npu_fix.pipeline.validation.comparison import Comparison
from onnx_npu_fix.pipeline.validation.reference import Reference
from onnx_npu_fix.pipeline.validation.runs import segmented
from onnx_npu_fix.pipeline.validation.validator import Validator, check_structure

log = logging.getLogger("onnx_npu_fix")

NOT_VALIDATED = "validation: none (requested): nothing was compared with the original"
"""FixReport.validation_note of a run with validate="none" (the CLI prints it as the summary's last line)."""

FOREIGN_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit)
"""What plugin code may raise that makes it unusable (at import) or a failed pass (in run()). SystemExit is
one: a plugin's ``sys.exit(0)`` would otherwise end the run with exit 0, no output and no message.
KeyboardInterrupt is not: it is how SIGINT reaches the run (exit 130, nothing written), and a plugin that raises
it ends the run the same way, which says no more than it should."""


def failure_text(exc: BaseException) -> str:
    """One line for an exception from plugin code; a SystemExit says it called sys.exit, not just its code."""
    if isinstance(exc, SystemExit):
        return f"it calls sys.exit({exc.code!r})"
    return first_line(exc)


def strict_message(record: PassRecord) -> str:
    """The one-line --strict refusal of an approximate change by ``record``'s pass."""
    nodes = record.approximate_nodes()
    shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
    alternative = EXACT_ALTERNATIVE.get(record.name)
    hint = f"use {alternative}, or drop --strict" if alternative else f"--skip {record.name}, or drop --strict"
    return (f"--strict: pass {record.name} would change {len(nodes) or 'some'} node(s) approximately"
            f"{f' ({shown})' if shown else ''}; nothing written ({hint} to accept it measured)")


@dataclass
class FixResult:
    model: onnx.ModelProto
    report: FixReport
    serialized: bytes | None = None
    """``model`` as checked bytes, when the final check produced them (save_model then writes these)."""
    inputs: list[Feeds] | None = None
    """With ``keep_inputs``: the input sets the run validated with, as the original takes them (frozen inputs
    included); None when it did not validate."""
    _index: GraphIndex | None = field(default=None, repr=False, compare=False)

    def graph_index(self) -> GraphIndex:
        """The one index of ``model`` as the run left it, built on first request: the cost table and the final
        constraint check read it instead of each building its own (a walk over the whole graph). Valid while nobody
        edits ``model``, which nothing does after the run."""
        if self._index is None or self._index.model is not self.model:
            self._index = GraphIndex(self.model)
        return self._index

    @property
    def ok(self) -> bool:
        """True when no pass failed and the output matches the original (constraints are judged by the caller)."""
        final = self.report.final
        return self.report.failed_pass is None and (final is None or final.passed)


class OwnedModel:
    """A model handed over to :func:`run_passes`, which may then replace it by an equal one: the caller keeps no
    other reference to it or to any part of it, and reads the result from FixResult.model (api.fix works on its
    own copy, api.run on the model it read).

    Why: protobuf (upb) keeps every byte a message ever held until the whole message is freed, so a weight a pass
    rewrites leaves its old bytes behind (rewriting every weight once adds about the model's size; neither Clear()
    nor ParseFromString gives it back). A run that owns its model continues from a fresh proto parsed from the
    bytes it serializes anyway (for a validation, or for the checker at the end), and the old one goes with all it
    held."""

    __slots__ = ("model", "index", "weights_on_disk")

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model: onnx.ModelProto | None = model
        self.index: GraphIndex | None = None
        """An index of the model as it is, built already (the input's cost table), handed over with it: the passes'
        finds read it until one changes the model, and the run lets it go then (it holds the proto too)."""
        self.weights_on_disk = has_lazy(model)
        """The model was read with large weights left in the input's data file (ir.weights), and is written with
        external data from the proto: the end of the run checks and runs it from a scratch copy, never from its
        bytes (serializing it would read every weight in)."""

    def take(self) -> onnx.ModelProto:
        """The model, no longer held here."""
        model, self.model = self.model, None
        assert model is not None, "an OwnedModel is handed over once"
        return model

    def take_index(self) -> GraphIndex | None:
        """The index handed over with the model (None if none), no longer held here."""
        index, self.index = self.index, None
        return index


def _proto(model: onnx.ModelProto | OwnedModel) -> onnx.ModelProto:
    if isinstance(model, OwnedModel):
        assert model.model is not None
        return model.model
    return model


def prepare(model: onnx.ModelProto, options: FixOptions) -> None:
    """What :func:`run_passes` needs first: ``model`` prepared in place for ``options`` (:func:`io.load.prepare`,
    strict: an InputError for an unknown ``--input-shape`` name or a model shape inference rejects)."""
    load.prepare(model, options.input_shapes)


def run_passes(model: onnx.ModelProto | OwnedModel, options: FixOptions, passes: Sequence[Pass], *,
               reference: Reference | None = None,
               on_serialized: Callable[[bytes], None] | None = None,
               reload: Callable[[], onnx.ModelProto] | None = None,
               reference_feeds: Feeds | None = None, keep_inputs: bool = False,
               refusal: Callable[[onnx.ModelProto], str | None] | None = None) -> FixResult:
    """Run ``passes`` over ``model`` (edited in place) and return it with the report. An :class:`OwnedModel` is the
    run's from here on: FixResult.model is then the result, not necessarily the proto handed over.

    Call :func:`prepare` first. Never raises for a failing pass: the report says which pass failed and why.
    Raises InputError when validation needs inputs it cannot generate (dynamic input shapes, an integer input
    that sets a shape) or cannot use (``validation_data``), and when onnxruntime cannot run the original (then
    nothing can be validated; only ``validate="none"`` goes on). Raises StrictRefused when ``strict`` is set and
    a pass made an approximate change.
    ``reference``: the original's outputs already under way (api.start_reference), else they are computed from
    ``model`` as it is now, in the background while the passes run.
    ``on_serialized``: called with the bytes of the model after the last pass, before their final validation
    runs (the CLI starts writing them); FixResult.serialized is that object when they are the result.
    ``reload``: returns ``model`` as it is now (read and prepared again); a failure before any change is then
    undone with it instead of a copy kept for the whole run.
    ``reference_feeds``: inputs only ``reference`` takes (``--freeze-input``: the original still has the inputs
    frozen in ``model``), added to every input set it runs.
    ``keep_inputs``: FixResult.inputs holds the validation inputs (``--save-inputs``), also when a pass failed.
    ``refusal``: why the target rejects the model whatever the passes do (a constraint no pass fixes), or None;
    asked once, when a pass first makes an approximate change (in a run that keeps no restore point otherwise:
    before the first pass that can make one and may change the model, a declared-approximate pass or any pass on a
    quantized model). When it gives a reason, no approximate change is kept: a pass whose run was not exact (a
    declared-approximate rewrite, an exact pass's QDQ fold) is undone as a whole and recorded unchanged, with the
    reason as ``metrics["skipped"]``. (A plugin declared exact that is not, on a float model, in a run without
    restore points, has nothing to be undone to: its change stays, reported as approximate.)
    """
    started = time.perf_counter()
    report = FixReport()
    if options.validate == "none":
        report.validation_note = NOT_VALIDATED
    approximate = any(not p.exact and _may_change(p, _proto(model), options) for p in passes)
    validator = Validator(_proto(model), options, reference=reference, approximate=approximate,
                          reference_feeds=reference_feeds)
    try:
        run = _Run(model, options, list(passes), report, validator, on_serialized, reload, refusal)
        data = run.run()
    finally:
        validator.close()
    report.seconds = time.perf_counter() - started
    inputs = [{**feeds, **(reference_feeds or {})} for feeds in validator.feeds] \
        if keep_inputs and validator.feeds else None
    kept = run.index if run.index is not None and run.index.model is run.model else None  # no pass changed it
    return FixResult(model=run.model, report=report, serialized=data, inputs=inputs, _index=kept)


def _may_change(pass_: Pass, model: onnx.ModelProto, options: FixOptions) -> bool:
    """``pass_.may_change``, True when it raises (plugin code): then the pass is measured alone, and its run()
    shows what is wrong with it as a failed pass."""
    try:
        return pass_.may_change(model, options)
    except FOREIGN_FAILURES:
        return True


class Outcome(Enum):
    """What happened to a pass (or to the group validated with it); the run's next step follows from it
    (_Run._next) and the record's status from :data:`STATUS_OF` (_Run._settle, the one place it is set)."""

    UNCHANGED = "unchanged"
    """The pass changed nothing: nothing to validate."""
    PENDING = "pending"
    """It changed the model; its group is validated after a later pass (the record's status is set then)."""
    VALIDATED = "validated"
    """The pass (or its group) passed validation: the model is the new accepted one."""
    NOT_VALIDATED = "not validated"
    """Kept unvalidated (--validate final/none), or the run stopped before its group was validated."""
    FAILED = "failed"
    """It broke shape inference, the checker, onnxruntime or the tolerance: the run stops."""
    ROLLED_BACK = "rolled back"
    """It failed or crashed and the model is restored to before it (--keep-going): the run goes on."""
    ERROR = "error"
    """It crashed: the run stops."""
    REPLAY = "replay"
    """Its group is undone and its records dropped: its passes run again, each validated alone."""
    REFUSED_STRICT = "refused strict"
    """An approximate change under --strict: StrictRefused ends the run (no report is returned)."""


STATUS_OF: dict[Outcome, PassStatus | None] = {
    Outcome.UNCHANGED: PassStatus.UNCHANGED,
    Outcome.PENDING: None,  # settled when its group is
    Outcome.VALIDATED: PassStatus.VALIDATED,
    Outcome.NOT_VALIDATED: PassStatus.NOT_VALIDATED,
    Outcome.FAILED: PassStatus.FAILED,
    Outcome.ROLLED_BACK: PassStatus.ROLLED_BACK,
    Outcome.ERROR: PassStatus.ERROR,
    Outcome.REPLAY: None,  # its records are dropped
    Outcome.REFUSED_STRICT: None,  # the run raises
}
"""The record's status after each outcome (None: left as it is)."""

_STOPS = (Outcome.FAILED, Outcome.ERROR)


class RestoreKind(Enum):
    """What a restore point holds."""

    NONE = "none"
    """Nothing: the run cannot go back (neither grouped validation nor --keep-going needs to)."""
    REREAD = "re-read"
    """The input, read and prepared again (no pass has changed it yet): no copy held for a rare failure."""
    BYTES = "bytes"
    """The bytes the last validation serialized (nothing has changed the model since): free."""
    FILE = "file"
    """Those bytes kept in the run's scratch directory instead of in memory (Validator.keep): a model of
    :data:`KEEP_ON_DISK` bytes or more, whose restore point would otherwise sit next to the next candidate's bytes
    and session."""
    COPY = "copy"
    """A copy of the model proto."""


@dataclass(frozen=True)
class RestorePoint:
    """Where a replay or a rollback takes the run back to: the model before pass ``index`` (the first of its
    group, or the one pass), when the report held ``records`` records."""

    kind: RestoreKind
    index: int = 0
    records: int = 0
    model: bytes | Callable[[], bytes] | onnx.ModelProto | None = None
    """The serialized model (BYTES), what reads it back from the file it is kept in (FILE: Validator.read_kept)
    or its copy (COPY)."""

    @property
    def data(self) -> bytes | None:
        """The model's bytes, when this point holds them (read back for FILE)."""
        if self.kind is RestoreKind.FILE:
            assert callable(self.model)
            return self.model()
        return self.model if isinstance(self.model, bytes) else None

    def restore(self, model: onnx.ModelProto, reload: Callable[[], onnx.ModelProto] | None, *,
                owned: bool = False) -> onnx.ModelProto:
        """The model as it was at this point: ``model`` made so, or with ``owned`` (the run may replace its
        model, OwnedModel) a new proto, so that ``model``'s memory goes (``reload`` reads the input again, for
        REREAD)."""
        if self.kind is RestoreKind.REREAD:
            assert reload is not None
            if owned:
                return reload()
            model.CopyFrom(reload())
        elif self.kind in (RestoreKind.BYTES, RestoreKind.FILE):
            data = self.data
            assert data is not None
            if owned:
                return parse_model(data)
            model.Clear()
            model.ParseFromString(data)
        elif self.kind is RestoreKind.COPY:
            assert isinstance(self.model, onnx.ModelProto)
            if owned:
                return copy_model(self.model)
            model.CopyFrom(self.model)
        return model


def parse_model(data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.ParseFromString(data)
    return model


KEEP_ON_DISK = 1 << 20
"""A validated model of this many serialized bytes or more is kept as the next restore point in the run's scratch
directory (RestoreKind.FILE), not in memory: it would sit there through the next group's passes, serialization,
checker and session (one model size more on the peak), and is read back only for a replay or a
rollback."""


_CHANGED = RestorePoint(RestoreKind.NONE)
"""_Run.here after a change: only a copy can take the run back to the model as it is now."""


@dataclass
class _Pending:
    index: int
    record: PassRecord


class _Run:
    """One run of the pass list: the loop, grouped validation, replay and rollback.

    With ``validate="each"``, consecutive *exact* passes that changed the graph are validated together, with one
    onnxruntime session after the last of them: a composite of exact rewrites is exact when each is, a wrong one
    shows in the composite's outputs, and a session per pass costs as much as the passes themselves on a large
    model. A pass declared approximate is always measured on its own (what precedes it is validated first). When
    a group of several passes fails, the model is restored to where the group started and its passes are run
    again one by one, each validated alone, so the failing pass is still named (and, with ``keep_going``, rolled
    back alone).

    The run's state: ``group`` (the passes changed and not yet validated), ``point`` (the restore point before
    it), ``here`` (the free way back to the model as it is now), ``solo_until`` (a replay's extent). Each step
    returns an :class:`Outcome`; :meth:`_next` turns it into the pass to run next, :meth:`_settle` into statuses.
    """

    def __init__(self, model: onnx.ModelProto | OwnedModel, options: FixOptions, passes: list[Pass],
                 report: FixReport, validator: Validator, on_serialized: Callable[[bytes], None] | None = None,
                 reload: Callable[[], onnx.ModelProto] | None = None,
                 refusal: Callable[[onnx.ModelProto], str | None] | None = None) -> None:
        self.owned = isinstance(model, OwnedModel)
        """The run may replace its model (:meth:`_serialize`, restores): handed over as an OwnedModel."""
        self.weights_on_disk = isinstance(model, OwnedModel) and model.weights_on_disk
        self.model: onnx.ModelProto = model.take() if isinstance(model, OwnedModel) else model
        self.index: GraphIndex | None = model.take_index() if isinstance(model, OwnedModel) else None
        """The index of the model as it is, while no pass changed it since it was built (read by the passes' finds,
        ir.graph.sharing_index); None once one may have (it holds the proto: OwnedModel)."""
        self.options, self.passes = options, passes
        self.refusal = refusal
        self.refused: str | None = None
        """refusal's answer once asked (:meth:`_refused`)."""
        self.quantized: bool | None = None
        """The model has quantizers (:meth:`_may_approximate`), once asked."""
        self.report, self.validator = report, validator
        self.on_serialized = on_serialized
        self.reload = reload
        self.each = options.validate == "each"
        # Above 2 GB a restore point is a second copy of the weights: there, every pass is validated alone, as
        # a replay would need that copy.
        self.grouping = self.each and approx_model_bytes(self.model) < TWO_GB
        self.group: list[_Pending] = []
        self.solo_until = -1
        """Passes up to this index are validated alone (a replay after a failed group)."""
        self.point = RestorePoint(RestoreKind.NONE)
        """The model before the current group (or pass): what a replay or a rollback restores."""
        self.here = RestorePoint(RestoreKind.REREAD) if reload is not None else _CHANGED
        """A restore point at the model as it is now that costs nothing (the input re-read while no pass changed
        it, the bytes of the last validation while nothing changed it since), else NONE."""
        self.announced = 0
        """Records before this index were announced (progress.PassFinished), in order."""
        self.recorded: onnx.GraphProto | None = None
        """A conditions.recorded_snapshot of the model as it is now, kept across passes that change nothing (a
        copy of every tensor's record is not free on a large graph); None once anything may have changed it."""

    def run(self) -> bytes | None:
        i: int | None = 0
        while i is not None:
            at_end = i >= len(self.passes)
            if self.group and (at_end or self._measured_alone(self.passes[i])):
                # Validate the pending group at the end, and before a pass declared approximate that may change
                # something (it is measured alone). Then back to the loop's head: the group is settled.
                i = self._next(self._validate_group(last=at_end), i)
            elif at_end:
                return self._finish()
            else:
                i = self._next(self._step(i), i + 1)
            self._announce()
        return None

    def _announce(self) -> None:
        """progress.PassFinished for every record settled since the last call, in pass order: a record waits for
        the pending group before it (a replay drops only pending records, never announced ones)."""
        pending = {id(p.record) for p in self.group}
        records = self.report.passes
        while self.announced < len(records) and id(records[self.announced]) not in pending:
            progress.emit(progress.PassFinished(records[self.announced]))
            self.announced += 1

    def _measured_alone(self, pass_: Pass) -> bool:
        return not pass_.exact and _may_change(pass_, self.model, self.options)

    def _next(self, outcome: Outcome, otherwise: int) -> int | None:
        """The pass the loop goes on with after ``outcome``: None when the run stops, the group's first pass
        after a replay, else ``otherwise``."""
        if outcome in _STOPS:
            return None
        return self.point.index if outcome is Outcome.REPLAY else otherwise

    def _settle(self, records: Sequence[PassRecord], outcome: Outcome, error: str | None = None) -> Outcome:
        """The one place a record's status is set: from ``outcome`` (STATUS_OF), with ``error`` saying why."""
        status = STATUS_OF[outcome]
        for record in records:
            if status is not None:
                record.status = status
            if error is not None:
                record.error = error
        return outcome

    def _step(self, i: int) -> Outcome:
        """Run pass ``i``, and validate it when it is not grouped with the next."""
        pass_ = self.passes[i]
        if not self.group:
            self._take_point(i)
        record = PassRecord(name=pass_.name, exact=pass_.exact)
        self.report.passes.append(record)
        declared = Conditions(pass_, self.model, self.options, self.recorded)
        recorded = declared.recorded if declared.recorded is not None else self.recorded
        self.recorded = None  # back only if the pass changes nothing
        t0 = time.perf_counter()
        try:
            result, found_with = self._run_pass(pass_)
        except InputError:
            raise
        except FOREIGN_FAILURES as exc:  # a crashing pass is a failed pass, reported, never a traceback
            record.seconds = time.perf_counter() - t0
            self.report.warnings.append(f"pass {pass_.name} crashed:\n{traceback.format_exc()}")
            return self._fail(i, record, Outcome.ERROR, f"{type(exc).__name__}: {failure_text(exc)}")
        record.seconds = time.perf_counter() - t0
        # Kept for the next pass only if this one changed nothing (the proto it holds must go with a replaced one).
        kept = found_with if isinstance(result, PassResult) and not result.changed else None
        del found_with
        if not isinstance(result, PassResult):
            return self._fail(i, record, Outcome.FAILED,
                              f"the pass returned {type(result).__name__}, not a PassResult")
        _take_result(record, result)
        broken = declared.broken(self.model, AFTER_RUN)
        if broken is not None:
            return self._fail(i, record, Outcome.FAILED, broken)
        if not record.exact and result.changed and self.point.kind is not RestoreKind.NONE and self._refused():
            return self._undo_approximate(i, record)
        if self.options.strict and result.changed and not record.exact:
            self._settle([record], Outcome.REFUSED_STRICT)
            raise StrictRefused(strict_message(record))
        if not result.changed:
            self.recorded = recorded
            self.index = kept
            return self._settle([record], Outcome.UNCHANGED)
        self.here = _CHANGED
        self._drop_unused(record)
        t1 = time.perf_counter()
        problem = declared.broken(self.model, AFTER_CLEANUP)
        if problem is None and not (pass_.keeps_shapes and keep_inferred_shapes(self.model.graph)):
            problem = refresh_shapes(self.model)
        record.validate_seconds = time.perf_counter() - t1
        if problem is not None:
            return self._fail(i, record, Outcome.FAILED, problem)
        return self._group_or_validate(i, record)

    def _run_pass(self, pass_: Pass) -> tuple[PassResult, GraphIndex | None]:
        """``pass_.run`` on the model, and the index of the model as the pass found it (None if none). A pass that
        runs as find then rewrite (Pass.run's own) finds with the run's index (:attr:`index`), or shares the one
        it builds: the graph is walked once for the finds of every pass until one changes it. A pass with a run of
        its own (rounds of find and rewrite) reads no shared index: its later finds see what its rewrites did."""
        index, self.index = self.index, None  # the caller keeps it only if the pass changes nothing
        if type(pass_).run is not Pass.run:
            return pass_.run(self.model, self.options), index
        with sharing_index(self.model, index) as shared:
            del index
            found = pass_.find(self.model, self.options)
        return pass_.rewrite(self.model, self.options, found), shared.index

    def _drop_unused(self, record: PassRecord) -> None:
        """What a rewrite left unused (old weights, Constant producers of replaced inputs) is dropped here, once,
        instead of in every pass. (A method of its own: the removed nodes, which keep the proto they came from
        alive, go before the validation that may let that proto go, OwnedModel.)"""
        dead, unused = remove_unused(self.model)
        record.changes.extend(Change(node.name, node.op_type, "removed dead node") for node in dead)
        record.changes.extend(Change(name, "initializer", "removed unused initializer") for name in unused)

    def _group_or_validate(self, i: int, record: PassRecord) -> Outcome:
        """Pass ``i`` changed the model: keep it unvalidated, add it to the pending group, or validate now."""
        if not self.each:
            self.validator.accept(exact=record.exact)
            return self._settle([record], Outcome.NOT_VALIDATED)
        if not record.exact and self.group:
            # Declared exact, but this run's rewrite was approximate: its error must not be measured against
            # exact passes' tolerance, nor theirs hidden under its bound. Undo the group; each runs alone.
            return self._replay(i)
        self.group.append(_Pending(i, record))
        if i <= self.solo_until or not record.exact or not self.grouping:
            return self._validate_group()
        return Outcome.PENDING

    def _refused(self) -> str | None:
        """Why the target rejects the model anyway (``refusal``, asked once), or None."""
        if self.refusal is not None:
            self.refused, self.refusal = self.refusal(self.model), None
        return self.refused

    def _may_approximate(self, i: int) -> bool:
        """Pass ``i`` can make an approximate change: it is declared approximate, or the model is quantized (an
        exact pass's fold can then drop a rounding step). Passes add no quantizer to a float model."""
        if not self.passes[i].exact:
            return True
        if self.quantized is None:
            self.quantized = any(node.op_type in QUANTIZERS for node in self.model.graph.node)
        return self.quantized

    def _skip(self, record: PassRecord) -> Outcome:
        """Record a pass whose approximate change is not made (``refusal``): unchanged, with the reason."""
        record.metrics["skipped"] = f"no approximate change: {self.refused}"
        self.report.passes.append(record)
        return self._settle([record], Outcome.UNCHANGED)

    def _undo_approximate(self, i: int, record: PassRecord) -> Outcome:
        """Pass ``i`` made an approximate change (declared so, or an exact pass's QDQ fold) that the target gains
        nothing from (``refusal``): undo it and record it unchanged, with the reason. With unvalidated exact
        passes before it, their group is replayed (each alone, this one again, then undone by itself)."""
        if self.group:
            return self._replay(i)
        self._restore()  # a restore point exists: _take_point keeps one once refusal has answered
        self.report.passes.remove(record)
        return self._skip(PassRecord(name=record.name, exact=True, seconds=record.seconds))

    def _fail(self, i: int, record: PassRecord, outcome: Outcome, error: str) -> Outcome:
        """Pass ``i`` crashed (ERROR) or its change was refused (FAILED): the run stops (the group before it was
        never validated, and the report says so), unless keep_going restores the model: the pass alone is
        rolled back, or its unvalidated group is replayed pass by pass."""
        if not self.options.keep_going or self.point.kind is RestoreKind.NONE:
            self._settle([p.record for p in self.group], Outcome.NOT_VALIDATED)
            self.group.clear()
            return self._settle([record], outcome, error)
        if self.group:  # the passes before it in its group are not validated yet: run them again, alone
            return self._replay(i)
        self._restore()
        return self._settle([record], Outcome.ROLLED_BACK, error)

    def _finish(self) -> bytes | None:
        report, validator, data = self.report, self.validator, self.here.data
        if report.failed_pass is not None and not self.options.keep_going:
            return None
        validator.require_original()
        problem = scratch = None
        if not self.each and validator.changed:
            # Without per-pass validation the checker still runs once, before anything is written. The model
            # is serialized once: for the checker, the final onnxruntime session and save_model.
            if self._from_proto():
                problem, scratch = validator.check_on_disk(self.model)  # the final session runs that copy
            else:
                data = self._serialize()
                problem = check_structure(self.model, data)
                self._fresh(data)  # after the checker: its copies of the bytes and the proto are not held at once
                if not problem and data is not None and self.on_serialized is not None:
                    self.on_serialized(data)
        if problem:
            report.final = Comparison(error=f"the output fails the onnx checker: {problem}")
        else:
            report.final = validator.final(self.model, data, scratch)
        return data

    # --- restore points ---------------------------------------------------------------------------------
    def _take_point(self, i: int) -> None:
        """Remember the model as it is before pass ``i`` (free when the last validation serialized it)."""
        here = self.here
        if here.kind in (RestoreKind.BYTES, RestoreKind.FILE):
            kind, model = here.kind, here.model
        elif not (self.grouping or self.options.keep_going
                  or (self._may_approximate(i) and _may_change(self.passes[i], self.model, self.options)
                      and self._refused())):
            # (refusal is asked here, before the pass, only in a run that keeps no restore point otherwise, and
            # only before a pass that can make an approximate change and may change this model: it costs a
            # constraint check of the model, a large share of a --no-validate run)
            kind, model = RestoreKind.NONE, None
        elif here.kind is RestoreKind.REREAD:
            kind, model = here.kind, None
        else:
            kind, model = RestoreKind.COPY, copy_model(self.model)
        self.point = RestorePoint(kind, i, len(self.report.passes), model)

    def _restore(self) -> None:
        self.recorded = None
        self.model = self.point.restore(self.model, self.reload, owned=self.owned)
        # Restored from bytes or by reading the input again: the same way back is free again.
        free = self.point.kind in (RestoreKind.REREAD, RestoreKind.BYTES, RestoreKind.FILE)
        self.here = RestorePoint(self.point.kind, model=self.point.model) if free else _CHANGED

    def _replay(self, until: int) -> Outcome:
        """Undo the current group; its passes (up to pass ``until``) then run again, each validated alone."""
        self.solo_until = max(self.solo_until, until)
        self.group.clear()
        self._restore()
        del self.report.passes[self.point.records:]
        return Outcome.REPLAY

    def _validated(self, data: bytes | None, last: bool, scratch: str | None = None) -> RestorePoint:
        """The free way back to the model a validation just accepted (``data``: its bytes; ``scratch``: the file
        its session ran from): those bytes, or, for a large model with passes still to run, the file they are kept
        in (RestoreKind.FILE)."""
        if data is None:
            return _CHANGED
        if not last and len(data) >= KEEP_ON_DISK:
            path = self.validator.keep(data, scratch)
            if path is not None:
                return RestorePoint(RestoreKind.FILE, model=functools.partial(self.validator.read_kept, path))
        return RestorePoint(RestoreKind.BYTES, model=data)

    def _from_proto(self) -> bool:
        """Whether the checker and the sessions read the model from a scratch copy written from the proto, never
        from its bytes: a model read with weights left in the input's data file (ir.weights), which serializing
        would read in, in a run that needs no bytes of it (its output is written with external data)."""
        return self.weights_on_disk and self.on_serialized is None

    def _serialize(self) -> bytes | None:
        """The model's bytes (None above 2 GB), for the checker and a session. A run that owns its model
        (OwnedModel) lets it go here, and every weight the passes replaced in it with it: the bytes are made in
        pieces while it lives and joined once it is gone (io.serialize.serialized_parts), and :meth:`_fresh` parses
        its successor from them once the checker's copies of them are gone too. Until then ``self.model`` is
        None."""
        if approx_model_bytes(self.model) >= TWO_GB:
            return None
        if not self.owned:
            return model_bytes(self.model)
        parts = serialized_parts(self.model)
        self.model = None  # type: ignore[assignment]
        # glibc keeps what the old proto freed in its heap, and the bytes and the checker's copy of them are
        # too large to reuse it: handed back now, or they come on top of it.
        release_freed_memory()
        data = b"".join(parts)
        del parts
        return data

    def _fresh(self, data: bytes | None) -> onnx.ModelProto:
        """The model, parsed from ``data`` when :meth:`_serialize` let it go."""
        if self.model is None:
            assert data is not None
            self.model = parse_model(data)
        return self.model

    # --- validation ---------------------------------------------------------------------------------------
    def _validate_group(self, *, last: bool = False) -> Outcome:
        """Validate the pending group: VALIDATED, FAILED (the run ends), REPLAY (restored: run again from the
        group's first pass, each alone) or ROLLED_BACK (keep_going: the one pass undone). ``last``: no pass
        follows, so these are the output's bytes if they pass."""
        records = [p.record for p in self.group]
        t0 = time.perf_counter()
        # The original's session goes first (its outputs are needed now anyway), so that its weights and
        # activations are not in memory while the candidate is serialized; then the bytes, which may replace
        # self.model (so they come before the call that reads it).
        self.validator.require_original()
        whole = not segmented(self.model)  # (a graph run in segments is cut from the proto)
        from_proto = self._from_proto()
        data = None if from_proto else self._serialize()
        candidate = functools.partial(self._fresh, data) if whole and self.model is None else self._fresh(data)
        verdict = self.validator.check(candidate, exact=all(r.exact for r in records), data=data,
                                       on_serialized=self.on_serialized if last else None,
                                       task=f"validating {', '.join(r.name for r in records)}", from_proto=from_proto)
        del candidate
        self._fresh(data)  # after the session: its weights and the proto are not in memory at once
        if verdict.comparison is not None:
            for record in records:
                record.validation = verdict.comparison
                if len(records) > 1:
                    record.validated_with = [r.name for r in records]
        records[-1].validate_seconds += time.perf_counter() - t0
        if verdict.passed:
            self.group = []
            self.here = self._validated(verdict.data, last, verdict.scratch)
            return self._settle(records, Outcome.VALIDATED)
        if len(records) > 1:
            return self._replay(self.group[-1].index)
        pending = self.group.pop()
        assert verdict.problem is not None
        return self._fail(pending.index, pending.record, Outcome.FAILED, verdict.problem)


def _take_result(record: PassRecord, result: PassResult) -> None:
    """Copy ``result`` into ``record``, with whether this run's rewrite was exact: as the pass declares, unless
    its result says otherwise — ``metrics["exact"]`` (a pass whose rewrites this run were all exact, or not, says
    so), a change with ``detail["exact"]`` False, or ``quantized_tolerance``. A run that is not exact is measured
    alone against ``--max-approx-error`` and refused by ``--strict``."""
    record.changes, record.rejections = result.changes, result.rejections
    record.metrics, record.warnings = result.metrics, result.warnings
    if "exact" in result.metrics:
        record.exact = bool(result.metrics["exact"])
    if any(change.detail.get("exact") is False for change in result.changes):
        record.exact = False
    record.quantized_tolerance = result.quantized_tolerance
    if record.quantized_tolerance:
        # One rounding of a quantized model removed: each removed rounding is within a step, but the
        # steps add up through the layers after it (5 at the QDQ U-Net's mask), so the output is not
        # "exact within k steps". Measured alone, against --max-approx-error, steps reported.
        record.exact = False


def refresh_shapes(model: onnx.ModelProto) -> str | None:
    """Strict shape inference after a pass (fresh shapes for the next pass; catches broken types): the one-line
    problem, or None."""
    try:
        infer_shapes(model)
    except Exception as exc:  # noqa: BLE001
        return f"shape inference fails after this pass: {first_line(exc)}"
    finally:
        release_freed_memory()  # what shape inference's copies left in the heap (host/heap.py)
    return None
