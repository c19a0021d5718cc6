"""Pass ``fold-constants``: evaluate constant subexpressions once input shapes are static.

    Shape(X) -> Gather -> Unsqueeze -> Concat -> Reshape(Y, .)   becomes   Reshape(Y, <constant>)

A node folds when every input is a constant (initializer or Constant) or it is ``Shape``/``Size`` of a tensor whose
shape is static; its outputs become initializers with the same names, and the chain that fed it dies (removed here).
Evaluation uses onnx's reference implementation at the model's opset — exact, since the runtime computes the same
values from the same constants. Shape inference is refreshed between rounds so shapes downstream of a newly constant
Reshape/Expand/Pad become static and can fold in turn. Random ops, custom domains and results larger than
``--large-tensor`` bytes (onnxsim's ``--no-large-tensor``) are left alone.

A Constant node read by an op in the target's ``initializer_inputs`` (an input after the first) becomes an
initializer of the same name and value (:class:`StoreConstant`; nncase 1.9 reads Unsqueeze's axes from initializers
only): every reader sees the same tensor.

Control flow folds too, repeatedly until nothing changes (an If inside the chosen branch folds in a later round):

    If(c = constant)  ->  the chosen branch's nodes, in the If's place        (If(c) = c ? then : else)
    Loop(M = constant, cond = true, body passes its condition through / returns true)
        ->  M copies of the body, iteration t bound to (t, true, values carried from copy t-1);
            scan outputs = Concat(Unsqueeze(scan_t, 0) for t < M)             (the Loop's definition)

Spliced names: the branch's own tensors keep their names when unique in the model (else ``<If name>/<name>``),
a Loop copy's are ``<Loop name>/iter<t>/<name>``; the producer of each branch output writes the If's output name,
so graph output names never change (an Identity only where a branch output is an enclosing tensor or an
initializer that a graph output must name). Unrolling is bounded: trip count <= ``_MAX_TRIP`` and trip count x
body nodes <= ``_MAX_UNROLLED_NODES`` (reported in the metrics). Every If / Loop / Scan left in place gets a
Rejection naming what keeps it (and the graph input that would let it fold: ``--freeze-input``).

Find and rewrite: ``find`` only reads. It returns one round of typed plans — :class:`FoldNode` (fold this node to
these values), :class:`InlineIf` (inline this If's chosen branch), :class:`UnrollLoop` (unroll this Loop this
many times) — and a Rejection for each candidate it leaves. It evaluates into its own table (name -> array), so a
chain folds in one round and an If whose condition that chain computes is planned in the same round. What only
exists after a rewrite (an inlined branch's nodes, the shapes inferred after a fold) is the next round's: ``run``
repeats ``rewrite(find())`` with shape inference between rounds until a find plans nothing (at most
``_MAX_ROUNDS``), then runs cleanup on the flattened graph and rejects what is left.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import first_line
from onnx_npu_fix.ir.graph import (
    GraphEditor,
    GraphIndex,
    all_known,
    constant_node_value,
    drop_nodes,
    get_attr,
    has_subgraphs,
    infer_shapes,
    opset_version,
    remove_dead_nodes,
    shape_of_value_info,
    tensor_from_array,
    unused_after,
)
from onnx_npu_fix.ir.ops import CONTROL_FLOW_OPS, RANDOM_OPS, is_default_domain
from onnx_npu_fix.ir.subgraph import ModelNames, rename_in_graph, splice, trace_origin
from onnx_npu_fix.ir.weights import tensor_value
from onnx_npu_fix.passes.base import Change, Fixes, Found, Pass, PassResult, Plan, Rejection
from onnx_npu_fix.passes.cleanup import CleanupPass

_NEVER_FOLD = RANDOM_OPS | {"Constant", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
# Quantization nodes stay: vendor compilers read the QDQ pattern around weights; folding them would dequantize
# the weights into float and break the QDQ form the toolchain requires.
_MAX_ROUNDS = 64  # rounds of folding + shape inference; each nesting level of Ifs needs one or two
_MAX_TRIP = 64  # Loop unrolling bounds: iterations, and copies of body nodes in all
_MAX_UNROLLED_NODES = 4096


@dataclass(kw_only=True)
class FoldNode(Plan):
    """Replace ``node`` by initializers under its output names holding ``values``: its outputs, evaluated."""

    node: onnx.NodeProto
    values: list[np.ndarray]


@dataclass(kw_only=True)
class InlineIf(Plan):
    """Replace If ``node`` by the nodes of ``branch`` (``then_branch`` / ``else_branch``), the one its constant
    condition picks."""

    node: onnx.NodeProto
    branch: str


@dataclass(kw_only=True)
class UnrollLoop(Plan):
    """Replace Loop ``node`` by ``trip`` copies of its body, ``unrolled_nodes`` nodes in all (module docstring)."""

    node: onnx.NodeProto
    trip: int
    unrolled_nodes: int


@dataclass(kw_only=True)
class StoreConstant(Plan):
    """Replace Constant ``node`` by an initializer of the same name and value, because an op in the target's
    ``initializer_inputs`` reads it (``constant-node-input``): every reader sees the same tensor, so this is exact."""

    node: onnx.NodeProto
    value: np.ndarray


class FoldConstantsPass(Pass):
    """Constant folding. ``find`` is one read-only round: it evaluates every node whose inputs are constant,
    propagating the values it computed in its own table (so a whole Shape -> ... -> Concat chain folds in one
    round), and plans the Ifs and Loops those values decide. What an inlined branch or the shapes inferred after
    a round expose is only there for the next round: :meth:`run` repeats find and rewrite until a find plans
    nothing."""
    name = "fold-constants"
    summary = "fold Shape/Gather/Concat chains and other constant subexpressions into initializers"
    exact = True
    fixes = (
        Fixes("unknown-shape", upstream=True, note="when folding makes it static"),
        Fixes("dynamic-shape", upstream=True,
              note="for a graph output whose unknown shape starts at its producer, when folding makes it static"),
        Fixes("constant-node-input", upstream=True,
              note="the Constant becomes an initializer; an op computed from constants only folds"),
        Fixes("control-flow", asked=False, note="when its condition / trip count is constant"),
    )

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        return self._find(model, options, spent=0)

    def _find(self, model: onnx.ModelProto, options: FixOptions, spent: int) -> Found:
        """One round's plans; ``spent``: nodes the Loops unrolled in the rounds before it (one budget per run)."""
        found = Found()
        stored = _stored_constants(model, options.initializer_inputs)
        if not (stored or _has_candidates(model)):
            return found  # the usual case on a clean graph: no index, no evaluation
        index = GraphIndex(model)
        known = self._find_folds(model, index, options.large_tensor_bytes, found)
        folded = {id(p.node) for p in found.plans}
        found.plans.extend(_find_stores(model, stored, {p.node.name for p in found.plans}))
        dead = {id(n) for n in unused_after(model, gone=folded)[0]} if folded else set()
        _find_control_flow(model, index, known, dead, spent, found, blocking=not options.allow_control_flow)
        return found

    def run(self, model: onnx.ModelProto, options: FixOptions) -> PassResult:
        """Rounds of ``rewrite(find())`` with shape inference between them, until a find plans nothing; then
        cleanup on the flattened graph (when an If or Loop was folded) and a Rejection for every node left."""
        result = PassResult()
        if not (_has_candidates(model) or _stored_constants(model, options.initializer_inputs)):
            return result
        stats = {"ifs_inlined": 0, "loops_unrolled": 0, "nodes_unrolled": 0,
                 "max_trip_count": _MAX_TRIP, "max_unrolled_nodes": _MAX_UNROLLED_NODES}
        skipped: dict[str, Rejection] = {}  # node name -> why its constant inputs did not fold (latest round)
        for _ in range(_MAX_ROUNDS):
            found = self._find(model, options, spent=stats["nodes_unrolled"])
            skipped.update((r.node, r) for r in found.rejections if r.op not in CONTROL_FLOW_OPS)
            if not found.plans:
                break
            step = self.rewrite(model, options, found)
            result.changes.extend(step.changes)
            for key, count in step.metrics.get("control_flow", {}).items():
                if key.startswith(("ifs_", "loops_", "nodes_")):
                    stats[key] += count
            infer_shapes(model)
        else:
            result.warnings.append(f"stopped after {_MAX_ROUNDS} rounds of folding; run it again to go on")
        if stats["ifs_inlined"] or stats["loops_unrolled"]:
            # Identity / Dropout nodes that only a subgraph read were kept by cleanup, and the spliced branches
            # bring their own: cleanup runs again on the flattened graph (it ran before this pass).
            tidy = CleanupPass().run(model, options)
            result.changes.extend(tidy.changes)
            result.rejections.extend(tidy.rejections)
        remaining = {n.name for n in model.graph.node}
        result.rejections.extend(r for name, r in skipped.items() if name in remaining)
        _reject_remaining(model, stats, result, blocking=not options.allow_control_flow)
        # The initializers a fold left unused are dropped by the pass manager (ir.graph.remove_unused), as for
        # every pass.
        return result

    def rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        """Apply exactly ``found.plans``: the folds first (and drop the nodes they leave dead), then the If /
        Loop plans; ``metrics["control_flow"]`` counts the latter."""
        result = PassResult(rejections=list(found.rejections))
        folds = [p for p in found.plans if isinstance(p, FoldNode)]
        if folds:
            drop_nodes(model, (p.node for p in folds))
            model.graph.initializer.extend(folded_tensor(np.asarray(value), out) for p in folds
                                           for out, value in zip(p.node.output, p.values) if out)
            result.changes += [Change(p.node.name, p.node.op_type, "folded to constant",
                                      new=[list(np.shape(v)) for v in p.values]) for p in folds]
            remove_dead_nodes(model)
        stores = [p for p in found.plans if isinstance(p, StoreConstant)]
        if stores:
            drop_nodes(model, (p.node for p in stores))
            model.graph.initializer.extend(folded_tensor(p.value, p.node.output[0]) for p in stores)
            result.changes += [Change(p.node.name, "Constant", p.action, detail={"read_by": list(p.nodes[:-1])})
                               for p in stores]
        flow = [p for p in found.plans if isinstance(p, (InlineIf, UnrollLoop))]
        if flow:
            _Splicer(model, result).apply(flow)
        return result

    @staticmethod
    def _find_folds(model: onnx.ModelProto, index: GraphIndex, limit: int, found: Found) -> dict[str, np.ndarray]:
        """A FoldNode plan for every node whose inputs are constant or were evaluated before it in this sweep,
        a Rejection for those whose evaluation failed or is too large; returns the values evaluated."""
        known: dict[str, np.ndarray] = {}
        opsets = list(model.opset_import)
        for node in model.graph.node:
            if not is_default_domain(node) or node.op_type in _NEVER_FOLD or has_subgraphs(node):
                continue
            if any(o in index.output_set for o in node.output):
                continue  # a graph output must stay a computed tensor with its declared name
            values = _evaluate(index, node, known, opsets)
            if values is None:
                continue
            if isinstance(values, str):
                found.rejections.append(Rejection(node.name, node.op_type, values))
                continue
            if any(v.nbytes > limit for v in values):
                size = max(v.nbytes for v in values)
                found.rejections.append(Rejection(node.name, node.op_type, f"its constant result has {size} "
                                                  f"bytes, above --large-tensor {limit}"))
                continue
            for out, value in zip(node.output, values):
                known[out] = value
            found.plans.append(FoldNode((node.name,), "folded to constant", node=node, values=list(values)))
        return known


SHAPE_LIKE_ELEMENTS = 64
"""Folded int64 / int32 tensors up to this many elements (pads, shapes, axes, starts) are stored typed."""


def folded_tensor(value: np.ndarray, name: str) -> onnx.TensorProto:
    """The initializer a folded value becomes: raw bytes, except a small int64 / int32 tensor (a shape-like one:
    pads, shape, axes), which is stored in ``int64_data`` / ``int32_data``. Why: rknn-toolkit2 2.5.0 reads a
    raw-bytes integer initializer as a read-only array and writes into it when it fuses a Pad into a Conv
    (``ValueError: assignment destination is read-only``); the typed field gives it a writable copy.
    onnx and onnxruntime read both forms as the same values."""
    value = np.asarray(value)
    if value.dtype in (np.int64, np.int32) and value.size <= SHAPE_LIKE_ELEMENTS:
        return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape,
                                  value.reshape(-1).tolist())
    return tensor_from_array(value, name)


def _evaluate(index: GraphIndex, node: onnx.NodeProto, known: dict[str, np.ndarray], opsets):
    """The node's constant outputs; None when an input is not constant; a reason when they are but the
    evaluation failed."""
    if node.op_type in ("Shape", "Size"):
        shape = index.static_shape(node.input[0])
        if shape is None:
            return None
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
        full = np.array(shape, dtype=np.int64)
        start = _attr_int(node, "start", 0)
        end = _attr_int(node, "end", None)
        return [full[start:end]]
    inputs = []
    for name in node.input:
        if not name:
            inputs.append(None)
            continue
        value = _const(index, known, name)
        if value is None:
            return None
        inputs.append(value)
    if not inputs:
        return None
    return _run_reference(node, inputs, opsets)


def _const(index: GraphIndex, known: dict[str, np.ndarray] | None, name: str) -> np.ndarray | None:
    """``name``'s constant value: evaluated by this round's find (``known``), an initializer or a Constant."""
    value = known.get(name) if known else None
    return index.const_value(name) if value is None else value


def _find_control_flow(model: onnx.ModelProto, index: GraphIndex, known: dict[str, np.ndarray], dead: set[int],
                       spent: int, found: Found, *, blocking: bool) -> None:
    """An InlineIf / UnrollLoop plan for every If / Loop that ``known`` and the constants decide (not those the
    round's folds leave dead: they are dropped first), a Rejection with the reason for the others."""
    for node in model.graph.node:
        if node.op_type not in CONTROL_FLOW_OPS or not is_default_domain(node) or id(node) in dead:
            continue
        if node.op_type == "If":
            branch, reason = _plan_if(index, node, known)
            if branch is not None:
                found.plans.append(InlineIf((node.name,), f"inlined {branch}", node=node, branch=branch))
                continue
        elif node.op_type == "Loop":
            trip, reason = _plan_loop(index, node, spent, known)
            if trip is not None:
                count = _unrolled_nodes(node, trip)
                spent += count
                found.plans.append(UnrollLoop((node.name,), "unrolled", node=node, trip=trip,
                                              unrolled_nodes=count))
                continue
        else:
            reason = why_control_flow_stays(index, node)
        found.rejections.append(Rejection(node.name, node.op_type, str(reason), blocking=blocking))


def _unrolled_nodes(node: onnx.NodeProto, trip: int) -> int:
    """The nodes unrolling Loop ``node`` ``trip`` times makes (:meth:`_Splicer._unroll_loop`): each copy of the
    body without its Identity nodes (splice drops them), and per scan output one Unsqueeze per copy plus a
    Concat when there is more than one copy."""
    body = get_attr(node, "body")
    spliced = sum(1 for n in body.node if not (n.op_type == "Identity" and is_default_domain(n) and n.input
                                               and n.input[0] and n.output))
    n_carried = len(node.input) - 2
    n_scan = len(body.output) - 1 - n_carried
    scans = sum(1 for k in range(n_scan) if n_carried + k < len(node.output) and node.output[n_carried + k])
    return trip * spliced + scans * (trip + (1 if trip > 1 else 0))


def _stored_constants(model: onnx.ModelProto, readers: tuple[str, ...]) -> dict[str, list[str]]:
    """Constant node output -> the nodes of an op in ``readers`` (the target's ``initializer_inputs``) that read
    it as an input after the first; empty without ``readers`` (one scan otherwise)."""
    if not readers:
        return {}
    constants = {node.output[0] for node in model.graph.node if node.op_type == "Constant" and node.output}
    read: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type in readers and is_default_domain(node):
            for name in node.input[1:]:
                if name in constants:
                    read.setdefault(name, []).append(node.name)
    return read


def _find_stores(model: onnx.ModelProto, read: dict[str, list[str]], folding: set[str]) -> list[StoreConstant]:
    """A StoreConstant plan for each Constant node of ``read`` (:func:`_stored_constants`) with a reader that does
    not fold this round (``folding``: the nodes this round's folds replace; a folded reader reads no Constant
    afterwards)."""
    if not read:
        return []
    plans = []
    for node in model.graph.node:
        if node.op_type != "Constant" or not node.output or node.output[0] not in read:
            continue
        value = constant_node_value(node)
        readers_left = [name for name in read[node.output[0]] if name not in folding]
        if value is None or not readers_left:
            continue  # a sparse_value / string form stays; a reader that folds reads no Constant afterwards
        plans.append(StoreConstant((*readers_left, node.name), "stored as an initializer", node=node,
                                   value=np.asarray(value)))
    return plans


def _has_candidates(model: onnx.ModelProto) -> bool:
    """Whether any node could fold: a Shape/Size, or a node whose inputs are all constants. One cheap scan."""
    graph = model.graph
    overridable = {i.name for i in graph.input}
    const = {t.name for t in graph.initializer if t.name not in overridable}
    for node in graph.node:
        op = node.op_type  # each field read builds a Python object: read once (100k nodes)
        if op == "Constant":
            const.update(node.output)
            continue
        if op in _NEVER_FOLD or not is_default_domain(node):
            continue
        if op in ("Shape", "Size") or op in CONTROL_FLOW_OPS:
            return True
        inputs = node.input
        if inputs and all_known(inputs, const):
            return True
    return False


def _attr_int(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return a.i
    return default


def _run_reference(node: onnx.NodeProto, inputs, opsets) -> list[np.ndarray] | str:
    """The node's outputs on constant ``inputs`` by onnx's reference evaluator, or why it could not evaluate them
    (the node then stays, with that reason as its Rejection)."""
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    single = helper.make_node(node.op_type, names, [f"out{i}" for i in range(len(node.output))],
                              domain=node.domain)
    single.attribute.extend(node.attribute)
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                    for n, v in zip(names, inputs) if n]
    graph_outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in single.output]
    model = helper.make_model(helper.make_graph([single], "fold", graph_inputs, graph_outputs),
                              opset_imports=opsets)
    try:
        evaluator = ReferenceEvaluator(model)
        outs = evaluator.run(None, {n: v for n, v in zip(names, inputs) if n})
    except Exception as exc:  # noqa: BLE001 - any failure of the reference only means: not folded, and why
        return f"onnx's reference evaluator cannot evaluate it ({type(exc).__name__}: {first_line(exc)})"
    return [np.asarray(o) for o in outs]


class _Splicer:
    """Applies If / Loop plans to the main graph: the branch or the body copies in the node's place."""

    def __init__(self, model: onnx.ModelProto, result: PassResult) -> None:
        self.model = model
        self.result = result
        self.stats = {"ifs_inlined": 0, "loops_unrolled": 0, "nodes_unrolled": 0}

    def apply(self, plans: list[InlineIf | UnrollLoop]) -> None:
        graph = self.model.graph
        index = GraphIndex(self.model)
        names = ModelNames(self.model)
        editor = GraphEditor(index)
        new_inits: list[onnx.TensorProto] = []
        aliases: dict[str, str] = {}
        for plan in plans:
            node = plan.node
            if isinstance(plan, InlineIf):
                nodes, inits, outputs = self._inline_if(node, plan.branch, names)
            else:
                nodes, inits, outputs = self._unroll_loop(node, plan.trip, names)
            for target, src in zip(node.output, outputs):
                if not target or target == src:
                    continue
                if target in index.output_set:
                    # A graph output keeps its name, and its value is an enclosing tensor or initializer here: no
                    # producer inside the subgraph can be renamed to write it, so one Identity carries it.
                    nodes.append(helper.make_node("Identity", [src], [target],
                                                  name=names.node("", f"{node.name}/{target}")))
                else:
                    aliases[target] = src
            editor.replace(node, nodes)
            new_inits.extend(inits)
        editor.commit()
        graph.initializer.extend(new_inits)
        rename_in_graph(graph, aliases)
        remove_dead_nodes(self.model)
        self.result.metrics["control_flow"] = dict(self.stats)

    def _inline_if(self, node: onnx.NodeProto, branch_name: str, names: ModelNames):
        branch = get_attr(node, branch_name)
        spliced = splice(branch, {}, names, node.name or "If", targets=list(node.output))
        self.stats["ifs_inlined"] += 1
        self.result.changes.append(Change(node.name, node.op_type, f"inlined {branch_name}",
                                          new={"nodes": len(spliced.nodes)}))
        return spliced.nodes, spliced.initializers, spliced.outputs

    def _unroll_loop(self, node: onnx.NodeProto, trip: int, names: ModelNames):
        body = get_attr(node, "body")
        n_carried = len(node.input) - 2
        n_scan = len(body.output) - 1 - n_carried
        prefix = node.name or "Loop"
        nodes: list[onnx.NodeProto] = []
        inits: list[onnx.TensorProto] = []
        carried = list(node.input[2:])
        scans: list[list[str]] = [[] for _ in range(n_scan)]
        # The iteration number and condition are scalars by the Loop's definition; an exporter that declares
        # them with shape [1] gets that shape, so the body's shapes stay what it declared.
        counter_shape = _declared_shape(body.input[0], ())
        cond_true = names.tensor("", f"{prefix}/cond")
        inits.append(onnx.numpy_helper.from_array(np.full(_declared_shape(body.input[1], ()), True), cond_true))
        for t in range(trip):
            counter = names.tensor("", f"{prefix}/iter{t}/i")
            inits.append(onnx.numpy_helper.from_array(np.full(counter_shape, t, np.int64), counter))
            bindings = {body.input[0].name: counter, body.input[1].name: cond_true}
            bindings.update({vi.name: carried[j] for j, vi in enumerate(body.input[2:])})
            last = t == trip - 1
            targets = [None, *(node.output[:n_carried] if last else [None] * n_carried), *[None] * n_scan]
            spliced = splice(body, bindings, names, f"{prefix}/iter{t}", targets=targets, keep_names=False)
            nodes.extend(spliced.nodes)
            inits.extend(spliced.initializers)
            carried = spliced.outputs[1:1 + n_carried]
            for k in range(n_scan):
                scans[k].append(spliced.outputs[1 + n_carried + k])
        outputs = list(carried)
        new_axes = opset_version(self.model) >= 13  # Unsqueeze takes axes as an input from opset 13
        axes = None
        if n_scan and new_axes:
            axes = names.tensor("", f"{prefix}/axes0")
            inits.append(onnx.numpy_helper.from_array(np.array([0], np.int64), axes))
        for k in range(n_scan):
            target = node.output[n_carried + k] if n_carried + k < len(node.output) else ""
            if not target:
                continue
            parts = []
            for t, part in enumerate(scans[k]):
                out = target if trip == 1 else names.tensor("", f"{prefix}/iter{t}/scan{k}")
                inputs = [part, axes] if new_axes else [part]
                attrs = {} if new_axes else {"axes": [0]}
                nodes.append(helper.make_node("Unsqueeze", inputs, [out],
                                              name=names.node("", f"{prefix}/iter{t}/unsqueeze{k}"), **attrs))
                parts.append(out)
            if trip > 1:
                nodes.append(helper.make_node("Concat", parts, [target], axis=0,
                                              name=names.node("", f"{prefix}/concat{k}")))
            outputs.append(target)
        self.stats["loops_unrolled"] += 1
        self.stats["nodes_unrolled"] += len(nodes)
        self.result.changes.append(Change(node.name, node.op_type, "unrolled",
                                          new={"trip_count": trip, "nodes": len(nodes)}))
        return nodes, inits, outputs


def _reject_remaining(model: onnx.ModelProto, stats: dict[str, int], result: PassResult, *,
                      blocking: bool) -> None:
    """A Rejection for every control-flow node still in the main graph, with what keeps it."""
    graph = model.graph
    if stats["ifs_inlined"] or stats["loops_unrolled"]:
        result.metrics["control_flow"] = dict(stats)
    if not any(n.op_type in CONTROL_FLOW_OPS for n in graph.node):
        return
    index = GraphIndex(model)
    for node in graph.node:
        if node.op_type not in CONTROL_FLOW_OPS or not is_default_domain(node):
            continue
        reason = why_control_flow_stays(index, node, spent=stats["nodes_unrolled"])
        if reason is None:  # would fold: only when the round limit stopped the pass
            reason = f"not reached within {_MAX_ROUNDS} rounds of folding"
        result.rejections.append(Rejection(node.name, node.op_type, reason, blocking=blocking))
    if not result.metrics.get("control_flow"):
        result.metrics["control_flow"] = dict(stats)


def _declared_shape(vi: onnx.ValueInfoProto, default: tuple) -> tuple:
    shape = shape_of_value_info(vi)
    if shape is None or not all(isinstance(d, int) for d in shape) or int(np.prod(shape, dtype=np.int64)) != 1:
        return default
    return tuple(shape)


def why_control_flow_stays(index: GraphIndex, node: onnx.NodeProto, *, spent: int = 0) -> str | None:
    """Why this pass leaves an If / Loop / Scan of the main graph alone, or None when it would fold it
    (constraints/ asks this for its ``control-flow`` finding). ``spent``: nodes the pass unrolled already."""
    if node.op_type == "If":
        return _plan_if(index, node)[1] or None
    if node.op_type == "Loop":
        return _plan_loop(index, node, spent)[1] or None
    return f"{node.op_type} is not unrolled (only If and Loop are folded)"


def _plan_if(index: GraphIndex, node: onnx.NodeProto,
             known: dict[str, np.ndarray] | None = None) -> tuple[str | None, str]:
    """(the branch attribute to inline, '') or (None, why the If stays). ``known``: values find evaluated."""
    cond = node.input[0] if node.input else ""
    value = _const(index, known, cond) if cond else None
    if value is None:
        return None, _not_constant("its condition", cond, index)
    if value.size != 1:
        return None, f"its condition {cond} has {value.size} elements, not 1"
    branch_name = "then_branch" if bool(value.reshape(-1)[0]) else "else_branch"
    branch = get_attr(node, branch_name)
    if branch is None:
        return None, f"it has no {branch_name}"
    if len(branch.sparse_initializer):
        return None, f"its {branch_name} holds sparse initializers, which are not spliced"
    if len(branch.output) != len(node.output):
        return None, f"its {branch_name} has {len(branch.output)} outputs for the If's {len(node.output)}"
    return branch_name, ""


def _plan_loop(index: GraphIndex, node: onnx.NodeProto, spent: int = 0,
               known: dict[str, np.ndarray] | None = None) -> tuple[int | None, str]:
    """(the trip count to unroll, '') or (None, why the Loop stays). ``spent``: nodes unrolled so far;
    ``known``: values find evaluated."""
    plan = _loop_trip(index, node, spent, known)
    return (plan, "") if isinstance(plan, int) else (None, plan)


def _loop_trip(index: GraphIndex, node: onnx.NodeProto, spent: int,
               known: dict[str, np.ndarray] | None) -> int | str:
    body = get_attr(node, "body")
    trip_name = node.input[0] if node.input else ""
    cond_name = node.input[1] if len(node.input) > 1 else ""
    if not trip_name:
        return "it has no trip count (it runs until its condition turns false)"
    trip_value = _const(index, known, trip_name)
    if trip_value is None:
        return _not_constant("its trip count", trip_name, index)
    trip = int(trip_value.reshape(-1)[0])
    if cond_name:
        cond_value = _const(index, known, cond_name)
        if cond_value is None:
            return _not_constant("its initial condition", cond_name, index)
        if not bool(cond_value.reshape(-1)[0]):
            trip = 0  # the condition is checked before the first iteration
    if body is None or len(body.input) < 2 or not body.output or len(body.input) != max(len(node.input), 2):
        return "its body does not have the Loop signature (iteration, condition, one input per carried value)"
    if len(body.sparse_initializer):
        return "its body holds sparse initializers, which are not spliced"
    if not _passes_condition_through(body, index, known):
        return (f"its body computes the loop condition ({body.output[0].name}): the number of iterations "
                f"depends on data")
    n_carried = max(len(node.input) - 2, 0)
    n_scan = len(body.output) - 1 - n_carried
    if n_scan < 0 or len(node.output) != n_carried + n_scan:
        return "its outputs do not match its body's outputs"
    if trip < 0:
        trip = 0
    if trip == 0 and n_scan:
        return "it runs 0 times and has scan outputs (their element shape is not known without a run)"
    if trip > _MAX_TRIP or trip * len(body.node) > _MAX_UNROLLED_NODES:
        return (f"trip count {trip} x {len(body.node)} body nodes is above the unroll bound (trip count <= "
                f"{_MAX_TRIP}, <= {_MAX_UNROLLED_NODES} unrolled nodes)")
    if spent + trip * len(body.node) > _MAX_UNROLLED_NODES:
        # The bound holds for the whole pass, so that Loops nested in Loops cannot multiply it.
        return (f"unrolling it ({trip} x {len(body.node)} body nodes) would pass the pass's budget of "
                f"{_MAX_UNROLLED_NODES} unrolled nodes ({spent} used by the Loops unrolled before it)")
    return trip


def _passes_condition_through(body: onnx.GraphProto, index: GraphIndex,
                              known: dict[str, np.ndarray] | None) -> bool:
    """Whether the body's condition output is its condition input (through Identity nodes) or constant true."""
    producers = {o: n for n in body.node for o in n.output}
    inits = {t.name: t for t in body.initializer}
    name = body.output[0].name
    for _ in range(len(body.node) + 1):
        if name == body.input[1].name:
            return True
        if name in inits:
            return bool(tensor_value(inits[name]).reshape(-1)[0])
        node = producers.get(name)
        if node is None:  # an enclosing-scope tensor
            value = _const(index, known, name)
            return value is not None and bool(value.reshape(-1)[0])
        if node.op_type == "Identity":
            name = node.input[0]
            continue
        if node.op_type == "Constant":
            value = constant_node_value(node)
            return value is not None and value.size == 1 and bool(value.reshape(-1)[0])
        return False
    return False


_FROM_CONSTANTS = "is computed from constants only"


def _not_constant(what: str, name: str, index: GraphIndex) -> str:
    origin = trace_origin(index, name)
    hint = origin.hint()
    if hint:
        return f"{what} {name} is not a constant: it depends on {_inputs(origin)}; fold with {hint}"
    if origin.constant_only:
        return (f"{what} {name} {_FROM_CONSTANTS}: fold-constants evaluates it, unless a node on the way cannot "
                f"be evaluated (see that node's rejection)")
    return f"{what} {name} is not a constant: it depends on data computed in the graph"


def control_flow_fix(index: GraphIndex, node: onnx.NodeProto) -> tuple[str | None, str]:
    """(what would fold this If / Loop / Scan — "fold-constants", "--freeze-input sr=<value>", … or None, why)
    for the ``control-flow`` finding of constraints/."""
    reason = why_control_flow_stays(index, node)
    if reason is None:
        return "fold-constants", "its condition is constant: fold-constants inlines it"
    if _FROM_CONSTANTS in reason:
        return "fold-constants", reason
    if "; fold with " in reason:  # the graph inputs that decide it: "--freeze-input sr=<value>"
        return reason.rsplit("; fold with ", 1)[1], reason
    return None, reason


def _inputs(origin) -> str:
    parts = [f"graph input {n}" for n in origin.values] + [f"the shape of {n}" for n in origin.shapes]
    return ", ".join(parts)
