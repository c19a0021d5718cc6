"""What a run did, as data: per-pass records, the final comparison, and their text / JSON renderings.

The JSON layout is documented in README.md ("Build record") and versioned by ``REPORT_VERSION``; add fields
freely, but bump the version when a documented field changes meaning or disappears.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from onnx_npu_fix.passes.base import Change, Rejection
from onnx_npu_fix.validate import Comparison

REPORT_VERSION = 1


@dataclass
class PassRecord:
    name: str
    exact: bool
    status: str = "unchanged"
    """unchanged | validated | not validated | failed | rolled back | error"""
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
            "status": self.status,
            "changes": [c.to_json() for c in self.changes],
            "rejections": [r.to_json() for r in self.rejections],
            "metrics": self.metrics,
            "warnings": self.warnings,
            "validation": self.validation.to_json() if self.validation else None,
            "validated_with": self.validated_with,
            "error": self.error,
            "seconds": round(self.seconds, 4),
            "validate_seconds": round(self.validate_seconds, 4),
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

    @property
    def failed_pass(self) -> PassRecord | None:
        return next((p for p in self.passes if p.status in ("failed", "error")), None)

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
        }


def _fmt_err(comparison: Comparison | None) -> str:
    if comparison is None:
        return ""
    if comparison.error:
        return f"  FAILED: {comparison.error}"
    worst = comparison.worst
    text = f"  max abs {comparison.max_abs:.2e}, max rel {comparison.max_rel:.2e}"
    if worst is not None and len(comparison.outputs) > 1:
        text += f" (worst {worst.name})"
    if not comparison.passed and worst is not None:
        text += f"  FAILED ({comparison.criterion}; would need atol {worst.needed_atol:.2e})"
    return text


def render_pass_line(record: PassRecord) -> str:
    """One line per pass for the stderr summary: name, what changed, validation error, time."""
    kind = "" if record.exact else " [approximate]"
    head = f"{record.name:<16} {record.change_summary()}{kind}"
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
    else:
        tail = ""
    return f"{head}{tail}  {record.seconds + record.validate_seconds:.2f}s"


EXACT_ALTERNATIVE = {"resize-nearest": "--resize-mode exact"}
"""What makes each approximate pass exact instead (named by --strict refusals and the APPROXIMATE line)."""


def approximation_summary(report: FixReport) -> str | None:
    """The summary's loud last line when the output holds approximate changes, e.g.
    ``APPROXIMATE: resize-nearest changed 3 Resize (rel L2 0.18 max) — use --resize-mode exact or --strict``;
    None when every change kept is exact."""
    parts, hints = [], []
    for record in report.passes:
        if record.exact or record.status not in ("validated", "not validated") or not record.changes:
            continue
        approximate = [c for c in record.changes if c.detail.get("exact") is False] or [
            c for c in record.changes if c.action not in ("removed dead node", "removed unused initializer")]
        counts = Counter(c.op for c in approximate)
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
