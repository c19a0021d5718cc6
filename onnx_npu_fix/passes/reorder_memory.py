"""Pass ``reorder-memory``: run the nodes in a topological order with a lower activation-memory peak.

    A1 -> A2 -> A3 ┐            A1 -> A2 -> A3 -> B1 -> B2 -> B3 -> Concat
    B1 -> B2 -> B3 ┴> Concat    (each branch finishes before the next starts: only one branch's wide
    stored as A1 B1 A2 B2 ...    intermediates are live at a time, instead of both)

Only the order of ``graph.node`` changes — every node keeps its inputs, outputs and attributes — so the pass
is exact by construction (same dataflow graph, same values). The order comes from
:func:`onnx_npu_fix.ir.schedule.order_plan`: greedy list scheduling over the ready nodes gives an incumbent, then an
exact best-first search over the sets of scheduled nodes (graphs up to ``EXACT_MAX_NODES`` nodes, at most
``options.schedule_budget`` state expansions, so the result does not depend on the machine) either proves it
optimal, finds the optimum, or stops with a lower bound — the largest (inputs + outputs) of a single node, or
the least peak of the unexplored partial orders. See ir/schedule.py for the liveness model and its assumptions. The
graph is rewritten only when the order's estimated peak is strictly lower than the stored order's, so a second
run changes nothing. The peak depends on shapes:
tensors of unknown shape count as 0 bytes, and the pass says so in a warning.
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import GraphIndex, format_bytes
from onnx_npu_fix.ir.schedule import EXACT_MAX_NODES, order_plan
from onnx_npu_fix.passes.base import Change, Found, Pass, PassResult, Plan


class ReorderMemoryPass(Pass):
    name = "reorder-memory"
    summary = "reorder nodes (topologically) to lower the estimated activation-memory peak"
    exact = True

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        """Read-only: the memory-aware order (one plan naming the graph) when it lowers the estimated peak."""
        # Peaks scale with act_bytes uniformly; it only matters for the figures in the report.
        plan = order_plan(GraphIndex(model), max(1, options.act_bytes), options.schedule_budget)
        plans = [Plan((model.graph.name or "(graph)",), "reordered nodes", plan)] if plan.improves else []
        return Found(plans, state=plan)

    def rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        result = PassResult()
        graph = model.graph
        plan = found.state
        if plan.unknown:
            result.warnings.append(f"{plan.unknown} activation tensors have unknown shapes and count as 0 "
                                   "bytes; the memory-aware order may not be the best")
        result.metrics.update({"peak_bytes_before": plan.peak_before, "peak_bytes_after": plan.peak_after,
                               "act_bytes": options.act_bytes, "lower_bound_bytes": plan.lower_bound,
                               "optimal": plan.optimal, "states_expanded": plan.expanded})
        if not plan.optimal:
            stopped = (f"stopped after {plan.expanded} states (options.schedule_budget)" if plan.expanded
                       else f"did not run (above {EXACT_MAX_NODES} nodes, or a cycle)")
            result.warnings.append(f"the exact schedule search {stopped}; the best order "
                                   f"found peaks at {format_bytes(plan.peak_after)}, no order is below "
                                   f"{format_bytes(plan.lower_bound)}")
        if not found.plans:
            return result
        order, before, after = plan.order, plan.peak_before, plan.peak_after
        moved = sum(1 for step, v in enumerate(order) if step != v)
        reordered = [_detached(graph.node[v]) for v in order]
        del graph.node[:]
        graph.node.extend(reordered)
        result.changes.append(Change(
            graph.name or "(graph)", "(graph)", "reordered nodes", old=before, new=after,
            detail={"nodes_moved": moved, "method": plan.method, "optimal": plan.optimal,
                    "lower_bound_bytes": plan.lower_bound,
                    "peak": f"{format_bytes(before)} -> {format_bytes(after)}"}))
        return result


def _detached(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy
