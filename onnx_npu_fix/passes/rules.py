"""The rule layer: a per-node rewrite written as a match and a replacement; naming, constants, placement, the
replacement itself and rollback are done here, once, for every rule.

    class SqueezeToReshape(Rule):
        op = "Squeeze"                        # the anchor: a default-domain node of this op type
        emits = ("Reshape",)                  # every op type its replacement may hold
        def match(self, node, view):          # read-only: a Match, a reason (refused), or None (no candidate)
            ...
            return Match((node,), shape=...)
        def build(self, match, out):          # the replacement, written through ``out``
            out.node("Reshape", [match.input(0), out.const(np.array(match.shape), "shape")],
                     outputs=match.outputs())

A :class:`Match` names the nodes it replaces (the anchor first, then any other node of a short chain, each read
by the chain alone) and carries what ``build`` needs. ``build`` writes through an :class:`Emit`: each node it adds
is named after the anchor (``<anchor>/<suffix>``, made unique) unless the rule names it, each constant becomes an
initializer named the same way, and the replacement writes the outputs of the nodes it replaces (``outputs``),
so every reader and every graph output keeps its tensor. :class:`RulePass` is a :class:`~passes.base.Pass` whose
find runs every rule on every node of its op (read-only; the first rule that matches wins, a match that would emit
a forbidden op type is refused with that reason and the next rule is tried) and whose rewrite builds every plan
before it edits anything: a rule that raises, or emits an op it did not declare, or leaves a replaced output
unwritten, fails the pass with the model as it was. The replacement then takes the place of the match's last
node in the graph (its inputs are all available there), and the constants only the replaced nodes read go with
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx import helper

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import GraphEditor, GraphIndex, drop_initializers, opset_version
from onnx_npu_fix.ir.ops import is_default_domain
from onnx_npu_fix.passes.base import Change, Found, Pass, PassResult, Plan, Rejection


class Match:
    """What a rule's match found: the nodes it replaces (the anchor first) and, as attributes, whatever its build
    needs (``Match((node,), shape=(1, 128))``)."""

    def __init__(self, nodes: Sequence[onnx.NodeProto], **found: Any) -> None:
        self.nodes = tuple(nodes)
        self.__dict__.update(found)

    @property
    def anchor(self) -> onnx.NodeProto:
        return self.nodes[0]

    def input(self, k: int, node: int = 0) -> str:
        """The name of input ``k`` of matched node ``node`` (the anchor by default)."""
        return self.nodes[node].input[k]

    def outputs(self) -> list[str]:
        """The tensors the replacement must write: the outputs of the matched nodes read outside the match (for a
        single node, its outputs; for a chain, its last node's)."""
        inside = {name for n in self.nodes for name in n.input}
        last = self.nodes[-1]
        return [name for n in self.nodes for name in n.output if name and (n is last or name not in inside)]


@dataclass(frozen=True)
class View:
    """What a rule's match may read: the index of the model (shapes, constants, consumers), the run's options and
    the model's default-domain opset."""

    index: GraphIndex
    options: FixOptions
    opset: int

    def only_reader(self, name: str, node: onnx.NodeProto) -> bool:
        """``node`` is the one reader of ``name``, and ``name`` is no graph output (a chain may swallow it)."""
        return name not in self.index.output_set and self.index.single_consumer(name) is node


class Rule:
    """One rewrite of a node (or a short chain anchored at it): see the module docstring."""

    op: ClassVar[str]
    """The op type of the anchor (default domain)."""
    name: ClassVar[str]
    """What the rewrite is called in the record (the action of its Change)."""
    emits: ClassVar[tuple[str, ...]]
    """Every op type the replacement may hold; a build that writes another fails the pass."""
    exact: ClassVar[bool] = True
    """False: the replacement approximates the anchor; the change is then measured, with ``bound``."""
    bound: ClassVar[float | None] = None
    """A rule that is not exact: the largest absolute difference between its replacement's output and the anchor's
    over every finite input, as its docstring derives and its test measures against onnxruntime; the change's
    ``detail["bound"]`` carries it (a rule that is not exact declares one)."""
    min_opset: ClassVar[int] = 1
    """The rule's anchor form exists from this opset on (the model's default-domain opset)."""

    def match(self, node: onnx.NodeProto, view: View) -> Match | str | None:  # pragma: no cover - abstract
        """Read-only: a Match, why the node is refused, or None when it is no candidate."""
        raise NotImplementedError

    def build(self, match: Match, out: Emit) -> None:  # pragma: no cover - abstract
        """Write the replacement of ``match.nodes`` through ``out``."""
        raise NotImplementedError

    def record(self, match: Match, ops: list[str]) -> dict[str, Any]:
        """What the record's Change says beyond the action: ``old``, ``new``, ``detail`` (by default the op types
        the replacement holds), and ``node`` / ``op`` when the change is better named by another matched node than
        the anchor (the Conv a Pad is folded into)."""
        return {"detail": {"ops": ops}}


class Emit:
    """Where a rule's build writes its replacement: nodes and constants, collected (nothing touches the model
    until every plan of the pass has built)."""

    def __init__(self, index: GraphIndex, match: Match) -> None:
        self._index, self.match = index, match
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[tuple[str, np.ndarray]] = []
        self._names: set[str] = set()

    def _fresh(self, base: str) -> str:
        name = self._index.unique_name(base)
        while name in self._names:  # unique_name does not see what this build named already
            name = self._index.unique_name(f"{base}_{len(self._names)}")
        self._names.add(name)
        return name

    def const(self, value: Any, suffix: str = "value", *, name: str | None = None) -> str:
        """A constant the replacement reads, as an initializer named ``<anchor>/<suffix>`` (or ``name``, made
        unique); returns its name."""
        tensor_name = self._fresh(name or f"{self.match.anchor.name}/{suffix}")
        self.constants.append((tensor_name, np.asarray(value)))
        return tensor_name

    def node(self, op: str, inputs: Sequence[str], *, outputs: Sequence[str] | None = None, suffix: str | None = None,
             name: str | None = None, domain: str = "", **attrs: Any) -> str:
        """Add a node; returns its (first) output's name. ``outputs`` default to one fresh tensor named after the
        node; ``name`` (e.g. the anchor's own, for a node that takes its place) is used as given, else
        ``<anchor>/<suffix or op>`` made unique."""
        node_name = name if name is not None else self._fresh(f"{self.match.anchor.name}/{suffix or op}")
        self._names.add(node_name)
        outs = list(outputs) if outputs is not None else [self._fresh(f"{node_name}_out")]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=node_name, domain=domain or None, **attrs))
        return outs[0]

    def like(self, node: onnx.NodeProto, *, inputs: Sequence[str] | None = None, **attrs: Any) -> str:
        """Add a copy of ``node`` (its name, op, outputs and attributes, in their order) with other ``inputs``
        and ``attrs`` set: a matched node that stays, changed; returns its first output."""
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        if inputs is not None:
            del copy.input[:]
            copy.input.extend(inputs)
        for key, value in attrs.items():
            for attribute in copy.attribute:
                if attribute.name == key:
                    copy.attribute.remove(attribute)
                    break
            copy.attribute.append(helper.make_attribute(key, value))
        self._names.add(copy.name)
        self.nodes.append(copy)
        return copy.output[0]


@dataclass(kw_only=True)
class RulePlan(Plan):
    """A rule's match, to be built and put in place of the matched nodes."""

    rule: Rule
    match: Match


@dataclass
class _Built:
    plan: RulePlan
    emit: Emit
    ops: list[str] = field(default_factory=list)


class RulePass(Pass):
    """A pass made of rules (the module docstring): subclasses set ``rules`` and may narrow :meth:`applies`."""

    rules: ClassVar[tuple[Rule, ...]] = ()

    def applies(self, options: FixOptions) -> bool:
        """Whether this run asks for the pass at all (a target's option); True by default."""
        return True

    def wants(self, rule: Rule, options: FixOptions) -> bool:
        """Whether this run asks for ``rule`` (lower-ops: only the rules of forbidden ops); True by default."""
        return True

    def may_change(self, model: onnx.ModelProto, options: FixOptions) -> bool:
        ops = {rule.op for rule in self.rules if self.wants(rule, options)}
        return self.applies(options) and bool(ops) and any(node.op_type in ops for node in model.graph.node)

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        found = Found()
        if not self.may_change(model, options):
            return found
        view = View(GraphIndex(model), options, opset_version(model))
        by_op: dict[str, list[Rule]] = {}
        for rule in self.rules:
            if view.opset >= rule.min_opset and self.wants(rule, options):
                by_op.setdefault(rule.op, []).append(rule)
        claimed: set[int] = set()
        for node in model.graph.node:
            rules = by_op.get(node.op_type)
            if rules and is_default_domain(node) and id(node) not in claimed:
                self._find_one(node, rules, view, found, claimed)
        return found

    def _find_one(self, node: onnx.NodeProto, rules: list[Rule], view: View, found: Found,
                  claimed: set[int]) -> None:
        """The first of ``rules`` that matches ``node`` becomes a plan; else a rejection with every reason."""
        reasons = []
        for rule in rules:
            outcome = rule.match(node, view)
            if outcome is None:
                continue
            if isinstance(outcome, str):
                reasons.append(outcome)
                continue
            forbidden = sorted(set(rule.emits) & set(view.options.forbidden_ops))
            if forbidden:
                reasons.append(f"{rule.name} would emit {', '.join(forbidden)}, which the target forbids")
                continue
            if any(id(n) in claimed for n in outcome.nodes):
                reasons.append(f"{rule.name}: a node of its match is rewritten by another plan")
                continue
            claimed.update(id(n) for n in outcome.nodes)
            found.plans.append(RulePlan(tuple(n.name for n in outcome.nodes), rule.name, rule=rule, match=outcome))
            return
        if reasons:
            found.rejections.append(Rejection(node.name, node.op_type, "; ".join(reasons)))

    def rewrite(self, model: onnx.ModelProto, options: FixOptions, found: Found) -> PassResult:
        result = found.report()
        if not found.plans:
            return result
        index = GraphIndex(model)
        built = [self._build(index, plan) for plan in found.plans]  # nothing is edited before all have built
        editor = GraphEditor(index)
        position = {id(node): k for k, node in enumerate(model.graph.node)}
        for one in built:
            match = one.plan.match
            for name, value in one.emit.constants:
                editor.add_initializer(name, value, exact_name=True)
            *others, last = sorted(match.nodes, key=lambda node: position[id(node)])
            editor.replace(last, one.emit.nodes)
            for node in others:
                editor.remove(node)
            result.changes.append(self._change(one))
        editor.commit()
        drop_initializers(model, _left_unread(index, built))
        return result

    @staticmethod
    def _build(index: GraphIndex, plan: Plan) -> _Built:
        assert isinstance(plan, RulePlan)
        emit = Emit(index, plan.match)
        plan.rule.build(plan.match, emit)
        ops = [node.op_type for node in emit.nodes]
        undeclared = sorted(set(ops) - set(plan.rule.emits))
        if undeclared:
            raise AssertionError(f"rule {plan.rule.name} emitted {undeclared}, which it does not declare")
        written = {name for node in emit.nodes for name in node.output}
        missing = [name for name in plan.match.outputs() if name not in written]
        if missing:
            raise AssertionError(f"rule {plan.rule.name} left {missing} unwritten")
        return _Built(plan, emit, ops)

    @staticmethod
    def _change(one: _Built) -> Change:
        """The record of one plan; an approximate rule's says so (``detail["exact"]`` False), which makes the
        manager measure the pass's run against its bound."""
        anchor, rule = one.plan.match.anchor, one.plan.rule
        said = rule.record(one.plan.match, one.ops)
        detail = dict(said.get("detail") or {})
        if not rule.exact:
            detail["exact"] = False
            detail["bound"] = rule.bound
        return Change(said.get("node", anchor.name), said.get("op", anchor.op_type), one.plan.action,
                      old=said.get("old"), new=said.get("new"), detail=detail)


def _left_unread(index: GraphIndex, built: list[_Built]) -> set[str]:
    """The initializers only the replaced nodes read and no replacement reads: a match's own constants (a Pad's
    pads, a Squeeze's axes), which go with it."""
    replaced = {id(node) for one in built for node in one.plan.match.nodes}
    still_read = {name for one in built for node in one.emit.nodes for name in node.input}
    candidates = {name for one in built for node in one.plan.match.nodes for name in node.input
                  if name in index.initializers and name not in still_read and name not in index.output_set}
    return {name for name in candidates if all(id(user) in replaced for user in index.consumers_of(name))}
