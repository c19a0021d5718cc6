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
from typing import ClassVar

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.passes import lowering
from onnx_npu_fix.passes.base import Fixes
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


class LowerOpsPass(RulePass):
    """A forbidden op -> the ops of its first lowering whose ops the target accepts (exact, or bounded)."""

    name = "lower-ops"
    summary = "an op type the target forbids (forbidden_ops) is rewritten into ops it accepts"
    exact = True
    rules: ClassVar[tuple[Rule, ...]] = lowering_rules()
    fixes = (Fixes("forbidden-op", ops=lowered_ops(), note="for the op types it lowers (docs/passes.md); a "
                   "lowering that needs another forbidden op is refused with that reason"),)

    def applies(self, options: FixOptions) -> bool:
        return bool(options.forbidden_ops)

    def wants(self, rule: Rule, options: FixOptions) -> bool:
        return rule.op in options.forbidden_ops
