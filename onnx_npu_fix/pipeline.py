"""The pass manager: runs passes in order, checks and validates each, rolls back or stops, and times it all.

For every pass that changed the graph (``validate="each"``, the default):
  1. onnx checker and strict shape inference on the new model;
  2. onnxruntime on the run's seeded inputs, every graph output compared with the outputs of the model *before*
     the pass (computed once and carried forward, so one session is built per changed pass);
  3. exact passes must meet rtol/atol, approximate ones their relative-L2 bound (``--max-approx-error``).
Finally the output model is compared with the original (reusing the last outputs: no extra session).
A failing pass stops the run (nothing is written) unless ``keep_going`` is set, which restores the model as it
was before that pass and continues with the next one.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from onnx_npu_fix.errors import InputError, first_line
from onnx_npu_fix.graph import (
    TWO_GB,
    approx_model_bytes,
    infer_shapes,
    name_unnamed_nodes,
    remove_dead_nodes,
    remove_unused_initializers,
    set_input_shapes,
)
from onnx_npu_fix.options import FixOptions
from onnx_npu_fix.passes.base import Change, Pass
from onnx_npu_fix.report import FixReport, PassRecord
from onnx_npu_fix.validate import Comparison, Feeds, Outputs, Runner, compare, make_inputs, runtime_errors

log = logging.getLogger("onnx_npu_fix")



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


def run_passes(model: onnx.ModelProto, options: FixOptions, passes: Sequence[Pass]) -> FixResult:
    """Run ``passes`` over ``model`` (edited in place) and return it with the report.

    Call :func:`prepare` first. Never raises for a failing pass: the report says which pass failed and why.
    Raises InputError when validation needs inputs it cannot generate (dynamic input shapes).
    """
    started = time.perf_counter()
    report = FixReport()
    data: bytes | None = None
    validator = _Validator(model, options, report)
    for pass_ in passes:
        record = PassRecord(name=pass_.name, exact=pass_.exact)
        report.passes.append(record)
        snapshot = _copy(model) if options.keep_going else None
        t0 = time.perf_counter()
        try:
            result = pass_.run(model, options)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - a crashing pass is a failed pass, reported, never a traceback
            record.seconds = time.perf_counter() - t0
            record.status = "error"
            record.error = f"{type(exc).__name__}: {first_line(exc)}"
            report.warnings.append(f"pass {pass_.name} crashed:\n{traceback.format_exc()}")
            if not _rollback(model, snapshot, record):
                break
            continue
        record.seconds = time.perf_counter() - t0
        record.changes, record.rejections = result.changes, result.rejections
        record.metrics, record.warnings = result.metrics, result.warnings
        if "exact" in result.metrics:  # a pass whose rewrites this run were all exact says so
            record.exact = bool(result.metrics["exact"])
        if not result.changed:
            continue
        # What a rewrite left unused (old weights, Constant producers of replaced inputs) is dropped here,
        # once, instead of in every pass.
        for node in remove_dead_nodes(model):
            record.changes.append(Change(node.name, node.op_type, "removed dead node"))
        for name in remove_unused_initializers(model.graph):
            record.changes.append(Change(name, "initializer", "removed unused initializer"))
        t1 = time.perf_counter()
        problem = validator.after_pass(model, record)
        record.validate_seconds = time.perf_counter() - t1
        if problem is None:
            continue
        record.status = "failed"
        record.error = problem
        if not _rollback(model, snapshot, record):
            break
    if report.failed_pass is None or options.keep_going:
        problem = None
        if options.validate != "each" and validator.changed:
            # Without per-pass validation the checker still runs once, before anything is written. The model
            # is serialized once: for the checker, the final onnxruntime session and save_model.
            data = model.SerializeToString() if approx_model_bytes(model) < TWO_GB else None
            problem = check_structure(model, data)
        if problem:
            report.final = Comparison(error=f"the output fails the onnx checker: {problem}")
        else:
            report.final = validator.final(model, data)
    report.seconds = time.perf_counter() - started
    return FixResult(model=model, report=report, serialized=data)


def _rollback(model: onnx.ModelProto, snapshot: onnx.ModelProto | None, record: PassRecord) -> bool:
    """Restore ``model`` from ``snapshot`` (keep-going mode); False when the run must stop instead."""
    if snapshot is None:
        return False
    model.CopyFrom(snapshot)
    record.status = "rolled back"
    return True


class _Validator:
    """Holds the seeded inputs and the outputs of the last accepted model, so each is computed once."""

    def __init__(self, model: onnx.ModelProto, options: FixOptions, report: FixReport) -> None:
        self.options = options
        self.report = report
        self.feeds: list[Feeds] = []
        self.original: list[Outputs] | None = None
        self.current: list[Outputs] | None = None
        self.all_exact = True
        self.changed = False
        if options.validate == "none":
            report.validation_note = "validation disabled (--no-validate)"
            return
        self.feeds = make_inputs(model, options.n_inputs, options.seed)
        try:
            self.original = self._run(model)
        except runtime_errors() as exc:  # the runtime's refusal is information, not a crash
            report.validation_note = (f"onnxruntime cannot run the original model ({first_line(exc)}); "
                                      f"passes are validated from the first model it can run")
            return
        self.current = self.original

    def _run(self, model: onnx.ModelProto, data: bytes | None = None) -> list[Outputs]:
        runner = Runner(model, data=data)
        try:
            return runner.run_all(self.feeds)
        finally:
            runner.close()

    def after_pass(self, model: onnx.ModelProto, record: PassRecord) -> str | None:
        """Check and validate the model after ``record``'s pass; a one-line problem, or None when it passed."""
        data = None
        try:
            if self.options.validate == "each":
                # Serialized once for both the checker and the onnxruntime session.
                data = model.SerializeToString() if approx_model_bytes(model) < TWO_GB else None
                problem = check_structure(model, data)
                if problem:
                    return f"the model fails the onnx checker after this pass: {problem}"
            infer_shapes(model)  # strict: also catches a pass that broke types or shapes
        except Exception as exc:  # noqa: BLE001
            return f"shape inference fails after this pass: {first_line(exc)}"
        if self.options.validate != "each":
            record.status = "not validated"
            self._accept(record)
            return None
        try:
            outputs = self._run(model, data)
        except runtime_errors() as exc:
            if self.current is None:
                record.status = "not validated"
                self._accept(record)
                return None
            return f"onnxruntime cannot run the model after this pass: {first_line(exc)}"
        if self.current is None:
            # The first model the runtime accepts becomes the reference for every later pass.
            record.status = "not validated"
            record.warnings.append("first model onnxruntime can run: later passes are validated against it")
            self.current = outputs
            self._accept(record)
            return None
        comparison = self._compare(self.current, outputs, exact=record.exact)
        record.validation = comparison
        if not comparison.passed:
            worst = comparison.worst
            where = f"output '{worst.name}'" if worst else "outputs"
            detail = comparison.error or (f"{where}: max abs error {worst.max_abs:.3g}, rel L2 {worst.rel_l2:.3g} "
                                          f"({comparison.criterion})")
            return f"validation failed on {detail}"
        record.status = "validated"
        self.current = outputs
        self._accept(record)
        return None

    def _accept(self, record: PassRecord) -> None:
        self.changed = True
        self.all_exact = self.all_exact and record.exact

    def final(self, model: onnx.ModelProto, data: bytes | None = None) -> Comparison | None:
        """The output model against the original (reusing the last pass's outputs when every pass ran);
        ``data``: the model already serialized."""
        if not self.changed or self.original is None or self.options.validate == "none":
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


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy
