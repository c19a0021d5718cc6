"""What a run did, as data: per-pass records, the final comparison, and their text / JSON renderings.

The JSON layout is documented in docs/record.md and versioned by ``REPORT_VERSION``; add fields
freely, but bump the version when a documented field changes meaning or disappears.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from onnx_npu_fix.io.save import sha256_file
from onnx_npu_fix.ir.graph import format_bytes
from onnx_npu_fix.passes.base import Change, Rejection
from onnx_npu_fix.pipeline.validation.comparison import Comparison, sets_summary
from onnx_npu_fix.pipeline.validation.quantized import quant_summary

REPORT_VERSION = 1
CHECK_VERSION = 1
"""The version of the ``--check --format json`` document (schemas/check.schema.json)."""
SCHEMAS = ("record", "check", "common", "reduce", "probe")
"""The JSON Schemas shipped in the package (``onnx_npu_fix/pipeline/schemas/<name>.schema.json``): the build
record, the --check document, the parts they share, ``npufix reduce``'s record and ``npufix probe``'s."""


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema ``name`` (one of SCHEMAS), as shipped in the package."""
    import json
    from importlib import resources

    if name not in SCHEMAS:
        raise ValueError(f"no schema {name!r}; schemas: {', '.join(SCHEMAS)}")
    text = resources.files("onnx_npu_fix.pipeline").joinpath("schemas", f"{name}.schema.json").read_text("utf-8")
    return json.loads(text)


class PassStatus(str, Enum):
    """A pass's verdict in the build record (``PassRecord.status``); the values are the record's strings, and a
    status compares equal to its string. The pass manager sets it from the pass's outcome (scheduler.Outcome)."""

    UNCHANGED = "unchanged"
    """The pass changed nothing."""
    VALIDATED = "validated"
    """Its change was checked and compared with the model before it (alone, or with ``validated_with``)."""
    NOT_VALIDATED = "not validated"
    """Its change is kept unchecked: --validate final/none, or the run stopped before its group was validated."""
    FAILED = "failed"
    """Its change broke shape inference, the checker, onnxruntime or the tolerance; the run stopped."""
    ROLLED_BACK = "rolled back"
    """It failed or crashed and was undone (--keep-going); ``error`` says why."""
    ERROR = "error"
    """It crashed; the run stopped."""

    def __str__(self) -> str:  # the record's string, also in f-strings (Python 3.12 formats mixed-in enums by name)
        return self.value

    __format__ = str.__format__


@dataclass
class PassRecord:
    name: str
    exact: bool
    status: PassStatus = PassStatus.UNCHANGED
    changes: list[Change] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    validation: Comparison | None = None
    validated_with: list[str] = field(default_factory=list)
    """The passes validated together in one group with this one (empty: validated alone)."""
    error: str | None = None
    seconds: float = 0.0
    validate_seconds: float = 0.0
    quantized_tolerance: bool = False
    """The pass removed a rounding step of a quantized model: exact within quantization steps (PassResult)."""

    def approximate_nodes(self) -> list[str]:
        """The nodes this run of the pass changed approximately: as its result listed them
        (``metrics["approximate_nodes"]``), else those of its changes marked ``detail["exact"]`` False."""
        listed = self.metrics.get("approximate_nodes")
        return list(listed) if listed else [c.node for c in self.changes if c.detail.get("exact") is False]

    def change_summary(self) -> str:
        """'3 removed, 1 folded to constant' — counts per kind of change (dropped initializers counted apart)."""
        counts: dict[str, int] = {}
        dropped = 0
        for change in self.changes:
            if change.action == "removed unused initializer":
                dropped += 1
                continue
            counts[change.action] = counts.get(change.action, 0) + 1
        parts = [f"{n} {action}" for action, n in counts.items()]
        if dropped:
            parts.append(f"{dropped} initializer{'s' if dropped > 1 else ''} dropped")
        return ", ".join(parts) or "no change"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "exact": self.exact,
            "status": str(self.status),
            "changes": [c.to_json() for c in self.changes],
            "rejections": [r.to_json() for r in self.rejections],
            "metrics": self.metrics,
            "warnings": self.warnings,
            "validation": self.validation.to_json() if self.validation else None,
            "validated_with": self.validated_with,
            "error": self.error,
            "seconds": round(self.seconds, 4),
            "validate_seconds": round(self.validate_seconds, 4),
            "quantized_tolerance": self.quantized_tolerance,
        }


@dataclass
class FixReport:
    passes: list[PassRecord] = field(default_factory=list)
    final: Comparison | None = None
    """The output model against the original, over all passes."""
    validation_note: str | None = None
    """Why validation was partial (e.g. the original cannot be run by onnxruntime)."""
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    frozen_inputs: dict[str, Any] = field(default_factory=dict)
    """Graph inputs replaced by constants (--freeze-input): name -> dtype, shape, value or sha256."""
    cost: tuple[Any, Any] | None = None
    """(before, after) cost.Cost of the input and the output model (api.fix fills it when the run succeeded)."""

    @property
    def failed_pass(self) -> PassRecord | None:
        return next((p for p in self.passes if p.status in (PassStatus.FAILED, PassStatus.ERROR)), None)

    @property
    def blocking(self) -> list[tuple[str, Rejection]]:
        return [(p.name, r) for p in self.passes for r in p.rejections if r.blocking]

    def to_json(self) -> dict[str, Any]:
        return {
            "passes": [p.to_json() for p in self.passes],
            "final_validation": self.final.to_json() if self.final else None,
            "validation_note": self.validation_note,
            "warnings": self.warnings,
            "seconds": round(self.seconds, 4),
            "frozen_inputs": self.frozen_inputs,
            "cost": None if self.cost is None else {"before": self.cost[0].to_json(), "after": self.cost[1].to_json()},
        }


GROWTH_SHOWN = 0.10
"""Weight or MAC growth above this fraction is printed on the pass line (it used to be in the JSON only)."""


def growth_note(metrics: dict[str, Any]) -> str:
    """", weights +98% (6.7 MiB -> 13.2 MiB)" / ", MACs +25%" for a pass whose metrics give its weights and MACs
    before and after (dilated-conv), when either grows by more than GROWTH_SHOWN."""
    parts = []
    weights, added = metrics.get("weight_bytes_before"), metrics.get("weight_bytes_added")
    if weights and added and added > GROWTH_SHOWN * weights:
        parts.append(f"weights {100 * added / weights:+.0f}% ({format_bytes(weights)} -> "
                     f"{format_bytes(weights + added)})")
    macs, after = metrics.get("conv_macs_before"), metrics.get("conv_macs_after")
    if macs and after is not None and after - macs > GROWTH_SHOWN * macs:
        parts.append(f"MACs {100 * (after - macs) / macs:+.0f}%")
    return "".join(f", {part}" for part in parts)


def _approximate_changes(record: PassRecord) -> list[Change]:
    """The changes of an approximate pass that approximate: those marked inexact, else every real change (the
    APPROXIMATE line and the pass line count the same ones)."""
    return [c for c in record.changes if c.detail.get("exact") is False] or _real_changes(record)


def _real_changes(record: PassRecord) -> list[Change]:
    """The changes that rewrite something (not the dead nodes and initializers a rewrite left behind)."""
    return [c for c in record.changes if c.action not in ("removed dead node", "removed unused initializer")]


def _approximate_tag(record: PassRecord) -> str:
    """" [approximate]", or " [approximate: 2 of 3]" when some of the pass's changes are exact."""
    real = _real_changes(record)
    approximate = len(_approximate_changes(record))
    return f" [approximate: {approximate} of {len(real)}]" if 0 < approximate < len(real) else " [approximate]"


def scaled_atol_note(comparison: Comparison | None) -> str:
    """Names the bound that passed an output whose relative error alone exceeds rtol (the atol term, scaled to the
    output's magnitude, carried it): "max rel 2.64e-01" must not read as a pass by rtol. Empty otherwise."""
    if comparison is None or not comparison.exact or not comparison.passed or all(
            o.max_rel <= (o.rtol if o.metric else comparison.rtol) for o in comparison.outputs):
        return ""
    needed = max(o.needed_atol for o in comparison.outputs)
    return f" (passed by {comparison.criterion}: atol needed {needed:.2e})"


def _fmt_err(comparison: Comparison | None) -> str:
    if comparison is None:
        return ""
    if comparison.error:
        return f"  FAILED: {comparison.error}"
    worst = comparison.worst
    text = f"  max abs {comparison.max_abs:.2e}, max rel {comparison.max_rel:.2e}{quant_summary(comparison)}"
    text += scaled_atol_note(comparison) + sets_summary(comparison)
    if worst is not None and len(comparison.outputs) > 1:
        text += f" (worst {worst.name})"
    if not comparison.passed and worst is not None:
        needs = (f"would need atol {worst.needed_atol:.2e}" if worst.metric in ("atol_needed", "")
                 else f"{worst.metric.replace('_', ' ')} {worst.value:.3g} > {worst.bound:.3g}")
        text += f"  FAILED ({comparison.criterion}; {needs})"
    return text


def render_pass_line(record: PassRecord) -> str:
    """One line per pass for the stderr summary: name, what changed, validation error, time."""
    kind = "" if record.exact else _approximate_tag(record)
    if record.quantized_tolerance:
        kind = " [quantized rounding changed: measured]"
    head = f"{record.name:<16} {record.change_summary()}{growth_note(record.metrics)}{kind}"
    if record.status == "validated" and record.validation is not None:
        tail = _fmt_err(record.validation)
        if not record.exact and record.validation.outputs:
            worst = max(record.validation.outputs, key=lambda o: o.rel_l2)
            tail += f", rel L2 {worst.rel_l2:.3f}, cosine {worst.cosine:.4f}"
        others = [name for name in record.validated_with if name != record.name]
        if others:
            tail += f" (checked together with {', '.join(others)})"
    elif record.status in ("failed", "rolled back"):
        tail = _fmt_err(record.validation) if record.validation else f"  FAILED: {record.error}"
        if record.status == "rolled back":
            tail += "  (rolled back, --keep-going)"
    elif record.status == "error":
        tail = f"  ERROR: {record.error}"
    elif record.status == "not validated" and record.changes:
        tail = "  (not validated)"
    elif "skipped" in record.metrics:
        tail = f"  skipped: {record.metrics['skipped']}"
    else:
        tail = ""
    return f"{head}{tail}  {record.seconds + record.validate_seconds:.2f}s"


# --- the build record (docs/record.md) ------------------------------------------------------------------


def build_record(model_path: str, output_path: str | None, options: Any, report: FixReport | None,
                 seconds: float, exit_code: int, checked: Any = None,
                 command: Sequence[str] | None = None, counted: Sequence[Any] | None = None,
                 not_requested: Sequence[tuple[Any, str]] = (), input_sha256: str | None = None,
                 output_sha256: str | None = None) -> dict[str, Any]:
    """The build record: what ran (``command``, default sys.argv), on what, with which result. ``report`` is
    None for a check run; ``checked`` the constraint check (constraints.CheckReport) of the output (check mode:
    of the input); ``counted`` / ``not_requested`` its violations that count and the others, with why
    (constraints.split_requested; default: all count). ``input_sha256`` / ``output_sha256``: the digests when the
    caller already has them (of the bytes read, of the bytes written), else the files are hashed."""
    from dataclasses import asdict

    from onnx_npu_fix import __version__
    record: dict[str, Any] = {
        "report_version": REPORT_VERSION,
        "npufix_version": __version__,
        "mode": "fix" if report is not None else "check",
        "command": list(sys.argv if command is None else command),
        "options": asdict(options),
        "input": {"path": model_path, "sha256": input_sha256 or sha256_file(model_path)},
        "output": {"path": output_path, "sha256": output_sha256 or sha256_file(output_path)} if output_path else None,
        "exit_code": exit_code,
        "seconds": round(seconds, 4),
    }
    if report is not None:
        record.update(report.to_json())
        record["seconds"] = round(seconds, 4)  # the run's wall time, not the passes' (a judge's calls count)
    else:  # a check run: same keys, nothing ran
        record.update({"passes": [], "final_validation": None, "validation_note": None, "warnings": [],
                       "frozen_inputs": {}, "cost": None})
    if counted is None and checked is not None:
        counted = checked.violations
    record["violations"] = [v.to_json() for v in counted] if counted is not None else None
    record["not_requested"] = [{**v.to_json(), "reason": why} for v, why in not_requested] \
        if checked is not None else None
    record["exempt"] = [v.to_json() for v in checked.exempt] if checked is not None else None
    record["memory"] = checked.memory.to_json() if checked is not None and checked.memory else None
    return record


EXACT_ALTERNATIVE = {
    "resize-nearest": "--resize-mode exact",
    # Measured on the QDQ U-Net: the fold moved its mask by up to 22 steps; quant_pre_process folds the BN in
    # float before quantizing, and the same model then needs no QDQ fold (0 elements moved).
    "fold-batchnorm": "onnxruntime's quant_pre_process before quantizing (folds BatchNorm in float: exact)",
}
"""What makes each approximate pass exact instead (named by --strict refusals and the APPROXIMATE line)."""


def approximation_summary(report: FixReport) -> str | None:
    """The summary's loud last line when the output holds approximate changes, e.g.
    ``APPROXIMATE: resize-nearest changed 3 Resize (rel L2 0.18 max) — use --resize-mode exact or --strict``;
    None when every change kept is exact."""
    parts, hints = [], []
    for record in report.passes:
        if record.exact or record.status not in ("validated", "not validated") or not record.changes:
            continue
        counts = Counter(c.op for c in _approximate_changes(record))
        parts.append(f"{record.name} changed {', '.join(f'{n} {op}' for op, n in counts.items())}")
        hint = EXACT_ALTERNATIVE.get(record.name)
        if hint and hint not in hints:
            hints.append(hint)
    if not parts:
        return None
    final = report.final
    if final is not None and final.outputs:
        measured = f"rel L2 {max(o.rel_l2 for o in final.outputs):.2g} max"
    else:
        measured = "not measured"
    return f"APPROXIMATE: {'; '.join(parts)} ({measured}) — use {' or '.join([*hints, '--strict'])}"


# --- the --check document (README "Check output"; schemas/check.schema.json) ---------------------------------


def check_entry(path: str, checked: Any, violations: Sequence[Any], not_requested: Sequence[tuple[Any, str]]) -> \
        dict[str, Any]:
    """One model of the --check document: ``checked`` (constraints.CheckReport) with the violations that count
    and the others with why (constraints.split_requested)."""
    data = {"path": path, "error": None, **checked.to_json()}
    data["clean"] = not violations
    data["violations"] = [v.to_json() for v in violations]
    data["not_requested"] = [{**v.to_json(), "reason": why} for v, why in not_requested]
    return data


def check_error_entry(path: str, error: str) -> dict[str, Any]:
    """A model --check could not read: not clean, the reason, empty lists (the same keys as check_entry)."""
    return {"path": path, "error": error, "clean": False, "violations": [], "exempt": [], "memory": None,
            "not_requested": []}


def check_document(models: Sequence[dict[str, Any]], exit_code: int) -> dict[str, Any]:
    """The --check --format json document: one object for one model or many (a script reads ``.models[]``)."""
    from onnx_npu_fix import __version__

    return {"check_version": CHECK_VERSION, "npufix_version": __version__, "exit_code": exit_code,
            "models": list(models)}
