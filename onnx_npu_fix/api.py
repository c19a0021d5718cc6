"""The library's façade: :func:`fix`, :func:`check` and :func:`run`, the whole use case as named steps
(plan paths → load → reference → fix → check → split / plot → commit → record).

    outcome = run("in.onnx", "out.onnx", FixOptions(max_dilation=4, align=8), report_path="npufix.json")
    outcome.exit_code    # 0 ok, 1 constraints remain, 3 a pass failed (errors.EXIT_*)

or step by step:

    model = load_model("in.onnx")
    result = fix(model, FixOptions(max_dilation=4, align=8))   # `model` is left as it is
    if result.ok:
        save_model(result.model, "out.onnx")
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx
import onnx.external_data_helper

from onnx_npu_fix import progress
from onnx_npu_fix.analysis.split import SplitOrigin, split_origins
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints import CheckReport, Violation
from onnx_npu_fix.errors import EXIT_OK, EXIT_PASS_FAILED, EXIT_VIOLATIONS, InputError, PassFailed, first_line
from onnx_npu_fix.host import cores
from onnx_npu_fix.io.atomic import Transaction
from onnx_npu_fix.io.external import SpillFile
from onnx_npu_fix.io.load import (  # noqa: F401 - load_model: part of the API
    LoadedModel,
    load_model,
    read_model,
    read_unchanged,
)
from onnx_npu_fix.io.paths import WritePlan
from onnx_npu_fix.io.save import EarlyWrite, save_model, sha256_file, write_json
from onnx_npu_fix.io.serialize import model_bytes
from onnx_npu_fix.ir.graph import TWO_GB, approx_model_bytes, copy_model, infer_shapes, sharing_index
from onnx_npu_fix.ir.weights import has_lazy, spilling
from onnx_npu_fix.passes import DEFAULT_ORDER, PASSES
from onnx_npu_fix.passes.base import Pass
from onnx_npu_fix.pipeline.freeze import FrozenInput, freeze_inputs
from onnx_npu_fix.pipeline.report import FixReport
from onnx_npu_fix.pipeline.scheduler import FixResult, OwnedModel, prepare, run_passes
from onnx_npu_fix.pipeline.segments import SplitOutcome, split_model
from onnx_npu_fix.pipeline.validation.reference import Reference
from onnx_npu_fix.pipeline.validation.runs import segmented

if TYPE_CHECKING:  # imported where used: --check and a plain fixing run never load the judge (nor pay for its imports)
    from onnx_npu_fix.analysis.cost import Cost
    from onnx_npu_fix.judge.command import Judge
    from onnx_npu_fix.judge.forms import JudgeFit
    from onnx_npu_fix.judge.reduce import Reduction


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
    return [plugin_mod.instantiate(cls) for cls in plugin_mod.place(only, skip, loaded, known)]


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


def start_reference(source: LoadedModel | str | os.PathLike, options: FixOptions, *,
                    start: bool = True) -> Reference | None:
    """Start computing the original's outputs on a worker thread, while the passes run (pass the result to
    :func:`fix`, and close it when done; ``start`` False: call its ``start`` once it is held where it will be
    closed, see Reference). ``source``: what :func:`read_model` returned; onnxruntime should only
    see models the onnx checker passed. The reference is the model as read: for a self-contained file,
    onnxruntime loads the file and the bytes read (``source.data``, taken over and let go once hashed) prove that
    it loaded those bytes — a file replaced or removed meanwhile stops the run with InputError (see
    Reference); for a model with external data, the model in memory, serialized now. None when the run
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
        return _reference_of(source.model, start=start)
    path = os.path.abspath(source.path)
    long_graph = segmented(source.model, len(data))
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # onnxruntime only opens UTF-8 paths: it gets the bytes read instead
        return Reference(data, long_graph=long_graph, start=start)
    return Reference(data, read_from=path, identity=source.identity, long_graph=long_graph, start=start,
                     digest=source.digest)


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
    if reference is None:  # (a reference under way has its sessions' thread count: the run's)
        cores.mark()
    if isinstance(model, (str, os.PathLike)):
        source = model if source is None else source
        owned = OwnedModel(read_model(model).model)
    elif isinstance(model, onnx.ModelProto):
        owned = OwnedModel(copy_model(model))
    else:
        raise TypeError(f"fix() takes an onnx.ModelProto or the path of an .onnx file, not {type(model).__name__}"
                        " (export an onnx-graphsurgeon graph with gs.export_onnx first)")
    return _fix_in_place(owned, options, passes, reference=reference, on_serialized=on_serialized, source=source)


def _fix_in_place(owned: OwnedModel, options: FixOptions | None = None,
                  passes: Sequence[Pass] | None = None, *, reference: Reference | None = None,
                  on_serialized: Callable[[bytes], None] | None = None,
                  source: str | os.PathLike | None = None, keep_inputs: bool = False,
                  digest: bytes | None = None) -> FixResult:
    """:func:`fix` on a model nobody else holds (e.g. just read), handed over: the pass manager may replace it
    (scheduler.OwnedModel), so the result is FixResult.model. ``keep_inputs``: FixResult.inputs holds the
    validation inputs (``--save-inputs``). ``digest``: the SHA-256 of ``source`` as read, which a rollback that
    reads it again must find (else that of the bytes the reference read)."""
    from onnx_npu_fix.analysis.cost import model_cost, needs_index

    options = options or FixOptions()
    assert owned.model is not None
    prepare(owned.model, options)
    with sharing_index(owned.model) as shared:  # the index the input's cost table builds, for the passes' finds
        before = _input_cost(owned.model, options)  # the model is edited in place: its cost is taken now
    if not options.freeze_inputs:  # (freezing edits the model)
        owned.index = shared.index  # handed over with the model: the pass manager lets it go with the proto
    del shared
    reload = None if source is None else functools.partial(_read_prepared, os.fspath(source), options,
                                                           digest, reference)
    frozen, own_reference = _freeze(owned.model, options, reference)
    try:
        if own_reference is not None:
            own_reference.start()  # now that the finally below closes it
        result = run_passes(owned, options, list(passes) if passes is not None else select_passes(),
                            reference=reference or own_reference, on_serialized=on_serialized, reload=reload,
                            reference_feeds={name: f.value for name, f in frozen.items()}, keep_inputs=keep_inputs,
                            refusal=functools.partial(target_refusal, options=options))
    finally:
        if own_reference is not None:
            own_reference.close()
    result.report.frozen_inputs = {name: f.to_json() for name, f in frozen.items()}
    if result.ok:
        index = result.graph_index() if needs_index(result.model) else None  # the final check reads it too
        result.report.cost = (before, model_cost(result.model, options.act_bytes, index))
    return result


def _input_cost(model: onnx.ModelProto, options: FixOptions) -> Cost:
    """The cost of the prepared input (input shapes frozen, shapes inferred; not modified). When a conv or an
    activation has no static shape, its MACs and peak come from a copy on which fold-constants has run — the
    shapes the passes see; what stays unknown there is None (analysis/cost.py's docstring)."""
    from onnx_npu_fix.analysis.cost import model_cost
    from onnx_npu_fix.passes.fold_constants import FoldConstantsPass

    cost = model_cost(model, options.act_bytes)
    if not cost.unknown:
        return cost
    work = copy_model(model)
    try:
        FoldConstantsPass().run(work, options)
    except Exception:  # noqa: BLE001 - the pass reports its own failure in the run; here the figure stays unknown
        return cost
    folded = model_cost(work, options.act_bytes)
    cost.conv_macs, cost.peak_bytes, cost.unknown = folded.conv_macs, folded.peak_bytes, folded.unknown
    return cost


# Findings that are no compiler's verdict: an estimate (the compiler may tile), or no constraint of the target.
_NOT_A_REFUSAL = frozenset({"sram", "sram-layer", "shape-inference", "judge"})


def target_refusal(model: onnx.ModelProto, *, options: FixOptions) -> str | None:
    """Why the target rejects ``model`` whatever the passes do — the first violation that counts
    (``split_requested``) and that no pass, option or freeze fixes — or None. The pass manager asks it before an
    approximate change (run_passes' ``refusal``): a target that refuses the model anyway gains nothing from one."""
    from onnx_npu_fix.constraints import check_model, split_requested

    counted, _ = split_requested(check_model(model, options, memory=False, _ask=False).violations, options)
    hard = [v for v in counted if v.fixed_by is None and v.constraint not in _NOT_A_REFUSAL]
    if not hard:
        return None
    more = f" and {len(hard) - 1} more" if len(hard) > 1 else ""
    return f"the target rejects the model anyway ({hard[0].constraint} at {hard[0].node}{more}; no pass fixes it)"


def _freeze(model: onnx.ModelProto, options: FixOptions,
            reference: Reference | None) -> tuple[dict[str, FrozenInput], Reference | None]:
    """``--freeze-input``, a step of the use case before the passes: the inputs become constants (InputError
    for a bad name or value). The reference stays the model *before* freezing, fed the frozen values: with no
    reference from the file (``reference``), the prepared model is serialized before it is frozen, or, when its
    weights are left in the input's data file (ir.weights), written to the reference's scratch copy."""
    if not options.freeze_inputs:
        return {}, None
    original = None
    if reference is None and options.validate != "none" and approx_model_bytes(model) < TWO_GB:
        original = _reference_of(model, start=False)  # taken now: freezing edits the model
    try:
        return _frozen(model, options), original
    except BaseException:
        if original is not None:
            original.close()  # its scratch files with it
        raise


def _reference_of(model: onnx.ModelProto, *, start: bool) -> Reference:
    """The reference of a model in memory (under 2 GB): one whose weights are left in the input's data file
    (ir.weights) written to its scratch copy at once, file to file, never serialized; any other serialized."""
    if has_lazy(model) and not segmented(model):
        return Reference(model, start=start)
    data = model_bytes(model)
    return Reference(data, long_graph=segmented(model, len(data)), start=start)


def _frozen(model: onnx.ModelProto, options: FixOptions) -> dict[str, FrozenInput]:
    """Freeze the inputs of ``model`` and infer its shapes again."""
    frozen = freeze_inputs(model, options.freeze_inputs)
    try:
        infer_shapes(model)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types; all mean the same to the user
        raise InputError(f"shape inference fails once the inputs are frozen: {first_line(exc)}") from None
    return frozen


def _read_prepared(path: str, options: FixOptions, digest: bytes | None = None,
                   reference: Reference | None = None) -> onnx.ModelProto:
    """The input read again (a rollback to it), proven to be the bytes read first (``digest``, else those the
    reference was built from)."""
    if digest is None and reference is not None:
        digest = reference.digest()
    model = read_unchanged(path, digest).model
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
    saved_inputs: dict[str, Any] | None = None
    """``save_inputs``: where the validation inputs went and how many sets (written also when a pass failed)."""
    judge: JudgeFit | None = None
    """``judge``: what the judge said of the output and which forms were tried (judge/forms.py)."""

    @property
    def report(self) -> FixReport | None:
        return self.result.report if self.result is not None else None

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


@dataclass
class _RunState:
    """One call of :func:`run`: its arguments, normalised, and what its steps learn for the record. Every path
    is absolute (made so before any work: a plugin that changes the working directory moves nothing);
    ``given`` keeps the input and output paths as given, for the messages and the record."""

    input_path: str
    output: str | None
    options: FixOptions
    report_path: str | None
    split_dir: str | None
    memory_plot: str | None
    shapes: bool
    wants_record: bool
    """``report_path`` or ``record=True``: the record hashes both models (every weight read), built only when read."""
    command: Sequence[str] | None
    save_inputs: str | None = None
    """Where the validation inputs go, in Polygraphy's JSON (``--save-inputs``)."""
    judge: Judge | None = None
    started: float = field(default_factory=time.perf_counter)
    external: bool = False
    """The input has external data (and so will the output)."""
    read_digest: bytes | None = None
    """The SHA-256 of the bytes read (the reference hashed them): the record names what was processed."""
    files: Transaction = field(default_factory=Transaction)
    """Every file of the run, staged beside its destination; committed together at the end (:func:`_commit`)."""
    split_origins: dict[str, SplitOrigin] = field(default_factory=dict)
    """The ``--split-at`` tensors as read, before the passes renamed any (:func:`split_origins`)."""
    given: tuple[str, str | None] = ("", None)
    """The input and output paths as given."""
    fitted_options: FixOptions | None = None
    """``--judge``: the options of the form the judge accepted (recorded); the output is checked against the
    requested ones (:attr:`options`)."""


def run(input_path: str | os.PathLike, output: str | os.PathLike | None = None,
        options: FixOptions | None = None, *, passes: Sequence[Pass] | None = None,
        report_path: str | os.PathLike | None = None, check: bool = False, shapes: bool = False,
        record: bool = False, command: Sequence[str] | None = None,
        split_dir: str | os.PathLike | None = None, memory_plot: str | os.PathLike | None = None,
        save_inputs: str | os.PathLike | None = None, on_event: Callable[[Any], None] | None = None,
        judge: Judge | None = None) -> RunOutcome:
    """Load ``input_path``, fix it (``passes``, default order unless given), re-check the constraints, write
    ``output`` atomically and the build record to ``report_path``; or with ``check=True`` only check the input.

    Every path is checked before any work (nothing the run writes may be something it reads, or another file
    it writes). Raises InputError (exit 2) for unusable input or paths, and OptionError for bad options;
    a failing pass is not raised: the outcome says so (exit 3, ``error``) and nothing is written.
    ``shapes``: also list every node's shapes (``checked.shapes``). ``record``: build the record even without
    ``report_path``. ``command``: recorded as the command line (default sys.argv).
    ``split_dir``: once fixed, cut the model into segments that each fit ``options.sram_bytes`` and write them
    with ``manifest.json`` there (:func:`split_model`; before the model is saved, so a failed split writes
    nothing). ``memory_plot``: draw the activation profile (:func:`write_memory_plot`). ``save_inputs``: write
    the input sets the run validated with in Polygraphy's JSON (``polygraphy run --load-inputs``), also when a
    pass failed (the case to replay); a fixing run that validates only. ``on_event``: gets the run's
    progress events as they happen (:mod:`onnx_npu_fix.progress`: each pass as it is settled, steps of long
    tasks); the same as running inside ``progress.listening(on_event)``.
    ``judge``: a fixing run's output must be accepted by this judge command; when it is not, the other emission
    forms the passes know are tried on the region it rejects (judge/forms.py) and the first accepted one is
    written; none accepted: the output is written with a ``judge`` violation (exit 1); each judge call is a
    ``progress.JudgeCall`` event.
    """
    if on_event is not None:
        with progress.listening(on_event):
            return run(input_path, output, options, passes=passes, report_path=report_path, check=check,
                       shapes=shapes, record=record, command=command, split_dir=split_dir,
                       memory_plot=memory_plot, save_inputs=save_inputs, judge=judge)
    cores.mark()  # the window in which other processes' use of the cores is measured opens (host/cores.py)
    job = _RunState(_absolute(input_path), _absolute(output), options or FixOptions(), _absolute(report_path),
                    _absolute(split_dir), _absolute(memory_plot), shapes, bool(report_path) or record, command,
                    _absolute(save_inputs), judge, given=(os.fspath(input_path), _fspath(output)))
    if judge is not None and check:
        raise InputError("--judge judges a fixing run's output: use it with -o, not with --check")
    _check_fitting(job.options, check, job.split_dir, job.memory_plot)
    _check_save_inputs(job, check)
    with job.files:  # any exception, KeyboardInterrupt and SIGTERM included, removes every staged file
        if check:
            _write_plan(job).check()
            outcome = _check_input(job)
        else:
            chosen = _plan_fix(job, passes)
            outcome = _fix_and_write(job, chosen)
        _record(job, outcome)
        _commit(job)
    return outcome


def _write_plan(job: _RunState, external_files: Sequence[str] = ()) -> WritePlan:
    """Every path the run reads and will write, in commit order (the saved inputs, the split directory, the
    plot and its sidecar, the output's external data and the output, the report): each must be writable, and no
    two may be one file (io.paths.WritePlan)."""
    plan = WritePlan(job.input_path, external_files)
    if job.options.validation_data:
        plan.reads(job.options.validation_data, "--validation-data")
    if job.save_inputs:
        plan.writes(job.save_inputs, "--save-inputs")
    if job.split_dir:
        plan.writes(job.split_dir, "--split", directory=True)
    if job.memory_plot:
        plan.writes(job.memory_plot, "--memory-plot").writes(job.memory_plot + ".json", "the plot's sidecar",
                                                             probe=False)
    if job.output:
        plan.writes(job.output + ".data", "the output's external data", probe=False).writes(job.output, "-o")
    if job.report_path:
        plan.writes(job.report_path, "--report")
    return plan


def _fspath(path: str | os.PathLike | None) -> str | None:
    return None if path is None else os.fspath(path)


def _absolute(path: str | os.PathLike | None) -> str | None:
    """``path`` made absolute now, before any work (an empty path stays empty, a trailing separator stays: the
    write plan refuses both)."""
    path = _fspath(path)
    if not path:
        return path
    return os.path.abspath(path) + (os.sep if path.endswith(("/", os.sep)) else "")


def _check_input(job: _RunState) -> RunOutcome:
    """``--check``: read the input, list its violations (and draw ``--memory-plot``); nothing else is written."""
    from onnx_npu_fix.constraints import check_model, split_requested

    source = read_model(job.input_path, lazy_weights=True)  # the checks read a few values (ir.weights)
    _write_plan(job, source.external_files).check()
    job.read_digest = source.digest
    checked = check_model(source.model, job.options, shapes=job.shapes)
    counted, others = split_requested(checked.violations, job.options)
    outcome = RunOutcome(EXIT_VIOLATIONS if counted else EXIT_OK, "check", job.given[0], checked=checked,
                         violations=counted, not_requested=others)
    if job.memory_plot:
        _plot(outcome, source.model, job, prepared=False)
    return outcome


def _plan_fix(job: _RunState, passes: Sequence[Pass] | None) -> list[Pass]:
    """Before any work: an output path, the passes, and the paths the run writes (the input's external data is
    only known once it is read: :func:`_load_and_fix` checks again)."""
    if job.output is None:
        raise InputError("missing the output path (where to write the fixed model)")
    chosen = list(passes) if passes is not None else select_passes()
    _write_plan(job).check()
    return chosen


def _fix_and_write(job: _RunState, chosen: list[Pass]) -> RunOutcome:
    """Load → reference → fix → check the output → split / plot → stage the output (written early, while the
    last validation runs, when it can); :func:`run` commits the staged files only if every step succeeds."""
    early, spill = EarlyWrite(job.output), SpillFile()
    try:
        result = _load_and_fix(job, chosen, early, spill)
        outcome = RunOutcome(EXIT_OK, "fix", job.given[0], result=result)
        _save_inputs(job, outcome)  # a failing run too: its inputs are the case to replay
        if not result.ok:
            outcome.exit_code, outcome.error = EXIT_PASS_FAILED, _failure(result.report)
            return outcome
        _check_output(job, outcome)
        if job.judge is not None:
            _fit_judge(job, outcome, chosen)
        _split(job, outcome)
        if job.memory_plot and outcome.error is None:
            _plot(outcome, result.model, job, prepared=True)
        if outcome.error is None:
            _stage_output(job, outcome, early)
    finally:
        early.close()
        spill.close()  # the output's data file, staged, holds what it held
    if outcome.error is None:
        _decide(job, outcome, chosen)
    return outcome


def _load_and_fix(job: _RunState, chosen: list[Pass], early: EarlyWrite, spill: SpillFile) -> FixResult:
    """Read the input, start the reference on it, and run the passes over the model read (nobody else holds
    it: edited in place, no copy). Weights left in the input's data file: those the passes compute go to
    ``spill``."""
    reference = None
    try:
        loaded = read_model(job.input_path, keep_bytes=True, lazy_weights=_weights_may_stay_on_disk(job, chosen))
        # Only a model that passed the onnx checker goes to onnxruntime: malformed graphs can crash it.
        reference = start_reference(loaded, job.options, start=False)
        if reference is not None:
            reference.start()  # now that the finally below closes it
        _write_plan(job, loaded.external_files).check()
        job.external, job.read_digest = bool(loaded.external_files), loaded.digest
        job.split_origins = split_origins(loaded.model.graph, job.options.split_at) if job.split_dir else {}
        owned, loaded = OwnedModel(loaded.model), None  # handed over: nothing here holds the model any more
        with spilling(spill if owned.weights_on_disk else None):
            result = _fix_in_place(owned, job.options, chosen, reference=reference,
                                   on_serialized=None if job.external else early.start, source=job.input_path,
                                   keep_inputs=bool(job.save_inputs), digest=job.read_digest)
    finally:
        if reference is not None:
            reference.close()
    return result


def _weights_may_stay_on_disk(job: _RunState, chosen: list[Pass]) -> bool:
    """Whether the run may leave an external-data input's large weights in their file (ir.weights): every step
    that reads or writes its model knows them, which a judge's candidates, a split's segments and a plugin's
    pass (outside this package) do not."""
    return (job.judge is None and not job.split_dir
            and all(type(p).__module__.startswith("onnx_npu_fix.passes.") for p in chosen))


def _fit_judge(job: _RunState, outcome: RunOutcome, chosen: list[Pass]) -> None:
    """``--judge``: judge the output; when rejected, the first accepted form replaces it (judge/forms.py)."""
    from onnx_npu_fix.judge.forms import fit_judge

    # A candidate's passes and the reduction's folding are the judge's work, not the run's: their pass events
    # would read as a second run in the middle of this one (its judge calls are the progress that counts).
    def refix(options: FixOptions) -> FixResult:  # from the input again (the bytes read), validated as the run is
        with progress.listening(None):
            owned = OwnedModel(read_unchanged(job.input_path, job.read_digest).model)
            return _fix_in_place(owned, options, chosen, source=job.input_path, digest=job.read_digest)

    def prepare_for_reduction(model: onnx.ModelProto) -> onnx.ModelProto:
        # the output's shapes are static already (an --input-shape name may be a frozen input, gone from it)
        with progress.listening(None):
            return _prepared_for_reduction(copy_model(model), dataclasses.replace(job.options, input_shapes={}))

    fit, result, options = _judged(lambda: fit_judge(outcome.result, job.options, job.judge, refix,
                                                     prepare_for_reduction))
    outcome.judge = fit
    if result is not outcome.result:
        # The accepted form's options are recorded; the output is still checked against the requested ones, so
        # that a form that gave up a requested constraint (align 8 -> 0) is reported as violating it.
        outcome.result, job.fitted_options = result, options
        _check_output(job, outcome)


def _judge_violation(fit: JudgeFit) -> Violation:
    """The ``judge`` violation of a run whose judge rejects the output in every form tried."""
    from onnx_npu_fix.constraints import judge_violation

    node, op = (fit.region[0]["name"], fit.region[0]["op"]) if fit.region else ("model", "-")
    return judge_violation(node, op, fit.signature, len(fit.attempts))


def _failure(report: FixReport) -> str:
    """The one-line error of a run whose passes did not produce a valid output."""
    failed = report.failed_pass
    if failed is not None:
        return (f"pass {failed.name} failed: {failed.error}; nothing written "
                f"(--skip {failed.name} to run without it, or --keep-going to roll it back)")
    return f"the output does not match the original ({_final_problem(report.final)}); nothing written"


def _check_output(job: _RunState, outcome: RunOutcome) -> None:
    from onnx_npu_fix.constraints import check_model

    outcome.checked = check_model(outcome.result.model, job.options, shapes=job.shapes, prepared=True,
                                  memory=job.wants_record, index=outcome.result.graph_index())


def _split(job: _RunState, outcome: RunOutcome) -> None:
    """``--split``: the segments, written before the model (a failed split writes nothing)."""
    if not job.split_dir:
        return
    try:
        outcome.split = split_model(outcome.result.model, job.split_dir, job.options, transaction=job.files,
                                    origins=job.split_origins)
    except PassFailed as exc:
        outcome.exit_code, outcome.error = exc.exit_code, f"split failed: {exc}; nothing written"
        return
    except OSError as exc:
        raise InputError(f"cannot write --split {job.split_dir}: {exc.strerror or exc}; nothing written") from None
    if outcome.split.fits and job.options.sram_bytes is not None:
        # Segments that all fit satisfy the budget: the whole model's 'sram' finding is resolved.
        outcome.checked.violations = [v for v in outcome.checked.violations if v.constraint != "sram"]


def _stage_output(job: _RunState, outcome: RunOutcome, early: EarlyWrite) -> None:
    """Stage the output model (the early write, when it holds these bytes)."""
    result = outcome.result
    try:
        save_model(result.model, job.output, external_data=job.external or None, serialized=result.serialized,
                   early=early, transaction=job.files)
    except OSError as exc:
        raise InputError(f"cannot write {job.output}: {exc.strerror or exc}; nothing written") from None


def _commit(job: _RunState) -> None:
    """Every staged file into place, in the order staged (:func:`_write_plan`), after every check passed."""
    try:
        job.files.commit()
    except OSError as exc:
        done = getattr(exc, "npufix_written", [])
        what = (f"{', '.join(done)} renamed into place before the failure and could not be put back, nothing "
                f"else written" if done else "nothing written (the files renamed before it were put back)")
        raise InputError(f"cannot write {exc.filename or 'the run files'}: {exc.strerror or exc}; {what}") from None


def _decide(job: _RunState, outcome: RunOutcome, chosen: list[Pass]) -> None:
    """Written: which violations count, and the exit code they make."""
    from onnx_npu_fix.constraints import split_requested

    outcome.written = job.given[1]
    outcome.violations, outcome.not_requested = split_requested(
        outcome.checked.violations, job.options, [p.name for p in chosen])
    if outcome.judge is not None and not outcome.judge.accepted:  # asked for by --judge itself
        outcome.violations.append(_judge_violation(outcome.judge))
    if outcome.violations or (outcome.split is not None and not outcome.split.fits):
        outcome.exit_code = EXIT_VIOLATIONS


def _record(job: _RunState, outcome: RunOutcome) -> None:
    """The build record (when asked for), written to ``--report``."""
    if job.wants_record:
        from onnx_npu_fix.pipeline.report import build_record

        result = outcome.result
        # A self-contained output is exactly the serialized bytes (save_model writes them as they are).
        written_digest = hashlib.sha256(result.serialized).hexdigest() \
            if outcome.written and not job.external and result.serialized is not None else None
        if outcome.written and written_digest is None:  # hashed where it is staged: committed after the record
            written_digest = sha256_file(job.files.staged_at(job.output))
        outcome.record = build_record(job.given[0], outcome.written, job.fitted_options or job.options,
                                      outcome.report, time.perf_counter() - job.started, outcome.exit_code,
                                      outcome.checked,
                                      job.command, outcome.violations if outcome.checked is not None else None,
                                      outcome.not_requested, job.read_digest.hex() if job.read_digest else None,
                                      written_digest)
        outcome.record["split"] = outcome.split.to_json() if outcome.split is not None else None
        outcome.record["saved_inputs"] = outcome.saved_inputs
        outcome.record["judge"] = outcome.judge.to_json() if outcome.judge is not None else None
    if job.report_path:
        try:
            write_json(job.report_path, outcome.record, transaction=job.files)
        except OSError as exc:
            raise InputError(f"cannot write the report {job.report_path}: {exc.strerror or exc}; "
                             f"nothing written") from None


def _check_fitting(options: FixOptions, check: bool, split_dir: str | None, memory_plot: str | None) -> None:
    """--split / --split-at / --memory-plot make sense together: checked before any work (InputError, exit 2);
    their paths are the write plan's (:func:`_write_plan`)."""
    if options.split_at and not split_dir:
        raise InputError("--split-at needs --split DIR (where the segments go)")
    if split_dir:
        if check:
            raise InputError("--split writes segments: use it in a fixing run (-o), not with --check")
        if options.sram_bytes is None and not options.split_at:
            raise InputError("--split needs --sram SIZE (the budget each segment must fit) or --split-at")
    if memory_plot:
        from onnx_npu_fix.analysis.plot import check_plot_path

        check_plot_path(memory_plot)


def _check_save_inputs(job: _RunState, check: bool) -> None:
    """--save-inputs needs a run that validates, and a .json path that can be written (before any work)."""
    path = job.save_inputs
    if not path:
        return
    if check:
        raise InputError("--save-inputs writes the inputs a fixing run validated with; --check validates nothing")
    if job.options.validate == "none":
        raise InputError("--save-inputs writes the validation inputs; with --validate none there are none")
    if not path.lower().endswith(".json"):
        raise InputError(f"--save-inputs {path}: give a .json file name (Polygraphy's JSON input format)")


def _save_inputs(job: _RunState, outcome: RunOutcome) -> None:
    """Stage the validation inputs in Polygraphy's JSON (committed with the run's other files)."""
    inputs = outcome.result.inputs
    if not job.save_inputs or inputs is None:
        return
    from onnx_npu_fix.io.polygraphy_json import encode_feeds

    try:
        document = encode_feeds(inputs)
    except ValueError as exc:  # np.save without pickle: string (object) inputs have no .npy form
        raise InputError(f"--save-inputs {job.save_inputs}: these inputs cannot be written as .npy arrays "
                         f"({first_line(exc)}); nothing written") from None
    try:
        write_json(job.save_inputs, document, transaction=job.files)
    except OSError as exc:
        raise InputError(f"cannot write --save-inputs {job.save_inputs}: {exc.strerror or exc}; nothing "
                         f"written") from None
    outcome.saved_inputs = {"path": job.save_inputs, "sets": len(inputs), "format": "polygraphy-json"}


def _plot(outcome: RunOutcome, model: onnx.ModelProto, job: _RunState, *, prepared: bool) -> None:
    from onnx_npu_fix.analysis.plot import write_memory_plot

    path = job.memory_plot
    try:
        split = outcome.split
        segments = split.segments if split is not None and split.segments else ()
        write_memory_plot(model, path, job.options, segments=segments, cuts=split.plan.cuts if segments else (),
                          prepared=prepared, transaction=job.files)
    except OSError as exc:
        raise InputError(f"cannot write --memory-plot {path}: {exc.strerror or exc}; nothing written") from None
    outcome.memory_plot = path


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
    from onnx_npu_fix.constraints import check_model, split_requested

    options = options or FixOptions()
    if isinstance(model, (str, os.PathLike)):
        model = read_model(model, lazy_weights=True).model  # read here and gone after: as --check reads it
    elif not isinstance(model, onnx.ModelProto):
        raise TypeError(f"check() takes an onnx.ModelProto or the path of an .onnx file, not {type(model).__name__}")
    report = check_model(model, options, shapes=shapes)
    report.violations, _ = split_requested(report.violations, options)
    return report


# --- npufix reduce: the smallest model a judge still rejects ----------------------------------------------------


@dataclass
class ReduceOutcome:
    """What :func:`reduce` did: the reduction, the files written and the record."""

    exit_code: int
    input_path: str
    reduction: Reduction
    written: str
    """The minimal model's path."""
    min_good: str | None = None
    """Where the nearest passing candidate went (None: not asked for, or the judge passed none)."""
    record: dict[str, Any] | None = None


def reduce(input_path: str | os.PathLike, output: str | os.PathLike, judge: Judge,
           options: FixOptions | None = None, *, min_good: str | os.PathLike | None = None,
           report_path: str | os.PathLike | None = None, shrink: bool = False,
           on_event: Callable[[Any], None] | None = None) -> ReduceOutcome:
    """Reduce the model at ``input_path`` to a minimal one ``judge`` still rejects with the same failure
    (judge/reduce.py) and write it to ``output``; ``min_good``: also the nearest candidate the judge passes, when
    there is one; ``report_path``: the record (judge/record.py). The model is reduced with static shapes
    (``options.input_shapes``) and its constants folded (the fold-constants pass, unvalidated: it is exact);
    ``options`` (a target's, say) also decide which constraints the record names as likely causes.

    Every path is checked before any work and every file is staged and committed together (io.atomic.Transaction).
    Raises InputError (exit 2) for unusable input, paths or a judge that cannot be used (judge.command.JudgeError),
    that passes the model (judge.reduce.NothingToReduce) or times out on it. ``on_event``: gets a
    ``progress.JudgeCall`` per judge call, as :func:`run`'s does."""
    from onnx_npu_fix.judge.record import reduction_record
    from onnx_npu_fix.judge.reduce import reduce_model

    if on_event is not None:
        with progress.listening(on_event):
            return reduce(input_path, output, judge, options, min_good=min_good, report_path=report_path,
                          shrink=shrink)
    started = time.perf_counter()
    options = options or FixOptions()
    given = (os.fspath(input_path), os.fspath(output), _fspath(min_good))
    input_path, output, min_good, report_path = map(_absolute, (input_path, output, min_good, report_path))

    def plan(external_files: Sequence[str] = ()) -> WritePlan:
        paths = WritePlan(input_path, external_files)
        for path, what in ((min_good, "--min-good"), (output, "-o")):
            if path is not None:
                paths.writes(path + ".data", f"the external data of {what}", probe=False).writes(path, what)
        return paths.writes(report_path, "--report") if report_path is not None else paths

    plan().check()
    loaded = read_model(input_path)
    plan(loaded.external_files).check()
    model = _prepared_for_reduction(loaded.model, options)
    reduction = _judged(lambda: reduce_model(model, judge, shrink=shrink))
    outcome = ReduceOutcome(EXIT_OK, given[0], reduction, given[1])
    outcome.record = reduction_record(reduction, options, command=judge.template, input_path=given[0],
                                      output=given[1], min_good=given[2] if reduction.min_good is not None else None,
                                      seconds=time.perf_counter() - started)
    def stage(files: Transaction) -> None:
        if min_good is not None and reduction.min_good is not None:
            save_model(reduction.min_good, min_good, transaction=files)
            outcome.min_good = given[2]
        save_model(reduction.model, output, transaction=files)

    _commit_with_report(stage, output, report_path, outcome.record)
    return outcome


def _commit_with_report(stage: Callable[[Transaction], None], output: str, report_path: str | None,
                        record: dict[str, Any]) -> None:
    """``stage(files)`` then the ``report_path`` record, renamed into place together; a file system error is an
    InputError (exit 2) and nothing is written."""
    try:
        with Transaction() as files:
            stage(files)
            if report_path is not None:
                write_json(report_path, record, transaction=files)
            files.commit()
    except OSError as exc:
        raise InputError(f"cannot write {exc.filename or output}: {exc.strerror or exc}; nothing written") from None


def _judged(loop: Callable[[], Any]) -> Any:
    """``loop()``, a judge loop (reduce, --judge's form search): a file system error on the way is the judge's copy
    of a candidate failing to be written (its scratch directory is in TMPDIR; npufix writes nothing else before
    its commit), an InputError (exit 2) saying so, not a crash."""
    import tempfile

    try:
        return loop()
    except OSError as exc:
        raise InputError(f"cannot write the judge's copy of the model in {tempfile.gettempdir()} "
                         f"({exc.strerror or exc}); nothing written: free space there or set TMPDIR") from None


def _prepared_for_reduction(model: onnx.ModelProto, options: FixOptions) -> onnx.ModelProto:
    """``model`` prepared (static shapes, InputError naming a dynamic input) with its constants folded."""
    from onnx_npu_fix.ir.graph import dynamic_inputs, format_shape
    from onnx_npu_fix.passes.fold_constants import FoldConstantsPass

    prepare(model, options)
    dynamic = dynamic_inputs(model)
    if dynamic:
        name, shape = next(iter(dynamic.items()))
        raise InputError(f"input '{name}' has a dynamic shape {format_shape(shape)}: reduce needs static shapes; "
                         f"give --input-shape {name}:<dims>")
    quiet = dataclasses.replace(options, validate="none")
    result = run_passes(model, quiet, [FoldConstantsPass()])
    if not result.ok:
        raise InputError(f"cannot fold the model's constants before reducing: {_failure(result.report)}")
    infer_shapes(result.model)
    return result.model


# --- npufix probe: learn a compiler's profile from a judge ---------------------------------------------------


@dataclass
class ProbeOutcome:
    """What :func:`probe` did: the result, the profile's text, the files written and the record."""

    exit_code: int
    result: Any
    """judge.probe.prober.ProbeResult"""
    profile: str
    written: str
    record: dict[str, Any]


def probe(output: str | os.PathLike, judge: Judge, *, like: Sequence[str | os.PathLike] = (),
          base_target: str | None = None, input_shapes: dict[str, tuple[int, ...]] | None = None,
          report_path: str | os.PathLike | None = None,
          on_event: Callable[[Any], None] | None = None) -> ProbeOutcome:
    """Probe ``judge`` (judge/probe/) and write the learned profile TOML to ``output`` (and the record to
    ``report_path``) atomically, together. ``like``: probe only what these models hold and what npufix emits for
    them (``input_shapes`` freezes their dynamic inputs); ``base_target``: a profile the learned keys override.

    Raises InputError (exit 2) for unusable input, paths or judge. On KeyboardInterrupt / SIGTERM the partial
    record alone is written (when asked for), and the exception goes on."""
    from onnx_npu_fix.config.targets import load_target, parse_profile
    from onnx_npu_fix.judge import probe as probing

    if on_event is not None:
        with progress.listening(on_event):
            return probe(output, judge, like=like, base_target=base_target, input_shapes=input_shapes,
                         report_path=report_path)
    started = time.perf_counter()
    given, like_given = os.fspath(output), [os.fspath(p) for p in like]
    output, report_path = _absolute(output), _absolute(report_path)
    paths = WritePlan().writes(output, "-o")
    for path in like_given:
        paths.reads(_absolute(path), "a --like model")
    if report_path is not None:
        paths.writes(report_path, "--report")
    paths.check()
    base = load_target(base_target) if base_target is not None else None
    options = FixOptions(input_shapes=dict(input_shapes or {}))
    models = [_prepared_for_reduction(read_model(path).model, options) for path in like_given]
    prober = probing.Prober(judge)
    focus = probing.focus_of(models) if models else probing.full_focus()
    fixing = functools.partial(_fixed_under, models, base) if models else None

    def record() -> dict[str, Any]:
        return probing.probe_record(prober.result, command=judge.template, like=like_given, base_target=base_target,
                                    output=given, seconds=time.perf_counter() - started)
    try:
        result = _judged(lambda: probing.probe(prober, focus, fixing))
        _judge_fixed(prober, models, like_given, base)
    except Exception:
        raise
    except BaseException as exc:  # KeyboardInterrupt, SIGTERM as the CLI raises it, SystemExit
        prober.result.interrupted = True
        if report_path is not None:
            write_json(report_path, record())
            exc.npufix_partial = os.fspath(report_path)  # type: ignore[attr-defined]
        raise
    text = probing.render_profile(result, name=os.path.splitext(os.path.basename(output))[0], command=judge.template,
                                  base=base)
    parse_profile(text, where=given, default_name="learned")  # a profile that does not load is a bug, not written
    outcome = ProbeOutcome(EXIT_OK, result, text, given, record())
    def stage(files: Transaction) -> None:
        with open(files.file(output, suffix=".toml.tmp"), "w", encoding="utf-8") as f:
            f.write(text)

    _commit_with_report(stage, output, report_path, outcome.record)
    return outcome


def _fixed_under(models: Sequence[onnx.ModelProto], base: Any, constraints: dict[str, Any]) -> list[onnx.ModelProto]:
    """``models`` fixed under ``base`` (a TargetProfile or None) with ``constraints`` over it, unvalidated (the
    probe needs their op types only); a model whose fix fails is left out."""
    from onnx_npu_fix.config.targets import TargetProfile, apply_target

    merged = {**(base.constraints if base is not None else {}), **constraints}
    options = apply_target(TargetProfile("probe", "", (), merged), FixOptions(validate="none"))
    fixed = []
    for model in models:
        result = fix(model, options)
        if result.ok:
            fixed.append(result.model)
    return fixed


def _judge_fixed(prober: Any, models: Sequence[onnx.ModelProto], paths: Sequence[str], base: Any) -> None:
    """Each ``--like`` model fixed under the learned profile, judged: the profile's evidence that it works."""
    from onnx_npu_fix.judge.probe import constraints

    learned = constraints(prober.result)
    for path, model in zip(paths, models):
        fixed = _fixed_under([model], base, learned)
        call = prober.ask("fixed_model", {"model": path}, fixed[0]) if fixed else None
        if call is not None:
            prober.result.checks.append({"model": path, "sha256": call.sha256, "verdict": call.verdict.kind,
                                         "signature": call.verdict.signature, "verdict_text": call.verdict.text()})
