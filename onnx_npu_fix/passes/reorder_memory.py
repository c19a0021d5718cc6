"""Pass ``reorder-memory``: run the nodes in a topological order with a lower activation-memory peak.

    A1 -> A2 -> A3 ┐            A1 -> A2 -> A3 -> B1 -> B2 -> B3 -> Concat
    B1 -> B2 -> B3 ┴> Concat    (each branch finishes before the next starts: only one branch's wide
    stored as A1 B1 A2 B2 ...    intermediates are live at a time, instead of both)

Only the order of ``graph.node`` changes — every node keeps its inputs, outputs and attributes — so the pass is
exact by construction (same dataflow graph, same values). The order comes from
:func:`onnx_npu_fix.analysis.schedule.order_plan`: greedy list scheduling over the ready nodes gives an incumbent,
then an exact best-first search over the sets of scheduled nodes (graphs up to ``EXACT_MAX_NODES`` nodes, at most
``options.schedule_budget`` state expansions, so the result does not depend on the machine) either proves it
optimal, finds the optimum, or stops with a lower bound — the largest (inputs + outputs) of a single node, or the
least peak of the unexplored partial orders. See analysis/schedule.py for the liveness model and its assumptions.
The graph is rewritten only when the order's estimated peak is strictly lower than the stored order's, so a second
run changes nothing. The peak depends on shapes:
tensors of unknown shape count as 0 bytes, and the pass says so in a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from onnx_npu_fix.analysis.schedule import EXACT_MAX_NODES, OrderPlan, order_plan
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import GraphIndex, format_bytes
from onnx_npu_fix.passes.base import Change, Fixes, Found, Pass, PassResult, Plan


@dataclass
class ReorderPlan(Plan):
    """Store the nodes in ``schedule.order`` (positions in ``graph.node`` as find saw it), which lowers the
    estimated peak from ``schedule.peak_before`` to ``schedule.peak_after``."""

    schedule: OrderPlan


class ReorderMemoryPass(Pass):
    name = "reorder-memory"
    summary = "reorder nodes (topologically) to lower the estimated activation-memory peak"
    exact = True
    fixes = (Fixes("sram", asked=False, note="if a reordering fits"),)

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        """Read-only: the memory-aware order (one plan naming the graph) when it lowers the estimated peak; the
        peaks and the search's figures as metrics either way."""
        # Peaks scale with act_bytes uniformly; it only matters for the figures in the report.
        schedule = order_plan(GraphIndex(model), max(1, options.act_bytes), options.schedule_budget)
        found = Found(metrics={
            "peak_bytes_before": schedule.peak_before, "peak_bytes_after": schedule.peak_after,
            "act_bytes": options.act_bytes, "lower_bound_bytes": schedule.lower_bound,
            "optimal": schedule.optimal, "states_expanded": schedule.expanded})
        if schedule.unknown:
            found.warnings.append(f"{schedule.unknown} activation tensors have unknown shapes and count as 0 "
                                  "bytes; the memory-aware order may not be the best")
        if not schedule.optimal:
            stopped = (f"stopped after {schedule.expanded} states (options.schedule_budget)" if schedule.expanded
                       else f"did not run (above {EXACT_MAX_NODES} nodes, or a cycle)")
            found.warnings.append(f"the exact schedule search {stopped}; the best order "
                                  f"found peaks at {format_bytes(schedule.peak_after)}, no order is below "
                                  f"{format_bytes(schedule.lower_bound)}")
        if schedule.improves:
            found.plans.append(ReorderPlan((model.graph.name or "(graph)",), "reordered nodes", schedule))
        return found

    def rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        result = found.report()
        graph = model.graph
        for plan in found.plans:
            assert isinstance(plan, ReorderPlan)
            schedule = plan.schedule
            order, before, after = schedule.order, schedule.peak_before, schedule.peak_after
            moved = sum(1 for step, v in enumerate(order) if step != v)
            reordered = [_detached(graph.node[v]) for v in order]
            del graph.node[:]
            graph.node.extend(reordered)
            result.changes.append(Change(
                graph.name or "(graph)", "(graph)", "reordered nodes", old=before, new=after,
                detail={"nodes_moved": moved, "method": schedule.method, "optimal": schedule.optimal,
                        "lower_bound_bytes": schedule.lower_bound,
                        "peak": f"{format_bytes(before)} -> {format_bytes(after)}"}))
        return result


def _detached(node: onnx.NodeProto) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy
