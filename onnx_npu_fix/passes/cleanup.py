"""Pass ``cleanup``: remove Identity and inference-time Dropout, dead nodes and unused initializers.

    X -> Identity -> Y -> f          becomes   X -> f          (Y renamed to X in its consumers)
    X -> Dropout(ratio) -> Y         becomes   X              (at inference Dropout is the identity; opset >= 12
                                                                training_mode must be absent or constant false)

Exact by construction. Graph input and output names and their order never change: when ``Y`` is a graph output,
the producer of ``X`` is renamed to write ``Y`` instead, which is only possible when ``X`` is neither a graph input,
an initializer, a graph output, nor read by anything else. A node is dead when none of its outputs reaches a graph
output; unused initializers (and the graph inputs that merely declared them) are dropped.
"""

from __future__ import annotations

import onnx

from onnx_npu_fix.graph import (
    GraphEditor,
    GraphIndex,
    has_subgraphs,
    remove_unused,
)
from onnx_npu_fix.options import FixOptions
from onnx_npu_fix.passes.base import Change, Pass, PassResult, Rejection


class CleanupPass(Pass):
    name = "cleanup"
    summary = "remove Identity / inference Dropout, dead nodes and unused initializers"
    exact = True
    keeps_shapes = True

    def run(self, model: onnx.ModelProto, options: FixOptions) -> PassResult:
        result = PassResult()
        graph = model.graph
        if any(n.op_type in ("Identity", "Dropout") for n in graph.node):
            self._remove_no_ops(model, result)
        dead, unused = remove_unused(model)
        for node in dead:
            result.changes.append(Change(node.name, node.op_type, "removed dead node"))
        for name in unused:
            result.changes.append(Change(name, "initializer", "removed unused initializer"))
        return result

    def _remove_no_ops(self, model: onnx.ModelProto, result: PassResult) -> None:
        graph = model.graph
        index = GraphIndex(model)
        rename: dict[str, str] = {}  # tensor name -> the name its readers should use instead

        def resolve(name: str) -> str:
            while name in rename:
                name = rename[name]
            return name

        output_renames: dict[str, tuple[onnx.NodeProto, str]] = {}  # graph output name -> (producer, old)
        removed: set[int] = set()
        for node in graph.node:
            if node.op_type not in ("Identity", "Dropout") or node.domain not in ("", "ai.onnx"):
                continue
            reason = self._why_kept(index, node)
            if reason:
                result.rejections.append(Rejection(node.name, node.op_type, reason))
                continue
            src, dst = resolve(node.input[0]), node.output[0]
            if dst in index.output_set:
                producer = index.producer.get(src)
                blocked = (
                    producer is None or src in index.output_set or src in index.initializers
                    or len(index.consumers_of(src)) != 1 or has_subgraphs(producer)
                )
                if blocked:
                    result.rejections.append(Rejection(
                        node.name, node.op_type,
                        "its output is a graph output and its input cannot take that name "
                        "(graph input, initializer, graph output or read elsewhere)"))
                    continue
                output_renames[dst] = (producer, src)
                rename[src] = dst
            else:
                rename[dst] = src
            removed.add(id(node))
            result.changes.append(Change(node.name, node.op_type, "removed"))

        if removed:
            for producer, old in output_renames.values():
                for i, out in enumerate(producer.output):
                    if out == old:
                        producer.output[i] = rename[old]
            for node in graph.node:
                if id(node) in removed:
                    continue
                for i, name in enumerate(node.input):
                    if name:
                        node.input[i] = resolve(name)
            editor = GraphEditor(index)
            for node in graph.node:
                if id(node) in removed:
                    editor.remove(node)
            editor.commit()

    @staticmethod
    def _why_kept(index: GraphIndex, node: onnx.NodeProto) -> str | None:
        if node.op_type == "Dropout":
            if len(node.output) > 1 and node.output[1] and (index.consumers_of(node.output[1])
                                                            or node.output[1] in index.output_set):
                return "its mask output is used"
            if len(node.input) > 2 and node.input[2]:
                training = index.const_value(node.input[2])
                if training is None or bool(training.reshape(-1)[0]):
                    return "training_mode is not a constant false"
        if not node.input or not node.input[0]:
            return "it has no input"
        if any(has_subgraphs(user) for user in index.consumers_of(node.output[0])):
            return "its output is read inside a subgraph (If/Loop/Scan), which this pass does not rewrite"
        return None
