"""A synthetic compiler for the probe tests: ``python synthetic_judge.py --limits LIMITS.json MODEL`` exits 0 when
it "compiles" the model and 1 with an error line when not.

Its limits come from the JSON file the test writes and names in the judge command; npufix probe only runs the
command and never reads that file, so what it learns comes from the verdicts alone. Keys (each optional):

- ``depthwise_max_dilation``: a depthwise Conv (group > 1) with a larger dilation is refused;
- ``depthwise_deconv_max_stride``: a depthwise ConvTranspose with a larger stride is refused;
- ``refused_ops``: op types refused wherever they occur (the error names the node);
- ``refused_nodes``: node names refused (a compiler that cannot place one particular layer); ``hang_nodes``:
  node names the compiler hangs on;
- ``refused_alone_ops``: op types refused in a model with no Conv, ConvTranspose, MatMul or Gemm (as rknn-toolkit2
  places a Reshape alone on the CPU, and one beside a Conv on the NPU);
- ``channel_multiple``: a Conv / ConvTranspose whose output channel count is not a multiple is refused;
- ``linear_resize``: false refuses a Resize in linear mode;
- ``resize_factors`` / ``linear_factors``: a Resize (a linear one) whose scales factor is not listed is refused;
- ``hang_above_dilation``: a Conv with a larger dilation makes the compiler hang (the judge's timeout ends it);
  ``hang_mark``: a file the hanging compiler writes its process id to first;
- ``max_kernel`` / ``max_stride``: a Conv with a larger kernel extent / stride on some axis is refused;
- ``quantized_max_stride``: the same for a Conv whose weight comes from a DequantizeLinear;
- ``max_rank``: a tensor (input, output or inferred) of more axes is refused;
- ``batch_one``: true refuses a tensor whose axis 0 is not 1;
- ``qdq``: false refuses QuantizeLinear / DequantizeLinear.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import onnx
from onnx import numpy_helper

COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _output_channels(node: onnx.NodeProto, weights: dict[str, Any]) -> int | None:
    weight = weights.get(node.input[1]) if len(node.input) > 1 else None
    if weight is None:
        return None
    if node.op_type == "ConvTranspose":
        return weight.shape[1] * _attribute(node, "group", 1)
    return weight.shape[0]


def _node_refusal(node: onnx.NodeProto, limits: dict[str, Any], weights: dict[str, Any]) -> str | None:
    depthwise = _attribute(node, "group", 1) > 1
    dilation = max(_attribute(node, "dilations", [1]) or [1])
    stride = max(_attribute(node, "strides", [1]) or [1])
    if node.op_type == "Conv" and dilation > limits.get("hang_above_dilation", dilation):
        if "hang_mark" in limits:
            with open(limits["hang_mark"], "w", encoding="utf-8") as f:
                f.write(str(os.getpid()))
        time.sleep(600)
    if node.name in limits.get("hang_nodes", ()):
        time.sleep(600)
    if node.name in limits.get("refused_nodes", ()):
        return f"error: cannot place {node.op_type} {node.name}"
    if node.op_type in limits.get("refused_ops", ()):
        return f"error: unsupported op {node.op_type} {node.name}"
    if node.op_type == "Conv" and depthwise and dilation > limits.get("depthwise_max_dilation", dilation):
        return f"error: dwconv {node.name}: dilation out of range"
    if node.op_type == "ConvTranspose" and depthwise and stride > limits.get("depthwise_deconv_max_stride", stride):
        return f"error: deconv {node.name}: stride out of range"
    multiple = limits.get("channel_multiple", 1)
    channels = _output_channels(node, weights) if node.op_type in ("Conv", "ConvTranspose") else None
    if channels is not None and channels % multiple:
        return f"error: {node.name}: {channels} channels, not a multiple of {multiple}"
    if node.op_type == "Conv" and max(_attribute(node, "kernel_shape", [1])) > limits.get("max_kernel", 1 << 30):
        return f"error: conv {node.name}: kernel too large"
    if node.op_type == "Conv" and stride > limits.get("max_stride", stride):
        return f"error: conv {node.name}: stride too large"
    quantized = node.op_type == "Conv" and node.input[1] in weights.get("<dequantized>", ())
    if quantized and stride > limits.get("quantized_max_stride", stride):
        return f"error: quantized conv {node.name}: stride too large"
    if node.op_type in ("QuantizeLinear", "DequantizeLinear") and not limits.get("qdq", True):
        return "error: quantized models are not supported"
    linear = node.op_type == "Resize" and _attribute(node, "mode", b"") == b"linear"
    if linear and not limits.get("linear_resize", True):
        return "error: Resize mode linear unsupported"
    if node.op_type == "Resize":
        return _resize_refusal(node, limits, weights, linear)
    return None


def _resize_refusal(node: onnx.NodeProto, limits: dict[str, Any], weights: dict[str, Any],
                    linear: bool) -> str | None:
    scales = weights.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    factor = float(scales[-1]) if scales is not None and len(scales) else None
    if factor is not None and factor not in limits.get("resize_factors", [factor]):
        return f"error: Resize {node.name}: factor {factor:g} unsupported"
    if linear and factor is not None and factor not in limits.get("linear_factors", [factor]):
        return f"error: linear Resize {node.name}: factor {factor:g} unsupported"
    return None


def refusal(model: onnx.ModelProto, limits: dict[str, Any]) -> str | None:
    """Why the synthetic compiler refuses ``model`` under ``limits``, or None when it compiles it."""
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.attribute and node.attribute[0].name == "value":
            weights[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    weights["<dequantized>"] = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    computes = any(n.op_type in COMPUTE_OPS for n in model.graph.node)
    for node in model.graph.node:
        if not computes and node.op_type in limits.get("refused_alone_ops", ()):
            return f"error: {node.op_type} {node.name} placed on the CPU"
        reason = _node_refusal(node, limits, weights)
        if reason is not None:
            return reason
    return _tensor_refusal(model, limits)


def _tensor_refusal(model: onnx.ModelProto, limits: dict[str, Any]) -> str | None:
    inferred = onnx.shape_inference.infer_shapes(model)
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if len(dims) > limits.get("max_rank", len(dims)):
            return f"error: tensor {value.name}: rank {len(dims)} unsupported"
        if limits.get("batch_one") and dims and dims[0].dim_value > 1:
            return f"error: tensor {value.name}: batch {dims[0].dim_value} unsupported"
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limits", required=True)
    parser.add_argument("model")
    args = parser.parse_args(argv)
    with open(args.limits, encoding="utf-8") as f:
        limits = json.load(f)
    model = onnx.load(args.model)
    onnx.checker.check_model(model)
    reason = refusal(model, limits)
    if reason is not None:
        print(reason)
        return 1
    print("compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
