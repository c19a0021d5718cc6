"""A synthetic compiler for the probe tests: ``python synthetic_judge.py MODEL`` exits 0 when it "compiles" the
model and 1 with an error line when not. Its rules are its own (the tests never tell npufix): a depthwise Conv with
a dilation above 6, a depthwise ConvTranspose with a stride above 2, HardSwish and linear Resize are refused."""

from __future__ import annotations

import sys

import onnx

DEPTHWISE_MAX_DILATION = 6
DEPTHWISE_DECONV_MAX_STRIDE = 2
REFUSED_OP = "HardSwish"


def _attribute(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def refusal(model: onnx.ModelProto) -> str | None:
    for node in model.graph.node:
        group = _attribute(node, "group", 1)
        dilation = max(_attribute(node, "dilations", [1]))
        stride = max(_attribute(node, "strides", [1]))
        if node.op_type == "Conv" and group > 1 and dilation > DEPTHWISE_MAX_DILATION:
            return f"error: dwconv {node.name}: dilation out of range"
        if node.op_type == "ConvTranspose" and group > 1 and stride > DEPTHWISE_DECONV_MAX_STRIDE:
            return f"error: deconv {node.name}: stride out of range"
        if node.op_type == REFUSED_OP:
            return f"error: unsupported op {REFUSED_OP}"
        if node.op_type == "Resize" and _attribute(node, "mode", b"nearest") == b"linear":
            return "error: Resize mode linear unsupported"
    return None


def main(path: str) -> int:
    model = onnx.load(path)
    onnx.checker.check_model(model)
    reason = refusal(model)
    if reason is not None:
        print(reason)
        return 1
    print("compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
