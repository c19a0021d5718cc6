"""Equivalence fuzzing: random small Conv/BN/activation/Add/Concat/MaxPool/Resize graphs through every pass.

For each generated model and random options, the full default pass list must
  - finish without a failed pass (every exact pass validated at the exact tolerance by the pass manager),
  - hold, checked here again independently on other seeds with the run replayed pass by pass (:func:`fix_problems`),
    every pass's declared bound on its own: an exact change equivalent at the exact tolerance; an approximate one
    within its pass's ``bound`` (passes/base.Bound) at each node it approximates, and exact everywhere else; the
    run's output equal to the replay's, and to the original when nothing was approximated,
  - leave no violation of a constraint that some pass claims to fix (dilation, channel alignment, BatchNorm,
    non-nearest Resize), unless that pass reported a blocking rejection explaining why.

CI runs 400 derandomized examples; NPUFIX_FUZZ_EXAMPLES sets another count, with fresh seeds (`make fuzz`: thousands).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import onnx
import pytest
from helpers import run_model
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import GraphIndex, copy_model, set_attr
from onnx_npu_fix.passes.base import Pass
from onnx_npu_fix.passes.resize_nearest import ResizeNearestPass
from onnx_npu_fix.pipeline.inputs import make_inputs
from onnx_npu_fix.pipeline.report import PassRecord, PassStatus
from onnx_npu_fix.pipeline.scheduler import FixResult, prepare, run_passes
from onnx_npu_fix.pipeline.validation.comparison import compare

EXAMPLES = int(os.environ.get("NPUFIX_FUZZ_EXAMPLES", "400"))

constraints = pytest.importorskip("onnx_npu_fix.constraints")


class ModelDraw:
    """Builds a random model from hypothesis draws; tensors carry (name, channels, spatial shape)."""

    def __init__(self, draw, spatial_rank: int) -> None:
        self.draw = draw
        self.rank = spatial_rank
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        self.n = 0

    def fresh(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def const(self, value: np.ndarray) -> str:
        name = self.fresh("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def conv(self, x, c, spatial):
        draw = self.draw
        k = [draw(st.integers(1, 5)) for _ in range(self.rank)]
        d = [draw(st.sampled_from([1, 1, 2, 3, 4, 5, 8, 9, 16, 32])) for _ in range(self.rank)]
        if self.rank == 2 and spatial[0] == 1:  # a 1-D conv exported as 2-D: [B,C,1,L], kernel [1,K]
            k[0], d[0] = 1, 1
        group_kind = draw(st.sampled_from(["dense", "depthwise", "grouped"]))
        if group_kind == "depthwise":
            group = c
            c_out = c * draw(st.sampled_from([1, 1, 2]))
        elif group_kind == "grouped" and c % 2 == 0 and c >= 4:
            group = draw(st.sampled_from([g for g in (2, 4) if c % g == 0]))
            c_out = group * draw(st.integers(1, 10))
        else:
            group = 1
            c_out = draw(st.integers(1, 80))
        auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "VALID", "SAME"]))
        if auto_pad == "SAME" and any(v > 1 for v in d):
            auto_pad = "NOTSET"  # onnxruntime refuses SAME with dilation: the original could not be checked
        attrs = {"kernel_shape": k, "dilations": d, "group": group}
        out_spatial = []
        if auto_pad == "NOTSET":
            begins, ends = [], []
            for kk, dd in zip(k, d):
                span = (kk - 1) * dd
                if draw(st.booleans()):
                    b = span // 2  # "same" length, sometimes asymmetric
                    e = span - b
                else:
                    b, e = draw(st.integers(0, span)), draw(st.integers(0, span))
                begins.append(b)
                ends.append(e)
            attrs["pads"] = begins + ends
            for length, kk, dd, b, e in zip(spatial, k, d, begins, ends):
                out_spatial.append(length + b + e - (kk - 1) * dd)
        elif auto_pad == "VALID":
            attrs["auto_pad"] = "VALID"
            out_spatial = [length - (kk - 1) * dd for length, kk, dd in zip(spatial, k, d)]
        else:
            attrs["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER"]))
            out_spatial = list(spatial)
        if any(v < 1 for v in out_spatial):
            return None
        w = self.const((self.rng.standard_normal((c_out, c // group, *k)) / np.sqrt(c // group * np.prod(k)))
                       .astype(np.float32))
        inputs = [x, w]
        if draw(st.booleans()):
            inputs.append(self.const((0.1 * self.rng.standard_normal(c_out)).astype(np.float32)))
        y = self.fresh("conv")
        self.nodes.append(helper.make_node("Conv", inputs, [y], name=y, **attrs))
        return y, c_out, tuple(out_spatial)

    def batchnorm(self, x, c, spatial):
        params = [(1 + 0.2 * self.rng.standard_normal(c)), 0.2 * self.rng.standard_normal(c),
                  0.3 * self.rng.standard_normal(c), 0.5 + self.rng.random(c)]
        names = [self.const(p.astype(np.float32)) for p in params]
        y = self.fresh("bn")
        self.nodes.append(helper.make_node("BatchNormalization", [x, *names], [y], name=y, epsilon=1e-5))
        return y, c, spatial

    def activation(self, x, c, spatial):
        op = self.draw(st.sampled_from(["Relu", "PRelu", "Sigmoid"]))
        y = self.fresh(op.lower())
        inputs = [x]
        if op == "PRelu":
            inputs.append(self.const((0.25 + 0.05 * self.rng.standard_normal((c,) + (1,) * self.rank))
                                     .astype(np.float32)))
        self.nodes.append(helper.make_node(op, inputs, [y], name=y))
        return y, c, spatial

    def maxpool(self, x, c, spatial):
        y = self.fresh("pool")
        self.nodes.append(helper.make_node("MaxPool", [x], [y], name=y, kernel_shape=[2] * self.rank,
                                           strides=[1] * self.rank, pads=[0] * self.rank + [1] * self.rank))
        return y, c, spatial

    def resize(self, x, c, spatial):
        if self.rank != 2 or max(spatial) > 24:
            return None
        mode = self.draw(st.sampled_from(["nearest", "linear"]))
        coord = self.draw(st.sampled_from(["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]))
        y = self.fresh("resize")
        roi = self.const(np.array([], np.float32))
        scales = self.const(np.array([1, 1, 2, 2], np.float32))
        self.nodes.append(helper.make_node("Resize", [x, roi, scales], [y], name=y, mode=mode,
                                           coordinate_transformation_mode=coord))
        return y, c, tuple(2 * s for s in spatial)

    def add(self, a, b):
        y = self.fresh("add")
        self.nodes.append(helper.make_node("Add", [a[0], b[0]], [y], name=y))
        return y, a[1], a[2]

    def concat(self, a, b):
        y = self.fresh("cat")
        self.nodes.append(helper.make_node("Concat", [a[0], b[0]], [y], name=y, axis=1))
        return y, a[1] + b[1], a[2]


@st.composite
def random_model(draw):
    rank = draw(st.sampled_from([1, 1, 2]))
    batch = draw(st.sampled_from([1, 1, 1, 2]))
    channels = draw(st.integers(1, 24))
    spatial = tuple(draw(st.integers(6, 40 if rank == 1 else 14)) for _ in range(rank))
    if rank == 2 and draw(st.booleans()):
        spatial = (1, draw(st.integers(6, 40)))  # audio models exported as [B,C,1,L]
    m = ModelDraw(draw, rank)
    tensors = [("x", channels, spatial)]
    for _ in range(draw(st.integers(2, 9))):
        kind = draw(st.sampled_from(["conv", "conv", "conv", "bn", "act", "pool", "resize", "join"]))
        src = draw(st.sampled_from(tensors[-3:]))
        if kind == "join":
            same = [t for t in tensors if t[2] == src[2] and t[0] != src[0]]
            if not same:
                continue
            other = draw(st.sampled_from(same))
            new = m.add(src, other) if other[1] == src[1] and draw(st.booleans()) else m.concat(src, other)
        else:
            new = {"conv": m.conv, "bn": m.batchnorm, "act": m.activation, "pool": m.maxpool,
                   "resize": m.resize}[kind](*src)
        if new is not None:
            tensors.append(new)
    if len(tensors) == 1:
        tensors.append(m.activation(*tensors[0]))
    outputs = [tensors[-1]]
    if len(tensors) > 3 and draw(st.booleans()):
        outputs.append(tensors[len(tensors) // 2])  # an intermediate tensor as a second graph output
    graph = helper.make_graph(
        m.nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, *spatial])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, c, *sp]) for name, c, sp in outputs],
        m.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


FUZZ_ONLY_NODE_BOUNDS = sys.float_info.max
"""max_approx_error of the fuzz's runs: the pass manager's bound at the graph outputs is a user's tolerance, and the
layers after a Resize may amplify what bilinear->nearest moves on white noise; the pass's own bound is checked
instead, at each node it approximates (:func:`fix_problems`)."""


@st.composite
def random_options(draw):
    return FixOptions(
        max_dilation=draw(st.sampled_from([None, 1, 2, 4, 7])),
        s2b_layout=draw(st.sampled_from(["auto", "spatial", "channel", "batch"])),
        align=draw(st.sampled_from([0, 8, 16])),
        bn_standalone=draw(st.sampled_from(["mul-add", "conv"])),
        resize_mode=draw(st.sampled_from(["nearest", "exact"])),
        max_approx_error=FUZZ_ONLY_NODE_BOUNDS,
    )


SEEDS = (11, 12)


def fix_problems(model: onnx.ModelProto, options: FixOptions,
                 passes: Sequence[Pass] | None = None) -> tuple[FixResult, list[str]]:
    """The run of ``passes`` (the default list) on ``model``, and everything wrong with it: a failed pass or final
    comparison; else the run replayed pass by pass (each pass alone, unvalidated, on the model the one before
    left), each change checked on its own on seeded inputs (:func:`step_problems`), and the run's output against
    the replay's and, when nothing was approximated, against the original."""
    passes = list(passes) if passes is not None else api.select_passes()
    result = api.fix(model, options, passes)
    failed = result.report.failed_pass
    if failed is not None:
        return result, [f"pass {failed.name} failed: {failed.error}"]
    if not result.ok:
        return result, [f"the output fails its final comparison: {result.report.final.to_json()}"]
    current = copy_model(model)
    prepare(current, options)
    feeds = [f for seed in SEEDS for f in make_inputs(current, 1, seed)]
    original = outputs = run_model(current, feeds)
    by_name, alone = {p.name: p for p in passes}, replace(options, validate="none")
    problems: list[str] = []
    approximated = False
    for record in result.report.passes:
        if not record.changes or record.status not in (PassStatus.VALIDATED, PassStatus.NOT_VALIDATED):
            continue
        step = run_passes(copy_model(current), alone, [by_name[record.name]])
        replayed = step.report.passes[-1]
        if step.report.failed_pass is not None or not replayed.changes:
            problems.append(f"pass {record.name} replayed alone: {replayed.status}, {replayed.error}")
            break
        approximated |= not replayed.exact
        after = run_model(step.model, feeds)
        problems += step_problems(by_name[record.name], replayed, current, step.model, feeds, (outputs, after),
                                  options)
        current, outputs = step.model, after
    fixed = run_model(result.model, feeds)
    problems += exact_problems("the run's output against the replay's", outputs, fixed, options)
    if not approximated:
        problems += exact_problems("the run's output against the original", original, fixed, options)
    return result, problems


def exact_problems(what: str, reference, candidate, options: FixOptions) -> list[str]:
    cmp = compare(reference, candidate, exact=True, rtol=options.rtol, atol=options.atol, max_approx_error=0.0)
    return [] if cmp.passed else [f"{what}: {cmp.to_json()}"]


def step_problems(pass_: Pass, record: PassRecord, before: onnx.ModelProto, after: onnx.ModelProto, feeds,
                  outputs, options: FixOptions) -> list[str]:
    """What is wrong with one pass's change ``before`` -> ``after`` (``outputs``: both models' graph outputs on
    ``feeds``). Exact: equivalent at the exact tolerance. Approximate: each node it approximates moves its output
    by at most ``pass_.bound``'s limit on that node's input, and the model after it, fed the nodes' outputs as
    they were before, is equivalent to the model before at the exact tolerance in its outputs and in the nodes'
    inputs (nothing else moved)."""
    if record.exact:
        return exact_problems(f"exact pass {pass_.name}", *outputs, options)
    names = record.approximate_nodes()
    if pass_.bound is None:
        return [f"pass {pass_.name} changed {names} approximately and declares no bound"]
    nodes = {node.name: node for node in before.graph.node}
    xs, ys = [nodes[name].input[0] for name in names], [nodes[name].output[0] for name in names]
    seen = run_model(exposing(before, [*xs, *ys]), feeds)
    index = GraphIndex(before)
    problems = [p for name in names for p in bound_problems(pass_, index, nodes[name], after, feeds, seen)]
    fed = [{**f, **{y: was[y] for y in ys}} for f, was in zip(feeds, seen)]
    rest = run_model(exposing(cut_at(after, ys), xs), fed)  # the nodes' inputs too: what moved upstream of them
    reference = [{name: was[name] for name in now} for was, now in zip(seen, rest)]
    return problems + exact_problems(f"pass {pass_.name} apart from {names}", reference, rest, options)


def bound_problems(pass_: Pass, index: GraphIndex, node: onnx.NodeProto, after: onnx.ModelProto, feeds,
                   seen) -> list[str]:
    """Where ``node`` (of the model ``index`` reads, whose tensors on ``feeds`` are ``seen``), rewritten by
    ``pass_`` into ``after``, moves its output beyond the pass's declared bound. Measured on the node alone, on the
    input it had before: an approximation upstream of it moves that input too."""
    x, y = node.input[0], node.output[0]
    fed = [{**f, x: was[x]} for f, was in zip(feeds, seen)] if cut_inputs(after, [x]) else feeds
    moved = run_model(exposing(cut_at(after, [x]), [y]), fed)
    problems = []
    for was, now in zip(seen, moved):
        limit = pass_.bound.limit(index, node, was[x])
        deviation = float(np.abs(now[y].astype(np.float64) - was[y]).max())
        slack = 1e-5 * max(1.0, float(np.abs(was[y]).max()))  # float32 interpolation in onnxruntime
        if limit is None or deviation > limit + slack:
            problems.append(f"pass {pass_.name} moved {node.name}'s output by {deviation:.4g}, bound "
                            f"{'none' if limit is None else f'{limit:.4g}'} ({pass_.bound.text})")
    return problems


def exposing(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` with the tensors ``names`` added to its graph outputs."""
    out = copy_model(model)
    index = GraphIndex(model)
    known = {o.name for o in out.graph.output}
    for name in dict.fromkeys(names):
        if name not in known:
            out.graph.output.append(helper.make_tensor_value_info(name, index.elem_type(name), None))
    return out


def cut_inputs(model: onnx.ModelProto, names: Sequence[str]) -> list[str]:
    """The tensors of ``names`` that :func:`cut_at` turns into graph inputs: those a node of ``model`` makes."""
    producer = GraphIndex(model).producer
    return [name for name in dict.fromkeys(names) if name in producer]


def cut_at(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose tensors ``names`` are graph inputs instead of computed by the nodes that make them
    (a name no node makes, a graph input or an initializer, stays as it is)."""
    out = copy_model(model)
    index = GraphIndex(model)
    computed = cut_inputs(model, names)
    kept = [node for node in out.graph.node if not set(node.output) & set(computed)]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    out.graph.input.extend(helper.make_tensor_value_info(name, index.elem_type(name), index.shape(name))
                           for name in computed)
    return out


FIXED_BY_A_PASS = {"dilated-conv", "align-channels", "fold-batchnorm", "resize-nearest", "cleanup"}


@settings(max_examples=EXAMPLES, deadline=None, derandomize="NPUFIX_FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(model=random_model(), options=random_options())
def test_every_pass_preserves_outputs_and_meets_constraints(model, options):
    result, problems = fix_problems(model, options)
    assert not problems, problems
    for record in result.report.passes:
        if record.changes:  # shown by --hypothesis-show-statistics
            event(f"{record.name} changed the model{'' if record.exact else ' approximately'}")
    onnx.checker.check_model(result.model)
    blocked = {r.node for p in result.report.passes for r in p.rejections if r.blocking}
    remaining = [v for v in constraints.find_violations(result.model, options)
                 if v.fixed_by in FIXED_BY_A_PASS and v.node not in blocked]
    assert not remaining, [v.text() if callable(getattr(v, "text", None)) else v for v in remaining]


def test_every_approximate_pass_declares_its_bound():
    from onnx_npu_fix.passes import PASSES

    assert {name for name, cls in PASSES.items() if not cls.exact} == {"resize-nearest"}  # a new one: test it here
    assert all(cls.bound is not None for cls in PASSES.values() if not cls.exact)
    assert all(cls.bound is None for cls in PASSES.values() if cls.exact)


# --- the checker fails on broken passes -------------------------------------------------------------------------


def _resize_model(*, conv: bool = False) -> onnx.ModelProto:
    """x [1, 4, 1, 12] -> (Conv 1x1) -> linear half_pixel Resize x2 along the last axis -> y [1, 4, 1, 24]."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(np.array([], np.float32), "roi"),
             numpy_helper.from_array(np.array([1, 1, 1, 2], np.float32), "scales")]
    nodes = [helper.make_node("Resize", ["h" if conv else "x", "roi", "scales"], ["y"], name="up", mode="linear",
                              coordinate_transformation_mode="half_pixel")]
    if conv:
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w"))
        nodes.insert(0, helper.make_node("Conv", ["x", "w"], ["h"], name="conv"))
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 1, 24])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _with(passes: Sequence[Pass], broken: Pass) -> list[Pass]:
    return [broken if p.name == broken.name else p for p in passes]


class _CeilNearest(ResizeNearestPass):
    """resize-nearest rounding up: x2 half_pixel output 2k+1 samples at k + 1/4 and copies x[k+1], 3/4 of the step
    away where the declared bound allows 1/4."""

    def rewrite(self, model, options, found):
        result = super().rewrite(model, options, found)
        for node in model.graph.node:
            if node.name in result.metrics["approximate_nodes"]:
                set_attr(node, "nearest_mode", "ceil")
        return result


class _NearestAndWeights(ResizeNearestPass):
    """resize-nearest that also scales every Conv weight by 1.01: each Resize within its bound, the model not."""

    def rewrite(self, model, options, found):
        result = super().rewrite(model, options, found)
        weights = {node.input[1] for node in model.graph.node if node.op_type == "Conv"}
        for init in model.graph.initializer:
            if init.name in weights:
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1.01), init.name))
        return result


def test_checker_passes_resize_nearest_within_its_bound():
    result, problems = fix_problems(_resize_model(conv=True), FixOptions(max_approx_error=FUZZ_ONLY_NODE_BOUNDS))
    assert [r.name for r in result.report.passes if r.changes and not r.exact] == ["resize-nearest"]
    assert problems == []


def test_checker_reports_an_approximate_pass_beyond_its_bound():
    passes = _with(api.select_passes(), _CeilNearest())
    _, problems = fix_problems(_resize_model(), FixOptions(max_approx_error=FUZZ_ONLY_NODE_BOUNDS), passes)
    assert problems and all(p.startswith("pass resize-nearest moved up's output by") for p in problems), problems


def test_checker_reports_an_approximate_pass_that_moves_other_nodes():
    passes = _with(api.select_passes(), _NearestAndWeights())
    _, problems = fix_problems(_resize_model(conv=True), FixOptions(max_approx_error=FUZZ_ONLY_NODE_BOUNDS), passes)
    assert len(problems) == 1 and problems[0].startswith("pass resize-nearest apart from ['up']"), problems


def _conv_batchnorm() -> onnx.ModelProto:
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 3, 3)).astype(np.float32), "w")]
    inits += [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
        ("gamma", 1 + 0.2 * rng.standard_normal(6)), ("beta", rng.standard_normal(6)),
        ("mean", rng.standard_normal(6)), ("var", 0.5 + rng.random(6)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], name="conv"),
             helper.make_node("BatchNormalization", ["h", "gamma", "beta", "mean", "var"], ["y"], name="bn")]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 14])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("validate", ["each", "none"])
def test_checker_reports_a_broken_exact_pass(monkeypatch, validate):
    """fold-batchnorm folding a factor 1 % off: the pass manager's validation names it; without it (--validate
    none) the checker's own replay does."""
    from onnx_npu_fix.passes import fold_batchnorm

    scaled = fold_batchnorm._scaled
    monkeypatch.setattr(fold_batchnorm, "_scaled", lambda weight, factor: scaled(weight, factor * 1.01))
    _, problems = fix_problems(_conv_batchnorm(), FixOptions(validate=validate))
    expected = "pass fold-batchnorm failed" if validate == "each" else "exact pass fold-batchnorm"
    assert problems and problems[0].startswith(expected), problems


def test_checker_passes_fold_batchnorm():
    result, problems = fix_problems(_conv_batchnorm(), FixOptions())
    assert any(r.name == "fold-batchnorm" and r.changes for r in result.report.passes)
    assert problems == []
