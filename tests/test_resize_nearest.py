"""resize-nearest: canonical nearest form, linear/cubic -> nearest (approximate), exact ConvTranspose/MatMul forms."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import apply_pass, assert_equivalent, ops, quantize_with_onnxruntime, rng
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.ir.graph import get_attr
from onnx_npu_fix.passes.resize_nearest import ResizeNearestPass, dense_matrix, interpolation_triplets
from onnx_npu_fix.pipeline.inputs import make_inputs
from onnx_npu_fix.pipeline.validation.session import Runner

COORDS = ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners", "half_pixel_symmetric"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


# --- model builders ---------------------------------------------------------------------------------


def resize_node(x: str, y: str, inits: list, opset: int, *, name: str = "rs", scales=None, sizes=None,
                roi: bool = False, **attrs) -> onnx.NodeProto:
    """A Resize of ``opset``'s form; ``roi=True`` gives it an (ignored) empty roi initializer."""
    inputs = [x]
    if opset >= 11:
        if roi or opset < 13:
            inits.append(numpy_helper.from_array(np.zeros(0, np.float32), f"{name}_roi"))
            inputs.append(f"{name}_roi")
        else:
            inputs.append("")
    if scales is not None:
        inits.append(numpy_helper.from_array(np.asarray(scales, np.float32), f"{name}_scales"))
        inputs.append(f"{name}_scales")
    else:
        if opset < 13:  # Resize-11/12: scales is required, empty when sizes are given
            inits.append(numpy_helper.from_array(np.zeros(0, np.float32), f"{name}_scales"))
            inputs.append(f"{name}_scales")
        else:
            inputs.append("")
        if isinstance(sizes, str):
            inputs.append(sizes)
        else:
            inits.append(numpy_helper.from_array(np.asarray(sizes, np.int64), f"{name}_sizes"))
            inputs.append(f"{name}_sizes")
    return helper.make_node("Resize", inputs, [y], name=name, **attrs)


def single_resize(shape, *, opset: int = 17, elem=TensorProto.FLOAT, **kwargs) -> onnx.ModelProto:
    inits: list = []
    node = resize_node("x", "y", inits, opset, **kwargs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, list(shape))],
                              [helper.make_tensor_value_info("y", elem, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def upsample_model(opset: int, mode: str, scales, *, extra=(), ir_version: int = 8) -> onnx.ModelProto:
    inits = []
    if opset >= 9:
        node = helper.make_node("Upsample", ["x", "up_scales"], ["y"], name="up", mode=mode)
        inits.append(numpy_helper.from_array(np.asarray(scales, np.float32), "up_scales"))
    else:
        node = helper.make_node("Upsample", ["x"], ["y"], name="up", mode=mode, scales=[float(s) for s in scales])
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    outputs += [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None) for n in extra]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 5])
    graph = helper.make_graph([node, *extra], "g", [x], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def unet_like(mode: str = "linear", coord: str = "half_pixel", *, seed: int = 0) -> onnx.ModelProto:
    """conv -> pool -> conv -> Resize x2 -> concat(skip) -> conv: the decoder step of a U-Net."""
    g = rng(seed)
    inits: list = []

    def conv(name, x, cin, cout, k, relu=True):
        w = (g.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (cin * k * k))).astype(np.float32)
        b = (g.standard_normal(cout) * 0.1).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")])
        nodes = [helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], name=name, pads=[k // 2] * 4)]
        if relu:
            nodes.append(helper.make_node("Relu", [name], [f"{name}_relu"], name=f"{name}_relu"))
        return nodes, nodes[-1].output[0]

    nodes, enc = conv("enc", "x", 3, 8, 3)
    nodes.append(helper.make_node("MaxPool", [enc], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2]))
    more, mid = conv("mid", "pool", 8, 16, 3)
    nodes += more
    nodes.append(resize_node(mid, "up", inits, 17, name="up", scales=[1, 1, 2, 2], mode=mode,
                             coordinate_transformation_mode=coord))
    nodes.append(helper.make_node("Concat", ["up", enc], ["cat"], name="cat", axis=1))
    more, dec = conv("dec", "cat", 24, 8, 3)
    nodes += more
    more, _ = conv("head", dec, 8, 2, 1, relu=False)
    nodes += more
    graph = helper.make_graph(nodes, "unet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("head", TensorProto.FLOAT, [1, 2, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# --- helpers ----------------------------------------------------------------------------------------


def run(model: onnx.ModelProto, feeds: list[dict]) -> list[dict]:
    return Runner(model).run_all(feeds)


def int_feeds(model: onnx.ModelProto, seeds=(0, 1)) -> list[dict]:
    """Small-integer float inputs: nearest copies and exact sums are bit-exact on them."""
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return [{"x": rng(s).integers(-8, 9, shape).astype(np.float32)} for s in seeds]


def smooth_feeds(shape, seeds=(0, 1, 2), corr: float = 2.0) -> list[dict]:
    """Unit-variance Gaussian fields low-passed over ``corr`` pixels (feature-map-like inputs)."""
    feeds = []
    for s in seeds:
        z = rng(s).standard_normal(shape)
        fy = np.fft.fftfreq(shape[-2])[:, None]
        fx = np.fft.fftfreq(shape[-1])[None, :]
        z = np.real(np.fft.ifft2(np.fft.fft2(z) * np.exp(-2 * (np.pi * corr) ** 2 * (fx**2 + fy**2))))
        feeds.append({"x": ((z - z.mean()) / z.std()).astype(np.float32)})
    return feeds


def rel_l2(ref: list[dict], got: list[dict]) -> float:
    err = sum(float(np.sum((r["y"].astype(np.float64) - g["y"]) ** 2)) for r, g in zip(ref, got))
    return float(np.sqrt(err / sum(float(np.sum(r["y"].astype(np.float64) ** 2)) for r in ref)))


def assert_all_nearest(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        if node.op_type in ("Resize", "Upsample"):
            assert get_attr(node, "mode", "nearest") == "nearest", node.name


def init_value(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def assert_canonical(model: onnx.ModelProto, factors: list[int]) -> None:
    (node,) = [n for n in model.graph.node if n.op_type == "Resize"]
    assert get_attr(node, "mode") == "nearest"
    assert get_attr(node, "coordinate_transformation_mode") == "asymmetric"
    assert get_attr(node, "nearest_mode") == "floor"
    assert len(node.input) == 3 and node.input[2]
    np.testing.assert_array_equal(init_value(model, node.input[2]), np.asarray(factors, np.float32))


def repeat_reference(x: np.ndarray, factors) -> np.ndarray:
    for axis, s in enumerate(factors):
        x = np.repeat(x, s, axis=axis)
    return x


# --- the interpolation matrices the exact forms are built from ----------------------------------------


@pytest.mark.parametrize("kind", ["linear", "cubic"])
@pytest.mark.parametrize("coord", COORDS)
def test_interpolation_matrix_matches_onnxruntime(kind, coord):
    # (H_in, H_out, W_in, W_out, by sizes) — up, down, non-integer, length-1 axes; cubic also with
    # cubic_coeff_a=-0.5 and exclude_outside=1.
    cases = [(4, 8, 5, 10, False), (5, 10, 3, 5, True), (7, 3, 6, 13, True), (6, 11, 4, 8, True),
             (8, 4, 9, 3, True), (1, 3, 2, 2, True)]
    cubic = [(-0.75, 0), (-0.5, 1)] if kind == "cubic" else [(-0.75, 0)]
    for h_in, h_out, w_in, w_out, by_sizes in cases:
        for a, exclude in cubic:
            x = rng(h_in * 7 + w_in).standard_normal((1, 2, h_in, w_in)).astype(np.float32)
            attrs = dict(mode=kind, coordinate_transformation_mode=coord, cubic_coeff_a=a, exclude_outside=exclude)
            if by_sizes:
                model = single_resize(x.shape, opset=19, sizes=[1, 2, h_out, w_out], **attrs)
                sh, sw = np.float32(h_out) / np.float32(h_in), np.float32(w_out) / np.float32(w_in)
            else:
                sh, sw = np.float32(h_out / h_in), np.float32(w_out / w_in)
                model = single_resize(x.shape, opset=19, scales=[1, 1, sh, sw], **attrs)
            (got,) = run(model, [{"x": x}])
            mh = dense_matrix(interpolation_triplets(kind, coord, h_in, h_out, float(sh), cubic_a=a,
                                                     exclude_outside=exclude), h_out, h_in)
            mw = dense_matrix(interpolation_triplets(kind, coord, w_in, w_out, float(sw), cubic_a=a,
                                                     exclude_outside=exclude), w_out, w_in)
            want = np.einsum("oh,nchw,pw->ncop", mh, x.astype(np.float64), mw)
            np.testing.assert_allclose(got["y"], want, rtol=0, atol=1e-5,
                                       err_msg=f"{kind} {coord} {h_in}->{h_out} {w_in}->{w_out} a={a}")


# --- normalisation: every claimed equivalence, checked against np.repeat --------------------------------


def claimed_canonical(coord: str, nearest_mode: str, s: int) -> bool:
    """The module docstring's table: nearest (coord, nearest_mode) equals floor(i/s) for integer s."""
    if s == 1:
        return True
    if coord == "asymmetric":
        return nearest_mode == "floor" or (nearest_mode == "round_prefer_floor" and s == 2)
    if coord in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric"):
        return nearest_mode.startswith("round")
    if coord == "align_corners":
        return nearest_mode.startswith("round") and s == 2
    return False


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
def test_nearest_combinations_equal_to_canonical_become_canonical(coord, nearest_mode):
    opset = 19 if coord == "half_pixel_symmetric" else 13
    for s in (1, 2, 3, 4):
        for by_sizes in (False, True):
            shape = (1, 2, 3, 5)  # two lengths: align_corners sampling depends on L
            kwargs = dict(sizes=[1, 2, 3 * s, 5 * s]) if by_sizes else dict(scales=[1, 1, s, s])
            model = single_resize(shape, opset=opset, roi=True, mode="nearest",
                                  coordinate_transformation_mode=coord, nearest_mode=nearest_mode, **kwargs)
            feeds = int_feeds(model)
            (ref,) = run(model, feeds[:1])
            equal = np.array_equal(ref["y"], repeat_reference(feeds[0]["x"], [1, 1, s, s]))
            assert equal == claimed_canonical(coord, nearest_mode, s), (coord, nearest_mode, s)
            fixed, result = apply_pass(model, ResizeNearestPass())
            assert result.metrics["exact"] is True
            if not equal:
                assert not result.changes
                assert [r.blocking for r in result.rejections] == [False]
                assert "kept as is" in result.rejections[0].reason
                continue
            already = coord == "asymmetric" and nearest_mode == "floor" and not by_sizes
            if already:
                assert not result.changes and not result.rejections
                continue
            assert_canonical(fixed, [1, 1, s, s])
            assert [c.action for c in result.changes] == ["canonicalise"]
            assert fixed.graph.node[0].input[1] == ""  # opset >= 13: roi dropped
            for r, g in zip(run(model, feeds), run(fixed, feeds)):
                np.testing.assert_array_equal(r["y"], g["y"])


def test_sizes_become_scales_opset11_keeps_roi_slot():
    model = single_resize((1, 2, 3, 4), opset=11, sizes=[1, 2, 6, 12], mode="nearest",
                          coordinate_transformation_mode="half_pixel")
    fixed, result = apply_pass(model, ResizeNearestPass())
    assert_canonical(fixed, [1, 1, 2, 3])
    roi = fixed.graph.node[0].input[1]
    assert roi and init_value(fixed, roi).size == 0  # Resize-11/12 need a roi tensor; onnxruntime rejects ""
    assert result.changes[0].old["sizes"] == [1, 2, 6, 12]
    assert_equivalent(model, fixed, atol=0, rtol=0)


def test_sizes_with_axes_attribute_opset18():
    model = single_resize((1, 2, 3, 4), opset=18, sizes=[6, 8], axes=[2, 3], mode="nearest",
                          coordinate_transformation_mode="pytorch_half_pixel")
    fixed, _ = apply_pass(model, ResizeNearestPass())
    assert_canonical(fixed, [1, 1, 2, 2])
    assert get_attr(fixed.graph.node[0], "axes") is None
    assert_equivalent(model, fixed, atol=0, rtol=0)


def test_sizes_computed_at_run_time_on_a_static_graph_become_constant_scales():
    # sizes = concat(shape(x)[:2], [6, 10]): not a constant, but the static shapes give the factors.
    inits = [numpy_helper.from_array(np.array([6, 10], np.int64), "hw")]
    nodes = [helper.make_node("Shape", ["x"], ["shp"], name="shape", end=2),
             helper.make_node("Concat", ["shp", "hw"], ["sizes"], name="sizes", axis=0)]
    nodes.append(resize_node("x", "y", inits, 13, sizes="sizes", mode="nearest",
                             coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    fixed, _ = apply_pass(model, ResizeNearestPass())
    (node,) = [n for n in fixed.graph.node if n.op_type == "Resize"]
    assert get_attr(node, "coordinate_transformation_mode") == "asymmetric"
    np.testing.assert_array_equal(init_value(fixed, node.input[2]), [1, 1, 2, 2])
    assert_equivalent(model, fixed, atol=0, rtol=0)


@pytest.mark.parametrize(("kwargs", "reason"), [
    (dict(scales=[1, 1, 1.5, 2]), "non-integer factor on axis 2"),
    (dict(sizes=[1, 2, 7, 10]), "non-integer factor on axis 2"),
    (dict(scales=[1, 1, 0.5, 1]), "downsampling on axis 2"),
])
def test_nearest_without_integer_factor_is_left_alone(kwargs, reason):
    model = single_resize((1, 2, 4, 5), mode="nearest", coordinate_transformation_mode="half_pixel", **kwargs)
    fixed, result = apply_pass(model, ResizeNearestPass())
    assert not result.changes
    assert fixed.graph.node[0] == model.graph.node[0]
    (rej,) = result.rejections
    assert reason in rej.reason and not rej.blocking


# --- Upsample and old opsets --------------------------------------------------------------------------


def test_opset9_nearest_upsample_becomes_resize10_when_the_bump_is_safe():
    pool = helper.make_node("MaxPool", ["x"], ["p"], name="mp", kernel_shape=[2, 2])  # MaxPool-8 -> 10 is safe
    model = upsample_model(9, "nearest", [1, 1, 2, 3], extra=[pool], ir_version=4)
    fixed, result = apply_pass(model, ResizeNearestPass())
    assert ops(fixed) == ["Resize", "MaxPool"]
    assert fixed.opset_import[0].version == 10 and fixed.ir_version == 5
    assert result.metrics["opset"] == {"old": 9, "new": 10}
    assert result.changes[0].action == "opset-bump" and result.warnings
    np.testing.assert_array_equal(init_value(fixed, fixed.graph.node[0].input[1]), [1, 1, 2, 3])
    assert_equivalent(model, fixed, atol=0, rtol=0)
    assert result.metrics["exact"] is True


def test_opset7_upsample_scales_attribute_becomes_an_input():
    model = upsample_model(7, "nearest", [1, 1, 2, 2])
    fixed, _ = apply_pass(model, ResizeNearestPass())
    assert ops(fixed) == ["Resize"] and fixed.opset_import[0].version == 10
    assert_equivalent(model, fixed, atol=0, rtol=0)


def test_opset9_upsample_stays_when_the_bump_is_not_provably_safe():
    slice_1 = helper.make_node("Slice", ["x"], ["s"], name="sl", starts=[0], ends=[2], axes=[3])  # Slice-1 -> 10
    model = upsample_model(9, "linear", [1, 1, 2, 2], extra=[slice_1])
    fixed, result = apply_pass(model, ResizeNearestPass())
    assert ops(fixed) == ["Upsample", "Slice"] and fixed.opset_import[0].version == 9
    assert_all_nearest(fixed)
    (rej,) = result.rejections
    assert "Slice changes schema" in rej.reason and not rej.blocking
    assert result.metrics["exact"] is False and result.metrics["approximate_nodes"] == ["up"]


def test_opset9_linear_upsample_exact_mode_needs_no_bump():
    model = upsample_model(9, "linear", [1, 1, 2, 2])
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact")
    assert ops(fixed) == ["Pad", "ConvTranspose"] and fixed.opset_import[0].version == 9
    pad = fixed.graph.node[0]
    assert get_attr(pad, "pads") == [0, 0, 0, 0, 0, 0, 1, 1]  # Pad-2: pads attribute, edge at the end
    assert result.metrics["exact"] is True
    assert_equivalent(model, fixed, atol=1e-6)


def test_opset10_linear_resize():
    model = single_resize((1, 2, 4, 5), opset=10, scales=[1, 1, 2, 2], mode="linear")
    fixed, result = apply_pass(model, ResizeNearestPass())
    assert ops(fixed) == ["Resize"] and get_attr(fixed.graph.node[0], "mode") == "nearest"
    assert result.metrics["exact"] is False
    exact, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact")
    assert ops(exact) == ["Pad", "ConvTranspose"] and result.metrics["exact"] is True
    assert_equivalent(model, exact, atol=1e-6)


# --- nearest mode (approximate) ------------------------------------------------------------------------


def nearest_variant(model: onnx.ModelProto, coord: str, nearest_mode: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    node = out.graph.node[0]
    for key, value in (("mode", "nearest"), ("coordinate_transformation_mode", coord),
                       ("nearest_mode", nearest_mode)):
        for attr in list(node.attribute):
            if attr.name == key:
                node.attribute.remove(attr)
        node.attribute.append(helper.make_attribute(key, value))
    return out


@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"])
@pytest.mark.parametrize("s", [2, 3])
def test_nearest_variant_chosen_is_the_closest(coord, s):
    shape = (1, 4, 12, 12)
    model = single_resize(shape, scales=[1, 1, s, s], mode="linear", coordinate_transformation_mode=coord)
    fixed, result = apply_pass(model, ResizeNearestPass())
    assert_all_nearest(fixed)
    assert result.metrics == {"exact": False, "approximate_nodes": ["rs"], "forms": {"nearest": 1}}
    feeds = make_inputs(model, 2, 0) + smooth_feeds(shape)
    ref = run(model, feeds)
    chosen = rel_l2(ref, run(fixed, feeds))
    others = [rel_l2(ref, run(nearest_variant(model, c, m), feeds))
              for c in {coord, "asymmetric"} for m in NEAREST_MODES]
    assert chosen <= min(others) * 1.02  # round_prefer_floor / _ceil tie by symmetry for asymmetric
    # half_pixel-family (every s) and s = 2 in every mode: the closest variant is the canonical form.
    if coord in ("half_pixel", "pytorch_half_pixel") or s == 2:
        assert_canonical(fixed, [1, 1, s, s])


def test_bilinear_to_nearest_moves_values_by_at_most_7_16_of_the_local_range():
    shape = (1, 3, 8, 8)
    model = single_resize(shape, scales=[1, 1, 2, 2], mode="linear", coordinate_transformation_mode="half_pixel")
    fixed, _ = apply_pass(model, ResizeNearestPass())
    for seed in range(3):
        x = rng(seed).random(shape).astype(np.float32)
        (ref,), (got,) = run(model, [{"x": x}]), run(fixed, [{"x": x}])
        padded = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)], mode="edge")
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
        local_range = np.repeat(np.repeat(windows.max(axis=(-1, -2)) - windows.min(axis=(-1, -2)), 2, 2), 2, 3)
        assert np.all(np.abs(ref["y"] - got["y"]) <= 7 / 16 * local_range + 1e-6)


def test_unet_nearest_mode_validates_within_the_default_bound():
    model = unet_like()
    fixed, result = apply_pass(model, ResizeNearestPass())
    assert ops(fixed).count("Resize") == 1
    assert_all_nearest(fixed)
    assert_canonical(fixed, [1, 1, 2, 2])
    assert result.metrics["exact"] is False and result.metrics["approximate_nodes"] == ["up"]
    cmp = assert_equivalent(model, fixed, exact=False, max_approx_error=0.5)
    (out,) = cmp.outputs
    assert 0 < out.rel_l2 < 0.5 and out.cosine > 0.9  # measured ~0.3 / 0.96: approximate, not exact
    with pytest.raises(AssertionError):
        assert_equivalent(model, fixed)  # and it does not pass as exact
    second, again = apply_pass(fixed, ResizeNearestPass())
    assert not again.changes and second.graph == fixed.graph


def test_integer_sampling_points_make_nearest_exact():
    # half_pixel x1/3: x = 3i + 1 exactly, so the linear weights are (1, 0).
    model = single_resize((1, 2, 9, 6), scales=[1, 1, 1 / 3, 1], mode="linear",
                          coordinate_transformation_mode="half_pixel")
    fixed, result = apply_pass(model, ResizeNearestPass())
    assert_all_nearest(fixed)
    assert result.metrics["exact"] is True and result.metrics["approximate_nodes"] == []
    assert result.changes[0].detail["exact"] is True
    assert_equivalent(model, fixed)


def test_cubic_and_dynamic_scales_become_nearest():
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s0")]
    nodes = [helper.make_node("Identity", ["s0"], ["s"], name="scales")]  # not a constant to the pass
    nodes.append(helper.make_node("Resize", ["x", "", "s"], ["y"], name="rs", mode="cubic",
                                  coordinate_transformation_mode="half_pixel", exclude_outside=1))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for mode in ("nearest", "exact"):
        fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode=mode)
        assert_all_nearest(fixed)
        node = fixed.graph.node[1]
        assert node.input[2] == "s"  # the run-time scales are kept
        assert get_attr(node, "nearest_mode") == "round_prefer_floor"
        assert get_attr(node, "exclude_outside") is None
        assert result.metrics["approximate_nodes"] == ["rs"]
        assert bool(result.warnings) == (mode == "exact")
        if mode == "exact":
            assert "scales 's' is computed at run time" in result.warnings[0]
        assert_equivalent(model, fixed, exact=False, feeds=smooth_feeds((1, 2, 4, 4), corr=1.0))


# --- exact mode ------------------------------------------------------------------------------------------


def conv_transpose(model: onnx.ModelProto) -> tuple[onnx.NodeProto, np.ndarray]:
    (node,) = [n for n in model.graph.node if n.op_type == "ConvTranspose"]
    return node, init_value(model, node.input[1])


Q = np.array([1, 3, 3, 1]) / 4  # half_pixel x2 taps
T2 = np.array([1, 2, 1]) / 2  # asymmetric / align_corners x2 taps


@pytest.mark.parametrize(("shape", "kwargs", "want_ops", "kernel", "pads", "edge"), [
    pytest.param((1, 3, 5, 6), dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="half_pixel"),
                 ["Pad", "ConvTranspose"], np.multiply.outer(Q, Q), [3, 3, 3, 3], [1, 1, 1, 1], id="half_pixel-2d"),
    pytest.param((1, 3, 7), dict(scales=[1, 1, 2], coordinate_transformation_mode="half_pixel"),
                 ["Pad", "ConvTranspose"], Q, [3, 3], [1, 1], id="half_pixel-1d"),
    pytest.param((1, 3, 5, 6), dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="pytorch_half_pixel"),
                 ["Pad", "ConvTranspose"], np.multiply.outer(Q, Q), [3, 3, 3, 3], [1, 1, 1, 1],
                 id="pytorch_half_pixel"),
    pytest.param((1, 3, 5, 6), dict(scales=[1, 1, 2, 1], coordinate_transformation_mode="half_pixel"),
                 ["Pad", "ConvTranspose"], Q[:, None], [3, 0, 3, 0], [1, 0, 1, 0], id="half_pixel-H-only"),
    pytest.param((1, 3, 5, 6), dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="asymmetric"),
                 ["Pad", "ConvTranspose"], np.multiply.outer(T2, T2), [1, 1, 2, 2], [0, 0, 1, 1], id="asymmetric"),
    pytest.param((1, 3, 5, 6), dict(sizes=[1, 3, 9, 11], coordinate_transformation_mode="align_corners"),
                 ["ConvTranspose"], np.multiply.outer(T2, T2), [1, 1, 1, 1], None, id="align_corners-2N-1"),
])
def test_exact_conv_transpose_forms(shape, kwargs, want_ops, kernel, pads, edge):
    model = single_resize(shape, mode="linear", **kwargs)
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact")
    assert ops(fixed) == want_ops
    assert result.metrics["exact"] is True and not result.warnings
    node, weight = conv_transpose(fixed)
    channels = shape[1]
    assert get_attr(node, "group") == channels
    assert get_attr(node, "pads") == pads
    np.testing.assert_allclose(weight, np.broadcast_to(kernel, (channels, 1, *kernel.shape)), atol=1e-7)
    if edge is not None:
        pad = fixed.graph.node[0]
        assert get_attr(pad, "mode") == "edge"
        n_sp = len(shape) - 2
        np.testing.assert_array_equal(init_value(fixed, pad.input[1]),
                                      [0, 0, *edge[:n_sp], 0, 0, *edge[n_sp:]])
    assert_equivalent(model, fixed, atol=1e-6)


@pytest.mark.parametrize(("shape", "kwargs", "want_ops"), [
    pytest.param((1, 3, 5, 6), dict(sizes=[1, 3, 10, 12], mode="linear",
                                    coordinate_transformation_mode="align_corners"),
                 ["MatMul", "MatMul"], id="align_corners-2N"),
    pytest.param((1, 3, 5, 6), dict(scales=[1, 1, 4, 4], mode="linear", coordinate_transformation_mode="half_pixel"),
                 ["Pad", "ConvTranspose"], id="half_pixel-x4"),
    pytest.param((1, 3, 5, 6), dict(scales=[1, 1, 3, 3], mode="linear", coordinate_transformation_mode="asymmetric"),
                 ["Pad", "ConvTranspose"], id="asymmetric-x3"),
    pytest.param((1, 3, 5, 6), dict(scales=[1, 1, 2, 2], mode="cubic", coordinate_transformation_mode="half_pixel"),
                 ["Pad", "ConvTranspose"], id="cubic-x2"),
    pytest.param((1, 3, 5, 6), dict(scales=[1, 1, 2, 2], mode="cubic", coordinate_transformation_mode="half_pixel",
                                    exclude_outside=1), ["MatMul", "MatMul"], id="cubic-exclude-outside"),
    pytest.param((1, 3, 5, 6), dict(sizes=[1, 3, 7, 9], mode="linear", coordinate_transformation_mode="half_pixel"),
                 ["MatMul", "MatMul"], id="non-integer"),
    pytest.param((1, 3, 8, 6), dict(scales=[1, 1, 0.5, 0.5], mode="linear",
                                    coordinate_transformation_mode="half_pixel"), ["MatMul", "MatMul"],
                 id="downsampling"),
    pytest.param((1, 3, 4, 5), dict(scales=[1, 1, 2, 2], mode="linear", coordinate_transformation_mode="half_pixel",
                                    opset=11), ["Pad", "ConvTranspose"], id="opset11"),
])
def test_exact_forms_are_exact(shape, kwargs, want_ops):
    model = single_resize(shape, **kwargs)
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact")
    assert ops(fixed) == want_ops
    assert result.metrics["exact"] is True and result.metrics["approximate_nodes"] == []
    assert_equivalent(model, fixed, atol=1e-6)


def test_forbidden_conv_transpose_uses_matmul_then_nearest():
    model = single_resize((1, 3, 5, 6), scales=[1, 1, 2, 2], mode="linear", coordinate_transformation_mode="half_pixel")
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact", forbidden_ops=("ConvTranspose",))
    assert ops(fixed) == ["MatMul", "MatMul"] and result.metrics["exact"] is True
    assert_equivalent(model, fixed, atol=1e-6)
    fixed, _ = apply_pass(model, ResizeNearestPass(), resize_mode="exact", forbidden_ops=("Pad",))
    assert ops(fixed) == ["MatMul", "MatMul"]  # half_pixel needs the edge pad
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact",
                               forbidden_ops=("ConvTranspose", "MatMul"))
    assert ops(fixed) == ["Resize"]
    assert_all_nearest(fixed)
    assert result.metrics["exact"] is False and result.metrics["approximate_nodes"] == ["rs"]
    assert result.warnings == ["rs: no exact form for linear Resize (ConvTranspose is forbidden; MatMul is "
                               "forbidden); converted to nearest (approximate)"]
    assert result.changes[0].detail["exact"] is False


def test_shared_scales_initializer_is_not_corrupted():
    inits: list = []
    a = resize_node("x", "a", inits, 17, name="a", scales=[1, 1, 2, 2], mode="linear",
                    coordinate_transformation_mode="half_pixel")
    b = helper.make_node("Resize", ["x", "", "a_scales"], ["b"], name="b", mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    graph = helper.make_graph([a, b], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])],
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for mode in ("nearest", "exact"):
        fixed, _ = apply_pass(model, ResizeNearestPass(), resize_mode=mode)
        np.testing.assert_array_equal(init_value(fixed, "a_scales"), [1, 1, 2, 2])
        assert fixed.graph.node[-1] == b
        ref, got = run(model, int_feeds(model)), run(fixed, int_feeds(model))
        for r, g in zip(ref, got):
            np.testing.assert_array_equal(r["b"], g["b"])


# --- end to end, idempotence, what must stay -----------------------------------------------------------


@pytest.mark.parametrize("coord", ["half_pixel", "align_corners"])
def test_unet_exact_mode_end_to_end(coord):
    model = unet_like(coord=coord)
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact")
    assert "Resize" not in ops(fixed)
    assert result.metrics["exact"] is True
    assert [c.node for c in result.changes] == ["up"]
    assert_equivalent(model, fixed)
    again, second = apply_pass(fixed, ResizeNearestPass(), resize_mode="exact")
    assert not second.changes and again.graph == fixed.graph


def mixed_model() -> onnx.ModelProto:
    """Resizes of every kind side by side: linear, cubic, nearest non-canonical, nearest by sizes, Upsample-free."""
    inits: list = []
    nodes = [
        resize_node("x", "a", inits, 17, name="a", scales=[1, 1, 2, 2], mode="linear",
                    coordinate_transformation_mode="asymmetric"),
        resize_node("x", "b", inits, 17, name="b", scales=[1, 1, 3, 3], mode="linear",
                    coordinate_transformation_mode="asymmetric"),
        resize_node("x", "c", inits, 17, name="c", sizes=[1, 2, 8, 10], mode="cubic"),
        resize_node("x", "d", inits, 17, name="d", sizes=[1, 2, 8, 10], mode="nearest"),
        resize_node("x", "e", inits, 17, name="e", scales=[1, 1, 1.5, 1.5], mode="nearest"),
        resize_node("x", "f", inits, 17, name="f", sizes=[1, 2, 7, 9], mode="linear",
                    coordinate_transformation_mode="align_corners"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 5])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abcdef"], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("mode", ["nearest", "exact"])
def test_idempotent_and_nothing_non_nearest_remains(mode):
    model = mixed_model()
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode=mode)
    assert_all_nearest(fixed)
    assert not any(r.blocking for r in result.rejections)
    assert [r.node for r in result.rejections] == ["e"]  # nearest x1.5: left alone, not blocking
    changed = sorted(c.node for c in result.changes)
    assert changed == ["a", "b", "c", "d", "f"]
    if mode == "nearest":
        assert sorted(result.metrics["approximate_nodes"]) == ["a", "b", "c", "f"]
        # asymmetric x3: nearest keeps its mode with round_prefer_floor (closer than the canonical floor)
        b = next(n for n in fixed.graph.node if n.name == "b")
        assert get_attr(b, "nearest_mode") == "round_prefer_floor"
    else:
        assert result.metrics["exact"] is True
        assert_equivalent(model, fixed)
    again, second = apply_pass(fixed, ResizeNearestPass(), resize_mode=mode)
    assert not second.changes and again.graph == fixed.graph


def test_resize_inside_a_subgraph_is_reported():
    inits: list = []
    body_node = resize_node("x", "y_then", inits, 17, name="inner", scales=[1, 1, 2, 2], mode="linear")
    then = helper.make_graph([body_node], "then", [], [helper.make_tensor_value_info("y_then", TensorProto.FLOAT,
                                                                                       None)], inits)
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["y_else"], name="id")], "else", [],
                              [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, None)])
    node = helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then, else_branch=other)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2]),
                                            helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _, result = apply_pass(model, ResizeNearestPass())
    (rej,) = result.rejections
    assert rej.node == "inner" and rej.blocking and "subgraph of 'branch'" in rej.reason
    _, result = apply_pass(model, ResizeNearestPass(), require_nearest_resize=False)
    assert not result.rejections[0].blocking


def test_unknown_resize_mode_is_an_error():
    model = single_resize((1, 1, 2, 2), scales=[1, 1, 2, 2], mode="linear")
    with pytest.raises(ValueError, match="resize_mode"):
        apply_pass(model, ResizeNearestPass(), resize_mode="bicubic")


def test_pass_declares_itself_approximate():
    assert ResizeNearestPass.name == "resize-nearest" and ResizeNearestPass.exact is False


# --- ConvTranspose stride limits and targets without ConvTranspose -------------------------------------


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "asymmetric"])
@pytest.mark.parametrize(("factor", "limit", "strides"), [
    (8, 4, [4, 2]), (8, 2, [2, 2, 2]), (16, 8, [8, 2]), (9, 8, [3, 3]), (6, 4, [3, 2]), (8, 8, [8]),
])
def test_conv_transpose_split_into_stages_below_the_stride_limit(mode, coord, factor, limit, strides):
    model = single_resize((1, 2, 5, 6), scales=[1, 1, factor, factor], mode=mode,
                          coordinate_transformation_mode=coord)
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact", max_convtranspose_stride=limit)
    convs = [n for n in fixed.graph.node if n.op_type == "ConvTranspose"]
    assert [get_attr(n, "strides") for n in convs] == [[s, s] for s in strides]
    assert ops(fixed) == ["Pad"] + ["ConvTranspose"] * len(strides)
    # Only the last stage crops; the staged form is the one-stage form refactored, so the same numbers.
    assert all(not any(get_attr(n, "pads")) for n in convs[:-1])
    assert result.metrics["exact"] is True
    assert_equivalent(model, fixed, atol=1e-6)
    one_stage, _ = apply_pass(model, ResizeNearestPass(), resize_mode="exact")
    assert_equivalent(one_stage, fixed, atol=1e-6)
    if mode == "linear":  # dyadic kernels for powers of two: small integers give bit-identical sums
        if factor & (factor - 1) == 0:
            for want, got in zip(run(model, int_feeds(model)), run(fixed, int_feeds(model))):
                np.testing.assert_array_equal(got["y"], want["y"])
    if len(strides) > 1:
        assert result.changes[0].new["stages"] == [{2: s, 3: s} for s in strides]
        assert "stages" in result.changes[0].detail["why"]
    again, second = apply_pass(fixed, ResizeNearestPass(), resize_mode="exact", max_convtranspose_stride=limit)
    assert not second.changes and again.graph.node == fixed.graph.node


def test_conv_transpose_stages_algebra():
    # W(z) = B(z) A(z^s2): the half_pixel x8 triangle splits into x2 then x4, and the rebuilt kernel is W.
    from onnx_npu_fix.passes.resize_nearest import conv_transpose_stages

    w = np.convolve(np.ones(8), np.ones(8))
    w = np.convolve(w, [1.0, 1.0]) / 16  # [1,3,5,...,15,15,...,1]/16
    stages = conv_transpose_stages(w, 8, 4)
    assert [s for _, s in stages] == [4, 2]
    (a, s1), (b, s2) = stages
    up = np.zeros((len(a) - 1) * s2 + 1)
    up[::s2] = a
    np.testing.assert_allclose(np.convolve(b, up), w, atol=1e-12)
    assert conv_transpose_stages(w, 8, 8) == [(pytest.approx(w), 8)]
    assert conv_transpose_stages(np.ones(7), 7, 4) is None  # a prime stride cannot be staged


def test_prime_stride_above_the_limit_falls_back_to_matmul():
    model = single_resize((1, 2, 5, 6), scales=[1, 1, 7, 7], mode="linear", coordinate_transformation_mode="half_pixel")
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact", max_convtranspose_stride=4)
    assert ops(fixed) == ["MatMul", "MatMul"] and result.metrics["exact"] is True
    assert_equivalent(model, fixed, atol=1e-6)


def test_target_without_conv_transpose_gets_the_matmul_form():
    model = single_resize((1, 2, 5, 6), scales=[1, 1, 2, 2], mode="linear", coordinate_transformation_mode="half_pixel")
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact", allow_convtranspose=False)
    assert ops(fixed) == ["MatMul", "MatMul"] and result.metrics["exact"] is True
    assert_equivalent(model, fixed, atol=1e-6)
    # 3 resized axes: no MatMul form either, so nearest with the reason in the warning.
    model = single_resize((1, 2, 3, 5, 6), scales=[1, 1, 2, 2, 2], mode="linear",
                          coordinate_transformation_mode="half_pixel")
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_mode="exact", allow_convtranspose=False)
    assert ops(fixed) == ["Resize"] and "allow_convtranspose = false" in result.warnings[0]


@pytest.mark.parametrize("target, rewritten", [("bm1684x", False), ("rk3588", False), ("stm32n6", True)])
def test_a_target_that_accepts_linear_resize_keeps_it(tmp_path, target, rewritten):
    """Do no harm: bm1684x and the Rockchip profiles set ``require_nearest_resize = false`` (their compilers run
    the bilinear Resize as it is), so ``--target`` there leaves it bilinear and the output equal to the input;
    stm32n6 asks for nearest and still gets the (approximate) rewrite."""
    from click.testing import CliRunner

    from onnx_npu_fix.cli import main

    model = unet_like()
    src, out = tmp_path / "unet.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    result = CliRunner().invoke(main, [str(src), "-o", str(out), "--target", target], catch_exceptions=False)
    assert result.exit_code in (0, 1), result.output
    fixed = onnx.load(out)
    (resize,) = [n for n in fixed.graph.node if n.op_type == "Resize"]
    assert (get_attr(resize, "mode") == "nearest") is rewritten, result.output
    if not rewritten:
        assert_equivalent(model, fixed)


# --- the separable exact form on quantized models -------------------------------------------------------------

def _quantized_up8(tmp_path) -> onnx.ModelProto:
    """Conv -> linear half_pixel x8 Resize (LR-ASPP's head), quantized by onnxruntime's quantize_static (QDQ)."""
    pytest.importorskip("onnxruntime.quantization")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "scales"], ["y"], name="up", mode="linear",
                              coordinate_transformation_mode="half_pixel")]
    inits = [numpy_helper.from_array(rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, 1, 8, 8], np.float32), "scales")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return quantize_with_onnxruntime(model, tmp_path)


def test_quantized_x8_bilinear_becomes_one_int8_conv_transpose_per_axis(tmp_path):
    """The 2-D kernel's products reach 225/256 (beyond int8 with a power-of-two scale), each axis's 1-D kernel
    {1, 3, ..., 15}/16 does not: two depthwise ConvTransposes with int8 weights, no linear Resize left."""
    quantized = _quantized_up8(tmp_path)
    fixed, result = apply_pass(quantized, ResizeNearestPass(), resize_mode="exact")
    assert "Resize" not in ops(fixed) and ops(fixed).count("ConvTranspose") == 2
    assert result.changes[0].new["stages"] == [{2: 8}, {3: 8}] and result.quantized_tolerance
    inits = {t.name: numpy_helper.to_array(t) for t in fixed.graph.initializer}
    producers = {o: n for n in fixed.graph.node for o in n.output}
    for conv in (n for n in fixed.graph.node if n.op_type == "ConvTranspose"):
        dq = producers[conv.input[1]]
        q, scale = inits[dq.input[0]], inits[dq.input[1]]
        assert dq.op_type == "DequantizeLinear" and q.dtype == np.int8 and float(scale) == 1 / 16
        assert sorted(set(np.abs(q).reshape(-1).tolist())) == list(range(1, 16, 2))  # {1, 3, ..., 15}
        assert sorted(q.shape[2:]) == [1, 16]  # one axis each
    # Canonical QDQ: the tensor between the stages is requantized on the input's grid (DQ -> ConvT -> Q units).
    from onnx_npu_fix.ir.qdq import walk_non_qdq

    assert walk_non_qdq(fixed) == walk_non_qdq(quantized) == []
    # Judged in the output's quantization steps (the pass declares quantized_tolerance): the stage's outputs
    # round to the grid (half a step at most) and ties round either way, so an output moves by one step at most.
    feeds = make_inputs(quantized, 3, 0)
    out_dq = quantized.graph.node[-1]
    step = float(numpy_helper.to_array(next(t for t in quantized.graph.initializer if t.name == out_dq.input[1])))
    for ref, got in zip(Runner(quantized).run_all(feeds), Runner(fixed).run_all(feeds)):
        steps = np.abs(ref["y"] - got["y"]) / step
        assert steps.max() <= 1 + 1e-4 and (steps > 0.5).mean() < 0.25
    # With ConvTranspose strides limited to 4 (bm1684x-like), the staged 2-D form's kernels are int8 already.
    staged, staged_result = apply_pass(quantized, ResizeNearestPass(), resize_mode="exact",
                                       max_convtranspose_stride=4)
    assert "Resize" not in ops(staged) and "separable" not in staged_result.changes[0].detail["why"]


# --- resize_separable: one ConvTranspose stage per axis, each with a 1-D kernel ------------------------------------


@pytest.mark.parametrize("factor, limit", [(2, None), (8, None), (8, 4)])
def test_the_separable_form_is_exact_and_has_only_1d_kernels(factor, limit):
    scales = numpy_helper.from_array(np.array([1, 1, factor, factor], np.float32), "scales")
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="linear",
                          coordinate_transformation_mode="half_pixel")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = dict(resize_mode="exact", max_convtranspose_stride=limit)
    joint, _ = apply_pass(model, ResizeNearestPass(), **options)
    fixed, result = apply_pass(model, ResizeNearestPass(), resize_separable=True, **options)
    weights = {t.name: list(t.dims) for t in fixed.graph.initializer}
    kernels = [weights[n.input[1]][2:] for n in fixed.graph.node if n.op_type == "ConvTranspose"]
    assert kernels and all(1 in kernel for kernel in kernels), kernels
    assert len(kernels) > ops(joint).count("ConvTranspose")
    assert "separable" in result.changes[0].detail["why"]
    assert_equivalent(model, fixed)
