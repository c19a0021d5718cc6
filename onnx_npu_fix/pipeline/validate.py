"""Numerical validation: onnxruntime runs (CPU, graph optimizations off) on the input sets of inputs.py, per-output
comparison.

Optimizations are off so onnxruntime runs the graph as written: with ORT_ENABLE_ALL its own Conv+BN fusion
would make an original and a wrongly folded model look alike, and session creation is 1.4-3x slower.

:class:`Validator` is the validation of one pass-manager run (the pass manager, pipeline.py, decides *when* to
validate and what a verdict does to the run; this module decides *how*): the run's input sets, the original's
outputs (computed in the background), the outputs of the last accepted model, and the comparison of a candidate
with them under the run's criteria (rtol/atol, the approximate bound, quantization steps).

One set when nothing moved: a candidate of exact passes whose outputs on the first generated input set are bit for
bit those of the model before it is accepted on that set, and the other sets are not run for it (its record says
so: ``sets_not_run``). Why one set can do: a wrong exact rewrite (a misplaced weight, a shifted window, a lost
channel) moves nearly every output element of any N(0, 1) input, and the sets are independent draws from one
distribution, so the others add only what depends on rare input values; a set of ``ONE_SET_MIN_ELEMENTS`` input
elements or more holds values beyond 3 sigma in all but about one of 60,000 draws, and a smaller one is run in
full (it costs little). Every set is run when anything moved, even within tolerance (a verdict about a size
depends on the sample), for a candidate with an approximate change, and on loaded ``--validation-data`` (the user
chose those sets). A later candidate that moves is compared, on the sets a predecessor skipped, with the last
model that ran them (the ones between were exact and bit-identical on the first set), and so is the output model
in the final comparison: it covers every set the original ran (``sets_carried``: how many of them the output
model did not run itself). So an exact pass after an approximate one (align-channels after resize-nearest) runs
one set, and the approximate verdict on the output is still made on all of them.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.config.options import check_output_names
from onnx_npu_fix.errors import InputError, first_line
from onnx_npu_fix.host import cores
from onnx_npu_fix.host.heap import release_freed_memory
from onnx_npu_fix.io.load import FileIdentity, file_identity
from onnx_npu_fix.io.save import MappedWeights
from onnx_npu_fix.ir.graph import TWO_GB, approx_model_bytes, subgraphs
from onnx_npu_fix.ir.ops import RANDOM_OPS, is_default_domain
from onnx_npu_fix.ir.qdq import StepBound
from onnx_npu_fix.pipeline.inputs import Feeds, make_inputs, validation_feeds

if TYPE_CHECKING:
    from onnx_npu_fix.config.options import FixOptions

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

    ``weights``: where a ``model`` given as a proto is written for onnxruntime to map its weights (io.save.
    MappedWeights) instead of handing it bytes, which it copies twice (its own message, then its tensors): a
    session of a 110 MB U-Net then holds 8 MB of heap instead of about 250 MB, and the weights' pages are the data
    file's, shared with the page cache. Without it, a model below 2 GB is serialized. ``refused``: the model as
    the caller knows it (bytes or a path), loaded instead when onnxruntime refuses the scratch file, so that its
    message is the one the model itself gets (it names the file it loaded, never a scratch name)."""

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
        # the pattern plans them all up front. Without either, a validated 28 MB QDQ U-Net peaked at 367 MB instead
        # of 565 MB (395 MB with the arena off only), in no more time on the float TCN, U-Net and a 10k-node chain.
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
        opts.intra_op_num_threads = cores.session_threads()  # one when other processes keep a core busy
        # Idle worker threads must not spin: the reference outputs are computed while the passes run.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._own_weights = None
        if model_path is not None:
            source: Any = model_path
        elif model is not None and weights is not None and (source := _write_scratch(weights, model)) is not None:
            if refused is None and data is not None:
                refused = data
            elif refused is None and approx_model_bytes(model) < TWO_GB:
                refused = model.SerializeToString
        elif (model is None and data is not None and weights is not None
              and (source := _write_scratch(weights, data)) is not None):
            refused = data if refused is None else refused
        elif data is not None:  # the caller serialized it already (or the scratch copy could not be written)
            source = data
        elif model is None:
            raise ValueError("Runner needs a model, a model_path or data")
        elif approx_model_bytes(model) < TWO_GB:
            source = model.SerializeToString()
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


def _write_scratch(weights: MappedWeights, model: onnx.ModelProto | bytes) -> str | None:
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


def _made(model: onnx.ModelProto | Callable[[], onnx.ModelProto] | None) -> onnx.ModelProto:
    assert model is not None
    return model() if callable(model) else model


ONE_SET_MIN_ELEMENTS = 4096
"""The input elements a generated set needs before one bit-identical set settles an exact candidate (module
docstring): at this size, P(no element beyond 3 sigma) = (1 - 0.0027)^4096 < 2e-5 (a 4,104-sample audio frame
qualifies; a 32-element toy input does not, and runs every set)."""

SEGMENT_NODES = 1000
"""A graph with more nodes than this is run as a chain of segments (at most this many nodes each, see
:data:`SEGMENT_LENGTH`), one onnxruntime session at a time (see :func:`run_model`)."""

SEGMENT_LENGTH = 250
"""How many nodes a segment holds. onnxruntime's session creation grows faster than the graph even at this
scale (per session about n^1.2 in nodes, measured from 50 to 2000: load, initialization and the session's
destruction 34-41 µs a node in 250-node sessions, 48-61 µs in 1000-node ones, with graph optimizations off), so
shorter segments cost less: a segmented run of the 30k-node Conv+BatchNorm+Relu chain 1.85 s CPU instead of 2.23,
of the 100k-node one 5.3 s instead of 8.1. Below about 100 nodes the sessions' fixed costs (and npufix's per
segment) take the gain back. The outputs are the same bytes at any length (each node runs the same kernel)."""

_UNSEGMENTABLE_OPS = ("Sequence", "Optional")
"""Op types holding these words make or take values other than tensors, which a segment's inputs cannot carry."""


def segmented(model: onnx.ModelProto, size: int | None = None) -> bool:
    """Whether :func:`run_model` runs ``model`` in segments: a long graph whose nodes only pass tensors to each
    other (no bodies reading outer-scope values, no sequences, no inputs with defaults), below 2 GB (``size``: its
    serialized size, when known), of IR version 4 or later (initializers need not be graph inputs)."""
    graph = model.graph
    if len(graph.node) <= SEGMENT_NODES or model.ir_version < 4:
        return False
    produced = {name for node in graph.node for name in node.output}
    if any(o.name not in produced for o in graph.output):
        return False  # an output that is an input or an initializer: the whole graph says it best
    if {vi.name for vi in graph.input} & {t.name for t in graph.initializer}:
        return False  # an input with a default (an initializer) that --validation-data may feed
    if any(subgraphs(node) or any(word in node.op_type for word in _UNSEGMENTABLE_OPS) for node in graph.node):
        return False
    return (size if size is not None else approx_model_bytes(model)) < TWO_GB


@dataclass
class _Segment:
    start: int
    stop: int
    inputs: list[str]
    """Tensors it reads that an earlier segment or the caller's feeds hold."""
    outputs: list[str]
    """Tensors it makes that a later segment reads, or graph outputs."""
    done_with: list[str]
    """Values no later segment reads (dropped once it ran)."""


def plan_segments(model: onnx.ModelProto, size: int | None = None) -> list[_Segment]:
    """``model``'s nodes (topologically sorted, as the checker requires) cut into runs of ``size`` nodes
    (default :data:`SEGMENT_LENGTH`, never more than :data:`SEGMENT_NODES`)."""
    graph = model.graph
    size = size or min(SEGMENT_LENGTH, SEGMENT_NODES)
    constants = {t.name for t in graph.initializer}
    cuts = list(range(0, len(graph.node), size)) + [len(graph.node)]
    needed_later = {o.name for o in graph.output}
    segments: list[_Segment] = []
    for start, stop in reversed(list(zip(cuts, cuts[1:]))):
        nodes = graph.node[start:stop]
        produced = {name for node in nodes for name in node.output if name}
        read = {name for node in nodes for name in node.input if name and name not in constants}
        outputs = [name for node in nodes for name in node.output if name and name in needed_later]
        inputs = sorted(read - produced)
        done_with = [name for name in inputs if name not in needed_later]
        needed_later = (needed_later - produced) | set(inputs)
        segments.append(_Segment(start, stop, inputs, outputs, done_with))
    return segments[::-1]


def _segment_model(model: onnx.ModelProto, segment: _Segment, values: Sequence[Outputs],
                   constants: dict[str, onnx.TensorProto]) -> bytes:
    """The serialized model of ``segment``: its nodes, the initializers they read, its inputs typed from
    ``values`` (per input set: what the runs so far computed, or the feeds; a dimension only where every set
    agrees; ``constants``: the graph's initializers by name)."""
    graph = model.graph
    nodes = graph.node[segment.start:segment.stop]
    read = dict.fromkeys(name for node in nodes for name in node.input if name in constants)
    part = onnx.GraphProto(name=f"{graph.name}-{segment.start}")
    part.node.extend(nodes)
    part.initializer.extend(constants[name] for name in read)
    for name in segment.inputs:
        held = [held[name] for held in values]
        if not all(isinstance(value, np.ndarray) for value in held) or len({v.dtype for v in held}) != 1:
            raise _NotSegmentable(name)
        shapes = {value.shape for value in held}
        dims = [d if len({shape[i] for shape in shapes}) == 1 else None for i, d in enumerate(held[0].shape)] \
            if len({len(shape) for shape in shapes}) == 1 else None
        part.input.append(onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(held[0].dtype), dims))
    part.output.extend(onnx.ValueInfoProto(name=name) for name in segment.outputs)
    whole = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import,
                            functions=model.functions, graph=part)
    return whole.SerializeToString()


class _NotSegmentable(Exception):
    """A value between two segments is not a tensor: the graph is run whole."""


def run_model(model: onnx.ModelProto | None, feeds: Sequence[Feeds], *,
              data: bytes | None = None, task: str = "validation",
              weights: MappedWeights | None = None,
              enough: Callable[[Outputs], bool] | None = None, size: int | None = None,
              path: str | None = None) -> list[Outputs]:
    """``model``'s outputs on every input set (``data``: it serialized already; needed without ``model``);
    ``task``: what its progress steps are called (progress.Step); ``weights``: see Runner; ``enough``: see
    Runner.run_all (a graph run in segments runs every set: each segment takes them all in turn); ``size``: the
    model's serialized size, when known without ``data`` (estimating it reads every initializer: 0.4 s at 30k
    nodes); ``path``: ``data`` written to ``weights`` already (MappedWeights.write_bytes), the session's file.

    One session, unless the graph is long (:func:`segmented`): onnxruntime's session creation grows faster than
    the graph (n^1.5 to n^2 in nodes: 1.2 s CPU at 10k nodes of a Conv+BatchNorm+Relu chain, 4.7-6.3 s at 30k,
    74 s at 100k), so a long graph runs as a chain of :data:`SEGMENT_LENGTH`-node segments, one session at a
    time, every input set through each, the tensors between them carried by name. Graph optimizations are off
    (Runner), so each node runs the same kernel on the same values as in the whole graph: the outputs are
    bit-identical, and only one segment's weights are in a session at a time."""
    if path is None and model is not None and segmented(model, len(data) if data is not None else size):
        try:
            return _run_segments(model, feeds, task)
        except _NotSegmentable:
            pass
    runner = Runner(None, model_path=path, refused=data) if path is not None else \
        Runner(model, data=data, weights=weights)
    try:
        return runner.run_all(feeds, task, enough)
    finally:
        runner.close()


def run_file(path: str, feeds: Sequence[Feeds], task: str = "validation") -> list[Outputs]:
    """The outputs of the model file at ``path`` on every input set (one session, closed after)."""
    runner = Runner(None, model_path=path)
    try:
        return runner.run_all(feeds, task)
    finally:
        runner.close()


def _run_segments(model: onnx.ModelProto, feeds: Sequence[Feeds], task: str) -> list[Outputs]:
    values: list[Outputs] = [dict(f) for f in feeds]
    constants = {t.name: t for t in model.graph.initializer}
    segments = plan_segments(model)
    for done, segment in enumerate(segments, 1):
        progress.emit(progress.Step(f"{task} (segments)", done - 1, len(segments)))
        if not segment.outputs:
            continue  # nothing it makes is read later: dead nodes
        runner = Runner(None, data=_segment_model(model, segment, values, constants))
        try:
            for held in values:
                held.update(runner.run({name: held[name] for name in segment.inputs}))
                for name in segment.done_with:
                    del held[name]
        finally:
            runner.close(trim=False)  # once at the end: a segment's session is small (0.1-0.3 s at 100k nodes)
    release_freed_memory()
    progress.emit(progress.Step(f"{task} (segments)", len(segments), len(segments)))
    names = [o.name for o in model.graph.output]
    return [{name: held[name] for name in names} for held in values]


class Reference:
    """The original model's outputs, computed on a worker thread so that they cost (almost) no wall time.

    The session is built as soon as the model file has passed the onnx checker, while npufix rewrites it; the
    runs start when :meth:`run` hands over the inputs. onnxruntime releases the GIL while it works, and its idle
    workers do not spin (see Runner), so the passes keep a core. ``source``: serialized bytes, or a file path.

    Bytes are parsed and written to :attr:`weights` (io.save.MappedWeights, a run-owned scratch directory), so
    that onnxruntime maps the weights instead of copying them (given bytes it copies them twice, given the input
    file once: 356 MB of heap while a 110 MB U-Net's session was built); the candidates' sessions share the
    weights a pass left alone. The pass manager's Validator takes the store over (:meth:`take_weights`); else
    :meth:`close` removes it.

    ``read_from``: the file ``source`` (bytes) was read from. The Reference checks that the file is still the one
    read: its ``identity`` (io.load.FileIdentity: inode, size, modification and change times, taken while reading)
    once the session is built, or, without one (a file changed too recently for its timestamps to tell), its
    SHA-256 against that of the bytes read. When it is not (replaced, rewritten or removed since it was read),
    the outputs raise InputError: a rollback reads that file again, and a run whose input moved under it stops;
    validation is never silently off.

    ``long_graph``: the model is run in segments (:func:`segmented`): it is parsed from ``source`` (the bytes
    read: no file is opened again) and run by :func:`run_model`.
    """

    def __init__(self, source: str | bytes, *, read_from: str | None = None, identity: FileIdentity | None = None,
                 long_graph: bool = False, start: bool = True) -> None:
        """``start``: start the worker now; False: at :meth:`start`, which a caller that will close this object
        calls once it holds it where its ``finally`` closes it (a signal in between would leave the worker waiting
        for inputs forever, its scratch files with it, and the interpreter's exit waiting for the worker)."""
        self._feeds: concurrent.futures.Future = concurrent.futures.Future()
        self._closing = False
        self._enough_with_one = False
        self.rerun_path: str | None = None
        """The scratch copy the original's session was built from (in :attr:`weights`, which outlives this
        object once taken): where its other input sets can be run later, when the runs stopped early."""
        self._source: str | bytes | None = source
        self._read_from = read_from
        self._identity = identity
        self._long_graph = long_graph
        self.keeps_copy = isinstance(source, bytes) and not long_graph
        """Whether the original's session runs from a scratch copy (:attr:`rerun_path`, once it ran): bytes are
        written to :attr:`weights`; a long graph is run in segments, a path as it is."""
        self.weights = MappedWeights()
        self._weights_taken = False
        self._digest: concurrent.futures.Future = concurrent.futures.Future()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="npufix-reference")
        self._outputs: concurrent.futures.Future | None = None
        if start:
            self.start()

    def start(self) -> Reference:
        """Start the worker (once; :meth:`run` and :meth:`outputs` start it too). The worker reports its progress
        to the run's listener (progress.listening): it runs in a copy of the caller's context, which a plain
        thread would not inherit."""
        if self._outputs is None:
            self._outputs = self._executor.submit(contextvars.copy_context().run, self._work)
        return self

    def _work(self) -> list[Outputs]:
        source, self._source = self._source, None
        from_file = isinstance(source, bytes) and self._read_from is not None
        digest = hashlib.sha256(source).digest() if from_file else None
        self._digest.set_result(digest)
        if self._long_graph:
            model = onnx.ModelProto()
            if isinstance(source, str):
                with open(source, "rb") as f:
                    source = f.read()
            model.ParseFromString(source)
            size = len(source)
            del source
            return run_model(model, self._feeds.result(), task="reference outputs", size=size)
        if isinstance(source, str):
            runner = Runner(None, model_path=source)
        else:
            # Written from the bytes as they are (not parsed: no second copy of the weights beside them), then
            # the scratch files from here on: the weights are mapped, not held. What onnxruntime loads if it
            # refuses the scratch model is the input file, when there is one: the bytes go before the session.
            scratch = _write_scratch(self.weights, source)
            refused, source = self._read_from or source, None
            runner = self._runner_of_scratch(scratch, digest, refused=refused)
            del refused
            self.rerun_path = scratch
        try:
            outputs = []
            sets = self._feeds.result()
            for feeds in sets:
                if self._closing:  # nobody will read them (no pass changed the model): stop between runs
                    break
                if outputs and self._enough_with_one and self.rerun_path is not None:
                    break  # the rest, if a candidate moves, from rerun_path (Validator._complete_original)
                outputs.append(runner.run(feeds))
                progress.emit(progress.Step("reference outputs", len(outputs), len(sets)))
            return outputs
        finally:
            runner.close()

    def _runner_of_scratch(self, scratch: str | None, digest: bytes | None, *, refused: bytes | str) -> Runner:
        """A session of ``scratch`` (the bytes read, written to :attr:`weights`; None: it could not be written,
        so ``refused``, the input file or the bytes read); with ``read_from``, once it is built, that file proven
        to hold the bytes read (identity, else digest)."""
        path = self._read_from

        def same() -> bool:
            if path is None:
                return True
            if self._identity is not None:
                return file_identity(path) == self._identity
            return file_digest(path) == digest

        try:
            if scratch is not None:
                runner = Runner(None, model_path=scratch, refused=refused)
            elif isinstance(refused, str):
                runner = Runner(None, model_path=refused)
            else:
                runner = Runner(None, data=refused)
        except (*runtime_errors(), OSError):
            if not same():
                raise _changed(path) from None
            raise
        if not same():
            runner.close()
            raise _changed(path)
        return runner

    def take_weights(self) -> MappedWeights:
        """The store of mapped weights, from now on the caller's to close (see the class docstring)."""
        self._weights_taken = True
        return self.weights

    def digest(self) -> bytes | None:
        """SHA-256 of the bytes read from ``read_from`` (None without one): what that file must still hold."""
        return self._digest.result()

    def run(self, feeds: Sequence[Feeds]) -> None:
        """Start the runs on ``feeds`` (once)."""
        self.start()
        self._feeds.set_result(list(feeds))

    def enough_with_one(self) -> None:
        """From now on, the runs may end after the first input set (after the one under way) when the original
        can be run again from :attr:`rerun_path`: the outputs then hold fewer sets than were handed over."""
        self._enough_with_one = True

    def outputs(self) -> list[Outputs]:
        """Wait for the outputs; raises what onnxruntime raised (see runtime_errors)."""
        self.start()
        assert self._outputs is not None
        return self._outputs.result()

    def close(self) -> None:
        """Stop waiting for inputs that will not come (or running those nobody will read), join the worker."""
        self._closing = True
        try:
            if not self._feeds.done():
                self._feeds.set_exception(_NotNeeded())
            self._executor.shutdown(wait=True)
        finally:  # also when a signal interrupts the wait: the scratch directory never outlives the run
            if not self._weights_taken:
                self.weights.close()


def _changed(path: str) -> InputError:
    return InputError(f"{path} changed while npufix ran (it no longer holds the bytes that were read); nothing "
                      f"written: rerun on a file that stays put")


def bit_identical(a: Outputs, b: Outputs) -> bool:
    """Every output of ``a`` and ``b`` the same bytes (NaNs in the same places, -0.0 apart from 0.0)."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)


def file_digest(path: str) -> bytes | None:
    """SHA-256 of the file at ``path`` (None when unreadable)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(16 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.digest()


class _NotNeeded(Exception):
    """The run ended before validation started (e.g. the input was refused)."""


@dataclass
class OutputDiff:
    """One output compared over every input set: the statistics users compare with (max abs, mean abs, max rel,
    the relative L2 error, cosine), and the one the verdict used (``metric``: ``atol_needed`` against ``atol``
    for the exact criterion, ``rel_l2`` against the approximate bound, ``steps`` for quantized outputs,
    ``max_abs`` against 0 for integer ones) with its ``value`` and ``bound``."""

    name: str
    max_abs: float
    max_rel: float
    rel_l2: float
    cosine: float
    passed: bool
    needed_atol: float
    """The smallest absolute tolerance (with this output's rtol) under which this output would have passed."""
    mean_abs: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0
    """This output's tolerances (``--rtol NAME:VALUE`` / ``--atol NAME:VALUE``, else the run's)."""
    metric: str = ""
    value: float = 0.0
    bound: float = 0.0
    sets: int = 0
    """How many input sets were compared."""
    rel_l2_upper: float | None = None
    """The one-sided 95% upper confidence bound of ``rel_l2`` over those sets (:func:`rel_l2_upper`; None with
    fewer than two). An approximate verdict near its bound is measured on more sets and then needs this, not only
    the estimate, within the bound (see :meth:`Validator._at_the_edge`)."""

    def to_json(self) -> dict[str, Any]:
        return {k: (v if not isinstance(v, float) else float(f"{v:.6g}")) for k, v in self.__dict__.items()}


@dataclass
class Comparison:
    outputs: list[OutputDiff] = field(default_factory=list)
    criterion: str = ""
    exact: bool = True
    """Whether the exact tolerance applied (False: the approximate bound)."""
    error: str | None = None
    """Set when the outputs could not be compared at all (missing output, shape or dtype mismatch)."""
    rtol: float = 0.0
    atol: float = 0.0
    """The exact criterion's tolerances (the summary names the bound when the scaled atol carried an output)."""
    sets_not_run: int = 0
    """The run's input sets this model was not run on: its outputs on the first were bit-identical to the model's
    before it (an exact candidate; see the module docstring)."""
    sets_carried: int = 0
    """Of the sets compared (the final comparison's), those this model did not run: the outputs of the last model
    before it that ran them stand in (every model since was exact and bit-identical to its predecessor on the
    first set)."""

    @property
    def passed(self) -> bool:
        return self.error is None and all(o.passed for o in self.outputs)

    @property
    def worst(self) -> OutputDiff | None:
        return max(self.outputs, key=lambda o: (not o.passed, o.max_abs), default=None)

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    def to_json(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "passed": self.passed,
            "criterion": self.criterion,
            "error": self.error,
            "max_abs": float(f"{self.max_abs:.6g}"),
            "max_rel": float(f"{self.max_rel:.6g}"),
            "worst_output": worst.name if worst else None,
            "outputs": [o.to_json() for o in self.outputs],
            "sets_not_run": self.sets_not_run,
            "sets_carried": self.sets_carried,
        }


def compare(reference: Sequence[Outputs], candidate: Sequence[Outputs], *, exact: bool, rtol: float,
            atol: float, max_approx_error: float, output_rtol: Mapping[str, float] | None = None,
            output_atol: Mapping[str, float] | None = None, confident: bool = False) -> Comparison:
    """Compare every output over every input set.

    Exact: each element must satisfy ``|a - b| <= atol * max(1, max|ref|) + rtol * |ref|`` — atol scales with
    the output's magnitude because float32 reassociation errors do; ``output_rtol`` / ``output_atol`` override
    the tolerances of the outputs they name (as polygraphy's ``--rtol out:1e-3``). Integer/bool outputs must be
    equal. Approximate: the relative L2 error ``||a - b|| / ||b||`` of each output must not exceed
    ``max_approx_error`` — with ``confident``, its 95% upper confidence bound over the input sets must not.
    """
    output_rtol, output_atol = output_rtol or {}, output_atol or {}
    criterion = (f"|a-b| <= {atol:g}*max(1,max|ref|) + {rtol:g}*|ref|" if exact
                 else f"relative L2 error <= {max_approx_error:g}")
    overrides = [f"{name}: rtol {output_rtol.get(name, rtol):g}, atol {output_atol.get(name, atol):g}"
                 for name in dict.fromkeys([*output_rtol, *output_atol])]
    if exact and overrides:
        criterion += f" ({'; '.join(overrides)})"
    result = Comparison(criterion=criterion, exact=exact, rtol=rtol, atol=atol)
    names = list(reference[0].keys()) if reference else []
    for name in names:
        out_rtol, out_atol = output_rtol.get(name, rtol), output_atol.get(name, atol)
        stats = _Accumulator()
        for ref_set, cand_set in zip(reference, candidate):
            if name not in cand_set:
                result.error = f"output '{name}' is missing"
                return result
            ref, cand = ref_set[name], cand_set[name]
            if ref.shape != cand.shape:
                result.error = f"output '{name}' changed shape {list(ref.shape)} -> {list(cand.shape)}"
                return result
            if ref.dtype != cand.dtype:
                result.error = f"output '{name}' changed dtype {ref.dtype} -> {cand.dtype}"
                return result
            stats.add(ref, cand, out_rtol)
        result.outputs.append(stats.finish(name, exact=exact, rtol=out_rtol, atol=out_atol,
                                           max_approx_error=max_approx_error, confident=confident))
    return result


class _Accumulator:
    def __init__(self) -> None:
        self.max_abs = 0.0
        self.sum_abs = 0.0
        self.count = 0
        self.set_err_sq: list[float] = []  # per input set, for the confidence of the pooled relative L2 error
        self.set_ref_sq: list[float] = []
        self.max_rel = 0.0
        self.ref_mag = 0.0
        self.err_sq = 0.0
        self.ref_sq = 0.0
        self.cand_sq = 0.0
        self.dot = 0.0
        self.needed = 0.0  # max over elements of (|a-b| - rtol*|ref|), for the atol that would have passed
        self.non_finite_mismatch = False
        self.integer = False

    def add(self, ref: np.ndarray, cand: np.ndarray, rtol: float) -> None:
        if not (np.issubdtype(ref.dtype, np.number) or ref.dtype == np.bool_):
            # strings / objects: equal or not
            self.integer = True
            if not np.array_equal(ref, cand):
                self.max_abs = max(self.max_abs, 1.0)
                self.non_finite_mismatch = True
            return
        if not np.issubdtype(ref.dtype, np.floating):
            self.integer = True
            ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
        else:
            ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
            finite_ref, finite_cand = np.isfinite(ref64), np.isfinite(cand64)
            # Non-finite values must match exactly (same inf sign, NaN where NaN).
            if not np.array_equal(finite_ref, finite_cand) or not np.array_equal(
                    ref64[~finite_ref], cand64[~finite_cand], equal_nan=True):
                self.non_finite_mismatch = True
            ref64 = np.where(finite_ref, ref64, 0.0)
            cand64 = np.where(finite_cand, cand64, 0.0)
        if ref64.size == 0:
            return
        diff = np.abs(ref64 - cand64)
        absref = np.abs(ref64)
        self.max_abs = max(self.max_abs, float(diff.max()))
        self.sum_abs += float(diff.sum())
        self.count += diff.size
        self.max_rel = max(self.max_rel, float((diff / np.maximum(absref, 1e-6)).max()))
        self.ref_mag = max(self.ref_mag, float(absref.max()))
        self.set_err_sq.append(float(np.sum(diff * diff)))
        self.set_ref_sq.append(float(np.sum(ref64 * ref64)))
        self.err_sq += self.set_err_sq[-1]
        self.ref_sq += self.set_ref_sq[-1]
        self.cand_sq += float(np.sum(cand64 * cand64))
        self.dot += float(np.sum(ref64 * cand64))
        self.needed = max(self.needed, float((diff - rtol * absref).max()))

    def finish(self, name: str, *, exact: bool, rtol: float, atol: float, max_approx_error: float,
               confident: bool = False) -> OutputDiff:
        rel_l2 = float(np.sqrt(self.err_sq / self.ref_sq)) if self.ref_sq > 0 else float(np.sqrt(self.err_sq))
        denom = np.sqrt(self.ref_sq * self.cand_sq)
        cosine = float(self.dot / denom) if denom > 0 else (1.0 if self.err_sq == 0 else 0.0)
        scale = max(1.0, self.ref_mag)
        needed_atol = max(0.0, self.needed) / scale
        if self.integer:
            metric, value, bound = "max_abs", self.max_abs, 0.0
        elif exact:
            metric, value, bound = "atol_needed", needed_atol, atol
        else:
            metric, value, bound = "rel_l2", rel_l2, max_approx_error
        upper = rel_l2_upper(self.set_err_sq, self.set_ref_sq)
        if confident and metric == "rel_l2" and upper is not None:
            metric, value = "rel_l2_upper", upper
        passed = not self.non_finite_mismatch and value <= bound
        return OutputDiff(name=name, max_abs=self.max_abs, max_rel=self.max_rel, rel_l2=rel_l2,
                          cosine=cosine, passed=passed, needed_atol=needed_atol,
                          mean_abs=self.sum_abs / self.count if self.count else 0.0, rtol=rtol, atol=atol,
                          metric=metric, value=value, bound=bound, sets=len(self.set_err_sq), rel_l2_upper=upper)


# One-sided 95% quantiles of Student's t with 1..30 degrees of freedom (beyond: the normal's 1.645 and a margin).
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def rel_l2_upper(err_sq: Sequence[float], ref_sq: Sequence[float]) -> float | None:
    """The one-sided 95% upper confidence bound of the pooled relative L2 error ``sqrt(sum(err_sq) /
    sum(ref_sq))`` when each input set (independent draws) gave ``err_sq[i] = ||a - b||^2`` and ``ref_sq[i] =
    ||b||^2``: the ratio estimator's standard error by the delta method, ``se(R^2)^2 = sum((e_i - R^2 d_i)^2) /
    (n (n - 1) mean(d)^2)``, and Student's t with n - 1 degrees of freedom. None with fewer than two sets or no
    reference energy (nothing to estimate a spread from)."""
    n = len(err_sq)
    total = float(sum(ref_sq))
    if n < 2 or total <= 0:
        return None
    ratio = float(sum(err_sq)) / total
    spread = sum((e - ratio * d) ** 2 for e, d in zip(err_sq, ref_sq)) / ((n - 1) * n * (total / n) ** 2)
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.66
    return float(np.sqrt(max(ratio + t * np.sqrt(spread), 0.0)))


# --- quantized outputs: compared in quantization steps -------------------------------------------------------

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


def sets_summary(comparison: Comparison | None) -> str:
    """", bit-identical on the first of 3 input sets (2 not run)" for a comparison that stopped after one set;
    for a final comparison that carried sets (Comparison.sets_carried), whose outputs those are."""
    if comparison is None or not comparison.sets_not_run:
        return ""
    total = comparison.sets_not_run + 1
    if comparison.sets_carried:
        return (f"; {comparison.sets_carried} of {total} input sets carried from the last model that ran them (the "
                f"output model ran the first, bit-identical there to the one before it)")
    return f", bit-identical on the first of {total} input sets ({comparison.sets_not_run} not run)"


def approximate_summary(comparison: Comparison | None) -> str:
    """", rel L2 0.436 (bound 0.5, 586 input sets)" for an approximate comparison: its worst output's error and
    sample; near the bound, the 95% upper confidence bound the verdict used."""
    diffs = [o for o in comparison.outputs if o.metric.startswith("rel_l2")] if comparison is not None else []
    if not diffs:
        return ""
    worst = max(diffs, key=lambda o: (o.value, o.rel_l2))
    sample = (f"95% upper confidence {worst.value:.3g} over {worst.sets} input sets, measured on more near the "
              f"bound" if worst.metric == "rel_l2_upper" else f"{worst.sets} input sets")
    return f", rel L2 {worst.rel_l2:.3g} (bound {worst.bound:g}; {sample})"


# --- a chain of sub-models (npufix --split) ------------------------------------------------------------


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


EDGE = 0.1
"""An approximate verdict within this fraction of its bound is near the edge (measured on more sets)."""
EDGE_SETS = 3
"""Near the edge, this many times the run's input sets are added."""
EDGE_SEED_OFFSET = 1_000_003
"""The added sets' seed is the run's plus this: other draws than the first sets, the same on every run."""


def at_the_edge(diff: OutputDiff) -> bool:
    """Whether an approximate verdict on ``diff`` could go the other way on another sample: its relative L2 error
    within ``EDGE`` of the bound, or the bound below the error's 95% upper confidence bound."""
    if diff.metric != "rel_l2":
        return False
    near = abs(diff.rel_l2 - diff.bound) <= EDGE * diff.bound
    return near or (diff.rel_l2 <= diff.bound and diff.rel_l2_upper is not None and diff.rel_l2_upper > diff.bound)


# --- the validation of a pass-manager run ----------------------------------------------------------------


def check_structure(model: onnx.ModelProto | Callable[[], onnx.ModelProto] | None,
                    data: bytes | None = None, *, path: str | None = None) -> str | None:
    """The onnx checker's complaint about ``model`` (one line), or None. ``data``: the model already
    serialized (checking bytes skips the checker's own re-serialization; ``model`` is then not read). ``path``:
    a scratch copy of it (io.save.MappedWeights), checked instead: the checker reads the model file, and of the
    weights in the data file beside it that they are there, not their bytes (whose lengths the copy kept inline
    where they disagree with their dims, see MappedWeights), so that its copy of the model is kilobytes, not one
    more model size. Above 2 GB the checker cannot take the in-memory proto; strict shape inference and
    onnxruntime still check those models."""
    if path is not None:
        data = None
    elif data is None:
        model = _made(model)
        if approx_model_bytes(model) >= TWO_GB:
            return None
        data = model.SerializeToString()
    try:
        onnx.checker.check_model(path if path is not None else data)
    except Exception as exc:  # noqa: BLE001
        return first_line(exc)
    finally:
        # The checker parsed its own copy of the model; handed back before onnxruntime's session and its runs
        # come on top (U-Net, 110 MB: 100 MB lower peak).
        release_freed_memory()
    return None


def refuse_random(model: onnx.ModelProto) -> None:
    """InputError naming the first node (main graph or a body) that draws random values: two runs of such a model
    differ whatever a pass did (a padded RandomNormalLike even draws other values under a seed), so validating it
    would blame an exact pass for the noise, or call a wrong one exact."""
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if node.op_type in RANDOM_OPS and is_default_domain(node):
                raise InputError(f"node '{node.name}' ({node.op_type}) draws random values, so no output of this "
                                 f"model can be compared with another run's; nothing written (feed the noise as "
                                 f"an input instead, or --validate none to write it unvalidated)")
            graphs.extend(subgraphs(node))


def blind_output(outputs: Sequence[Outputs]) -> str | None:
    """Why the original's ``outputs`` (over all input sets) cannot show a difference, or None: an output with no
    element at all (a zero-size dimension), or a floating one with no finite element (NaN and ±inf compare
    equal to themselves, so any model that also yields them "matches" — e.g. on all-NaN inputs)."""
    if not outputs:
        return None
    for name in outputs[0]:
        values = [np.asarray(o[name]) for o in outputs]
        if all(v.size == 0 for v in values):
            return f"output '{name}' has no elements"
        if all(v.dtype.kind in "fc" for v in values) and not any(np.isfinite(v).any() for v in values):
            return f"output '{name}' has no finite value (only NaN / ±inf)"
    return None


@dataclass
class Verdict:
    """A candidate model judged by :meth:`Validator.check`."""

    problem: str | None
    """One line saying why it was refused; None when it passed."""
    comparison: Comparison | None
    """Its outputs against the last accepted model's (None when it could not run: checker, onnxruntime)."""
    data: bytes | None
    """The candidate serialized (None above 2 GB): reused by a later restore or by save_model."""
    scratch: str | None = None
    """The model file onnxruntime ran it from (io.save.MappedWeights.write_bytes), when it did: :meth:`Validator.
    keep` writes a restore point of it without the weights that file's data holds already."""

    @property
    def passed(self) -> bool:
        return self.problem is None


class Validator:
    """The validation of one run: its seeded (or loaded) inputs, the original's outputs and those of the last
    accepted model, so each is computed once; :meth:`check` judges a candidate against the last accepted model.

    The original's outputs are computed on a background thread (Reference) while the passes work; the first
    validation waits for them. A run whose original onnxruntime cannot run is an InputError (nothing could be
    validated), unless validation is off.
    """

    def __init__(self, model: onnx.ModelProto, options: FixOptions, *, reference: Reference | None = None,
                 reference_feeds: Feeds | None = None, approximate: bool = False) -> None:
        """``reference``: the original's outputs already under way, else computed from ``model`` as it is now.
        ``reference_feeds``: inputs only ``reference`` takes (frozen inputs), added to every set it runs.
        ``approximate``: the run may make an approximate change (more input sets, see inputs.py)."""

        self.options = options
        self.feeds: list[Feeds] = []
        self._original: list[Outputs] | None = None
        self._current: list[Outputs] | None = None
        self._fresh = 0
        """How many of the input sets (the first ones) the last accepted model itself ran: all, or only the first
        when its outputs there were bit-identical to its predecessor's (then ``_current`` holds, for the others,
        the outputs of the last model that ran them)."""
        self._reference: Reference | None = None
        self._reference_feeds: Feeds = {}
        self._rerun_path: str | None = None
        """The original's scratch copy, when its runs stopped after the first set (:meth:`_complete_original`)."""
        self.all_exact = True
        """Every accepted change was exact (the final comparison's criterion)."""
        self.changed = False
        """Some change was accepted (validated or not)."""
        self.steps: dict[str, StepBound] = {}
        self._may_widen = False
        """A change may be approximate, and its verdict near the bound can be measured on more generated sets
        (:meth:`_at_the_edge`)."""
        self._edge_model: str | bytes | None = None
        """The model as validation starts, written to the run's mapped weights for :meth:`_at_the_edge`, when the
        original's own scratch copy (``_rerun_path``) will not be there to run instead."""
        self._weights = MappedWeights()
        """Where the candidates' weights are written for onnxruntime to map (shared with the original's: a
        weight no pass changed is written once per run); removed by :meth:`close`, also when this raises."""
        check_output_names(options, [o.name for o in model.graph.output])
        if options.validate == "none":
            return
        try:
            self._start(model, reference, reference_feeds, approximate)
        except BaseException:
            self.close()
            raise

    def _start(self, model: onnx.ModelProto, reference: Reference | None, reference_feeds: Feeds | None,
               approximate: bool) -> None:
        """The input sets, and the original's outputs under way (see __init__)."""
        options = self.options
        refuse_random(model)
        self.feeds = validation_feeds(model, n_inputs=options.n_inputs, seed=options.seed,
                                      data=options.validation_data, ranges=options.input_ranges,
                                      approximate=approximate and not options.strict)
        # Outputs made by a DequantizeLinear are judged in quantization steps (graph output names never change).
        self.steps = quantized_output_steps(model)
        if reference is None and approx_model_bytes(model) >= TWO_GB:
            # No file to start from and too large for bytes: the scratch copy must be written now, before the
            # passes change the model, so this one is computed here.
            self._settle(lambda: self._run(model))
            return
        if reference is None:
            data = model.SerializeToString()
            reference = Reference(data, long_graph=segmented(model, len(data)), start=False)
            del data
        self._reference = reference.start()  # started once held here: close() stops it, whatever lands next
        self._weights = reference.take_weights()
        self._may_widen = (approximate and not options.strict and not options.validation_data
                           and approx_model_bytes(model) < TWO_GB)
        if self._may_widen and not reference.keeps_copy:
            self._edge_model = _write_scratch(self._weights, model) or model.SerializeToString()
        self._reference_feeds = dict(reference_feeds or {})
        if not approximate and self._one_set_may_do():
            reference.enough_with_one()  # the other sets only when a candidate moves
        self._reference.run([{**feeds, **self._reference_feeds} for feeds in self.feeds])

    @staticmethod
    def _of_original(compute: Callable[[], list[Outputs]]) -> list[Outputs]:
        try:
            return compute()
        except runtime_errors() as exc:
            # Without the original's outputs nothing can be validated, and nothing is written unvalidated
            # unless the user asked for it.
            raise InputError(f"onnxruntime cannot run the original model ({first_line(exc)}), so no change "
                             f"could be validated; nothing written (fix the model, or --validate none to write "
                             f"it unvalidated)") from None

    def _settle(self, compute: Callable[[], list[Outputs]]) -> None:
        self._original = self._of_original(compute)
        blind = blind_output(self._original)
        if blind is not None:
            source = ("the --validation-data inputs" if self.options.validation_data
                      else "the generated validation inputs")
            raise InputError(f"validation cannot tell a wrong model from a right one: {blind} on {source}; "
                             f"nothing written (give --validation-data with finite values and non-empty shapes, "
                             f"or --validate none to write it unvalidated)")
        self._current = self._original
        self._fresh = len(self._original)

    def _wait(self) -> None:
        if self._reference is not None:
            reference, self._reference = self._reference, None
            try:
                self._settle(reference.outputs)
                self._rerun_path = reference.rerun_path
            finally:
                reference.close()

    def _complete_original(self) -> None:
        """The original's outputs on every input set: the runs the reference left out (it stopped after the
        first set, see :meth:`_one_set_may_do`) from its scratch copy; the last accepted model's outputs on them
        are the original's too (every candidate since was bit-identical on the first set)."""
        assert self._original is not None and self._current is not None
        missing = self.feeds[len(self._original):]
        if not missing:
            return
        assert self._rerun_path is not None, "the reference stops early only with a scratch copy to run again"
        rest = self._of_original(functools.partial(
            run_file, self._rerun_path, [{**feeds, **self._reference_feeds} for feeds in missing],
            "reference outputs"))
        self._original = [*self._original, *rest]
        self._current = [*self._current, *rest]

    def require_original(self) -> None:
        """Raise InputError unless the original's outputs exist (or validation is off): a run that changed
        nothing still proves that the model it hands back runs."""
        if self.options.validate != "none":
            self._wait()

    @property
    def original(self) -> list[Outputs] | None:
        self._wait()
        return self._original

    @property
    def current(self) -> list[Outputs] | None:
        """The outputs of the last accepted model (the original's until a validation passes)."""
        self._wait()
        return self._current

    def close(self) -> None:
        try:
            if self._reference is not None:
                self._reference.close()
        finally:
            self._weights.close()

    def _run(self, model: onnx.ModelProto | None, data: bytes | None = None,
             task: str = "validation", enough: Callable[[Outputs], bool] | None = None,
             path: str | None = None) -> list[Outputs]:
        return run_model(model, self.feeds, data=data, task=task, weights=self._weights, enough=enough, path=path)

    def _scratch_copy(self, model: onnx.ModelProto | Callable[[], onnx.ModelProto], data: bytes | None) -> str | None:
        """The candidate written for the checker and its session (a model file and its weights in the run's
        data file, :func:`_write_scratch`), or None: above 2 GB, for a graph run in segments (cut from the
        proto), or when the file system refuses (then both take the bytes, as before the scratch copies)."""
        if data is None or (not callable(model) and segmented(model, len(data))):
            return None
        return _write_scratch(self._weights, data)

    def _unmoved(self, exact: bool, before: Outputs) -> Callable[[Outputs], bool] | None:
        """For an exact candidate on generated inputs (more than one set): whether its first set's outputs are
        ``before``'s bit for bit, so that its other sets need not run (the module docstring says why; after an
        approximate change too: the final comparison's verdict about a size is made on the sets carried)."""
        if not (exact and self._one_set_may_do()):
            return None
        return lambda first: bit_identical(before, first)

    def _one_set_may_do(self) -> bool:
        """Whether this run's input sets allow settling a candidate on the first (generated, more than one,
        ``ONE_SET_MIN_ELEMENTS`` elements or more each)."""
        return (not self.options.validation_data and len(self.feeds) >= 2
                and sum(v.size for v in self.feeds[0].values()) >= ONE_SET_MIN_ELEMENTS)

    def check(self, model: onnx.ModelProto | Callable[[], onnx.ModelProto], *, exact: bool,
              data: bytes | None = None, on_serialized: Callable[[bytes], None] | None = None,
              task: str = "validation") -> Verdict:
        """Check and run ``model`` (the candidate after one pass or one group of them) and compare its outputs
        with the last accepted model's: by rtol/atol when ``exact`` (quantized outputs in quantization steps),
        else by the approximate bound. A passing candidate becomes the accepted model. ``data``: ``model``
        serialized already (else serialized here, below 2 GB); with ``data``, ``model`` may be a function
        that makes it: onnxruntime then gets the bytes (written for it to map, io.save.MappedWeights.write_bytes)
        and the proto is made only if a wider comparison needs it, so that neither the checker's two copies of
        the bytes nor the session's weights come on top of it (the caller makes it after this, from the bytes).
        Not for a graph run in segments (:func:`segmented`), which are cut from the proto. ``on_serialized``
        gets the candidate's bytes once the checker accepted them, before onnxruntime runs them. ``task``: what
        its progress steps are called (progress.Step)."""
        # The original's session is let go before the candidate is checked: its weights next to the candidate's
        # bytes and the checker's copy of them made the peak (and two models computing at once would only fight
        # over the cores). An original that cannot run is the input's problem: raised here.
        self._wait()
        if data is None:
            model = _made(model)
            data = model.SerializeToString() if approx_model_bytes(model) < TWO_GB else None
        scratch = self._scratch_copy(model, data)
        problem = check_structure(model, data, path=scratch)
        if problem:
            return Verdict(f"the model fails the onnx checker after this pass: {problem}", None, data)
        if on_serialized is not None and data is not None:
            on_serialized(data)
        current = self.current
        assert current is not None  # the original ran (else _wait raised)
        try:
            outputs = self._run(None if callable(model) else model, data, task=task,
                                enough=self._unmoved(exact, current[0]), path=scratch)
        except runtime_errors() as exc:
            return Verdict(f"onnxruntime cannot run the model after this pass: {first_line(exc)}", None, data)
        if len(outputs) > len(current):
            self._complete_original()
            current = self._current
        comparison = self._compare(current[:len(outputs)], outputs, exact=exact)
        comparison.sets_not_run = len(self.feeds) - len(outputs)
        if self.all_exact:  # the accepted model computes the original's outputs: more sets can be compared
            comparison = self._at_the_edge(model, data, comparison, self.current, outputs)
        if not comparison.passed:
            worst = comparison.worst
            where = f"output '{worst.name}'" if worst else "outputs"
            upper = (f", its 95% upper confidence bound {worst.value:.3g} over {worst.sets} input sets"
                     if worst is not None and worst.metric == "rel_l2_upper" else "")
            detail = comparison.error or (f"{where}: max abs error {worst.max_abs:.3g}, rel L2 {worst.rel_l2:.3g}"
                                          f"{upper} ({comparison.criterion})")
            return Verdict(f"validation failed on {detail}", comparison, data)
        self.accept(exact=exact)
        self._current, self._fresh = [*outputs, *current[len(outputs):]], len(outputs)
        return Verdict(None, comparison, data, scratch)

    def keep(self, data: bytes, scratch: str | None = None) -> str | None:
        """``data`` (a validated model's bytes) written to the run's scratch directory, for a restore point that
        does not sit in memory (``scratch``: the file its session ran from, Verdict.scratch); its path, for
        :meth:`read_kept`, or None when the file system refuses (the caller keeps the bytes)."""
        try:
            return self._weights.keep(data, scratch)
        except OSError:
            return None

    def read_kept(self, path: str) -> bytes:
        """The bytes kept at ``path`` by :meth:`keep`."""
        return self._weights.read_kept(path)

    def accept(self, *, exact: bool) -> None:
        """A change is kept (by :meth:`check`, or unvalidated): the final comparison covers it."""
        self.changed = True
        self.all_exact = self.all_exact and exact

    def final(self, model: onnx.ModelProto, data: bytes | None = None) -> Comparison | None:
        """The output model against the original (reusing the last accepted outputs when every pass was
        validated); ``data``: the model already serialized. None when nothing changed or validation is off."""
        if not self.changed or self.options.validate == "none" or self.original is None:
            return None
        original = self.original
        if self.options.validate == "each" and self.current is not None:
            # Every set the original ran: the output model's own, and for the others the outputs of the last
            # model that ran them (bit-identical since on the first set).
            outputs, own = self.current[:max(len(original), self._fresh)], self._fresh
        else:
            try:
                outputs = self._run(model, data, enough=self._unmoved(self.all_exact, original[0]))
            except runtime_errors() as exc:
                return Comparison(error=f"onnxruntime cannot run the output model: {first_line(exc)}")
            own = len(outputs)
            if len(outputs) > len(original):
                self._complete_original()
                original = self.original
        comparison = self._compare(original[:len(outputs)], outputs, exact=self.all_exact)
        comparison.sets_not_run, comparison.sets_carried = len(self.feeds) - own, len(outputs) - own
        return self._at_the_edge(model, data, comparison, original, outputs)

    def _at_the_edge(self, model: onnx.ModelProto | Callable[[], onnx.ModelProto], data: bytes | None,
                     comparison: Comparison,
                     reference: list[Outputs], outputs: list[Outputs]) -> Comparison:
        """An approximate ``comparison`` whose verdict is near its bound (within ``EDGE`` of it, or the bound
        inside the 95% confidence interval) depends on the sample: then ``model`` and the original are run on
        ``EDGE_SETS`` times as many more seeded sets (within inputs.MAX_SETS / MAX_EXTRA_BYTES), and every output
        is judged on all of them by the 95% upper confidence bound of its error (measured: 0.504 on the default
        sets of one seed was a pass at 0.5 on another). ``reference`` / ``outputs``: what ``comparison``
        compared (the original's, or the accepted model's while it computes the original's). Without a way to
        run more (--validation-data, --strict, above 2 GB, no scratch copy of the original because the file
        system refused it) the comparison stands, with its sets and confidence in the record."""
        # The original's own scratch copy when there is one (it is the model every comparison's original outputs
        # came from: frozen inputs are fed to it, as to the reference), else the copy written at the start.
        edge = self._edge_model if self._edge_model is not None else self._rerun_path
        if (comparison.exact or comparison.error is not None or not self._may_widen or edge is None
                or not any(at_the_edge(o) for o in comparison.outputs)):
            return comparison
        model = _made(model)
        from onnx_npu_fix.pipeline.inputs import MAX_EXTRA_BYTES, MAX_SETS, parse_input_ranges

        per_set = sum(v.nbytes for v in self.feeds[0].values()) + 2 * sum(v.nbytes for v in reference[0].values())
        more = min(EDGE_SETS * len(self.feeds), MAX_SETS - len(self.feeds), MAX_EXTRA_BYTES // max(per_set, 1))
        if more < 1:
            return comparison
        feeds = make_inputs(model, more, self.options.seed + EDGE_SEED_OFFSET,
                            ranges=parse_input_ranges(self.options.input_ranges))
        original = Runner(None, model_path=edge) if isinstance(edge, str) else Runner(None, data=edge)
        candidate = Runner(model, data=data, weights=self._weights)
        extra_reference_feeds = feeds if self._edge_model is not None else \
            [{**f, **self._reference_feeds} for f in feeds]
        try:
            extra_reference, extra = original.run_all(extra_reference_feeds), candidate.run_all(feeds)
        except runtime_errors():
            return comparison  # ran on the first sets, so this is not expected; the first verdict stands
        finally:
            original.close()
            candidate.close()
        widened = self._compare([*reference, *extra_reference], [*outputs, *extra], exact=False, confident=True)
        widened.criterion += f", by its 95% upper confidence bound over {len(self.feeds) + more} input sets"
        widened.sets_not_run, widened.sets_carried = comparison.sets_not_run, comparison.sets_carried
        return widened

    def _compare(self, reference: list[Outputs], outputs: list[Outputs], *, exact: bool,
                 confident: bool = False) -> Comparison:
        if self.steps:
            return compare_quantized(reference, outputs, self.steps, exact=exact, rtol=self.options.rtol,
                                     atol=self.options.atol, max_approx_error=self.options.max_approx_error,
                                     quant_steps=self.options.quant_steps, output_rtol=self.options.output_rtol,
                                     output_atol=self.options.output_atol, confident=confident)
        return compare(reference, outputs, exact=exact, rtol=self.options.rtol, atol=self.options.atol,
                       max_approx_error=self.options.max_approx_error, output_rtol=self.options.output_rtol,
                       output_atol=self.options.output_atol, confident=confident)
