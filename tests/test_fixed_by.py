"""--check's ``fixed_by`` against the passes themselves: for every pass, a model it fixes and one it
rejects. The check must name the pass exactly when the pass's own ``find`` plans the violating node and running
the pass makes the violation disappear; when it does not, the message carries the pass's reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import apply_pass
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints import find_violations
from onnx_npu_fix.constraints.table import declared_fixes
from onnx_npu_fix.ir.graph import infer_shapes, name_unnamed_nodes
from onnx_npu_fix.passes import PASSES
from onnx_npu_fix.passes.base import Found, Pass, PassResult

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _c(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _find(model: onnx.ModelProto, pass_name: str, options: FixOptions) -> Found:
    work = onnx.ModelProto()
    work.CopyFrom(model)
    name_unnamed_nodes(work.graph)
    infer_shapes(work)
    before = work.SerializeToString()
    found = PASSES[pass_name]().find(work, options)
    assert work.SerializeToString() == before  # find is read-only
    return found


def _agree(model: onnx.ModelProto, pass_name: str, node: str, constraint: str, **options) -> tuple[bool, str]:
    """(whether --check says ``pass_name`` fixes the violation, its message), after asserting that this matches
    the pass's find and what running the pass does."""
    opts = FixOptions(**options)
    violation = next(v for v in find_violations(model, opts) if (v.node, v.constraint) == (node, constraint))
    found = _find(model, pass_name, opts)
    fixed, _ = apply_pass(model, PASSES[pass_name](), **options)
    gone = (node, constraint) not in {(v.node, v.constraint) for v in find_violations(fixed, opts)}
    claimed = violation.fixed_by == pass_name
    assert claimed == gone, (violation.text(), violation.message)
    assert claimed == (node in found.planned() and gone)
    if violation.fixed_by is None:
        reason = found.reason(node)
        assert reason is None or reason in violation.message
    return claimed, violation.message


# --- cleanup -----------------------------------------------------------------------------------------


def _dropout(training_mode):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Dropout", ["r", "ratio", "tm"], ["d"], name="drop"),
             helper.make_node("Relu", ["d"], ["y"], name="relu2")]
    return _model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])],
                  [_c("ratio", 0.5), _c("tm", training_mode, np.bool_)])


def test_cleanup_fixes_an_inference_dropout():
    assert _agree(_dropout(False), "cleanup", "drop", "leftover-op")[0]


def test_cleanup_refuses_a_dropout_whose_training_mode_is_the_constant_true():
    # --check used to say "fixed by cleanup" here from its own copy of cleanup's rule; cleanup keeps it.
    claimed, message = _agree(_dropout(True), "cleanup", "drop", "leftover-op")
    assert not claimed and "cleanup: training_mode" in message


# --- fold-batchnorm ------------------------------------------------------------------------------------


def _bn_params(channels, scale_name="s"):
    return [_c(n, np.full(channels, v)) for n, v in ((scale_name, 2.0), ("b", 1.0), ("m", 0.5), ("v", 4.0))]


def test_fold_batchnorm_fixes_a_conv_batchnorm():
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], name="conv"),
             helper.make_node("BatchNormalization", ["a", "s", "b", "m", "v"], ["y"], name="bn")]
    model = _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None)], [_c("w", np.ones((8, 8, 1, 1)))] + _bn_params(8))
    assert _agree(model, "fold-batchnorm", "bn", "batchnorm")[0]


def test_fold_batchnorm_refuses_a_batchnorm_with_a_runtime_scale():
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn")]
    model = _model(nodes, [_vi("x", [1, 4, 4, 4]), _vi("s", [4])], [_vi("y", None)], _bn_params(4)[1:])
    claimed, message = _agree(model, "fold-batchnorm", "bn", "batchnorm")
    assert not claimed and "fold-batchnorm:" in message


def _qdq(x, scale, zero, base):
    return [helper.make_node("QuantizeLinear", [x, scale, zero], [f"{base}_q"], name=f"q_{base}"),
            helper.make_node("DequantizeLinear", [f"{base}_q", scale, zero], [f"{base}_d"], name=f"dq_{base}")]


def test_qdq_batchnorm_outside_the_fold_pattern_is_what_fold_batchnorm_does():
    # A QDQ BatchNormalization with no Conv next to it: the check says what fold-batchnorm does with it
    # (lowered to Mul+Add), not what a copy of the fold pattern would say.
    nodes = [*_qdq("x", "sx", "zx", "in"),
             helper.make_node("BatchNormalization", ["in_d", "s", "b", "m", "v"], ["n"], name="bn"),
             *_qdq("n", "sx", "zx", "out")]
    model = _model(nodes, [_vi("x", [1, 4, 6, 6])], [_vi("out_d", [1, 4, 6, 6])],
                   [_c("sx", 0.05), _c("zx", 0, np.int8)] + _bn_params(4))
    claimed, _ = _agree(model, "fold-batchnorm", "bn", "batchnorm")
    assert claimed


# --- align-channels -------------------------------------------------------------------------------------


def _conv_chain(c_mid, w1=None):
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    inits = [_c("w2", np.ones((8, c_mid, 3, 3)))]
    inputs = [_vi("x", [1, 8, 8, 8])]
    if w1 is None:
        inits.append(_c("w1", np.ones((c_mid, 8, 3, 3))))
    else:
        inputs.append(_vi("w1", [c_mid, 8, 3, 3]))
    return _model(nodes, inputs, [_vi("y", None)], inits)


def test_align_channels_fixes_unaligned_intermediate_channels():
    assert _agree(_conv_chain(12), "align-channels", "conv1", "out-channels-align", align=8)[0]
    assert _agree(_conv_chain(12), "align-channels", "conv2", "in-channels-align", align=8)[0]


def test_align_channels_refuses_runtime_weights():
    claimed, message = _agree(_conv_chain(12, w1="input"), "align-channels", "conv1", "out-channels-align", align=8)
    assert not claimed and "not constant" in message


def _qdq_conv(axis):
    """x -> QDQ -> Conv(DQ(W_q), per-channel on ``axis``) [8 -> 12] -> QDQ -> Conv [12 -> 8]."""
    m = 12
    w_scale = np.full(m if axis == 0 else 8, 0.02, np.float32)
    nodes = [*_qdq("x", "sx", "zx", "in"),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], name="dqw", axis=axis),
             helper.make_node("Conv", ["in_d", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             *_qdq("c", "s1", "z1", "mid"),
             helper.make_node("Conv", ["mid_d", "w2"], ["y"], name="conv2")]
    rng = np.random.default_rng(0)
    inits = [_c("sx", 0.05), _c("zx", 0, np.int8), _c("s1", 0.1), _c("z1", 0, np.int8),
             _c("wq", rng.integers(-5, 6, (m, 8, 3, 3)), np.int8), _c("sw", w_scale),
             _c("zw", np.zeros(w_scale.shape), np.int8), _c("w2", np.ones((8, m, 1, 1)))]
    return _model(nodes, [_vi("x", [1, 8, 6, 6])], [_vi("y", None)], inits)


def test_align_channels_on_qdq_convs_agrees_with_the_pass():
    assert _agree(_qdq_conv(axis=0), "align-channels", "conv", "out-channels-align", align=8)[0]
    # per channel on the input-channel axis: align-channels refuses, so the check must not promise it
    claimed, message = _agree(_qdq_conv(axis=1), "align-channels", "conv", "out-channels-align", align=8)
    assert not claimed and "axis 1" in message


def test_a_concat_the_padding_crosses_is_fixed_only_when_the_multiples_match():
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a"),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b"),
             helper.make_node("Concat", ["a", "b"], ["k"], name="cat", axis=1),
             helper.make_node("Conv", ["k", "wc"], ["y"], name="conv_c")]
    model = _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None)],
                   [_c("wa", np.ones((4, 8, 1, 1))), _c("wb", np.ones((8, 8, 1, 1))), _c("wc", np.ones((8, 12, 1, 1)))])
    assert _agree(model, "align-channels", "cat", "concat-align", align=8, concat_align=8)[0]
    claimed, message = _agree(model, "align-channels", "cat", "concat-align", align=8, concat_align=16)
    assert not claimed and "violation remains" in message


# --- dilated-conv ------------------------------------------------------------------------------------


def _dilated(op="Conv", opset=17):
    nodes = [helper.make_node(op, ["x", "w"], ["y"], name="conv", pads=[8, 8, 8, 8], dilations=[8, 8])]
    return _model(nodes, [_vi("x", [1, 8, 16, 16])], [_vi("y", None)], [_c("w", np.ones((8, 8, 3, 3)))], opset)


def test_dilated_conv_fixes_a_dilated_conv():
    assert _agree(_dilated(), "dilated-conv", "conv", "dilation", max_dilation=4)[0]


@pytest.mark.parametrize("model", [_dilated(opset=10), _dilated("ConvTranspose")], ids=["opset-10", "conv-transpose"])
def test_dilated_conv_refusals_are_not_promised(model):
    assert not _agree(model, "dilated-conv", "conv", "dilation", max_dilation=4)[0]


def test_dilated_conv_trimming_a_conv_it_then_refuses_to_split_is_not_a_fix():
    # Taps 0 and 4 only read padding and go; the 3x3 rest keeps dilation 6, and its split needs a Transpose.
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[12] * 4, dilations=[6, 6], group=4)]
    model = _model(nodes, [_vi("x", [1, 4, 10, 10])], [_vi("y", None)], [_c("w", np.ones((4, 1, 5, 5)))])
    claimed, message = _agree(model, "dilated-conv", "conv", "dilation", max_dilation=4,
                              forbidden_ops=("Transpose",))
    assert not claimed and "Transpose, which the target forbids" in message


# --- resize-nearest ----------------------------------------------------------------------------------


def _resize(mode="linear"):
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode=mode)]
    return _model(nodes, [_vi("x", [1, 2, 4, 4])], [_vi("y", None)], [_c("scales", [1, 1, 2, 2])])


def test_resize_nearest_fixes_a_linear_resize():
    assert _agree(_resize(), "resize-nearest", "up", "resize-mode")[0]


def test_resize_nearest_refuses_a_mode_it_does_not_know():
    # resize-nearest rewrites every linear / cubic Resize; a mode outside the spec is the one it refuses.
    claimed, message = _agree(_resize("lanczos"), "resize-nearest", "up", "resize-mode")
    assert not claimed and "resize-nearest: unknown mode 'lanczos'" in message


# --- the passes whose constraint is judged by the pass's own module -------------------------------------


def _if_model(cond_input):
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")], "then", [],
                             [_vi("t", [1, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [],
                              [_vi("e", [1, 4])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)]
    inputs = [_vi("x", [1, 4])] + ([_vi("c", [], TensorProto.BOOL)] if cond_input else [])
    inits = [] if cond_input else [_c("c", True, np.bool_)]
    return _model(nodes, inputs, [_vi("y", [1, 4])], inits)


@pytest.mark.parametrize("cond_input", [False, True], ids=["constant-condition", "runtime-condition"])
def test_fold_constants_folds_control_flow_exactly_when_the_check_says(cond_input):
    model = _if_model(cond_input)
    claimed, _ = _agree(model, "fold-constants", "branch", "control-flow", allow_control_flow=False)
    assert claimed is not cond_input


def _two_branches():
    # A1 -> A2 and B1 -> B2, stored interleaved: both wide intermediates live at once unless reordered.
    nodes = [helper.make_node("Relu", ["x"], ["a1"], name="a1"), helper.make_node("Neg", ["x"], ["b1"], name="b1"),
             helper.make_node("ReduceSum", ["a1"], ["a2"], name="a2", keepdims=1),
             helper.make_node("ReduceSum", ["b1"], ["b2"], name="b2", keepdims=1),
             helper.make_node("Concat", ["a2", "b2"], ["y"], name="cat", axis=0)]
    return _model(nodes, [_vi("x", [1, 64, 32, 32])], [_vi("y", None)], opset=13)


def test_reorder_memory_agrees_with_the_sram_verdict():
    opts = dict(sram_bytes=140_000, act_bytes=1)
    sram = [v for v in find_violations(_two_branches(), FixOptions(**opts)) if v.constraint == "sram"]
    found = _find(_two_branches(), "reorder-memory", FixOptions(**opts))
    assert sram and (sram[0].fixed_by == "reorder-memory") == bool(found.plans)
    fixed, _ = apply_pass(_two_branches(), PASSES["reorder-memory"](), **opts)
    still = [v for v in find_violations(fixed, FixOptions(**opts)) if v.constraint == "sram"]
    assert (sram[0].fixed_by == "reorder-memory") == (not still)


# --- the interface ---------------------------------------------------------------------------------------


def test_every_responsible_pass_is_a_registered_pass_with_a_find():
    for name in {name for pairs in declared_fixes().values() for name, fix in pairs if fix.asked}:
        assert PASSES[name].find is not Pass.find


def test_a_plugin_pass_with_only_run_still_runs_and_knows_nothing():
    class OnlyRun(Pass):
        name = "only-run"
        summary = "test"

        def run(self, model, options):
            return PassResult()

    assert OnlyRun().find(onnx.ModelProto(), FixOptions()).known is False
    assert OnlyRun().run(onnx.ModelProto(), FixOptions()).changed is False


def test_each_find_runs_once_and_only_when_its_constraint_is_violated(monkeypatch):
    calls: list[str] = []
    for name in {name for pairs in declared_fixes().values() for name, _ in pairs}:
        cls = PASSES[name]
        real = cls.find

        def spy(self, model, options, _real=real, _name=name):
            calls.append(_name)
            return _real(self, model, options)

        monkeypatch.setattr(cls, "find", spy)
    assert find_violations(_conv_chain(8), FixOptions(align=8)) == []
    assert calls == []  # nothing violated: no find runs
    violations = find_violations(_conv_chain(12), FixOptions(align=8))
    assert len(violations) == 2 and calls == ["align-channels"]
