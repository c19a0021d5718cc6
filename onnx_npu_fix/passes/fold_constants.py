"""Pass ``fold-constants``: evaluate constant subexpressions once input shapes are static.

    Shape(X) -> Gather -> Unsqueeze -> Concat -> Reshape(Y, .)   becomes   Reshape(Y, <constant>)

A node folds when every input is a constant (initializer or Constant) or it is ``Shape``/``Size`` of a tensor whose
shape is static; its outputs become initializers with the same names, and the chain that fed it dies (removed here).
Evaluation uses onnx's reference implementation at the model's opset — exact, since the runtime computes the same
values from the same constants. Shape inference is refreshed between rounds so shapes downstream of a newly constant
Reshape/Expand/Pad become static and can fold in turn. Random ops, nodes with subgraphs, custom domains and results
larger than ``--large-tensor`` bytes (onnxsim's ``--no-large-tensor``) are left alone.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnx_npu_fix.graph import (
    GraphEditor,
    GraphIndex,
    all_known,
    has_subgraphs,
    infer_shapes,
    remove_dead_nodes,
    remove_unused_initializers,
)
from onnx_npu_fix.options import FixOptions
from onnx_npu_fix.passes.base import Change, Pass, PassResult

_NEVER_FOLD = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
               "Bernoulli", "Constant", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
# Quantization nodes stay: vendor compilers read the QDQ pattern around weights; folding them would dequantize
# the weights into float and break the QDQ form the toolchain requires.
_MAX_ROUNDS = 8


class FoldConstantsPass(Pass):
    name = "fold-constants"
    summary = "fold Shape/Gather/Concat chains and other constant subexpressions into initializers"
    exact = True

    def run(self, model: onnx.ModelProto, options: FixOptions) -> PassResult:
        result = PassResult()
        if not _has_candidates(model):
            return result  # the usual case on a clean graph: no index, no inference
        opsets = list(model.opset_import)
        for _ in range(_MAX_ROUNDS):
            folded = self._fold_round(model, opsets, options.large_tensor_bytes, result)
            if not folded:
                break
            infer_shapes(model)
        if result.changes:
            for name in remove_unused_initializers(model.graph):
                result.changes.append(Change(name, "initializer", "removed unused initializer"))
        return result

    def _fold_round(self, model: onnx.ModelProto, opsets, limit: int, result: PassResult) -> bool:
        index = GraphIndex(model)
        editor = GraphEditor(index)
        known: dict[str, np.ndarray] = {}
        folded_any = False
        for node in model.graph.node:
            if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLD or has_subgraphs(node):
                continue
            if any(o in index.output_set for o in node.output):
                continue  # a graph output must stay a computed tensor with its declared name
            values = self._evaluate(index, node, known, opsets)
            if values is None:
                continue
            if any(v.nbytes > limit for v in values):
                continue
            for out, value in zip(node.output, values):
                known[out] = value
            editor.remove(node)
            for out, value in zip(node.output, values):
                if out:
                    editor.add_initializer(out, np.asarray(value), exact_name=True)
            result.changes.append(Change(node.name, node.op_type, "folded to constant",
                                         new=[list(np.shape(v)) for v in values]))
            folded_any = True
        if folded_any:
            editor.commit()
            remove_dead_nodes(model)
        return folded_any

    @staticmethod
    def _evaluate(index: GraphIndex, node: onnx.NodeProto, known: dict[str, np.ndarray], opsets):
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
            value = known.get(name)
            if value is None:
                value = index.const_value(name)
            if value is None:
                return None
            inputs.append(value)
        if not inputs:
            return None
        return _run_reference(node, inputs, opsets)


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
        if op in _NEVER_FOLD or node.domain not in ("", "ai.onnx"):
            continue
        if op in ("Shape", "Size"):
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


def _run_reference(node: onnx.NodeProto, inputs, opsets):
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
    except Exception:  # noqa: BLE001 - anything the reference cannot evaluate simply is not folded
        return None
    return [np.asarray(o) for o in outs]
