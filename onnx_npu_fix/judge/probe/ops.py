"""The op probes: ``forbidden_ops`` from the op types a judge rejects."""

from __future__ import annotations

import onnx

from onnx_npu_fix.judge.command import FAIL, TIMEOUT
from onnx_npu_fix.judge.probe import models as probe_models
from onnx_npu_fix.judge.probe.focus import QDQ_OPS
from onnx_npu_fix.judge.probe.prober import Call, Learned, Prober, ProbeResult


def probe_ops(prober: Prober, ops: dict[str, tuple[onnx.ModelProto, onnx.NodeProto] | None],
              result: ProbeResult, *, source: str) -> None:
    """``forbidden_ops``: the op types whose model alone the judge rejects (added to what is already learned).
    Quantization ops are left to ``allow_qdq`` where the QDQ probe decided it: a compiler that refuses quantized
    models is a ``quantized-input`` violation, not one to lower Q/DQ for (forbidding them would make every pass
    that keeps a model's QDQ units refuse to emit)."""
    forbidden = dict(result.learned.get("forbidden_ops", Learned("forbidden_ops", {}, "")).value)
    if "allow_qdq" in result.learned:
        ops = {op: example for op, example in ops.items() if op not in QDQ_OPS}
    for op, example in sorted(ops.items()):
        call = _ask_op(prober, op, example, source)
        if call is None:
            continue
        if call.verdict.kind == TIMEOUT:
            result.notes[f"op_{op}"] = f"not decided: the judge timed out on {op} alone ({call.evidence()})"
        elif call.verdict.kind == FAIL:
            forbidden[op] = f"{op} ({source}): {call.evidence()}"
    if forbidden:
        evidence = "probe op alone: " + "; ".join(forbidden.values())
        result.learned["forbidden_ops"] = Learned("forbidden_ops", forbidden, evidence)


def _ask_op(prober: Prober, op: str, example: tuple[onnx.ModelProto, onnx.NodeProto] | None,
            source: str) -> Call | None:
    if example is None:
        return prober.ask("op", {"op": op, "from": source}, probe_models.single_op(op))
    model, node = example
    try:
        alone = probe_models.extracted(model, node)
    except ValueError as exc:
        prober.result.unbuildable.append({"probe": "op", "params": {"op": op, "node": node.name}, "reason": str(exc)})
        return None
    return prober.ask("op", {"op": op, "from": source, "node": node.name}, alone)
