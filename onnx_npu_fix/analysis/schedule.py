"""Activation liveness over a node order, and the topological order with the lowest activation peak.

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

import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.ir.graph import (
    GraphIndex,
    Shape,
    all_known,
    has_subgraphs,
    subgraph_outer_inputs,
    type_may_hold_subgraphs,
)
from onnx_npu_fix.ir.ops import DEFAULT_DOMAINS, RANDOM_OPS

# --- liveness structure ----------------------------------------------------------------------------


@dataclass
class Liveness:
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
    _floors: list[int] | None = None

    def size(self, t: int) -> int:
        return self.sz[t]

    def successors(self) -> list[list[int]]:
        if self._succs is None:
            self._succs = [[] for _ in self.nodes]
            for v, ps in enumerate(self.preds):
                for p in ps:
                    self._succs[p].append(v)
        return self._succs




def _reads_subgraph(node: onnx.NodeProto, op: str, domain: str) -> bool:
    """Whether ``node`` (of type ``op`` in ``domain``, as read) holds a subgraph."""
    # Only these standard ops carry graph attributes; skip the attribute walk for everything else.
    return type_may_hold_subgraphs(op, domain) and has_subgraphs(node)


def constant_names(index: GraphIndex) -> frozenset[str]:
    """Names that are weights rather than activations: initializers, Constant/Shape/Size outputs, and every
    output of a node that reads only such names (one pass in node order, once per index)."""
    return index.derived(_constant_names)


def _constant_names(index: GraphIndex) -> frozenset[str]:
    const = {name for name in index.initializers if name not in index.graph_inputs}
    # The index's per-node fields, read once when it was built (100k nodes).
    for node, op, domain, inputs, outputs in zip(index.nodes, index.ops, index.domains, index.node_inputs,
                                                 index.node_outputs):
        if op in ("Constant", "Shape", "Size") and domain in DEFAULT_DOMAINS:
            const.update(o for o in outputs if o)
            continue
        if (any(inputs) and all_known(inputs, const) and op not in RANDOM_OPS
                and not _reads_subgraph(node, op, domain)):
            const.update(o for o in outputs if o)
    return frozenset(const)  # shared by every reader of the index: read-only


def liveness(index: GraphIndex, act_bytes: int, const: set[str] | None = None) -> Liveness:
    nodes = index.nodes
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
    node_outputs = index.node_outputs  # every node's fields as the index read them (once)
    node_of: dict[str, int] = {}
    for i, outputs in enumerate(node_outputs):
        for out in outputs:
            if out:
                node_of[out] = i
                if out not in const and out not in tid:
                    add(out, i)
    consumers: list[list[int]] = [[] for _ in names]
    node_in: list[list[int]] = []
    node_out: list[list[int]] = []
    preds: list[list[int]] = []
    tid_get, node_of_get = tid.get, node_of.get
    for i, (node, op, domain, reads) in enumerate(zip(nodes, index.ops, index.domains, index.node_inputs)):
        if _reads_subgraph(node, op, domain):
            reads = [*reads, *sorted(subgraph_outer_inputs(node))]
        seen_t: list[int] = []
        seen_p: set[int] = set()
        for name in reads:
            if not name:
                continue
            t = tid_get(name)
            if t is not None and t not in seen_t:
                seen_t.append(t)
                consumers[t].append(i)
            p = node_of_get(name)
            if p is not None and p != i:
                seen_p.add(p)
        node_in.append(seen_t)
        node_out.append([tid[o] for o in node_outputs[i] if o in tid and producer[tid[o]] == i])
        preds.append(sorted(seen_p))
    shapes = [index.shape(n) for n in names]
    sizes: list[int | None] = []
    for shape in shapes:
        if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
            sizes.append(None)
        else:
            sizes.append(math.prod(shape) * act_bytes)
    is_output = [n in index.output_set for n in names]
    return Liveness(nodes, names, shapes, sizes, producer, consumers, is_output, node_in, node_out, preds,
                     sz=[v or 0 for v in sizes], outputs=[t for t, o in enumerate(is_output) if o])


def tensor_spans(lv: Liveness, order: Sequence[int]) -> tuple[list[int], list[int]]:
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


def live_profile(lv: Liveness, start: list[int], end: list[int], n: int) -> list[int]:
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


def peak_of(lv: Liveness, order: Sequence[int]) -> int:
    if not order:
        return sum(lv.size(t) for t in range(len(lv.names)))
    start, end = tensor_spans(lv, order)
    return max(live_profile(lv, start, end, len(order)))


def stored_peak(index: GraphIndex, act_bytes: int) -> tuple[int, int]:
    """``peak_of(liveness(index, act_bytes), stored order)`` and how many activations have no static shape, in
    one sweep over the nodes: the cost table needs these two figures only, and the liveness structure (readers,
    predecessors, per-node lists) the order search needs costs several times as much to build."""
    const = constant_names(index)
    start = dict.fromkeys(index.graph_inputs, 0)  # activation -> its producer's step (first producer)
    last: dict[str, int] = {}  # any name -> the last step reading it
    step = -1
    for step, (node, op, domain, reads, outputs) in enumerate(zip(
            index.nodes, index.ops, index.domains, index.node_inputs, index.node_outputs)):
        if _reads_subgraph(node, op, domain):
            reads = [*reads, *subgraph_outer_inputs(node)]  # (the index's own list is left as it was read)
        for name in reads:
            last[name] = step
        for out in outputs:
            if out and out not in const and out not in start:
                start[out] = step
    n = step + 1
    diff = [0] * (n + 1)
    blank = total = 0
    outputs = index.output_set
    sizes: dict[Shape | None, int | None] = {}  # most activations share a few shapes
    for name, first in start.items():
        shape = index.shape(name)
        size = sizes.get(shape, -1)
        if size == -1:
            static = shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)
            size = sizes[shape] = math.prod(shape) * act_bytes if static else None  # type: ignore[arg-type]
        if size is None:
            blank += 1
            continue
        if not size:
            continue
        total += size
        # live from its producer's step to its last reader's (the last step for a graph output); an unread
        # output during its producer's step only, as tensor_spans
        end = max(first, n - 1 if name in outputs else last.get(name, -1))
        diff[first] += size
        diff[end + 1] -= size
    if not n:
        return total, blank
    peak = live = 0
    for step in range(n):
        live += diff[step]
        peak = max(peak, live)
    return peak, blank


# --- memory-aware order ----------------------------------------------------------------------------


def _greedy(lv: Liveness, variant: str, prefix: Sequence[int] = ()) -> list[int] | None:
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
        net = 0 if variant == "lifo" else alloc[v] - freed(v)
        heapq.heappush(heap, (*_ready_key(variant, net, ready_tick[v], v), version[v], v))

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


def _ready_key(variant: str, net: int, ready_tick: int, v: int) -> tuple[int, int]:
    """Heap key of ready node ``v`` under a greedy variant (see :func:`_greedy`); ``net``: bytes it adds."""
    if variant == "lifo":
        return (-ready_tick, 0)
    if variant == "net-lifo":
        return (net, -ready_tick)
    return (net, v)


def best_greedy_order(lv: Liveness, stored_peak: int | None = None) -> tuple[list[int], int, str]:
    """The lowest-peak order among the stored order and the greedy variants (stored wins ties)."""
    stored = list(range(len(lv.nodes)))
    best_peak = stored_peak if stored_peak is not None else peak_of(lv, stored)
    best, method = stored, "stored"
    for variant in ("net", "net-lifo", "lifo"):
        order = _greedy(lv, variant)
        if order is None:
            return best, best_peak, method  # a cycle: only the stored order is meaningful
        peak = peak_of(lv, order)
        if peak < best_peak:
            best, best_peak, method = order, peak, variant
    return best, best_peak, method


def node_floors(lv: Liveness) -> list[int]:
    """Bytes every node needs on its own step, whatever the order: its distinct activation inputs plus all its
    outputs. No order and no cut can put a node's step below this; the largest one bounds every peak."""
    if lv._floors is None:  # the estimate and the order search both ask (a list per node: built once)
        sz = lv.sz
        lv._floors = [sum(sz[t] for t in ins) + sum(sz[t] for t in outs) for ins, outs in zip(lv.node_in, lv.node_out)]
    return lv._floors


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


PROGRESS_EVERY = 1024
"""The exact search reports its expanded states (progress.Step) every this many."""


def _exact_search(lv: Liveness, incumbent_peak: int, lower: int, budget: int,
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
    sz, is_output, consumers, node_out = lv.sz, lv.is_output, lv.consumers, lv.node_out
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
            return _path_to(info, mask), g, g, True, expanded
        if expanded >= budget or (expanded & 255 == 0 and time.monotonic() > deadline):
            heapq.heappush(heap, (g, neg_depth, mask))
            bound = max(lower, min(incumbent_peak, heap[0][0]))
            found, peak = _complete_best(lv, heap, info, best_g, closed, incumbent_peak)
            return found, peak, min(bound, peak), False, expanded
        expanded += 1
        if expanded % PROGRESS_EVERY == 0:
            progress.emit(progress.Step("schedule search", expanded, budget))
        closed.add(mask)
        resident, ready, _, _ = info[mask]
        for v, done, after, ng in _moves(lv, keeps, step_bytes, mask, resident, ready, g,
                                         unused_inputs if mask == 0 else 0):
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


def _moves(lv: Liveness, keeps: list[int], step_bytes: list[int], mask: int, resident: int,
           ready: tuple[int, ...], g: int, extra: int) -> list[tuple[int, int, int, int]]:
    """The successors of state ``mask`` (resident bytes ``resident``, bottleneck ``g``): (node run next, new
    state, bytes resident after it, new bottleneck) per ready node; only the first dominant move when there is
    one (it frees at least what it keeps and its step fits under ``g``). ``extra``: graph inputs nobody reads,
    live at the first step only."""
    sz, is_output, consumers = lv.sz, lv.is_output, lv.consumers
    moves = []
    for v in ready:
        done = mask | (1 << v)
        freed = 0
        for t in lv.node_in[v]:
            if sz[t] and not is_output[t] and all((done >> c) & 1 for c in consumers[t]):
                freed += sz[t]
        after = resident + keeps[v] - freed
        step = resident + step_bytes[v] + extra
        if after <= resident and step <= g:
            return [(v, done, after, g)]
        moves.append((v, done, after, max(g, step)))
    return moves


def _path_to(info: dict[int, tuple[int, tuple[int, ...], int, int]], mask: int) -> list[int]:
    """The nodes run to reach state ``mask``, in order (each state records its parent and the node run last)."""
    path: list[int] = []
    while mask:
        _, _, parent, v = info[mask]
        path.append(v)
        mask = parent
    path.reverse()
    return path


COMPLETIONS = 16
"""Open states the search completes greedily when its budget runs out (the best found, not proved)."""


def _complete_best(lv: Liveness, heap: list[tuple[int, int, int]], info: dict, best_g: dict[int, int],
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
        prefix = _path_to(info, mask)
        for variant in ("net", "net-lifo"):
            order = _greedy(lv, variant, prefix)
            if order is not None:
                peak = peak_of(lv, order)
                if peak < best_peak:
                    best, best_peak = order, peak
    return best, best_peak


def best_schedule(lv: Liveness, budget: int = DEFAULT_SEARCH_BUDGET, *, stored_peak: int | None = None,
                  seconds: float = SEARCH_SECONDS_CAP) -> SearchResult:
    """The lowest-peak topological order provable within ``budget`` state expansions: the greedy orders first
    (the incumbent), then :func:`_exact_search` when the graph has at most EXACT_MAX_NODES nodes and the
    incumbent is above the largest node floor. The stored order wins ties."""
    n = len(lv.nodes)
    lower = max(node_floors(lv), default=0)
    if stored_peak is None:
        stored_peak = peak_of(lv, list(range(n)))
    if stored_peak <= lower:  # no order peaks below the floor and the stored one wins ties: no greedy to run
        return SearchResult(list(range(n)), stored_peak, "stored", stored_peak, True, 0)
    order, peak, method = best_greedy_order(lv, stored_peak)
    if n == 0 or peak <= lower:
        return SearchResult(order, peak, method, min(lower, peak), True, 0)
    if n > EXACT_MAX_NODES or budget <= 0 or _greedy(lv, "lifo") is None:
        return SearchResult(order, peak, method, lower, False, 0)
    found, best, bound, optimal, expanded = _exact_search(lv, peak, lower, budget, seconds)
    if found is not None and best < peak:
        order, peak, method = found, peak_of(lv, found), "exact" if optimal else "search"
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
    lv = liveness(index, act_bytes)
    before = peak_of(lv, list(range(len(lv.nodes))))
    found = best_schedule(lv, budget, stored_peak=before)
    return OrderPlan(found.order, before, found.peak, found.method, sum(1 for s in lv.sizes if s is None),
                     found.lower_bound, found.optimal, found.expanded)


def memory_aware_order(model: onnx.ModelProto, act_bytes: int = 1) -> tuple[list[int], int]:
    """A topological order of ``model.graph.node`` (as node indices) whose estimated peak is as low as the
    search finds, never above the stored order's, and that peak in bytes. Uses the model's value_info as is
    (run ``infer_shapes`` first)."""
    plan = order_plan(GraphIndex(model), act_bytes)
    return plan.order, plan.peak_after
