"""A model's outputs on every input set (:func:`run_model`, :func:`run_file`): in one onnxruntime session, or, for
a long graph (:func:`segmented`), as a chain of segments run one session at a time, the tensors between them
carried by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.host.heap import release_freed_memory
from onnx_npu_fix.io.external import MappedWeights
from onnx_npu_fix.io.serialize import model_bytes
from onnx_npu_fix.ir.graph import TWO_GB, approx_model_bytes, subgraphs
from onnx_npu_fix.pipeline.inputs import Feeds
from onnx_npu_fix.pipeline.validation.session import Outputs, Runner

SEGMENT_NODES = 1000
"""A graph with more nodes than this is run as a chain of segments (at most this many nodes each, see
:data:`SEGMENT_LENGTH`), one onnxruntime session at a time (see :func:`run_model`)."""

SEGMENT_LENGTH = 250
"""How many nodes a segment holds. onnxruntime's session creation (load, initialization and the session's
destruction, with graph optimizations off) grows faster than the graph even at this scale, so shorter segments
cost less per node; much shorter ones give the gain back to the sessions' fixed costs (and npufix's per segment).
The outputs are the same bytes at any length (each node runs the same kernel)."""

_UNSEGMENTABLE_OPS = ("Sequence", "Optional")
"""Op types holding these words make or take values other than tensors, which a segment's inputs cannot carry."""


def segmented(model: onnx.ModelProto, size: int | None = None) -> bool:
    """Whether :func:`run_model` runs ``model`` in segments: a long graph whose nodes only pass tensors to each
    other (no bodies reading outer-scope values, no sequences, no inputs with defaults), below 2 GB (``size``: its
    serialized size, when known), of IR version 4 or later (initializers need not be graph inputs)."""
    graph = model.graph
    if len(graph.node) <= SEGMENT_NODES or model.ir_version < 4:
        return False
    produced = {name for node in graph.node for name in node.output}
    if any(o.name not in produced for o in graph.output):
        return False  # an output that is an input or an initializer: the whole graph says it best
    if {vi.name for vi in graph.input} & {t.name for t in graph.initializer}:
        return False  # an input with a default (an initializer) that --validation-data may feed
    if any(subgraphs(node) or any(word in node.op_type for word in _UNSEGMENTABLE_OPS) for node in graph.node):
        return False
    return (size if size is not None else approx_model_bytes(model)) < TWO_GB


@dataclass
class _Segment:
    start: int
    stop: int
    inputs: list[str]
    """Tensors it reads that an earlier segment or the caller's feeds hold."""
    outputs: list[str]
    """Tensors it makes that a later segment reads, or graph outputs."""
    done_with: list[str]
    """Values no later segment reads (dropped once it ran)."""


def plan_segments(model: onnx.ModelProto, size: int | None = None) -> list[_Segment]:
    """``model``'s nodes (topologically sorted, as the checker requires) cut into runs of ``size`` nodes
    (default :data:`SEGMENT_LENGTH`, never more than :data:`SEGMENT_NODES`)."""
    graph = model.graph
    size = size or min(SEGMENT_LENGTH, SEGMENT_NODES)
    constants = {t.name for t in graph.initializer}
    cuts = list(range(0, len(graph.node), size)) + [len(graph.node)]
    needed_later = {o.name for o in graph.output}
    segments: list[_Segment] = []
    for start, stop in reversed(list(zip(cuts, cuts[1:]))):
        nodes = graph.node[start:stop]
        produced = {name for node in nodes for name in node.output if name}
        read = {name for node in nodes for name in node.input if name and name not in constants}
        outputs = [name for node in nodes for name in node.output if name and name in needed_later]
        inputs = sorted(read - produced)
        done_with = [name for name in inputs if name not in needed_later]
        needed_later = (needed_later - produced) | set(inputs)
        segments.append(_Segment(start, stop, inputs, outputs, done_with))
    return segments[::-1]


def _segment_model(model: onnx.ModelProto, segment: _Segment, values: Sequence[Outputs],
                   constants: dict[str, onnx.TensorProto]) -> bytes:
    """The serialized model of ``segment``: its nodes, the initializers they read, its inputs typed from
    ``values`` (per input set: what the runs so far computed, or the feeds; a dimension only where every set
    agrees; ``constants``: the graph's initializers by name)."""
    graph = model.graph
    nodes = graph.node[segment.start:segment.stop]
    read = dict.fromkeys(name for node in nodes for name in node.input if name in constants)
    part = onnx.GraphProto(name=f"{graph.name}-{segment.start}")
    part.node.extend(nodes)
    part.initializer.extend(constants[name] for name in read)
    for name in segment.inputs:
        held = [held[name] for held in values]
        if not all(isinstance(value, np.ndarray) for value in held) or len({v.dtype for v in held}) != 1:
            raise _NotSegmentable(name)
        shapes = {value.shape for value in held}
        dims = [d if len({shape[i] for shape in shapes}) == 1 else None for i, d in enumerate(held[0].shape)] \
            if len({len(shape) for shape in shapes}) == 1 else None
        part.input.append(onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(held[0].dtype), dims))
    part.output.extend(onnx.ValueInfoProto(name=name) for name in segment.outputs)
    whole = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import,
                            functions=model.functions, graph=part)
    return model_bytes(whole)


class _NotSegmentable(Exception):
    """A value between two segments is not a tensor: the graph is run whole."""


def run_model(model: onnx.ModelProto | None, feeds: Sequence[Feeds], *,
              data: bytes | None = None, task: str = "validation",
              weights: MappedWeights | None = None,
              enough: Callable[[Outputs], bool] | None = None, size: int | None = None,
              path: str | None = None) -> list[Outputs]:
    """``model``'s outputs on every input set (``data``: it serialized already; needed without ``model``);
    ``task``: what its progress steps are called (progress.Step); ``weights``: see Runner; ``enough``: see
    Runner.run_all (a graph run in segments runs every set: each segment takes them all in turn); ``size``: the
    model's serialized size, when known without ``data`` (estimating it reads every initializer); ``path``:
    ``data`` written to ``weights`` already (MappedWeights.write_bytes), the session's file.

    One session, unless the graph is long (:func:`segmented`): onnxruntime's session creation grows faster than
    the graph (more than linearly in its nodes), so a long graph runs as a chain of :data:`SEGMENT_LENGTH`-node
    segments, one session at a time, every input set through each, the tensors between them carried by name.
    Graph optimizations are off (Runner), so each node runs the same kernel on the same values as in the whole
    graph: the outputs are bit-identical, and only one segment's weights are in a session at a time."""
    if path is None and model is not None and segmented(model, len(data) if data is not None else size):
        try:
            return _run_segments(model, feeds, task)
        except _NotSegmentable:
            pass
    runner = Runner(None, model_path=path, refused=data) if path is not None else \
        Runner(model, data=data, weights=weights)
    try:
        return runner.run_all(feeds, task, enough)
    finally:
        runner.close()


def run_file(path: str, feeds: Sequence[Feeds], task: str = "validation") -> list[Outputs]:
    """The outputs of the model file at ``path`` on every input set (one session, closed after)."""
    runner = Runner(None, model_path=path)
    try:
        return runner.run_all(feeds, task)
    finally:
        runner.close()


def _run_segments(model: onnx.ModelProto, feeds: Sequence[Feeds], task: str) -> list[Outputs]:
    values: list[Outputs] = [dict(f) for f in feeds]
    constants = {t.name: t for t in model.graph.initializer}
    segments = plan_segments(model)
    for done, segment in enumerate(segments, 1):
        progress.emit(progress.Step(f"{task} (segments)", done - 1, len(segments)))
        if not segment.outputs:
            continue  # nothing it makes is read later: dead nodes
        runner = Runner(None, data=_segment_model(model, segment, values, constants))
        try:
            for held in values:
                held.update(runner.run({name: held[name] for name in segment.inputs}))
                for name in segment.done_with:
                    del held[name]
        finally:
            runner.close(trim=False)  # once at the end: a segment's session frees little, a trim each would add up
    release_freed_memory()
    progress.emit(progress.Step(f"{task} (segments)", len(segments), len(segments)))
    names = [o.name for o in model.graph.output]
    return [{name: held[name] for name in names} for held in values]
