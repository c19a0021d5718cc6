"""Activation-memory estimate (onnx_npu_fix/analysis/memory.py) and the reorder-memory pass.

Expected peaks are computed by hand in the comments (act_bytes = 1 unless said otherwise); the property tests
compare the implementation against a naive step-by-step count written independently here.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import apply_pass, assert_equivalent, ops
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.analysis.memory import estimate, render_memory
from onnx_npu_fix.analysis.schedule import memory_aware_order, order_plan, stored_peak
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.passes.reorder_memory import ReorderMemoryPass

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _weight(name, shape, seed=0):
    # small integers: every sum in a conv is exact in float32
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.integers(-2, 3, size=shape).astype(np.float32), name)


def skip_model():
    """x [1,4,8,8] -> conv1 (4->8) -> a -> relu -> b -> conv2 (8->4) -> c;  y = c + x  (a skip connection).

    Sizes at 1 byte/element: x = 4*8*8 = 256, a = b = 8*8*8 = 512, c = y = 256.
    step 0 conv1: x, a            =  256 + 512             =  768
    step 1 relu:  x, a, b         =  256 + 512 + 512       = 1280   <- peak
    step 2 conv2: x, b, c         =  256 + 512 + 256       = 1024
    step 3 add:   x, c, y         =  256 + 256 + 256       =  768
    x is live from step 0 (graph input) to step 3 (its last reader, add): span 3.
    """
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Conv", ["b", "w2"], ["c"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "x"], ["y"], name="add"),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 4, 8, 8])],
                  [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])],
                  [_weight("w1", (8, 4, 3, 3)), _weight("w2", (4, 8, 3, 3), 1)])


def test_hand_computed_peak_and_live_set():
    model = skip_model()
    est = estimate(model, act_bytes=1)
    assert est.profile == [768, 1280, 1024, 768]
    assert est.peak_bytes == 1280
    assert (est.peak_step, est.peak_node, est.peak_op) == (1, "relu", "Relu")
    live = {t.name: t for t in est.live_at_peak}
    assert set(live) == {"x", "a", "b"}
    assert [t.bytes for t in est.live_at_peak] == [512, 512, 256]  # largest first
    skip = live["x"]
    assert (skip.producer, skip.producer_step, skip.last_consumer, skip.last_step, skip.span) == (
        "(graph input)", 0, "add", 3, 3)
    assert (live["a"].producer, live["a"].last_consumer, live["a"].span) == ("conv1", "relu", 1)
    # weights are not activations
    assert est.activations == 5  # x, a, b, c, y
    assert est.largest is not None and est.largest.bytes == 512 and est.largest.name in {"a", "b"}
    assert est.unknown == []


def test_act_bytes_scales_and_sram_verdict():
    model = skip_model()
    est = estimate(model, act_bytes=4, sram_bytes=5000)
    assert est.peak_bytes == 4 * 1280
    assert est.fits is False and est.miss_bytes == 5120 - 5000
    ok = estimate(model, act_bytes=4, sram_bytes=5120)
    assert ok.fits is True and ok.miss_bytes == 0
    assert estimate(model).fits is None


def test_estimate_does_not_modify_the_model():
    model = skip_model()
    before = model.SerializeToString()
    estimate(model, act_bytes=1, sram_bytes=100)
    assert model.SerializeToString() == before


def test_graph_output_stays_live_to_the_end():
    # x -> relu1 -> r (graph output, also read by relu2) -> relu2 -> s -> relu3 -> t (graph output)
    # x, r, s, t: 16 bytes each ([1,16]).  step 0: x r = 32; step 1: r s = 32; step 2: r s t = 48 (r stays: output)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu1"),
             helper.make_node("Relu", ["r"], ["s"], name="relu2"),
             helper.make_node("Relu", ["s"], ["t"], name="relu3")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 16])],
                   [helper.make_tensor_value_info("r", F, [1, 16]), helper.make_tensor_value_info("t", F, [1, 16])])
    est = estimate(model)
    assert est.profile == [32, 32, 48]
    r = next(t for t in est.live_at_peak if t.name == "r")
    assert r.last_consumer == "(graph output)" and r.last_step == 2


def test_constants_and_weight_chains_are_not_activations():
    # c = Constant [1,64]; q = DequantizeLinear(int8 weight) [1,64]; both constant -> not counted.
    # x [1,64] -> add(x, c) -> a -> mul(a, q) -> y : step 1 (add): x a = 128; step 2 (mul): a y = 128
    wq = numpy_helper.from_array(np.arange(64, dtype=np.int8).reshape(1, 64), "wq")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const",
                         value=numpy_helper.from_array(np.ones((1, 64), np.float32))),
        helper.make_node("DequantizeLinear", ["wq", "scale"], ["q"], name="dq"),
        helper.make_node("Add", ["x", "c"], ["a"], name="add"),
        helper.make_node("Mul", ["a", "q"], ["y"], name="mul"),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 64])],
                   [helper.make_tensor_value_info("y", F, [1, 64])], [wq, scale])
    est = estimate(model)
    names = {t.name for t in est.live_at_peak}
    assert names.isdisjoint({"c", "q", "wq", "scale"})
    assert est.activations == 3  # x, a, y
    # steps 0 (const) and 1 (dq) already hold x, which is live from step 0
    assert est.profile == [64, 64, 128, 128]


def unet_model():
    """A two-level U-Net: the encoder output e1 is kept for the decoder's Concat (the skip connection).

    x [1,1,16,16]=256 -> enc conv (1->8) e1 [1,8,16,16]=2048 -> maxpool p [1,8,8,8]=512
    -> mid conv (8->16) m [1,16,8,8]=1024 -> resize x2 u [1,16,16,16]=4096 -> concat(e1, u) k [1,24,16,16]=6144
    -> out conv (24->1) y [1,1,16,16]=256.
    step 0 enc: x e1 = 2304; 1 pool: e1 p = 2560; 2 mid: e1 p m = 3584; 3 resize: e1 m u = 7168;
    step 4 concat: e1 u k = 12288 <- peak; 5 out: k y = 6400.
    """
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [
        helper.make_node("Conv", ["x", "we"], ["e1"], name="enc", pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["e1"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "wm"], ["m"], name="mid", pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["m", "", "scales"], ["u"], name="up", mode="nearest"),
        helper.make_node("Concat", ["e1", "u"], ["k"], name="cat", axis=1),
        helper.make_node("Conv", ["k", "wo"], ["y"], name="out", pads=[1, 1, 1, 1]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 1, 16, 16])],
                  [helper.make_tensor_value_info("y", F, [1, 1, 16, 16])],
                  [_weight("we", (8, 1, 3, 3)), _weight("wm", (16, 8, 3, 3), 1), _weight("wo", (1, 24, 3, 3), 2),
                   scales])


def test_unet_peak_holds_the_skip_tensor():
    est = estimate(unet_model())
    assert est.profile == [2304, 2560, 3584, 7168, 12288, 6400]
    assert (est.peak_bytes, est.peak_node) == (12288, "cat")
    live = {t.name: t for t in est.live_at_peak}
    assert set(live) == {"e1", "u", "k"}
    skip = live["e1"]
    assert (skip.producer, skip.last_consumer, skip.span, skip.bytes) == ("enc", "cat", 4, 2048)
    # the skip tensor has the longest span of the live set
    assert max(est.live_at_peak, key=lambda t: t.span).name == "e1"
    assert est.largest is not None and (est.largest.name, est.largest.bytes) == ("k", 6144)
    text = render_memory(est)
    assert "e1" in text and "enc -> cat" in text and "estimate" in text and "no tiling" in text


def test_unknown_shapes_are_counted_as_unknown_not_a_crash():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Relu", ["r"], ["y"], name="relu2")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 8])],
                   [helper.make_tensor_value_info("y", F, None)])
    est = estimate(model, sram_bytes=10)
    assert set(est.unknown) == {"x", "r", "y"}
    assert est.peak_bytes == 0 and est.fits is True
    assert est.to_json()["lower_bound"] is True
    assert "lower bound" in render_memory(est)
    # freezing the input makes everything known: x, r, y are [2,8] = 16 bytes; step 0: x r, step 1: r y
    frozen = estimate(model, input_shapes={"x": (2, 8)})
    assert frozen.unknown == []
    assert frozen.profile == [32, 32]


def test_given_order_and_invalid_order():
    model = skip_model()
    assert estimate(model, order=[0, 1, 2, 3]).profile == [768, 1280, 1024, 768]
    with pytest.raises(ValueError):
        estimate(model, order=[0, 1, 1, 3])


def test_json_is_serialisable_and_matches():
    est = estimate(unet_model(), act_bytes=1, sram_bytes=10_000)
    data = json.loads(json.dumps(est.to_json(profile=True)))
    assert data["peak"] == {"bytes": 12288, "step": 4, "node": "cat", "op": "Concat"}
    assert data["sram"] == {"bytes": 10_000, "fits": False, "miss_bytes": 2288}
    assert data["profile"] == est.profile
    assert {t["name"] for t in data["live_at_peak"]} == {"e1", "u", "k"}
    assert "no tiling" in data["assumptions"]


def two_branch_model():
    """Two independent branches stored breadth-first; a depth-first order halves the peak.

    x [1,1,8,8] = 64 bytes; each branch: conv 1->8 (512) -> conv 8->1 (64); concat -> y (128).
    Stored order a1 b1 a2 b2 cat:  a1: x a1 = 576 | b1: x a1 b1 = 1088 | a2: a1 b1 a2 = 1088 | b2: b1 a2 b2 = 640
                                   | cat: a2 b2 y = 256                                  -> peak 1088
    Order a1 a2 b1 b2 cat:          a1: x a1 = 576 | a2: x a1 a2 = 640 | b1: x a2 b1 = 640 | b2: a2 b1 b2 = 640
                                   | cat: 256                                           -> peak 640
    No order does better: b1 (or a1) needs x (64) and its 512-byte output, and the other branch's input x or
    its output must be live too (>= 640).
    """
    nodes = [
        helper.make_node("Conv", ["x", "wa1"], ["a1"], name="a1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wb1"], ["b1"], name="b1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a1", "wa2"], ["a2"], name="a2", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b1", "wb2"], ["b2"], name="b2", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["a2", "b2"], ["y"], name="cat", axis=1),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 1, 8, 8])],
                  [helper.make_tensor_value_info("y", F, [1, 2, 8, 8])],
                  [_weight("wa1", (8, 1, 3, 3)), _weight("wb1", (8, 1, 3, 3), 1), _weight("wa2", (1, 8, 3, 3), 2),
                   _weight("wb2", (1, 8, 3, 3), 3)])


def test_memory_aware_order_is_reported_when_lower():
    est = estimate(two_branch_model(), sram_bytes=700)
    assert est.peak_bytes == 1088 and est.fits is False
    assert est.reordered_peak == 640 and est.reorder_fits is True
    assert "reorder-memory" in render_memory(est)
    # nothing lower for a chain: no reordered figure
    assert estimate(skip_model()).reordered_peak is None


def test_reorder_pass_lowers_the_peak_exactly():
    model = two_branch_model()
    fixed, result = apply_pass(model, ReorderMemoryPass())
    assert len(result.changes) == 1
    change = result.changes[0]
    assert (change.action, change.old, change.new) == ("reordered nodes", 1088, 640)
    names = [n.name for n in fixed.graph.node]
    assert names in (["a1", "a2", "b1", "b2", "cat"], ["b1", "b2", "a1", "a2", "cat"])
    assert sorted(ops(fixed)) == sorted(ops(model))
    assert estimate(fixed).peak_bytes == 640
    assert_equivalent(model, fixed)
    # idempotent
    _, again = apply_pass(fixed, ReorderMemoryPass())
    assert again.changes == []
    assert again.metrics["peak_bytes_before"] == 640


def test_reorder_pass_leaves_a_chain_alone():
    model = skip_model()
    fixed, result = apply_pass(model, ReorderMemoryPass())
    assert result.changes == []
    assert fixed.graph.node == model.graph.node


# --- property tests on random DAGs -----------------------------------------------------------------


@st.composite
def random_dags(draw):
    """Random DAGs of custom-domain nodes with declared 1-D shapes (no shape inference needed)."""
    n_inputs = draw(st.integers(1, 3))
    tensors = [f"in{i}" for i in range(n_inputs)]
    sizes = {t: draw(st.integers(0, 40)) for t in tensors}
    consts = ["k0", "k1"]
    nodes = []
    n_nodes = draw(st.integers(1, 14))
    for i in range(n_nodes):
        reads = draw(st.lists(st.sampled_from(tensors), min_size=1, max_size=3))
        if draw(st.booleans()):
            reads.append(draw(st.sampled_from(consts)))
        outs = [f"t{i}_{j}" for j in range(draw(st.integers(1, 2)))]
        for o in outs:
            sizes[o] = draw(st.integers(0, 40))
        nodes.append(helper.make_node("Op", reads, outs, name=f"n{i}", domain="test"))
        tensors.extend(outs)
    produced = [o for node in nodes for o in node.output]
    graph_outputs = draw(st.lists(st.sampled_from(produced), min_size=1, max_size=3, unique=True))
    shuffle = draw(st.permutations(range(n_nodes)))
    # store the nodes in a random topological order: nodes only read earlier tensors, so any order that
    # keeps producers first is valid; pick one by a stable sort on (depth, random key)
    depth = {t: 0 for t in tensors[:n_inputs]}
    for node in nodes:
        d = 1 + max(depth.get(r, 0) for r in node.input)
        for o in node.output:
            depth[o] = d
    order = sorted(range(n_nodes), key=lambda i: (depth[nodes[i].output[0]], shuffle[i]))
    stored = [nodes[i] for i in order]
    graph = helper.make_graph(
        stored, "g", [helper.make_tensor_value_info(t, F, [sizes[t]]) for t in tensors[:n_inputs]],
        [helper.make_tensor_value_info(t, F, [sizes[t]]) for t in graph_outputs],
        [numpy_helper.from_array(np.zeros(50, np.float32), c) for c in consts])
    graph.value_info.extend(helper.make_tensor_value_info(t, F, [sizes[t]])
                            for t in produced if t not in graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test", 1)],
                              ir_version=8)
    return model, sizes


def naive_profile(model, sizes, order):
    """Live bytes per step, counted tensor by tensor (independent of memory.py)."""
    nodes = [model.graph.node[i] for i in order]
    step_of_producer = {o: s for s, node in enumerate(nodes) for o in node.output}
    inputs = [i.name for i in model.graph.input]
    outputs = {o.name for o in model.graph.output}
    profile = []
    for step in range(len(nodes)):
        live = 0
        for t in inputs + list(step_of_producer):
            first = step_of_producer.get(t, 0)
            readers = [s for s, node in enumerate(nodes) if t in node.input]
            last = len(nodes) - 1 if t in outputs else max(readers + [first])
            if first <= step <= last:
                live += sizes[t]
        profile.append(live)
    return profile


def is_topological(model, order):
    available = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    for i in order:
        node = model.graph.node[i]
        if any(r not in available for r in node.input):
            return False
        available.update(node.output)
    return sorted(order) == list(range(len(model.graph.node)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags())
def test_property_profile_matches_naive_count(case):
    model, sizes = case
    est = estimate(model, infer=False)
    assert est.profile == naive_profile(model, sizes, range(len(model.graph.node)))
    assert est.peak_bytes == max(est.profile)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(), st.sampled_from([1, 4]))
def test_property_stored_peak_is_the_estimates_peak(case, act_bytes):
    """The cost table's one-sweep peak (schedule.stored_peak) is the estimate's stored-order peak and unknown
    count, also on a node order that is not topological (the nodes reversed) and with shapes missing."""
    model, _ = case
    backwards = onnx.ModelProto()
    backwards.CopyFrom(model)
    del backwards.graph.node[:]
    backwards.graph.node.extend(reversed(model.graph.node))
    blind = onnx.ModelProto()
    blind.CopyFrom(model)
    kept = list(blind.graph.value_info)[1::2]
    blind.graph.ClearField("value_info")
    blind.graph.value_info.extend(kept)
    for m in (model, backwards, blind):
        est = estimate(m, act_bytes, infer=False, reorder=False)
        assert stored_peak(GraphIndex(m), act_bytes) == (est.peak_bytes, len(est.unknown))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags())
def test_property_memory_aware_order_is_valid_and_never_higher(case):
    model, sizes = case
    stored_peak = max(naive_profile(model, sizes, range(len(model.graph.node))))
    order, peak = memory_aware_order(model)
    assert is_topological(model, order)
    assert peak == max(naive_profile(model, sizes, order))
    assert peak <= stored_peak
    plan = order_plan(GraphIndex(model))
    assert plan.peak_before == stored_peak and plan.improves == (plan.peak_after < stored_peak)


def test_unet_fixture_peak_names_its_skip_connection(fixture_path):
    model = onnx.load(fixture_path("unet.onnx"))
    est = estimate(model, act_bytes=1)
    concat_inputs = {i for n in model.graph.node if n.op_type == "Concat" for i in n.input}
    # a skip connection: an encoder tensor read by a decoder Concat many steps after it was produced
    skips = [t for t in est.live_at_peak if t.name in concat_inputs and t.span > 3]
    assert skips, render_memory(est)
    text = render_memory(est)
    assert all(f"{t.producer} -> {t.last_consumer}" in text for t in skips)


# --- exact schedule search ------------------------------------------------------------------------


def _brute_force_min_peak(lv):
    """The lowest peak over every topological order, by enumeration (independent of the search)."""
    import itertools

    from onnx_npu_fix.analysis.schedule import peak_of

    n = len(lv.nodes)
    best = None
    for perm in itertools.permutations(range(n)):
        pos = {v: i for i, v in enumerate(perm)}
        if all(pos[p] < pos[v] for v in range(n) for p in lv.preds[v]):
            peak = peak_of(lv, perm)
            best = peak if best is None else min(best, peak)
    return best


def _dag_model(spec, in_channels=2):
    """spec: per node, (input indices, out channels); index 0 is x, node i writes tensor i + 1. One input ->
    a 1x1 Conv to `out channels`; several -> a channel Concat. Unread tensors are graph outputs."""
    channels = [in_channels]
    nodes, inits = [], []
    for i, (inputs, out_c) in enumerate(spec):
        names = ["x" if j == 0 else f"t{j}" for j in inputs]
        if len(inputs) == 1:
            inits.append(numpy_helper.from_array(np.ones((out_c, channels[inputs[0]], 1, 1), np.float32), f"w{i}"))
            nodes.append(helper.make_node("Conv", [names[0], f"w{i}"], [f"t{i + 1}"], name=f"n{i}"))
            channels.append(out_c)
        else:
            nodes.append(helper.make_node("Concat", names, [f"t{i + 1}"], name=f"n{i}", axis=1))
            channels.append(sum(channels[j] for j in inputs))
    read = {j for inputs, _ in spec for j in inputs}
    outs = [helper.make_tensor_value_info(f"t{j}", F, [1, channels[j], 2, 2])
            for j in range(1, len(spec) + 1) if j not in read]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, in_channels, 2, 2])], outs, inits)


def _lv(model):
    from onnx_npu_fix.analysis.schedule import liveness
    from onnx_npu_fix.ir.graph import infer_shapes

    infer_shapes(model)
    return liveness(GraphIndex(model), 1)


# A 7-node DAG where every greedy variant peaks at 128 bytes but an order reaching 112 exists (found by a random
# search against the brute force below, then frozen here). 4 bytes per channel (2x2 maps, 1 byte/element).
GREEDY_TRAP = [((0,), 6), ((1,), 2), ((2, 1), None), ((1,), 6), ((2, 3), None), ((1,), 3), ((3,), 3)]


def _greedy_trap():
    return _dag_model([(ins, c or 0) for ins, c in GREEDY_TRAP])


def test_exact_search_beats_greedy_and_matches_brute_force():
    from onnx_npu_fix.analysis.schedule import best_greedy_order, best_schedule, peak_of

    lv = _lv(_greedy_trap())
    _, greedy_peak, _ = best_greedy_order(lv)
    optimum = _brute_force_min_peak(lv)
    assert (greedy_peak, optimum) == (128, 112)
    found = best_schedule(lv)
    assert (found.peak, found.method, found.optimal) == (112, "exact", True)
    assert peak_of(lv, found.order) == 112
    assert found.lower_bound <= found.peak
    # a valid topological order
    pos = {v: i for i, v in enumerate(found.order)}
    assert sorted(found.order) == list(range(len(lv.nodes)))
    assert all(pos[p] < pos[v] for v in range(len(lv.nodes)) for p in lv.preds[v])


def test_exhausted_budget_claims_no_optimality_and_keeps_a_true_bound():
    from onnx_npu_fix.analysis.schedule import best_schedule, node_floors, peak_of

    lv = _lv(_greedy_trap())
    found = best_schedule(lv, budget=1)
    assert not found.optimal and found.expanded == 1
    assert found.peak == 128  # the greedy incumbent: no completion of the first partial orders does better
    assert max(node_floors(lv)) <= found.lower_bound <= 112  # the bound never exceeds the true optimum
    # a few more states: the best partial orders, completed greedily, beat greedy without a proof
    found = best_schedule(lv, budget=3)
    assert 112 <= found.peak < 128 and (found.method, found.optimal) == ("search", False)
    assert peak_of(lv, found.order) == found.peak and found.lower_bound <= 112


def test_reorder_pass_uses_the_exact_schedule():
    model = _greedy_trap()
    fixed, result = apply_pass(model, ReorderMemoryPass())
    assert result.metrics["peak_bytes_after"] == 112 and result.metrics["optimal"] is True
    assert result.metrics["lower_bound_bytes"] <= 112
    assert result.changes and result.changes[0].detail["method"] == "exact"
    assert estimate(fixed).peak_bytes == 112
    assert_equivalent(model, fixed)
    assert apply_pass(fixed, ReorderMemoryPass())[1].changes == []  # idempotent


def test_estimate_reports_floor_and_bound():
    est = estimate(_greedy_trap(), sram_bytes=100)
    assert est.best_peak == 112 and est.best_optimal is True
    assert est.floor_bytes <= est.best_lower_bound <= est.best_peak
    data = est.to_json()
    assert data["schedule"] == {"peak_bytes": 112, "lower_bound_bytes": est.best_lower_bound, "optimal": True}
    assert data["floor"]["node"] == est.floor_node and data["floor"]["fits"] == (est.floor_bytes <= 100)
    assert "best order" in render_memory(est)


@st.composite
def small_dags(draw):
    n = draw(st.integers(2, 7))
    spec = []
    for i in range(n):
        k = draw(st.integers(1, min(2, i + 1)))
        inputs = tuple(sorted(draw(st.lists(st.integers(0, i), min_size=k, max_size=k, unique=True))))
        spec.append((inputs, draw(st.integers(1, 8))))
    return spec


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags(), st.sampled_from([1, 3, 20000]))
def test_property_search_is_exact_and_its_bound_is_sound(spec, budget):
    from onnx_npu_fix.analysis.schedule import best_schedule, peak_of

    lv = _lv(_dag_model(spec))
    optimum = _brute_force_min_peak(lv)
    found = best_schedule(lv, budget=budget)
    assert peak_of(lv, found.order) == found.peak >= optimum
    assert found.lower_bound <= optimum
    if found.optimal:
        assert found.peak == optimum
    if budget == 20000:
        assert found.optimal and found.peak == optimum


# --- cost table ---------------------------------------------------------------------------------------


def test_cost_table_before_and_after_alignment(tmp_path):
    """One Conv 3 -> 5 channels, 3x3, on 1x3x8x8 (pads 1), then Relu. --align 8 pads the conv to 8 output
    channels and slices back to 5: by hand, MACs 8*8*5 * 3*9 = 8640 -> 8*8*8 * 3*9 = 13824; weights
    5*3*9*4 = 540 B -> 8*3*9*4 = 864 B plus the Slice's constants."""
    from click.testing import CliRunner

    from onnx_npu_fix.api import fix
    from onnx_npu_fix.cli import main
    from onnx_npu_fix.config.options import FixOptions

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
                   [helper.make_tensor_value_info("y", F, [1, 5, 8, 8])], [_weight("w", (5, 3, 3, 3))])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    result = fix(onnx.load(path), FixOptions(align=8))
    before, after = result.report.cost
    assert before.ops == {"Conv": 1, "Relu": 1} and before.nodes == 2
    assert (before.conv_macs, after.conv_macs) == (8640, 13824)
    assert before.weight_bytes == 540 and after.weight_bytes >= 864
    assert before.peak_bytes == estimate(model).peak_bytes
    assert after.peak_bytes == estimate(result.model).peak_bytes > before.peak_bytes
    assert after.ops.get("Slice", 0) >= 1
    run = CliRunner().invoke(main, [str(path), "-o", str(tmp_path / "o.onnx"), "--report", str(tmp_path / "r.json")])
    assert run.exit_code == 0, run.output
    line = next(x for x in run.output.splitlines() if x.startswith("cost "))
    assert "conv MACs 8,640 -> 13,824, +60%" in line
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["cost"]["before"]["conv_macs"] == 8640 and record["cost"]["after"]["conv_macs"] == 13824


def _shape_chain_model() -> onnx.ModelProto:
    """Conv 2 -> 4 on 1x2x16x16, then a Resize whose ``sizes`` a Shape chain computes (Shape -> Slice -> Div ->
    Concat, as exporters emit), then Conv 4 -> 4 1x1. onnx's data propagation stops at the Div: before
    fold-constants the Resize's output and the second conv have no static shape, after it they do (1x4x8x8)."""
    i64 = onnx.TensorProto.INT64
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Shape", ["c1"], ["s"], name="shape"),
             helper.make_node("Slice", ["s", "two", "four"], ["hw"], name="slice"),
             helper.make_node("Div", ["hw", "two"], ["hw2"], name="div"),
             helper.make_node("Concat", ["nc", "hw2"], ["sizes"], name="concat", axis=0),
             helper.make_node("Resize", ["c1", "", "", "sizes"], ["r"], name="resize", mode="nearest"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2")]
    inits = [_weight("w1", (4, 2, 3, 3)), _weight("w2", (4, 4, 1, 1)),
             onnx.helper.make_tensor("two", i64, [1], [2]), onnx.helper.make_tensor("four", i64, [1], [4]),
             onnx.helper.make_tensor("nc", i64, [2], [1, 4])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [1, 2, 16, 16])],
                  [helper.make_tensor_value_info("y", F, ["n", "c", "h", "w"])], inits)


def test_cost_before_is_taken_with_the_shape_chains_folded(tmp_path):
    """The "before" MACs and peak are the input's as the passes see it (shape chains folded on a copy), not a sum
    over the shapes known before folding: that sum read as "conv MACs 18,432 -> 19,456, +6%" for a model whose
    convs npufix never touched. By hand: conv1 16*16*4 * 2*9 = 18,432; conv2 8*8*4 * 4 = 1,024."""
    from click.testing import CliRunner

    from onnx_npu_fix.analysis.cost import model_cost
    from onnx_npu_fix.api import fix
    from onnx_npu_fix.cli import main
    from onnx_npu_fix.config.options import FixOptions
    from onnx_npu_fix.io.load import prepare

    model = _shape_chain_model()
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    prepare(prepared)
    assert model_cost(prepared).conv_macs is None  # what the input alone says: unknown, not a partial 18,432
    result = fix(model, FixOptions(align=0))
    before, after = result.report.cost
    assert (before.conv_macs, after.conv_macs) == (18432 + 1024, 18432 + 1024)
    assert before.peak_bytes == after.peak_bytes == estimate(result.model).peak_bytes
    assert before.unknown == {} and before.ops["Shape"] == 1  # the node counts stay the input's own
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    run = CliRunner().invoke(main, [str(path), "-o", str(tmp_path / "o.onnx"), "--align", "0",
                                    "--report", str(tmp_path / "r.json")])
    assert run.exit_code == 0, run.output
    line = next(x for x in run.output.splitlines() if x.startswith("cost "))
    assert "conv MACs 19,456 (same)" in line and "activation peak 1.5 KiB (same)" in line
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["cost"]["before"]["conv_macs"] == record["cost"]["after"]["conv_macs"] == 19456


def test_cost_prints_unknown_rather_than_a_partial_sum():
    """A figure whose shapes stay unknown is None in the record and "unknown" in the table, never a growth."""
    from onnx_npu_fix.analysis.cost import Cost, render_cost

    before = Cost({"Conv": 1}, None, 100, None, 1, {"conv_macs": 1, "peak_bytes": 3})
    after = Cost({"Conv": 1}, 5000, 100, 2048, 1)
    line = render_cost(before, after)[0]
    assert "conv MACs unknown -> 5,000;" in line and "activation peak unknown -> 2.0 KiB (1 B" in line
    assert before.to_json()["unknown_shapes"] == {"conv_macs": 1, "peak_bytes": 3}


def test_cli_schedule_budget_reaches_the_pass_and_the_check(tmp_path):
    from click.testing import CliRunner

    from onnx_npu_fix.cli import main

    path = tmp_path / "trap.onnx"
    onnx.save(_greedy_trap(), path)
    runner = CliRunner()
    runs = {}
    for budget in ("0", "20000"):
        report = tmp_path / f"r{budget}.json"
        result = runner.invoke(main, [str(path), "-o", str(tmp_path / f"o{budget}.onnx"), "--align", "0",
                                      "--passes", "reorder-memory", "--schedule-budget", budget,
                                      "--report", str(report)])
        assert result.exit_code == 0, result.output
        runs[budget] = json.loads(report.read_text())
    greedy = next(p for p in runs["0"]["passes"] if p["name"] == "reorder-memory")["metrics"]
    exact = next(p for p in runs["20000"]["passes"] if p["name"] == "reorder-memory")["metrics"]
    assert (greedy["peak_bytes_after"], greedy["optimal"], greedy["states_expanded"]) == (128, False, 0)
    assert (exact["peak_bytes_after"], exact["optimal"]) == (112, True)
    assert runs["0"]["memory"]["schedule"]["optimal"] is False  # the output's check uses the same budget
    from onnx_npu_fix.analysis.schedule import node_floors

    check = runner.invoke(main, [str(path), "--check", "--align", "0", "--schedule-budget", "0", "--format", "json"])
    floor = max(node_floors(_lv(_greedy_trap())))
    assert json.loads(check.output)["models"][0]["memory"]["schedule"] == {
        "peak_bytes": 128, "lower_bound_bytes": floor, "optimal": False}


def test_the_exact_search_reports_its_progress(monkeypatch):
    """A long search tells a listener how far it is (states expanded of the budget), every PROGRESS_EVERY
    states; nobody listening costs nothing but the check."""
    from onnx_npu_fix import progress
    from onnx_npu_fix.analysis import schedule

    monkeypatch.setattr(schedule, "PROGRESS_EVERY", 2)
    lv = _lv(_greedy_trap())
    steps = []
    with progress.listening(steps.append):
        found = schedule.best_schedule(lv, budget=100)
    reported = [(s.task, s.done, s.total) for s in steps]
    assert reported == [("schedule search", k, 100) for k in range(2, found.expanded + 1, 2)] and reported
