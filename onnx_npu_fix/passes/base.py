"""The contract between a pass and the pass manager.

A pass is an object with ``name``, ``summary``, ``exact``, ``keeps_shapes`` and
``run(model, options) -> PassResult``. ``run`` edits the model in place (the manager keeps what it needs for
rollback), never runs onnxruntime and never prints. A built-in pass splits it in two:

* ``find(model, options) -> Found`` only reads: :attr:`Found.plans` are the edits it would make, one typed plan
  per edit (a subclass of :class:`Plan` per pass, naming the node(s) it fixes and holding everything the edit
  needs); :attr:`Found.rejections` every candidate it leaves alone, with a reason; :attr:`Found.warnings` and
  :attr:`Found.metrics` what finding measured for the report. ``--check`` asks it which violations the pass
  fixes (constraints/fixed_by.py), so the check's ``fixed_by`` cannot disagree with the pass.
* ``rewrite(model, options, found) -> PassResult`` applies exactly ``found.plans`` (found on this same model) —
  no other edit, no candidate decided again — and returns a :class:`Change` per edit, with what finding
  reported (:meth:`Found.report`).

``Pass.run`` is ``rewrite(model, options, find(model, options))``. A plugin pass may implement only ``run``: its
``find`` then says it does not know (``Found.known`` False) and ``--check`` names no pass for it.

What a pass is for is declared in its own file, as data the rest of npufix derives its answers from:

* ``fixes``: the constraints it fixes (:class:`Fixes`, by the constraint's name in constraints/table.py, narrowed
  to op types where it fixes only some). The constraint table's "fixed by", which passes ``--check`` asks about
  a violation, and what a run promises to fix are derived from these; several passes may fix one constraint.
* ``forms``: the options (profile / emission keys) that choose how it writes what it emits (:class:`Form`): which
  op types a key shapes, the alternatives worth trying and how costly a change of it is, and (:class:`Fact`) the
  op forms in a model that the key would write another way. ``--judge``'s form search and ``npufix reduce``'s
  record read these.
* ``bound`` (an approximate pass): how far its rewrite may move the output of a node it changes approximately,
  as a function of that node's input (:class:`Bound`), derived from the math of the rewrite.

What a pass declares, the manager checks when it runs it (pipeline/scheduler.py): ``run`` returns a
:class:`PassResult` and keeps the graph's input and output names; a ``keeps_shapes`` pass leaves every surviving
tensor's recorded type and shape as it was; an ``exact`` pass is validated with the exact criterion unless its
result says this run was not exact (``metrics["exact"]`` False, a change with ``detail["exact"]`` False, or
``quantized_tolerance``), and is then measured alone like an approximate one. A pass that breaks one of these
fails, named, like a pass that fails validation.

A pass whose candidates only appear after its own edits (fold-constants: inlining an If exposes new folds)
overrides ``run`` with rounds of find and rewrite, each round still finding read-only and applying exactly what
it found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.ir.ops import is_default_domain


@dataclass(frozen=True)
class Fixes:
    """A constraint a pass fixes: its name (a row of the constraint table), the op types it fixes it at (empty:
    any), and how ``--check`` confirms it for one violation."""

    constraint: str
    ops: tuple[str, ...] = ()
    """Only at nodes of these op types (fold-batchnorm fixes ``forbidden-op`` for BatchNormalization only)."""
    upstream: bool = False
    """The fix happens upstream of the violating node (fold-constants folds the Shape chain feeding a Reshape, not
    the Reshape): the pass fixes a violation when it is gone once the pass has run on a copy, not when its find
    plans the node."""
    asked: bool = True
    """False: whether the pass fixes a violation is decided where it is found, from the analysis the pass itself
    uses (reorder-memory's order search, fold-constants' control-flow folding), not by asking its find."""
    note: str = ""
    """How the constraint table's "fixed by" qualifies the pass (markdown): ``dilated-conv (<note>)``."""


@dataclass(frozen=True)
class Fact:
    """An op form in a model (one npufix did not emit) that a :class:`Form`'s key would write another way."""

    op: str
    text: str
    """What the form is, with ``{}`` for the value :attr:`test` found."""
    test: Callable[[GraphIndex, onnx.NodeProto, FixOptions], Any]
    """The value that makes ``node`` this form under ``options``, or None when it is not."""

    def describe(self, value: Any, key: str) -> str:
        return f"{self.text.format(value)}; profile key {key}"


@dataclass(frozen=True)
class Form:
    """An option that chooses how a pass writes what it emits: the profile / emission key, the op types of the
    nodes it shapes, what it chooses, how costly changing it is, and what to try instead of its value."""

    key: str
    """A FixOptions field."""
    emits: tuple[str, ...]
    """The op types of the nodes the pass emits whose form the key chooses."""
    text: str
    """What the key chooses (the record's and the docs' wording)."""
    cost: int
    """How much of a model a change of the key rewrites: the form search tries the cheapest keys first (folding a
    Pad away touches one node; another channel alignment, every conv)."""
    values: Callable[[Any, Sequence[onnx.NodeProto]], list[Any]] | None = None
    """The values worth trying instead of the current one, given the nodes of the region a compiler rejects; None:
    the other choices of a choice option, the other boolean (judge/forms.py)."""
    facts: tuple[Fact, ...] = ()
    """Op forms in a model the pass did not emit that this key would write another way."""


@dataclass(frozen=True)
class Bound:
    """How far an approximate pass may move the output of a node it rewrites approximately (a node its result
    lists in ``metrics["approximate_nodes"]`` or in a change with ``detail["exact"]`` False): ``max |y' - y| <=
    limit(index, node, x)``, with ``y`` the node's first output before the pass, ``y'`` the tensor of that name
    after it, and ``x`` the value its first input took on the same inputs (``index``: the model before the pass,
    ``node`` in it). ``limit`` returns None when it cannot bound this node (its shapes are not static).

    It is a fact about one node, where the math of the rewrite holds, not about the graph outputs: the layers after
    the node may amplify a deviation. The pass manager judges a run at the outputs (``--max-approx-error``);
    tests/test_fuzz.py checks this bound on every node the fuzz rewrites approximately, and that the rest of the
    rewrite is exact."""

    text: str
    """The bound in words (its derivation is in the pass's module docstring)."""
    limit: Callable[[GraphIndex, onnx.NodeProto, np.ndarray], float | None]


@dataclass
class Change:
    """One edit: which node, what kind of edit, and old -> new values where that means something."""

    node: str
    op: str
    action: str
    old: Any = None
    new: Any = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "op": self.op, "action": self.action}
        if self.old is not None:
            out["old"] = self.old
        if self.new is not None:
            out["new"] = self.new
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class Rejection:
    """A candidate the pass left alone, and why. ``blocking`` means a constraint stays violated."""

    node: str
    op: str
    reason: str
    blocking: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "op": self.op, "reason": self.reason, "blocking": self.blocking}


@dataclass
class PassResult:
    changes: list[Change] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    """Pass-specific figures for the report (e.g. MACs before/after, weight bytes added)."""
    warnings: list[str] = field(default_factory=list)
    quantized_tolerance: bool = False
    """Set by an exact pass whose rewrite this run removed a rounding step of a quantized model (e.g. a BN folded
    into a QDQ conv's weight scale): each tensor it rewrote is within a quantization step of the original, not
    bit for bit, and the steps add up through the layers after it. The manager then never reports it exact:
    it is measured alone like an approximate pass (``max_approx_error``), with its outputs' step counts."""

    @property
    def changed(self) -> bool:
        return bool(self.changes)


@dataclass
class Plan:
    """One edit :meth:`Pass.find` would make: the node(s) it fixes and what it does to them. A pass subclasses it
    with typed fields for what its rewrite needs to apply the edit."""

    nodes: tuple[str, ...]
    action: str
    leaves: frozenset[str] = field(default=frozenset(), kw_only=True)
    """Constraints (by name) still violated on ``nodes`` once the plan is applied: a plan can touch a node
    without fixing every constraint on it (align-channels carrying padding across a Concat whose inputs then
    still miss --concat-align). ``--check`` then names no pass for that violation."""


@dataclass
class Found:
    """What a pass's read-only :meth:`Pass.find` saw: the edits it would make and the candidates it refuses."""

    plans: list[Plan] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    known: bool = True
    """False for a pass that only implements ``run`` (plugins): nothing is known about what it would do."""
    warnings: list[str] = field(default_factory=list)
    """What finding noticed for the report that is no rejection (e.g. a form it could not use)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Figures finding measured for the report (e.g. peaks before and after, nodes counted)."""

    def report(self) -> PassResult:
        """A result holding what finding reported (rejections, warnings, metrics), for rewrite to add its
        changes to."""
        return PassResult(rejections=list(self.rejections), metrics=dict(self.metrics),
                          warnings=list(self.warnings))

    def planned(self) -> set[str]:
        """The names of every node some plan fixes."""
        return {name for plan in self.plans for name in plan.nodes}

    def left_violated(self) -> set[tuple[str, str]]:
        """(node, constraint) for every constraint a plan leaves violated on a node it touches."""
        return {(node, constraint) for plan in self.plans if plan.leaves for node in plan.nodes
                for constraint in plan.leaves}

    def reason(self, node: str) -> str | None:
        """Why the pass leaves ``node`` alone, if it said (its first reason)."""
        return self.reasons().get(node)

    def reasons(self) -> dict[str, str]:
        """The first reason of every node the pass gave one for, in one walk over the rejections."""
        by_node: dict[str, str] = {}
        for rejection in self.rejections:
            by_node.setdefault(rejection.node, rejection.reason)
        return by_node

    @classmethod
    def unknown(cls) -> Found:
        return cls(known=False)



class Pass:
    """Base class for passes; subclasses set the class attributes and implement :meth:`find` and
    :meth:`rewrite` (or, for a plugin pass, only :meth:`run`)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    exact: ClassVar[bool] = True
    """False for approximate rewrites: validated against ``--max-approx-error`` instead of rtol/atol. A pass
    declared exact whose result says a run was not (see the module docstring) is measured like an approximate
    one for that run."""
    keeps_shapes: ClassVar[bool] = False
    """True when every tensor that survives the pass keeps its type and shape (removals and renames only, e.g.
    a BatchNorm folded into its Conv): the manager then reuses the recorded shapes instead of inferring them
    again, unless the pass created a tensor without one. The manager checks the claim against the types on record
    before the pass (a broken claim fails the pass); tests/test_pipeline.py checks it against fresh inference."""
    fixes: ClassVar[tuple[Fixes, ...]] = ()
    """The constraints this pass fixes (the module docstring)."""
    forms: ClassVar[tuple[Form, ...]] = ()
    """The options that choose how it writes what it emits (the module docstring)."""
    bound: ClassVar[Bound | None] = None
    """An approximate pass's bound on the nodes it rewrites approximately (:class:`Bound`); None for an exact pass
    (its bound is the exact tolerance) and for a plugin that declares none."""
    find_reads_stubs: ClassVar[bool] = False
    """True when :meth:`find` reads initializer values only through ``GraphIndex.const_value``: ``--check`` may
    then hand it its shape-only analysis copy under ``graph.values_from`` instead of a full copy of the weights."""

    def may_change(self, model: onnx.ModelProto, options: FixOptions) -> bool:
        """A cheap read-only look: False when :meth:`run` surely changes nothing here. The manager asks an
        approximate pass first, so that it validates the exact passes before it only when it must (and if a pass
        says False wrongly, its change is still measured alone)."""
        return True

    def find(self, model: onnx.ModelProto, options: FixOptions) -> Found:
        """Read-only: the edits :meth:`rewrite` would make on ``model``, and the candidates it refuses with a
        reason. ``model`` is not modified. The default knows nothing (a pass that only implements ``run``)."""
        return Found.unknown()

    def find_each(self, model: onnx.ModelProto, options: FixOptions, op_type: str,
                  plan_of: Callable[[GraphIndex, onnx.NodeProto], Plan | str | None]) -> Found:
        """The find of a pass that judges the default-domain ``op_type`` nodes one at a time: nothing when
        :meth:`may_change` says so; else, per node, ``plan_of``'s plan, or its reason for refusing the node
        (a rejection), or None for a node that is no candidate."""
        found = Found()
        if not self.may_change(model, options):
            return found
        index = GraphIndex.of(model)  # the pass manager's, when the passes before this one changed nothing
        for node in model.graph.node:
            if node.op_type != op_type or not is_default_domain(node):
                continue
            outcome = plan_of(index, node)
            if isinstance(outcome, str):
                found.rejections.append(Rejection(node.name, node.op_type, outcome))
            elif outcome is not None:
                found.plans.append(outcome)
        return found

    def rewrite(self, model: onnx.ModelProto, options: FixOptions,
                found: Found) -> PassResult:  # pragma: no cover - abstract
        """Apply ``found`` (from :meth:`find` on this same ``model``) in place; a Change per edit."""
        raise NotImplementedError

    def run(self, model: onnx.ModelProto, options: FixOptions) -> PassResult:
        """Find, then rewrite: what the pass manager calls."""
        return self.rewrite(model, options, self.find(model, options))

    def __repr__(self) -> str:
        return f"<pass {self.name}>"

