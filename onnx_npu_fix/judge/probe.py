"""``npufix probe``: learn a compiler's limits from a judge command and write them as a target profile.

Each probe is a small model with one op (judge/probe_models.py), checked before it is sent (a model that fails the
onnx checker or strict shape inference is recorded as unbuildable, never judged). A numeric limit is bisected:
the value doubles from 1 while the judge accepts (up to a cap), then a binary search between the last accepted and
the first rejected value finds the largest accepted one. The search assumes the judge's answer is monotone in the
value (every compiler limit the profiles record is a bound). Verdicts are cached by the SHA-256 of the probe's
bytes (judge/command.py): no model is judged twice.

What is probed, and the profile key each fact sets (config/options.py says what the keys mean):

- Conv dilation, depthwise and group 1, 1-D and 2-D -> ``max_dilation`` (the smallest limit: it applies to every
  Conv);
- depthwise ConvTranspose stride (the form of npufix's exact Resize) -> ``max_convtranspose_stride``;
- linear vs nearest Resize -> ``require_nearest_resize``;
- channel counts of a 1x1 Conv (odd ones first; then the multiples of 2, 3, 4, ... up to 16) -> ``align``;
- the kernel of a group-1 Conv (per spatial rank in focus) -> ``max_kernel``;
- the stride of a 3x3 Conv -> ``max_stride``; of a QDQ one, where lower -> ``max_stride_quantized``;
- the rank of a tensor (from 4 up) -> ``max_rank``;
- a 1x1 Conv on two images where one passes -> ``batch_one``;
- a QDQ Conv where the float one passes -> ``allow_qdq``;
- each other op type alone -> ``forbidden_ops``.

With ``--like`` models only what they hold is probed: their op types (each node probed as it occurs in the model:
probe_models.extracted), dilations up to the largest they have, ConvTranspose strides up to the largest stride or
Resize factor; then the models are fixed under the profile learned so far and the op types npufix emitted that the
models did not have (space-to-batch's Reshape / Transpose / Pad, say) are probed as they occur in the fixed model.

A limit the probe cannot decide (a timeout, a rejection at the smallest value) is left out of the profile with a
``[notes]`` line saying why.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.judge import probe_models
from onnx_npu_fix.judge.candidates import unbuildable
from onnx_npu_fix.judge.command import FAIL, PASS, TIMEOUT, Judge, Verdict

DEFAULT_DILATION_CAP = 256
"""Largest dilation tried without a ``--like`` model (the largest in the fixtures' TCNs is 128)."""
DEFAULT_STRIDE_CAP = 16
"""Largest ConvTranspose stride tried without a ``--like`` model."""
DEFAULT_KERNEL_CAP = 16
"""Largest Conv kernel tried without a ``--like`` model."""
DEFAULT_RANK_CAP = 6
"""Largest tensor rank tried without a ``--like`` model."""
RANK_START = 4
"""The tensor-rank search starts here: every NPU compiler takes rank-4 tensors, and a rank-1 or rank-2 Relu says
little about the ranks a model's activations have."""
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul"})
"""Op types that make a model quantized (the QDQ probes run for it)."""
ALIGN_SCAN = 16
"""The largest channel alignment (and channel count) the alignment probe tries."""
LIMIT_OPS = frozenset({"Conv", "ConvTranspose", "Resize"})
"""Op types whose support the limit probes decide (their smallest value is the op's own probe)."""
NOT_PROBED = frozenset({"Constant", "Identity"})
"""Op types not probed alone: a model of one constant (or of a copy) says nothing about the compiler."""


@dataclass(frozen=True)
class Call:
    """One judge call (cache hits are not calls): the probe, its parameters, the model's SHA-256, the verdict."""

    probe: str
    params: dict[str, Any]
    sha256: str
    verdict: Verdict

    def evidence(self) -> str:
        what = self.verdict.text()
        return f"sha256 {self.sha256[:12]}, {what}"

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "params": self.params, "sha256": self.sha256, "verdict": self.verdict.kind,
                "signature": self.verdict.signature, "exit_code": self.verdict.exit_code,
                "seconds": round(self.verdict.seconds, 3)}


@dataclass(frozen=True)
class Bracket:
    """A bisected limit: the largest accepted and the smallest rejected value (None: none seen), and why the
    search stopped short (``undecided``: a timeout, a rejection at 1)."""

    probe: str
    accepted: Call | None
    rejected: Call | None
    value: int | None
    cap: int
    undecided: str | None = None

    def evidence(self, key: str) -> str:
        sample = self.accepted or self.rejected
        fixed = ", ".join(f"{k} {v}" for k, v in sample.params.items() if k != key) if sample else ""
        parts = [f"probe {self.probe}" + (f" ({fixed})" if fixed else "")]
        if self.accepted is not None:
            parts.append(f"{self.accepted.params[key]} accepted ({self.accepted.evidence()})")
        if self.rejected is not None:
            parts.append(f"{self.rejected.params[key]} rejected ({self.rejected.evidence()})")
        return "; ".join(parts)


@dataclass
class Learned:
    """One profile key the probe set, with its evidence (a one-line comment)."""

    key: str
    value: Any
    evidence: str


@dataclass
class ProbeResult:
    """What :func:`probe` learned and how."""

    learned: dict[str, Learned] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    unbuildable: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    """The --like models fixed under the learned profile, each judged: model, sha256, verdict, signature."""
    cached: int = 0
    judge_seconds: float = 0.0
    interrupted: bool = False


class Prober:
    """Sends probe models to a judge and keeps every call (the report), the cache hits and the unbuildable ones."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.result = ProbeResult()
        self.started = time.perf_counter()
        self._seen: dict[str, Call] = {}

    def ask(self, probe: str, params: dict[str, Any], model: onnx.ModelProto) -> Call | None:
        """The judge's call on ``model`` (a cached one when these bytes were judged before); None when the model
        cannot be built (recorded with the reason, never sent)."""
        reason = unbuildable(model)
        if reason is not None:
            self.result.unbuildable.append({"probe": probe, "params": params, "reason": reason})
            progress.emit(progress.JudgeCall(f"probe {probe} {_params_text(params)}: not built ({reason})"))
            return None
        data = model.SerializeToString()
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._seen:
            self.result.cached += 1
            return self._seen[digest]
        verdict = self.judge.judge(data)
        call = Call(probe, params, digest, verdict)
        self._seen[digest] = call
        self.result.calls.append(call)
        self.result.judge_seconds += verdict.seconds
        progress.emit(progress.JudgeCall(
            f"judge call {len(self.result.calls)}: {probe} {_params_text(params)} -> {verdict.text()}  "
            f"({time.perf_counter() - self.started:.1f}s)"))
        return call

    def bisect(self, probe: str, key: str, build: Callable[[int], onnx.ModelProto], cap: int,
               fixed: dict[str, Any], start: int = 1) -> Bracket:
        """The largest value of ``key`` in ``start``..``cap`` the judge accepts (module docstring)."""
        def ask(value: int) -> Call | None:
            return self.ask(probe, {**fixed, key: value}, build(value))

        accepted = rejected = None
        value = start
        while True:
            call = ask(value)
            stop = _stop_reason(call, value, accepted)
            if stop is not None:
                return Bracket(probe, accepted, rejected, None, cap, stop)
            if call.verdict.kind == PASS:
                accepted = call
                if value >= cap:
                    return Bracket(probe, accepted, None, None, cap)
                value = min(2 * value, cap)
            else:
                rejected = call
                break
        while rejected.params[key] - accepted.params[key] > 1:
            middle = (accepted.params[key] + rejected.params[key]) // 2
            call = ask(middle)
            if call is None or call.verdict.kind == TIMEOUT:
                return Bracket(probe, accepted, rejected, None, cap, _undecided(call, middle))
            accepted, rejected = (call, rejected) if call.verdict.kind == PASS else (accepted, call)
        return Bracket(probe, accepted, rejected, accepted.params[key], cap)


def _stop_reason(call: Call | None, value: int, accepted: Call | None) -> str | None:
    if call is None or call.verdict.kind == TIMEOUT:
        return _undecided(call, value)
    if call.verdict.kind == FAIL and accepted is None:
        return f"rejected already at {value} ({call.evidence()})"
    return None


def _undecided(call: Call | None, value: int) -> str:
    if call is None:
        return f"the probe at {value} could not be built"
    return f"the judge timed out at {value} ({call.evidence()})"


def _params_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


# --- what to probe -------------------------------------------------------------------------------------------


@dataclass
class Focus:
    """What the probe covers: dilation caps per (depthwise, rank), the ConvTranspose stride cap (0: none), Resize,
    and the op types to probe alone with an example node of each (None: a probe_models.single_op model); the
    largest Conv kernel per spatial rank, the largest Conv stride (of a quantized model's Convs: ``qdq_stride_cap``),
    the largest tensor rank, and whether the models are quantized (QDQ)."""

    dilation_caps: dict[tuple[bool, int], int]
    stride_cap: int
    resize: bool
    conv: bool
    ops: dict[str, tuple[onnx.ModelProto, onnx.NodeProto] | None]
    kernel_caps: dict[int, int] = field(default_factory=dict)
    conv_stride_cap: int = 0
    rank_cap: int = 0
    qdq: bool = False
    qdq_stride_cap: int = 0


def full_focus() -> Focus:
    """Without ``--like``: every limit to its default cap, every op of probe_models.SINGLE_OPS."""
    caps = {(dw, rank): DEFAULT_DILATION_CAP for dw in (True, False) for rank in (1, 2)}
    return Focus(caps, DEFAULT_STRIDE_CAP, True, True,
                 {op: None for op in probe_models.SINGLE_OPS if op not in NOT_PROBED},
                 kernel_caps={2: DEFAULT_KERNEL_CAP}, conv_stride_cap=DEFAULT_STRIDE_CAP, rank_cap=DEFAULT_RANK_CAP,
                 qdq=True, qdq_stride_cap=DEFAULT_STRIDE_CAP)


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _ordinariness(node: onnx.NodeProto) -> int:
    """How unusual a node's attributes are (the example of an op type is its most ordinary node)."""
    return sum(abs(v) for a in node.attribute if a.type == onnx.AttributeProto.INTS for v in a.ints)


def focus_of(models: Sequence[onnx.ModelProto]) -> Focus:
    """What ``models`` (static shapes, inferred) hold (module docstring)."""
    focus = Focus({}, 0, False, False, {})
    for model in models:
        shapes = {v.name: len(v.type.tensor_type.shape.dim) for v in
                  list(model.graph.value_info) + list(model.graph.input)}
        focus.rank_cap = max(focus.rank_cap, *shapes.values(), 0)
        quantized = any(node.op_type in QDQ_OPS for node in model.graph.node)
        focus.qdq = focus.qdq or quantized
        for node in model.graph.node:
            _note_node(focus, model, node, shapes)
            if quantized and node.op_type == "Conv":
                focus.qdq_stride_cap = max(focus.qdq_stride_cap, max(_attribute(node, "strides", [1]) or [1]))
    return focus


def _note_node(focus: Focus, model: onnx.ModelProto, node: onnx.NodeProto, ranks: dict[str, int]) -> None:
    op = node.op_type
    if op == "Conv":
        focus.conv = True
        rank = ranks.get(node.input[0], 3) - 2
        dilation = max(_attribute(node, "dilations", [1]) or [1])
        depthwise = _attribute(node, "group", 1) > 1
        key = (depthwise, 1 if rank <= 1 else 2)
        focus.dilation_caps[key] = max(focus.dilation_caps.get(key, 1), dilation)
        kernel = max(_attribute(node, "kernel_shape", [1]) or [1])
        focus.kernel_caps[key[1]] = max(focus.kernel_caps.get(key[1], 1), kernel)
        focus.conv_stride_cap = max(focus.conv_stride_cap, max(_attribute(node, "strides", [1]) or [1]))
    elif op == "ConvTranspose":
        focus.stride_cap = max(focus.stride_cap, max(_attribute(node, "strides", [1]) or [1]))
    elif op == "Resize":
        focus.resize = True
        focus.stride_cap = max(focus.stride_cap, 2)
    if op in LIMIT_OPS or op in NOT_PROBED or node.domain not in ("", "ai.onnx"):
        return
    known = focus.ops.get(op)
    if known is None or _ordinariness(node) < _ordinariness(known[1]):
        focus.ops[op] = (model, node)


# --- the probes ----------------------------------------------------------------------------------------------


def probe_dilations(prober: Prober, focus: Focus, result: ProbeResult) -> None:
    """``max_dilation``: the smallest bisected dilation limit over the (depthwise, rank) pairs in focus."""
    brackets = []
    for (depthwise, rank), cap in sorted(focus.dilation_caps.items(), reverse=True):
        if cap <= 1:
            continue
        name = f"{'depthwise' if depthwise else 'group1'}_conv{rank}d_dilation"
        fixed = {"channels": probe_models.CHANNELS, "kernel": probe_models.KERNEL}
        bracket = prober.bisect(name, "dilation", lambda d, dw=depthwise, r=rank: probe_models.dilated_conv(
            depthwise=dw, rank=r, dilation=d), cap, fixed)
        _record_bracket(bracket, "dilation", result)
        brackets.append(bracket)
    limits = [b for b in brackets if b.value is not None]
    if limits:
        lowest = min(limits, key=lambda b: b.value)
        others = "; ".join(f"{b.probe} {b.value}" for b in limits if b is not lowest)
        evidence = lowest.evidence("dilation") + (f"; other limits: {others}" if others else "")
        result.learned["max_dilation"] = Learned("max_dilation", lowest.value, evidence)


def _record_bracket(bracket: Bracket, key: str, result: ProbeResult) -> None:
    """A note for a bracket that sets no key: why it could not, or that every value up to the cap passed."""
    if bracket.undecided is not None:
        result.notes[bracket.probe] = f"not decided: {bracket.undecided}"
    elif bracket.value is None:
        result.notes[bracket.probe] = (f"every {key} up to {bracket.cap} accepted (the cap of this probe); "
                                       f"{bracket.evidence(key)}")


def probe_convtranspose(prober: Prober, focus: Focus, result: ProbeResult) -> None:
    """``max_convtranspose_stride`` from the depthwise ConvTranspose stride bisection."""
    if focus.stride_cap <= 1:
        return
    fixed = {"channels": probe_models.CHANNELS, "kernel": "2*stride"}
    bracket = prober.bisect("depthwise_convtranspose_stride", "stride",
                            lambda s: probe_models.conv_transpose(stride=s), focus.stride_cap, fixed)
    _record_bracket(bracket, "stride", result)
    if bracket.value is not None:
        result.learned["max_convtranspose_stride"] = Learned("max_convtranspose_stride", bracket.value,
                                                             bracket.evidence("stride"))


def _learn_bracket(result: ProbeResult, profile_key: str, bracket: Bracket, key: str) -> None:
    _record_bracket(bracket, key, result)
    if bracket.value is not None:
        result.learned[profile_key] = Learned(profile_key, bracket.value, bracket.evidence(key))


def probe_kernels(prober: Prober, focus: Focus, result: ProbeResult) -> None:
    """``max_kernel``: the largest group-1 Conv kernel (k on every axis) accepted, the smallest over the spatial
    ranks in focus."""
    for rank, cap in sorted(focus.kernel_caps.items()):
        if cap <= 1:
            continue
        bracket = prober.bisect(f"conv{rank}d_kernel", "kernel", lambda k, r=rank: probe_models.conv(
            kernel=k, rank=r), cap, {"channels": probe_models.CHANNELS, "stride": 1})
        _record_bracket(bracket, "kernel", result)
        known = result.learned.get("max_kernel")
        if bracket.value is not None and (known is None or bracket.value < known.value):
            result.learned["max_kernel"] = Learned("max_kernel", bracket.value, bracket.evidence("kernel"))


def probe_strides(prober: Prober, focus: Focus, result: ProbeResult) -> None:
    """``max_stride``: the largest Conv stride accepted (a 3x3 group-1 Conv); ``max_stride_quantized``: the same
    of a QDQ Conv, set only where it is below the float one (config/options.py)."""
    if focus.conv_stride_cap > 1:
        bracket = prober.bisect("conv2d_stride", "stride", lambda s: probe_models.conv(stride=s),
                                focus.conv_stride_cap, {"channels": probe_models.CHANNELS, "kernel": 3})
        _learn_bracket(result, "max_stride", bracket, "stride")
    if focus.qdq_stride_cap > 1:
        bracket = prober.bisect("qdq_conv2d_stride", "stride", lambda s: probe_models.qdq_conv(stride=s),
                                focus.qdq_stride_cap, {"channels": probe_models.CHANNELS, "kernel": 3})
        _record_bracket(bracket, "stride", result)
        float_limit = result.learned.get("max_stride")
        below = float_limit is None or (bracket.value is not None and bracket.value < float_limit.value)
        if bracket.value is not None and below:
            result.learned["max_stride_quantized"] = Learned("max_stride_quantized", bracket.value,
                                                             bracket.evidence("stride"))


def probe_rank(prober: Prober, focus: Focus, result: ProbeResult) -> None:
    """``max_rank``: the largest rank of a tensor (a Relu's input) accepted, from :data:`RANK_START` up to the
    largest rank in focus (nothing to learn when no tensor has more than :data:`RANK_START` axes)."""
    if focus.rank_cap <= RANK_START:
        return
    bracket = prober.bisect("tensor_rank", "rank", lambda r: probe_models.ranked(rank=r), focus.rank_cap,
                            {"op": "Relu"}, start=RANK_START)
    _learn_bracket(result, "max_rank", bracket, "rank")


def _both(prober: Prober, probe: str, models: dict[Any, tuple[dict[str, Any], onnx.ModelProto]],
          result: ProbeResult) -> dict[Any, Call] | None:
    """The calls on a pair of probe models (the form without and with what is probed), or None with a note when
    either gives no verdict to learn from."""
    calls = {form: prober.ask(probe, params, model) for form, (params, model) in models.items()}
    if any(c is None or c.verdict.kind == TIMEOUT for c in calls.values()):
        said = ", ".join(f"{form}: {c.evidence() if c else 'not built'}" for form, c in calls.items())
        result.notes[probe] = f"not decided: {said}"
        return None
    return calls


def probe_batch(prober: Prober, focus: Focus, result: ProbeResult) -> None:
    """``batch_one``: true when a 1x1 Conv on one image passes and on two fails, false when both pass (space-to-
    batch's batch layout and batched models need batch > 1)."""
    if not focus.conv:
        return
    channels = probe_models.CHANNELS
    forms = {batch: ({"channels": channels, "batch": batch}, probe_models.pointwise_conv(channels=channels,
                                                                                         batch=batch))
             for batch in (1, 2)}
    calls = _both(prober, "batch", forms, result)
    if calls is None:
        return
    one, two = calls[1], calls[2]
    if one.verdict.kind != PASS:
        result.notes["batch"] = f"not decided: batch 1 rejected ({one.evidence()})"
        return
    refused = two.verdict.kind == FAIL
    result.learned["batch_one"] = Learned("batch_one", refused, f"probe batch: 1x1 Conv on one image accepted "
                                          f"({one.evidence()}), on two {'rejected' if refused else 'accepted'} "
                                          f"({two.evidence()})")


def probe_qdq(prober: Prober, focus: Focus, result: ProbeResult) -> None:
    """``allow_qdq``: whether a QDQ Conv is accepted, decided only where the same float Conv is."""
    if not focus.qdq:
        return
    forms = {"float": ({"kernel": 3, "stride": 1}, probe_models.conv()),
             "qdq": ({"kernel": 3, "stride": 1, "quantized": "qdq"}, probe_models.qdq_conv())}
    calls = _both(prober, "qdq_conv", forms, result)
    if calls is None:
        return
    if calls["float"].verdict.kind != PASS:
        result.notes["qdq_conv"] = f"not decided: the float Conv is rejected ({calls['float'].evidence()})"
        return
    qdq = calls["qdq"]
    result.learned["allow_qdq"] = Learned("allow_qdq", qdq.verdict.kind == PASS, f"probe qdq_conv: the QDQ 3x3 Conv "
                                          f"{'accepted' if qdq.verdict.kind == PASS else 'rejected'} "
                                          f"({qdq.evidence()}), the float one accepted ({calls['float'].evidence()})")


def probe_resize(prober: Prober, focus: Focus, result: ProbeResult) -> None:
    """``require_nearest_resize``: false when a linear Resize passes, true when it fails and nearest passes."""
    if not focus.resize:
        return
    calls = {form: prober.ask("resize", {"form": form, "factor": 2}, probe_models.resize(form=form))
             for form in probe_models.RESIZE_FORMS}
    linear, nearest = calls["linear"], calls["nearest"]
    if linear is not None and linear.verdict.kind == PASS:
        result.learned["require_nearest_resize"] = Learned(
            "require_nearest_resize", False, f"probe resize linear half_pixel x2 accepted ({linear.evidence()})")
    elif (linear is not None and linear.verdict.kind == FAIL and nearest is not None
          and nearest.verdict.kind == PASS):
        result.learned["require_nearest_resize"] = Learned(
            "require_nearest_resize", True, f"probe resize linear half_pixel x2 rejected ({linear.evidence()}); "
                                            f"nearest asymmetric floor x2 accepted ({nearest.evidence()})")
    else:
        said = ", ".join(f"{form}: {c.evidence() if c else 'not built'}" for form, c in calls.items())
        result.notes["resize"] = f"not decided: neither form gives a verdict to learn from ({said})"


def probe_align(prober: Prober, focus: Focus, result: ProbeResult) -> None:
    """``align``: 0 when odd channel counts pass; else the smallest a in 2..16 all of whose multiples up to 16
    pass (align-channels pads every count to a multiple of a), asking each a's multiples until one fails."""
    if not focus.conv:
        return

    def ask(channels: int) -> Call | None:
        return prober.ask("pointwise_conv_channels", {"channels": channels, "kernel": 1},
                          probe_models.pointwise_conv(channels=channels))

    odd = [ask(c) for c in (3, 7)]
    if all(c is not None and c.verdict.kind == PASS for c in odd):
        result.learned["align"] = Learned("align", 0, "probe pointwise_conv_channels: 3 and 7 channels accepted ("
                                          + "; ".join(c.evidence() for c in odd) + ")")
        return
    refused: list[Call] = [c for c in odd if c is not None and c.verdict.kind == FAIL]
    for align in range(2, ALIGN_SCAN + 1):
        calls = []
        for channels in range(align, ALIGN_SCAN + 1, align):
            call = ask(channels)
            if call is None or call.verdict.kind == TIMEOUT:
                result.notes["align"] = f"not decided: the probe of {channels} channels " + (
                    "could not be built" if call is None else f"timed out ({call.evidence()})")
                return
            calls.append(call)
            if call.verdict.kind == FAIL:
                refused.append(call)
                break
        else:
            counts = ", ".join(str(c.params["channels"]) for c in calls)
            below = min(refused, key=lambda c: c.params["channels"])
            result.learned["align"] = Learned(
                "align", align, f"probe pointwise_conv_channels: {counts} channels accepted ({calls[0].evidence()}); "
                                f"{below.params['channels']} rejected ({below.evidence()})")
            return
    result.notes["align"] = f"not decided: no alignment up to {ALIGN_SCAN} has all its channel counts accepted"


def probe_ops(prober: Prober, ops: dict[str, tuple[onnx.ModelProto, onnx.NodeProto] | None],
              result: ProbeResult, *, source: str) -> None:
    """``forbidden_ops``: the op types whose model alone the judge rejects (added to what is already learned).
    Quantization ops are left to ``allow_qdq`` where the QDQ probe decided it: a compiler that refuses quantized
    models is a ``quantized-input`` violation, not one to lower Q/DQ for (forbidding them would make every pass
    that keeps a model's QDQ units refuse to emit)."""
    forbidden = dict(result.learned.get("forbidden_ops", Learned("forbidden_ops", {}, "")).value)
    if "allow_qdq" in result.learned:
        ops = {op: example for op, example in ops.items() if op not in QDQ_OPS}
    for op, example in sorted(ops.items()):
        call = _ask_op(prober, op, example, source)
        if call is None:
            continue
        if call.verdict.kind == TIMEOUT:
            result.notes[f"op_{op}"] = f"not decided: the judge timed out on {op} alone ({call.evidence()})"
        elif call.verdict.kind == FAIL:
            forbidden[op] = f"{op} ({source}): {call.evidence()}"
    if forbidden:
        evidence = "probe op alone: " + "; ".join(forbidden.values())
        result.learned["forbidden_ops"] = Learned("forbidden_ops", forbidden, evidence)


def _ask_op(prober: Prober, op: str, example: tuple[onnx.ModelProto, onnx.NodeProto] | None,
            source: str) -> Call | None:
    if example is None:
        return prober.ask("op", {"op": op, "from": source}, probe_models.single_op(op))
    model, node = example
    try:
        alone = probe_models.extracted(model, node)
    except ValueError as exc:
        prober.result.unbuildable.append({"probe": "op", "params": {"op": op, "node": node.name}, "reason": str(exc)})
        return None
    return prober.ask("op", {"op": op, "from": source, "node": node.name}, alone)


def probe(prober: Prober, focus: Focus,
          fixed_outputs: Callable[[dict[str, Any]], Iterable[onnx.ModelProto]] | None = None) -> ProbeResult:
    """Run every probe ``focus`` asks for; with ``fixed_outputs`` (``--like``: the models fixed under a profile's
    constraints), then the op types npufix emits for them that they did not hold."""
    result = prober.result
    probe_dilations(prober, focus, result)
    probe_convtranspose(prober, focus, result)
    probe_resize(prober, focus, result)
    probe_align(prober, focus, result)
    probe_kernels(prober, focus, result)
    probe_strides(prober, focus, result)
    probe_rank(prober, focus, result)
    probe_batch(prober, focus, result)
    probe_qdq(prober, focus, result)
    probe_ops(prober, focus.ops, result, source="model" if fixed_outputs else "single op")
    if fixed_outputs is not None:
        emitted: dict[str, tuple[onnx.ModelProto, onnx.NodeProto] | None] = {}
        for model in fixed_outputs(constraints(result)):
            for op, example in focus_of([model]).ops.items():
                if op not in focus.ops and op not in emitted:
                    emitted[op] = example
        probe_ops(prober, emitted, result, source="npufix output")
    return result


def constraints(result: ProbeResult) -> dict[str, Any]:
    """The learned profile keys as FixOptions values."""
    values = {key: learned.value for key, learned in result.learned.items()}
    if "forbidden_ops" in values:
        values["forbidden_ops"] = tuple(sorted(values["forbidden_ops"]))
    return values


# --- the profile and the report -----------------------------------------------------------------------------

PROBE_REPORT_VERSION = 1
"""The version of ``npufix probe --report`` (pipeline/schemas/probe.schema.json)."""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's for these characters)."""
    import json

    return json.dumps(" ".join(text.split()), ensure_ascii=False)


def _comment(text: str) -> str:
    return " ".join(text.split())


def render_profile(result: ProbeResult, *, name: str, command: str, base: Any = None) -> str:
    """The learned profile as TOML in the shipped profiles' format; ``base``: a TargetProfile whose constraints
    and notes the learned ones override (each kept line says where it came from)."""
    values = constraints(result)
    calls = len(result.calls)
    lines = [f"# Learned by npufix probe from the judge {_comment(command)}: {calls} judge call"
             f"{'' if calls == 1 else 's'} ({result.judge_seconds:.1f} s), {result.cached} answered from the cache.",
             "# Each learned line says which probe model (its parameters and sha256 prefix) the judge accepted or "
             "rejected; the calls are in the probe report.", ""]
    for check in result.checks:
        lines.insert(-1, f"# {check['model']} fixed under this profile: the judge says {check['verdict_text']} "
                         f"(sha256 {check['sha256'][:12]})")
    sources = [f"npufix probe --judge {command}"] + (list(base.sources) if base is not None else [])
    description = f"learned by npufix probe ({calls} judge calls)"
    if base is not None:
        description += f" over {base.name}"
    lines += ["[target]", f"name = {_toml_string(name)}", f"description = {_toml_string(description)}",
              "sources = [" + ", ".join(_toml_string(s) for s in sources) + "]", "", "[constraints]"]
    base_constraints = dict(base.constraints) if base is not None else {}
    for key, value in base_constraints.items():
        if key not in values:
            lines.append(f"{key} = {_toml_value(value)}  # from --base-target {base.name}")
    for key, learned in result.learned.items():
        lines.append(f"{key} = {_toml_value(values[key])}  # {_comment(learned.evidence)}")
    notes = {**(dict(base.notes) if base is not None else {}), **result.notes}
    if result.interrupted:
        notes["interrupted"] = "the probe was interrupted: the keys not listed were not probed"
    if notes:
        lines += ["", "[notes]"] + [f"{_note_key(key)} = {_toml_string(text)}" for key, text in notes.items()]
    return "\n".join(lines) + "\n"


def _note_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_string(key)


def probe_record(result: ProbeResult, *, command: str, like: Sequence[str], base_target: str | None,
                 output: str | None, seconds: float) -> dict[str, Any]:
    """The ``--report`` JSON of a probe: every judge call, what was not built, what was learned."""
    return {
        "report_version": PROBE_REPORT_VERSION,
        "mode": "probe",
        "judge": command,
        "like": list(like),
        "base_target": base_target,
        "output": output,
        "interrupted": result.interrupted,
        "judge_calls": len(result.calls),
        "cached": result.cached,
        "judge_seconds": round(result.judge_seconds, 3),
        "seconds": round(seconds, 3),
        "learned": {key: constraints(result)[key] for key in result.learned},
        "notes": dict(result.notes),
        "calls": [c.to_json() for c in result.calls],
        "unbuildable": list(result.unbuildable),
        "checks": [{k: v for k, v in c.items() if k != "verdict_text"} for c in result.checks],
    }
