"""Pass ``lower-ops``: an op type the target forbids (``forbidden_ops``) is rewritten into ops it accepts.

    X -> HardSwish -> Y        becomes   X -> HardSigmoid(1/6, 1/2) -> Mul(X, .) -> Y   (or a Clip / Min-Max form)

Each lowering is a rule of the rule layer (passes/rules.py), one file per op under ``passes/lowering/``, whose
docstring states its identity; the rules are found there by :func:`lowering_rules` (every module's ``RULES``, in
file order, so adding a lowering is its file and its test). Only the anchors the target forbids are rewritten,
each by the first of its rules whose replacement emits no op the target forbids too; where every form of it
would, the node is left with that reason (``--check`` then says "no pass fixes this", naming it). A rule is exact
where its identity holds in floating point term by term, and declares a bound where it does not (its changes are
then measured against ``--max-approx-error``, as every approximate change). In a QDQ model the replacement stands
where the op stood, between the same DequantizeLinear and QuantizeLinear, so the lowered ops stay inside the Q/DQ
unit and no rounding step is added or removed.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Sequence
from typing import ClassVar

import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.passes import lowering
from onnx_npu_fix.passes.base import Fact, Fixes, Form
from onnx_npu_fix.passes.rules import Rule, RulePass


@functools.cache
def lowering_rules() -> tuple[Rule, ...]:
    """Every lowering rule: the ``RULES`` of each module of ``passes/lowering/``, modules in name order."""
    rules: list[Rule] = []
    for info in sorted(pkgutil.iter_modules(lowering.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{lowering.__name__}.{info.name}")
        rules.extend(getattr(module, "RULES", ()))
    return tuple(rules)


def lowered_ops() -> tuple[str, ...]:
    """The op types some lowering rule rewrites."""
    return tuple(dict.fromkeys(rule.op for rule in lowering_rules()))


def _forbid_one_more(current: tuple[str, ...], region: Sequence[onnx.NodeProto]) -> list[tuple[str, ...]]:
    """``forbidden_ops`` values worth trying: the current ones and one more op type of the region that a rule
    lowers (a compiler that says "op X is not supported" gets X lowered), or that the form of an op forbidden
    already emits (its lowering's next form is then taken: HardSigmoid refused -> HardSwish's Clip form)."""
    avoidable = set(lowered_ops()) | {op for rule in lowering_rules() if rule.op in current for op in rule.emits}
    found = dict.fromkeys(n.op_type for n in region if n.op_type in avoidable and n.op_type not in current)
    return [(*current, op) for op in found]


def _lowerable(index: GraphIndex, node: onnx.NodeProto, options: FixOptions) -> str | None:
    """The op type of a node lower-ops would rewrite if the target forbade it, or None."""
    return node.op_type if node.op_type not in options.forbidden_ops else None


def _forms() -> tuple[Form, ...]:
    # The lowered ops are of the nodes it chooses the form of too: kept as they are, or lowered.
    emitted = tuple(dict.fromkeys([*lowered_ops(), *(op for rule in lowering_rules() for op in rule.emits)]))
    facts = tuple(Fact(op, "{} (lower-ops rewrites it into other ops where the target forbids it)", _lowerable)
                  for op in lowered_ops())
    return (Form("forbidden_ops", emitted, "which op types the target forbids, which lower-ops then rewrites into "
                 "the first of their forms whose ops the target accepts", cost=15, values=_forbid_one_more,
                 facts=facts),)


class LowerOpsPass(RulePass):
    """A forbidden op -> the ops of its first lowering whose ops the target accepts (exact, or bounded)."""

    name = "lower-ops"
    summary = "an op type the target forbids (forbidden_ops) is rewritten into ops it accepts"
    exact = True
    rules: ClassVar[tuple[Rule, ...]] = lowering_rules()
    fixes = (Fixes("forbidden-op", ops=lowered_ops(), note="for the op types it lowers (docs/passes.md); a "
                   "lowering that needs another forbidden op is refused with that reason"),)
    forms = _forms()

    def applies(self, options: FixOptions) -> bool:
        return bool(options.forbidden_ops)

    def wants(self, rule: Rule, options: FixOptions) -> bool:
        return rule.op in options.forbidden_ops
