"""--split: segments that each fit the SRAM budget (onnx_npu_fix/analysis/split.py, api.split_model, the CLI).

The oracles here are independent of the planner: a segment's peak is what ``estimate`` says for the sub-model
built by hand from the node list; the fewest cuts and the fewest crossing bytes come from enumerating every set
of cut positions; equivalence is checked by running the written segments with onnxruntime, passing tensors by
name as the manifest says, and requiring bit-identical outputs.
"""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from helpers import quantize_with_onnxruntime
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.analysis.memory import estimate
from onnx_npu_fix.analysis.split import plan_split, resolution_hint
from onnx_npu_fix.cli import main
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.ir.graph import GraphIndex, infer_shapes

F = TensorProto.FLOAT


def skip_unet(levels: int = 2, convs: int = 3, base: int = 4, size: int = 16, seed: int = 0) -> onnx.ModelProto:
    """A U-Net whose skip tensor is taken after the first conv of each encoder block, so it stays live across the
    block's other wide convs: the whole model's peak is above its largest layer, and a cut that sends the skip to
    external memory lowers it. Decoder: nearest x2 Resize, a 1x1 conv to a quarter of the skip's channels, Concat
    with the skip, a 3x3 conv. Small-integer weights and Relu: every value is exact in float32."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    count = itertools.count()

    def conv(x, c_in, c_out, k=3):
        i = next(count)
        w = f"w{i}"
        inits.append(numpy_helper.from_array(rng.integers(-1, 2, (c_out, c_in, k, k)).astype(np.float32), w))
        nodes.append(helper.make_node("Conv", [x, w], [f"c{i}"], name=f"conv{i}", pads=[k // 2] * 4))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        return f"r{i}"

    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales"))
    x, c = "image", 1
    skips = []
    for level in range(levels):
        width = base * 2 ** level
        x = conv(x, c, width)
        skips.append((x, width))
        for _ in range(convs - 1):
            x = conv(x, width, width)
        c = width
        nodes.append(helper.make_node("MaxPool", [x], [f"pool{level}"], name=f"pool{level}", kernel_shape=[2, 2],
                                      strides=[2, 2]))
        x = f"pool{level}"
    x = conv(x, c, c)
    for level in reversed(range(levels)):
        skip, width = skips[level]
        nodes.append(helper.make_node("Resize", [x, "", "up_scales"], [f"up{level}"], name=f"up{level}",
                                      mode="nearest"))
        small = max(1, width // 4)
        x = conv(f"up{level}", c, small, k=1)
        nodes.append(helper.make_node("Concat", [x, skip], [f"cat{level}"], name=f"cat{level}", axis=1))
        x = conv(f"cat{level}", small + width, width)
        c = width
    i = next(count)
    inits.append(numpy_helper.from_array(rng.integers(-1, 2, (1, c, 1, 1)).astype(np.float32), f"w{i}"))
    nodes.append(helper.make_node("Conv", [x, f"w{i}"], ["mask"], name="head"))
    graph = helper.make_graph(nodes, "skip_unet", [helper.make_tensor_value_info("image", F, [1, 1, size, size])],
                              [helper.make_tensor_value_info("mask", F, [1, 1, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _inferred(model):
    model = onnx.ModelProto.FromString(model.SerializeToString())
    infer_shapes(model)
    return model


def _peak_of_interval(model, order, i, j, act_bytes):
    """The estimate of the sub-model running order[i:j], built here from names alone."""
    graph = model.graph
    nodes = [graph.node[v] for v in order[i:j]]
    later = {name for v in order[j:] for name in graph.node[v].input}
    later |= {o.name for o in graph.output}
    made = {o for n in nodes for o in n.output}
    inits = {t.name: t for t in graph.initializer}
    vis = {vi.name: vi for vi in [*graph.input, *graph.value_info, *graph.output]}
    inputs = []
    for n in nodes:
        for name in n.input:
            if name and name not in made and name not in inits and name not in inputs:
                inputs.append(name)
    outputs = [o for n in nodes for o in n.output if o in later]
    used = {name for n in nodes for name in n.input}
    sub = helper.make_graph(nodes, "seg", [vis[n] for n in inputs], [vis[n] for n in outputs],
                            [inits[n] for n in sorted(used) if n in inits])
    sub_model = helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return estimate(sub_model, act_bytes, reorder=False).peak_bytes


def _crossing(model, order, cut, act_bytes):
    graph = model.graph
    before = {o for v in order[:cut] for o in graph.node[v].output}
    after = {name for v in order[cut:] for name in graph.node[v].input}
    est_shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in graph.value_info}
    return sum(int(np.prod(est_shapes[t])) * act_bytes for t in before & after if t in est_shapes)


def _run_chain(directory, feeds):
    with open(os.path.join(directory, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    values = dict(feeds)
    for seg in manifest["segments"]:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(os.path.join(directory, seg["path"]), opts,
                                       providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        assert names == seg["outputs"]
        result = session.run(names, {name: values[name] for name in seg["inputs"]})
        values.update(zip(names, result))
    return values, manifest


def _run(model_path, feeds):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


# --- planning -----------------------------------------------------------------------------------------


def test_skip_unet_peak_is_above_its_largest_layer():
    est = estimate(skip_unet())
    assert est.floor_bytes < est.best_peak  # only a cut can lower it: the reason this model exists
    assert est.best_optimal


@pytest.mark.parametrize(("act_bytes", "share", "levels"), [(1, 0.5, 1), (4, 0.5, 1), (1, 0.0, 1), (1, 0.9, 2),
                                                              (4, 0.3, 2)])
def test_plan_is_minimal_and_every_segment_fits(act_bytes, share, levels):
    model = _inferred(skip_unet(levels=levels, convs=3, base=4, size=8))
    est = estimate(model, act_bytes)
    budget = est.floor_bytes + int(share * (est.best_peak - est.floor_bytes))
    plan = plan_split(GraphIndex(model), budget, act_bytes)
    order, n = plan.order, len(plan.order)
    assert len(plan.segments) >= 2 and plan.fits
    bounds = [0, *plan.cuts, n]
    for k in range(len(plan.segments)):
        peak = _peak_of_interval(model, order, bounds[k], bounds[k + 1], act_bytes)
        assert peak == plan.segments[k].peak_bytes <= budget
    assert plan.crossing_bytes == [_crossing(model, order, c, act_bytes) for c in plan.cuts]
    # every set of cut positions of the same order: none with fewer segments fits, none as few crosses less
    fits = {}
    best = None
    for r in range(n):
        for cuts in itertools.combinations(range(1, n), r):
            b = [0, *cuts, n]
            ok = True
            for k in range(len(b) - 1):
                key = (b[k], b[k + 1])
                if key not in fits:
                    fits[key] = _peak_of_interval(model, order, *key, act_bytes) <= budget
                if not fits[key]:
                    ok = False
                    break
            if ok:
                cost = (len(b) - 1, sum(_crossing(model, order, c, act_bytes) for c in cuts))
                best = cost if best is None else min(best, cost)
        if best is not None:
            break
    assert (len(plan.segments), sum(plan.crossing_bytes)) == best


def test_below_the_floor_names_the_layer_and_a_resolution():
    model = _inferred(skip_unet())
    est = estimate(model)
    plan = plan_split(GraphIndex(model), est.floor_bytes - 1)
    assert not plan.fits and plan.segments == []
    assert plan.blocking[0] == (est.floor_node, est.floor_op, est.floor_bytes)
    hint = resolution_hint(model, est.floor_bytes - 1)
    assert hint.input == "image" and hint.split is not None and hint.split[2] < 16
    # the answer is the same estimate at those shapes: re-infer independently and check
    smaller = skip_unet(size=hint.split[2])
    assert estimate(smaller).floor_bytes == hint.split_floor <= est.floor_bytes - 1
    if hint.whole is not None:
        assert estimate(skip_unet(size=hint.whole[2])).best_peak == hint.whole_peak <= est.floor_bytes - 1


def test_split_at_forces_a_cut_and_unknown_names_are_refused():
    model = _inferred(skip_unet())
    plan = plan_split(GraphIndex(model), None, split_at=["pool0"])
    assert len(plan.segments) == 2 and "pool0" in plan.segments[0].outputs and "pool0" in plan.segments[1].inputs
    with pytest.raises(InputError, match="--split-at names 'nope'"):
        plan_split(GraphIndex(model), None, split_at=["nope"])


# --- the use case -------------------------------------------------------------------------------------


def test_split_model_writes_a_chain_that_reproduces_the_model(tmp_path):
    model = _inferred(skip_unet())
    est = estimate(model)
    budget = est.floor_bytes + (est.best_peak - est.floor_bytes) // 3
    outcome = api.split_model(model, tmp_path / "seg", FixOptions(sram_bytes=budget))
    assert outcome.fits and outcome.validation.passed and outcome.validation.max_abs == 0
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    feeds = {"image": np.random.default_rng(3).standard_normal((1, 1, 16, 16)).astype(np.float32)}
    values, manifest = _run_chain(tmp_path / "seg", feeds)
    assert np.array_equal(values["mask"], _run(str(path), feeds)["mask"])
    assert set(manifest) == {"segments", "crossing_bytes"}
    assert len(manifest["crossing_bytes"]) == len(manifest["segments"]) - 1
    assert sorted(os.listdir(tmp_path / "seg")) == sorted(["manifest.json", *(s["path"] for s in manifest["segments"])])


def test_cli_split_each_segment_passes_check(tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save(skip_unet(), src)
    est = estimate(skip_unet(), 4)
    budget = est.floor_bytes + (est.best_peak - est.floor_bytes) // 2
    out, seg = tmp_path / "out.onnx", tmp_path / "seg"
    runner = CliRunner()
    result = runner.invoke(main, [str(src), "-o", str(out), "--act-bytes", "4", "--sram", str(budget), "--align", "0",
                                  "--split", str(seg), "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert "chained segments bit-exact" in result.output and "unfixed" not in result.output
    manifest = json.loads((seg / "manifest.json").read_text())
    assert len(manifest["segments"]) >= 2
    for s in manifest["segments"]:
        check = runner.invoke(main, [str(seg / s["path"]), "--check", "--act-bytes", "4", "--sram", str(budget),
                                     "--align", "0", "--format", "json"])
        assert check.exit_code == 0, check.output
        assert json.loads(check.output)["models"][0]["memory"]["peak"]["bytes"] == s["peak_bytes"] <= budget
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["split"]["manifest"] == manifest and record["split"]["validation"]["passed"]
    feeds = {"image": np.random.default_rng(5).standard_normal((1, 1, 16, 16)).astype(np.float32)}
    assert np.array_equal(_run_chain(seg, feeds)[0]["mask"], _run(str(out), feeds)["mask"])


def test_cli_split_refuses_a_nonempty_dir_and_writes_nothing(tmp_path):
    src = tmp_path / "in.onnx"
    onnx.save(skip_unet(), src)
    seg = tmp_path / "seg"
    seg.mkdir()
    (seg / "keep.txt").write_text("mine")
    result = CliRunner().invoke(main, [str(src), "-o", str(tmp_path / "out.onnx"), "--sram", "1MiB",
                                       "--split", str(seg)])
    assert result.exit_code == 2 and "not an empty directory" in result.output
    assert not (tmp_path / "out.onnx").exists() and os.listdir(seg) == ["keep.txt"]
    usage = CliRunner().invoke(main, [str(src), "-o", str(tmp_path / "out.onnx"), "--split-at", "pool0"])
    assert usage.exit_code == 2 and "--split-at needs --split" in usage.output
    unknown = CliRunner().invoke(main, [str(src), "-o", str(tmp_path / "out.onnx"), "--split", str(tmp_path / "new"),
                                        "--split-at", "nope"])
    assert unknown.exit_code == 2 and "--split-at names 'nope'" in unknown.output and "Traceback" not in unknown.output
    assert not (tmp_path / "out.onnx").exists() and not (tmp_path / "new").exists()


@pytest.mark.parametrize(("name", "act_bytes"), [("unet.onnx", 1), ("unet.onnx", 4), ("torch_unet.onnx", 1),
                                                 ("torch_unet.onnx", 4)])
def test_fixtures_fit_above_the_floor_and_name_the_layer_below(tmp_path, fixture_path, name, act_bytes):
    src = fixture_path(name)
    fixed = api.fix(api.load_model(src), FixOptions(validate="none")).model
    est = estimate(fixed, act_bytes)
    runner = CliRunner()
    above = runner.invoke(main, [src, "-o", str(tmp_path / "a.onnx"), "--act-bytes", str(act_bytes),
                                 "--sram", str(est.floor_bytes), "--split", str(tmp_path / "a")])
    assert above.exit_code == 0, above.output
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert all(s["peak_bytes"] <= est.floor_bytes for s in manifest["segments"])
    assert "chained segments bit-exact" in above.output
    below = runner.invoke(main, [src, "-o", str(tmp_path / "b.onnx"), "--act-bytes", str(act_bytes),
                                 "--sram", str(est.floor_bytes - 1), "--split", str(tmp_path / "b")])
    assert below.exit_code != 0
    assert f"{est.floor_node} ({est.floor_op}): sram-layer" in below.output
    assert "fits the whole model" in below.output or "fits with --split" in below.output
    assert not (tmp_path / "b").exists()


# --- the picture --------------------------------------------------------------------------------------


def test_memory_plot_file_and_its_data_match_the_estimate(tmp_path):
    pytest.importorskip("matplotlib")
    src = tmp_path / "in.onnx"
    onnx.save(skip_unet(), src)
    est = estimate(skip_unet())
    budget = est.floor_bytes + (est.best_peak - est.floor_bytes) // 2
    out, seg, png = tmp_path / "out.onnx", tmp_path / "seg", tmp_path / "mem.png"
    result = CliRunner().invoke(main, [str(src), "-o", str(out), "--align", "0", "--sram", str(budget),
                                       "--split", str(seg), "--memory-plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    data = json.loads((tmp_path / "mem.png.json").read_text())
    fixed = onnx.load(out)
    stored, best, *segments = data["series"]
    assert stored["profile"] == estimate(fixed).profile
    assert max(best["profile"]) == best["peak_bytes"] == estimate(fixed).best_peak
    manifest = json.loads((seg / "manifest.json").read_text())
    assert len(segments) == len(manifest["segments"])
    for s, m in zip(segments, manifest["segments"]):
        assert s["profile"] == estimate(onnx.load(seg / m["path"])).profile
        assert max(s["profile"]) == m["peak_bytes"] <= budget == data["sram_bytes"]
    # the tensors live at the peak include the long skip
    assert max(t["end"] - t["start"] for t in data["peak"]["live"]) > 10


def test_memory_plot_svg_in_check_mode_and_bad_names(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    src = tmp_path / "in.onnx"
    onnx.save(skip_unet(), src)
    svg = tmp_path / "mem.svg"
    result = CliRunner().invoke(main, [str(src), "--check", "--memory-plot", str(svg)])
    assert result.exit_code in (0, 1), result.output
    assert svg.read_text().lstrip().startswith("<?xml")
    assert json.loads((tmp_path / "mem.svg.json").read_text())["series"][0]["profile"] == estimate(skip_unet()).profile
    bad = CliRunner().invoke(main, [str(src), "--check", "--memory-plot", str(tmp_path / "mem.pdf")])
    assert bad.exit_code == 2 and "choose a .png or .svg" in bad.output
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # as if the extra were not installed
    missing = CliRunner().invoke(main, [str(src), "-o", str(tmp_path / "o.onnx"), "--memory-plot", str(svg)])
    # npufix is not on PyPI: the hint names matplotlib itself and the extra of a source checkout
    assert missing.exit_code == 2 and "pip install matplotlib" in missing.output and "'.[plot]'" in missing.output
    assert "onnx-npu-fix[" not in missing.output
    assert not (tmp_path / "o.onnx").exists()


def test_the_field_reports_512_to_384():
    """The report lowered a 512x512 U-Net to 384x384 to fit. With a budget that 384 meets and 416 does not, the
    hint finds exactly 384, for the whole model and for the largest layer; both figures are re-estimated here on
    models built at those sizes (shape inference only, no onnxruntime)."""
    at = {size: estimate(skip_unet(size=size)) for size in (384, 416, 512)}
    whole_budget = at[384].best_peak
    assert at[416].best_peak > whole_budget
    hint = resolution_hint(_inferred(skip_unet(size=512)), whole_budget)
    assert hint.step == 32 and hint.whole == [1, 1, 384, 384] and hint.whole_peak == whole_budget
    layer_budget = at[384].floor_bytes
    assert at[416].floor_bytes > layer_budget
    hint = resolution_hint(_inferred(skip_unet(size=512)), layer_budget)
    assert hint.split == [1, 1, 384, 384] and hint.split_floor == layer_budget
    assert hint.tiles == -(-at[512].floor_bytes // layer_budget)


def test_split_of_a_model_quantized_by_onnxruntime(tmp_path):
    """QDQ from onnxruntime's own quantizer: weight DequantizeLinear nodes are constant-only, so they are
    recomputed in each segment that reads them and only (quantized) activations cross the cuts."""

    quantize_with_onnxruntime(skip_unet(), tmp_path, sets=4, activation="QInt8")
    quantized = tmp_path / "qdq.onnx"
    fixed = api.fix(api.load_model(quantized), FixOptions(align=0)).model
    est = estimate(fixed)
    assert est.floor_bytes < est.best_peak
    budget = est.floor_bytes + (est.best_peak - est.floor_bytes) // 2
    outcome = api.split_model(fixed, tmp_path / "seg", FixOptions(sram_bytes=budget))
    assert len(outcome.plan.segments) >= 2 and outcome.validation.passed and outcome.validation.max_abs == 0
    dq_weights = {n.output[0] for n in fixed.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in
                  {t.name for t in fixed.graph.initializer}}
    for s in outcome.manifest["segments"]:
        assert not set(s["inputs"]) & dq_weights  # recomputed, never passed between segments
        check = CliRunner().invoke(main, [str(tmp_path / "seg" / s["path"]), "--check", "--sram", str(budget),
                                          "--align", "0", "--format", "json"])
        data = json.loads(check.output)["models"][0]
        assert not [v for v in data["violations"] if v["constraint"].startswith("sram")]
        assert data["memory"]["peak"]["bytes"] == s["peak_bytes"] <= budget
    feeds = {"image": np.random.default_rng(9).standard_normal((1, 1, 16, 16)).astype(np.float32)}
    onnx.save(fixed, tmp_path / "fixed.onnx")
    chained = _run_chain(tmp_path / "seg", feeds)[0]["mask"]
    assert np.array_equal(chained, _run(str(tmp_path / "fixed.onnx"), feeds)["mask"])


# --- random graphs ------------------------------------------------------------------------------------


def _random_spec(draw_int, n):
    spec = []
    for i in range(n):
        k = min(draw_int(1, 2), i + 1)
        first = draw_int(0, i)
        inputs = (first,) if k == 1 else tuple(sorted({first, draw_int(0, i)}))
        spec.append((inputs, draw_int(1, 6)))
    return spec


def test_property_random_dags_split_fit_and_chain_exactly():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_memory import _dag_model

    from onnx_npu_fix.analysis.split import build_segments
    from onnx_npu_fix.pipeline.validation.chain import validate_chain

    @settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def check(data):
        n = data.draw(st.integers(3, 10))
        spec = _random_spec(lambda lo, hi: data.draw(st.integers(lo, hi)), n)
        model = _inferred(_dag_model(spec))
        est = estimate(model)
        budget = data.draw(st.integers(est.floor_bytes, max(est.floor_bytes, est.best_peak)))
        plan = plan_split(GraphIndex(model), budget)
        assert plan.fits
        segments = build_segments(model, plan)
        for segment, planned in zip(segments, plan.segments):
            onnx.checker.check_model(segment)
            assert estimate(segment, reorder=False).peak_bytes == planned.peak_bytes <= budget
        assert validate_chain(model, segments, n=1, seed=0).passed
        assert len(plan.segments) == 1 or est.best_peak > budget  # no cut unless the whole does not fit

    check()


def test_split_of_models_onnxruntime_cannot_run_says_not_validated(tmp_path):
    """An original onnxruntime cannot run stops the run (exit 2, nothing written, no segments); with an explicit
    --validate none the split is written and said to be unvalidated."""
    from hostile.build_hostile import build

    corpus = build(tmp_path / "corpus")
    for case in ("custom_domain", "opset_3"):
        seg = tmp_path / f"seg_{case}"
        args = [str(corpus[case]), "-o", str(tmp_path / f"{case}.onnx"), "--sram", "1MiB", "--split", str(seg)]
        refused = CliRunner().invoke(main, args)
        assert refused.exit_code == 2 and "onnxruntime cannot run the original" in refused.output, refused.output
        assert not seg.exists() and not (tmp_path / f"{case}.onnx").exists()
        result = CliRunner().invoke(main, [*args, "--validate", "none"])
        assert "internal error" not in result.output, result.output
        assert "not validated" in result.output and result.exit_code == 0, result.output
        manifest = json.loads((seg / "manifest.json").read_text())
        assert len(manifest["segments"]) == 1


def test_split_through_if_and_loop_bodies(tmp_path):
    """Subgraph bodies read outer tensors implicitly: a cut must make those segment inputs too."""
    from hostile.build_hostile import build

    corpus = build(tmp_path / "corpus")
    for case, cut in (("if_subgraph", "t"), ("loop_subgraph", None)):
        model = api.fix(api.load_model(corpus[case]), FixOptions(validate="none")).model
        at = [cut] if cut else [model.graph.node[0].output[0]]
        outcome = api.split_model(model, tmp_path / f"seg_{case}", FixOptions(split_at=tuple(at)))
        assert len(outcome.plan.segments) == 2 and outcome.validation.passed, outcome.validation


def test_segments_pass_check_with_a_targets_options(tmp_path):
    """With the stm32n6 profile (8-aligned channels, nearest Resize, static shapes, batch 1...), every segment of
    the split passes ``--check --sram`` with the same profile: the cuts never expose what the fix removed."""
    src = tmp_path / "in.onnx"
    onnx.save(skip_unet(levels=2, base=32, size=16), src)
    fixed = api.fix(api.load_model(src), FixOptions(validate="none")).model
    est = estimate(fixed)
    assert est.floor_bytes < est.best_peak
    budget = str(est.floor_bytes)
    seg = tmp_path / "seg"
    result = CliRunner().invoke(main, [str(src), "-o", str(tmp_path / "out.onnx"), "--target", "stm32n6",
                                       "--sram", budget, "--split", str(seg)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((seg / "manifest.json").read_text())
    assert len(manifest["segments"]) >= 2
    for s in manifest["segments"]:
        check = CliRunner().invoke(main, [str(seg / s["path"]), "--check", "--target", "stm32n6", "--sram", budget])
        assert check.exit_code == 0, check.output


def test_a_split_whose_chain_fails_writes_nothing_and_exits_3(tmp_path, monkeypatch):
    """PassFailed from the split is the run's outcome (exit 3, one line), not an internal error."""
    from onnx_npu_fix.errors import PassFailed

    def fail(*args, **kwargs):
        raise PassFailed("the chained segments do not reproduce the model: output 'mask' differs by 1",
                         pass_name="split")

    src = tmp_path / "in.onnx"
    onnx.save(skip_unet(), src)
    monkeypatch.setattr(api, "split_model", fail)
    result = CliRunner().invoke(main, [str(src), "-o", str(tmp_path / "out.onnx"), "--sram", "1MiB",
                                       "--split", str(tmp_path / "seg"), "-q"])
    assert result.exit_code == 3, result.output
    assert "split failed: the chained segments do not reproduce the model" in result.output
    assert sorted(os.listdir(tmp_path)) == ["in.onnx"]


def test_memory_plot_is_reproducible_and_its_labels_stay_inside(tmp_path):
    """The SVG is the same bytes on every run (no embedded date, fixed element ids); the legend does not cover
    the peak label, and every label — a 200-character tensor name at the right end too — is inside the figure."""
    pytest.importorskip("matplotlib")
    from onnx_npu_fix.analysis.plot import draw, figure, profile_data
    from onnx_npu_fix.io.load import prepare

    model = skip_unet()
    long = {o: f"{o}_{'x' * 200}" for n in model.graph.node for o in n.output}  # as torch exports name them
    for node in model.graph.node:
        node.input[:] = [long.get(i, i) for i in node.input]
        node.output[:] = [long[o] for o in node.output]
    for out in model.graph.output:
        out.name = long.get(out.name, out.name)
    del model.graph.value_info[:]
    prepare(model)
    est = estimate(model)
    budget = est.floor_bytes + (est.best_peak - est.floor_bytes) // 2
    split = api.split_model(model, tmp_path / "seg", FixOptions(sram_bytes=budget, align=0))
    assert len(split.segments) >= 2  # the legend holds the segments too
    data = profile_data(model, 1, budget, segments=split.segments, cuts=split.plan.cuts)
    assert max(len(t["name"]) for t in data["peak"]["live"]) > 200
    a, b = tmp_path / "a.svg", tmp_path / "b.svg"
    draw(data, str(a))
    draw(data, str(b))
    assert a.read_bytes() == b.read_bytes() and b"<dc:date>" not in a.read_bytes()
    fig = figure(data)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        top = fig.axes[0]
        (label,) = [t for t in top.texts if t.get_text().startswith("peak ")]
        assert not top.get_legend().get_window_extent(renderer).overlaps(label.get_window_extent(renderer))
        texts = [t for ax in fig.axes for t in ax.texts] + [top.get_legend()]
        for t in texts:
            e = t.get_window_extent(renderer)
            assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, t
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_memory_plot_draws_a_split_on_the_curves_step_axis(tmp_path):
    """A quantized model's segments recompute their weight DequantizeLinears (more nodes than the steps they
    cover): each segment's fill is still drawn on the best order's steps it covers, contiguous, with its peak at
    the step of the node the segment's own estimate names (it was drawn 9 steps late before)."""
    pytest.importorskip("matplotlib")

    from onnx_npu_fix.analysis.plot import figure
    from onnx_npu_fix.analysis.schedule import best_schedule, liveness

    quantize_with_onnxruntime(skip_unet(), tmp_path, sets=2, activation="QInt8")
    quantized = tmp_path / "qdq.onnx"
    fixed = api.fix(api.load_model(quantized), FixOptions(align=0)).model
    est = estimate(fixed)
    budget = est.floor_bytes + (est.best_peak - est.floor_bytes) // 2
    out, seg, png = tmp_path / "out.onnx", tmp_path / "seg", tmp_path / "mem.png"
    result = CliRunner().invoke(main, [str(quantized), "-o", str(out), "--align", "0", "--sram", str(budget),
                                       "--split", str(seg), "--memory-plot", str(png), "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "mem.png.json").read_text())
    _, best, *segments = data["series"]
    manifest = json.loads((seg / "manifest.json").read_text())
    assert len(segments) == len(manifest["segments"]) >= 2
    index = GraphIndex(onnx.load(out))
    lv = liveness(index, 1)
    step_of = {lv.nodes[v].name: step for step, v in enumerate(best_schedule(lv).order)}
    # the fills tile the curve's steps, in order, without gaps or overlaps
    assert [s["start"] for s in segments] == [0, *[s["start"] + len(s["profile"]) for s in segments][:-1]]
    assert segments[-1]["start"] + len(segments[-1]["profile"]) == len(best["profile"]) == data["steps"]
    stretched = False
    for s, m in zip(segments, manifest["segments"]):
        own = estimate(onnx.load(seg / m["path"]), reorder=False)
        stretched |= len(own.profile) != len(s["profile"])
        assert max(s["profile"]) == s["peak_bytes"] == own.peak_bytes == m["peak_bytes"] <= budget
        assert s["peak_step"] == step_of[own.peak_node]
        assert s["profile"][s["peak_step"] - s["start"]] == own.peak_bytes
    assert stretched  # the case the old placement got wrong: a segment with more nodes than its steps
    fig = figure(data)
    try:
        fills = fig.axes[0].collections
        assert len(fills) == len(segments)
        for fill, s in zip(fills, segments):
            xs = fill.get_paths()[0].vertices[:, 0]
            assert (xs.min(), xs.max()) == (s["start"] - 0.5, s["start"] + len(s["profile"]) - 0.5)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


@pytest.mark.parametrize(("requested", "carrier"), [
    ("enc1.conv_2_out", "enc1.bn_7_out_aligned"),   # the Conv's own output: its BatchNormalization folded into it
    ("enc1.bn_7_out", "enc1.bn_7_out_aligned"),     # align-channels renamed the padded output
    ("enc1.relu_8_out", "enc1.relu_8_out_aligned"),
    ("enc1.identity_9_out", "enc1.relu_8_out_aligned"),  # cleanup removed the Identity
    ("dec2.relu_39_out", "dec2.relu_39_out"),       # kept as it was
])
def test_split_at_names_of_the_model_read_cut_where_the_passes_moved_them(tmp_path, fixture_path, requested,
                                                                          carrier):
    seg = tmp_path / "seg"
    result = CliRunner().invoke(main, [fixture_path("unet.onnx"), "-o", str(tmp_path / "out.onnx"), "--align", "8",
                                       "--split", str(seg), "--split-at", requested,
                                       "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert ("split-at" in result.output) == (carrier != requested)
    assert json.loads((tmp_path / "r.json").read_text())["split"]["split_at"] == {requested: carrier}
    manifest = json.loads((seg / "manifest.json").read_text())
    assert carrier in manifest["segments"][0]["outputs"] and "chained segments bit-exact" in result.output
