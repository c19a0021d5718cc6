"""``npufix MODEL -o OUT --judge CMD``: when the judge rejects npufix's output, try the other
emission forms the passes already know for the region the judge objects to, and keep the first one it accepts.

1. The output is judged. Accepted: done (one judge call).
2. Rejected: it is reduced (judge/reduce.py) to the failing node(s); a reduction that cannot run (the prepared
   output passes, a timeout, an unmatched ``--signature``) leaves the whole output as the region.
3. The region's nodes say which profile keys can change them (:func:`relevant_keys`), from what the passes
   declare (``Pass.forms``, passes/base.py): a node a pass changed or emitted (its name is the changed node's, or
   starts with it and ``/``) names every key of each pass that did; a node of an op type a form emits names that
   form's key, for every pass that changed the model; and a node names the keys of the facts it matches (a
   dilated conv under the limit, a 1-D conv, a rank-3 Pad, a ConvTranspose stride, a non-nearest Resize, a conv
   with unaligned channels, an op type lower-ops can lower).
4. Candidates, cheapest first (:func:`candidates`): one key changed, keys by their form's ``cost`` and each key's
   values in the order :func:`_values` gives (the form's own ``values``, which first make a pass rewrite the
   region's own nodes); then two keys changed; at most ``MAX_CANDIDATES`` fix runs. Each candidate re-runs the
   passes from the input with the changed options and is validated as usual (the caller's ``refix``; passes never
   run onnxruntime); one that fails to fix or to validate is skipped, unjudged. When the run was exact, a
   candidate whose fix is approximate (nearest instead of bilinear) is judged only once every exact one was
   refused (under ``--strict`` never). A candidate the judge refuses for a reason not met before (the change
   fixed the first rejection: a lowered op's own form is refused too) is reduced again, at most
   ``MAX_DEEPENINGS`` times, and the keys of its new region are tried on top of it, after the single changes
   still queued. A candidate whose bytes were judged before costs no call (the judge's cache).
5. The first candidate the judge accepts is the result; its record says what changed from the profile's values,
   why (the region's facts) and the profile lines that would make it the default (``remainder_pad = "concat"  #
   judge: <signature>``); every attempt says what came of it and whether its fix was exact.
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
from onnx_npu_fix.errors import InputChanged, InputError, OptionError, StrictRefused
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.judge.candidates import judge_bytes
from onnx_npu_fix.judge.command import FAIL, PASS, Judge, Verdict
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


MAX_CANDIDATES = 16
"""Fix runs tried at most (each is a full, validated fix)."""
STRICT = "not judged: approximate (--strict)"
"""A candidate whose fix is approximate, under --strict."""
MAX_DEEPENINGS = 2
"""Candidates whose output the judge rejects for another reason that are reduced again, at most: the change fixed
what the judge objected to first, and the new region's keys are tried on top of it."""

Refix = Callable[[FixOptions], FixResult | None]
"""Fixes the input again with these options: the validated result, or None when the passes or validation fail."""


@dataclass
class Attempt:
    """One candidate: the keys changed (key -> new value) and what came of it."""

    changes: dict[str, Any]
    outcome: str
    """pass | fail: <signature> | timeout | not fixed: <why> | deferred: approximate (judged once no exact form is
    accepted) | not judged: approximate (--strict)"""
    exact: bool | None = None
    """Whether the candidate's fix was exact (None: it was not fixed)."""

    def to_json(self) -> dict[str, Any]:
        return {"changes": self.changes, "outcome": self.outcome, "exact": self.exact}


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
        search = _Search(fit, options, judge, refix, prepare_for_reduction, exact_run=not _approximate(result))
        chosen = search.run(region, result.report) or chosen
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
    """The profile keys that can change ``region``'s nodes, each with why (module docstring, step 3): every key of
    each pass that rewrote a node (by name), the keys of the passes that changed the model whose forms emit the
    node's op type, and the keys of the facts the node matches."""
    why: dict[str, str] = {}
    rewritten: dict[str, list[str]] = {}
    for record in report.passes:
        for change in record.changes:
            if record.name not in rewritten.setdefault(change.node, []):
                rewritten[change.node].append(record.name)
    forms = pass_forms()
    changed = [record.name for record in report.passes if record.changes and record.name in forms]
    index = GraphIndex(region)
    for node in region.graph.node:
        origins = [name for n in _ancestors(node.name) for name in rewritten.get(n, ()) if name in forms]
        for origin in dict.fromkeys(origins):
            for form in forms[origin]:
                why.setdefault(form.key, f"{node.name} ({node.op_type}) rewritten by {origin}")
        for name in changed:
            for form in forms[name]:
                if node.op_type in form.emits:
                    why.setdefault(form.key, f"{node.name} ({node.op_type}): a form {name} emits")
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


@dataclass
class _Search:
    """The form search of one rejected output (module docstring, steps 4 and 5): candidates cheapest first, each
    fixed and validated; an approximate one (when the run itself was exact) waits until every exact one was
    refused (under --strict its fix is refused, and it is not judged); a candidate the judge refuses for a reason
    of its own is reduced again (at most MAX_DEEPENINGS times) and the keys of its new region are tried on top of
    it."""

    fit: JudgeFit
    options: FixOptions
    judge: Judge
    refix: Refix
    prepare_for_reduction: Callable[[onnx.ModelProto], onnx.ModelProto]
    exact_run: bool
    fix_runs: int = 0
    deepened: int = 0
    why: dict[str, str] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    signatures: set[str | None] = field(default_factory=set)
    """The rejections met so far: a candidate refused for one of these is not reduced again."""

    def run(self, region: onnx.ModelProto, report: FixReport) -> tuple[FixResult, FixOptions] | None:
        """The accepted (result, options), or None."""
        self.why = relevant_keys(region, report, self.options)
        self.signatures.add(self.fit.signature)
        queue = candidates(self.why, self.options, region.graph.node)
        deferred: list[dict[str, Any]] = []
        while queue and self.fix_runs < MAX_CANDIDATES - len(deferred):  # the deferred keep their fix runs
            # The fewest keys changed first (stable: cheapest first among them): a deeper candidate waits for
            # the single changes still queued.
            changes = queue.pop(min(range(len(queue)), key=lambda k: len(queue[k])))
            found = self._try(changes, deferred, queue)
            if found is not None:
                return found
        for changes in deferred:
            if self.fix_runs < MAX_CANDIDATES and (found := self._try(changes, None, [])) is not None:
                return found
        return None

    def _try(self, changes: dict[str, Any], deferred: list[dict[str, Any]] | None,
             queue: list[dict[str, Any]]) -> tuple[FixResult, FixOptions] | None:
        """Fix again with ``changes`` and judge the result: (result, options) when accepted. ``deferred``: where
        an approximate result goes instead of the judge (None: judge it)."""
        key = json.dumps({k: _plain(v) for k, v in sorted(changes.items())})
        if deferred is not None:  # a deferred candidate comes back once, to be judged
            if key in self.seen:
                return None
            self.seen.add(key)
        changed = dataclasses.replace(self.options, **changes)
        label = ", ".join(f"{k}={_plain(v)}" for k, v in changes.items())
        self.fix_runs += 1
        result, reason = self._refix(changed)
        if reason == STRICT:
            self.fit.attempts.append(Attempt(changes, reason, exact=False))
            return None
        if result is None:
            self.fit.attempts.append(Attempt(changes, f"not fixed: {reason}"))
            progress.emit(progress.JudgeCall(f"judge: {label}: not fixed ({reason})"))
            return None
        exact = not _approximate(result)
        if deferred is not None and self.exact_run and not exact:
            deferred.append(changes)
            self.fit.attempts.append(Attempt(changes, "deferred: approximate", exact=False))
            return None
        verdict = self.judge.judge(_bytes(result))
        _say(self.judge, label, verdict)
        self.fit.attempts.append(Attempt(changes, verdict.text(), exact=exact))
        if verdict.kind == PASS:
            self.fit.accepted = True
            self.fit.changed = {k: {"from": _plain(getattr(self.options, k)), "to": _plain(v),
                                    "why": self.why.get(k, "")} for k, v in changes.items()}
            return result, changed
        if verdict.kind == FAIL and verdict.signature not in self.signatures and self.deepened < MAX_DEEPENINGS:
            self.signatures.add(verdict.signature)
            queue.extend(self._deeper(changes, result))
        return None

    def _refix(self, options: FixOptions) -> tuple[FixResult | None, str]:
        try:
            result = self.refix(options)
        except StrictRefused:  # the candidate's form is approximate, which --strict refuses
            return None, STRICT
        except InputChanged:  # the run's input, not this candidate: the run stops
            raise
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot be fixed is skipped, like an unbuildable one
            return None, f"{type(exc).__name__}: {exc}"
        if result is None or not result.ok:
            return None, "the passes or validation failed"
        return result, ""

    def _deeper(self, changes: dict[str, Any], result: FixResult) -> list[dict[str, Any]]:
        """The candidate ``changes`` fixed the first rejection and met another: its output reduced to the new
        region, whose keys (other than the ones ``changes`` set) are tried on top of it, first."""
        self.deepened += 1
        try:
            region = reduce_model(self.prepare_for_reduction(result.model), self.judge).model
        except InputError:
            region = result.model
        options = dataclasses.replace(self.options, **changes)
        why = relevant_keys(region, result.report, options)
        for key, text in why.items():
            self.why.setdefault(key, text)
        # A key ``changes`` set may change again: its new values are read off the changed options (forbidding
        # one more op: the lowered form's own op was refused too); a key changed back is no change.
        deeper = []
        for more in candidates(why, options, region.graph.node):
            merged = {k: v for k, v in {**changes, **more}.items() if v != getattr(self.options, k)}
            if merged and merged != changes:
                deeper.append(merged)
        return deeper


def _approximate(result: FixResult) -> bool:
    """Whether a pass of ``result``'s run changed the model approximately (measured, not exact)."""
    return any(record.changes and not record.exact for record in result.report.passes)


def _bytes(result: FixResult) -> bytes:
    return judge_bytes(result.model, result.serialized)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _say(judge: Judge, what: str, verdict: Verdict) -> None:
    progress.emit(progress.JudgeCall(f"judge call {judge.calls}: {what} -> {verdict.text()}"))

