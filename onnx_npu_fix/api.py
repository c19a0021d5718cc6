"""The library entry points: load a model, fix it, save it atomically.

    outcome = run("in.onnx", "out.onnx", FixOptions(max_dilation=4, align=8), report_path="npufix.json")
    outcome.exit_code    # 0 ok, 1 constraints remain, 3 a pass failed (errors.EXIT_*)

or step by step:

    model = load_model("in.onnx")
    result = fix(model, FixOptions(max_dilation=4, align=8))   # `model` is left as it is
    if result.ok:
        save_model(result.model, "out.onnx")
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx.external_data_helper

from onnx_npu_fix.analysis.constraints import CheckReport, Violation
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import EXIT_OK, EXIT_PASS_FAILED, EXIT_VIOLATIONS, InputError, PassFailed, first_line
from onnx_npu_fix.io.load import LoadedModel, load_model, read_model  # noqa: F401 - load_model: part of the API
from onnx_npu_fix.io.paths import check_output_path, check_run_paths, check_split_dir
from onnx_npu_fix.io.save import EarlyWrite, current_umask, save_model, write_json
from onnx_npu_fix.ir.graph import TWO_GB, approx_model_bytes, infer_shapes
from onnx_npu_fix.passes import DEFAULT_ORDER, PASSES
from onnx_npu_fix.passes.base import Pass
from onnx_npu_fix.pipeline.freeze import FrozenInput, freeze_inputs
from onnx_npu_fix.pipeline.report import FixReport
from onnx_npu_fix.pipeline.scheduler import FixResult, prepare, run_passes
from onnx_npu_fix.pipeline.validate import Reference


def select_passes(only: Sequence[str] | None = None, skip: Sequence[str] = (),
                  plugins: Sequence[str | type[Pass]] = ()) -> list[Pass]:
    """The passes of a run, in order: the default order, restricted to ``only`` and without ``skip``, with the
    ``plugins`` (``--plugin`` specs or pass classes) placed as :func:`onnx_npu_fix.plugins.loader.place` says.

    Unknown names and unusable plugins raise InputError listing the valid names.
    """
    from onnx_npu_fix.plugins import loader as plugin_mod
    loaded = plugin_mod.load_all(plugins)
    known = plugin_mod.registry(loaded)
    for name in [*(only or ()), *skip]:
        if name not in known:
            raise InputError(f"unknown pass '{name}'; passes: {', '.join(known)}")
    return [cls() for cls in plugin_mod.place(only, skip, loaded, known)]


def list_passes(plugins: Sequence[str | type[Pass]] = ()) -> list[tuple[type[Pass] | None, str, str]]:
    """Every pass a run can name, for ``--list-passes``: (class or None when it fails to load, name, where from:
    ``default``, ``opt-in``, ``installed: <entry point>``, ``plugin: <spec>`` or the load error)."""
    from onnx_npu_fix.plugins import loader as plugin_mod
    rows: list[tuple[type[Pass] | None, str, str]] = []
    for name, held in plugin_mod.registry(plugin_mod.load_all(plugins)).items():
        # identity, not ==: an EntryPoint's __eq__ fails on a class
        if any(held is cls for cls in DEFAULT_ORDER):
            rows.append((held, name, "default"))
        elif any(held is cls for cls in PASSES.values()):
            rows.append((held, name, "opt-in"))
        elif isinstance(held, type):
            rows.append((held, name, f"plugin: {plugin_mod.origin_of(held)}"))
        else:
            try:
                rows.append((plugin_mod.load_entry_point(held), name, f"installed: {held.value}"))
            except InputError as exc:
                rows.append((None, name, str(exc)))
    return rows


def start_reference(source: LoadedModel | str | os.PathLike, options: FixOptions) -> Reference | None:
    """Start computing the original's outputs on a worker thread, while the passes run (pass the result to
    :func:`fix`, and close it when done). ``source``: what :func:`read_model` returned; onnxruntime should only
    see models the onnx checker passed. The reference is the model as read: for a self-contained file,
    onnxruntime loads the file and the bytes read (``source.data``, taken over and let go once hashed) prove that
    it loaded those bytes — a file replaced or removed meanwhile stops the run with InputError (see
    validate.Reference); for a model with external data, the model in memory, serialized now. None when the run
    will not validate, when ``--input-shape`` overrides or repeated node names (which onnxruntime refuses,
    :func:`fix` renames) make the model as read the wrong one to run, or when a model above 2 GB leaves the pass
    manager to compute the reference itself."""
    if not isinstance(source, LoadedModel):
        source = read_model(source, keep_bytes=True)
    data, source.data = source.data, None  # taken over, even when not used: no copy outlives this call
    if options.validate == "none" or options.input_shapes:
        return None
    names = [node.name for node in source.model.graph.node if node.name]
    if len(set(names)) != len(names):
        return None  # onnxruntime refuses repeated node names: the pass manager runs the renamed (prepared) model
    if data is None:
        if approx_model_bytes(source.model) >= TWO_GB:
            return None
        return Reference(source.model.SerializeToString())
    path = os.path.abspath(source.path)
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # onnxruntime only opens UTF-8 paths: it gets the bytes read instead
        return Reference(data)
    return Reference(data, read_from=path)


def fix(model: onnx.ModelProto | str | os.PathLike, options: FixOptions | None = None,
        passes: Sequence[Pass] | None = None, *, reference: Reference | None = None,
        on_serialized: Callable[[bytes], None] | None = None,
        source: str | os.PathLike | None = None) -> FixResult:
    """Run the passes (default order unless given) over ``model``; see :class:`FixResult`.

    ``model``: an ONNX ModelProto, which is left as it is (the passes work on a copy: FixResult.model), or the
    path of an .onnx file, read with :func:`read_model` (no copy needed).
    ``reference``: from :func:`start_reference` on what :func:`read_model` returned (``model`` unchanged since).
    ``on_serialized``: called with the output's bytes before its last validation runs (e.g. EarlyWrite.start);
    FixResult.serialized is that same object when they are the result.
    ``source``: the file ``model`` was read from by :func:`read_model`, unchanged since: a rollback to the input
    reads it again instead of the pass manager keeping a copy of the model."""
    if isinstance(model, (str, os.PathLike)):
        source = model if source is None else source
        model = read_model(model).model
    elif isinstance(model, onnx.ModelProto):
        work = onnx.ModelProto()
        work.CopyFrom(model)
        model = work
    else:
        raise TypeError(f"fix() takes an onnx.ModelProto or the path of an .onnx file, not {type(model).__name__}"
                        " (export an onnx-graphsurgeon graph with gs.export_onnx first)")
    return _fix_in_place(model, options, passes, reference=reference, on_serialized=on_serialized, source=source)


def _fix_in_place(model: onnx.ModelProto, options: FixOptions | None = None,
                  passes: Sequence[Pass] | None = None, *, reference: Reference | None = None,
                  on_serialized: Callable[[bytes], None] | None = None,
                  source: str | os.PathLike | None = None) -> FixResult:
    """:func:`fix` on ``model`` itself (edited in place): for a model nobody else holds, e.g. just read."""
    from onnx_npu_fix.analysis.cost import model_cost

    options = options or FixOptions()
    prepare(model, options)
    before = model_cost(model, options.act_bytes)  # the model is edited in place: its cost is taken now
    reload = None if source is None else functools.partial(_read_prepared, os.fspath(source), options, reference)
    frozen, own_reference = _freeze(model, options, reference)
    try:
        result = run_passes(model, options, list(passes) if passes is not None else select_passes(),
                            reference=reference or own_reference, on_serialized=on_serialized, reload=reload,
                            reference_feeds={name: f.value for name, f in frozen.items()})
    finally:
        if own_reference is not None:
            own_reference.close()
    result.report.frozen_inputs = {name: f.to_json() for name, f in frozen.items()}
    if result.ok:
        result.report.cost = (before, model_cost(result.model, options.act_bytes))
    return result


def _freeze(model: onnx.ModelProto, options: FixOptions,
            reference: Reference | None) -> tuple[dict[str, FrozenInput], Reference | None]:
    """``--freeze-input``, a step of the use case before the passes: the inputs become constants (InputError
    for a bad name or value). The reference stays the model *before* freezing, fed the frozen values: with no
    reference from the file (``reference``), the prepared model is serialized before it is frozen."""
    if not options.freeze_inputs:
        return {}, None
    original = None
    if reference is None and options.validate != "none" and approx_model_bytes(model) < TWO_GB:
        original = model.SerializeToString()
    frozen = freeze_inputs(model, options.freeze_inputs)
    try:
        infer_shapes(model)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types; all mean the same to the user
        raise InputError(f"shape inference fails once the inputs are frozen: {first_line(exc)}") from None
    return frozen, (Reference(original) if original is not None else None)


def _read_prepared(path: str, options: FixOptions, reference: Reference | None = None) -> onnx.ModelProto:
    """The input read again (a rollback to it), proven to be the bytes the reference was built from."""
    loaded = read_model(path, keep_bytes=True)
    expected = reference.digest() if reference is not None else None
    if expected is not None and (loaded.data is None or hashlib.sha256(loaded.data).digest() != expected):
        raise InputError(f"{path} changed while npufix ran (it no longer holds the bytes that were read); "
                         f"nothing written: rerun on a file that stays put")
    model = loaded.model
    prepare(model, options)
    if options.freeze_inputs:
        freeze_inputs(model, options.freeze_inputs)
        infer_shapes(model)
    return model


# --- the whole use case: what `npufix` does, as one call ------------------------------------------------


@dataclass
class RunOutcome:
    """What :func:`run` did. ``exit_code`` is the decision the CLI exits with (errors.EXIT_*: 0 ok, 1 requested
    constraints violated, 3 a pass failed)."""

    exit_code: int
    mode: str
    """fix | check"""
    input_path: str
    written: str | None = None
    """The output model's path when it was written, else None."""
    result: FixResult | None = None
    """The pass manager's result (None in check mode)."""
    checked: CheckReport | None = None
    """The constraint check of the output (check mode: of the input)."""
    violations: list[Violation] = field(default_factory=list)
    """The violations that count (requested constraints); exit code 1 when not empty."""
    not_requested: list[tuple[Violation, str]] = field(default_factory=list)
    """Violations that do not count, with why (not requested, or their pass was not run): warnings."""
    record: dict[str, Any] | None = None
    """The build record, when it was asked for (``report_path`` or ``record=True``)."""
    error: str | None = None
    """One line: why nothing was written (a pass failed, the output does not match the original)."""
    split: SplitOutcome | None = None
    """``split_dir``: the segments that fit the SRAM budget (or why none could), see :func:`split_model`."""
    memory_plot: str | None = None
    """``memory_plot``: the picture written (its numbers are next to it, ``+ '.json'``)."""

    @property
    def report(self) -> FixReport | None:
        return self.result.report if self.result is not None else None

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


def run(input_path: str | os.PathLike, output: str | os.PathLike | None = None,
        options: FixOptions | None = None, *, passes: Sequence[Pass] | None = None,
        report_path: str | os.PathLike | None = None, check: bool = False, shapes: bool = False,
        record: bool = False, command: Sequence[str] | None = None,
        split_dir: str | os.PathLike | None = None, memory_plot: str | os.PathLike | None = None) -> RunOutcome:
    """Load ``input_path``, fix it (``passes``, default order unless given), re-check the constraints, write
    ``output`` atomically and the build record to ``report_path``; or with ``check=True`` only check the input.

    Every path is checked before any work (nothing the run writes may be something it reads, or another file
    it writes). Raises InputError (exit 2) for unusable input or paths, and OptionError for bad options;
    a failing pass is not raised: the outcome says so (exit 3, ``error``) and nothing is written.
    ``shapes``: also list every node's shapes (``checked.shapes``). ``record``: build the record even without
    ``report_path``. ``command``: recorded as the command line (default sys.argv).
    ``split_dir``: once fixed, cut the model into segments that each fit ``options.sram_bytes`` and write them
    with ``manifest.json`` there (:func:`split_model`; before the model is saved, so a failed split writes
    nothing). ``memory_plot``: draw the activation profile (:func:`write_memory_plot`).
    """
    from onnx_npu_fix.analysis.constraints import check_model, split_requested
    from onnx_npu_fix.pipeline.report import build_record

    started = time.perf_counter()
    options = options or FixOptions()
    path = os.fspath(input_path)
    report_path = None if report_path is None else os.fspath(report_path)
    split_dir = None if split_dir is None else os.fspath(split_dir)
    memory_plot = None if memory_plot is None else os.fspath(memory_plot)
    _check_fitting(options, path, check, split_dir, memory_plot)
    if check:
        source = read_model(path)
        if report_path:
            check_run_paths(path, None, report_path, source.external_files)
        checked = check_model(source.model, options, shapes=shapes)
        counted, others = split_requested(checked.violations, options)
        outcome = RunOutcome(EXIT_VIOLATIONS if counted else EXIT_OK, "check", path, checked=checked,
                             violations=counted, not_requested=others)
        if memory_plot:
            _plot(outcome, source.model, memory_plot, options, prepared=False)
        if report_path or record:
            outcome.record = build_record(path, None, options, None, time.perf_counter() - started,
                                          outcome.exit_code, checked, command, counted, others)
            outcome.record["split"] = None
        if report_path:
            _write_report(report_path, outcome.record, write_json)
        return outcome
    if output is None:
        raise InputError("missing the output path (where to write the fixed model)")
    output = os.fspath(output)
    chosen = list(passes) if passes is not None else select_passes()
    check_output_path(output, path)
    if report_path:
        check_run_paths(path, output, report_path)
    reference = None
    early = EarlyWrite(output)
    try:
        loaded = read_model(path, keep_bytes=True)
        # Only a model that passed the onnx checker goes to onnxruntime: malformed graphs can crash it.
        reference = start_reference(loaded, options)
        check_output_path(output, path, protected=loaded.external_files)
        if report_path:
            check_run_paths(path, output, report_path, loaded.external_files)
        external = bool(loaded.external_files)
        # The model was read here and nobody else holds it: the passes work on it in place (no copy).
        result = _fix_in_place(loaded.model, options, chosen, reference=reference,
                               on_serialized=None if external else early.start, source=path)
        # The SHA-256 of the bytes read (the reference hashed them): the record names what was processed.
        read_digest = reference.digest() if reference is not None else None
    except BaseException:
        early.close()
        raise
    finally:
        if reference is not None:
            reference.close()
    outcome = RunOutcome(EXIT_OK, "fix", path, result=result)
    if not result.ok:
        early.close()
        outcome.exit_code = EXIT_PASS_FAILED
        failed = result.report.failed_pass
        if failed is not None:
            outcome.error = (f"pass {failed.name} failed: {failed.error}; nothing written "
                             f"(--skip {failed.name} to run without it, or --keep-going to roll it back)")
        else:
            outcome.error = f"the output does not match the original ({_final_problem(result.report.final)}); " \
                            f"nothing written"
    else:
        try:
            outcome.checked = check_model(result.model, options, shapes=shapes, prepared=True,
                                          memory=bool(report_path) or record)
            if split_dir:
                try:
                    outcome.split = split_model(result.model, split_dir, options)
                except PassFailed as exc:
                    outcome.exit_code, outcome.error = exc.exit_code, f"split failed: {exc}; nothing written"
                except OSError as exc:
                    raise InputError(f"cannot write --split {split_dir}: {exc.strerror or exc}; nothing written") \
                        from None
                if outcome.split.fits and options.sram_bytes is not None:
                    # Segments that all fit satisfy the budget: the whole model's 'sram' finding is resolved.
                    outcome.checked.violations = [v for v in outcome.checked.violations if v.constraint != "sram"]
            if memory_plot and outcome.error is None:
                _plot(outcome, result.model, memory_plot, options, prepared=True)
            if outcome.error is None:
                save_model(result.model, output, external_data=external or None, serialized=result.serialized,
                           early=early)
        except OSError as exc:
            raise InputError(f"cannot write {output}: {exc.strerror or exc}; nothing written") from None
        finally:
            early.close()
        if outcome.error is None:
            outcome.written = output
            outcome.violations, outcome.not_requested = split_requested(
                outcome.checked.violations, options, [p.name for p in chosen])
            if outcome.violations or (outcome.split is not None and not outcome.split.fits):
                outcome.exit_code = EXIT_VIOLATIONS
    # The record hashes both models (0.2 s at 100 MB): built only when someone reads it.
    if report_path or record:
        # A self-contained output is exactly the serialized bytes (save_model writes them as they are).
        written_digest = hashlib.sha256(result.serialized).hexdigest() \
            if outcome.written and not external and result.serialized is not None else None
        outcome.record = build_record(path, outcome.written, options, result.report, time.perf_counter() - started,
                                      outcome.exit_code, outcome.checked, command,
                                      outcome.violations if outcome.checked is not None else None,
                                      outcome.not_requested, read_digest.hex() if read_digest else None,
                                      written_digest)
        outcome.record["split"] = outcome.split.to_json() if outcome.split is not None else None
    if report_path:
        _write_report(report_path, outcome.record, write_json)
    return outcome


def _check_fitting(options: FixOptions, input_path: str, check: bool, split_dir: str | None,
                   memory_plot: str | None) -> None:
    """--split / --split-at / --memory-plot make sense together and their paths can be written: checked before
    any work (InputError, exit 2)."""
    if options.split_at and not split_dir:
        raise InputError("--split-at needs --split DIR (where the segments go)")
    if split_dir:
        if check:
            raise InputError("--split writes segments: use it in a fixing run (-o), not with --check")
        if options.sram_bytes is None and not options.split_at:
            raise InputError("--split needs --sram SIZE (the budget each segment must fit) or --split-at")
        check_split_dir(split_dir)
    if memory_plot:
        from onnx_npu_fix.analysis.plot import check_plot_path

        check_plot_path(memory_plot)
        check_output_path(memory_plot, input_path, what="--memory-plot")


def _plot(outcome: RunOutcome, model: onnx.ModelProto, path: str, options: FixOptions, *, prepared: bool) -> None:
    try:
        write_memory_plot(model, path, options, split=outcome.split, prepared=prepared)
    except OSError as exc:
        raise InputError(f"cannot write --memory-plot {path}: {exc.strerror or exc}") from None
    outcome.memory_plot = path


def _write_report(path: str, data: dict[str, Any] | None, write_json: Callable[[str, Any], None]) -> None:
    try:
        write_json(path, data)
    except OSError as exc:
        raise InputError(f"cannot write the report {path}: {exc.strerror or exc}") from None


def _final_problem(final) -> str:
    if final is None:
        return "not compared"
    if final.error:
        return final.error
    worst = final.worst
    return f"output '{worst.name}': max abs {worst.max_abs:.3g}, rel L2 {worst.rel_l2:.3g}; {final.criterion}"


def check(model: onnx.ModelProto | str | os.PathLike, options: FixOptions | None = None, *,
          shapes: bool = False) -> CheckReport:
    """Every constraint violation of ``model`` (a ModelProto, left as it is, or an .onnx path): what
    ``npufix --check`` lists. With ``options.requested`` set, only the requested ones are in ``violations``
    (constraints.split_requested)."""
    from onnx_npu_fix.analysis.constraints import check_model, split_requested

    options = options or FixOptions()
    if isinstance(model, (str, os.PathLike)):
        model = read_model(model).model
    elif not isinstance(model, onnx.ModelProto):
        raise TypeError(f"check() takes an onnx.ModelProto or the path of an .onnx file, not {type(model).__name__}")
    report = check_model(model, options, shapes=shapes)
    report.violations, _ = split_requested(report.violations, options)
    return report


# --- --split: segments that fit the SRAM budget ---------------------------------------------------------


@dataclass
class SplitOutcome:
    """What :func:`split_model` did: the plan, its chained validation, and where the segments went."""

    plan: object  # split.SplitPlan
    directory: str | None = None
    """Where the segments and manifest.json were written (None: nothing written, the plan does not fit)."""
    validation: object | None = None  # validate.Comparison, None when validation is off
    hint: object | None = None  # split.ResolutionHint when a single layer does not fit
    manifest: dict | None = None
    segments: list | None = None
    """The segment models written (for --memory-plot)."""
    note: str | None = None
    """Why the chain was not validated, when onnxruntime cannot run the model itself."""

    @property
    def fits(self) -> bool:
        return bool(self.plan.fits)

    def to_json(self) -> dict:
        return {"directory": self.directory, "manifest": self.manifest, **self.plan.to_json(),
                "validation": self.validation.to_json() if self.validation is not None else None,
                "validation_note": self.note,
                "resolution": self.hint.to_json() if self.hint is not None else None}


def split_model(model: onnx.ModelProto, directory: str | os.PathLike, options: FixOptions) -> SplitOutcome:
    """Cut ``model`` (fixed, with fresh shapes: FixResult.model) into segments that each fit
    ``options.sram_bytes`` (split.plan_split), check each segment's own estimate against the budget, validate
    that running them in order reproduces ``model``'s outputs bit for bit, and write DIR atomically: the
    segments and ``manifest.json`` go to a temporary sibling directory renamed into place at the end.

    When a single layer exceeds the budget nothing is written: the outcome has ``fits`` False, the plan names
    the layers and ``hint`` says which input size would fit. Raises PassFailed (pass name 'split') when the
    chained segments do not reproduce the model, InputError for a bad ``--split-at`` name or directory."""
    import shutil

    from onnx_npu_fix.analysis.memory import estimate
    from onnx_npu_fix.analysis.split import build_segments, plan_split, resolution_hint
    from onnx_npu_fix.ir.graph import GraphIndex
    from onnx_npu_fix.pipeline.validate import CannotRun, validate_chain

    directory = os.fspath(directory)
    check_split_dir(directory)
    plan = plan_split(GraphIndex(model), options.sram_bytes, options.act_bytes, split_at=options.split_at,
                      budget=options.schedule_budget)
    outcome = SplitOutcome(plan)
    if not plan.fits:
        outcome.hint = resolution_hint(model, options.sram_bytes, options.act_bytes)
        return outcome
    segments = build_segments(model, plan)
    for k, (segment, planned) in enumerate(zip(segments, plan.segments)):
        onnx.checker.check_model(segment)
        peak = estimate(segment, options.act_bytes, reorder=False).peak_bytes
        if options.sram_bytes is not None and peak > options.sram_bytes:
            raise PassFailed(f"segment {k} as built peaks at {peak} B, above the budget (planned "
                             f"{planned.peak_bytes} B)", pass_name="split")
        planned.peak_bytes = peak
    if options.validate != "none":
        try:
            outcome.validation = validate_chain(model, segments, n=options.n_inputs, seed=options.seed)
        except CannotRun as exc:
            outcome.note = f"onnxruntime cannot run the model ({exc}), so the chain is not validated"
    if outcome.validation is not None:
        if not outcome.validation.passed:
            worst = outcome.validation.worst
            what = outcome.validation.error or (f"output '{worst.name}' differs by {worst.max_abs:.3g}"
                                                if worst else "outputs differ")
            raise PassFailed(f"the chained segments do not reproduce the model: {what}", pass_name="split")
    width = max(2, len(str(len(segments) - 1)))
    names = [f"segment_{k:0{width}d}.onnx" for k in range(len(segments))]
    manifest = {
        "segments": [{"path": name, "inputs": s.inputs, "outputs": s.outputs, "peak_bytes": s.peak_bytes}
                     for name, s in zip(names, plan.segments)],
        "crossing_bytes": list(plan.crossing_bytes),
    }
    parent = os.path.dirname(os.path.abspath(directory))
    tmp = tempfile.mkdtemp(prefix=".npufix-split-", dir=parent)
    try:
        for name, segment in zip(names, segments):
            save_model(segment, os.path.join(tmp, name))
        write_json(os.path.join(tmp, "manifest.json"), manifest)
        os.chmod(tmp, 0o777 & ~current_umask())
        if os.path.isdir(directory):
            os.rmdir(directory)  # empty (checked above): replaced by the finished directory
        os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    outcome.directory, outcome.manifest, outcome.segments = directory, manifest, segments
    return outcome


def write_memory_plot(model: onnx.ModelProto, path: str | os.PathLike, options: FixOptions, *,
                      split: SplitOutcome | None = None, prepared: bool = True) -> dict:
    """Draw the activation profile of ``model`` (plot.py) to ``path`` (.png / .svg) and its numbers to
    ``path + '.json'``, both atomically. ``prepared``: ``model`` has fresh inferred shapes (FixResult.model);
    otherwise a light analysis copy is made. ``split``: also draw each segment. Returns the numbers.
    Raises InputError (exit 2) when matplotlib is missing."""

    from onnx_npu_fix.analysis.memory import analysis_copy
    from onnx_npu_fix.analysis.plot import check_plot_path, draw, profile_data

    path = os.fspath(path)
    check_plot_path(path)
    if not prepared:
        model, _ = analysis_copy(model, options.input_shapes)
    segments = split.segments if split is not None and split.segments else ()
    cuts = split.plan.cuts if segments else ()
    data = profile_data(model, options.act_bytes, options.sram_bytes, segments=segments, cuts=cuts,
                        budget=options.schedule_budget)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".npufix-plot-", suffix=os.path.splitext(path)[1], dir=directory)
    os.close(fd)
    try:
        draw(data, tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        write_json(path + ".json", data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return data
