"""Writing models (with external data above 2 GB, or early while validation still runs) and strict JSON records,
through the one atomic write (io/atomic.py)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import math
import os
from typing import Any

import onnx

from onnx_npu_fix.io.atomic import AtomicFile, Transaction
from onnx_npu_fix.io.external import uses_external_data, write_with_external_data
from onnx_npu_fix.ir.graph import TWO_GB, approx_model_bytes


class EarlyWrite:
    """The output file written while validation still runs, committed only if those bytes are the result.

    Pass :meth:`start` to :func:`fix` as ``on_serialized``: the pass manager hands over the final model's bytes
    before its last onnxruntime runs, and a worker thread writes them to a temporary file in the target directory
    (the write releases the GIL; otherwise its time would follow validation's). :func:`save_model`
    renames that file into place when it is asked to write the same bytes; anything else discards it, and so does
    :meth:`discard` (call it when nothing is to be written).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._data: bytes | None = None
        self._target: AtomicFile | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="npufix-write")
        self._written: concurrent.futures.Future | None = None

    def start(self, data: bytes) -> None:
        """Begin writing ``data`` (replacing an earlier start). A file system error here only means no early
        write: :func:`save_model` then writes as usual and reports it. The temporary file is this object's from
        before it is created (a signal between its creation and the worker's start cannot orphan it)."""
        self.discard()
        self._target = target = AtomicFile(self.path)
        try:
            tmp = target.create()
        except OSError:
            self._target = None
            return
        self._data = data
        self._written = self._executor.submit(_write_bytes, tmp, data)

    def take(self, data: bytes) -> AtomicFile | None:
        """The written early file, handed over to the caller (e.g. a :class:`Transaction`) if it holds ``data``
        (the same object); else it is discarded and None returned (the caller then writes normally)."""
        if self._written is None or data is not self._data:
            self.discard()
            return None
        try:
            self._written.result()
        except BaseException:
            self.discard()
            raise
        target = self._target
        self._written = self._target = self._data = None
        return target

    def commit(self, data: bytes) -> bool:
        """Rename the early file into place if it holds ``data`` (the same object) and was written; else
        discard it and return False (the caller then writes normally)."""
        target = self.take(data)
        if target is None:
            return False
        target.commit()
        return True

    def discard(self) -> None:
        if self._written is not None:
            with contextlib.suppress(Exception):
                self._written.result()
        if self._target is not None:
            self._target.discard()
        self._written = self._target = self._data = None

    def close(self) -> None:
        self.discard()
        self._executor.shutdown(wait=True)


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, external_data: bool | None = None,
               serialized: bytes | None = None, early: EarlyWrite | None = None,
               transaction: Transaction | None = None) -> None:
    """Write ``model`` atomically: temporary files in the target directory, then renames.

    Models above 2 GB, or when ``external_data`` is True, keep every initializer of 1 KiB or more in
    ``<name>.data`` next to the output, written fresh (onnx's own writer appends to an existing data file and
    checks for it relative to the working directory). In that case the written tensors' data moves out of the
    in-memory ``model`` (it then refers to the data file), which saves a copy of the weights.
    ``serialized``: ``model`` already serialized (FixResult.serialized), written as is.
    ``early``: an :class:`EarlyWrite` to ``path`` that may already hold those bytes.
    ``transaction``: stage the files there (committed with the run's other files); else committed now.
    """
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    if external_data is None:
        # Bytes in hand mean the model is below 2 GB (protobuf cannot serialize more): no need to size it again.
        external_data = (serialized is None and approx_model_bytes(model) >= TWO_GB) or uses_external_data(model)
    with contextlib.ExitStack() as stack:
        files = transaction if transaction is not None else stack.enter_context(Transaction())
        if early is not None:
            held = None
            if not external_data and serialized is not None and early.path == path:
                held = early.take(serialized)
            early.discard()  # anything it still holds is not the result
            if held is not None:
                files.adopt(held)
                if transaction is None:
                    files.commit()
                return
        data_name = os.path.basename(path) + ".data"
        if external_data:  # staged (and so renamed into place) first, the model that refers to it second
            tmp_data = files.file(os.path.join(directory, data_name), suffix=".data.tmp")
            write_with_external_data(model, files.file(path), tmp_data, data_name, in_place=True)
        else:
            _write_bytes(files.file(path), serialized if serialized is not None else model.SerializeToString())
        if transaction is None:
            files.commit()



def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf, e.g. the error of an output that overflowed) replaced by
    the string "nan" / "inf" / "-inf": the build record is strict JSON, which has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else ("nan" if value != value else ("inf" if value > 0 else "-inf"))
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def dumps(data: Any, indent: int | None = 2) -> str:
    """Strict JSON text (no NaN / Infinity tokens; numpy scalars and other objects as strings)."""
    try:  # almost always: no non-finite number anywhere, and no walk over a record of 100k changes
        return json.dumps(data, indent=indent, default=_json_default, allow_nan=False)
    except ValueError:
        return json.dumps(strict_json(data), indent=indent, default=_json_default, allow_nan=False)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # a numpy scalar
        return strict_json(value.item())
    return str(value)


def sha256_file(path: str | None) -> str | None:
    if path is None or not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: str | os.PathLike, data: Any, *, transaction: Transaction | None = None) -> None:
    """Write strict JSON atomically (a uniquely named temporary file next to ``path``, never a fixed name that
    could be another file of the run); staged in ``transaction`` when given, else committed now."""
    with Transaction() as own:
        files = transaction if transaction is not None else own
        with open(files.file(path, suffix=".json.tmp"), "w", encoding="utf-8") as f:
            f.write(dumps(data))
            f.write("\n")
        if transaction is None:
            own.commit()

