"""``--split``: the segments the run writes. Plans the cut (analysis/split.py), builds the segments, checks each
one's own estimate against the budget, validates that running them in order reproduces the model bit for bit, and
stages the directory beside its destination (io.atomic.Transaction: renamed into place with the run's other
files).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from onnx_npu_fix.analysis.memory import estimate
from onnx_npu_fix.analysis.split import (
    ResolutionHint,
    SplitOrigin,
    SplitPlan,
    build_segments,
    plan_split,
    resolution_hint,
    resolve_split_at,
)
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import PassFailed
from onnx_npu_fix.io.atomic import Transaction
from onnx_npu_fix.io.paths import check_split_dir
from onnx_npu_fix.io.save import save_model, write_json
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.pipeline.validation.chain import CannotRun, validate_chain


@dataclass
class SplitOutcome:
    """What :func:`split_model` did: the plan, its chained validation, and where the segments went."""

    plan: SplitPlan
    directory: str | None = None
    """Where the segments and manifest.json were written (None: nothing written, the plan does not fit)."""
    validation: object | None = None  # validation.comparison.Comparison, None when validation is off
    hint: ResolutionHint | None = None
    """When a single layer does not fit: which input size would."""
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


def split_model(model: onnx.ModelProto, directory: str | os.PathLike, options: FixOptions, *,
                transaction: Transaction | None = None,
                origins: dict[str, SplitOrigin] | None = None) -> SplitOutcome:
    """Cut ``model`` (fixed, with fresh shapes: FixResult.model) into segments that each fit
    ``options.sram_bytes`` (:func:`plan_split`), check each segment's own estimate against the budget, validate
    that running them in order reproduces ``model``'s outputs bit for bit, and write DIR atomically
    (io.atomic.atomic_dir): the segments and ``manifest.json`` appear together or not at all.

    When a single layer exceeds the budget nothing is written: the outcome has ``fits`` False, the plan names
    the layers and ``hint`` says which input size would fit. Raises PassFailed (pass name 'split') when the
    chained segments do not reproduce the model, InputError for a bad ``--split-at`` name or directory.
    ``transaction``: the directory is staged there (renamed into place with the run's other files); else now.
    ``origins``: the ``--split-at`` tensors as the model was read (:func:`split_origins`), so that a name a pass
    renamed or folded away still cuts where the user meant."""
    directory = os.fspath(directory)
    check_split_dir(directory)
    cuts = resolve_split_at(model.graph, options.split_at, origins or {})
    plan = plan_split(GraphIndex(model), options.sram_bytes, options.act_bytes, split_at=list(cuts.values()),
                      budget=options.schedule_budget)
    plan.split_at = cuts
    outcome = SplitOutcome(plan)
    if not plan.fits:
        outcome.hint = resolution_hint(model, options.sram_bytes, options.act_bytes)
        return outcome
    segments = build_segments(model, plan)
    _check_segment_peaks(segments, plan, options)
    outcome.validation, outcome.note = _validate_chain(model, segments, options)
    outcome.manifest = _write_segments(directory, segments, plan, transaction)
    outcome.directory, outcome.segments = directory, segments
    return outcome


def _check_segment_peaks(segments: Sequence[onnx.ModelProto], plan: SplitPlan, options: FixOptions) -> None:
    """Each built segment passes the checker and its own estimate fits the budget (recorded in the plan)."""
    for k, (segment, planned) in enumerate(zip(segments, plan.segments)):
        onnx.checker.check_model(segment)
        peak = estimate(segment, options.act_bytes, reorder=False).peak_bytes
        if options.sram_bytes is not None and peak > options.sram_bytes:
            raise PassFailed(f"segment {k} as built peaks at {peak} B, above the budget (planned "
                             f"{planned.peak_bytes} B)", pass_name="split")
        planned.peak_bytes = peak


def _validate_chain(model: onnx.ModelProto, segments: Sequence[onnx.ModelProto],
                    options: FixOptions) -> tuple[object | None, str | None]:
    """The chained segments' comparison with ``model`` (None with validation off) and why it is missing when
    onnxruntime cannot run the model; PassFailed when the chain does not reproduce the model."""
    if options.validate == "none":
        return None, None
    try:
        validation = validate_chain(model, segments, n=options.n_inputs, seed=options.seed)
    except CannotRun as exc:
        return None, f"onnxruntime cannot run the model ({exc}), so the chain is not validated"
    if not validation.passed:
        worst = validation.worst
        what = validation.error or (f"output '{worst.name}' differs by {worst.max_abs:.3g}"
                                    if worst else "outputs differ")
        raise PassFailed(f"the chained segments do not reproduce the model: {what}", pass_name="split")
    return validation, None


def _write_segments(directory: str, segments: Sequence[onnx.ModelProto], plan: SplitPlan,
                    transaction: Transaction | None) -> dict:
    """Stage ``segment_NN.onnx`` and ``manifest.json`` in a temporary sibling of ``directory`` (renamed into
    place by ``transaction``'s commit, or now); returns the manifest."""
    width = max(2, len(str(len(segments) - 1)))
    names = [f"segment_{k:0{width}d}.onnx" for k in range(len(segments))]
    manifest = {
        "segments": [{"path": name, "inputs": s.inputs, "outputs": s.outputs, "peak_bytes": s.peak_bytes}
                     for name, s in zip(names, plan.segments)],
        "crossing_bytes": list(plan.crossing_bytes),
    }
    with Transaction() as own:
        files = transaction if transaction is not None else own
        tmp = files.directory(directory)
        for name, segment in zip(names, segments):
            save_model(segment, os.path.join(tmp, name))
        write_json(os.path.join(tmp, "manifest.json"), manifest)
        if transaction is None:
            own.commit()
    return manifest
