"""Candidate sub-models for a reduction: the model restricted to a set of its nodes, cut at tensors.

A candidate keeps a set of *removable* nodes (every node but those computed from constants only, which come along
with the nodes that read them, as ``--split`` recomputes them per segment: analysis/split.py ``pure_nodes``).
Cutting works as ``--split`` builds its segments (``build_segments``): a tensor a kept node reads but no kept
node makes becomes a graph input, and a tensor a kept node makes that no kept node reads — a graph output of the
model, or one its removed consumers read — becomes a graph output, each with its inferred shape and type (the
model carries fresh, static shapes: io.load.prepare). Initializers are copied as needed.

Every candidate must pass the onnx checker and strict shape inference, with static graph inputs, before a judge
sees it; one that does not is *unbuildable* (:meth:`CandidateBuilder.build` returns the reason) and is never sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx

from onnx_npu_fix.analysis.schedule import constant_names
from onnx_npu_fix.analysis.split import SegmentPlan, SplitPlan, build_segments, node_reads, pure_nodes
from onnx_npu_fix.errors import InputError, first_line
from onnx_npu_fix.ir.graph import TWO_GB, GraphIndex, approx_model_bytes, dynamic_inputs, infer_shapes

JUDGE_FILE_LIMIT = TWO_GB
"""The largest model a judge is handed, as one serialized file (protobuf serializes no more)."""


def judge_bytes(model: onnx.ModelProto, serialized: bytes | None = None) -> bytes:
    """``model`` serialized for a judge (one file; ``serialized``: those bytes, when at hand). A model of
    :data:`JUDGE_FILE_LIMIT` or more is refused with one line (exit 2): it would need its weights as external
    data beside it, which the judge's copy does not carry."""
    if serialized is not None and len(serialized) < JUDGE_FILE_LIMIT:
        return serialized
    size = len(serialized) if serialized is not None else approx_model_bytes(model)
    if size >= JUDGE_FILE_LIMIT:
        raise InputError(f"the model to judge is about {size / 2**30:.1f} GiB, over what one ONNX file holds "
                         f"({JUDGE_FILE_LIMIT} bytes), and a judge gets one file; nothing written")
    return model.SerializeToString()


@dataclass(frozen=True)
class Candidate:
    """A buildable candidate: the kept removable nodes, the model and its serialized bytes (what the judge gets)."""

    nodes: frozenset[int]
    """Indices into the reduced model's ``graph.node`` of the removable nodes kept."""
    model: onnx.ModelProto
    data: bytes


class CandidateBuilder:
    """Builds candidates of ``model`` (static shapes, inferred: io.load.prepare; left as it is)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        index = GraphIndex(model)
        self._nodes = list(model.graph.node)
        self._pure = pure_nodes(index, constant_names(index))
        self.removable: list[int] = [v for v in range(len(self._nodes)) if v not in self._pure]
        """The nodes a reduction chooses from, in the model's (topological) order."""
        self._reads = [node_reads(node) for node in self._nodes]
        self._producer = {out: v for v, node in enumerate(self._nodes) for out in node.output if out}
        self._read_anywhere = {name for names in self._reads for name in names}
        self._model_outputs = list(index.graph_outputs)
        self._initializers = set(index.initializers) - index.overridable

    def build(self, kept: Iterable[int]) -> Candidate | str:
        """The candidate keeping the removable nodes ``kept``, or why it cannot be built."""
        own = sorted(set(kept))
        if not own:
            return "no nodes"
        needed = sorted(self._with_constant_producers(own))
        made = {o for v in needed for o in self._nodes[v].output if o}
        read = {name for v in needed for name in self._reads[v]}
        inputs = list(dict.fromkeys(name for v in needed for name in self._reads[v]
                                    if name not in made and name not in self._initializers))
        outputs = [o for o in self._model_outputs if o in made]
        outputs += [o for v in own for o in self._nodes[v].output
                    if o and o not in read and o in self._read_anywhere and o not in outputs]
        if not outputs:
            return "no outputs (the kept nodes' results are not read anywhere)"
        plan = SplitPlan(None, 1, needed, segments=[SegmentPlan(needed, inputs, outputs, 0)])
        try:
            candidate = build_segments(self.model, plan)[0]
        except ValueError as exc:  # a cut tensor without a type
            return first_line(exc)
        candidate.producer_name = "npufix-reduce"
        candidate.graph.name = f"{self.model.graph.name or 'graph'}_reduced"
        problem = unbuildable(candidate)
        if problem is not None:
            return problem
        return Candidate(frozenset(own), candidate, judge_bytes(candidate))

    def _with_constant_producers(self, own: list[int]) -> set[int]:
        """``own`` and the constant-only nodes whose results they read (transitively)."""
        needed = set(own)
        stack = [self._producer[name] for v in own for name in self._reads[v] if name in self._producer]
        while stack:
            v = stack.pop()
            if v in needed or v not in self._pure:
                continue
            needed.add(v)
            stack.extend(self._producer[name] for name in self._reads[v] if name in self._producer)
        return needed


def unbuildable(candidate: onnx.ModelProto) -> str | None:
    """Why ``candidate`` may not go to a judge (the onnx checker, strict shape inference, a graph input without a
    static shape), or None; its shapes are inferred afresh (in place) on the way."""
    try:
        onnx.checker.check_model(candidate)
        infer_shapes(candidate)
    except Exception as exc:  # noqa: BLE001 - any refusal makes the candidate unbuildable, with its reason
        return first_line(exc)
    dynamic = dynamic_inputs(candidate)
    if dynamic:
        return f"input '{next(iter(dynamic))}' has no static shape"
    return None
