"""The rule layer (passes/rules.py): what it does once for every rule — naming, constants, placement, replacing a
chain, dropping the chain's own constants, refusing a match that would emit a forbidden op, and leaving the model
as it was when a rule's build fails."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_equivalent, ops, prepared
from onnx import TensorProto, helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.passes.rules import Emit, Match, Rule, RulePass, View

F = TensorProto.FLOAT


def _model(nodes, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4])],
                              [helper.make_tensor_value_info("y", F, [1, 4])], list(inits))
    return prepared(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


def _neg_abs():
    """x -> Neg -> Abs -> Relu -> y: Neg -> Abs is |x|, written here as one chain a rule replaces by Abs."""
    return _model([helper.make_node("Neg", ["x"], ["n"], name="neg"),
                   helper.make_node("Abs", ["n"], ["a"], name="abs"),
                   helper.make_node("Relu", ["a"], ["y"], name="relu")])


class NegAbsToAbs(Rule):
    """Abs(Neg(x)) = Abs(x): a two-node chain anchored at the Neg."""

    op = "Neg"
    name = "neg-abs"
    emits = ("Abs",)

    def match(self, node, view):
        reader = view.index.single_consumer(node.output[0])
        if reader is None or reader.op_type != "Abs":
            return None
        return Match((node, reader))

    def build(self, match, out):
        out.node("Abs", [match.input(0)], outputs=match.outputs())


class ReluAsMax(Rule):
    """Relu(x) = Max(x, 0), with the 0 a constant of the rule's own."""

    op = "Relu"
    name = "relu-as-max"
    emits = ("Max",)

    def match(self, node, view):
        return Match((node,))

    def build(self, match, out):
        out.node("Max", [match.input(0), out.const(np.zeros((), np.float32), "zero")], outputs=match.outputs())


def _pass(*rules, applies=True):
    class Rules(RulePass):
        name = "test-rules"
        summary = "test"

        def applies(self, options):
            return applies

    Rules.rules = rules
    return Rules()


def test_a_chain_is_replaced_in_place_with_derived_names_and_its_own_constants():
    model = _neg_abs()
    original = onnx.ModelProto()
    original.CopyFrom(model)
    result = _pass(NegAbsToAbs(), ReluAsMax()).run(model, FixOptions())
    onnx.checker.check_model(model, full_check=True)
    assert ops(model) == ["Abs", "Max"]  # the replacement of the chain stands where the chain's last node stood
    assert [n.name for n in model.graph.node] == ["neg/Abs", "relu/Max"]
    assert [t.name for t in model.graph.initializer] == ["relu/zero"]
    assert [(c.node, c.action, c.detail) for c in result.changes] == [
        ("neg", "neg-abs", {"ops": ["Abs"]}), ("relu", "relu-as-max", {"ops": ["Max"]})]
    assert model.graph.output[0].name == "y"
    assert_equivalent(original, model)


def test_find_is_read_only_and_names_what_rewrite_does():
    model = _neg_abs()
    before = model.SerializeToString()
    found = _pass(NegAbsToAbs()).find(model, FixOptions())
    assert model.SerializeToString() == before
    assert [plan.nodes for plan in found.plans] == [("neg", "abs")]


def test_a_match_that_would_emit_a_forbidden_op_is_refused_with_the_reason_and_the_next_rule_tried():
    class ReluAsClip(Rule):
        op, name, emits = "Relu", "relu-as-clip", ("Clip",)

        def match(self, node, view):
            return Match((node,))

        def build(self, match, out):
            out.node("Clip", [match.input(0), out.const(np.zeros((), np.float32), "low")], outputs=match.outputs())

    found = _pass(ReluAsMax(), ReluAsClip()).find(_neg_abs(), FixOptions(forbidden_ops=("Max",)))
    assert [plan.action for plan in found.plans] == ["relu-as-clip"]
    refused = _pass(ReluAsMax()).find(_neg_abs(), FixOptions(forbidden_ops=("Max",)))
    assert not refused.plans
    assert refused.reason("relu") == "relu-as-max would emit Max, which the target forbids"


class _Broken(Rule):
    op, name, emits = "Relu", "broken", ("Max",)

    def __init__(self, how):
        self.how = how

    def match(self, node, view):
        return Match((node,))

    def build(self, match, out):
        if self.how == "raises":
            raise ValueError("no")
        if self.how == "undeclared":
            out.node("Min", [match.input(0), match.input(0)], outputs=match.outputs())
        if self.how == "unwritten":
            out.node("Max", [match.input(0), match.input(0)])


@pytest.mark.parametrize("how, message", [("raises", "no"), ("undeclared", "emitted ['Min']"),
                                          ("unwritten", "left ['y'] unwritten")])
def test_a_failing_build_leaves_the_model_as_it_was(how, message):
    """Every plan is built before anything is edited: the first plan (neg-abs) is not applied either."""
    model = _neg_abs()
    before = model.SerializeToString()
    with pytest.raises((ValueError, AssertionError), match=message.replace("[", r"\[").replace("]", r"\]")):
        _pass(NegAbsToAbs(), _Broken(how)).run(model, FixOptions())
    assert model.SerializeToString() == before


def test_a_node_two_matches_claim_goes_to_the_first():
    class AbsRelu(Rule):
        """Relu(Abs(x)) = Abs(x): a chain anchored at the Relu that reaches back to the Abs neg-abs took."""

        op, name, emits = "Relu", "abs-relu", ("Abs",)

        def match(self, node, view):
            return Match((node, view.index.producer[node.input[0]]))

        def build(self, match, out):
            out.node("Abs", [match.input(0, node=1)], outputs=match.outputs())

    found = _pass(NegAbsToAbs(), AbsRelu()).find(_neg_abs(), FixOptions())
    assert [plan.action for plan in found.plans] == ["neg-abs"]
    assert found.reason("abs") is None  # part of a plan: no rejection
    assert "rewritten by another plan" in found.reason("relu")


def test_a_pass_the_run_does_not_ask_for_finds_nothing():
    assert not _pass(ReluAsMax(), applies=False).find(_neg_abs(), FixOptions()).plans


def test_emit_names_stay_unique_within_one_build():
    index_model = _neg_abs()

    class TwoMax(Rule):
        op, name, emits = "Relu", "two-max", ("Max",)

        def match(self, node, view):
            return Match((node,))

        def build(self, match, out: Emit):
            zero = out.const(np.zeros((), np.float32), "zero")
            first = out.node("Max", [match.input(0), zero])
            out.node("Max", [first, out.const(np.zeros((), np.float32), "zero")], outputs=match.outputs())

    _pass(TwoMax()).run(index_model, FixOptions())
    names = [n.name for n in index_model.graph.node] + [t.name for t in index_model.graph.initializer]
    assert len(names) == len(set(names))
    onnx.checker.check_model(index_model, full_check=True)


def test_view_only_reader():
    from onnx_npu_fix.ir.graph import GraphIndex

    model = _neg_abs()
    view = View(GraphIndex(model), FixOptions(), 17)
    neg, abs_, relu = model.graph.node
    assert view.only_reader("n", abs_) and not view.only_reader("n", relu)
    assert not view.only_reader("y", relu)  # a graph output is never swallowed by a chain


def test_every_lowering_rule_that_approximates_declares_its_bound():
    from onnx_npu_fix.passes.lower_ops import lowering_rules

    for rule in lowering_rules():
        assert rule.exact == (rule.bound is None), (rule.name, rule.exact, rule.bound)
        assert rule.bound is None or rule.bound > 0, rule.name
