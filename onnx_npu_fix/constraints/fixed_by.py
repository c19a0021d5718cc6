"""Which pass fixes a violation, asked from the passes themselves.

A check (constraints/checks.py) names a violation's candidates: the passes that declare they fix its constraint
at that op type (``Pass.fixes``, :func:`~onnx_npu_fix.constraints.table.responsible`). :func:`ask_passes` then
asks each candidate's read-only ``find`` — once per pass, only when a violation it is a candidate for exists —
whether the violating node is in its plans; the first that plans it is ``fixed_by``. A constraint fixed upstream
of its node (``Fixes.upstream``: fold-constants folds the Shape chain feeding a Reshape) is fixed when the
violation is gone once the pass has run on a copy. When no candidate fixes it, the violation says "no pass fixes
this" with each candidate's reason. tests/test_fixed_by.py checks the answers against the finds and against
running the passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints.report import Violation
from onnx_npu_fix.constraints.table import declaration
from onnx_npu_fix.ir.graph import GraphIndex, values_from
from onnx_npu_fix.ir.ops import CONTROL_FLOW_OPS, is_default_domain
from onnx_npu_fix.passes.base import Found

Recheck = Callable[[onnx.ModelProto, FixOptions], list[Violation]]
"""The violations of a model with these options, no pass asked (checks.check_model without asking)."""


@dataclass
class Asked:
    """A violation whose ``fixed_by`` waits for its candidates' finds (:func:`ask_passes`)."""

    violation: Violation
    candidates: tuple[str, ...]


@dataclass
class _Facts:
    """One find's answers by node: :meth:`Found.planned`, :meth:`Found.left_violated`, the first reason per node
    (:meth:`Found.reason`)."""

    planned: set[str]
    left_violated: set[tuple[str, str]]
    reasons: dict[str, str]


@dataclass
class _Answers:
    """What each asked pass said, each asked once: its plans, its find (None: it failed, ``failure`` says why)."""

    model: onnx.ModelProto
    light: onnx.ModelProto
    index: GraphIndex
    options: FixOptions
    recheck: Recheck
    finds: dict[str, tuple[Found | None, str]] = field(default_factory=dict)
    remaining: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    full: onnx.ModelProto | None = None
    facts: dict[str, _Facts] = field(default_factory=dict)

    def facts_of(self, name: str, found: Found) -> _Facts:
        """``found``'s plans and reasons as sets and maps, made once per pass: every violation asks them."""
        if name not in self.facts:
            self.facts[name] = _Facts(found.planned(), found.left_violated(), found.reasons())
        return self.facts[name]

    def found(self, name: str) -> tuple[Found | None, str]:
        if name not in self.finds:
            from onnx_npu_fix.passes import PASSES

            the_pass = PASSES[name]()
            try:
                if the_pass.find_reads_stubs:
                    with values_from(self.light, self.model, self.index):
                        self.finds[name] = (the_pass.find(self.light, self.options), "")
                else:
                    self.finds[name] = (the_pass.find(self.find_model(), self.options), "")
            except Exception as exc:  # noqa: BLE001 - a find that fails answers "not fixed", with why
                self.finds[name] = (None, f"its find failed: {type(exc).__name__}: {exc}".splitlines()[0])
        return self.finds[name]

    def find_model(self) -> onnx.ModelProto:
        if self.full is None:
            self.full = find_model(self.model, self.light)
        return self.full

    def left_after(self, name: str) -> set[tuple[str, str]]:
        if name not in self.remaining:
            self.remaining[name] = remaining_after(name, self.find_model(), self.options, self.recheck)
        return self.remaining[name]


def find_model(model: onnx.ModelProto, light: onnx.ModelProto) -> onnx.ModelProto:
    """What the pass manager hands a pass (frozen input shapes, named nodes, inferred shapes: ``light``), with the
    initializer data the light copy left out put back from ``model``: for a find that reads weight values other
    than through ``GraphIndex.const_value`` (``Pass.find_reads_stubs``), and for :func:`remaining_after`."""
    if light is model:
        return model
    full = onnx.ModelProto()
    full.CopyFrom(light)
    originals = {t.name: t for t in model.graph.initializer}
    for t in full.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL and t.name in originals:
            t.CopyFrom(originals[t.name])
    return full


def remaining_after(name: str, full: onnx.ModelProto, options: FixOptions,
                    recheck: Recheck) -> set[tuple[str, str]]:
    """The (node, constraint) violations left once pass ``name`` has run (all its rounds: fold-constants
    converges in rounds of find and rewrite) on a copy of what the finds read. How a constraint fixed upstream
    of its node is judged; only asked when such a violation exists."""
    from onnx_npu_fix.passes import PASSES

    work = onnx.ModelProto()
    work.CopyFrom(full)
    try:
        PASSES[name]().run(work, options)
    except Exception:  # noqa: BLE001 - a pass that fails leaves every violation in place
        work = full
    return {(v.node, v.constraint) for v in recheck(work, options)}


def ask_passes(model: onnx.ModelProto, light: onnx.ModelProto, index: GraphIndex, options: FixOptions,
               asked: list[Asked], recheck: Recheck) -> None:
    """Settle each asked violation's ``fixed_by``: its first candidate whose find fixes it (module docstring), or
    None with every candidate's reason in its message. The finds run on the model as given (each pass alone, not
    after the passes before it in the order)."""
    answers = _Answers(model, light, index, options, recheck)
    for entry in asked:
        violation = entry.violation
        reasons = []
        for name in entry.candidates:
            reason = _reason_not_fixed(answers, name, violation)
            if reason is None:
                violation.fixed_by = name
                break
            reasons.append(f"{name}: {reason}")
        else:
            violation.fixed_by = None
            violation.message = "; ".join([violation.message, *reasons])
            if violation.constraint == "leftover-op":
                _behind_control_flow(light, index, violation)


def _reason_not_fixed(answers: _Answers, name: str, violation: Violation) -> str | None:
    """None when pass ``name`` fixes ``violation``, else why not (its rejection reason where it gave one)."""
    found, failure = answers.found(name)
    if found is None:
        return failure
    fix = declaration(violation.constraint, name)
    if fix is not None and fix.upstream:
        if (violation.node, violation.constraint) not in answers.left_after(name):
            return None
        return "rewrites it, but the violation remains"
    facts = answers.facts_of(name, found)
    if violation.node in facts.planned:
        # A plan may touch a node without fixing every constraint on it (a Concat the padding crosses): the find
        # says so in the plan (Plan.leaves).
        if (violation.node, violation.constraint) not in facts.left_violated:
            return None
        return "rewrites it, but the violation remains"
    return facts.reasons.get(violation.node) or "finds no rewrite for it"


def _behind_control_flow(light: onnx.ModelProto, index: GraphIndex, violation: Violation) -> None:
    """A Dropout / Identity behind an If / Loop output: cleanup (re-run by fold-constants) removes it once that
    folds, so what folds the If / Loop fixes it."""
    node = next((n for n in light.graph.node if n.name == violation.node), None)
    producer = index.producer.get(node.input[0]) if node is not None and node.input else None
    if producer is not None and producer.op_type in CONTROL_FLOW_OPS and is_default_domain(producer):
        violation.fixed_by = control_flow_fix(index, producer)[0]
        violation.message += f"; it goes once {producer.name} ({producer.op_type}) is folded"


def control_flow_fix(index: GraphIndex, node: onnx.NodeProto) -> tuple[str | None, str]:
    """(what folds this onnx If / Loop / Scan — fold-constants, "--freeze-input sr=<value>", ... or None, why)."""
    from onnx_npu_fix.passes.fold_constants import control_flow_fix as fold_constants_answer

    return fold_constants_answer(index, node)
