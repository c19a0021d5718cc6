"""The plain rewrite of a Conv + BatchNormalization chain: the least a fold of its BNs costs in Python.

``python bench/rewrite_floor.py MODEL [--repeat N]`` parses MODEL once per repetition (untimed), then times, in
this process, only what any tool must do to fold its BNs with onnx's protobuf messages and numpy, written the
plain way: one walk mapping each tensor to its producer and readers; for each ``Conv -> BatchNormalization``
whose Conv output feeds only the BN, the four parameters read from their raw bytes, ``a = gamma / sqrt(var +
eps)`` and ``b = beta - mean * a`` in float64, the Conv weight scaled by ``a`` and written back, ``b`` added as
the Conv's bias, the Conv rewired to the BN's output; then the BNs and their parameters removed from the graph.
No check, shape, report, cost table or validation: the rewrite alone, with the cyclic collector paused (as in an
npufix run: it would walk the new objects again and again).

It prints the median of the timed part in seconds and per node of the input. Beside ``bench.py``'s columns,
npufix's (b) − (h) per node (its own work beyond onnx's checks) cannot go below this figure on the chain models
(``chain10k``, ``chain30k``: every BN follows a Conv), since npufix does this work and more (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np
import onnx
from onnx import numpy_helper


def fold_plainly(model: onnx.ModelProto) -> int:
    """Fold every ``Conv -> BatchNormalization`` of ``model``'s graph (float32, raw data) into the Conv; the
    number of BNs folded."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    producer: dict[str, onnx.NodeProto] = {}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.output:
            producer[name] = node
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    folded: set[int] = set()
    dropped: set[str] = set()
    for node in graph.node:
        if node.op_type != "BatchNormalization":
            continue
        conv = producer.get(node.input[0])
        if conv is None or conv.op_type != "Conv" or readers[node.input[0]] != 1 or len(conv.input) > 2:
            continue
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        gamma, beta, mean, var = (np.frombuffer(initializers[name].raw_data, np.float32).astype(np.float64)
                                  for name in node.input[1:5])
        a = gamma / np.sqrt(var + eps)
        weight = initializers[conv.input[1]]
        value = np.frombuffer(weight.raw_data, np.float32).reshape(tuple(weight.dims))
        weight.raw_data = (value * a.reshape((-1,) + (1,) * (value.ndim - 1))).astype(np.float32).tobytes()
        bias = numpy_helper.from_array((beta - mean * a).astype(np.float32), f"{conv.name}_bias")
        graph.initializer.append(bias)
        conv.input.append(bias.name)
        conv.output[0] = node.output[0]
        folded.add(id(node))
        dropped.update(node.input[1:5])
    kept = len(graph.node) - len(folded)
    graph.node.sort(key=lambda n: id(n) in folded)  # a stable sort moves the folded BNs to the end, uncopied
    del graph.node[kept:]
    kept = sum(1 for t in graph.initializer if t.name not in dropped)
    graph.initializer.sort(key=lambda t: t.name in dropped)
    del graph.initializer[kept:]
    return len(folded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with open(args.model, "rb") as f:
        data = f.read()
    seconds = []
    for _ in range(args.repeat):
        model = onnx.load_from_string(data)
        nodes = len(model.graph.node)
        gc.disable()
        t0 = time.perf_counter()
        folded = fold_plainly(model)
        seconds.append(time.perf_counter() - t0)
        gc.enable()
        del model
    median = statistics.median(seconds)
    print(f"{args.model}: {nodes:,} nodes, {folded:,} BNs folded; the plain rewrite {median:.3f} s "
          f"(median of {args.repeat}), {median / nodes * 1e6:.1f} µs per node")


if __name__ == "__main__":
    main()
