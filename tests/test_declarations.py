"""Every pass's declarations hold: each constraint it says it fixes (``Pass.fixes``) has a model here on which
``--check`` names it and running it removes the violation; each key it says chooses how it writes what it emits
(``Pass.forms``) changes what it emits on a model here, and only nodes of the op types it declares; each fact it
declares matches the op form it names and not another node of that op. A declaration without an example here
fails, so a new one comes with its proof."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from helpers import apply_pass
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints import CONSTRAINT, find_violations
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.passes import PASSES
from onnx_npu_fix.passes.base import Form
from onnx_npu_fix.passes.lower_ops import lowered_ops
from onnx_npu_fix.pipeline.scheduler import prepare

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _w(name, shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


# --- models ------------------------------------------------------------------------------------------------


def _shape_chain(*, to_output: bool):
    """Shape -> Abs -> Reshape: opaque to onnx's data propagation, folded by fold-constants."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Abs", ["s"], ["s_abs"], name="abs"),
             helper.make_node("Reshape", ["x", "s_abs"], ["y" if to_output else "r"], name="reshape")]
    if not to_output:
        nodes.append(helper.make_node("Relu", ["r"], ["y"], name="relu"))
    return _model(nodes, [_vi("x", [1, 8, 4, 4])], [_vi("y", None if to_output else [1, 8, 4, 4])])


def _constant_axes():
    nodes = [helper.make_node("Constant", [], ["axes"], name="axes_const", value=_i64("v", [1])),
             helper.make_node("Unsqueeze", ["x", "axes"], ["y"], name="unsqueeze")]
    return _model(nodes, [_vi("x", [1, 16, 8])], [_vi("y", None)])


def _if_on_a_constant():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")], "then", [],
                             [_vi("t", [1, 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [],
                              [_vi("e", [1, 4])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)]
    return _model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])],
                  [numpy_helper.from_array(np.array(True), "c")])


def _identity():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Identity", ["a"], ["b"], name="identity"),
             helper.make_node("Relu", ["b"], ["y"], name="relu2")]
    return _model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])])


def _bn(*, after_conv: bool):
    c = 8
    first = (helper.make_node("Conv", ["x", "w"], ["a"], name="conv", pads=[1, 1, 1, 1]) if after_conv
             else helper.make_node("Relu", ["x"], ["a"], name="relu"))
    nodes = [first, helper.make_node("BatchNormalization", ["a", "s", "b", "m", "v"], ["y"], name="bn")]
    rng = np.random.default_rng(1)
    params = [numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), n) for n in ("s", "b", "m", "v")]
    return _model(nodes, [_vi("x", [1, c, 8, 8])], [_vi("y", [1, c, 8, 8])],
                  ([_w("w", (c, c, 3, 3))] if after_conv else []) + params)


def _two_branches():
    nodes = [helper.make_node("Relu", ["x"], ["a1"], name="a1"), helper.make_node("Neg", ["x"], ["b1"], name="b1"),
             helper.make_node("ReduceSum", ["a1"], ["a2"], name="a2", keepdims=1),
             helper.make_node("ReduceSum", ["b1"], ["b2"], name="b2", keepdims=1),
             helper.make_node("Concat", ["a2", "b2"], ["y"], name="cat", axis=0)]
    return _model(nodes, [_vi("x", [1, 64, 32, 32])], [_vi("y", None)], opset=13)


def _resize_by_sizes():
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize", mode="linear")
    return _model([node], [_vi("x", [1, 16, 8, 8])], [_vi("y", None)], [_i64("sizes", [1, 16, 16, 16])])


def _squeeze_keeping_one():
    node = helper.make_node("Squeeze", ["x", "axes"], ["y"], name="squeeze")
    return _model([node], [_vi("x", [1, 16, 1])], [_vi("y", None)], [_i64("axes", [2])])


def _resize(factor: int, mode: str = "linear", coord: str = "half_pixel"):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode=mode,
                            coordinate_transformation_mode=coord)
    scales = numpy_helper.from_array(np.array([1, 1, factor, factor], np.float32), "scales")
    return _model([node], [_vi("x", [1, 16, 8, 8])], [_vi("y", None)], [scales])


def _dilated(dilation: int, length: int = 64, rank: int = 1):
    """One depthwise-free Conv of kernel 3 and ``dilation`` on [1,4,length] (rank 1) or [1,4,length,length]."""
    spatial = [length] * rank
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", dilations=[dilation] * rank,
                            pads=[dilation] * (2 * rank))
    return _model([node], [_vi("x", [1, 4, *spatial])], [_vi("y", None)], [_w("w", (4, 4, *[3] * rank))])


def _unaligned_chain():
    """x [1,8,8,8] -> conv_a (8 -> 12) -> conv_b (12 -> 8): 12 channels in between."""
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "wb"], ["y"], name="conv_b", pads=[1, 1, 1, 1])]
    return _model(nodes, [_vi("x", [1, 8, 8, 8])], [_vi("y", None)],
                  [_w("wa", (12, 8, 3, 3)), _w("wb", (8, 12, 3, 3), 1)])


def _unaligned_concat():
    """Two convs (8 -> 16, 8 -> 12) concatenated, then a conv: the 12 is padded to 16 and carried across."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv_1", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["b"], name="conv_2", pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["c"], name="cat", axis=1),
             helper.make_node("Conv", ["c", "w3"], ["y"], name="conv_3", pads=[1, 1, 1, 1])]
    return _model(nodes, [_vi("x", [1, 8, 8, 8])], [_vi("y", None)],
                  [_w("w1", (16, 8, 3, 3)), _w("w2", (12, 8, 3, 3), 1), _w("w3", (8, 28, 3, 3), 2)])


def _hardswish():
    return _model([helper.make_node("HardSwish", ["x"], ["y"], name="hs")], [_vi("x", [1, 4])], [_vi("y", [1, 4])])


def _lowerable(op: str):
    """One node of ``op`` on [1, 4] float inputs (as many as its schema requires), at the newest opset: every op
    a lowering rule rewrites has one, so each rule's fact is held here without an entry of its own."""
    inputs = [f"x{k}" for k in range(onnx.defs.get_schema(op).min_input)]
    return _model([helper.make_node(op, inputs, ["y"], name="lowered")], [_vi(name, [1, 4]) for name in inputs],
                  [_vi("y", None)], opset=onnx.defs.onnx_opset_version())


def _pad_before_conv():
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], name="pad"),
             helper.make_node("Conv", ["p", "w"], ["y"], name="conv")]
    return _model(nodes, [_vi("x", [1, 8, 8, 8])], [_vi("y", None)],
                  [_i64("pads", [0, 0, 1, 1, 0, 0, 1, 1]), _w("w", (8, 8, 3, 3))])


# --- the constraints each pass declares it fixes ---------------------------------------------------------------

# (pass, constraint) -> (model, options, the violating node; None: wherever the check reports it)
FIX_EXAMPLES = {
    ("fold-constants", "unknown-shape"): (lambda: _shape_chain(to_output=False), {}, "reshape"),
    ("fold-constants", "dynamic-shape"): (lambda: _shape_chain(to_output=True), {}, "y"),
    ("fold-constants", "constant-node-input"): (_constant_axes, {"initializer_inputs": ("Unsqueeze",)}, "unsqueeze"),
    ("fold-constants", "control-flow"): (_if_on_a_constant, {"allow_control_flow": False}, "branch"),
    ("cleanup", "leftover-op"): (_identity, {}, "identity"),
    ("fold-batchnorm", "batchnorm"): (lambda: _bn(after_conv=True), {}, "bn"),
    ("fold-batchnorm", "forbidden-op"): (lambda: _bn(after_conv=True),
                                         {"allow_batchnorm": True, "forbidden_ops": ("BatchNormalization",)}, "bn"),
    ("reorder-memory", "sram"): (_two_branches, {"sram_bytes": 140_000, "act_bytes": 1}, None),
    ("resize-scales", "resize-sizes"): (_resize_by_sizes, {"resize_scales_only": True, "align": 0,
                                                          "require_nearest_resize": False}, "resize"),
    ("squeeze-reshape", "squeeze-axes"): (_squeeze_keeping_one, {"squeeze_axes_ignored": True}, "squeeze"),
    ("resize-nearest", "resize-mode"): (lambda: _resize(2), {"align": 0}, "up"),
    ("resize-nearest", "resize-factor"): (lambda: _resize(8), {"align": 0, "resize_factors": (2, 4, 8),
                                                                "linear_half_pixel_factors": (2,)}, "up"),
    ("dilated-conv", "dilation"): (lambda: _dilated(8), {"max_dilation": 4, "align": 0}, "conv"),
    ("dilated-conv", "dilation-allowed"): (lambda: _dilated(3), {"max_dilation": 8, "allowed_dilations": (1, 2, 4),
                                                                 "align": 0}, "conv"),
    ("align-channels", "in-channels-align"): (_unaligned_chain, {"align": 8}, "conv_b"),
    ("align-channels", "out-channels-align"): (_unaligned_chain, {"align": 8}, "conv_a"),
    ("align-channels", "concat-align"): (_unaligned_concat, {"align": 8, "concat_align": 8}, "cat"),
    ("lower-ops", "forbidden-op"): (_hardswish, {"forbidden_ops": ("HardSwish",)}, "hs"),
}
DECLARED_FIXES = sorted((name, fix.constraint) for name, cls in PASSES.items() for fix in cls.fixes)


def test_every_declared_fix_has_an_example_and_every_example_a_declaration():
    assert sorted(FIX_EXAMPLES) == DECLARED_FIXES


def test_every_declaration_names_a_constraint_and_its_ops():
    for name, cls in PASSES.items():
        for fix in cls.fixes:
            assert fix.constraint in CONSTRAINT, (name, fix)
            assert all(onnx.defs.has(op) for op in fix.ops), (name, fix)


def _violations(model, options, constraint, node):
    return [v for v in find_violations(model, options)
            if v.constraint == constraint and (node is None or v.node == node)]


@pytest.mark.parametrize("pass_name, constraint", DECLARED_FIXES)
def test_the_pass_fixes_what_it_declares(pass_name, constraint):
    build, kwargs, node = FIX_EXAMPLES[(pass_name, constraint)]
    options = FixOptions(**kwargs)
    before = _violations(build(), options, constraint, node)
    assert before, f"the example of {pass_name} / {constraint} violates nothing"
    assert before[0].fixed_by == pass_name, before[0].text()
    fixed, _ = apply_pass(build(), PASSES[pass_name](), **kwargs)
    assert not _violations(fixed, options, constraint, node)


# --- the keys each pass declares choose how it writes what it emits ----------------------------------------------

# (pass, key) -> (model, options, another value of the key)
FORM_EXAMPLES = {
    ("fold-pad-conv", "fold_pad_into_conv"): (_pad_before_conv, {"fold_pad_into_conv": False}, True),
    ("fold-batchnorm", "bn_standalone"): (lambda: _bn(after_conv=False), {}, "conv"),
    ("resize-nearest", "resize_mode"): (lambda: _resize(2), {"align": 0}, "exact"),
    ("resize-nearest", "allow_convtranspose"): (lambda: _resize(2), {"resize_mode": "exact", "align": 0}, False),
    ("resize-nearest", "max_convtranspose_stride"): (lambda: _resize(8), {"resize_mode": "exact", "align": 0}, 4),
    ("dilated-conv", "remainder_pad"): (lambda: _dilated(8, length=63), {"max_dilation": 4, "align": 0}, "pad"),
    ("dilated-conv", "lift_conv1d"): (lambda: _dilated(8), {"max_dilation": 4, "align": 0}, True),
    ("dilated-conv", "s2b_layout"): (lambda: _dilated(8, length=32, rank=2), {"max_dilation": 4, "align": 0},
                                     "channel"),
    ("dilated-conv", "max_dilation"): (lambda: _dilated(8), {"max_dilation": 4, "align": 0}, 2),
    ("align-channels", "align"): (_unaligned_chain, {"align": 8}, 16),
    ("resize-nearest", "resize_separable"): (lambda: _resize(2), {"resize_mode": "exact", "align": 0}, True),
    ("lower-ops", "forbidden_ops"): (lambda: _hardswish(), {}, ("HardSwish",)),
}
DECLARED_FORMS = sorted((name, form.key) for name, cls in PASSES.items() for form in cls.forms)


def _form(pass_name: str, key: str) -> Form:
    return next(form for form in PASSES[pass_name].forms if form.key == key)


def test_every_declared_form_has_an_example_and_every_example_a_declaration():
    assert sorted(FORM_EXAMPLES) == DECLARED_FORMS


def test_every_form_names_an_option_and_real_op_types():
    for name, cls in PASSES.items():
        for form in cls.forms:
            assert form.key in FixOptions.__dataclass_fields__, (name, form.key)
            assert form.emits and all(onnx.defs.has(op) for op in form.emits), (name, form.key)
            assert all(onnx.defs.has(fact.op) for fact in form.facts), (name, form.key)


def _node_texts(model):
    """Each node as (op type, its serialized bytes without the name), with how often it occurs."""
    texts: dict[tuple[str, bytes], int] = {}
    for node in model.graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = ""
        key = (node.op_type, copy.SerializeToString())
        texts[key] = texts.get(key, 0) + 1
    return texts


@pytest.mark.parametrize("pass_name, key", DECLARED_FORMS)
def test_the_key_changes_what_the_pass_emits_and_only_nodes_it_declares(pass_name, key):
    build, kwargs, other = FORM_EXAMPLES[(pass_name, key)]
    one, result = apply_pass(build(), PASSES[pass_name](), **kwargs)
    two, other_result = apply_pass(build(), PASSES[pass_name](), **{**kwargs, key: other})
    assert result.changed or other_result.changed, f"{pass_name} changes nothing on its {key} example"
    a, b = _node_texts(one), _node_texts(two)
    differing = {op for (op, text), n in a.items() if b.get((op, text), 0) != n}
    differing |= {op for (op, text), n in b.items() if a.get((op, text), 0) != n}
    assert differing, f"{key} = {other!r} emits what {getattr(FixOptions(**kwargs), key)!r} emits"
    assert differing <= set(_form(pass_name, key).emits), sorted(differing - set(_form(pass_name, key).emits))


# --- the facts: the op forms in a model a key would write another way --------------------------------------------

# (key, fact op) -> (model with a node of that form, its name, a model whose node of that op is not the form[,
# the options it is not the form under])
FACT_EXAMPLES = {
    **{("forbidden_ops", op): (lambda op=op: _lowerable(op), "lowered", lambda op=op: _lowerable(op),
                               {"forbidden_ops": (op,)}) for op in lowered_ops()},
    ("fold_pad_into_conv", "Pad"): (_pad_before_conv, "pad", lambda: _model(
        [helper.make_node("Pad", ["x", "pads"], ["y"], name="pad")], [_vi("x", [1, 8, 8, 8])], [_vi("y", None)],
        [_i64("pads", [0, 0, 1, 1, 0, 0, 1, 1])])),
    ("remainder_pad", "Pad"): (lambda: _model([helper.make_node("Pad", ["x", "pads"], ["y"], name="pad")],
                                              [_vi("x", [1, 8, 8])], [_vi("y", None)],
                                              [_i64("pads", [0, 0, 1, 0, 0, 1])]),
                               "pad", _pad_before_conv),
    ("lift_conv1d", "Conv"): (lambda: _dilated(1), "conv", lambda: _dilated(1, rank=2)),
    ("max_dilation", "Conv"): (lambda: _dilated(4), "conv", lambda: _dilated(1)),
    ("resize_mode", "Resize"): (lambda: _resize(2), "up", lambda: _resize(2, "nearest", "asymmetric")),
    ("max_convtranspose_stride", "ConvTranspose"): (
        lambda: _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", strides=[2, 2])],
                       [_vi("x", [1, 8, 8, 8])], [_vi("y", None)], [_w("w", (8, 8, 2, 2))]), "up",
        lambda: _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up")],
                       [_vi("x", [1, 8, 8, 8])], [_vi("y", None)], [_w("w", (8, 8, 1, 1))])),
    ("align", "Conv"): (_unaligned_chain, "conv_a", _pad_before_conv),
    ("align", "ConvTranspose"): (
        lambda: _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", strides=[2, 2])],
                       [_vi("x", [1, 8, 8, 8])], [_vi("y", None)], [_w("w", (8, 12, 2, 2))]), "up",
        lambda: _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", strides=[2, 2])],
                       [_vi("x", [1, 8, 8, 8])], [_vi("y", None)], [_w("w", (8, 8, 2, 2))])),
}
DECLARED_FACTS = sorted((form.key, fact.op) for cls in PASSES.values() for form in cls.forms for fact in form.facts)


def test_every_declared_fact_has_an_example_and_every_example_a_declaration():
    assert sorted(FACT_EXAMPLES) == DECLARED_FACTS


def _fact_value(key, op, model, options):
    fact = next(f for cls in PASSES.values() for form in cls.forms if form.key == key
                for f in form.facts if f.op == op)
    prepare(model, options)
    index = GraphIndex(model)
    return [fact.test(index, node, options) for node in model.graph.node if node.op_type == op]


@pytest.mark.parametrize("key, op", DECLARED_FACTS)
def test_each_fact_matches_its_form_and_not_another_node_of_its_op(key, op):
    build, node, other, *other_options = FACT_EXAMPLES[(key, op)]
    options = dataclasses.replace(FixOptions(), align=8)
    model = build()
    values = dict(zip([n.name for n in model.graph.node if n.op_type == op], _fact_value(key, op, model, options)))
    assert values[node] is not None
    negative = dataclasses.replace(options, **other_options[0]) if other_options else options
    assert _fact_value(key, op, other(), negative) == [None]
