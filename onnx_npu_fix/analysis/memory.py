"""Activation-memory estimate: live activation bytes at every step of a node order, and a lower-peak order.

The model of execution (what NPU compilers' schedulers start from, before tiling):

- the nodes run one at a time in the given order; step ``i`` is the ``i``-th node;
- a tensor occupies memory from its producer's step to its last consumer's step, both inclusive (a node
  reads its inputs while it writes its outputs); graph inputs are live from step 0, graph outputs stay live
  to the last step, and an output nobody reads is live during its producer's step only;
- weights are not activations: initializers, Constant outputs, Shape/Size results and anything computed
  only from those (e.g. a DequantizeLinear of a constant weight) are not counted;
- every element takes ``act_bytes`` bytes (1 for int8, 4 for float32), whatever its ONNX element type.

So it is an estimate: it assumes no tiling, no in-place reuse (a Relu writing over its input), no alignment
padding, no scratch buffers and no memory inside If/Loop bodies. A tensor of unknown shape counts as 0
bytes and is listed, so the peak is then a lower bound.

A skip connection shows up as a tensor with a long producer -> last-consumer span, live across the peak.
``best_schedule`` looks for the topological order with the lowest peak: greedy list scheduling first (run the
ready node that adds the fewest bytes once the inputs it is the last reader of are freed, O((nodes + edges) log
nodes)), then, up to EXACT_MAX_NODES nodes, an exact best-first search over the sets of scheduled nodes with a
deterministic budget of state expansions (``_exact_search``). No order can go below a node's *floor* (its
activation inputs plus outputs, all live at its step), so the largest floor is a lower bound, raised by the search;
the result says whether the order is proved optimal. The stored order is kept unless a candidate is strictly lower.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io.load import prepare
from onnx_npu_fix.ir.graph import (
    GraphIndex,
    Shape,
    all_known,
    format_shape,
    has_subgraphs,
    shape_only_copy,
    subgraph_outer_inputs,
)
from onnx_npu_fix.ir.ops import RANDOM_OPS, SUBGRAPH_OPS, is_default_domain

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
    error = prepare(light, input_shapes, strict=False)
    return light, error


# --- liveness structure ----------------------------------------------------------------------------


@dataclass
class _Liveness:
    """Activation tensors and node dependencies of one graph, as integer-indexed lists."""

    nodes: list[onnx.NodeProto]
    names: list[str]
    shapes: list[Shape | None]
    sizes: list[int | None]  # bytes; None when the shape is not static
    producer: list[int]  # node index, -1 for a graph input
    consumers: list[list[int]]  # distinct reading nodes
    is_output: list[bool]
    node_in: list[list[int]]  # activation tensors each node reads (distinct)
    node_out: list[list[int]]  # activation tensors each node writes
    preds: list[list[int]]  # distinct predecessor nodes over every tensor, constants included
    sz: list[int] = field(default_factory=list)  # bytes, 0 when unknown
    outputs: list[int] = field(default_factory=list)  # tensors that are graph outputs
    _succs: list[list[int]] | None = None

    def size(self, t: int) -> int:
        return self.sz[t]

    def successors(self) -> list[list[int]]:
        if self._succs is None:
            self._succs = [[] for _ in self.nodes]
            for v, ps in enumerate(self.preds):
                for p in ps:
                    self._succs[p].append(v)
        return self._succs




def _reads_subgraph(node: onnx.NodeProto) -> bool:
    # Only these standard ops carry graph attributes; skip the attribute walk for everything else.
    if is_default_domain(node) and node.op_type not in SUBGRAPH_OPS:
        return False
    return has_subgraphs(node)


def constant_names(index: GraphIndex) -> set[str]:
    """Names that are weights rather than activations: initializers, Constant/Shape/Size outputs, and every
    output of a node that reads only such names (one pass in node order)."""
    const = {name for name in index.initializers if name not in index.graph_inputs}
    for node in index.graph.node:
        op = node.op_type  # each field read builds a Python object: read once (100k nodes)
        if op in ("Constant", "Shape", "Size") and is_default_domain(node):
            const.update(o for o in node.output if o)
            continue
        inputs = node.input[:]
        if (any(inputs) and all_known(inputs, const) and op not in RANDOM_OPS
                and not _reads_subgraph(node)):
            const.update(o for o in node.output if o)
    return const


def _liveness(index: GraphIndex, act_bytes: int, const: set[str] | None = None) -> _Liveness:
    nodes = list(index.graph.node)
    const = constant_names(index) if const is None else const
    tid: dict[str, int] = {}
    names: list[str] = []
    producer: list[int] = []

    def add(name: str, prod: int) -> None:
        tid[name] = len(names)
        names.append(name)
        producer.append(prod)

    for name in index.graph_inputs:
        add(name, -1)
    node_of: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for out in node.output:
            if out:
                node_of[out] = i
                if out not in const and out not in tid:
                    add(out, i)
    consumers: list[list[int]] = [[] for _ in names]
    node_in: list[list[int]] = []
    node_out: list[list[int]] = []
    preds: list[list[int]] = []
    for i, node in enumerate(nodes):
        reads = [n for n in node.input if n]
        if _reads_subgraph(node):
            reads.extend(sorted(subgraph_outer_inputs(node)))
        seen_t: list[int] = []
        seen_p: set[int] = set()
        for name in reads:
            t = tid.get(name)
            if t is not None and t not in seen_t:
                seen_t.append(t)
                consumers[t].append(i)
            p = node_of.get(name)
            if p is not None and p != i:
                seen_p.add(p)
        node_in.append(seen_t)
        node_out.append([tid[o] for o in node.output if o in tid and producer[tid[o]] == i])
        preds.append(sorted(seen_p))
    shapes = [index.shape(n) for n in names]
    sizes: list[int | None] = []
    for shape in shapes:
        if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
            sizes.append(None)
        else:
            sizes.append(math.prod(shape) * act_bytes)
    is_output = [n in index.output_set for n in names]
    return _Liveness(nodes, names, shapes, sizes, producer, consumers, is_output, node_in, node_out, preds,
                     sz=[v or 0 for v in sizes], outputs=[t for t, o in enumerate(is_output) if o])


# The liveness structure is shared with split.py (segment peaks over the same model of execution).
Liveness = _Liveness
liveness = _liveness


def _spans(lv: _Liveness, order: Sequence[int]) -> tuple[list[int], list[int]]:
    """First and last step of every activation tensor under ``order`` (a permutation of node indices)."""
    n = len(order)
    count = len(lv.names)
    start = [0] * count  # graph inputs: step 0
    end = [-1] * count
    node_in, node_out = lv.node_in, lv.node_out
    for step, v in enumerate(order):
        for t in node_out[v]:
            start[t] = step
        for t in node_in[v]:
            end[t] = step  # steps only grow, so the last write is the last reader
    for t in lv.outputs:
        end[t] = n - 1
    for t in range(count):
        # Unread outputs live during their producer's step; a graph that is not topologically sorted reads
        # before it writes, so keep every span non-empty.
        if end[t] < start[t]:
            end[t] = start[t]
    return start, end


def _profile(lv: _Liveness, start: list[int], end: list[int], n: int) -> list[int]:
    diff = [0] * (n + 1)
    for t, size in enumerate(lv.sz):
        if size:
            diff[start[t]] += size
            diff[end[t] + 1] -= size
    profile: list[int] = []
    live = 0
    for step in range(n):
        live += diff[step]
        profile.append(live)
    return profile


def _peak_of(lv: _Liveness, order: Sequence[int]) -> int:
    if not order:
        return sum(lv.size(t) for t in range(len(lv.names)))
    start, end = _spans(lv, order)
    return max(_profile(lv, start, end, len(order)))


# --- memory-aware order ----------------------------------------------------------------------------


def _greedy(lv: _Liveness, variant: str, prefix: Sequence[int] = ()) -> list[int] | None:
    """List scheduling over the ready nodes; None if the graph has a cycle. ``prefix``: a valid partial order run
    first (the exact search completes its best partial orders with this).

    ``net``: fewest bytes added (new outputs that stay live minus inputs freed), ties by stored position;
    ``net-lifo``: same key, ties to the most recently readied node (finish a branch before starting one);
    ``lifo``: depth-first, most recently readied node first.
    """
    n = len(lv.nodes)
    indeg = [len(p) for p in lv.preds]
    succs = lv.successors()
    remaining = [len(c) for c in lv.consumers]
    sz, is_output = lv.sz, lv.is_output
    alloc = [sum(sz[t] for t in outs if lv.consumers[t] or is_output[t]) for outs in lv.node_out]
    done = [False] * n
    version = [0] * n
    ready_tick = [0] * n
    tick = 0
    heap: list[tuple[int, int, int, int]] = []

    def freed(v: int) -> int:
        return sum(sz[t] for t in lv.node_in[v] if remaining[t] == 1 and not is_output[t])

    def push(v: int) -> None:
        if variant == "lifo":
            key = (-ready_tick[v], 0)
        elif variant == "net-lifo":
            key = (alloc[v] - freed(v), -ready_tick[v])
        else:
            key = (alloc[v] - freed(v), v)
        heapq.heappush(heap, (key[0], key[1], version[v], v))

    for v in range(n):
        if indeg[v] == 0:
            ready_tick[v] = tick
            tick += 1
            push(v)
    order: list[int] = []

    def run(v: int) -> None:
        nonlocal tick
        done[v] = True
        order.append(v)
        for t in lv.node_in[v]:
            remaining[t] -= 1
            if remaining[t] == 1 and variant != "lifo" and lv.size(t) and not lv.is_output[t]:
                # The one reader left now frees this tensor: its key improved, re-queue it if it is ready.
                last = next(c for c in lv.consumers[t] if not done[c])
                if indeg[last] == 0:
                    version[last] += 1
                    push(last)
        for s in succs[v]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready_tick[s] = tick
                tick += 1
                push(s)

    for v in prefix:
        run(v)
    while heap:
        _, _, ver, v = heapq.heappop(heap)
        if done[v] or ver != version[v]:
            continue
        run(v)
    return order if len(order) == n else None


def _best_order(lv: _Liveness, stored_peak: int | None = None) -> tuple[list[int], int, str]:
    """The lowest-peak order among the stored order and the greedy variants (stored wins ties)."""
    stored = list(range(len(lv.nodes)))
    best_peak = stored_peak if stored_peak is not None else _peak_of(lv, stored)
    best, method = stored, "stored"
    for variant in ("net", "net-lifo", "lifo"):
        order = _greedy(lv, variant)
        if order is None:
            return best, best_peak, method  # a cycle: only the stored order is meaningful
        peak = _peak_of(lv, order)
        if peak < best_peak:
            best, best_peak, method = order, peak, variant
    return best, best_peak, method


def node_floors(lv: _Liveness) -> list[int]:
    """Bytes every node needs on its own step, whatever the order: its distinct activation inputs plus all its
    outputs. No order and no cut can put a node's step below this; the largest one bounds every peak."""
    sz = lv.sz
    return [sum(sz[t] for t in ins) + sum(sz[t] for t in outs) for ins, outs in zip(lv.node_in, lv.node_out)]


EXACT_MAX_NODES = 5000
"""Graphs above this many nodes get the greedy orders only (the exact search keeps a bitmask per state)."""
DEFAULT_SEARCH_BUDGET = 20000
"""States the exact search may expand before it settles for the best order found (deterministic)."""
SEARCH_SECONDS_CAP = 20.0
"""Safety net only: a wall-time cap far above what the default budget takes on any machine."""


@dataclass
class SearchResult:
    order: list[int]
    peak: int
    method: str
    lower_bound: int
    """No topological order peaks below this: the largest node floor, raised to the least bottleneck of the
    search frontier when the search stopped early (every cheaper partial order was expanded)."""
    optimal: bool
    """True only when the search proved no order is lower than ``peak``."""
    expanded: int


def _exact_search(lv: _Liveness, incumbent_peak: int, lower: int, budget: int,
                  seconds: float) -> tuple[list[int] | None, int, int, bool, int]:
    """Bottleneck best-first search over the sets of scheduled nodes (each a down-set of the DAG).

    A state S (a bitmask of the nodes run so far) determines what is resident: every tensor produced in S
    (or a graph input) with a reader outside S, and the graph outputs produced. Running a ready node v next
    costs ``resident(S) + bytes(outputs of v)`` at its step; the peak of a path is its largest step, and
    ``g(S)`` the least peak over all paths to S. States pop in increasing ``g`` (ties: the deepest first), so
    the first complete state popped is optimal, and when the heap empties with every successor at or above
    the incumbent's peak pruned, the incumbent is optimal. Dominance: a ready node that frees at least what it
    keeps and whose step fits under ``g(S)`` is run at once (moving it earlier never raises a later step:
    every later resident set loses at least what it gains), which collapses constant chains and
    memory-neutral tails into a single successor.
    When ``budget`` expansions are spent, the bound is the least ``g`` left open (every cheaper partial order was
    expanded), and :func:`_complete_best` finishes the most promising open partial orders greedily.
    Returns (a better order or None, the best peak, the proved lower bound, whether it is optimal, states
    expanded).
    """
    import time

    n = len(lv.nodes)
    sz, is_output, consumers, node_in, node_out = lv.sz, lv.is_output, lv.consumers, lv.node_in, lv.node_out
    succs, preds = lv.successors(), lv.preds
    keeps = [sum(sz[t] for t in outs if consumers[t] or is_output[t]) for outs in node_out]
    step_bytes = [sum(sz[t] for t in outs) for outs in node_out]
    resident0 = sum(sz[t] for t in range(len(lv.names)) if lv.producer[t] < 0 and (consumers[t] or is_output[t]))
    unused_inputs = sum(sz[t] for t in range(len(lv.names)) if lv.producer[t] < 0 and not consumers[t]
                        and not is_output[t])
    full = (1 << n) - 1
    g0 = resident0 + unused_inputs
    ready0 = tuple(v for v in range(n) if not preds[v])
    best_g: dict[int, int] = {0: g0}
    info: dict[int, tuple[int, tuple[int, ...], int, int]] = {0: (resident0, ready0, -1, -1)}  # R, ready, parent, v
    heap: list[tuple[int, int, int]] = [(g0, 0, 0)]
    closed: set[int] = set()
    expanded = 0
    deadline = time.monotonic() + seconds
    while heap:
        g, neg_depth, mask = heapq.heappop(heap)
        if mask in closed or g > best_g[mask]:
            continue
        if mask == full:
            order: list[int] = []
            while mask:
                _, _, parent, v = info[mask]
                order.append(v)
                mask = parent
            order.reverse()
            return order, g, g, True, expanded
        if expanded >= budget or (expanded & 255 == 0 and time.monotonic() > deadline):
            heapq.heappush(heap, (g, neg_depth, mask))
            bound = max(lower, min(incumbent_peak, heap[0][0]))
            found, peak = _complete_best(lv, heap, info, best_g, closed, incumbent_peak)
            return found, peak, min(bound, peak), False, expanded
        expanded += 1
        closed.add(mask)
        resident, ready, _, _ = info[mask]
        extra = unused_inputs if mask == 0 else 0
        moves = []
        for v in ready:
            bit = 1 << v
            done = mask | bit
            freed = 0
            for t in node_in[v]:
                if sz[t] and not is_output[t] and all((done >> c) & 1 for c in consumers[t]):
                    freed += sz[t]
            after = resident + keeps[v] - freed
            step = resident + step_bytes[v] + extra
            if after <= resident and step <= g:
                moves = [(v, done, after, g)]
                break
            moves.append((v, done, after, max(g, step)))
        for v, done, after, ng in moves:
            if ng >= incumbent_peak or done in closed or ng >= best_g.get(done, incumbent_peak):
                continue
            best_g[done] = ng
            new_ready = [u for u in ready if u != v]
            for s in succs[v]:
                if all((done >> p) & 1 for p in preds[s]):
                    new_ready.append(s)
            info[done] = (after, tuple(new_ready), mask, v)
            heapq.heappush(heap, (ng, neg_depth - 1, done))
    # Every partial order below the incumbent's peak was expanded without completing: the incumbent is optimal.
    return None, incumbent_peak, incumbent_peak, True, expanded


COMPLETIONS = 16
"""Open states the search completes greedily when its budget runs out (the best found, not proved)."""


def _complete_best(lv: _Liveness, heap: list[tuple[int, int, int]], info: dict, best_g: dict[int, int],
                   closed: set[int], incumbent_peak: int) -> tuple[list[int] | None, int]:
    """Finish the most promising partial orders (lowest bottleneck, deepest first) with the greedy list
    schedulers; the best complete order if it is below the incumbent."""
    best, best_peak, tried = None, incumbent_peak, 0
    for g, _, mask in sorted(heap):
        if tried >= COMPLETIONS or g >= best_peak:
            break
        if mask in closed or g > best_g[mask]:
            continue
        tried += 1
        prefix: list[int] = []
        at = mask
        while at:
            _, _, parent, v = info[at]
            prefix.append(v)
            at = parent
        prefix.reverse()
        for variant in ("net", "net-lifo"):
            order = _greedy(lv, variant, prefix)
            if order is not None:
                peak = _peak_of(lv, order)
                if peak < best_peak:
                    best, best_peak = order, peak
    return best, best_peak


def best_schedule(lv: _Liveness, budget: int = DEFAULT_SEARCH_BUDGET, *, stored_peak: int | None = None,
                  seconds: float = SEARCH_SECONDS_CAP) -> SearchResult:
    """The lowest-peak topological order provable within ``budget`` state expansions: the greedy orders first
    (the incumbent), then :func:`_exact_search` when the graph has at most EXACT_MAX_NODES nodes and the
    incumbent is above the largest node floor. The stored order wins ties."""
    n = len(lv.nodes)
    order, peak, method = _best_order(lv, stored_peak)
    floors = node_floors(lv)
    lower = max(floors, default=0)
    if n == 0 or peak <= lower:
        return SearchResult(order, peak, method, min(lower, peak), True, 0)
    if n > EXACT_MAX_NODES or budget <= 0 or _greedy(lv, "lifo") is None:
        return SearchResult(order, peak, method, lower, False, 0)
    found, best, bound, optimal, expanded = _exact_search(lv, peak, lower, budget, seconds)
    if found is not None and best < peak:
        order, peak, method = found, _peak_of(lv, found), "exact" if optimal else "search"
    return SearchResult(order, peak, method, bound, optimal, expanded)


@dataclass
class OrderPlan:
    """The stored order's peak and the best order found (``order`` is the stored one if none is lower)."""

    order: list[int]
    peak_before: int
    peak_after: int
    method: str
    """'stored', the greedy variant that won ('net', 'net-lifo', 'lifo'), 'exact' (the search found the optimum)
    or 'search' (its budget ran out: a greedy completion of its best partial order, not proved optimal)."""
    unknown: int
    """Activation tensors of unknown size (counted as 0 bytes)."""
    lower_bound: int = 0
    """No topological order peaks below this (see :class:`SearchResult`)."""
    optimal: bool = False
    """Whether ``peak_after`` is proved to be the lowest peak of any topological order."""
    expanded: int = 0
    """States the exact search expanded."""

    @property
    def improves(self) -> bool:
        return self.peak_after < self.peak_before


def order_plan(index: GraphIndex, act_bytes: int = 1, budget: int = DEFAULT_SEARCH_BUDGET) -> OrderPlan:
    """Search the lowest-peak topological order for the graph behind ``index`` (shapes must be inferred), with at
    most ``budget`` state expansions of the exact search (:func:`best_schedule`)."""
    lv = _liveness(index, act_bytes)
    before = _peak_of(lv, list(range(len(lv.nodes))))
    found = best_schedule(lv, budget, stored_peak=before)
    return OrderPlan(found.order, before, found.peak, found.method, sum(1 for s in lv.sizes if s is None),
                     found.lower_bound, found.optimal, found.expanded)


def memory_aware_order(model: onnx.ModelProto, act_bytes: int = 1) -> tuple[list[int], int]:
    """A topological order of ``model.graph.node`` (as node indices) whose estimated peak is as low as the
    search finds, never above the stored order's, and that peak in bytes. Uses the model's value_info as is
    (run ``infer_shapes`` first)."""
    plan = order_plan(GraphIndex(model), act_bytes)
    return plan.order, plan.peak_after


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
    lv = _liveness(index, act_bytes, constants)
    n = len(lv.nodes)
    given = order is not None
    order = list(order) if given else list(range(n))
    if sorted(order) != list(range(n)):
        raise ValueError("order must be a permutation of the node indices")
    start, end = _spans(lv, order)
    profile = _profile(lv, start, end, n)
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
        found = best_schedule(lv, search_budget)
        est.best_peak, est.best_lower_bound, est.best_optimal = found.peak, found.lower_bound, found.optimal
        if found.peak < peak:
            est.reordered_peak, est.reordered_method, est.reordered_order = found.peak, found.method, found.order
    return est


# --- text ------------------------------------------------------------------------------------------


def format_bytes(n: int | None) -> str:
    """'412.0 KiB', '3.2 MiB', '96 B' (binary units)."""
    if n is None:
        return "?"
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


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
