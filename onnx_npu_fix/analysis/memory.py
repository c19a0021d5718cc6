"""Activation-memory estimate: live activation bytes at every step of a node order, the tensors live at the
peak, the largest node floor and the best order the schedule search finds, as text (``render_memory``) and JSON.

The model of execution and the order search live in analysis/schedule.py (the reorder-memory pass uses the same
search); this module measures one model with them and reports. It is an estimate: no tiling, no in-place reuse,
no padding or scratch buffers (``ASSUMPTIONS``). A tensor of unknown shape counts as 0 bytes and is listed, so
the peak is then a lower bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix.analysis.schedule import (
    DEFAULT_SEARCH_BUDGET,
    best_schedule,
    live_profile,
    liveness,
    node_floors,
    tensor_spans,
)
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io.load import prepare
from onnx_npu_fix.ir.graph import (
    GraphIndex,
    Shape,
    format_bytes,
    format_shape,
    shape_only_copy,
)

ASSUMPTIONS = (
    "estimate: nodes run one at a time in order; a tensor is live from its producer to its last consumer; "
    "no tiling, no in-place reuse, no padding or scratch buffers; weights and constants not counted"
)



# --- analysis copy ---------------------------------------------------------------------------------


def analysis_copy(model: onnx.ModelProto,
                  input_shapes: dict[str, Sequence[int]] | None = None) -> tuple[onnx.ModelProto, str | None]:
    """A copy of ``model`` with inferred shapes, for read-only analysis; the caller's model is not touched.

    Large initializers are copied without their data (dims only, :func:`graph.shape_only_copy`), so this is
    cheap on large models; only use the copy for shapes and structure. ``input_shapes`` freezes graph inputs
    like ``--input-shape`` (an unknown input name raises InputError). Unnamed nodes get the names the pass
    manager would give them.
    Returns the copy and the shape-inference error message, if strict inference failed (the copy then carries
    whatever non-strict inference could find).
    """
    light = shape_only_copy(model, keep_value_info=True)
    error = prepare(light, input_shapes, strict=False, light=True)
    return light, error


# --- report ----------------------------------------------------------------------------------------


@dataclass
class LiveTensor:
    """An activation tensor with its size and live range (producer step -> last consumer step)."""

    name: str
    shape: Shape | None
    bytes: int | None
    producer: str
    producer_step: int
    last_consumer: str
    last_step: int

    @property
    def span(self) -> int:
        return self.last_step - self.producer_step

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape) if self.shape is not None else None,
            "bytes": self.bytes,
            "producer": self.producer,
            "producer_step": self.producer_step,
            "last_consumer": self.last_consumer,
            "last_step": self.last_step,
            "span": self.span,
        }


@dataclass
class MemoryEstimate:
    """The estimate for one node order. Steps are 0-based indices into that order (the text says 'step k of n',
    1-based); sizes are bytes at ``act_bytes`` per element."""

    act_bytes: int
    sram_bytes: int | None
    order: str
    """'stored' (the model's node order) or 'given' (an order passed by the caller)."""
    steps: int
    activations: int
    """Number of activation tensors counted (known and unknown size)."""
    peak_bytes: int
    peak_step: int | None
    peak_node: str | None
    peak_op: str | None
    live_at_peak: list[LiveTensor] = field(default_factory=list)
    largest: LiveTensor | None = None
    unknown: list[str] = field(default_factory=list)
    """Activation tensors whose shape is not static: counted as 0 bytes."""
    profile: list[int] = field(default_factory=list)
    """Live bytes at every step."""
    reordered_peak: int | None = None
    """Peak of the memory-aware order, only when it is lower than ``peak_bytes``."""
    reordered_method: str | None = None
    reordered_order: list[int] | None = None
    floor_bytes: int = 0
    """The largest node floor (its activation inputs plus outputs): no order or cut goes below it."""
    floor_node: str | None = None
    floor_op: str | None = None
    best_peak: int | None = None
    """The lowest peak the schedule search found (the stored order's when none is lower)."""
    best_lower_bound: int | None = None
    """No topological order peaks below this."""
    best_optimal: bool | None = None
    """Whether ``best_peak`` is proved optimal."""

    @property
    def floor_fits(self) -> bool | None:
        """Whether the largest single node fits the budget (if not, no order and no split can help)."""
        return None if self.sram_bytes is None else self.floor_bytes <= self.sram_bytes

    @property
    def fits(self) -> bool | None:
        return None if self.sram_bytes is None else self.peak_bytes <= self.sram_bytes

    @property
    def miss_bytes(self) -> int:
        """By how much the peak exceeds the SRAM budget (0 when it fits or there is no budget)."""
        return 0 if self.sram_bytes is None else max(0, self.peak_bytes - self.sram_bytes)

    @property
    def reorder_fits(self) -> bool | None:
        if self.sram_bytes is None or self.reordered_peak is None:
            return None
        return self.reordered_peak <= self.sram_bytes

    def to_json(self, *, profile: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "assumptions": ASSUMPTIONS,
            "act_bytes": self.act_bytes,
            "order": self.order,
            "steps": self.steps,
            "activations": self.activations,
            "peak": {"bytes": self.peak_bytes, "step": self.peak_step, "node": self.peak_node,
                     "op": self.peak_op},
            "live_at_peak": [t.to_json() for t in self.live_at_peak],
            "largest_tensor": self.largest.to_json() if self.largest else None,
            "sram": None if self.sram_bytes is None else {
                "bytes": self.sram_bytes, "fits": self.fits, "miss_bytes": self.miss_bytes},
            "reordered": None if self.reordered_peak is None else {
                "peak_bytes": self.reordered_peak, "saving_bytes": self.peak_bytes - self.reordered_peak,
                "fits": self.reorder_fits, "method": self.reordered_method, "pass": "reorder-memory"},
            "unknown_tensors": list(self.unknown),
            "lower_bound": bool(self.unknown),
            "floor": {"bytes": self.floor_bytes, "node": self.floor_node, "op": self.floor_op,
                      "fits": self.floor_fits},
            "schedule": None if self.best_peak is None else {
                "peak_bytes": self.best_peak, "lower_bound_bytes": self.best_lower_bound,
                "optimal": self.best_optimal},
        }
        if profile:
            out["profile"] = list(self.profile)
        return out


def estimate(model: onnx.ModelProto, act_bytes: int = 1, sram_bytes: int | None = None,
             order: Sequence[int] | None = None, *, infer: bool = True, reorder: bool = True,
             input_shapes: dict[str, Sequence[int]] | None = None) -> MemoryEstimate:
    """Estimate the activation memory of running ``model`` node by node (see the module docstring).

    ``order``: node indices into ``model.graph.node`` (default: the stored order). ``infer``: run shape
    inference on a light copy first (the model is never modified); pass False when the model's value_info is
    already fresh. ``reorder``: also search a memory-aware order and report it when its peak is lower.
    """
    if infer:
        model, _ = analysis_copy(model, input_shapes)
    return estimate_index(GraphIndex(model), act_bytes, sram_bytes, order, reorder=reorder)


def estimate_index(index: GraphIndex, act_bytes: int = 1, sram_bytes: int | None = None,
                   order: Sequence[int] | None = None, *, reorder: bool = True,
                   constants: set[str] | None = None,
                   search_budget: int = DEFAULT_SEARCH_BUDGET) -> MemoryEstimate:
    """:func:`estimate` over a prepared GraphIndex (its shapes must be inferred). ``constants``: the result of
    :func:`constant_names` when the caller has it already."""
    if act_bytes <= 0:
        raise InputError(f"--act-bytes must be positive, got {act_bytes}")
    lv = liveness(index, act_bytes, constants)
    n = len(lv.nodes)
    given = order is not None
    order = list(order) if given else list(range(n))
    if sorted(order) != list(range(n)):
        raise ValueError("order must be a permutation of the node indices")
    start, end = tensor_spans(lv, order)
    profile = live_profile(lv, start, end, n)
    unknown = [lv.names[t] for t in range(len(lv.names)) if lv.sizes[t] is None]

    pos = [0] * n
    for step, v in enumerate(order):
        pos[v] = step

    def describe(t: int) -> LiveTensor:
        p = lv.producer[t]
        producer = lv.nodes[p].name if p >= 0 else "(graph input)"
        if lv.is_output[t]:
            last = "(graph output)"
        elif lv.consumers[t]:
            last = lv.nodes[max(lv.consumers[t], key=pos.__getitem__)].name
        else:
            last = "(unused)"
        return LiveTensor(lv.names[t], lv.shapes[t], lv.sizes[t], producer, start[t], last, end[t])

    if n:
        peak = max(profile)
        peak_step = profile.index(peak)
        peak_node = lv.nodes[order[peak_step]]
        live = [t for t in range(len(lv.names)) if start[t] <= peak_step <= end[t]]
    else:  # no nodes: whatever the inputs hold
        peak, peak_step, peak_node = sum(lv.size(t) for t in range(len(lv.names))), None, None
        live = list(range(len(lv.names)))
    live.sort(key=lambda t: (-(lv.sizes[t] or 0), lv.sizes[t] is None, start[t], lv.names[t]))
    known = [t for t in range(len(lv.names)) if lv.sizes[t]]
    largest = describe(max(known, key=lambda t: (lv.sizes[t], -t))) if known else None
    est = MemoryEstimate(
        act_bytes=act_bytes, sram_bytes=sram_bytes, order="given" if given else "stored", steps=n,
        activations=len(lv.names), peak_bytes=peak, peak_step=peak_step,
        peak_node=peak_node.name if peak_node is not None else None,
        peak_op=peak_node.op_type if peak_node is not None else None,
        live_at_peak=[describe(t) for t in live], largest=largest, unknown=unknown, profile=profile)
    if n:
        floors = node_floors(lv)
        worst = max(range(n), key=lambda v: (floors[v], -v))
        est.floor_bytes, est.floor_node, est.floor_op = floors[worst], lv.nodes[worst].name, lv.nodes[worst].op_type
    if reorder and n:
        found = best_schedule(lv, search_budget, stored_peak=None if given else peak)
        est.best_peak, est.best_lower_bound, est.best_optimal = found.peak, found.lower_bound, found.optimal
        if found.peak < peak:
            est.reordered_peak, est.reordered_method, est.reordered_order = found.peak, found.method, found.order
    return est


# --- text ------------------------------------------------------------------------------------------


def _fmt_exact(n: int) -> str:
    return format_bytes(n) if n < 1024 else f"{format_bytes(n)} ({n:,} B)"


def render_memory(est: MemoryEstimate, *, max_tensors: int = 12) -> str:
    """The estimate for a person, several lines, no trailing newline."""
    per = f"{est.act_bytes} byte{'s' if est.act_bytes != 1 else ''}/element"
    order = "stored node order" if est.order == "stored" else "given node order"
    lines = [f"Activation memory (estimate: {per}, {order}, assumes no tiling or in-place reuse; "
             "weights and constants not counted)"]
    if est.peak_step is None:
        lines.append(f"  peak            {_fmt_exact(est.peak_bytes)} (the graph has no nodes)")
    else:
        lines.append(f"  peak            {_fmt_exact(est.peak_bytes)} at step {est.peak_step + 1} of "
                     f"{est.steps}: {est.peak_node} ({est.peak_op})")
    if est.live_at_peak:
        lines.append(f"  live at the peak ({len(est.live_at_peak)} tensors; producer -> last consumer, "
                     "span in steps):")
        width = max(len(t.name) for t in est.live_at_peak[:max_tensors])
        for t in est.live_at_peak[:max_tensors]:
            lines.append(f"    {format_bytes(t.bytes):>10}  {t.name:<{width}}  {format_shape(t.shape):<16} "
                         f"{t.producer} -> {t.last_consumer}  span {t.span}")
        if len(est.live_at_peak) > max_tensors:
            rest = est.live_at_peak[max_tensors:]
            lines.append(f"    ... {len(rest)} more ({format_bytes(sum(t.bytes or 0 for t in rest))})")
    if est.largest is not None:
        t = est.largest
        lines.append(f"  largest tensor  {format_bytes(t.bytes)}  {t.name} {format_shape(t.shape)}  "
                     f"{t.producer} -> {t.last_consumer}")
    if est.sram_bytes is not None:
        if est.fits:
            spare = format_bytes(est.sram_bytes - est.peak_bytes)
            lines.append(f"  SRAM {format_bytes(est.sram_bytes)}: fits, {spare} to spare")
        else:
            share = 100 * est.peak_bytes / max(est.sram_bytes, 1)
            lines.append(f"  SRAM {format_bytes(est.sram_bytes)}: does not fit, misses by "
                         f"{_fmt_exact(est.miss_bytes)} (peak is {share:.0f}% of the budget)")
    if est.reordered_peak is not None:
        verdict = {None: "", True: "; fits", False: "; still does not fit"}[est.reorder_fits]
        saving = format_bytes(est.peak_bytes - est.reordered_peak)
        lines.append(f"  memory-aware order: peak {_fmt_exact(est.reordered_peak)}, {saving} lower{verdict} "
                     "(pass reorder-memory)")
    if est.best_peak is not None:
        proof = "optimal" if est.best_optimal else f"no order below {_fmt_exact(est.best_lower_bound or 0)}"
        lines.append(f"  best order      {_fmt_exact(est.best_peak)} ({proof})")
    if est.floor_node is not None:
        verdict = {None: "", True: "", False: " — above the SRAM budget: no order or split fits it"}[est.floor_fits]
        lines.append(f"  largest layer   {_fmt_exact(est.floor_bytes)} inputs + outputs of {est.floor_node} "
                     f"({est.floor_op}){verdict}")
    if est.unknown:
        shown = ", ".join(est.unknown[:5]) + (", ..." if len(est.unknown) > 5 else "")
        lines.append(f"  unknown size: {len(est.unknown)} tensors not counted ({shown}); the peak is a lower "
                     "bound — freeze dynamic inputs with --input-shape")
    return "\n".join(lines)
