"""The original model's outputs (:class:`Reference`): computed on a worker thread while the passes work, from a
scratch copy of the bytes read, the input file proven to still hold them.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import hashlib
from collections.abc import Sequence

import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io.external import MappedWeights
from onnx_npu_fix.io.load import FileIdentity, file_identity
from onnx_npu_fix.io.serialize import model_bytes
from onnx_npu_fix.pipeline.inputs import Feeds
from onnx_npu_fix.pipeline.validation.runs import run_model
from onnx_npu_fix.pipeline.validation.session import Outputs, Runner, runtime_errors, write_scratch


class Reference:
    """The original model's outputs, computed on a worker thread so that they cost (almost) no wall time.

    The session is built as soon as the model file has passed the onnx checker, while npufix rewrites it; the
    runs start when :meth:`run` hands over the inputs. onnxruntime releases the GIL while it works, and its idle
    workers do not spin (see Runner), so the passes keep a core. ``source``: serialized bytes, or a file path.

    Bytes are parsed and written to :attr:`weights` (io.external.MappedWeights, a run-owned scratch directory), so
    that onnxruntime maps the weights instead of copying them (given bytes it copies them twice, given the input
    file once, into its heap); the candidates' sessions share the weights a pass left alone. The pass manager's
    Validator takes the store over (:meth:`take_weights`); else :meth:`close` removes it.

    ``read_from``: the file ``source`` (bytes) was read from. The Reference checks that the file is still the one
    read: its ``identity`` (io.load.FileIdentity: inode, size, modification and change times, taken while reading)
    once the session is built, or, without one (a file changed too recently for its timestamps to tell), its
    SHA-256 against that of the bytes read. When it is not (replaced, rewritten or removed since it was read),
    the outputs raise InputError: a rollback reads that file again, and a run whose input moved under it stops;
    validation is never silently off.

    ``long_graph``: the model is run in segments (:func:`segmented`): it is parsed from ``source`` (the bytes
    read: no file is opened again) and run by :func:`run_model`.
    """

    def __init__(self, source: str | bytes | onnx.ModelProto, *, read_from: str | None = None,
                 identity: FileIdentity | None = None,
                 long_graph: bool = False, start: bool = True, digest: bytes | None = None) -> None:
        """``digest``: the SHA-256 of ``source`` (bytes read from ``read_from``), when the reader took it already.
        ``start``: start the worker now; False: at :meth:`start`, which a caller that will close this object
        calls once it holds it where its ``finally`` closes it (a signal in between would leave the worker waiting
        for inputs forever, its scratch files with it, and the interpreter's exit waiting for the worker)."""
        self._feeds: concurrent.futures.Future = concurrent.futures.Future()
        self._closing = False
        self._enough_with_one = False
        self.rerun_path: str | None = None
        """The scratch copy the original's session was built from (in :attr:`weights`, which outlives this
        object once taken): where its other input sets can be run later, when the runs stopped early."""
        self.weights = MappedWeights()
        if isinstance(source, onnx.ModelProto):
            # A model whose weights are left in the input's data file (ir.weights): written to the scratch
            # directory now, while nothing changes it (their bytes copied file to file, never serialized).
            self.rerun_path = write_scratch(self.weights, source)
            source = self.rerun_path if self.rerun_path is not None else model_bytes(source)
        self._source: str | bytes | None = source
        self._read_from = read_from
        self._identity = identity
        self._known_digest = digest
        self._long_graph = long_graph
        self.keeps_copy = (isinstance(source, bytes) or self.rerun_path is not None) and not long_graph
        """Whether the original's session runs from a scratch copy (:attr:`rerun_path`, once it ran): bytes are
        written to :attr:`weights`, a model already is; a long graph is run in segments, a path as it is."""
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
        digest = (self._known_digest or hashlib.sha256(source).digest()) if from_file else None
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
            scratch = write_scratch(self.weights, source)
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
