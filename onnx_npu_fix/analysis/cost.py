"""What a model costs an NPU, before and after the fix: nodes by op type, conv MACs, weight bytes, activation peak.

Like onnxsim's before/after table, so the price of alignment (zero channels) and space-to-batch (tiled weights,
a few extra output positions) is visible in every summary. One pass over the nodes for the op counts and MACs
(:func:`graph.macs_of`), one over the initializers for the weight bytes, and the activation peak of the stored
order from :mod:`memory` (no order search: it is the figure the model has as written). Above
``DETAIL_MAX_NODES`` nodes the MACs and the peak are skipped (None): they need an index and shapes of the whole
graph, a large share of a long graph's run; the op counts and weight bytes (one cheap walk each) stay. Nodes and
weights inside If / Loop / Scan bodies are counted too (a model whose branches fold-constants inlined would
otherwise seem to grow from nothing); their MACs and activations are not, as memory.py estimates the outer graph
only.

MACs and the peak need static shapes. An export's Shape chains leave most shapes unknown until fold-constants has
run, so a sum over the known ones would read as growth that did not happen (DeepLabV3+: "conv MACs 0 -> 279.67 M").
The input's MACs and peak are therefore taken on a copy with the shape chains folded (api's ``_input_cost``), as
--check's analysis does; a figure whose shapes stay unknown even then is None and printed "unknown", never a
partial sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix.analysis.schedule import stored_peak
from onnx_npu_fix.ir.graph import (
    GraphIndex,
    format_bytes,
    has_subgraphs,
    macs_of,
    may_hold_subgraphs,
    payload_bytes,
    subgraphs,
    type_may_hold_subgraphs,
)
from onnx_npu_fix.ir.ops import DEFAULT_DOMAINS, is_default_domain

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
    unknown: dict[str, int] = field(default_factory=dict)
    """Why a figure is None although the model is small enough to count: {"conv_macs": convs, "peak_bytes":
    activation tensors} whose shape is not static."""

    @property
    def nodes(self) -> int:
        return sum(self.ops.values())

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "ops": dict(sorted(self.ops.items())), "conv_macs": self.conv_macs,
                "weight_bytes": self.weight_bytes, "peak_bytes": self.peak_bytes, "act_bytes": self.act_bytes,
                "unknown_shapes": dict(self.unknown)}


def needs_index(model: onnx.ModelProto) -> bool:
    """Whether :func:`model_cost` of ``model`` reads a GraphIndex (its MACs and peak): up to DETAIL_MAX_NODES."""
    return len(model.graph.node) <= DETAIL_MAX_NODES


def model_cost(model: onnx.ModelProto, act_bytes: int = 1, index: GraphIndex | None = None) -> Cost:
    """The cost of ``model`` (shapes must be inferred, as the pass manager leaves them). ``index``: one of
    ``model`` built already, else one is built when :func:`needs_index`."""
    nodes = model.graph.node
    detail = needs_index(model)
    if detail:
        index = index or GraphIndex.of(model)
    ops: dict[str, int] = {}
    macs = 0
    blind = 0  # convs whose MACs need a shape that is not static
    bodies: list[onnx.GraphProto] = []
    if detail:
        assert index is not None
        # The index's per-node fields, read once when it was built.
        for node, op, domain, inputs, outputs in zip(index.nodes, index.ops, index.domains, index.node_inputs,
                                                     index.node_outputs):
            if domain not in DEFAULT_DOMAINS:
                op = f"{domain}.{op}"
            ops[op] = ops.get(op, 0) + 1
            if op in ("Conv", "ConvTranspose"):
                n = macs_of(index, op, inputs, outputs)
                macs += n
                blind += n == 0 and _shapes_unknown(index, op, inputs, outputs)
            elif type_may_hold_subgraphs(op, domain):  # (a qualified op is outside the default domain)
                bodies.extend(subgraphs(node))
    else:
        for node in nodes:
            op = node.op_type if is_default_domain(node) else f"{node.domain}.{node.op_type}"
            ops[op] = ops.get(op, 0) + 1
            if may_hold_subgraphs(node):  # in this walk: a second walk over every node for the few bodies costs more
                bodies.extend(subgraphs(node))
    weights = sum(payload_bytes(t) for t in model.graph.initializer)
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
    # The stored order's peak alone: memory.estimate_index's figure without its report (live tensors, node
    # floors, the liveness structure an order search needs), which was most of the cost table's time.
    peak, blank = stored_peak(index, act_bytes)
    unknown = {k: n for k, n in (("conv_macs", blind), ("peak_bytes", blank)) if n}
    return Cost(ops, None if blind else macs, weights, None if blank else peak, act_bytes, unknown)


def _shapes_unknown(index: GraphIndex, op: str, inputs: list[str], outputs: list[str]) -> bool:
    """macs_of counted 0 for lack of a static shape (not because a dimension is 0)."""
    measured = outputs[0] if op == "Conv" else inputs[0]
    return index.static_shape(inputs[1]) is None or index.static_shape(measured) is None


def cost_json(before: Cost, after: Cost) -> dict[str, Any]:
    return {"before": before.to_json(), "after": after.to_json()}


def _change(old: int | None, new: int | None, fmt, before: Cost, after: Cost, key: str) -> str:
    if old is None and new is None and not (before.unknown.get(key) or after.unknown.get(key)):
        return f"not counted above {DETAIL_MAX_NODES:,} nodes"
    if old is None or new is None:
        # No growth is claimed across a side that is not known; the side that is known is still shown.
        return f"{'unknown' if old is None else fmt(old)} -> {'unknown' if new is None else fmt(new)}"
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

    def change(key: str, fmt) -> str:
        return _change(getattr(before, key), getattr(after, key), fmt, before, after, key)

    lines = [f"{'cost':<16} nodes {change('nodes', count)}; conv MACs {change('conv_macs', macs)}; weights "
             f"{change('weight_bytes', format_bytes)}; activation peak {change('peak_bytes', format_bytes)} "
             f"({after.act_bytes} B/element)"]
    changed = sorted(set(before.ops) | set(after.ops),
                     key=lambda op: (-abs(after.ops.get(op, 0) - before.ops.get(op, 0)), op))
    deltas = [f"{op} {before.ops.get(op, 0)} -> {after.ops.get(op, 0)}" for op in changed
              if before.ops.get(op, 0) != after.ops.get(op, 0)]
    if deltas:
        shown = deltas[:8] + ([f"{len(deltas) - 8} more"] if len(deltas) > 8 else [])
        lines.append(f"{'':<16} ops: {', '.join(shown)}")
    return lines
