"""``npufix reduce --shrink``: the minimal model's tensors made smaller where the ops allow it exactly, as long as
the failure stays.

After bisection and ddmin the nodes are few, but their tensors are as large as in the whole model (a [1,256,16000]
feature map). For each graph input of rank 3 or more, in turn, one axis at a time:

- a spatial axis (2 and up) is halved while the failure stays: nothing but the shapes changes (strict shape
  inference recomputes every one of them);
- the channel axis (1) is halved likewise when the input is read only as the data input of group-1 Convs /
  ConvTransposes whose weights are initializers nothing else reads: each weight keeps its first input channels
  (Conv axis 1, ConvTranspose axis 0), so the model computes the same sub-problem on fewer channels.

A halving must build (checker, strict inference, static shapes: candidates.unbuildable) and reproduce the
signature; the first one that does not ends that axis, so a size the failure needs (a Conv with more than 512
input channels) stays within a factor of 2 of the smallest that still fails. Judge calls: the number of halvings
kept plus one per axis.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from onnx_npu_fix.ir.graph import GraphIndex, copy_model, get_attr, shape_of_value_info, tensor_from_array
from onnx_npu_fix.ir.weights import tensor_value
from onnx_npu_fix.judge.candidates import Candidate, unbuildable

_CHANNEL_AXIS = {"Conv": 1, "ConvTranspose": 0}
"""The weight axis that holds a conv's input channels."""


def shrink_candidate(best: Candidate, fails: Callable[[bytes, int], bool]) -> Candidate:
    """``best`` with its graph inputs' axes halved while ``fails`` (serialized model, node count) holds."""
    model = best.model
    for name, axis in _axes(model):
        while True:
            trial = copy_model(model)
            if not _halve(trial, name, axis) or unbuildable(trial) is not None:
                break
            data = trial.SerializeToString()
            if not fails(data, len(best.nodes)):
                break
            model = trial
    return Candidate(best.nodes, model, model.SerializeToString())


def _axes(model: onnx.ModelProto) -> list[tuple[str, int]]:
    """(graph input, axis) for every axis of rank >= 3 graph inputs but the batch axis: channels first."""
    inits = {t.name for t in model.graph.initializer}
    found = []
    for vi in model.graph.input:
        shape = shape_of_value_info(vi)
        if vi.name not in inits and shape is not None and len(shape) >= 3:
            found += [(vi.name, axis) for axis in range(1, len(shape))]
    return found


def _halve(model: onnx.ModelProto, name: str, axis: int) -> bool:
    """Halve ``axis`` of graph input ``name`` in ``model`` (in place; shapes to be inferred again); False when it
    is 1 already or, for channels, the readers are not convs whose weights can follow."""
    vi = next(i for i in model.graph.input if i.name == name)
    dim = vi.type.tensor_type.shape.dim[axis]
    if dim.dim_value <= 1:
        return False
    size = dim.dim_value // 2
    if axis == 1 and not _cut_conv_weights(model, name, size):
        return False
    dim.dim_value = size
    del model.graph.value_info[:]
    for out in model.graph.output:  # symbolic until inferred again (ir.graph.infer_shapes fills those in)
        for d in out.type.tensor_type.shape.dim:
            d.dim_param = "shrunk"
    return True


def _cut_conv_weights(model: onnx.ModelProto, name: str, size: int) -> bool:
    """Keep the first ``size`` input channels of the weights of the convs that read ``name`` (all its readers must
    be group-1 Convs / ConvTransposes reading it as data, with an initializer weight read by nothing else)."""
    index = GraphIndex(model)
    readers = index.consumers_of(name)
    if not readers or name in index.graph_outputs:
        return False
    weights = []
    for node in readers:
        axis = _CHANNEL_AXIS.get(node.op_type)
        if axis is None or list(node.input).index(name) != 0 or get_attr(node, "group", 1) != 1 or \
                len(node.input) < 2 or node.input[1] not in index.initializers or \
                len(index.consumers_of(node.input[1])) != 1:
            return False
        weights.append((node.input[1], axis))
    for weight, axis in weights:
        tensor = index.initializers[weight]
        value = tensor_value(tensor)
        tensor.CopyFrom(tensor_from_array(np.take(value, range(size), axis=axis), weight))
    return True
