"""Tests for the fold-batchnorm pass: every rule against onnxruntime on the original model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import apply_pass, assert_equivalent, ops
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.ir.graph import infer_shapes
from onnx_npu_fix.passes import fold_batchnorm
from onnx_npu_fix.passes.fold_batchnorm import FoldBatchNormPass

SEEDS = (0, 1, 2)


# --- model builders ---------------------------------------------------------------------------------


class Builder:
    """Accumulates nodes and initializers of one test model; all randomness from one seeded generator."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> str:
        return self.const(name, self.rng.standard_normal(shape).astype(dtype))

    def node(self, op: str, inputs: list[str], outputs: list[str], name: str, **attrs) -> onnx.NodeProto:
        node = helper.make_node(op, inputs, outputs, name=name, **attrs)
        self.nodes.append(node)
        return node

    def bn(self, name: str, x: str, y: str, c: int, *, eps: float = 1e-5, dtype=np.float32,
           outputs: list[str] | None = None, **attrs) -> onnx.NodeProto:
        """A BN with non-trivial statistics: signed gammas, shifted means, variances far from 1."""
        rng = self.rng
        stats = {
            "scale": rng.uniform(0.5, 2.0, c) * rng.choice([-1.0, 1.0], c),
            "B": rng.standard_normal(c),
            "mean": rng.standard_normal(c) * 2.0,
            "var": rng.uniform(0.05, 3.0, c),
        }
        names = [self.const(f"{name}.{k}", v.astype(dtype)) for k, v in stats.items()]
        return self.node("BatchNormalization", [x, *names], [y, *(outputs or [])], name, epsilon=eps, **attrs)

    def model(self, inputs: dict[str, list[int]], outputs: list[str], opset: int = 17,
              elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "test",
            [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, elem, None) for n in outputs],
            initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
        infer_shapes(model)  # fills the output shapes the checker wants
        onnx.checker.check_model(model)
        return model


def fold(model: onnx.ModelProto, **options):
    return apply_pass(model, FoldBatchNormPass(), **options)


def init_value(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def check(model: onnx.ModelProto, expected_ops: list[str], **options):
    """Run the pass, then: expected op sequence, no BN left, equivalence, idempotence. Returns (fixed, result)."""
    fixed, result = fold(model, **options)
    assert ops(fixed) == expected_ops
    assert "BatchNormalization" not in ops(fixed)
    assert not [r for r in result.rejections if r.blocking]
    assert_equivalent(model, fixed, seeds=SEEDS)
    again, second = fold(fixed, **options)
    assert not second.changes and not second.rejections
    assert ops(again) == ops(fixed)
    return fixed, result


# --- rule 1: fold into the producer -------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eps", [1e-3, 1e-5])
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv_bn_folds(seed, eps, with_bias):
    b = Builder(seed)
    inputs = ["x", b.weight("w", (6, 3, 3, 3))] + ([b.weight("bias", (6,))] if with_bias else [])
    b.node("Conv", inputs, ["c"], "conv1", pads=[1, 1, 1, 1])
    b.bn("bn1", "c", "y", 6, eps=eps)
    model = b.model({"x": [1, 3, 8, 8]}, ["y"])
    fixed, result = check(model, ["Conv"])
    conv = fixed.graph.node[0]
    assert conv.output[0] == "y" and len(conv.input) == 3
    assert conv.input[1] == "w"  # the sole reader's weight is rewritten in place, under its own name
    assert [(c.node, c.action, c.new) for c in result.changes] == [("bn1", "folded into Conv", "conv1")]
    assert result.metrics["folded"] == 1 and result.metrics["batchnorm_after"] == 0


@pytest.mark.parametrize("spatial_rank", [1, 2, 3])
def test_conv_bn_folds_1d_2d_3d(spatial_rank):
    b = Builder(spatial_rank)
    k = [3] * spatial_rank
    b.node("Conv", ["x", b.weight("w", (4, 2, *k))], ["c"], "conv", strides=[2] * spatial_rank)
    b.bn("bn", "c", "y", 4)
    check(b.model({"x": [2, 2, *([9] * spatial_rank)]}, ["y"]), ["Conv"])


@pytest.mark.parametrize("group", [2, 8])  # grouped and depthwise
def test_grouped_and_depthwise_conv_bn_folds(group):
    b = Builder(group)
    b.node("Conv", ["x", b.weight("w", (8, 8 // group, 3, 3)), b.weight("bias", (8,))], ["c"], "conv",
           group=group, pads=[1, 1, 1, 1])
    b.bn("bn", "c", "y", 8, eps=1e-3)
    check(b.model({"x": [1, 8, 6, 6]}, ["y"]), ["Conv"])


@pytest.mark.parametrize("group", [1, 2, 3])
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv_transpose_bn_folds(group, with_bias):
    b = Builder(10 * group + with_bias)
    # W is [C_in, M/group, k, k]: C_in = 6, M = 4 * group output channels
    inputs = ["x", b.weight("w", (6, 4, 3, 3))] + ([b.weight("bias", (4 * group,))] if with_bias else [])
    b.node("ConvTranspose", inputs, ["c"], "deconv", group=group, strides=[2, 2], pads=[1, 1, 1, 1])
    b.bn("bn", "c", "y", 4 * group)
    _, result = check(b.model({"x": [1, 6, 5, 5]}, ["y"]), ["ConvTranspose"])
    assert (result.changes[0].action, result.changes[0].new) == ("folded into ConvTranspose", "deconv")


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (1, 5), (3, 1), (3, 5)])
def test_gemm_bn_folds(trans_b, c_shape):
    b = Builder(trans_b)
    inputs = ["x", b.weight("w", (5, 4) if trans_b else (4, 5))]
    if c_shape is not None:
        inputs.append(b.weight("cc", c_shape))
    b.node("Gemm", inputs, ["g"], "fc", transB=trans_b, alpha=0.75, beta=-1.5)
    b.bn("bn", "g", "y", 5, eps=1e-3)
    fixed, _ = check(b.model({"x": [3, 4]}, ["y"]), ["Gemm"])
    gemm = fixed.graph.node[0]
    assert onnx.helper.get_node_attr_value(gemm, "alpha") == pytest.approx(0.75)


def test_gemm_trans_a_folds():
    b = Builder(7)
    b.node("Gemm", ["x", b.weight("w", (4, 5)), b.weight("cc", (5,))], ["g"], "fc", transA=1)
    b.bn("bn", "g", "y", 5)
    check(b.model({"x": [4, 3]}, ["y"]), ["Gemm"])


@pytest.mark.parametrize("seed", SEEDS)
def test_matmul_bn_folds_with_add(seed):
    b = Builder(seed)
    b.node("MatMul", ["x", b.weight("w", (6, 5))], ["mm"], "fc")
    b.bn("bn", "mm", "y", 5)
    fixed, result = check(b.model({"x": [4, 6]}, ["y"]), ["MatMul", "Add"])
    assert (result.changes[0].action, result.changes[0].new) == ("folded into MatMul (shift as Add)", ["fc", "bn_add"])


def test_matmul_3d_output_is_lowered():
    # [N, C, K] @ [K, L] -> [N, C, L]: BN normalises C, which is not the weight's output axis.
    b = Builder(3)
    b.node("MatMul", ["x", b.weight("w", (6, 5))], ["mm"], "fc")
    b.bn("bn", "mm", "y", 4)
    _, result = check(b.model({"x": [2, 4, 6]}, ["y"]), ["MatMul", "Mul", "Add"])
    assert "rank is 3" in result.changes[0].detail["why_not_folded"]


# --- rule 2: fold into the following Conv -------------------------------------------------------------


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("with_bias", [True, False])
def test_bn_conv_zero_pads_folds(group, with_bias):
    b = Builder(group + 5 * with_bias)
    b.bn("bn", "x", "n", 4, eps=1e-3)
    inputs = ["n", b.weight("w", (8, 4 // group, 3, 3))] + ([b.weight("bias", (8,))] if with_bias else [])
    b.node("Conv", inputs, ["y"], "conv", group=group, strides=[1, 2])
    fixed, result = check(b.model({"x": [1, 4, 7, 7]}, ["y"]), ["Conv"])
    assert fixed.graph.node[0].input[0] == "x"
    assert (result.changes[0].action, result.changes[0].new) == ("folded into Conv", "conv")
    assert result.changes[0].detail["rule"] == "bn->conv"


def test_bn_conv_auto_pad_valid_folds():
    b = Builder(4)
    b.bn("bn", "x", "n", 3)
    b.node("Conv", ["n", b.weight("w", (5, 3, 3))], ["y"], "conv", auto_pad="VALID")
    check(b.model({"x": [2, 3, 10]}, ["y"]), ["Conv"])


@pytest.mark.parametrize("attrs", [{"pads": [1, 1, 1, 1]}, {"pads": [0, 1, 0, 0]}, {"auto_pad": "SAME_UPPER"}])
def test_bn_conv_with_padding_is_lowered(attrs):
    b = Builder(5)
    b.bn("bn", "x", "n", 3)
    b.node("Conv", ["n", b.weight("w", (5, 3, 3, 3))], ["y"], "conv", **attrs)
    _, result = check(b.model({"x": [1, 3, 6, 6]}, ["y"]), ["Mul", "Add", "Conv"])
    assert result.changes[0].action == "lowered to Mul+Add"
    assert "BN(0) = b" in result.changes[0].detail["why_not_folded"]


def test_bn_conv_bn_combines_both_folds():
    b = Builder(6)
    b.bn("bn_in", "x", "n", 4)
    b.node("Conv", ["n", b.weight("w", (6, 2, 3, 3)), b.weight("bias", (6,))], ["c"], "conv", group=2)
    b.bn("bn_out", "c", "y", 6, eps=1e-3)
    _, result = check(b.model({"x": [1, 4, 7, 7]}, ["y"]), ["Conv"])
    assert sorted(c.node for c in result.changes) == ["bn_in", "bn_out"]


# --- what must not be corrupted ------------------------------------------------------------------------


def test_conv_feeding_two_bns_is_not_folded():
    b = Builder(8)
    b.node("Conv", ["x", b.weight("w", (4, 3, 3, 3))], ["c"], "conv")
    b.bn("bn_a", "c", "ya", 4)
    b.bn("bn_b", "c", "yb", 4, eps=1e-3)
    model = b.model({"x": [1, 3, 6, 6]}, ["ya", "yb"])
    fixed, result = check(model, ["Conv", "Mul", "Add", "Mul", "Add"])
    assert np.array_equal(init_value(fixed, "w"), init_value(model, "w"))
    assert all(c.action == "lowered to Mul+Add" for c in result.changes)
    assert "also feeds 1 other node" in result.changes[0].detail["why_not_folded"]


def test_conv_output_that_is_a_graph_output_is_not_folded():
    b = Builder(9)
    b.node("Conv", ["x", b.weight("w", (4, 3, 1, 1))], ["c"], "conv")
    b.bn("bn", "c", "y", 4)
    model = b.model({"x": [1, 3, 5, 5]}, ["c", "y"])
    fixed, result = check(model, ["Conv", "Mul", "Add"])
    assert fixed.graph.node[0].output[0] == "c"
    assert np.array_equal(init_value(fixed, "w"), init_value(model, "w"))
    assert "is also a graph output" in result.changes[0].detail["why_not_folded"]


def test_shared_weight_gets_private_copies():
    b = Builder(10)
    w = b.weight("w", (4, 4, 3, 3))
    b.node("Conv", ["x", w], ["c1"], "conv1", pads=[1, 1, 1, 1])
    b.bn("bn1", "c1", "n1", 4)
    b.node("Conv", ["n1", w], ["c2"], "conv2", pads=[1, 1, 1, 1])
    b.bn("bn2", "c2", "y", 4, eps=1e-3)
    model = b.model({"x": [1, 4, 6, 6]}, ["y"])
    fixed, _ = check(model, ["Conv", "Conv"])
    w1, w2 = (n.input[1] for n in fixed.graph.node)
    assert len({w1, w2, "w"}) == 3  # each conv got its own copy
    assert np.array_equal(init_value(fixed, "w"), init_value(model, "w"))


def test_weight_shared_with_an_unfolded_conv_is_not_corrupted():
    b = Builder(11)
    w = b.weight("w", (3, 3, 1, 1))
    b.node("Conv", ["x", w], ["c1"], "conv1")
    b.bn("bn", "c1", "n1", 3)
    b.node("Conv", ["n1", w], ["y"], "conv2", pads=[0, 0, 0, 0])
    model = b.model({"x": [1, 3, 4, 4]}, ["y"])
    # bn folds into conv1 (rule 1); conv2 still reads the untouched shared weight.
    fixed, _ = check(model, ["Conv", "Conv"])
    assert fixed.graph.node[1].input[1] == "w"
    assert fixed.graph.node[0].input[1] != "w"
    assert np.array_equal(init_value(fixed, "w"), init_value(model, "w"))


def test_weight_from_constant_node_folds():
    b = Builder(12)
    w = b.rng.standard_normal((4, 2, 3)).astype(np.float32)
    b.node("Constant", [], ["w"], "wconst", value=numpy_helper.from_array(w))
    b.node("Conv", ["x", "w"], ["c"], "conv")
    b.bn("bn", "c", "y", 4)
    check(b.model({"x": [1, 2, 8]}, ["y"]), ["Constant", "Conv"])


def test_quantized_weight_is_not_folded():
    b = Builder(13)
    b.const("wq", b.rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8))
    b.const("ws", np.float32(0.02))
    b.node("DequantizeLinear", ["wq", "ws"], ["w"], "dq")
    b.node("Conv", ["x", "w"], ["c"], "conv")
    b.bn("bn", "c", "y", 4)
    model = b.model({"x": [1, 3, 6, 6]}, ["y"])
    _, result = check(model, ["DequantizeLinear", "Conv", "Mul", "Add"])
    assert "DequantizeLinear dq (quantized)" in result.changes[0].detail["why_not_folded"]


# --- rule 3: standalone lowering -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [[4, 5], [2, 5, 7], [1, 5, 4, 4], [1, 5, 2, 3, 3]])
@pytest.mark.parametrize("eps", [1e-3, 1e-5])
def test_bn_on_graph_input_is_lowered(shape, eps):
    b = Builder(len(shape))
    b.bn("bn", "x", "y", 5, eps=eps)
    fixed, result = check(b.model({"x": shape}, ["y"]), ["Mul", "Add"])
    assert result.changes[0].action == "lowered to Mul+Add"
    assert "graph input" in result.changes[0].detail["why_not_folded"]
    scale = init_value(fixed, fixed.graph.node[0].input[1])
    assert scale.shape == (5,) + (1,) * (len(shape) - 2)


@pytest.mark.parametrize("shape", [[2, 5, 7], [1, 5, 4, 4]])
def test_standalone_conv_mode(shape):
    b = Builder(20)
    b.bn("bn", "x", "y", 5)
    fixed, result = check(b.model({"x": shape}, ["y"]), ["Conv"], bn_standalone="conv")
    conv = fixed.graph.node[0]
    assert onnx.helper.get_node_attr_value(conv, "group") == 5
    assert result.changes[0].action == "lowered to 1x1 depthwise Conv"


@pytest.mark.parametrize("shape", [[4, 5], [1, 5, 2, 3, 3]])
def test_standalone_conv_mode_falls_back_for_other_ranks(shape):
    b = Builder(21)
    b.bn("bn", "x", "y", 5)
    _, result = check(b.model({"x": shape}, ["y"]), ["Mul", "Add"], bn_standalone="conv")
    assert "rank-3/4" in result.changes[0].detail["note"]


def test_bn_after_relu_is_lowered_and_bn_before_padded_conv_too():
    b = Builder(22)
    b.node("Conv", ["x", b.weight("w", (4, 3, 3, 3))], ["c"], "conv")
    b.node("Relu", ["c"], ["r"], "relu")
    b.bn("bn", "r", "n", 4)
    b.node("Conv", ["n", b.weight("w2", (4, 4, 3, 3))], ["y"], "conv2", pads=[1, 1, 1, 1])
    _, result = check(b.model({"x": [1, 3, 8, 8]}, ["y"]), ["Conv", "Relu", "Mul", "Add", "Conv"])
    why = result.changes[0].detail["why_not_folded"]
    assert "Relu relu, not a Conv" in why and "pads [1, 1, 1, 1]" in why


def test_conv_bn_bn_chain_leaves_no_bn():
    b = Builder(23)
    b.node("Conv", ["x", b.weight("w", (4, 3, 3, 3))], ["c"], "conv")
    b.bn("bn1", "c", "m", 4)
    b.bn("bn2", "m", "y", 4, eps=1e-3)
    check(b.model({"x": [1, 3, 6, 6]}, ["y"]), ["Conv", "Mul", "Add"])


# --- opsets and BN forms -----------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [7, 9, 12, 14, 15, 18, 21])
def test_opsets(opset):
    b = Builder(opset)
    b.node("Conv", ["x", b.weight("w", (4, 3, 3, 3))], ["c"], "conv")
    b.bn("bn1", "c", "n", 4)
    b.node("Relu", ["n"], ["r"], "relu")
    b.bn("bn2", "r", "y", 4, eps=1e-3)
    check(b.model({"x": [1, 3, 6, 6]}, ["y"], opset=opset), ["Conv", "Relu", "Mul", "Add"])


def test_opset15_mixed_parameter_types():
    # opset 15: X float16, scale/B float32 (T1), mean/var float16 (T2)
    b = Builder(30)
    stats = {"s": b.rng.uniform(0.5, 2, 4).astype(np.float32), "bb": b.rng.standard_normal(4).astype(np.float32),
             "m": b.rng.standard_normal(4).astype(np.float16), "v": b.rng.uniform(0.5, 2, 4).astype(np.float16)}
    for k, v in stats.items():
        b.const(k, v)
    b.node("BatchNormalization", ["x", *stats], ["y"], "bn")
    model = b.model({"x": [1, 4, 3, 3]}, ["y"], opset=15, elem=TensorProto.FLOAT16)
    fixed, _ = fold(model)
    assert ops(fixed) == ["Mul", "Add"]
    assert init_value(fixed, fixed.graph.node[0].input[1]).dtype == np.float16
    assert_equivalent(model, fixed, seeds=SEEDS, rtol=2e-3, atol=2e-3)  # float16 arithmetic


def test_opset7_spatial0_per_activation_is_lowered():
    b = Builder(31)
    shape = (3, 4)  # [C, L]
    names = [b.const(n, v.astype(np.float32)) for n, v in (
        ("s", b.rng.uniform(0.5, 2, shape)), ("bb", b.rng.standard_normal(shape)),
        ("m", b.rng.standard_normal(shape)), ("v", b.rng.uniform(0.1, 2, shape)))]
    b.node("BatchNormalization", ["x", *names], ["y"], "bn", spatial=0)
    fixed, _ = check(b.model({"x": [2, 3, 4]}, ["y"], opset=7), ["Mul", "Add"])
    assert init_value(fixed, fixed.graph.node[0].input[1]).shape == shape


@pytest.mark.parametrize("batch", [1, 2])
def test_opset8_spatial0_per_channel_on_nc_input(batch):
    # spatial=0 with [C] parameters on an [N, C] input is the per-channel form: the input's shape is only
    # checked, the constants stay [C] (whatever N is).
    b = Builder(32)
    b.node("Gemm", ["x", b.weight("w", (3, 4)), b.weight("c", (4,))], ["g"], "gemm")  # opset 8: C required
    b.bn("bn_fold", "g", "h", 4, spatial=0)
    b.bn("bn_low", "h", "y", 4, spatial=0)
    model = b.model({"x": [batch, 3]}, ["y"], opset=8)
    fixed, result = check(model, ["Gemm", "Mul", "Add"])
    assert [(c.node, c.action) for c in result.changes] == [("bn_fold", "folded into Gemm"),
                                                            ("bn_low", "lowered to Mul+Add")]
    assert init_value(fixed, fixed.graph.node[1].input[1]).shape == (4,)


def test_opset6_is_rejected_with_reason():
    b = Builder(32)
    b.node("Conv", ["x", b.weight("w", (4, 3, 1, 1))], ["c"], "conv")
    b.bn("bn", "c", "y", 4, is_test=1)
    model = b.model({"x": [1, 3, 4, 4]}, ["y"], opset=6)
    fixed, result = fold(model)
    assert ops(fixed) == ["Conv", "BatchNormalization"]
    assert [(r.node, r.blocking) for r in result.rejections] == [("bn", True)]
    assert "opset 6" in result.rejections[0].reason


def test_training_mode_is_rejected():
    b = Builder(33)
    b.node("Conv", ["x", b.weight("w", (4, 3, 1, 1))], ["c"], "conv")
    b.bn("bn", "c", "y", 4, training_mode=1, outputs=["rm", "rv"])
    model = b.model({"x": [2, 3, 4, 4]}, ["y"], opset=15)
    fixed, result = fold(model)
    assert ops(fixed) == ["Conv", "BatchNormalization"]
    assert not result.changes
    assert len(result.rejections) == 1 and result.rejections[0].blocking
    assert "training_mode=1" in result.rejections[0].reason
    fixed, result = fold(model, allow_batchnorm=True)
    assert not result.rejections[0].blocking


def test_opset9_training_outputs_are_rejected():
    # Before opset 14 extra outputs select training mode (onnxruntime then uses batch statistics).
    b = Builder(34)
    b.bn("bn", "x", "y", 4, outputs=["mean_out", "var_out", "saved_mean", "saved_var"])
    model = b.model({"x": [2, 4, 3]}, ["y"], opset=9)
    fixed, result = fold(model)
    assert ops(fixed) == ["BatchNormalization"]
    assert "training outputs" in result.rejections[0].reason and result.rejections[0].blocking


def test_non_constant_parameters_are_rejected():
    b = Builder(36)
    b.const("B", np.zeros(4, np.float32))
    b.const("m", np.zeros(4, np.float32))
    b.const("v", np.ones(4, np.float32))
    b.node("BatchNormalization", ["x", "gamma", "B", "m", "v"], ["y"], "bn")
    graph_inputs = {"x": [1, 4, 3, 3], "gamma": [4]}
    model = b.model(graph_inputs, ["y"])
    fixed, result = fold(model)
    assert ops(fixed) == ["BatchNormalization"]
    assert result.rejections[0].reason == "its scale gamma is not constant"
    assert result.rejections[0].blocking


def test_bn_inside_subgraph_is_reported():
    inner = Builder(37)
    inner.bn("inner_bn", "x", "yi", 3)
    body = helper.make_graph(inner.nodes, "body", [], [helper.make_tensor_value_info("yi", TensorProto.FLOAT,
                                                                                       [1, 3, 2, 2])],
                             initializer=inner.inits)
    b = Builder(38)
    b.const("cond", np.array(True))
    b.node("If", ["cond"], ["y"], "branch", then_branch=body, else_branch=body)
    model = b.model({"x": [1, 3, 2, 2]}, ["y"])
    _, result = fold(model)
    assert [(r.node, r.blocking) for r in result.rejections] == [("branch", True)]
    assert result.metrics["batchnorm_after"] == 2


def test_graph_without_batchnorm_is_untouched():
    b = Builder(39)
    b.node("Conv", ["x", b.weight("w", (4, 3, 1, 1))], ["y"], "conv")
    model = b.model({"x": [1, 3, 4, 4]}, ["y"])
    fixed, result = fold(model)
    assert not result.changes and not result.rejections
    assert fixed.graph.node[0] == model.graph.node[0]
    assert np.array_equal(init_value(fixed, "w"), init_value(model, "w"))


def test_mixed_model_reports_every_bn():
    b = Builder(40)
    b.bn("bn_in", "x", "a", 3)                                          # graph input -> rule 2 into conv1
    b.node("Conv", ["a", b.weight("w1", (8, 3, 1, 1))], ["c1"], "conv1")
    b.bn("bn1", "c1", "r1", 8)                                          # rule 1 into conv1
    b.node("Relu", ["r1"], ["r"], "relu")
    b.bn("bn2", "r", "n2", 8)                                           # lowered: Relu before, pads after
    b.node("Conv", ["n2", b.weight("w2", (8, 8, 3, 3))], ["c2"], "conv2", pads=[1, 1, 1, 1])
    b.node("ConvTranspose", ["c2", b.weight("w3", (8, 4, 2, 2))], ["c3"], "up", strides=[2, 2])
    b.bn("bn3", "c3", "y", 4, eps=1e-3)                                 # rule 1 into ConvTranspose
    _, result = check(b.model({"x": [1, 3, 6, 6]}, ["y"]),
                      ["Conv", "Relu", "Mul", "Add", "Conv", "ConvTranspose"])
    assert [(c.node, c.action, c.new if c.action.startswith("folded") else None)
            for c in result.changes] == [  # in graph order
        ("bn_in", "folded into Conv", "conv1"), ("bn1", "folded into Conv", "conv1"),
        ("bn2", "lowered to Mul+Add", None), ("bn3", "folded into ConvTranspose", "up")]
    assert result.metrics == {"batchnorm_before": 4, "folded": 3, "lowered": 1, "batchnorm_after": 0}


def test_float16_conv_bn_folds_in_float16():
    b = Builder(41)
    b.node("Conv", ["x", b.weight("w", (4, 3, 3, 3), dtype=np.float16)], ["c"], "conv")
    b.bn("bn", "c", "y", 4, dtype=np.float16)
    model = b.model({"x": [1, 3, 6, 6]}, ["y"], elem=TensorProto.FLOAT16)
    fixed, _ = fold(model)
    assert ops(fixed) == ["Conv"]
    assert {init_value(fixed, n).dtype for n in fixed.graph.node[0].input[1:]} == {np.dtype(np.float16)}
    assert_equivalent(model, fixed, seeds=SEEDS, rtol=2e-3, atol=2e-3)  # float16 rounding of W' and of Y


def test_bn_parameters_from_constant_nodes():
    b = Builder(42)
    for k, v in {"s": b.rng.uniform(0.5, 2, 3), "bb": b.rng.standard_normal(3),
                 "m": b.rng.standard_normal(3), "v": b.rng.uniform(0.1, 2, 3)}.items():
        b.node("Constant", [], [k], f"const_{k}", value=numpy_helper.from_array(v.astype(np.float32)))
    b.node("Conv", ["x", b.weight("w", (3, 2, 3))], ["c"], "conv")
    b.node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"], "bn", epsilon=1e-3)
    check(b.model({"x": [2, 2, 9]}, ["y"]), ["Constant"] * 4 + ["Conv"])


# --- exactness when many BNs are folded together ------------------------------------------------------
# The pass computes (a, b) for all BNs with the same parameter shape and dtypes in one array, and the new
# weights of all plain Conv -> BN folds of the same weight shape in one array. Every fold must still be bit for
# bit the documented math done for that BN alone, whatever else the graph holds.


def _reference_fold(w, bias, params, eps):
    """W' and bias' of Conv(W, bias) -> BN, computed alone in float64 and rounded once (the module docstring)."""
    scale, beta, mean, var = (p.astype(np.float64) for p in params)
    a = scale / np.sqrt(var + float(np.float32(eps)))  # the attribute is stored as float32
    b = beta - mean * a
    new_w = (w.astype(np.float64) * a.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    old_bias = bias.astype(np.float64) if bias is not None else np.zeros(len(a))
    return new_w, (old_bias * a + b).astype(w.dtype)


def _same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("batch_bytes", [None, 1, 2 * 4 * 4 * 9 * 4])  # default, one Conv, two Convs a batch
def test_many_folds_in_one_graph_are_each_exact(batch_bytes, monkeypatch):
    if batch_bytes is not None:
        monkeypatch.setattr(fold_batchnorm, "_BATCH_BYTES", batch_bytes)
    b = Builder(50)
    inputs: dict[str, list[int]] = {}
    outputs: list[str] = []
    expected: dict[str, tuple] = {}  # conv name -> (W, bias or None, BN params, eps)
    elem = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.float64: TensorProto.DOUBLE}

    def branch(tag, dtype=np.float32, *, bias=False, weight=None, params=None, eps=1e-5):
        x = f"x_{tag}"
        inputs[x] = [1, 4, 5, 5]
        w = weight or b.weight(f"w_{tag}", (4, 4, 3, 3), dtype)
        conv_in = [x, w] + ([b.weight(f"bias_{tag}", (4,), dtype)] if bias else [])
        b.node("Conv", conv_in, [f"c_{tag}"], f"conv_{tag}")
        if params is None:
            bn = b.bn(f"bn_{tag}", f"c_{tag}", f"y_{tag}", 4, eps=eps, dtype=dtype)
        else:
            bn = b.node("BatchNormalization", [f"c_{tag}", *params], [f"y_{tag}"], f"bn_{tag}", epsilon=eps)
        outputs.append(f"y_{tag}")
        return bn

    for tag in ("a1", "a2", "a3"):  # one batch: same weight shape and dtype, no bias
        branch(tag)
    branch("b1", bias=True)
    branch("b2", bias=True, eps=1e-3)
    branch("half", np.float16, bias=True)
    branch("double", np.float64, bias=True)
    shared = list(branch("s1").input[1:])  # BN parameters read by two BNs
    branch("s2", params=shared, eps=1e-3)
    branch("w1", weight="w_a1")  # a Conv weight read by two Convs: each gets a private copy
    for k, v in {"cs": b.rng.uniform(0.5, 2, 4), "cb": b.rng.standard_normal(4),
                 "cm": b.rng.standard_normal(4), "cv": b.rng.uniform(0.1, 2, 4)}.items():
        b.node("Constant", [], [k], f"const_{k}", value=numpy_helper.from_array(v.astype(np.float32)))
    branch("const", params=["cs", "cb", "cm", "cv"])
    mixed = [b.const("m_s", b.rng.uniform(0.5, 2, 4).astype(np.float16)),
             b.const("m_b", b.rng.standard_normal(4).astype(np.float16)), *branch("m0").input[3:]]
    branch("mixed", params=mixed)  # float16 scale and B with float32 statistics: a batch of its own
    bad = [*shared[:3], b.const("neg_var", np.array([1.0, -2.0, 1.0, 1.0], np.float32))]
    branch("neg", params=bad)
    inf = [b.const("inf_scale", np.array([1.0, np.inf, 1.0, 1.0], np.float32)), *shared[1:]]
    branch("inf", params=inf)

    def elem_of(tensor: str) -> int:  # each branch's input and output take its dtype
        return elem[{"half": np.float16, "double": np.float64}.get(tensor[2:], np.float32)]

    graph = helper.make_graph(
        b.nodes, "many", [helper.make_tensor_value_info(x, elem_of(x), s) for x, s in inputs.items()],
        [helper.make_tensor_value_info(y, elem_of(y), None) for y in outputs], initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    infer_shapes(model)
    onnx.checker.check_model(model)
    original = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            original[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    bns = {n.name: n for n in model.graph.node if n.op_type == "BatchNormalization"}
    convs = {n.name: n for n in model.graph.node if n.op_type == "Conv"}
    for name, conv in convs.items():
        bn = bns["bn_" + name[5:]]
        eps = next(a.f for a in bn.attribute if a.name == "epsilon")
        bias = original[conv.input[2]] if len(conv.input) > 2 else None
        expected[name] = (original[conv.input[1]], bias, [original[p] for p in bn.input[1:]], eps)

    fixed, result = fold(model)
    reasons = {r.node: r.reason for r in result.rejections}
    assert reasons == {"bn_neg": "var + epsilon <= 0 for some channel (the original output is NaN/inf there)",
                       "bn_inf": "its parameters are not finite"}
    assert result.metrics == {"batchnorm_before": 15, "folded": 13, "lowered": 0, "batchnorm_after": 2}
    values = {t.name: numpy_helper.to_array(t) for t in fixed.graph.initializer}
    folded = {n.name: n for n in fixed.graph.node if n.op_type == "Conv"}
    for name, (w, bias, params, eps) in expected.items():
        conv = folded[name]
        if name in ("conv_neg", "conv_inf"):
            assert _same_bits(values[conv.input[1]], w)
            continue
        new_w, new_bias = _reference_fold(w, bias, params, eps)
        assert _same_bits(values[conv.input[1]], new_w), name
        assert _same_bits(values[conv.input[2]], new_bias), name
    # The shared weight was copied for each reader, never rewritten under its own name.
    assert folded["conv_a1"].input[1] != folded["conv_w1"].input[1]
    assert "w_a1" not in values or _same_bits(values["w_a1"], original["w_a1"])


@pytest.mark.parametrize("overridden", ["bn.scale", "conv.w"])
def test_initializers_listed_as_graph_inputs_are_not_folded(overridden):
    """keep_initializers_as_inputs exports: such an initializer is only a default a caller may feed another value
    for, so folding it would silently ignore that value. It is left as it is: a BN whose parameter it is stays
    (with the reason); a Conv whose weight it is gets no fold (the BN becomes Mul+Add instead)."""
    b = Builder(5)
    b.node("Conv", ["x", b.weight("conv.w", (4, 3, 3, 3))], ["y"], "conv", pads=[1, 1, 1, 1])
    b.bn("bn", "y", "out", 4)
    model = b.model({"x": [1, 3, 6, 6]}, ["out"])
    value = next(t for t in model.graph.initializer if t.name == overridden)
    model.graph.input.append(helper.make_tensor_value_info(overridden, TensorProto.FLOAT, list(value.dims)))
    fixed, result = fold(model)
    assert next(t for t in fixed.graph.initializer if t.name == overridden) == value
    reasons = [r.reason for r in result.rejections] + [c.detail.get("why_not_folded", "") for c in result.changes]
    assert any("listed as a graph input" in reason for reason in reasons)
    assert ops(fixed) == (["Conv", "BatchNormalization"] if overridden == "bn.scale" else ["Conv", "Mul", "Add"])
    feed = {"x": np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32),
            overridden: np.random.default_rng(2).standard_normal(tuple(value.dims)).astype(np.float32)}
    from helpers import run_model

    np.testing.assert_allclose(run_model(model, [feed])[0]["out"], run_model(fixed, [feed])[0]["out"],
                               rtol=1e-5, atol=1e-5)
