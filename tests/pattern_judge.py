"""A stand-in for a vendor compiler, run by tests/test_reduce.py as a real subprocess:
``python pattern_judge.py PATTERN[,PATTERN...] MODEL``. It rejects models that contain a structural pattern, with a
message like a compiler's, and accepts the rest (exit 0). Patterns, checked in the order given (the first found
is reported):

- ``pad3-mul``: a rank-3 Pad whose data input comes from a Mul (tpu-mlir's abort on ConvTasNet);
- ``pad3``: any rank-3 Pad, with the same message (what ``--remainder-pad pad`` emits on a 1-D conv);
- ``convt-stride``: a ConvTranspose with a stride above 4;
- ``conv-channels``: a Conv with more than 512 input channels;
- ``pad-conv``: a Pad with initializer pads read by a Conv (rknn-toolkit2 2.5.0's crash in its Pad-into-Conv
  fusion, reported as a Python traceback);
- ``op:TYPE``: any node of that op type; ``dilation:N``: a Conv with a dilation of N or more;
- ``sleep``: hangs (a compiler that never returns).

:func:`judge_bytes` is the same judgement in-process (the random-graph tests, where thousands of subprocesses
would cost minutes).

It reads the model with onnx's generated protobuf module alone (importing ``onnx`` costs seconds on a loaded CI
machine; the candidates carry their inferred shapes in value_info).
"""

import importlib.util
import os
import sys
import time


def _model_proto():
    spec = importlib.util.find_spec("onnx")  # finds the package without running its __init__
    path = os.path.join(os.path.dirname(spec.origin), "onnx_ml_pb2.py")
    module_spec = importlib.util.spec_from_file_location("onnx_ml_pb2_alone", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.ModelProto


def _ranks(graph):
    return {vi.name: len(vi.type.tensor_type.shape.dim) for vi in [*graph.input, *graph.value_info, *graph.output]}


def _ints(node, name):
    return next((list(a.ints) for a in node.attribute if a.name == name), [])


def _find(pattern, graph):
    producer = {o: n for n in graph.node for o in n.output}
    ranks = _ranks(graph)
    dims = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if pattern in ("pad3-mul", "pad3") and node.op_type == "Pad" and ranks.get(node.input[0]) == 3:
            source = producer.get(node.input[0])
            if pattern == "pad3" or (source is not None and source.op_type == "Mul"):
                return (f"/build/tpu-mlir/lib/Dialect/Top/IR/Module.cpp:575: getI64Array: Assertion "
                        f"`arr->size() == num_elem' failed (node {node.name})")
        if pattern == "convt-stride" and node.op_type == "ConvTranspose" and max(_ints(node, "strides") or [1]) > 4:
            return f"error: ConvTranspose stride {max(_ints(node, 'strides'))} > 4 is not supported ({node.name})"
        if pattern == "conv-channels" and node.op_type == "Conv":
            weight = dims.get(node.input[1])
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            if weight is not None and weight[1] * group > 512:
                return f"RuntimeError: Conv {node.name} has {weight[1] * group} input channels, at most 512"
        if pattern == "pad-conv" and node.op_type == "Pad" and node.input[1] in dims and \
                any(n.op_type == "Conv" and n.input[0] == node.output[0] for n in graph.node):
            return ("E build: Catch exception when building RKNN model!\nTraceback (most recent call last):\n"
                    '  File "rknn/api/rules/conv.py", line 1093, in _p_fuse_pad_into_conv\n'
                    "    pads[2:] += 1\nValueError: assignment destination is read-only")
        if pattern.startswith("op:") and node.op_type == pattern[3:]:
            return f"FAIL: {node.op_type} {node.name} is not supported"
        if pattern.startswith("dilation:") and node.op_type == "Conv" and \
                max(_ints(node, "dilations") or [1]) >= int(pattern[9:]):
            return f"Error: Conv {node.name}: dilation {max(_ints(node, 'dilations'))} exceeds the hardware limit"
    return None


def judge_bytes(patterns, data, proto=None):
    """(exit status, output) of a judge call on the serialized model ``data``."""
    model = (proto or _model_proto())()
    model.ParseFromString(data)
    lines = [f"compiling ({len(model.graph.node)} nodes)"]
    for pattern in patterns:
        message = _find(pattern, model.graph)
        if message:
            return 1, "\n".join([*lines, "progress 1/3 ok", message])
    return 0, "\n".join([*lines, "done: all layers on the NPU"])


def main():
    patterns, path = sys.argv[1].split(","), sys.argv[2]
    log = os.environ.get("PATTERN_JUDGE_LOG")  # bench/reduce_vs_polygraphy.py counts the calls here
    if log:
        with open(log, "a") as f:
            f.write("call\n")
    if "sleep" in patterns:
        time.sleep(60)
    with open(path, "rb") as f:
        code, output = judge_bytes(patterns, f.read())
    print(output, file=sys.stderr if code else sys.stdout)
    sys.exit(code)


if __name__ == "__main__":
    main()
