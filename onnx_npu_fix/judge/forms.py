"""``npufix MODEL -o OUT --judge CMD``: when the judge rejects npufix's output, try the other
emission forms the passes already know for the region the judge objects to, and keep the first one it accepts.

1. The output is judged. Accepted: done (one judge call).
2. Rejected: it is reduced (judge/reduce.py) to the failing node(s); a reduction that cannot run (the prepared
   output passes, a timeout, an unmatched ``--signature``) leaves the whole output as the region.
3. The region's nodes say which profile keys can change them (:func:`relevant_keys`): a node a pass emitted or
   changed (its name is the changed node's, or starts with it and ``/``) names that pass's keys
   (``PASS_KEYS``); a node npufix did not rewrite names the keys of the emission facts it matches
   (judge/record.py ``EMISSION_FACTS``: a dilated conv under the limit, a 1-D conv, a rank-3 Pad, a
   ConvTranspose stride), a non-nearest Resize ``resize_mode``, a conv with unaligned channels ``align``.
4. Candidates, cheapest first (:func:`candidates`): one key changed, keys in ``KEY_ORDER`` and each key's
   values in the order :func:`_values` gives (a numeric limit: first the ones that make a pass rewrite the
   region's own nodes, :func:`region_limits`); then two keys changed (pairs of those single changes, in the same
   order); at most ``MAX_CANDIDATES`` fix runs. Each candidate re-runs the passes from the input with the changed
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.config.options import CHOICES, FixOptions
from onnx_npu_fix.errors import InputError, OptionError
from onnx_npu_fix.ir.graph import GraphIndex, get_attr
from onnx_npu_fix.ir.ops import conv_aligned, conv_channels
from onnx_npu_fix.judge.command import PASS, Judge, Verdict
from onnx_npu_fix.judge.record import EMISSION_FACTS, remaining_nodes
from onnx_npu_fix.judge.reduce import Reduction, reduce_model
from onnx_npu_fix.pipeline.report import FixReport
from onnx_npu_fix.pipeline.scheduler import FixResult

PASS_KEYS: dict[str, tuple[str, ...]] = {
    "dilated-conv": ("remainder_pad", "lift_conv1d", "s2b_layout", "max_dilation"),
    "resize-nearest": ("resize_mode", "allow_convtranspose", "max_convtranspose_stride"),
    "fold-batchnorm": ("bn_standalone",),
    "align-channels": ("align",),
    "fold-pad-conv": ("fold_pad_into_conv",),
}
"""The profile keys that choose the forms each pass emits."""
KEY_ORDER: tuple[str, ...] = ("fold_pad_into_conv", "remainder_pad", "lift_conv1d", "s2b_layout", "max_dilation",
                              "resize_mode", "allow_convtranspose", "max_convtranspose_stride", "bn_standalone",
                              "align")
"""Which key is tried first: the cheapest change first (folding a Pad into its Conv removes a node; a remainder
form touches a few padding nodes; lifting 1-D convs wraps every one in Reshapes; another layout or block size k
rebuilds the whole rewrite; another channel alignment changes every conv)."""
ALIGN = 8
"""The alignment tried for an unaligned conv when the run aligns nothing (``align`` 0)."""
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
        for changes in candidates(why, options, region_limits(region)):
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
    index = GraphIndex(region)
    for node in region.graph.node:
        origin = next((rewritten[n] for n in _ancestors(node.name) if n in rewritten), None)
        if origin in PASS_KEYS:
            for key in PASS_KEYS[origin]:
                why.setdefault(key, f"{node.name} ({node.op_type}) emitted by {origin}")
            continue
        for fact in EMISSION_FACTS:
            if fact.key is None or fact.op != node.op_type:
                continue
            try:
                value = fact.test(index, node)
            except Exception:  # noqa: BLE001 - a fact that cannot be read off a node only offers no alternative
                value = None
            if value is not None:
                why.setdefault(fact.key, f"{node.name}: {fact.describe(value)}")
        if node.op_type == "Resize" and get_attr(node, "mode", b"nearest") not in (b"nearest", "nearest"):
            why.setdefault("resize_mode", f"{node.name}: a non-nearest Resize")
        unaligned = _unaligned(index, node, options.align or ALIGN)
        if unaligned:
            why.setdefault("align", f"{node.name}: {unaligned}")
    return why


def _unaligned(index: GraphIndex, node: onnx.NodeProto, align: int) -> str | None:
    """What is unaligned about a Conv / ConvTranspose's channels (None: nothing, or not a conv)."""
    if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2:
        return None
    weight = index.shape(node.input[1])
    if weight is None:
        return None
    group = get_attr(node, "group", 1)
    c_in, c_out = conv_channels(node.op_type, weight, group)
    if conv_aligned(align, group, c_in, c_out):
        return None
    return f"{node.op_type} channels {c_in} -> {c_out} not multiples of {align}"


def region_limits(region: onnx.ModelProto) -> dict[str, list[int]]:
    """Limits that would make a pass rewrite the region's own nodes: a dilation d -> ``max_dilation`` d - 1
    (dilated-conv rewrites that conv), a ConvTranspose stride s -> ``max_convtranspose_stride`` s // 2."""
    dilations = {max(get_attr(n, "dilations", None) or [1]) for n in region.graph.node if n.op_type == "Conv"}
    strides = {max(get_attr(n, "strides", None) or [1]) for n in region.graph.node if n.op_type == "ConvTranspose"}
    return {"max_dilation": sorted((d - 1 for d in dilations if d > 1), reverse=True),
            "max_convtranspose_stride": sorted((s // 2 for s in strides if s > 1), reverse=True)}


def _ancestors(name: str) -> list[str]:
    """``name`` and every ``/``-prefix of it: a node a pass emits is named after the node it rewrote."""
    parts = name.split("/")
    return ["/".join(parts[:k]) for k in range(len(parts), 0, -1)]


def candidates(why: dict[str, str], options: FixOptions,
               limits: dict[str, list[int]] | None = None) -> list[dict[str, Any]]:
    """The option changes to try, cheapest first, at most MAX_CANDIDATES (module docstring, step 4);
    ``limits``: :func:`region_limits`."""
    limits = limits or {}
    singles = [{key: value} for key in KEY_ORDER if key in why for value in _values(key, options, limits)]
    pairs = [{**a, **b} for i, a in enumerate(singles) for b in singles[i + 1:] if not set(a) & set(b)]
    valid = []
    for changes in [*singles, *pairs]:
        try:
            dataclasses.replace(options, **changes)
        except OptionError:
            continue
        valid.append(changes)
    return valid[:MAX_CANDIDATES]


def _values(key: str, options: FixOptions, limits: dict[str, list[int]]) -> list[Any]:
    """The values of ``key`` other than the current one: the other choices in their listed order; the other
    boolean; for a numeric limit, the region's own limits (:func:`region_limits`, largest first) below the
    current one, then half the current one (another block size k, more ConvTranspose stages); for ``align``,
    ALIGN when the run aligns nothing, else no alignment, then twice the current one."""
    current = getattr(options, key)
    if key in CHOICES:
        return [v for v in CHOICES[key] if v != current and v != "auto"]
    if isinstance(current, bool):
        return [not current]
    if key == "align":
        return [ALIGN] if current == 0 else [0, 2 * current]
    if key in ("max_dilation", "max_convtranspose_stride"):
        below = [v for v in limits.get(key, ()) if v >= 1 and (current is None or v < current)]
        halved = [current // 2] if current is not None and current > 1 else []
        return list(dict.fromkeys([*below, *halved]))
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

