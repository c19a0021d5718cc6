"""The declared dependency floors are right: onnxruntime computes what the ONNX reference evaluator computes on the
model that onnxruntime 1.16-1.18 get wrong (pyproject.toml's floor is 1.19; `make test-min` runs this at it)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_npu_fix.pipeline.validation.session import Runner

# name: (input, scale, bias, mean, var) of one-channel BatchNormalizations. bn20 and bn26 are dead branches; with
# them in the graph, onnxruntime 1.18.1 returns wrong values (max error 0.05-0.07) from the second run of a session
# on, which made npufix refuse a correct rewrite (the fuzz test found it). Found by tests/test_fuzz.py.
_BATCHNORMS = {
    "bn5": ("x", 1.0251460075378418, -0.026420973241329193, 0.1921267956495285, 0.5165276527404785),
    "bn10": ("bn5", 0.8928661346435547, 0.07231900840997696, 0.3912000060081482, 1.2294965982437134),
    "bn15": ("x", 0.8592529296875, -0.25308430194854736, -0.18698233366012573, 0.5027384757995605),
    "bn20": ("bn10", 0.5349938273429871, -0.0437583327293396, -0.3737732768058777, 0.6756556034088135),
}
_AFTER_CONCAT = {"bn26": ("bn15", 0.8911482095718384, -0.0632600337266922, 0.12348916381597519, 0.9226872324943542)}


def _batchnorm(name, source, *values):
    names = [f"{name}_{kind}" for kind in ("scale", "bias", "mean", "var")]
    inits = [numpy_helper.from_array(np.array([v], np.float32), n) for n, v in zip(names, values)]
    return helper.make_node("BatchNormalization", [source, *names], [name], name=name, epsilon=1e-5), inits


def _model() -> onnx.ModelProto:
    nodes, inits = [], []
    for table in (_BATCHNORMS, None, _AFTER_CONCAT):
        if table is None:
            nodes.append(helper.make_node("Concat", ["bn15", "bn5"], ["cat"], axis=1, name="cat"))
            continue
        for name, (source, *values) in table.items():
            node, tensors = _batchnorm(name, source, *values)
            nodes.append(node)
            inits += tensors
    inits.append(numpy_helper.from_array(np.array([[[-0.09088773280382156], [0.9662355780601501]]], np.float32), "w"))
    nodes.append(helper.make_node("Conv", ["cat", "w"], ["y"], name="conv", kernel_shape=[1]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_onnxruntime_computes_the_model_older_versions_get_wrong():
    model = _model()
    onnx.checker.check_model(model, full_check=True)
    runner = Runner(model)  # npufix's own session settings
    reference = ReferenceEvaluator(model)
    try:
        for seed in range(4):  # the wrong values start at the second run of the session
            x = np.random.default_rng(seed).standard_normal((1, 1, 6)).astype(np.float32)
            got = runner.run({"x": x})["y"]
            want = reference.run(None, {"x": x})[0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"run {seed + 1}")
    finally:
        runner.close()
