"""The record of a reduction (``npufix reduce --report``) and, for each node left, the npufix fact it most likely
trips: a constraint ``--check`` finds on the minimal model (constraints/'s table, with the run's
options or target) or an *emission fact* — an op form that npufix's passes can emit in another way, with the
profile key that chooses the form (each pass's ``forms``, passes/base.py)."""

from __future__ import annotations

from typing import Any

import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints import check_model, shape_listing
from onnx_npu_fix.ir.graph import GraphIndex
from onnx_npu_fix.judge.reduce import Reduction
from onnx_npu_fix.passes.base import Fact

REPORT_VERSION = 1


def emission_facts() -> list[tuple[str, Fact]]:
    """(profile key, fact) for every op form a built-in pass declares it can write another way (``Pass.forms``)."""
    from onnx_npu_fix.passes import PASSES

    return [(form.key, fact) for cls in PASSES.values() for form in cls.forms for fact in form.facts]


def matching_facts(index: GraphIndex, node: onnx.NodeProto, options: FixOptions) -> list[tuple[str, str]]:
    """(profile key, what the form is) for every emission fact ``node`` matches under ``options``."""
    matches = []
    for key, fact in emission_facts():
        if fact.op != node.op_type:
            continue
        try:
            value = fact.test(index, node, options)
        except Exception:  # noqa: BLE001 - a hint never stops the record (a malformed node, missing shape)
            value = None
        if value is not None:
            matches.append((key, fact.describe(value, key)))
    return matches


def likely_causes(model: onnx.ModelProto, options: FixOptions) -> dict[str, list[str]]:
    """Per node name of ``model`` (static shapes, inferred): the constraints ``--check`` finds there with
    ``options``, then the emission facts that match it."""
    causes: dict[str, list[str]] = {}
    try:
        violations = check_model(model, options, memory=False).violations
    except Exception:  # noqa: BLE001 - a hint must never cost the user a reduction that took hours of compiles
        violations = []
    for violation in violations:
        causes.setdefault(violation.node, []).append(violation.text())
    index = GraphIndex(model)
    for node in model.graph.node:
        for _, text in matching_facts(index, node, options):
            causes.setdefault(node.name, []).append(text)
    return causes


def _attribute(attribute: onnx.AttributeProto) -> Any:
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return {"tensor": list(value.dims)}
    if isinstance(value, onnx.GraphProto):
        return {"graph": value.name, "nodes": len(value.node)}
    if isinstance(value, list):
        return [_attribute_item(v) for v in value]
    return value


def _attribute_item(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (onnx.TensorProto, onnx.GraphProto)):
        return type(value).__name__
    return value


def remaining_nodes(model: onnx.ModelProto, options: FixOptions) -> list[dict[str, Any]]:
    """Each node of the minimal model: name, op, attributes, input / output shapes, likely causes."""
    causes = likely_causes(model, options)
    attributes = {node.name: {a.name: _attribute(a) for a in node.attribute} for node in model.graph.node}
    return [{**entry.to_json(), "attributes": attributes.get(entry.name, {}), "likely": causes.get(entry.name, [])}
            for entry in shape_listing(model)]


def reduction_record(reduction: Reduction, options: FixOptions, *, command: str, input_path: str,
                     output: str | None, min_good: str | None, seconds: float) -> dict[str, Any]:
    """The ``--report`` JSON of a reduction."""
    return {
        "report_version": REPORT_VERSION,
        "mode": "reduce",
        "input": input_path,
        "output": output,
        "min_good": min_good,
        "judge": command,
        "signature": reduction.signature,
        "nodes_before": reduction.nodes_before,
        "nodes_after": reduction.nodes_after,
        "steps": reduction.steps,
        "judge_calls": reduction.calls,
        "cached": reduction.cached,
        "unbuildable": reduction.unbuildable,
        "timeouts": reduction.timeouts,
        "other_failures": reduction.other_failures,
        "judge_seconds": round(reduction.judge_seconds, 3),
        "seconds": round(seconds, 3),
        "nodes": remaining_nodes(reduction.model, options),
        "trials": [t.to_json() for t in reduction.trials],
    }
