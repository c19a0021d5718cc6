"""The pass manager: runs passes in order, checks and validates them, rolls back or stops, and times it all.

After every pass that changed the graph: strict shape inference (fresh shapes for the next pass; it also catches a
pass that broke types or shapes), unless the pass declares ``keeps_shapes`` and left no tensor without a shape.
Then, with ``validate="each"`` (the default):
  1. onnx checker on the new model;
  2. onnxruntime on the run's seeded inputs, every graph output compared with the outputs of the model before;
  3. exact passes must meet rtol/atol, approximate ones their relative-L2 bound (``--max-approx-error``); outputs
     made by a DequantizeLinear are judged in their quantization steps instead (``quant_steps``), and a pass that
     changed a rounding of a quantized model (``PassResult.quantized_tolerance``) is measured like an approximate one.
Consecutive exact passes are validated as one group (one session after the last of them); an approximate pass
is always measured alone; a failing group is replayed pass by pass so the failing pass is named (see _Run).
The original's outputs are computed once, in the background while the passes run, and the outputs of the last
validated model are carried forward. Finally the output model is compared with the original (reusing the last
outputs: no extra session). A failing pass stops the run (nothing is written) unless ``keep_going`` is set,
which restores the model as it was before that pass and continues with the next one.

The inputs come from onnx_npu_fix.inputs (loaded data, or seeded sets, more of them when an approximate change
may be measured). An original onnxruntime cannot run is an InputError, never a silently unvalidated run; with
``strict`` an approximate change is a StrictRefused.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from onnx_npu_fix.errors import InputError, StrictRefused, first_line
from onnx_npu_fix.graph import (
    TWO_GB,
    approx_model_bytes,
    infer_shapes,
    keep_inferred_shapes,
    name_unnamed_nodes,
    remove_unused,
    set_input_shapes,
)
from onnx_npu_fix.inputs import validation_feeds
from onnx_npu_fix.options import FixOptions
from onnx_npu_fix.passes.base import Change, Pass
from onnx_npu_fix.report import EXACT_ALTERNATIVE, FixReport, PassRecord
from onnx_npu_fix.validate import (
    Comparison,
    Feeds,
    Outputs,
    Reference,
    Runner,
    compare,
    compare_quantized,
    quantized_output_steps,
    runtime_errors,
)

log = logging.getLogger("onnx_npu_fix")

NOT_VALIDATED = "validation: none (requested): nothing was compared with the original"
"""FixReport.validation_note of a run with validate="none" (the CLI prints it as the summary's last line)."""


def strict_message(record: PassRecord) -> str:
    """The one-line --strict refusal of an approximate change by ``record``'s pass."""
    nodes = record.metrics.get("approximate_nodes") or [c.node for c in record.changes
                                                        if c.detail.get("exact") is False]
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

    @property
    def ok(self) -> bool:
        """True when no pass failed and the output matches the original (constraints are judged by the caller)."""
        final = self.report.final
        return self.report.failed_pass is None and (final is None or final.passed)


def prepare(model: onnx.ModelProto, options: FixOptions) -> None:
    """Normalise the input in place: frozen input shapes, named nodes, fresh shape information.

    Raises InputError for an input-shape override naming no graph input, or a model shape inference rejects.
    """
    if options.input_shapes:
        try:
            set_input_shapes(model, options.input_shapes)
        except KeyError as exc:
            names = ", ".join(i.name for i in model.graph.input) or "none"
            raise InputError(f"--input-shape names '{exc.args[0]}', which is not a graph input "
                             f"(inputs: {names})") from None
    name_unnamed_nodes(model.graph)
    try:
        infer_shapes(model)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types; all mean the same to the user
        raise InputError(f"shape inference fails on the input model: {first_line(exc)}; "
                         f"fix the model or freeze its inputs with --input-shape") from None


def run_passes(model: onnx.ModelProto, options: FixOptions, passes: Sequence[Pass], *,
               reference: Reference | None = None,
               on_serialized: Callable[[bytes], None] | None = None,
               reload: Callable[[], onnx.ModelProto] | None = None,
               reference_feeds: Feeds | None = None) -> FixResult:
    """Run ``passes`` over ``model`` (edited in place) and return it with the report.

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
    """
    started = time.perf_counter()
    report = FixReport()
    approximate = any(not p.exact and p.may_change(model, options) for p in passes)
    validator = _Validator(model, options, report, reference=reference, approximate=approximate,
                           reference_feeds=reference_feeds)
    try:
        data = _Run(model, options, list(passes), report, validator, on_serialized, reload).run()
    finally:
        validator.close()
    report.seconds = time.perf_counter() - started
    return FixResult(model=model, report=report, serialized=data)


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
    """

    def __init__(self, model: onnx.ModelProto, options: FixOptions, passes: list[Pass], report: FixReport,
                 validator: _Validator, on_serialized: Callable[[bytes], None] | None = None,
                 reload: Callable[[], onnx.ModelProto] | None = None) -> None:
        self.model, self.options, self.passes = model, options, passes
        self.report, self.validator = report, validator
        self.on_serialized = on_serialized
        self.reload = reload
        self.pristine = True
        """No pass has changed the model yet (``reload`` can restore it)."""
        self.each = options.validate == "each"
        # Above 2 GB a restore point is a second copy of the weights: there, every pass is validated alone, as
        # a replay would need that copy.
        self.grouping = self.each and approx_model_bytes(model) < TWO_GB
        self.group: list[_Pending] = []
        self.solo_until = -1
        """Passes up to this index are validated alone (a replay after a failed group)."""
        self.point: onnx.ModelProto | bytes | object | None = None
        """The model before the current group (or pass): what a replay or a rollback restores."""
        self.point_at = (0, 0)
        """(pass index, number of records) where ``point`` was taken."""
        self.data: bytes | None = None
        """The model serialized by the last validation, while nothing changed it since."""

    def run(self) -> bytes | None:
        i = 0
        while True:
            at_end = i >= len(self.passes)
            if self.group and (at_end or (not self.passes[i].exact
                                          and self.passes[i].may_change(self.model, self.options))):
                # Validate the pending group at the end, and before a pass declared approximate that may change
                # something (it is measured alone). Then back to the loop's head: the group is settled.
                next_i = self._resume_at(self._flush(last=at_end), i)
                if next_i is None:
                    return None
                i = next_i
                continue
            if at_end:
                return self._finish()
            pass_ = self.passes[i]
            if not self.group:
                self._take_point(i)
            record = PassRecord(name=pass_.name, exact=pass_.exact)
            self.report.passes.append(record)
            t0 = time.perf_counter()
            try:
                result = pass_.run(self.model, self.options)
            except InputError:
                raise
            except Exception as exc:  # noqa: BLE001 - a crashing pass is a failed pass, reported, never a traceback
                record.seconds = time.perf_counter() - t0
                record.status = "error"
                record.error = f"{type(exc).__name__}: {first_line(exc)}"
                self.report.warnings.append(f"pass {pass_.name} crashed:\n{traceback.format_exc()}")
                next_i = self._resume_at(self._go_on(i, record), i + 1)
                if next_i is None:
                    return None
                i = next_i
                continue
            record.seconds = time.perf_counter() - t0
            record.changes, record.rejections = result.changes, result.rejections
            record.metrics, record.warnings = result.metrics, result.warnings
            if "exact" in result.metrics:  # a pass whose rewrites this run were all exact says so
                record.exact = bool(result.metrics["exact"])
            record.quantized_tolerance = result.quantized_tolerance
            if record.quantized_tolerance:
                # One rounding of a quantized model removed: each removed rounding is within a step, but the
                # steps add up through the layers after it (5 at the QDQ U-Net's mask), so the output is not
                # "exact within k steps". Measured alone, against --max-approx-error, steps reported.
                record.exact = False
            if self.options.strict and result.changed and not record.exact:
                raise StrictRefused(strict_message(record))
            if not result.changed:
                i += 1
                continue
            self.data = None
            self.pristine = False
            # What a rewrite left unused (old weights, Constant producers of replaced inputs) is dropped here,
            # once, instead of in every pass.
            dead, unused = remove_unused(self.model)
            for node in dead:
                record.changes.append(Change(node.name, node.op_type, "removed dead node"))
            for name in unused:
                record.changes.append(Change(name, "initializer", "removed unused initializer"))
            t1 = time.perf_counter()
            problem = None
            if not (pass_.keeps_shapes and keep_inferred_shapes(self.model.graph)):
                problem = self.validator.refresh_shapes(self.model)
            record.validate_seconds = time.perf_counter() - t1
            if problem is not None:
                record.status, record.error = "failed", problem
                next_i = self._resume_at(self._go_on(i, record), i + 1)
                if next_i is None:
                    return None
                i = next_i
                continue
            if not self.each:
                self.validator.accept_unvalidated(record)
                i += 1
                continue
            if not record.exact and self.group:
                # Declared exact, but this run's rewrite was approximate: its error must not be measured against
                # exact passes' tolerance, nor theirs hidden under its bound. Undo the group; each runs alone.
                self._replay(i)
                i = self.point_at[0]
                continue
            self.group.append(_Pending(i, record))
            outcome = "ok"
            if i <= self.solo_until or not record.exact or not self.grouping:
                outcome = self._flush()
            next_i = self._resume_at(outcome, i + 1)
            if next_i is None:
                return None
            i = next_i

    def _resume_at(self, outcome: str, otherwise: int) -> int | None:
        """The pass the loop goes on with after ``outcome`` of _flush or _go_on: None when the run stops, the
        group's first pass after a replay, else ``otherwise``."""
        if outcome == "stop":
            return None
        return self.point_at[0] if outcome == "replay" else otherwise

    def _go_on(self, i: int, record: PassRecord) -> str:
        """After pass ``i`` crashed or broke shape inference: "stop" ends the run; with keep_going the model is
        restored: "rolled back" (the pass alone) or "replay" (its unvalidated group, to run again pass by pass)."""
        if not self.options.keep_going or self.point is None:
            self._abandon()
            return "stop"
        if self.group:  # the passes before it in its group are not validated yet: run them again, alone
            self._replay(i)
            return "replay"
        self._restore()
        record.status = "rolled back"
        return "rolled back"

    def _abandon(self) -> None:
        """The run stops: the group's passes were never validated, and the report says so."""
        for pending in self.group:
            pending.record.status = "not validated"
        self.group.clear()

    def _finish(self) -> bytes | None:
        report, validator, data = self.report, self.validator, self.data
        if report.failed_pass is not None and not self.options.keep_going:
            return None
        validator.require_original()
        problem = None
        if not self.each and validator.changed:
            # Without per-pass validation the checker still runs once, before anything is written. The model
            # is serialized once: for the checker, the final onnxruntime session and save_model.
            data = self.model.SerializeToString() if approx_model_bytes(self.model) < TWO_GB else None
            problem = check_structure(self.model, data)
            if not problem and data is not None and self.on_serialized is not None:
                self.on_serialized(data)
        if problem:
            report.final = Comparison(error=f"the output fails the onnx checker: {problem}")
        else:
            report.final = validator.final(self.model, data)
        return data

    # --- restore points ---------------------------------------------------------------------------------
    def _take_point(self, i: int) -> None:
        """Remember the model as it is before pass ``i`` (free when the last validation serialized it)."""
        if self.data is not None:
            self.point = self.data
        elif not (self.grouping or self.options.keep_going):
            self.point = None
        elif self.pristine and self.reload is not None:
            self.point = _RELOAD  # the input as read: no 100 MB copy held for a failure that rarely comes
        else:
            self.point = _copy(self.model)
        self.point_at = (i, len(self.report.passes))

    def _restore(self) -> None:
        point = self.point
        if point is _RELOAD:
            assert self.reload is not None
            self.model.CopyFrom(self.reload())
            self.pristine = True
        elif isinstance(point, bytes):
            self.model.Clear()
            self.model.ParseFromString(point)
        elif isinstance(point, onnx.ModelProto):
            self.model.CopyFrom(point)
        self.data = point if isinstance(point, bytes) else None  # restored from bytes: they describe it again

    def _replay(self, until: int) -> None:
        """Undo the current group; its passes (up to pass ``until``) then run again, each validated alone."""
        self.solo_until = max(self.solo_until, until)
        self.group.clear()
        self._restore()
        del self.report.passes[self.point_at[1]:]

    # --- validation ---------------------------------------------------------------------------------------
    def _flush(self, *, last: bool = False) -> str:
        """Validate the pending group: "ok", "stop" (failed, the run ends), "replay" (restored: run again from
        the group's first pass) or "rolled back" (keep_going: the one pass undone). ``last``: no pass follows,
        so these are the output's bytes if they pass."""
        group = self.group
        records = [p.record for p in group]
        t0 = time.perf_counter()
        problem, data = self.validator.validate(self.model, records, self.on_serialized if last else None)
        records[-1].validate_seconds += time.perf_counter() - t0
        if problem is None:
            self.group = []
            self.data = data
            return "ok"
        if len(group) > 1:
            self._replay(group[-1].index)
            return "replay"
        self.group = []
        record = records[0]
        record.status, record.error = "failed", problem
        if not self.options.keep_going or self.point is None:
            return "stop"
        self._restore()
        record.status = "rolled back"
        return "rolled back"


class _Validator:
    """Holds the seeded inputs and the outputs of the last accepted model, so each is computed once.

    The original's outputs are computed on a background thread (validate.Reference) while the passes work; the
    first validation waits for them.
    """

    def __init__(self, model: onnx.ModelProto, options: FixOptions, report: FixReport, *,
                 reference: Reference | None = None, reference_feeds: Feeds | None = None,
                 approximate: bool = False) -> None:
        self.options = options
        self.report = report
        self.feeds: list[Feeds] = []
        self._original: list[Outputs] | None = None
        self._current: list[Outputs] | None = None
        self._reference: Reference | None = None
        self.all_exact = True
        self.changed = False
        self.steps: dict[str, np.ndarray] = {}
        if options.validate == "none":
            report.validation_note = NOT_VALIDATED
            return
        self.feeds = validation_feeds(model, n_inputs=options.n_inputs, seed=options.seed,
                                      data=options.validation_data, ranges=options.input_ranges,
                                      approximate=approximate and not options.strict)
        # Outputs made by a DequantizeLinear are judged in quantization steps (graph output names never change).
        self.steps = quantized_output_steps(model)
        if reference is None and approx_model_bytes(model) >= TWO_GB:
            # No file to start from and too large for bytes: the scratch copy must be written now, before the
            # passes change the model, so this one is computed here.
            self._settle(lambda: self._run(model))
            return
        self._reference = reference or Reference(model.SerializeToString())
        if reference is not None and reference_feeds:
            self._reference.run([{**feeds, **reference_feeds} for feeds in self.feeds])
        else:
            self._reference.run(self.feeds)

    def _settle(self, compute) -> None:  # noqa: ANN001 - a zero-argument callable returning the outputs
        try:
            self._original = compute()
        except runtime_errors() as exc:
            # Without the original's outputs nothing can be validated, and nothing is written unvalidated
            # unless the user asked for it.
            raise InputError(f"onnxruntime cannot run the original model ({first_line(exc)}), so no change "
                             f"could be validated; nothing written (fix the model, or --validate none to write "
                             f"it unvalidated)") from None
        self._current = self._original

    def _wait(self) -> None:
        if self._reference is not None:
            reference, self._reference = self._reference, None
            try:
                self._settle(reference.outputs)
            finally:
                reference.close()

    def require_original(self) -> None:
        """Raise InputError unless the original's outputs exist (or validation is off): a run that changed
        nothing still proves that the model it hands back runs."""
        if self.options.validate != "none":
            self._wait()

    @property
    def original(self) -> list[Outputs] | None:
        self._wait()
        return self._original

    @property
    def current(self) -> list[Outputs] | None:
        self._wait()
        return self._current

    def close(self) -> None:
        if self._reference is not None:
            self._reference.close()

    def _run(self, model: onnx.ModelProto, data: bytes | None = None, *,
             before_runs: Callable[[], None] | None = None) -> list[Outputs]:
        runner = Runner(model, data=data)
        try:
            if before_runs is not None:
                before_runs()
            return runner.run_all(self.feeds)
        finally:
            runner.close()

    def refresh_shapes(self, model: onnx.ModelProto) -> str | None:
        """Strict shape inference after a pass (fresh shapes for the next pass; catches broken types)."""
        try:
            infer_shapes(model)
        except Exception as exc:  # noqa: BLE001
            return f"shape inference fails after this pass: {first_line(exc)}"
        return None

    def accept_unvalidated(self, record: PassRecord) -> None:
        record.status = "not validated"
        self._accept(record)

    def validate(self, model: onnx.ModelProto, records: list[PassRecord],
                 on_serialized: Callable[[bytes], None] | None = None) -> tuple[str | None, bytes | None]:
        """Check and run the model after ``records``' passes (one group); a one-line problem or None, and the
        serialized model (reused by a later replay or by save_model, after going to ``on_serialized``)."""
        data = model.SerializeToString() if approx_model_bytes(model) < TWO_GB else None
        problem = check_structure(model, data)
        if problem:
            return f"the model fails the onnx checker after this pass: {problem}", data
        if on_serialized is not None and data is not None:
            on_serialized(data)
        try:
            # The session is built while the original's runs may still be going; its own runs wait for them
            # (two models computing at once would only fight over the cores).
            outputs = self._run(model, data, before_runs=self._wait)
        except runtime_errors() as exc:
            self._wait()  # an original that cannot run either is the input's problem, not this pass's
            return f"onnxruntime cannot run the model after this pass: {first_line(exc)}", data
        assert self.current is not None  # the original ran (else _wait raised)
        exact = all(r.exact for r in records)
        comparison = self._compare(self.current, outputs, exact=exact)
        for record in records:
            record.validation = comparison
            if len(records) > 1:
                record.validated_with = [r.name for r in records]
        if not comparison.passed:
            worst = comparison.worst
            where = f"output '{worst.name}'" if worst else "outputs"
            detail = comparison.error or (f"{where}: max abs error {worst.max_abs:.3g}, rel L2 {worst.rel_l2:.3g} "
                                          f"({comparison.criterion})")
            return f"validation failed on {detail}", data
        for record in records:
            record.status = "validated"
            self._accept(record)
        self._current = outputs
        return None, data

    def _accept(self, record: PassRecord) -> None:
        self.changed = True
        self.all_exact = self.all_exact and record.exact

    def final(self, model: onnx.ModelProto, data: bytes | None = None) -> Comparison | None:
        """The output model against the original (reusing the last pass's outputs when every pass ran);
        ``data``: the model already serialized."""
        if not self.changed or self.options.validate == "none" or self.original is None:
            return None
        if self.options.validate == "each" and self.current is not None:
            outputs = self.current
        else:
            try:
                outputs = self._run(model, data)
            except runtime_errors() as exc:
                return Comparison(error=f"onnxruntime cannot run the output model: {first_line(exc)}")
        return self._compare(self.original, outputs, exact=self.all_exact)

    def _compare(self, reference: list[Outputs], outputs: list[Outputs], *, exact: bool) -> Comparison:
        if self.steps:
            return compare_quantized(reference, outputs, self.steps, exact=exact, rtol=self.options.rtol,
                                     atol=self.options.atol, max_approx_error=self.options.max_approx_error,
                                     quant_steps=self.options.quant_steps)
        return compare(reference, outputs, exact=exact, rtol=self.options.rtol, atol=self.options.atol,
                       max_approx_error=self.options.max_approx_error)


def check_structure(model: onnx.ModelProto, data: bytes | None = None) -> str | None:
    """The onnx checker's complaint about ``model`` (one line), or None. ``data``: the model already
    serialized (checking bytes skips the checker's own re-serialization). Above 2 GB the checker cannot take
    the in-memory proto; strict shape inference and onnxruntime still check those models."""
    if data is None:
        if approx_model_bytes(model) >= TWO_GB:
            return None
        data = model.SerializeToString()
    try:
        onnx.checker.check_model(data)
    except Exception as exc:  # noqa: BLE001
        return first_line(exc)
    return None


_RELOAD = object()
"""A restore point meaning: the input model, read and prepared again."""


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy
