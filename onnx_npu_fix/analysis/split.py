"""Split a model into an ordered list of sub-models ("segments") whose activation peaks each fit an SRAM budget.

The field report's working fix for an SRAM overflow: run the U-Net as two sub-models (encoder to bottleneck,
decoder) that exchange the feature maps crossing the cut through external memory. The same model of execution as
analysis/schedule.py: nodes run one at a time in one order (the best order schedule.best_schedule finds); a segment is
a contiguous run of that order. Inside a segment a tensor is on chip from its producer (step 0 for a segment input)
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from onnx_npu_fix.analysis.schedule import (
    DEFAULT_SEARCH_BUDGET,
    Liveness,
    best_greedy_order,
    best_schedule,
    constant_names,
    liveness,
    node_floors,
)
from onnx_npu_fix.errors import InputError
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
    split_at: dict[str, str] = field(default_factory=dict)
    """Each ``--split-at`` name -> the tensor of the fixed model the cut follows (the same name unless a pass
    renamed or folded it away, see :func:`resolve_split_at`)."""

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
            "split_at": dict(self.split_at),
            "blocking": [{"node": n, "op": op, "bytes": b} for n, op, b in self.blocking],
        }


# --- --split-at names across the passes -------------------------------------------------------------------

# How far up a removed producer's data input the search for a kept node goes: a fold removes one node (a
# BatchNormalization into its Conv, an Identity); a few allow for folds in a row.
_ORIGIN_DEPTH = 4


@dataclass(frozen=True)
class SplitOrigin:
    """A ``--split-at`` tensor as the model was read: its producer and the producers up its data input, as
    (node name, output index). The passes keep node names, not always tensor names: fold-batchnorm removes a
    Conv's output (its BatchNormalization's output now comes from the Conv), align-channels gives a padded
    output a new name. The first of these nodes the fixed model still has produces the tensor that carries
    the requested one."""

    name: str
    producers: tuple[tuple[str, int], ...]


def split_origins(graph: onnx.GraphProto, names: Sequence[str]) -> dict[str, SplitOrigin]:
    """The origin of each of ``names`` in ``graph`` (before the passes); a name no node produces is left out
    (:func:`plan_split` then says so)."""
    if not names:
        return {}
    constant = {i.name for i in graph.initializer}
    producer = {out: (node, k) for node in graph.node for k, out in enumerate(node.output) if out}
    origins = {}
    for name in names:
        chain, tensor = [], name
        while tensor in producer and len(chain) < _ORIGIN_DEPTH:
            node, k = producer[tensor]
            chain.append((node.name, k))
            data = [i for i in node.input if i and i not in constant]
            if len(data) != 1:  # a node that merges tensors has no one input that carries its output
                break
            tensor = data[0]
        if chain:
            origins[name] = SplitOrigin(name, tuple(chain))
    return origins


def resolve_split_at(graph: onnx.GraphProto, names: Sequence[str],
                     origins: dict[str, SplitOrigin]) -> dict[str, str]:
    """Each of ``names`` -> the tensor of ``graph`` (the fixed model) to cut after: the name itself when a node
    still produces it, else the output of the first node of its origin the graph still has. A name that
    resolves to nothing maps to itself (:func:`plan_split` reports it)."""
    produced = {out for node in graph.node for out in node.output if out}
    outputs = {node.name: list(node.output) for node in graph.node if node.name}
    resolved = {}
    for name in names:
        resolved[name] = name
        if name in produced or name not in origins:
            continue
        for node_name, k in origins[name].producers:
            if k < len(outputs.get(node_name, ())) and outputs[node_name][k]:
                resolved[name] = outputs[node_name][k]
                break
    return resolved


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
        plan.blocking = _blocking(lv, sram_bytes)
        if plan.blocking:
            return plan
    seg = _Segmenter(lv, order)
    plan.forced = _forced_cuts(lv, seg, split_at)
    cross = seg.crossing()
    bounds = [0, *_fewest_segments(_reach(seg, sram_bytes, plan.forced), cross), n]
    segments = _segment_io(index, const, lv, order, bounds, seg)
    # A run of constant-only nodes is recomputed where it is read: a segment left without nodes of its own
    # (possible only between forced cuts) writes nothing: it disappears, and so does the cut that opened it.
    kept = [k for k, s in enumerate(segments) if s.outputs]
    plan.segments = [segments[k] for k in kept]
    plan.cuts = [bounds[k] for k in kept[1:]]
    plan.crossing_bytes = [cross[c] for c in plan.cuts]
    return plan


def _blocking(lv: Liveness, sram_bytes: int) -> list[tuple[str, str, int]]:
    """(node, op, bytes) of every node whose floor alone exceeds the budget, largest first."""
    floors = node_floors(lv)
    blocking = [(lv.nodes[v].name, lv.nodes[v].op_type, floors[v]) for v in range(len(lv.nodes))
                if floors[v] > sram_bytes]
    blocking.sort(key=lambda b: -b[2])
    return blocking


def _forced_cuts(lv: Liveness, seg: _Segmenter, split_at: Sequence[str]) -> list[int]:
    """The positions (in the segmenter's order) right after the producers of the ``split_at`` tensors."""
    n = len(lv.nodes)
    node_at = {out: v for v, node in enumerate(lv.nodes) for out in node.output if out}
    forced: set[int] = set()
    for name in split_at:
        if name not in node_at:
            raise InputError(f"--split-at names '{name}', which no node produces; name an intermediate tensor")
        cut = seg.pos[node_at[name]] + 1
        if 0 < cut < n:
            forced.add(cut)
    return sorted(forced)


def _reach(seg: _Segmenter, sram_bytes: int | None, forced: Sequence[int]) -> list[int]:
    """reach[i]: the largest j such that order[i:j] fits and no forced cut lies strictly inside it."""
    n = len(seg.pos)
    forced = set(forced)
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
    return reach


def _fewest_segments(reach: list[int], cross: Sequence[int]) -> list[int]:
    """The cuts of the fewest segments, then the fewest crossing bytes, each segment within its start's reach."""
    n = len(reach)
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
    return sorted(cuts)


def pure_nodes(index: GraphIndex, const: set[str]) -> set[int]:
    """Nodes computed from constants only (no activation anywhere upstream): safe to recompute per segment (and
    never a cut of ``npufix reduce``: they come along with the nodes that read them)."""
    pure_tensors = {name for name in index.initializers if name not in index.graph_inputs}
    pure: set[int] = set()
    for v, node in enumerate(index.graph.node):
        if has_subgraphs(node):
            continue
        if all(o in const for o in node.output if o) and all(i in pure_tensors for i in node.input if i):
            pure.add(v)
            pure_tensors.update(o for o in node.output if o)
    return pure


def node_reads(node: onnx.NodeProto) -> list[str]:
    """The names ``node`` reads: its inputs and, for an If / Loop / Scan, what its bodies read from outside."""
    reads = [i for i in node.input if i]
    if has_subgraphs(node):
        reads.extend(sorted(subgraph_outer_inputs(node)))
    return reads


def _segment_io(index: GraphIndex, const: set[str], lv: Liveness, order: list[int], bounds: list[int],
                seg: _Segmenter) -> list[SegmentPlan]:
    nodes = lv.nodes
    pure = pure_nodes(index, const)
    producer = {out: v for v, node in enumerate(nodes) for out in node.output if out}
    outputs_of_model = set(index.graph_outputs)
    # a pure node stays where the order put it only when it writes a graph output; elsewhere it is recomputed
    own_lists = []
    for k in range(len(bounds) - 1):
        own_lists.append([v for v in order[bounds[k]:bounds[k + 1]]
                          if v not in pure or any(o in outputs_of_model for o in nodes[v].output)])
    segment_of = {v: k for k, own in enumerate(own_lists) for v in own}
    reads_of = [node_reads(node) for node in nodes]
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
        used = {name for node in nodes for name in node_reads(node)}
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
    if len(lv.nodes) > LARGE_GRAPH_NODES:  # each trial is a shape inference of the whole graph
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
    probe = _SizeProbe(model, spatial, reference, act_bytes)
    for which in (0, 1):
        k = _largest_fitting(probe, candidates, which, sram_bytes, max_trials)
        if k is None:
            continue
        size = candidates[k]
        dims = [d * size // reference for d in hint.shape[2:]]
        if which == 0:
            hint.whole, hint.whole_peak = hint.shape[:2] + dims, probe.measure(size)[0]
        else:
            hint.split, hint.split_floor = hint.shape[:2] + dims, probe.measure(size)[1]
    return hint


class _SizeProbe:
    """The (greedy peak, largest floor) of ``model`` with its spatial inputs scaled to ``size / reference``, on a
    light copy with shapes re-inferred; None when the model refuses that size. Cached; ``trials`` counts the
    sizes measured."""

    def __init__(self, model: onnx.ModelProto, spatial: list[tuple[str, list[int]]], reference: int,
                 act_bytes: int) -> None:
        self.model, self.spatial, self.reference, self.act_bytes = model, spatial, reference, act_bytes
        self.trials = 0
        self.cache: dict[int, tuple[int, int] | None] = {}

    def measure(self, size: int) -> tuple[int, int] | None:
        if size not in self.cache:
            self.trials += 1
            self.cache[size] = self._measure(size)
        return self.cache[size]

    def _measure(self, size: int) -> tuple[int, int] | None:
        shapes = {}
        for name, shape in self.spatial:
            scaled = [d * size // self.reference for d in shape[2:]]
            if any(d * size % self.reference for d in shape[2:]) or min(scaled) < 1:
                return None
            shapes[name] = shape[:2] + scaled
        light = shape_only_copy(self.model)
        for out in light.graph.output:
            out.type.tensor_type.ClearField("shape")
        set_input_shapes(light, shapes)
        try:
            infer_shapes(light, light=True)
        except Exception:  # noqa: BLE001 - the model does not accept this size
            return None
        sub = liveness(GraphIndex(light), self.act_bytes)
        if any(s is None for s in sub.sizes):
            return None
        _, peak, _ = best_greedy_order(sub)
        return peak, max(node_floors(sub), default=0)


def _largest_fitting(probe: _SizeProbe, candidates: list[int], which: int, sram_bytes: int,
                     max_trials: int) -> int | None:
    """Index of the largest candidate size whose measure ``which`` (0: peak, 1: floor) fits, by bisection."""
    lo, hi, found = 0, len(candidates) - 1, None  # candidates descend; find the first that fits
    while lo <= hi and probe.trials < max_trials:
        mid = (lo + hi) // 2
        # a refused size: look at its neighbours on the grid before giving up on this half
        k = next((k for k in range(mid, hi + 1) if probe.measure(candidates[k]) is not None), None)
        if k is None:
            hi = mid - 1
            continue
        if probe.measure(candidates[k])[which] <= sram_bytes:
            found, hi = k, mid - 1
        else:
            lo = k + 1
    return found
