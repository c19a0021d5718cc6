"""The limit probes: each bisects (or compares two forms of) one numeric or boolean profile key."""

from __future__ import annotations

from typing import Any

import onnx

from onnx_npu_fix.judge.command import FAIL, PASS, TIMEOUT
from onnx_npu_fix.judge.probe import models as probe_models
from onnx_npu_fix.judge.probe.focus import Focus
from onnx_npu_fix.judge.probe.prober import Bracket, Call, Learned, Prober, ProbeResult

RANK_START = 4
"""The tensor-rank search starts here: every NPU compiler takes rank-4 tensors, and a rank-1 or rank-2 Relu says
little about the ranks a model's activations have."""
ALIGN_SCAN = 16
"""The largest channel alignment (and channel count) the alignment probe tries."""


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


RESIZE_FACTOR_KEYS = {"nearest": "resize_factors", "linear": "linear_half_pixel_factors"}
"""The profile key the Resize factors of each probe_models.RESIZE_FORMS form set."""


def probe_resize_factors(prober: Prober, focus: Focus, result: ProbeResult) -> None:
    """``resize_factors`` (nearest) and ``linear_half_pixel_factors`` (linear half_pixel, where linear x2 is
    accepted): each integer factor above 2 the models' Resizes have, beside x2; set only where one is rejected,
    to the factors accepted."""
    factors = sorted(f for f in focus.resize_factors if f > 2)
    if not factors:
        return
    linear = result.learned.get("require_nearest_resize")
    for form, key in RESIZE_FACTOR_KEYS.items():
        if form == "linear" and (linear is None or linear.value is not False):
            continue  # linear Resize is refused (or undecided) at x2 already
        calls = {f: prober.ask("resize", {"form": form, "factor": f}, probe_models.resize(form=form, factor=f))
                 for f in [2, *factors]}
        said = "; ".join(f"x{f} ({c.evidence() if c else 'not built'})" for f, c in calls.items())
        if any(c is None or c.verdict.kind == TIMEOUT for c in calls.values()) or calls[2].verdict.kind != PASS:
            result.notes[key] = f"not decided: probe resize {form} {said}"
        elif all(c.verdict.kind == PASS for c in calls.values()):
            result.notes[key] = f"every factor the models have accepted: probe resize {form} {said}"
        else:
            accepted = tuple(f for f, c in calls.items() if c.verdict.kind == PASS)
            result.learned[key] = Learned(key, accepted, f"probe resize {form} (channels {probe_models.CHANNELS}, "
                                                         f"8x8): {said}")


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
