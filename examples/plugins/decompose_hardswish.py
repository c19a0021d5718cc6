"""An example plugin pass for npufix, written against onnx-graphsurgeon: HardSwish -> x * HardSigmoid(x).

Why a deployment engineer would keep such a rewrite: HardSwish arrived in opset 14, and compilers (or compiler
versions) written before it reject the op or send it to the CPU, while HardSigmoid and Mul run on the NPU.

Math (ONNX spec): HardSwish(x) = x * max(0, min(1, x/6 + 1/2)) = x * HardSigmoid(x; alpha=1/6, beta=1/2).
Exact up to float32 rounding of alpha * x against x / 6 (one ulp), so it is declared exact and validated with
npufix's exact tolerance.

Run it:
    npufix model.onnx -o fixed.onnx --plugin examples/plugins/decompose_hardswish.py
or name its place with --passes (it otherwise goes after fold-batchnorm, its ``run_after``):
    npufix model.onnx -o fixed.onnx --plugin examples/plugins/decompose_hardswish.py \
        --passes cleanup,decompose-hardswish,align-channels
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.plugins.graphsurgeon import graphsurgeon_pass


@graphsurgeon_pass(name="decompose-hardswish", summary="HardSwish -> x * HardSigmoid(x) (opset < 14 compilers)",
                   exact=True, run_after="fold-batchnorm")
def decompose_hardswish(graph: gs.Graph, options: FixOptions) -> None:
    for node in [n for n in graph.nodes if n.op == "HardSwish"]:
        x, y = node.inputs[0], node.outputs[0]
        node.outputs.clear()  # first, so y has one producer at every moment; cleanup() then removes the dead node
        gate = gs.Variable(f"{node.name}/gate", dtype=x.dtype, shape=x.shape)
        graph.nodes.append(gs.Node("HardSigmoid", f"{node.name}/hardsigmoid", {"alpha": 1 / 6, "beta": 0.5},
                                   inputs=[x], outputs=[gate]))
        graph.nodes.append(gs.Node("Mul", f"{node.name}/mul", inputs=[x, gate], outputs=[y]))
