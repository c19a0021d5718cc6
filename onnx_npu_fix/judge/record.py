"""The record of a reduction (``npufix reduce --report``) and, for each node left, the npufix fact it most likely
trips: a constraint ``--check`` finds on the minimal model (constraints/'s table, with the run's
options or target) or an *emission fact* — an op form that npufix's passes can emit in another way, with the
profile key that chooses the form (``EMISSION_FACTS``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.constraints import check_model, shape_listing
from onnx_npu_fix.ir.graph import GraphIndex, conv_geometry, get_attr
from onnx_npu_fix.judge.reduce import Reduction

REPORT_VERSION = 1


@dataclass(frozen=True)
class EmissionFact:
    """An op form a compiler may reject that npufix emits, or can emit, in another form."""

    op: str
    text: str
    """What the form is, with ``{}`` for the value :attr:`test` found."""
    key: str | None
    """The profile key (FixOptions field) that chooses the form, when one does."""
    test: Callable[[GraphIndex, onnx.NodeProto], Any]
    """The value that makes ``node`` this form, or None when it is not."""

    def describe(self, value: Any) -> str:
        text = self.text.format(value)
        return f"{text}; profile key {self.key}" if self.key else text


def _rank(index: GraphIndex, name: str) -> int | None:
    shape = index.shape(name)
    return None if shape is None else len(shape)


def _rank3_pad(index: GraphIndex, node: onnx.NodeProto) -> int | None:
    return 3 if _rank(index, node.input[0]) == 3 else None


def _constant_pad_before_conv(index: GraphIndex, node: onnx.NodeProto) -> str | None:
    readers = index.consumers_of(node.output[0])
    pads = node.input[1] if len(node.input) > 1 else ""
    if pads and index.is_const(pads) and readers and all(r.op_type == "Conv" for r in readers):
        return readers[0].name
    return None


def _convtranspose_stride(index: GraphIndex, node: onnx.NodeProto) -> int | None:
    stride = max(get_attr(node, "strides", None) or [1])
    return stride if stride > 1 else None


def _conv1d(index: GraphIndex, node: onnx.NodeProto) -> int | None:
    return 1 if _rank(index, node.input[0]) == 3 else None


def _dilation(index: GraphIndex, node: onnx.NodeProto) -> int | None:
    dilation = max(conv_geometry(index, node).dilations or [1])
    return dilation if dilation > 1 else None


EMISSION_FACTS: tuple[EmissionFact, ...] = (
    EmissionFact("Pad", "rank-{} Pad (dilated-conv's remainder form: concat / pad4d avoid it)", "remainder_pad",
                 _rank3_pad),
    EmissionFact("Pad", "a Pad with constant pads before Conv {} (compilers fuse it into the Conv's pads; "
                 "rknn-toolkit2 2.5.0 crashes doing so; fold-pad-conv folds it first)", "fold_pad_into_conv",
                 _constant_pad_before_conv),
    EmissionFact("ConvTranspose", "ConvTranspose stride {} (exact Resize forms split larger strides into stages)",
                 "max_convtranspose_stride", _convtranspose_stride),
    EmissionFact("Conv", "{}-D Conv (run as a 4-D one, kernel [1,K])", "lift_conv1d", _conv1d),
    EmissionFact("Conv", "Conv dilation {} (space-to-batch rewrites it)", "max_dilation", _dilation),
)


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
        for fact in EMISSION_FACTS:
            if node.op_type != fact.op:
                continue
            try:
                value = fact.test(index, node)
            except Exception:  # noqa: BLE001 - a hint never stops the record (a malformed node, missing shape)
                value = None
            if value is not None:
                causes.setdefault(node.name, []).append(fact.describe(value))
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
