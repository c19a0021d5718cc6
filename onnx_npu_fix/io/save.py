"""Writing: models (atomically, with external data above 2 GB, or early while validation still runs) and strict
JSON records."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import math
import os
import tempfile
from typing import Any

import onnx

from onnx_npu_fix.ir.graph import TWO_GB, approx_model_bytes, payload_bytes


class EarlyWrite:
    """The output file written while validation still runs, committed only if those bytes are the result.

    Pass :meth:`start` to :func:`fix` as ``on_serialized``: the pass manager hands over the final model's bytes
    before its last onnxruntime runs, and a worker thread writes them to a temporary file in the target directory
    (the write releases the GIL; 0.1-0.3 s for 100 MB that otherwise follow validation). :func:`save_model`
    renames that file into place when it is asked to write the same bytes; anything else discards it, and so does
    :meth:`discard` (call it when nothing is to be written).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._data: bytes | None = None
        self._tmp: str | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="npufix-write")
        self._written: concurrent.futures.Future | None = None

    def start(self, data: bytes) -> None:
        """Begin writing ``data`` (replacing an earlier start). A file system error here only means no early
        write: :func:`save_model` then writes as usual and reports it."""
        self.discard()
        try:
            fd, tmp = tempfile.mkstemp(prefix=".npufix-", suffix=".tmp", dir=os.path.dirname(self.path))
        except OSError:
            return
        self._data, self._tmp = data, tmp
        self._written = self._executor.submit(_write_fd, fd, data)

    def commit(self, data: bytes) -> bool:
        """Rename the early file into place if it holds ``data`` (the same object) and was written; else
        discard it and return False (the caller then writes normally)."""
        if self._written is None or data is not self._data:
            self.discard()
            return False
        tmp = self._tmp
        try:
            self._written.result()
            os.chmod(tmp, 0o666 & ~current_umask())
            os.replace(tmp, self.path)
        except BaseException:
            self.discard()
            raise
        self._written = self._tmp = self._data = None
        return True

    def discard(self) -> None:
        if self._written is not None:
            with contextlib.suppress(Exception):
                self._written.result()
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
        self._written = self._tmp = self._data = None

    def close(self) -> None:
        self.discard()
        self._executor.shutdown(wait=True)


def _write_fd(fd: int, data: bytes) -> None:
    with open(fd, "wb") as f:
        f.write(data)


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, external_data: bool | None = None,
               serialized: bytes | None = None, early: EarlyWrite | None = None) -> None:
    """Write ``model`` atomically: temporary files in the target directory, then renames.

    Models above 2 GB, or when ``external_data`` is True, keep every initializer of 1 KiB or more in
    ``<name>.data`` next to the output, written fresh (onnx's own writer appends to an existing data file and
    checks for it relative to the working directory). In that case the written tensors' data moves out of the
    in-memory ``model`` (it then refers to the data file), which saves a copy of the weights.
    ``serialized``: ``model`` already serialized (FixResult.serialized), written as is.
    ``early``: an :class:`EarlyWrite` to ``path`` that may already hold those bytes.
    """
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    if external_data is None:
        # Bytes in hand mean the model is below 2 GB (protobuf cannot serialize more): no need to size it again.
        external_data = (serialized is None and approx_model_bytes(model) >= TWO_GB) or _uses_external_data(model)
    if early is not None:
        if not external_data and serialized is not None and early.path == path and early.commit(serialized):
            return
        early.discard()
    fd, tmp = tempfile.mkstemp(prefix=".npufix-", suffix=".tmp", dir=directory)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~current_umask())
    tmp_data = None
    try:
        if external_data:
            fd, tmp_data = tempfile.mkstemp(prefix=".npufix-", suffix=".data.tmp", dir=directory)
            os.close(fd)
            os.chmod(tmp_data, 0o666 & ~current_umask())
            write_with_external_data(model, tmp, tmp_data, os.path.basename(path) + ".data", in_place=True)
        else:
            with open(tmp, "wb") as f:
                f.write(serialized if serialized is not None else model.SerializeToString())
        if tmp_data is not None:
            os.replace(tmp_data, os.path.join(directory, os.path.basename(path) + ".data"))
            tmp_data = None
        os.replace(tmp, path)
    except BaseException:
        for leftover in (tmp, tmp_data):
            if leftover is not None:
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        raise


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def write_with_external_data(model: onnx.ModelProto, model_file: str, data_file: str, location: str, *,
                             in_place: bool, threshold: int = 1024) -> None:
    """Write ``model`` to ``model_file`` with every raw initializer of ``threshold`` bytes or more in
    ``data_file`` (written fresh), referenced as ``location`` (relative to the model file's final place).

    ``in_place``: the model's own tensors are pointed at the data file (no copy of the weights; the caller is
    done with them). Otherwise the model is untouched and a shell copy refers to the file.
    """
    target = model
    if not in_place:
        target = onnx.ModelProto()
        _copy_without_initializers(model, target)
    with open(data_file, "wb") as data:
        for tensor in model.graph.initializer:
            big = (tensor.data_location != onnx.TensorProto.EXTERNAL and tensor.HasField("raw_data")
                   and payload_bytes(tensor) >= threshold)
            if not big:
                if not in_place:
                    target.graph.initializer.append(tensor)
                continue
            offset = data.tell()
            raw = tensor.raw_data  # one copy out of the message; every read of the field makes another
            data.write(raw)
            ref = tensor if in_place else onnx.TensorProto(name=tensor.name, data_type=tensor.data_type,
                                                           dims=tensor.dims)
            del ref.external_data[:]
            for key, value in (("location", location), ("offset", str(offset)),
                               ("length", str(len(raw)))):
                ref.external_data.add(key=key, value=value)
            ref.data_location = onnx.TensorProto.EXTERNAL
            del raw
            if in_place:
                tensor.ClearField("raw_data")
            else:
                target.graph.initializer.append(ref)
    with open(model_file, "wb") as f:
        f.write(target.SerializeToString())


def _copy_without_initializers(model: onnx.ModelProto, target: onnx.ModelProto) -> None:
    """Copy every field of ``model`` into ``target`` except the graph's initializers (the weights)."""
    _copy_fields(model, target, skip="graph")
    _copy_fields(model.graph, target.graph, skip="initializer")


def _copy_fields(source: Any, target: Any, *, skip: str) -> None:
    for desc, value in source.ListFields():
        if desc.name == skip:
            continue
        if getattr(desc, "is_repeated", None) or getattr(desc, "label", None) == 3:  # 3: LABEL_REPEATED
            getattr(target, desc.name).extend(value)
        elif desc.message_type is not None:
            getattr(target, desc.name).CopyFrom(value)
        else:
            setattr(target, desc.name, value)


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


def current_umask() -> int:
    """The process umask (read by setting and restoring it): files written through a temporary name get the mode
    a plain open() would have given them."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str, data: Any) -> None:
    """Write strict JSON atomically: a uniquely named temporary file next to ``path`` (never a fixed name that
    could be another file of the run), then a rename."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".npufix-", suffix=".json.tmp", dir=directory)
    try:
        with open(fd, "w", encoding="utf-8") as f:
            f.write(dumps(data))
            f.write("\n")
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
