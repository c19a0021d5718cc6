"""A chain of sub-models (npufix --split) checked against the whole: the segments run in order on the same seeded
inputs, tensors passed by name, every graph output of the whole compared for bit-identity.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from onnx_npu_fix.pipeline.inputs import Feeds, make_inputs
from onnx_npu_fix.pipeline.validation.comparison import Comparison, compare
from onnx_npu_fix.pipeline.validation.session import Outputs, Runner, runtime_errors


def run_chain(segments: Sequence[onnx.ModelProto], feeds: Sequence[Feeds]) -> list[Outputs]:
    """Run ``segments`` in order on every input set, passing tensors by name: each segment reads its inputs from
    the caller's feeds or an earlier segment's outputs. Returns every tensor any segment produced, per input set."""
    fed = [[vi.name for vi in s.graph.input if vi.name not in {t.name for t in s.graph.initializer}]
           for s in segments]
    runners = [Runner(segment) for segment in segments]
    try:
        results = []
        for feed in feeds:
            values: dict[str, np.ndarray] = dict(feed)
            for names, runner in zip(fed, runners):
                values.update(runner.run({name: values[name] for name in names}))
            results.append(values)
        return results
    finally:
        for runner in runners:
            runner.close()


class CannotRun(Exception):
    """onnxruntime cannot run the whole model (custom ops, an opset it lacks...): a chain cannot be judged."""


def validate_chain(whole: onnx.ModelProto, segments: Sequence[onnx.ModelProto], *, n: int, seed: int) -> Comparison:
    """Run ``whole`` and the chain of ``segments`` on the same seeded inputs and compare every graph output of
    ``whole`` for equality (|a - b| <= 0: the segments run the same ops on the same values, so nothing but
    bit-identical outputs is accepted). Raises CannotRun when onnxruntime cannot run ``whole``; a segment that
    fails to run makes the comparison fail (``error``)."""
    feeds = make_inputs(whole, n, seed)
    try:
        runner = Runner(whole)
        try:
            reference = runner.run_all(feeds, "split validation")
        finally:
            runner.close()
    except runtime_errors() as exc:
        raise CannotRun(str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__) \
            from None
    try:
        chained = run_chain(segments, feeds)
    except runtime_errors() as exc:
        failed = Comparison(criterion="chained segments run", exact=True)
        failed.error = f"a segment fails in onnxruntime: {str(exc).strip()[:300]}"
        return failed
    names = [o.name for o in whole.graph.output]
    candidate = [{name: values[name] for name in names if name in values} for values in chained]
    return compare(reference, candidate, exact=True, rtol=0.0, atol=0.0, max_approx_error=0.0)
