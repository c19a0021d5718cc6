"""``npufix probe``: learn a compiler's limits from a judge command and write them as a target profile.

Each probe is a small model with one op (models.py), checked before it is sent (a model that fails the
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
- nearest and linear half_pixel Resize at the models' factors above 2 -> ``resize_factors``,
  ``linear_half_pixel_factors``;
- channel counts of a 1x1 Conv (odd ones first; then the multiples of 2, 3, 4, ... up to 16) -> ``align``;
- the kernel of a group-1 Conv (per spatial rank in focus) -> ``max_kernel``;
- the stride of a 3x3 Conv -> ``max_stride``; of a QDQ one, where lower -> ``max_stride_quantized``;
- the rank of a tensor (from 4 up) -> ``max_rank``;
- a 1x1 Conv on two images where one passes -> ``batch_one``;
- a QDQ Conv where the float one passes -> ``allow_qdq``;
- each other op type alone -> ``forbidden_ops``.

With ``--like`` models only what they hold is probed: their op types (each node probed as it occurs in the model:
models.extracted), dilations up to the largest they have, ConvTranspose strides up to the largest stride or
Resize factor; then the models are fixed under the profile learned so far (and, where it forbids ops, as if it
forbade none) and the op types npufix emitted that the models did not have (space-to-batch's Concat / Slice, say)
are probed as they occur in the fixed model. An op type forbidden from one node is judged again on the other
models' nodes of the type and on the one npufix emits (space-to-batch's Reshape; ops.reconsider).

A limit the probe cannot decide (a timeout, a rejection at the smallest value) is left out of the profile with a
``[notes]`` line saying why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import onnx

from onnx_npu_fix.judge.probe import limits
from onnx_npu_fix.judge.probe.focus import Focus, emitted_ops, focus_of, full_focus
from onnx_npu_fix.judge.probe.ops import probe_ops, reconsider
from onnx_npu_fix.judge.probe.prober import Prober, ProbeResult, constraints
from onnx_npu_fix.judge.probe.profile import probe_record, render_profile

LIMIT_PROBES = (limits.probe_dilations, limits.probe_convtranspose, limits.probe_resize,
                limits.probe_resize_factors, limits.probe_align, limits.probe_kernels, limits.probe_strides,
                limits.probe_rank, limits.probe_batch, limits.probe_qdq)
"""The limit probes in the order they run (the QDQ probe last: the op probes read what it decided)."""

__all__ = ["Focus", "Prober", "ProbeResult", "constraints", "focus_of", "full_focus", "probe", "probe_record",
           "render_profile"]


def probe(prober: Prober, focus: Focus,
          fixed_outputs: Callable[[dict[str, Any]], Iterable[onnx.ModelProto]] | None = None) -> ProbeResult:
    """Run every probe ``focus`` asks for; with ``fixed_outputs`` (``--like``: the models fixed under a profile's
    constraints), then the op types npufix emits for them that they did not hold."""
    result = prober.result
    for limit_probe in LIMIT_PROBES:
        limit_probe(prober, focus, result)
    probe_ops(prober, focus.ops, result, source="model" if fixed_outputs else "single op")
    reconsider(prober, focus.others, result, source="model")
    if fixed_outputs is not None:
        emitted = _emitted(fixed_outputs, result, focus)
        probe_ops(prober, {op: ex for op, ex in emitted.items() if op not in focus.ops}, result,
                  source="npufix output")
        reconsider(prober, {op: [ex] for op, ex in emitted.items() if op in focus.ops}, result,
                   source="npufix output")
    return result


def _emitted(fixed_outputs: Callable[[dict[str, Any]], Iterable[onnx.ModelProto]], result: ProbeResult,
             focus: Focus) -> dict[str, tuple[onnx.ModelProto, onnx.NodeProto]]:
    """The op types npufix emits for the models, each with an example: fixed under the profile learned so far
    (its lowerings of the forbidden ops), and, where it forbids ops, fixed as if it forbade none (the forms a
    forbidden op stops, such as space-to-batch's Reshape)."""
    learned = constraints(result)
    emitted = emitted_ops(list(fixed_outputs(learned)), focus.node_names)
    if "forbidden_ops" in learned:
        unforbidden = {k: v for k, v in learned.items() if k != "forbidden_ops"}
        for op, example in emitted_ops(list(fixed_outputs(unforbidden)), focus.node_names).items():
            emitted.setdefault(op, example)
    return emitted
