"""onnxruntime sessions: :class:`Runner` (one session for one model, reused for every input set), the exceptions
by which onnxruntime refuses a model, and the scratch copy a session is built from (its weights mapped, not
copied).

Optimizations are off so onnxruntime runs the graph as written: with ORT_ENABLE_ALL its own Conv+BN fusion
would make an original and a wrongly folded model look alike, and session creation is slower.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.host import cores
from onnx_npu_fix.host.heap import release_freed_memory
from onnx_npu_fix.io.external import MappedWeights
from onnx_npu_fix.io.serialize import model_bytes
from onnx_npu_fix.ir.graph import TWO_GB, approx_model_bytes
from onnx_npu_fix.pipeline.inputs import Feeds

Outputs = dict[str, np.ndarray]


def runtime_errors() -> tuple[type[BaseException], ...]:
    """The exceptions by which onnxruntime refuses a model or an input (its pybind classes derive from
    Exception directly). Anything else raised while validating is a bug in npufix, not a verdict on the model."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidGraph", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError",
             "RuntimeException", "InvalidProtobuf", "ModelLoaded", "NotImplemented", "EPFail")
    found = tuple(getattr(state, n) for n in names if isinstance(getattr(state, n, None), type))
    return (*found, RuntimeError)


class Runner:
    """One onnxruntime session for one model (given as a proto, a file or bytes); reused for every input set.

    ``weights``: where a ``model`` given as a proto is written for onnxruntime to map its weights (io.external.
    MappedWeights) instead of handing it bytes, which it copies twice (its own message, then its tensors): the
    session's heap then holds no copy of the weights, whose pages are the data file's, shared with the page
    cache. Without it, a model below 2 GB is serialized. ``refused``: the model as the caller knows it (bytes or
    a path), loaded instead when onnxruntime refuses the scratch file, so that its message is the one the model
    itself gets (it names the file it loaded, never a scratch name)."""

    def __init__(self, model: onnx.ModelProto | None, *, model_path: str | None = None,
                 data: bytes | None = None, weights: MappedWeights | None = None,
                 refused: bytes | str | Callable[[], bytes] | None = None) -> None:
        import onnxruntime as ort

        # Fatal only: onnxruntime's own (coloured, multi-line) log lines must not reach stderr around npufix's
        # one-line errors; its errors reach npufix as exceptions anyway.
        ort.set_default_logger_severity(4)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.log_severity_level = 4
        # No arena and no memory pattern: onnxruntime's CPU arena keeps the largest activations of every run (on
        # a QDQ model, each dequantized weight is one: graph optimizations are off) until the session goes, and
        # the pattern plans them all up front. Without either, a validated QDQ model peaks far lower, in no more
        # time on float models.
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
        opts.intra_op_num_threads = cores.session_threads()  # one when other processes keep a core busy
        # Idle worker threads must not spin: the reference outputs are computed while the passes run.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._own_weights = None
        if model_path is not None:
            source: Any = model_path
        elif model is not None and weights is not None and (source := write_scratch(weights, model)) is not None:
            if refused is None and data is not None:
                refused = data
            elif refused is None and approx_model_bytes(model) < TWO_GB:
                refused = functools.partial(model_bytes, model)
        elif (model is None and data is not None and weights is not None
              and (source := write_scratch(weights, data)) is not None):
            refused = data if refused is None else refused
        elif data is not None:  # the caller serialized it already (or the scratch copy could not be written)
            source = data
        elif model is None:
            raise ValueError("Runner needs a model, a model_path or data")
        elif approx_model_bytes(model) < TWO_GB:
            source = model_bytes(model)
        else:
            # Too large to pass as bytes: a scratch copy whose weights live in a data file; the model in
            # memory is left as it is (the passes after this validation still read its weights).
            self._own_weights = weights or MappedWeights()
            source = self._own_weights.write(model)
            if weights is not None:
                self._own_weights = None  # the caller's to remove
        try:
            self.session = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
        except runtime_errors():
            if refused is None:
                raise
            self.session = ort.InferenceSession(refused() if callable(refused) else refused, opts,
                                                providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]  # the graph's outputs, in order

    def run(self, feeds: Feeds) -> Outputs:
        values = self.session.run(self.output_names, feeds)
        return dict(zip(self.output_names, values))

    def run_all(self, feeds: Sequence[Feeds], task: str = "validation",
                enough: Callable[[Outputs], bool] | None = None) -> list[Outputs]:
        """Every input set, in order; progress.Step(``task``) after each. ``enough``: asked with the first set's
        outputs; True ends the runs there (the total of the last Step is then 1: one set was all it took)."""
        outputs = []
        for feed in feeds:
            outputs.append(self.run(feed))
            if len(outputs) == 1 and enough is not None and enough(outputs[0]):
                progress.emit(progress.Step(task, 1, 1))
                break
            progress.emit(progress.Step(task, len(outputs), len(feeds)))
        return outputs

    def close(self, *, trim: bool = True) -> None:
        """Let the session go; ``trim``: and hand freed memory back to the system (see release_freed_memory)."""
        self.session = None
        if self._own_weights is not None:
            self._own_weights.close()
        if trim:
            release_freed_memory()


def write_scratch(weights: MappedWeights, model: onnx.ModelProto | bytes) -> str | None:
    """``model`` (a proto, or its bytes) written to ``weights`` for onnxruntime to map, or None when the file
    system refuses (full, a file size limit): then onnxruntime gets the model as it did before the scratch
    copies, which validates the same, with more memory."""
    try:
        if isinstance(model, bytes):
            try:
                return weights.write_bytes(model)
            except ValueError:  # a wire layout write_bytes does not take apart (see there): parsed instead
                model = _parsed(model)
        return weights.write(model)
    except OSError:
        return None


def _parsed(data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.ParseFromString(data)
    return model
