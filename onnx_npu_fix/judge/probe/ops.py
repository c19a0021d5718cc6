"""The op probes: ``forbidden_ops`` from the op types a judge rejects.

Each op type is first judged alone (its example node extracted from the model it occurs in, or a
models.single_op model). Some compilers decide where an op runs by what surrounds it: rknn-toolkit2 places a
Reshape, Unsqueeze or Div that is alone in a model on the CPU, and the same op between two Convs on the NPU; with a
judge that rejects CPU placement, the op alone is rejected although the compiler takes it in a real model. So an
op rejected alone is judged again inside its neighbours (models.in_context: the node with the producers of its
inputs and the consumers of its outputs, as they occur in the model), and it is forbidden only when the judge
rejects that too:

- accepted inside its neighbours: not forbidden; a ``[notes]`` line ``op_<type>`` keeps both verdicts;
- rejected, and the judge's output names one of the neighbours but not the node: not decided (the rejection may be
  the neighbour's), a ``[notes]`` line says so and the op is not forbidden;
- rejected otherwise, timed out, or not buildable inside its neighbours (or it has none): forbidden, with the
  verdicts as evidence.

An op type forbidden that way is judged again on other nodes of the type (:func:`reconsider`): the other --like
models' own, then the one npufix emits. A compiler may take one Div or Reshape and not another, and a forbidden
op stops every pass that would emit it; one accepted, and the op is a note, not a forbidden op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx

from onnx_npu_fix.judge.command import FAIL, PASS, TIMEOUT
from onnx_npu_fix.judge.probe import models as probe_models
from onnx_npu_fix.judge.probe.focus import QDQ_OPS
from onnx_npu_fix.judge.probe.prober import Call, Learned, Prober, ProbeResult

Example = tuple[onnx.ModelProto, onnx.NodeProto]
"""An op type's example: a model (static shapes, inferred) and the node of that type probed."""
OTHER_EXAMPLES = 3
"""How many other nodes of a forbidden op type :func:`reconsider` judges, at most (the judge-call budget)."""


def probe_ops(prober: Prober, ops: dict[str, Example | None], result: ProbeResult, *, source: str) -> None:
    """``forbidden_ops``: the op types the judge rejects alone and inside their neighbours (module docstring;
    added to what is already learned). Quantization ops are left to ``allow_qdq`` where the QDQ probe decided it:
    a compiler that refuses quantized models is a ``quantized-input`` violation, not one to lower Q/DQ for
    (forbidding them would make every pass that keeps a model's QDQ units refuse to emit)."""
    forbidden = _forbidden(result)
    if "allow_qdq" in result.learned:
        ops = {op: example for op, example in ops.items() if op not in QDQ_OPS}
    for op, example in sorted(ops.items()):
        verdict = _op_verdict(prober, op, example, source)
        if verdict is None:
            continue
        if verdict.forbidden is not None:
            forbidden[op] = verdict.forbidden
        if verdict.note is not None:
            result.notes[f"op_{op}"] = verdict.note
    _learn_forbidden(result, forbidden)


def reconsider(prober: Prober, examples: dict[str, list[Example]], result: ProbeResult, *, source: str) -> None:
    """An op type forbidden from one node is judged again on ``examples`` of it (up to :data:`OTHER_EXAMPLES`
    each): the other models' nodes of the type, or the node npufix emits (``source``). A compiler may run one
    Div or Reshape on the CPU and another on the NPU, and a forbidden op stops every pass that would emit it and
    marks every model that holds it. One accepted (alone or inside its neighbours): the op is not forbidden, and
    an ``op_<type>`` note keeps both findings (the rejected node may still be rejected by the compiler).
    Rejected, timed out or undecided there, the first node's rejection stands."""
    forbidden = _forbidden(result)
    for op, candidates in sorted(examples.items()):
        for example in candidates[:OTHER_EXAMPLES] if op in forbidden else ():
            verdict = _op_verdict(prober, op, example, source)
            if verdict is None or not verdict.accepted:
                continue  # rejected, timed out or undecided: the first node's rejection stands
            said = verdict.note or f"accepted alone ({verdict.alone.evidence()})"
            which = "npufix emits" if source == "npufix output" else "another model holds"
            result.notes[f"op_{op}"] = (f"not forbidden: {which} {op} ({example[1].name}): {said}; the rejected "
                                        f"one: {forbidden.pop(op)}")
            break
    _learn_forbidden(result, forbidden)


def _forbidden(result: ProbeResult) -> dict[str, str]:
    """The op types learned forbidden so far, each with its evidence (a copy to edit)."""
    learned = result.learned.get("forbidden_ops")
    return dict(learned.value) if learned is not None else {}


def _learn_forbidden(result: ProbeResult, forbidden: dict[str, str]) -> None:
    """``forbidden`` as the learned ``forbidden_ops`` (none left: the key goes)."""
    if not forbidden:
        result.learned.pop("forbidden_ops", None)
        return
    evidence = "probe op alone, then inside its neighbours: " + "; ".join(forbidden.values())
    result.learned["forbidden_ops"] = Learned("forbidden_ops", forbidden, evidence)


@dataclass(frozen=True)
class _OpVerdict:
    """What the op probes found for one example: its forbidden_ops evidence (None: not forbidden), its note, and
    whether the judge accepted it (alone or inside its neighbours: not undecided)."""

    alone: Call
    forbidden: str | None = None
    note: str | None = None
    accepted: bool = False


def _op_verdict(prober: Prober, op: str, example: Example | None, source: str) -> _OpVerdict | None:
    """The verdict on ``op`` from its example alone and, where rejected, inside its neighbours; None when the
    example could not be built."""
    alone = _ask_alone(prober, op, example, source)
    if alone is None:
        return None
    if alone.verdict.kind == TIMEOUT:
        return _OpVerdict(alone, None, f"not decided: the judge timed out on {op} alone ({alone.evidence()})")
    if alone.verdict.kind == FAIL:
        return _judged_in_neighbours(prober, op, example, source, alone)
    return _OpVerdict(alone, accepted=True)


def _ask_alone(prober: Prober, op: str, example: Example | None, source: str) -> Call | None:
    if example is None:
        return prober.ask("op", {"op": op, "from": source}, probe_models.single_op(op))
    model, node = example
    try:
        alone = probe_models.extracted(model, node)
    except ValueError as exc:
        prober.result.unbuildable.append({"probe": "op", "params": {"op": op, "node": node.name}, "reason": str(exc)})
        return None
    return prober.ask("op", {"op": op, "from": source, "node": node.name}, alone)


def _judged_in_neighbours(prober: Prober, op: str, example: Example | None, source: str,
                          alone: Call) -> _OpVerdict:
    """The verdict on an op rejected alone, as the module docstring says."""
    if example is None:
        return _OpVerdict(alone, f"{op} ({source}): alone {alone.evidence()}")
    model, node = example
    said_alone = f"{op} ({source}, {node.name}): alone {alone.evidence()}"
    around = probe_models.neighbours(model, node)
    if not around:
        return _OpVerdict(alone, said_alone + "; no neighbours to judge it among")
    types = ", ".join(n.op_type for n in around)
    params = {"op": op, "from": source, "node": node.name, "neighbours": types}
    try:
        context = probe_models.in_context(model, node)
    except ValueError as exc:
        prober.result.unbuildable.append({"probe": "op_in_neighbours", "params": params, "reason": str(exc)})
        return _OpVerdict(alone, said_alone + f"; inside its neighbours not built ({exc})")
    call = prober.ask("op_in_neighbours", params, context)
    if call is None:
        return _OpVerdict(alone, said_alone + "; inside its neighbours not built")
    inside = f"inside its neighbours {types} ({call.evidence()})"
    if call.verdict.kind == PASS:
        return _OpVerdict(alone, None, f"not forbidden: rejected alone ({alone.evidence()}), accepted {inside}", True)
    blamed = _names_only_neighbours(call, node, around) if call.verdict.kind == FAIL else []
    if blamed:
        return _OpVerdict(alone, None, f"not decided: rejected alone ({alone.evidence()}) and {inside}, but the "
                                       f"judge's output names {', '.join(blamed)}, not {node.name}")
    return _OpVerdict(alone, f"{said_alone}; {'timed out' if call.verdict.kind == TIMEOUT else 'rejected'} {inside}")


def _names_only_neighbours(call: Call, node: onnx.NodeProto, around: list[onnx.NodeProto]) -> list[str]:
    """The neighbours the judge's output names when it does not name ``node`` (empty otherwise)."""
    def named(name: str) -> bool:
        return bool(name) and re.search(rf"(?<![\w/.:-]){re.escape(name)}(?![\w/.:-])", call.verdict.output) is not None

    if named(node.name):
        return []
    return [n.name for n in around if named(n.name)]
