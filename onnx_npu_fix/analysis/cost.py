"""What a model costs an NPU, before and after the fix: nodes by op type, conv MACs, weight bytes, activation peak.

Like onnxsim's before/after table, so the price of alignment (zero channels) and space-to-batch (tiled weights,
a few extra output positions) is visible in every summary. One pass over the nodes for the op counts and MACs
(:func:`graph.node_macs`), one over the initializers for the weight bytes, and the activation peak of the stored
order from :mod:`memory` (no order search: it is the figure the model has as written). Above
``DETAIL_MAX_NODES`` nodes the MACs and the peak are skipped (None): at 100k nodes they cost ~2 s per model, a
quarter of the whole run; the op counts and weight bytes stay (0.2 s). Nodes and weights inside If / Loop / Scan
bodies are counted too (a model whose branches fold-constants inlined would otherwise seem to grow from nothing);
their MACs and activations are not, as memory.py estimates the outer graph only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix.analysis.memory import estimate_index
from onnx_npu_fix.ir.graph import GraphIndex, format_bytes, has_subgraphs, node_macs, payload_bytes, subgraphs
from onnx_npu_fix.ir.ops import is_default_domain

DETAIL_MAX_NODES = 20000


@dataclass
class Cost:
    ops: dict[str, int] = field(default_factory=dict)
    """Node count per op type (domain-qualified when not the default domain)."""
    conv_macs: int | None = 0
    """None above DETAIL_MAX_NODES nodes."""
    weight_bytes: int = 0
    """Initializer payload bytes (the weights as stored)."""
    peak_bytes: int | None = 0
    """Activation peak of the stored node order at ``act_bytes`` per element (memory.py); None above
    DETAIL_MAX_NODES nodes."""
    act_bytes: int = 1

    @property
    def nodes(self) -> int:
        return sum(self.ops.values())

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "ops": dict(sorted(self.ops.items())), "conv_macs": self.conv_macs,
                "weight_bytes": self.weight_bytes, "peak_bytes": self.peak_bytes, "act_bytes": self.act_bytes}


def model_cost(model: onnx.ModelProto, act_bytes: int = 1, index: GraphIndex | None = None) -> Cost:
    """The cost of ``model`` (shapes must be inferred, as the pass manager leaves them)."""
    nodes = model.graph.node
    detail = len(nodes) <= DETAIL_MAX_NODES
    if detail:
        index = index or GraphIndex(model)
    ops: dict[str, int] = {}
    macs = 0
    for node in nodes:
        op = node.op_type if is_default_domain(node) else f"{node.domain}.{node.op_type}"
        ops[op] = ops.get(op, 0) + 1
        if detail and op in ("Conv", "ConvTranspose"):
            macs += node_macs(index, node)
    weights = sum(payload_bytes(t) for t in model.graph.initializer)
    bodies = [g for node in nodes if has_subgraphs(node) for g in subgraphs(node)]
    while bodies:
        body = bodies.pop()
        weights += sum(payload_bytes(t) for t in body.initializer)
        for node in body.node:
            op = node.op_type if is_default_domain(node) else f"{node.domain}.{node.op_type}"
            ops[op] = ops.get(op, 0) + 1
            if has_subgraphs(node):
                bodies.extend(subgraphs(node))
    if not detail:
        return Cost(ops, None, weights, None, act_bytes)
    peak = estimate_index(index, act_bytes, reorder=False).peak_bytes
    return Cost(ops, macs, weights, peak, act_bytes)


def cost_json(before: Cost, after: Cost) -> dict[str, Any]:
    return {"before": before.to_json(), "after": after.to_json()}


def _change(old: int | None, new: int | None, fmt) -> str:
    if old is None or new is None:
        return f"not counted above {DETAIL_MAX_NODES:,} nodes"
    if old == new:
        return f"{fmt(old)} (same)"
    pct = f", {100 * (new - old) / old:+.0f}%" if old else ""
    return f"{fmt(old)} -> {fmt(new)}{pct}"


def render_cost(before: Cost, after: Cost) -> list[str]:
    """Summary lines (stderr, shown without -v): what the model costs before -> after the fix."""
    def count(n: int) -> str:
        return f"{n:,}"

    def macs(n: int) -> str:
        return f"{n / 1e6:.2f} M" if n >= 1e5 else f"{n:,}"

    lines = [f"{'cost':<16} nodes {_change(before.nodes, after.nodes, count)}; conv MACs "
             f"{_change(before.conv_macs, after.conv_macs, macs)}; weights "
             f"{_change(before.weight_bytes, after.weight_bytes, format_bytes)}; activation peak "
             f"{_change(before.peak_bytes, after.peak_bytes, format_bytes)} ({after.act_bytes} B/element)"]
    changed = sorted(set(before.ops) | set(after.ops),
                     key=lambda op: (-abs(after.ops.get(op, 0) - before.ops.get(op, 0)), op))
    deltas = [f"{op} {before.ops.get(op, 0)} -> {after.ops.get(op, 0)}" for op in changed
              if before.ops.get(op, 0) != after.ops.get(op, 0)]
    if deltas:
        shown = deltas[:8] + ([f"{len(deltas) - 8} more"] if len(deltas) > 8 else [])
        lines.append(f"{'':<16} ops: {', '.join(shown)}")
    return lines
