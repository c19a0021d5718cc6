"""Quantized (QDQ) models: quantized here with onnxruntime's own quantizer, fixed, judged in quantization steps.

Fixtures: the committed float models, quantized inside the tests by ``onnxruntime.quantization.quantize_static``
(QDQ format, seeded calibration data), with and without ``quant_pre_process``, int8 / uint8 activations,
per-tensor / per-channel weights, symmetric / asymmetric. Each quantized model is built once per session.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints import check_model
from onnx_npu_fix.ir.graph import GraphIndex, set_input_shapes
from onnx_npu_fix.ir.qdq import power_of_two_int8, walk_non_qdq
from onnx_npu_fix.passes.align_channels import AlignChannelsPass
from onnx_npu_fix.pipeline.inputs import make_inputs
from onnx_npu_fix.pipeline.scheduler import prepare
from onnx_npu_fix.pipeline.validation.quantized import QuantOutputDiff, compare_quantized
from onnx_npu_fix.pipeline.validation.session import Runner

quantization = pytest.importorskip("onnxruntime.quantization")

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures")

# (fixture, per_channel, activation type, quant_pre_process, symmetric activations)
CONFIGS = {
    "unet-pc-u8": ("unet.onnx", True, "QUInt8", False, False),
    "unet-pt-i8-sym": ("unet.onnx", False, "QInt8", False, True),
    "unet-pc-i8-pre": ("unet.onnx", True, "QInt8", True, False),
    "tcn-pc-u8": ("tcn.onnx", True, "QUInt8", False, False),
    "tcn-pt-i8-pre": ("tcn.onnx", False, "QInt8", True, False),
    "torch_unet-pc-u8": ("torch_unet.onnx", True, "QUInt8", False, False),
    "torch_unet-pc-i8-pre": ("torch_unet.onnx", True, "QInt8", True, False),
    "torch_convtasnet-pc-u8": ("torch_convtasnet.onnx", True, "QUInt8", False, False),
}
STATIC = {"torch_convtasnet.onnx": {"mix": (1, 2000)}}
"""Input shapes frozen before quantizing (the calibration runs on them) and for npufix."""


class _Reader(quantization.CalibrationDataReader):
    """A few seeded N(0, 1) input sets (the same distribution npufix validates on)."""

    def __init__(self, model: onnx.ModelProto, count: int = 4, seed: int = 7) -> None:
        self._sets = iter(make_inputs(model, count, seed))

    def get_next(self):  # noqa: ANN201 - the quantizer's interface
        return next(self._sets, None)


def _quantize(src: str, dst: str, per_channel: bool, activation: str, pre: bool, symmetric: bool) -> None:
    if pre:
        staged = dst + ".pre.onnx"
        quantization.shape_inference.quant_pre_process(src, staged, skip_symbolic_shape=True)
        src = staged
    quantization.quantize_static(
        src, dst, _Reader(onnx.load(src)), quant_format=quantization.QuantFormat.QDQ, per_channel=per_channel,
        activation_type=getattr(quantization.QuantType, activation), weight_type=quantization.QuantType.QInt8,
        extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True})


@pytest.fixture(scope="session")
def quantized(tmp_path_factory):
    """name -> path of the quantized model (built on first use, kept for the session)."""
    cache: dict[str, str] = {}
    root = tmp_path_factory.mktemp("qdq")

    def get(name: str) -> str:
        if name not in cache:
            fixture, per_channel, activation, pre, symmetric = CONFIGS[name]
            path = str(root / f"{name}.onnx")
            src = os.path.join(ROOT, fixture)
            if fixture in STATIC:
                model = onnx.load(src)
                set_input_shapes(model, STATIC[fixture])
                src = str(root / f"{name}.static.onnx")
                onnx.save(model, src)
            _quantize(src, path, per_channel, activation, pre, symmetric)
            cache[name] = path
        return cache[name]

    return get


def _fix(path: str, skip: tuple[str, ...] = (), **options):
    model = api.read_model(path).model
    opts = FixOptions(**options)
    result = api.fix(model, opts, api.select_passes(skip=skip))  # fix() leaves its argument alone
    return result.model, result, opts


def _node_names(model: onnx.ModelProto) -> set[str]:
    return {n.name for n in model.graph.node}


# --- validation in quantization steps ------------------------------------------------------------------------

def test_quantized_outputs_are_judged_in_their_own_steps():
    scale = np.array([0.5, 0.25], dtype=np.float32).reshape(1, 2, 1)
    ref = {"y": np.array([[[1.0, 2.0], [0.25, 0.5]]], dtype=np.float32)}
    one = {"y": np.array([[[1.5, 2.0], [0.25, 0.75]]], dtype=np.float32)}  # one step on each channel
    two = {"y": np.array([[[1.0, 2.0], [0.25, 1.0]]], dtype=np.float32)}  # two steps on channel 1
    kw = {"exact": True, "rtol": 1e-4, "atol": 1e-5, "max_approx_error": 0.5}
    passed = compare_quantized([ref], [one], {"y": scale}, **kw)
    diff = passed.outputs[0]
    assert isinstance(diff, QuantOutputDiff) and passed.passed
    assert diff.max_steps == pytest.approx(1.0) and diff.moved_elements == 2 and diff.elements == 4
    failed = compare_quantized([ref], [two], {"y": scale}, **kw)
    assert not failed.passed and failed.outputs[0].max_steps == pytest.approx(2.0)
    assert compare_quantized([ref], [two], {"y": scale}, quant_steps=2, **kw).passed
    assert "max_steps" in failed.to_json()["outputs"][0]


# --- align-channels and the whole default run on QDQ models ---------------------------------------------------

@pytest.mark.parametrize("name", [*CONFIGS])
def test_align_channels_is_exact_on_qdq_models(quantized, name):
    path = quantized(name)
    original = onnx.load(path)
    # The exact passes only (fold-batchnorm and linear->nearest are measured, tested below).
    model, result, opts = _fix(path, skip=("fold-batchnorm", "resize-nearest"), align=8)
    align = next(p for p in result.report.passes if p.name == "align-channels")
    assert any(c.action == "pad-channels" for c in align.changes), align.rejections
    assert align.exact and not align.quantized_tolerance
    final = result.report.final
    assert result.ok and final is not None and final.passed
    quantized_outputs = [o for o in final.outputs if isinstance(o, QuantOutputDiff)]
    assert quantized_outputs and all(o.max_steps <= 1 + 1e-5 for o in quantized_outputs)
    # No violation left that a pass claims to fix.
    checked = check_model(model, opts)
    skipped = ("fold-batchnorm", "resize-nearest")
    assert [v for v in checked.violations if v.fixed_by and v.fixed_by not in skipped] == []
    # Still QDQ: nothing the passes added (or rewired) computes on a float tensor outside a DQ -> op -> Q.
    before = {p.split(" ")[0] for p in walk_non_qdq(original)}
    new = [p for p in walk_non_qdq(model) if p.split(" ")[0] not in before]
    assert new == []
    # Idempotent: a second run finds nothing to pad.
    assert not AlignChannelsPass().run(model, FixOptions(align=8)).changes


@pytest.mark.parametrize("name", [*CONFIGS])
def test_default_run_on_qdq_models(quantized, name):
    """The whole default run (fold-batchnorm and linear -> nearest measured): it succeeds, leaves no violation a
    pass claims to fix, and the output is still QDQ."""
    path = quantized(name)
    original = onnx.load(path)
    options = {"max_dilation": 4} if name.startswith(("tcn", "torch_convtasnet")) else {}
    model, result, opts = _fix(path, align=8, **options)
    assert result.ok, [(p.name, p.error) for p in result.report.passes if p.error]
    assert [v.text() for v in check_model(model, opts).violations if v.fixed_by] == []
    before = {p.split(" ")[0] for p in walk_non_qdq(original)}
    assert [p for p in walk_non_qdq(model) if p.split(" ")[0] not in before] == []
    for record in result.report.passes:
        if record.quantized_tolerance:
            assert not record.exact


def test_align_channels_pads_qdq_weights_with_their_zero_point(quantized):
    model = onnx.load(quantized("unet-pc-u8"))
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    prepare(fixed, FixOptions())
    AlignChannelsPass().run(fixed, FixOptions(align=8))
    index = GraphIndex(fixed)
    convs = [n for n in fixed.graph.node if n.op_type == "Conv"]
    for conv in convs:
        dq = index.producer[conv.input[1]]
        assert dq.op_type == "DequantizeLinear"
        q = numpy_helper.to_array(index.initializers[dq.input[0]])
        scale = numpy_helper.to_array(index.initializers[dq.input[1]])
        assert np.all(scale > 0) and np.all(np.isfinite(scale))
        if scale.size > 1:
            assert scale.size == q.shape[0]  # per-channel scale padded with the filters
        if q.shape[0] % 8 == 0 and q.shape[0] > 1:
            assert q.dtype == np.int8


def test_check_promises_align_channels_only_where_it_pads(quantized):
    model = onnx.load(quantized("unet-pc-u8"))
    checked = check_model(model, FixOptions(align=8))
    aligns = [v for v in checked.violations if v.constraint.endswith("channels-align")]
    assert aligns and all(v.fixed_by == "align-channels" for v in aligns)


# --- fold-batchnorm in QDQ ------------------------------------------------------------------------------------

def _ratio(float_path: str, qdq: onnx.ModelProto, fixed: onnx.ModelProto) -> tuple[float, float]:
    """(||fixed - qdq|| / ||qdq - float||, ||fixed - float|| / ||qdq - float||) on seeded inputs."""
    reference = onnx.load(float_path)
    feeds = make_inputs(reference, 3, 11)
    outs = [Runner(m).run_all(feeds) for m in (reference, qdq, fixed)]
    name = next(iter(outs[0][0]))
    flt, q, fx = (np.concatenate([o[name].ravel() for o in run]).astype(np.float64) for run in outs)
    noise = np.linalg.norm(q - flt)
    return float(np.linalg.norm(fx - q) / noise), float(np.linalg.norm(fx - flt) / noise)


def test_fold_batchnorm_folds_into_qdq_conv_scales_and_declares_the_rounding(quantized):
    path = quantized("unet-pc-u8")  # no quant_pre_process: the BNs sit between DQ and Q
    qdq = onnx.load(path)
    assert sum(n.op_type == "BatchNormalization" for n in qdq.graph.node) == 5
    model, result, _ = _fix(path, align=8)
    assert result.ok
    record = next(p for p in result.report.passes if p.name == "fold-batchnorm")
    assert record.quantized_tolerance and not record.exact  # never reported bit-exact
    assert record.to_json()["quantized_tolerance"] is True
    folds = [c for c in record.changes if c.action == "folded into QDQ conv scale"]
    assert len(folds) == 5 and all("one requantization removed" in c.detail["rounding"] for c in folds)
    assert not any(n.op_type == "BatchNormalization" for n in model.graph.node)
    diff = record.validation.outputs[0]
    assert isinstance(diff, QuantOutputDiff) and diff.max_steps >= 1  # a rounding really went away
    # Weight scales are per channel now, positive and finite.
    index = GraphIndex(model)
    for conv in (n for n in model.graph.node if n.op_type == "Conv"):
        dq = index.producer[conv.input[1]]
        scale = numpy_helper.to_array(index.initializers[dq.input[1]])
        assert scale.ndim == 1 and np.all(scale > 0)
    before = {p.split(" ")[0] for p in walk_non_qdq(qdq)}
    assert [p for p in walk_non_qdq(model) if p.split(" ")[0] not in before] == []


def test_fold_batchnorm_qdq_moves_less_than_quantization_itself(quantized):
    path = quantized("unet-pc-u8")
    qdq = onnx.load(path)
    model, result, _ = _fix(path, skip=("resize-nearest",), align=8)
    moved, to_float = _ratio(os.path.join(ROOT, "unet.onnx"), qdq, model)
    assert 0 < moved < 1.0  # the fold moves the output by less than quantization moved it
    assert to_float < 1.0  # and one rounding fewer brings it closer to the float model


def _qdq_conv_bn(gamma: np.ndarray, weight_q: np.ndarray, per_channel: bool,
                 op: str = "Conv") -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv(DQ(W_q)) -> Q -> DQ -> BN -> Q -> DQ -> y, hand-built (int8, 1x1 kernel); ``weight_q``
    is [M, C, 1, 1] and stored transposed for a ConvTranspose ([C, M, 1, 1], per-channel on axis 1)."""
    m, c = weight_q.shape[:2]
    if op == "ConvTranspose":
        weight_q = weight_q.transpose(1, 0, 2, 3)
    w_scale = np.full(m, 0.02, np.float32) if per_channel else np.array(0.02, np.float32)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "sx"), numpy_helper.from_array(np.array(0, np.int8), "zx"),
        numpy_helper.from_array(weight_q.astype(np.int8), "wq"), numpy_helper.from_array(w_scale, "sw"),
        numpy_helper.from_array(np.zeros(w_scale.shape, np.int8), "zw"),
        numpy_helper.from_array(np.array(0.1, np.float32), "s1"), numpy_helper.from_array(np.array(0, np.int8), "z1"),
        numpy_helper.from_array(gamma.astype(np.float32), "g"),
        numpy_helper.from_array(np.linspace(-0.2, 0.2, m).astype(np.float32), "b"),
        numpy_helper.from_array(np.linspace(-0.1, 0.1, m).astype(np.float32), "mu"),
        numpy_helper.from_array(np.linspace(0.5, 1.5, m).astype(np.float32), "var"),
        numpy_helper.from_array(np.array(0.06, np.float32), "s2"), numpy_helper.from_array(np.array(0, np.int8), "z2"),
    ]
    axis = {"axis": 0 if op == "Conv" else 1} if per_channel else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], name="dqw", **axis),
        helper.make_node(op, ["xd", "w"], ["c"], name="conv"),
        helper.make_node("QuantizeLinear", ["c", "s1", "z1"], ["cq"], name="q1"),
        helper.make_node("DequantizeLinear", ["cq", "s1", "z1"], ["cd"], name="dq1"),
        helper.make_node("BatchNormalization", ["cd", "g", "b", "mu", "var"], ["n"], name="bn"),
        helper.make_node("QuantizeLinear", ["n", "s2", "z2"], ["nq"], name="q2"),
        helper.make_node("DequantizeLinear", ["nq", "s2", "z2"], ["y"], name="dq2"),
    ]
    graph = helper.make_graph(nodes, "qdq_conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   [1, c, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, 6, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_fold_batchnorm_negative_gamma_and_int8_min(tmp_path, per_channel, op):
    rng = np.random.default_rng(3)
    weight = rng.integers(-127, 128, (8, 4, 1, 1))
    weight[2, 0, 0, 0] = -128  # its reflection, 128, is not int8: that channel is requantized
    gamma = np.array([1.0, -0.5, -2.0, 0.7, 1.3, -1.1, 0.9, 1.0])
    model = _qdq_conv_bn(gamma, weight, per_channel, op)
    onnx.checker.check_model(model)
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    fixed, result, _ = _fix(path, align=8)
    assert result.ok, result.report.to_json()
    record = next(p for p in result.report.passes if p.name == "fold-batchnorm")
    (change,) = [c for c in record.changes if c.action == "folded into QDQ conv scale"]
    assert change.detail["negated_channels"] == 3 and change.detail["requantized_channels"] == [2]
    assert [n.op_type for n in fixed.graph.node].count("QuantizeLinear") == 2  # the middle Q went
    diff = result.report.final.outputs[0]
    # One layer: what moved is the removed rounding of Q1 (half its step, scaled by |a|: < 2 steps of Q2, so
    # at most 2 after Q2's own rounding), plus one for the requantized channel's weights.
    a = np.abs(gamma) / np.sqrt(np.linspace(0.5, 1.5, 8) + 1e-5)
    bound = np.ceil(a.max() * 0.1 / (2 * 0.06)) + 1
    assert isinstance(diff, QuantOutputDiff) and 0 < diff.max_steps <= bound + 1e-5


# --- QOperator models ---------------------------------------------------------------------------------------

def _qlinear_conv_model() -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.array(0.1, np.float32), "xs"),
        numpy_helper.from_array(np.array(128, np.uint8), "xz"),
        numpy_helper.from_array(np.ones((20, 3, 3, 3), np.int8), "w"),
        numpy_helper.from_array(np.array(0.01, np.float32), "ws"), numpy_helper.from_array(np.array(0, np.int8), "wz"),
        numpy_helper.from_array(np.array(0.2, np.float32), "ys"),
        numpy_helper.from_array(np.array(128, np.uint8), "yz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="qx"),
        helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["yq"], name="qconv",
                         pads=[2, 2, 2, 2], dilations=[2, 2]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="dqy"),
    ]
    graph = helper.make_graph(nodes, "qop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 20, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_qoperator_convs_are_refused_with_a_reason(tmp_path):
    model = _qlinear_conv_model()
    onnx.checker.check_model(model)
    path = str(tmp_path / "qop.onnx")
    onnx.save(model, path)
    fixed, result, opts = _fix(path, align=8, max_dilation=1)
    assert result.ok
    for name in ("align-channels", "dilated-conv"):  # each pass that would touch it says why it does not
        record = next(p for p in result.report.passes if p.name == name)
        (rejection,) = record.rejections
        assert rejection.node == "qconv" and rejection.blocking and "QOperator" in rejection.reason
        assert not record.changes
    violations = {v.constraint: v for v in check_model(fixed, opts).violations}
    for constraint in ("out-channels-align", "dilation"):
        assert violations[constraint].fixed_by is None and "QOperator" in violations[constraint].message


# --- exact Resize forms on quantized tensors -------------------------------------------------------------------

def test_exact_resize_on_a_qdq_model_stays_qdq(quantized):
    path = quantized("unet-pc-u8")
    original = onnx.load(path)
    model, result, _ = _fix(path, align=8, resize_mode="exact")
    assert result.ok
    record = next(p for p in result.report.passes if p.name == "resize-nearest")
    assert record.quantized_tolerance and not record.exact  # ties on the grid: measured, never "exact"
    index = GraphIndex(model)
    interps = [n for n in model.graph.node if n.op_type == "ConvTranspose"]
    assert len(interps) == 2
    for node in interps:
        dq = index.producer[node.input[1]]
        assert dq.op_type == "DequantizeLinear"
        assert numpy_helper.to_array(index.initializers[dq.input[0]]).dtype == np.int8
        assert float(numpy_helper.to_array(index.initializers[dq.input[1]])) == 1 / 16  # [1,3,3,1]^2 / 16
    before = {p.split(" ")[0] for p in walk_non_qdq(original)}
    assert [p for p in walk_non_qdq(model) if p.split(" ")[0] not in before] == []


def test_power_of_two_int8_is_exact_or_nothing():
    q, scale = power_of_two_int8(np.array([0.25, 0.75, 0.0625, -0.5]))
    assert scale == 1 / 16 and q.tolist() == [4, 12, 1, -8]
    assert power_of_two_int8(np.array([1 / 3, 2 / 3])) is None  # align_corners 2N-1 weights: not representable
    assert power_of_two_int8(np.array([200.0])) is None


def _qdq_resize(path: str, coord: str) -> None:
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(np.array([], np.float32), "roi"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
             helper.make_node("Resize", ["xd", "roi", "scales"], ["r"], name="up", mode="linear",
                              coordinate_transformation_mode=coord),
             helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"], name="qr"),
             helper.make_node("DequantizeLinear", ["rq", "s", "z"], ["y"], name="dqy")]
    graph = helper.make_graph(nodes, "qdq_resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 [1, 8, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_exact_resize_form_not_representable_in_int8_is_refused(tmp_path):
    """align_corners x2 on 4 -> 8 interpolates with weights k/7: no int8 weight with a power-of-two scale."""
    path = str(tmp_path / "r.onnx")
    _qdq_resize(path, "align_corners")
    model, result, _ = _fix(path, resize_mode="exact")
    record = next(p for p in result.report.passes if p.name == "resize-nearest")
    assert not record.changes
    (rejection,) = record.rejections
    assert rejection.node == "up" and "power-of-two" in rejection.reason
    assert [n.op_type for n in model.graph.node].count("Resize") == 1



def test_a_shared_qdq_weight_is_copied_before_padding(tmp_path):
    """Two convs read one DequantizeLinear weight: each gets a padded private copy, the original is not edited."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(rng.integers(-127, 128, (20, 20, 1, 1)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.full(20, 0.01, np.float32), "sw"),
             numpy_helper.from_array(np.zeros(20, np.int8), "zw")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], name="dqw", axis=0),
             helper.make_node("Conv", ["xd", "w"], ["a"], name="conv_a"),
             helper.make_node("QuantizeLinear", ["a", "s", "z"], ["aq"], name="qa"),
             helper.make_node("DequantizeLinear", ["aq", "s", "z"], ["ad"], name="dqa"),
             helper.make_node("Conv", ["ad", "w"], ["b"], name="conv_b"),
             helper.make_node("QuantizeLinear", ["b", "s", "z"], ["bq"], name="qb"),
             helper.make_node("DequantizeLinear", ["bq", "s", "z"], ["y"], name="dqy")]
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 20, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 20, 5, 5])], inits)
    path = str(tmp_path / "shared.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model, result, _ = _fix(path, align=8, align_io=True)
    assert result.ok and result.report.final.passed
    assert result.report.final.outputs[0].max_steps <= 1 + 1e-5
    index = GraphIndex(model)
    weights = {index.producer[n.input[1]].name for n in model.graph.node if n.op_type == "Conv"}
    assert len(weights) == 2  # a private DequantizeLinear each
    for name in weights:
        dq = next(n for n in model.graph.node if n.name == name)
        assert numpy_helper.to_array(index.initializers[dq.input[0]]).shape == (24, 24, 1, 1)
        assert numpy_helper.to_array(index.initializers[dq.input[1]]).shape == (24,)


def test_per_channel_activation_quantization_carries_the_padding(tmp_path):
    """Conv(20) -> Q/DQ per channel (axis 1) -> Conv: the activation scale and zero point are padded with the
    filters (scale 1, zero point 0 on the pad channels), and the result is bit for bit the original's."""
    rng = np.random.default_rng(9)
    act_scale = rng.uniform(0.02, 0.08, 20).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(rng.integers(-127, 128, (20, 8, 3)).astype(np.int8), "wa"),
             numpy_helper.from_array(rng.integers(-127, 128, (8, 20, 3)).astype(np.int8), "wb"),
             numpy_helper.from_array(np.array(0.01, np.float32), "sw"),
             numpy_helper.from_array(np.array(0, np.int8), "zw"),
             numpy_helper.from_array(act_scale, "sa"),
             numpy_helper.from_array(rng.integers(-5, 5, 20).astype(np.int8), "za")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["wa", "sw", "zw"], ["wad"], name="dqwa"),
             helper.make_node("DequantizeLinear", ["wb", "sw", "zw"], ["wbd"], name="dqwb"),
             helper.make_node("Conv", ["xd", "wad"], ["a"], name="conv_a", pads=[1, 1]),
             helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"], name="qa", axis=1),
             helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["ad"], name="dqa", axis=1),
             helper.make_node("Conv", ["ad", "wbd"], ["b"], name="conv_b", pads=[1, 1]),
             helper.make_node("QuantizeLinear", ["b", "s", "z"], ["bq"], name="qb"),
             helper.make_node("DequantizeLinear", ["bq", "s", "z"], ["y"], name="dqy")]
    graph = helper.make_graph(nodes, "pc_act", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], inits)
    path = str(tmp_path / "pc_act.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model, result, _ = _fix(path, align=8)
    assert result.ok and result.report.final.outputs[0].max_steps == 0
    align = next(p for p in result.report.passes if p.name == "align-channels")
    assert {c.op for c in align.changes if c.action == "carry"} == {"QuantizeLinear", "DequantizeLinear"}
    index = GraphIndex(model)
    q = next(n for n in model.graph.node if n.name == "qa")
    scale = numpy_helper.to_array(index.initializers[q.input[1]])
    zero = numpy_helper.to_array(index.initializers[q.input[2]])
    assert scale.shape == (24,) and np.array_equal(scale[:20], act_scale) and np.all(scale[20:] == 1)
    assert zero.shape == (24,) and np.all(zero[20:] == 0)


@pytest.mark.parametrize("coord", ["asymmetric", "half_pixel", "pytorch_half_pixel"])
def test_exact_resize_forms_with_a_crop_stay_qdq(tmp_path, coord):
    path = str(tmp_path / "r.onnx")
    _qdq_resize(path, coord)
    original = onnx.load(path)
    model, result, _ = _fix(path, resize_mode="exact")
    record = next(p for p in result.report.passes if p.name == "resize-nearest")
    assert result.ok and record.changes and not record.rejections
    before = {q.split(" ")[0] for q in walk_non_qdq(original)}
    assert [p for p in walk_non_qdq(model) if p.split(" ")[0] not in before] == []
    assert result.report.final.outputs[0].max_steps <= 1 + 1e-5  # one Resize: a tie rounds at most one step away


def test_wrap_moves_quantizes_on_each_grid_and_never_between_stages():
    """Pad -> Conv -> Slice replacing an op from DQ(x, s) to Q(y, s2): the Pad is requantized with s (its values
    are still x's), the Conv's output with s2 (what the Slice's readers quantize it with), nothing else."""
    from onnx_npu_fix.ir.graph import GraphEditor
    from onnx_npu_fix.ir.qdq import wrap_moves

    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(0.07, np.float32), "s2"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
             helper.make_node("Relu", ["xd"], ["r"], name="op"),
             helper.make_node("QuantizeLinear", ["r", "s2", "z"], ["rq"], name="qr"),
             helper.make_node("DequantizeLinear", ["rq", "s2", "z"], ["y"], name="dqy")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4])], inits)
    index = GraphIndex(helper.make_model(graph))
    editor = GraphEditor(index)
    chain = [helper.make_node("Pad", ["xd", "pads"], ["p"], name="pad"),
             helper.make_node("Conv", ["p", "w"], ["c"], name="conv"),
             helper.make_node("Slice", ["c", "a", "b"], ["r"], name="crop")]
    out = wrap_moves(index, editor, "xd", chain)
    assert [(n.op_type, n.input[1] if n.op_type.endswith("Linear") else "") for n in out] == [
        ("Pad", ""), ("QuantizeLinear", "s"), ("DequantizeLinear", "s"), ("Conv", ""),
        ("QuantizeLinear", "s2"), ("DequantizeLinear", "s2"), ("Slice", "")]
    assert out[3].input[0] == "p" and out[6].input[0] == "c" and out[6].output[0] == "r"  # names kept


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_per_channel_weights_of_both_conv_kinds_are_padded_on_their_output_axis(tmp_path, op):
    """Conv [M, C, k] per-channel on axis 0, ConvTranspose [C, M, k] on axis 1, M = 12 -> 16, with an int32
    bias: the outputs are bit for bit the original's."""
    rng = np.random.default_rng(13)
    shape = (12, 8, 3) if op == "Conv" else (8, 12, 3)
    w_scale = rng.uniform(0.005, 0.02, 12).astype(np.float32)
    b_scale = (np.float32(0.05) * w_scale).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(3, np.int8), "z"),
             numpy_helper.from_array(rng.integers(-127, 128, shape).astype(np.int8), "wq"),
             numpy_helper.from_array(w_scale, "sw"), numpy_helper.from_array(np.zeros(12, np.int8), "zw"),
             numpy_helper.from_array(rng.integers(-2000, 2000, 12).astype(np.int32), "bq"),
             numpy_helper.from_array(b_scale, "sb"), numpy_helper.from_array(np.zeros(12, np.int32), "zb"),
             numpy_helper.from_array(np.array(0.08, np.float32), "so")]
    axis = 0 if op == "Conv" else 1
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], name="dqw", axis=axis),
             helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["b"], name="dqb", axis=0),
             helper.make_node(op, ["xd", "w", "b"], ["c"], name="conv", pads=[1, 1]),
             helper.make_node("QuantizeLinear", ["c", "so", "z"], ["cq"], name="qc"),
             helper.make_node("DequantizeLinear", ["cq", "so", "z"], ["y"], name="dqy")]
    graph = helper.make_graph(nodes, "pc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 12, 10])], inits)
    path = str(tmp_path / "pc.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model, result, _ = _fix(path, align=8)
    assert result.ok and result.report.final.outputs[0].max_steps == 0
    index = GraphIndex(model)
    conv = next(n for n in model.graph.node if n.op_type == op)
    dq_w, dq_b = index.producer[conv.input[1]], index.producer[conv.input[2]]
    q = numpy_helper.to_array(index.initializers[dq_w.input[0]])
    assert q.shape[axis] == 16 and numpy_helper.to_array(index.initializers[dq_w.input[1]]).shape == (16,)
    assert numpy_helper.to_array(index.initializers[dq_b.input[0]]).tolist()[12:] == [0, 0, 0, 0]
    assert numpy_helper.to_array(index.initializers[dq_b.input[1]]).shape == (16,)


# --- every emitted form stays canonical QDQ ---------------------------------------------------------------------

_INTEGER = {TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16}

# (quantized fixture, options): every form the passes emit on a quantized tensor — space-to-batch in each layout and
# remainder form, the 1-D conv lift, align-channels' padding and slicing, the exact Resize forms.
_FORMS = {
    **{f"s2b-{layout}-{pad}": ("tcn-pc-u8", {"max_dilation": 2, "s2b_layout": layout, "remainder_pad": pad})
       for layout in ("spatial", "channel", "batch") for pad in ("concat", "pad4d", "pad")},
    "s2b-lift-i8": ("tcn-pt-i8-pre", {"max_dilation": 2, "lift_conv1d": True, "remainder_pad": "concat"}),
    "s2b-convtasnet": ("torch_convtasnet-pc-u8", {"max_dilation": 4}),
    "align-resize-exact": ("unet-pc-u8", {"align": 8, "resize_mode": "exact"}),
}


@pytest.mark.parametrize("form", [*_FORMS])
def test_every_emitted_form_is_canonical_qdq(quantized, form):
    """On models onnxruntime's quantize_static made, no op npufix emits reads or writes an integer activation
    except QuantizeLinear / DequantizeLinear (Qualcomm HTP rejects a Concat on raw uint8 tensors), every
    inserted float op sits in a DQ -> op -> Q unit, and the outputs stay within one quantization step."""
    name, options = _FORMS[form]
    path = quantized(name)
    original = onnx.load(path)
    model, result, _ = _fix(path, skip=("fold-batchnorm",), **options)
    assert result.ok and result.report.final is not None and result.report.final.passed
    assert any(p.changes for p in result.report.passes if p.name in ("dilated-conv", "align-channels"))
    index = GraphIndex(model)
    kept = _node_names(original)
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or node.name in kept:
            continue
        names = [n for n in (*node.input, *node.output) if n and not index.is_const(n)]
        assert not [n for n in names if index.elem_type(n) in _INTEGER], f"{node.name} ({node.op_type})"
    before = {p.split(" ")[0] for p in walk_non_qdq(original)}
    assert [p for p in walk_non_qdq(model) if p.split(" ")[0] not in before] == []
    steps = [o for o in result.report.final.outputs if isinstance(o, QuantOutputDiff)]
    assert steps
    if options.get("resize_mode") == "exact":  # ties on the grid round the other way: declared, and measured
        assert next(p for p in result.report.passes if p.name == "resize-nearest").quantized_tolerance
    else:
        assert all(o.max_steps <= 1 + 1e-5 for o in steps)


def test_qdq_fold_messages_give_the_real_fix_and_strict_names_the_nodes(quantized):
    """The QDQ fold is measured, not exact: --strict refuses it naming the BatchNormalizations, and both the
    refusal and the APPROXIMATE line say what makes it exact (quant_pre_process before quantizing)."""
    from onnx_npu_fix.errors import StrictRefused
    from onnx_npu_fix.pipeline.report import approximation_summary

    path = quantized("unet-pc-u8")  # no quant_pre_process: the BNs sit between DQ and Q
    bns = [n.name for n in onnx.load(path).graph.node if n.op_type == "BatchNormalization"]
    with pytest.raises(StrictRefused) as refused:
        _fix(path, skip=("resize-nearest",), align=8, strict=True)
    message = str(refused.value)
    assert f"would change {len(bns)} node(s) approximately ({', '.join(bns[:3])} and {len(bns) - 3} more)" \
        in message, message
    assert "quant_pre_process before quantizing" in message
    _, result, _ = _fix(path, skip=("resize-nearest",), align=8)
    line = approximation_summary(result.report)
    assert line.startswith(f"APPROXIMATE: fold-batchnorm changed {len(bns)} BatchNormalization ("), line
    assert "quant_pre_process before quantizing" in line
