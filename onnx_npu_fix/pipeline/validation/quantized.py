"""Quantized outputs judged in quantization steps: which graph outputs a DequantizeLinear makes (or float ops
after one, by a known factor), and :func:`compare_quantized`, the comparison with those outputs in steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from onnx_npu_fix.ir.ops import is_default_domain
from onnx_npu_fix.ir.qdq import StepBound
from onnx_npu_fix.pipeline.validation.comparison import Comparison, OutputDiff, compare
from onnx_npu_fix.pipeline.validation.session import Outputs


@dataclass
class QuantOutputDiff(OutputDiff):
    """An output made by a DequantizeLinear, or from one by float ops that carry a step by a known factor: judged
    in units of that step."""

    scale: float = 0.0
    """Its quantization step (the largest, for a per-channel scale); for an output computed from a quantized tensor
    by float ops, how far one step of that tensor can move it."""
    max_steps: float = 0.0
    """The largest ``|a - b| / scale`` over its elements (0 when bit-exact; an integer up to float noise)."""
    moved_elements: int = 0
    """How many elements moved by at least one step (summed over the validation inputs)."""
    elements: int = 0
    tolerance_steps: float = 1.0
    quantizer: list[str] = field(default_factory=list)
    """The DequantizeLinear nodes whose steps these are (empty when not known)."""
    through: list[str] = field(default_factory=list)
    """The float ops between them and the output (empty: the output is a DequantizeLinear's)."""


def quantized_output_steps(model: onnx.ModelProto) -> dict[str, StepBound]:
    """The step of every graph output made by a DequantizeLinear with constant parameters (per channel where its
    scale is), or computed from such outputs by float ops that carry a one-step move by a known factor (Tanh
    after a DequantizeLinear: ir.qdq.output_step_bound). Such an output is judged in those steps, not by the
    float tolerance: a rounding flip upstream moves it by a step whatever the seed."""
    from onnx_npu_fix.ir.graph import GraphIndex
    from onnx_npu_fix.ir.qdq import output_step_bound

    if not any(n.op_type == "DequantizeLinear" and is_default_domain(n) for n in model.graph.node):
        return {}  # a float model: no index over the whole graph
    index = GraphIndex(model)
    steps: dict[str, StepBound] = {}
    for name in index.graph_outputs:
        found = output_step_bound(index, name)
        if found is not None and np.max(found.steps) > 0:
            steps[name] = found
    return steps


def compare_quantized(reference: Sequence[Outputs], candidate: Sequence[Outputs],
                      steps: Mapping[str, StepBound | np.ndarray], *, exact: bool, rtol: float, atol: float,
                      max_approx_error: float, quant_steps: float = 1.0,
                      output_rtol: Mapping[str, float] | None = None,
                      output_atol: Mapping[str, float] | None = None, confident: bool = False) -> Comparison:
    """:func:`compare`, with every output in ``steps`` judged in quantization steps: a DequantizeLinear's own
    (an array: its scale), or the bound on how far one step of its upstream quantizers moves it
    (:class:`StepBound`: Tanh after a DequantizeLinear moves by at most one step of it).

    Such an output passes when every element satisfies ``|a - b| <= quant_steps * step`` (per channel where the
    step is), or the float criterion: an exact rewrite of a QDQ model may flip a rounding inside a
    QuantizeLinear, since float summation order moves, and that moves a value by one step. Approximate passes
    keep their relative-L2 bound on every output. Other outputs keep rtol/atol.
    """
    result = compare(reference, candidate, exact=exact, rtol=rtol, atol=atol, max_approx_error=max_approx_error,
                     output_rtol=output_rtol, output_atol=output_atol, confident=confident)
    if result.error is not None or not steps:
        return result
    if exact:
        result.criterion = (f"quantized outputs |a-b| <= {quant_steps:g}*step; others {result.criterion}"
                            if len(steps) < len(result.outputs) else f"|a-b| <= {quant_steps:g}*step")
    for i, diff in enumerate(result.outputs):
        bound = steps.get(diff.name)
        if bound is None:
            continue
        if not isinstance(bound, StepBound):
            bound = StepBound(np.asarray(bound, np.float64), ())
        judged = _in_steps(reference, candidate, diff, bound, exact=exact, quant_steps=quant_steps)
        if judged is None:
            return result  # the step does not fit the output: keep the float verdict
        result.outputs[i] = judged
    return result


def _in_steps(reference: Sequence[Outputs], candidate: Sequence[Outputs], diff: OutputDiff, bound: StepBound, *,
              exact: bool, quant_steps: float) -> QuantOutputDiff | None:
    """``diff`` (the float verdict of one output) judged in the steps of ``bound``; None when they do not
    broadcast against the output."""
    max_steps, moved, count = 0.0, 0, 0
    for ref_set, cand_set in zip(reference, candidate):
        ref = ref_set[diff.name].astype(np.float64)
        cand = cand_set[diff.name].astype(np.float64)
        if ref.size == 0:
            continue
        try:
            with np.errstate(divide="ignore", invalid="ignore"):
                moved_by = np.abs(ref - cand) / np.broadcast_to(bound.steps, ref.shape)
        except ValueError:
            return None
        moved_by = np.where(np.isfinite(moved_by), moved_by, np.where(ref == cand, 0.0, np.inf))
        max_steps = max(max_steps, float(moved_by.max()))
        moved += int(np.count_nonzero(moved_by >= 0.5))
        count += ref.size
    # A one-step move is (q1 - q2) * scale in float32: allow float32 rounding of that product (and of the float
    # ops after it). An output the float criterion passes has passed.
    in_steps = max_steps <= quant_steps * (1 + 1e-5)
    passed = diff.passed if not exact else (in_steps or (diff.passed and bool(bound.through)))
    fields = diff.__dict__ | {"passed": passed}
    if exact:
        fields |= {"metric": "steps", "value": max_steps, "bound": quant_steps}
    return QuantOutputDiff(**fields, scale=float(np.max(bound.steps)), max_steps=max_steps, moved_elements=moved,
                           elements=count, tolerance_steps=quant_steps, quantizer=list(bound.sources),
                           through=list(bound.through))


def quant_summary(comparison: Comparison | None) -> str:
    """", 1 quantization step at most (12 of 3072 elements moved)" for a comparison with quantized outputs."""
    diffs = [o for o in comparison.outputs if isinstance(o, QuantOutputDiff)] if comparison is not None else []
    if not diffs:
        return ""
    worst = max(d.max_steps for d in diffs)
    moved = sum(d.moved_elements for d in diffs)
    total = sum(d.elements for d in diffs)
    return f", {worst:.3g} quantization steps at most ({moved} of {total} quantized elements moved)"
