"""``npufix MODEL -o OUT --judge CMD``: when the judge rejects npufix's output, try the other
emission forms the passes already know for the region the judge objects to, and keep the first one it accepts.

1. The output is judged. Accepted: done (one judge call).
2. Rejected: it is reduced (judge/reduce.py) to the failing node(s); a reduction that cannot run (the prepared
   output passes, a timeout, an unmatched ``--signature``) leaves the whole output as the region.
3. The region's nodes say which profile keys can change them (:func:`relevant_keys`), from what the passes
   declare (``Pass.forms``, passes/base.py): a node a pass emitted or changed (its name is the changed node's,
   or starts with it and ``/``) names every key of that pass's forms; a node npufix did not rewrite names the
   keys of the facts it matches (a dilated conv under the limit, a 1-D conv, a rank-3 Pad, a ConvTranspose
   stride, a non-nearest Resize, a conv with unaligned channels).
4. Candidates, cheapest first (:func:`candidates`): one key changed, keys by their form's ``cost`` and each key's
   values in the order :func:`_values` gives (a numeric limit: the form's own ``values``, which first make a pass
   rewrite the region's own nodes); then two keys changed (pairs of those single changes, in the same order); at
   most ``MAX_CANDIDATES`` fix runs. Each candidate re-runs the passes from the input with the changed
   options and is validated as usual (the caller's ``refix``; passes never run onnxruntime); one that fails to
   fix or to validate is skipped, unjudged. A candidate whose bytes were judged before costs no call (the
   judge's cache).
5. The first candidate the judge accepts is the result; its record says what changed from the profile's values,
   why (the region's facts) and the profile lines that would make it the default (``remainder_pad = "concat"  #
   judge: <signature>``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.config.options import CHOICES, FixOptions
from onnx_npu_fix.errors import InputError, OptionError
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.judge.command import PASS, Judge, Verdict
from onnx_npu_fix.judge.record import matching_facts, remaining_nodes
from onnx_npu_fix.judge.reduce import Reduction, reduce_model
from onnx_npu_fix.passes.base import Form
from onnx_npu_fix.pipeline.report import FixReport
from onnx_npu_fix.pipeline.scheduler import FixResult


def pass_forms() -> dict[str, tuple[Form, ...]]:
    """pass name -> the forms it declares (``Pass.forms``): which keys choose how it writes what it emits."""
    from onnx_npu_fix.passes import PASSES

    return {name: cls.forms for name, cls in PASSES.items() if cls.forms}


def key_forms() -> dict[str, Form]:
    """profile key -> its declaration, cheapest first (``Form.cost``: the order keys are tried in)."""
    forms = [form for declared in pass_forms().values() for form in declared]
    return {form.key: form for form in sorted(forms, key=lambda form: form.cost)}


MAX_CANDIDATES = 12
"""Fix runs tried at most (each is a full, validated fix)."""

Refix = Callable[[FixOptions], FixResult | None]
"""Fixes the input again with these options: the validated result, or None when the passes or validation fail."""


@dataclass
class Attempt:
    """One candidate: the keys changed (key -> new value) and what came of it."""

    changes: dict[str, Any]
    outcome: str
    """pass | fail: <signature> | timeout | not fixed: <why> (not judged)"""

    def to_json(self) -> dict[str, Any]:
        return {"changes": self.changes, "outcome": self.outcome}


@dataclass
class JudgeFit:
    """What the judge loop did (the build record's ``judge`` object)."""

    command: str
    accepted: bool
    signature: str | None = None
    """The signature of the judge's rejection of the first output (None: accepted at once)."""
    changed: dict[str, dict[str, Any]] = field(default_factory=dict)
    """key -> {from, to, why} of the accepted candidate (empty: the first output was accepted, or none was)."""
    attempts: list[Attempt] = field(default_factory=list)
    reduction: Reduction | None = None
    reduction_error: str | None = None
    region: list[dict[str, Any]] = field(default_factory=list)
    """The reduced model's nodes (record.remaining_nodes) or, without a reduction, nothing."""
    calls: int = 0
    cached: int = 0
    seconds: float = 0.0

    def snippet(self) -> str:
        """The profile lines that make the accepted forms the target's default."""
        return "\n".join(f"{key} = {json.dumps(c['to'])}  # judge: {self.signature}" for key, c in self.changed.items())

    def to_json(self) -> dict[str, Any]:
        r = self.reduction
        return {
            "command": self.command, "accepted": self.accepted, "signature": self.signature,
            "judge_calls": self.calls, "cached": self.cached, "seconds": round(self.seconds, 3),
            "changed": self.changed, "profile_snippet": self.snippet() if self.changed else None,
            "attempts": [a.to_json() for a in self.attempts],
            "reduction": None if r is None else {"nodes_before": r.nodes_before, "nodes_after": r.nodes_after,
                                                 "judge_calls": r.calls, "nodes": self.region},
            "reduction_error": self.reduction_error,
        }


def fit_judge(result: FixResult, options: FixOptions, judge: Judge, refix: Refix,
              prepare_for_reduction: Callable[[onnx.ModelProto], onnx.ModelProto],
              ) -> tuple[JudgeFit, FixResult, FixOptions]:
    """Judge ``result`` (a successful fix with ``options``); when rejected, search the other forms (module
    docstring). Returns the record, and the accepted result with its options (``result`` and ``options`` when
    none was accepted)."""
    start = (judge.calls, judge.cached, judge.seconds)
    fit = JudgeFit(judge.template, accepted=False)
    verdict = judge.judge(_bytes(result))
    _say(judge, "the output", verdict)
    chosen = (result, options)
    if verdict.kind == PASS:
        fit.accepted = True
    else:
        fit.signature = verdict.signature or verdict.text()
        region = _reduce(fit, result.model, judge, prepare_for_reduction)
        why = relevant_keys(region, result.report, options)
        for changes in candidates(why, options, region.graph.node):
            found = _try(fit, changes, options, judge, refix)
            if found is not None:
                fit.accepted = True
                fit.changed = {k: {"from": _plain(getattr(options, k)), "to": _plain(v), "why": why[k]}
                               for k, v in changes.items()}
                chosen = found
                break
    fit.calls, fit.cached = judge.calls - start[0], judge.cached - start[1]
    fit.seconds = judge.seconds - start[2]
    return fit, *chosen


def _reduce(fit: JudgeFit, output: onnx.ModelProto, judge: Judge,
            prepare_for_reduction: Callable[[onnx.ModelProto], onnx.ModelProto]) -> onnx.ModelProto:
    """The reduced region of the rejected output, recorded in ``fit`` (the whole output when it cannot be
    reduced: the reason goes to ``reduction_error``)."""
    try:
        prepared = prepare_for_reduction(output)
        fit.reduction = reduce_model(prepared, judge)
    except InputError as exc:  # JudgeError among them: nothing to reduce, a timeout, no --signature match
        fit.reduction_error = str(exc)
        return output
    fit.signature = fit.reduction.signature
    fit.region = remaining_nodes(fit.reduction.model, FixOptions())
    return fit.reduction.model


def relevant_keys(region: onnx.ModelProto, report: FixReport, options: FixOptions) -> dict[str, str]:
    """The profile keys that can change ``region``'s nodes, each with why (module docstring, step 3)."""
    why: dict[str, str] = {}
    rewritten: dict[str, str] = {}
    for record in report.passes:
        for change in record.changes:
            rewritten.setdefault(change.node, record.name)
    forms = pass_forms()
    index = GraphIndex(region)
    for node in region.graph.node:
        origin = next((rewritten[n] for n in _ancestors(node.name) if n in rewritten), None)
        if origin in forms:
            for form in forms[origin]:
                why.setdefault(form.key, f"{node.name} ({node.op_type}) emitted by {origin}")
            continue
        for key, text in matching_facts(index, node, options):
            why.setdefault(key, f"{node.name}: {text}")
    return why


def _ancestors(name: str) -> list[str]:
    """``name`` and every ``/``-prefix of it: a node a pass emits is named after the node it rewrote."""
    parts = name.split("/")
    return ["/".join(parts[:k]) for k in range(len(parts), 0, -1)]


def candidates(why: dict[str, str], options: FixOptions,
               region: Sequence[onnx.NodeProto] = ()) -> list[dict[str, Any]]:
    """The option changes to try, cheapest first, at most MAX_CANDIDATES (module docstring, step 4); ``region``:
    the nodes of the region the judge rejects (a form's values may depend on them)."""
    singles = [{key: value} for key, form in key_forms().items() if key in why
               for value in _values(form, options, region)]
    pairs = [{**a, **b} for i, a in enumerate(singles) for b in singles[i + 1:] if not set(a) & set(b)]
    valid = []
    for changes in [*singles, *pairs]:
        try:
            dataclasses.replace(options, **changes)
        except OptionError:
            continue
        valid.append(changes)
    return valid[:MAX_CANDIDATES]


def _values(form: Form, options: FixOptions, region: Sequence[onnx.NodeProto]) -> list[Any]:
    """The values of ``form``'s key other than the current one: what the form declares (``Form.values``, from the
    region's nodes), else the other choices of a choice option in their listed order, else the other boolean."""
    current = getattr(options, form.key)
    if form.values is not None:
        return [v for v in form.values(current, region) if v != current]
    if form.key in CHOICES:
        return [v for v in CHOICES[form.key] if v != current and v != "auto"]
    if isinstance(current, bool):
        return [not current]
    return []


def _try(fit: JudgeFit, changes: dict[str, Any], options: FixOptions, judge: Judge,
         refix: Refix) -> tuple[FixResult, FixOptions] | None:
    """Fix again with ``changes`` and judge the result: (result, options) when accepted."""
    changed = dataclasses.replace(options, **changes)
    label = ", ".join(f"{k}={_plain(v)}" for k, v in changes.items())
    try:
        result = refix(changed)
    except Exception as exc:  # noqa: BLE001 - a candidate that cannot be fixed is skipped, like an unbuildable one
        result, reason = None, f"{type(exc).__name__}: {exc}"
    else:
        reason = "the passes or validation failed"
    if result is None or not result.ok:
        fit.attempts.append(Attempt(changes, f"not fixed: {reason}"))
        progress.emit(progress.JudgeCall(f"judge: {label}: not fixed ({reason})"))
        return None
    verdict = judge.judge(_bytes(result))
    _say(judge, label, verdict)
    fit.attempts.append(Attempt(changes, verdict.text()))
    return (result, changed) if verdict.kind == PASS else None


def _bytes(result: FixResult) -> bytes:
    return result.serialized if result.serialized is not None else result.model.SerializeToString()


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _say(judge: Judge, what: str, verdict: Verdict) -> None:
    progress.emit(progress.JudgeCall(f"judge call {judge.calls}: {what} -> {verdict.text()}"))

