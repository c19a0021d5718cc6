"""Split a model into an ordered list of sub-models ("segments") whose activation peaks each fit an SRAM budget.

The field report's working fix for an SRAM overflow: run the U-Net as two sub-models (encoder to bottleneck,
decoder) that exchange the feature maps crossing the cut through external memory. The same model of execution as
memory.py: nodes run one at a time in one order (the best order memory.best_schedule finds); a segment is a
contiguous run of that order. Inside a segment a tensor is on chip from its producer (step 0 for a segment input)
to its last reader in the segment, or to the segment's end when a later segment or the caller reads it; a tensor
crossing a cut lives in external memory in between (a skip connection that crosses a middle segment costs that
segment nothing). So a segment's peak is exactly what ``npufix SEGMENT --check --sram`` estimates for it.

Planning, for cuts at positions of one fixed order:
- a sub-run of a run that fits also fits (every tensor's on-chip range shrinks), so for each start ``i`` the
  segments that fit are ``[i, j)`` for ``j <= reach(i)``, and ``reach`` never decreases: two pointers find all
  of them with O(nodes) segment evaluations;
- a dynamic programme over cut positions then minimises (number of segments, total bytes crossing the cuts),
  lexicographically; the bytes crossing a cut are the activations produced before it and read after it;
- ``split_at`` tensors force a cut right after their producer; the planner adds cuts only where it must.
A node whose own inputs plus outputs exceed the budget fits no segment: the plan says which (``blocking``).

Tensors computed from constants only (Constant nodes and what reads only initializers and those) are recomputed in
every segment that reads them instead of crossing a cut, so segments exchange activations only.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from onnx_npu_fix.analysis.memory import (  # noqa: I001
    DEFAULT_SEARCH_BUDGET,
    Liveness,
    _best_order,
    best_schedule,
    constant_names,
    liveness,
    node_floors,
)
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import InputError, PassFailed
from onnx_npu_fix.ir.graph import (
    GraphIndex,
    has_subgraphs,
    infer_shapes,
    set_input_shapes,
    shape_only_copy,
    subgraph_outer_inputs,
)


@dataclass
class SegmentPlan:
    nodes: list[int]
    """Indices into ``model.graph.node``, in execution order (recomputed constant producers first)."""
    inputs: list[str]
    outputs: list[str]
    peak_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"nodes": len(self.nodes), "inputs": self.inputs, "outputs": self.outputs,
                "peak_bytes": self.peak_bytes}


@dataclass
class SplitPlan:
    sram_bytes: int | None
    act_bytes: int
    order: list[int]
    """The node order the cuts are positions of."""
    cuts: list[int] = field(default_factory=list)
    """Positions in ``order`` where a new segment starts (the first segment starts at 0, not listed)."""
    segments: list[SegmentPlan] = field(default_factory=list)
    crossing_bytes: list[int] = field(default_factory=list)
    """Per cut: bytes of the activations produced before it and read after it (they go to external memory)."""
    forced: list[int] = field(default_factory=list)
    """Cuts that came from ``split_at``."""
    blocking: list[tuple[str, str, int]] = field(default_factory=list)
    """(node, op, bytes) of every node whose inputs plus outputs alone exceed the budget: nothing fits then."""

    @property
    def fits(self) -> bool:
        return not self.blocking

    def to_json(self) -> dict[str, Any]:
        return {
            "sram_bytes": self.sram_bytes,
            "act_bytes": self.act_bytes,
            "fits": self.fits,
            "segments": [s.to_json() for s in self.segments],
            "crossing_bytes": list(self.crossing_bytes),
            "forced_cuts": len(self.forced),
            "blocking": [{"node": n, "op": op, "bytes": b} for n, op, b in self.blocking],
        }


# --- planning ----------------------------------------------------------------------------------------


class _Segmenter:
    """Segment peaks over one order of one liveness structure, vectorised over tensors (numpy): the planner asks
    for O(nodes) peaks, each over up to the whole graph."""

    def __init__(self, lv: Liveness, order: Sequence[int]) -> None:
        self.lv = lv
        self.order = list(order)
        n = len(order)
        self.pos = [0] * n
        for step, v in enumerate(order):
            self.pos[v] = step
        # per tensor: the order positions of its readers, sorted
        self.reader_steps = [sorted(self.pos[c] for c in cs) for cs in lv.consumers]
        self.produced_at = [self.pos[p] if p >= 0 else -1 for p in lv.producer]
        self._size = np.array(lv.sz, dtype=np.int64)
        self._start = np.array(self.produced_at, dtype=np.int64)
        # Where an internal tensor's life ends in the whole order: its last reader, the end for a graph output,
        # its producer's step when nobody reads it; a segment cuts that at its own last step.
        ends = []
        for t, steps in enumerate(self.reader_steps):
            ends.append(n - 1 if lv.is_output[t] else (steps[-1] if steps else self.produced_at[t]))
        self._end = np.array(ends, dtype=np.int64)
        edges = sorted((r, t) for t, steps in enumerate(self.reader_steps) if lv.sz[t] for r in steps)
        self._edge_step = np.array([r for r, _ in edges], dtype=np.int64)
        self._edge_tensor = np.array([t for _, t in edges], dtype=np.int64)

    def peak(self, i: int, j: int) -> int:
        """Peak on-chip bytes of the segment ``order[i:j]`` (see the module docstring): tensors made inside live
        from their producer to min(their end, the segment's last step); inputs (made before ``i``) from step 0 to
        their last reader inside."""
        length = j - i
        size, start = self._size, self._start
        inside = (start >= i) & (start < j) & (size > 0)
        sizes = size[inside]
        diff = np.bincount(start[inside] - i, weights=sizes, minlength=length + 1)
        diff -= np.bincount(np.minimum(self._end[inside], j - 1) - i + 1, weights=sizes, minlength=length + 1)
        lo, hi = np.searchsorted(self._edge_step, [i, j])
        tensors, steps = self._edge_tensor[lo:hi], self._edge_step[lo:hi]
        outside = start[tensors] < i
        if outside.any():
            tensors, steps = tensors[outside], steps[outside]
            last = np.full(len(size), -1, dtype=np.int64)
            np.maximum.at(last, tensors, steps)
            read = np.nonzero(last >= 0)[0]
            diff[0] += size[read].sum()
            diff -= np.bincount(last[read] - i + 1, weights=size[read], minlength=length + 1)
        return int(round(np.cumsum(diff[:length]).max())) if length else 0

    def crossing(self) -> list[int]:
        """Bytes crossing a cut at every position 0..n (activations produced before it, read at or after it)."""
        n = len(self.order)
        diff = [0] * (n + 2)
        for t, size in enumerate(self.lv.sz):
            start = self.produced_at[t]
            if size and start >= 0 and self.reader_steps[t] and self.reader_steps[t][-1] > start:
                diff[start + 1] += size  # cuts at positions start+1 .. last reader
                diff[self.reader_steps[t][-1] + 1] -= size
        out, live = [], 0
        for p in range(n + 1):
            live += diff[p]
            out.append(live)
        return out


def plan_split(index: GraphIndex, sram_bytes: int | None, act_bytes: int = 1, *, split_at: Sequence[str] = (),
               budget: int = DEFAULT_SEARCH_BUDGET) -> SplitPlan:
    """Cut the graph behind ``index`` (shapes inferred) into the fewest segments that each fit ``sram_bytes``
    (None: no budget, only the ``split_at`` cuts), then the fewest bytes crossing the cuts. Raises InputError
    when a ``split_at`` name is not a tensor some node produces."""
    const = constant_names(index)
    lv = liveness(index, act_bytes, const)
    n = len(lv.nodes)
    order = best_schedule(lv, budget).order if n else []
    plan = SplitPlan(sram_bytes, act_bytes, order)
    if sram_bytes is not None:
        floors = node_floors(lv)
        plan.blocking = [(lv.nodes[v].name, lv.nodes[v].op_type, floors[v]) for v in range(n)
                         if floors[v] > sram_bytes]
        plan.blocking.sort(key=lambda b: -b[2])
        if plan.blocking:
            return plan
    seg = _Segmenter(lv, order)
    node_at = {out: v for v, node in enumerate(lv.nodes) for out in node.output if out}
    forced: set[int] = set()
    for name in split_at:
        if name not in node_at:
            raise InputError(f"--split-at names '{name}', which no node produces; name an intermediate tensor")
        cut = seg.pos[node_at[name]] + 1
        if 0 < cut < n:
            forced.add(cut)
    plan.forced = sorted(forced)
    # reach[i]: the largest j such that order[i:j] fits and no forced cut lies strictly inside it
    next_forced = [n] * (n + 1)
    upcoming = n
    for p in range(n, -1, -1):
        next_forced[p] = upcoming
        if p in forced:
            upcoming = p
    reach = [0] * n
    j = 1
    for i in range(n):
        j = max(j, i + 1)
        limit = next_forced[i]
        while j < limit and (sram_bytes is None or seg.peak(i, j + 1) <= sram_bytes):
            j += 1
        reach[i] = j
    cross = seg.crossing()
    # best[p]: the least (segments, crossing bytes) covering order[:p]; the last segment [start, p) needs
    # reach[start] >= p, and the starts allowed for p form a window [lo, p) that only slides right, so a
    # monotonic deque of the window's keys (best[start] plus the bytes crossing a cut at start) gives each
    # minimum in O(1) amortised: O(nodes) for the programme.
    inf = (n + 1, 0)
    best: list[tuple[int, int]] = [inf] * (n + 1)
    back = [0] * (n + 1)
    best[0] = (0, 0)
    window: collections.deque[tuple[tuple[int, int], int]] = collections.deque()
    lo = 0
    for end in range(1, n + 1):
        start = end - 1
        if best[start] != inf:
            key = (best[start][0] + 1, best[start][1] + (cross[start] if start else 0))
            while window and window[-1][0] >= key:
                window.pop()
            window.append((key, start))
        while reach[lo] < end:
            lo += 1
        while window and window[0][1] < lo:
            window.popleft()
        if window:
            best[end], back[end] = window[0]
    cuts = []
    p = n
    while p > 0:
        p = back[p]
        if p:
            cuts.append(p)
    plan.cuts = sorted(cuts)
    plan.crossing_bytes = [cross[c] for c in plan.cuts]
    bounds = [0, *plan.cuts, n]
    segments = _segment_io(index, const, lv, order, bounds, seg)
    # A run of constant-only nodes is recomputed where it is read: a segment left without nodes of its own
    # (possible only between forced cuts) writes nothing: it disappears, and so does the cut that opened it.
    kept = [k for k, s in enumerate(segments) if s.outputs]
    plan.segments = [segments[k] for k in kept]
    plan.cuts = [bounds[k] for k in kept[1:]]
    plan.crossing_bytes = [cross[c] for c in plan.cuts]
    return plan


def _pure_nodes(index: GraphIndex, const: set[str]) -> set[int]:
    """Nodes computed from constants only (no activation anywhere upstream): safe to recompute per segment."""
    pure_tensors = {name for name in index.initializers if name not in index.graph_inputs}
    pure: set[int] = set()
    for v, node in enumerate(index.graph.node):
        if has_subgraphs(node):
            continue
        if all(o in const for o in node.output if o) and all(i in pure_tensors for i in node.input if i):
            pure.add(v)
            pure_tensors.update(o for o in node.output if o)
    return pure


def _node_reads(node: onnx.NodeProto) -> list[str]:
    reads = [i for i in node.input if i]
    if has_subgraphs(node):
        reads.extend(sorted(subgraph_outer_inputs(node)))
    return reads


def _segment_io(index: GraphIndex, const: set[str], lv: Liveness, order: list[int], bounds: list[int],
                seg: _Segmenter) -> list[SegmentPlan]:
    nodes = lv.nodes
    pure = _pure_nodes(index, const)
    producer = {out: v for v, node in enumerate(nodes) for out in node.output if out}
    outputs_of_model = set(index.graph_outputs)
    # a pure node stays where the order put it only when it writes a graph output; elsewhere it is recomputed
    own_lists = []
    for k in range(len(bounds) - 1):
        own_lists.append([v for v in order[bounds[k]:bounds[k + 1]]
                          if v not in pure or any(o in outputs_of_model for o in nodes[v].output)])
    segment_of = {v: k for k, own in enumerate(own_lists) for v in own}
    reads_of = [_node_reads(node) for node in nodes]
    readers: dict[str, list[int]] = {}
    for v, names in enumerate(reads_of):
        for name in names:
            readers.setdefault(name, []).append(v)
    plans = []
    for k, own in enumerate(own_lists):
        stack = [producer[name] for v in own for name in reads_of[v]
                 if name in producer and producer[name] in pure and segment_of.get(producer[name]) != k]
        closure: set[int] = set()
        while stack:
            v = stack.pop()
            if v in closure or segment_of.get(v) == k:
                continue
            closure.add(v)
            stack.extend(producer[name] for name in reads_of[v] if name in producer)
        needed = sorted(closure) + own
        made = {o for v in needed for o in nodes[v].output if o}
        inputs: list[str] = []
        for v in needed:
            for name in reads_of[v]:
                if name not in made and name not in inputs and (name not in index.initializers
                                                                 or name in index.overridable):
                    inputs.append(name)
        outputs: list[str] = []
        for v in own:
            for name in nodes[v].output:
                if not name:
                    continue
                later = any(segment_of.get(c, -1) > k for c in readers.get(name, ()))
                if name in outputs_of_model or later:
                    outputs.append(name)
        plans.append(SegmentPlan(needed, inputs, outputs, seg.peak(bounds[k], bounds[k + 1])))
    return plans


# --- building ----------------------------------------------------------------------------------------


def build_segments(model: onnx.ModelProto, plan: SplitPlan) -> list[onnx.ModelProto]:
    """One standalone model per segment of ``plan`` (made from ``model``, the model the plan was made for: same
    node list). Inputs and outputs keep the original tensor names; initializers are copied as needed."""
    graph = model.graph
    value_info = {vi.name: vi for vi in [*graph.input, *graph.value_info, *graph.output]}
    inits = {t.name: t for t in graph.initializer}
    built = []
    for k, segment in enumerate(plan.segments):
        nodes = [graph.node[v] for v in segment.nodes]
        used = {name for node in nodes for name in _node_reads(node)}
        missing = [name for name in [*segment.inputs, *segment.outputs] if name not in value_info]
        if missing:
            raise ValueError(f"segment {k}: no type for tensor '{missing[0]}' (run shape inference first)")
        internal = {o for node in nodes for o in node.output} - set(segment.outputs)
        sub = onnx.helper.make_graph(
            nodes, f"{graph.name or 'graph'}_segment{k}",
            [value_info[name] for name in segment.inputs], [value_info[name] for name in segment.outputs],
            [inits[name] for name in sorted(used) if name in inits],
            value_info=[value_info[name] for name in sorted(internal) if name in value_info])
        out = onnx.ModelProto()
        out.ir_version = model.ir_version
        out.opset_import.extend(model.opset_import)
        out.functions.extend(model.functions)
        out.producer_name = "npufix-split"
        out.graph.CopyFrom(sub)
        built.append(out)
    return built


# --- what would fit: a smaller input ---------------------------------------------------------------------


@dataclass
class ResolutionHint:
    """What would fit when a single layer does not: smaller inputs (the same estimate at re-inferred shapes),
    or the number of spatial tiles the largest layer needs."""

    input: str | None
    shape: list[int] | None
    """The input's shape now."""
    whole: list[int] | None = None
    """The largest input shape (on the searched grid) at which the whole model fits unsplit; None: none found."""
    whole_peak: int | None = None
    split: list[int] | None = None
    """The largest input shape at which every single layer fits, so ``--split`` can cut the model to fit."""
    split_floor: int | None = None
    tiles: int = 1
    """Spatial tiles the largest layer needs at the current shape: ceil(its bytes / budget), halos ignored."""
    step: int = 0
    """The grid: spatial sizes that are multiples of this."""

    def to_json(self) -> dict[str, Any]:
        return {"input": self.input, "shape": self.shape, "whole_fits_at": self.whole, "whole_peak": self.whole_peak,
                "split_fits_at": self.split, "split_floor": self.split_floor, "tiles": self.tiles,
                "grid": self.step}

    def text(self) -> str:
        parts = []
        if self.whole is not None:
            parts.append(f"input {self.input} {_dims(self.whole)} fits the whole model (peak {self.whole_peak:,} B)")
        if self.split is not None and self.split != self.whole:
            parts.append(f"input {self.input} {_dims(self.split)} fits with --split (largest layer "
                         f"{self.split_floor:,} B)")
        if not parts and self.input is None:
            parts.append("no input with spatial axes (rank >= 3) to shrink")
        elif not parts:
            parts.append(f"no smaller input {self.input} the model accepts (multiples of {self.step}) fits")
        parts.append(f"or >= {self.tiles} spatial tiles of the largest layer (halos not counted)")
        return "; ".join(parts)


LARGE_GRAPH_NODES = 20000


def _dims(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)


def _spatial_candidates(size: int) -> tuple[int, list[int]]:
    # the largest power of two <= 32 dividing the size, small enough to leave a few candidates below it
    step = 1
    while step < 32 and size % (step * 2) == 0 and size // (step * 2) >= 4:
        step *= 2
    return step, list(range(size - step, 0, -step))


def resolution_hint(model: onnx.ModelProto, sram_bytes: int, act_bytes: int = 1, *,
                    max_trials: int = 24) -> ResolutionHint:
    """Search smaller spatial input sizes (every rank >= 3 input scaled alike on its axes 2.., on the grid of the
    largest power of two <= 32 dividing the first input's first spatial size, at most a quarter of it) for the
    largest at which the whole model fits and at which its largest layer fits. Shapes are re-inferred on a light
    copy per candidate (a size
    the model's shape logic refuses — fixed Reshape targets, mismatched Concat — is skipped). Peaks shrink with
    the input, so a bisection over the grid needs O(log) inferences; at most ``max_trials`` in all."""
    index = GraphIndex(model)
    lv = liveness(index, act_bytes)
    floor = max(node_floors(lv), default=0)
    if len(lv.nodes) > LARGE_GRAPH_NODES:  # a shape inference costs about a second per 100k nodes
        max_trials = min(max_trials, 8)
    hint = ResolutionHint(None, None, tiles=max(1, -(-floor // max(1, sram_bytes))))
    inputs = [vi for vi in model.graph.input if vi.name not in index.initializers]
    spatial = [(vi.name, index.static_shape(vi.name)) for vi in inputs]
    spatial = [(name, list(shape)) for name, shape in spatial if shape is not None and len(shape) >= 3]
    if not spatial:
        return hint
    hint.input, hint.shape = spatial[0]
    reference = spatial[0][1][2]
    hint.step, candidates = _spatial_candidates(reference)
    trials = 0
    cache: dict[int, tuple[int, int] | None] = {}

    def measure(size: int) -> tuple[int, int] | None:
        nonlocal trials
        if size in cache:
            return cache[size]
        trials += 1
        shapes = {}
        for name, shape in spatial:
            scaled = [d * size // reference for d in shape[2:]]
            if any(d * size % reference for d in shape[2:]) or min(scaled) < 1:
                cache[size] = None
                return None
            shapes[name] = shape[:2] + scaled
        light = shape_only_copy(model)
        for out in light.graph.output:
            out.type.tensor_type.ClearField("shape")
        set_input_shapes(light, shapes)
        try:
            infer_shapes(light)
        except Exception:  # noqa: BLE001 - the model does not accept this size
            cache[size] = None
            return None
        sub = liveness(GraphIndex(light), act_bytes)
        if any(s is None for s in sub.sizes):
            cache[size] = None
            return None
        _, peak, _ = _best_order(sub)
        cache[size] = (peak, max(node_floors(sub), default=0))
        return cache[size]

    def largest(which: int) -> int | None:
        lo, hi, found = 0, len(candidates) - 1, None  # candidates descend; find the first that fits
        while lo <= hi and trials < max_trials:
            mid = (lo + hi) // 2
            # a refused size: look at its neighbours on the grid before giving up on this half
            probe = next((k for k in range(mid, hi + 1) if measure(candidates[k]) is not None), None)
            if probe is None:
                hi = mid - 1
                continue
            if measure(candidates[probe])[which] <= sram_bytes:
                found, hi = probe, mid - 1
            else:
                lo = probe + 1
        return found

    for which in (0, 1):
        k = largest(which)
        if k is None:
            continue
        size = candidates[k]
        dims = [d * size // reference for d in hint.shape[2:]]
        if which == 0:
            hint.whole, hint.whole_peak = hint.shape[:2] + dims, measure(size)[0]
        else:
            hint.split, hint.split_floor = hint.shape[:2] + dims, measure(size)[1]
    return hint


# --- the --split use case: plan, build, check, validate, write -------------------------------------------------


@dataclass
class SplitOutcome:
    """What :func:`split_model` did: the plan, its chained validation, and where the segments went."""

    plan: SplitPlan
    directory: str | None = None
    """Where the segments and manifest.json were written (None: nothing written, the plan does not fit)."""
    validation: object | None = None  # validate.Comparison, None when validation is off
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


def split_model(model: onnx.ModelProto, directory: str | os.PathLike, options: FixOptions) -> SplitOutcome:
    """Cut ``model`` (fixed, with fresh shapes: FixResult.model) into segments that each fit
    ``options.sram_bytes`` (:func:`plan_split`), check each segment's own estimate against the budget, validate
    that running them in order reproduces ``model``'s outputs bit for bit, and write DIR atomically
    (io.save.atomic_dir): the segments and ``manifest.json`` appear together or not at all.

    When a single layer exceeds the budget nothing is written: the outcome has ``fits`` False, the plan names
    the layers and ``hint`` says which input size would fit. Raises PassFailed (pass name 'split') when the
    chained segments do not reproduce the model, InputError for a bad ``--split-at`` name or directory."""
    from onnx_npu_fix.io.paths import check_split_dir

    directory = os.fspath(directory)
    check_split_dir(directory)
    plan = plan_split(GraphIndex(model), options.sram_bytes, options.act_bytes, split_at=options.split_at,
                      budget=options.schedule_budget)
    outcome = SplitOutcome(plan)
    if not plan.fits:
        outcome.hint = resolution_hint(model, options.sram_bytes, options.act_bytes)
        return outcome
    segments = build_segments(model, plan)
    _check_segment_peaks(segments, plan, options)
    outcome.validation, outcome.note = _validate_chain(model, segments, options)
    outcome.manifest = _write_segments(directory, segments, plan)
    outcome.directory, outcome.segments = directory, segments
    return outcome


def _check_segment_peaks(segments: Sequence[onnx.ModelProto], plan: SplitPlan, options: FixOptions) -> None:
    """Each built segment passes the checker and its own estimate fits the budget (recorded in the plan)."""
    from onnx_npu_fix.analysis.memory import estimate

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
    from onnx_npu_fix.pipeline.validate import CannotRun, validate_chain

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


def _write_segments(directory: str, segments: Sequence[onnx.ModelProto], plan: SplitPlan) -> dict:
    """Write ``segment_NN.onnx`` and ``manifest.json`` to ``directory`` in one atomic step; returns the
    manifest."""
    from onnx_npu_fix.io.save import atomic_dir, save_model, write_json

    width = max(2, len(str(len(segments) - 1)))
    names = [f"segment_{k:0{width}d}.onnx" for k in range(len(segments))]
    manifest = {
        "segments": [{"path": name, "inputs": s.inputs, "outputs": s.outputs, "peak_bytes": s.peak_bytes}
                     for name, s in zip(names, plan.segments)],
        "crossing_bytes": list(plan.crossing_bytes),
    }
    with atomic_dir(directory) as tmp:
        for name, segment in zip(names, segments):
            save_model(segment, os.path.join(tmp, name))
        write_json(os.path.join(tmp, "manifest.json"), manifest)
    return manifest
