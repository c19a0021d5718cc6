"""Weights left in the input's external data file: read when a pass or a writer needs their bytes, never held.

A model read with external data (io.load.read_model, ``lazy_weights``) keeps each large initializer that the file
holds exactly (its ``length`` what its dims and type need) as a reference: ``data_location`` EXTERNAL and its
``location`` the data file's absolute path. That marks it as held here and nowhere else, and it cannot leave the
process by accident: the onnx checker, onnx's loader and onnxruntime all refuse an absolute location. Everything
that reads values or writes a model knows it instead: ``GraphIndex.const_value`` (through which the passes read
weights) and :func:`tensor_value` read the bytes (:func:`lazy_bytes`); io.serialize serializes the tensor as the
model read eagerly does (its bytes inline); the external-data writers (the output's, the scratch copies
onnxruntime maps) copy the byte range from file to file (:func:`copy_lazy`).

Bytes are read, not mapped: a data file truncated by another process while mapped kills the process (SIGBUS);
read, it is an error that says so. Every read checks afterwards that the file is still the one the model was read
with (device, inode, size, modification time), so a run never mixes two versions of its input.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_npu_fix.errors import InputChanged

LAZY_MIN_BYTES = 1 << 16
"""An external tensor this large (and larger) is left in its file; smaller ones are read into the model."""

_IDENTITY_KEY = "npufix_file"
"""The reference's entry that holds the data file's identity when it was read (device, inode, size, modification
time): in memory only (the writers make their references afresh, and the serialized tensor has its bytes inline)."""

_COPY_BLOCK = 1 << 24

SPILLED = "spilled"
"""The identity of a run's own spill file (:class:`Spill`): appended to while the run goes on, so its size and
time move; nobody else writes it (a private file in a private directory)."""


class Spill(Protocol):
    """Where a run whose weights stay on disk puts the large weights its passes compute (io.external.SpillFile)."""

    def put(self, tensor: onnx.TensorProto, value: np.ndarray) -> None:
        """Write ``value`` (C-contiguous, native byte order) and make ``tensor`` a reference to it."""


_SPILL: contextvars.ContextVar[Spill | None] = contextvars.ContextVar("npufix_spill", default=None)


@contextlib.contextmanager
def spilling(spill: Spill | None) -> Iterator[None]:
    """While open, every weight of LAZY_MIN_BYTES or more that ir.graph's writers give a tensor goes to
    ``spill`` instead of the proto (None: to the proto, as outside)."""
    token = _SPILL.set(spill)
    try:
        yield
    finally:
        _SPILL.reset(token)


def spill(tensor: onnx.TensorProto, value: np.ndarray) -> bool:
    """Give ``tensor`` the bytes of ``value`` in the open spill (:func:`spilling`) if there is one and ``value``
    is large: True when it did (``tensor``'s type and dims are the caller's to set)."""
    store = _SPILL.get()
    if store is None or value.nbytes < LAZY_MIN_BYTES:
        return False
    store.put(tensor, value)
    return True


def file_identity(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def leave_in_file(tensor: onnx.TensorProto, path: str, offset: int, length: int, identity: str) -> None:
    """Make ``tensor`` a reference to ``length`` bytes at ``offset`` of data file ``path`` (absolute), whose
    :func:`file_identity` was ``identity`` when the model was read."""
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    for key, value in (("location", path), ("offset", str(offset)), ("length", str(length)),
                       (_IDENTITY_KEY, identity)):
        tensor.external_data.add(key=key, value=value)
    tensor.data_location = onnx.TensorProto.EXTERNAL


def is_lazy(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor``'s bytes are left in a data file (see the module's docstring)."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return False
    return any(entry.key == _IDENTITY_KEY for entry in tensor.external_data)


def has_lazy(model: onnx.ModelProto) -> bool:
    return any(is_lazy(t) for t in model.graph.initializer)


def lazy_span(tensor: onnx.TensorProto) -> tuple[str, int, int, str]:
    """(data file, offset, length, the file's identity when read) of a lazy tensor."""
    fields = {entry.key: entry.value for entry in tensor.external_data}
    return fields["location"], int(fields["offset"]), int(fields["length"]), fields.get(_IDENTITY_KEY, "")


def lazy_bytes(tensor: onnx.TensorProto) -> bytes:
    """The bytes of lazy ``tensor``, read from its data file."""
    path, offset, length, identity = lazy_span(tensor)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        data = read_up_to(f, length)
        _check_unchanged(path, f, identity, len(data) == length)
    return data


def read_up_to(file: Any, size: int) -> bytes:
    """``size`` bytes from an unbuffered binary ``file`` where it stands, fewer only at its end (one read may
    return fewer than asked)."""
    parts, got = [], 0
    while got < size:
        part = file.read(size - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def lazy_array(tensor: onnx.TensorProto) -> np.ndarray:
    """The value of lazy ``tensor`` (a fresh array, its own bytes)."""
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    value = np.frombuffer(lazy_bytes(tensor), dtype=dtype).reshape(tuple(tensor.dims))
    return value.astype(value.dtype.newbyteorder("="), copy=False)


def needed_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes ``tensor``'s dims and (fixed-size) type need."""
    return math.prod(tensor.dims[:]) * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize


def copy_lazy(tensor: onnx.TensorProto, target: Any) -> int:
    """Append lazy ``tensor``'s bytes to the open binary file ``target`` (at its position; a buffered one
    flushed) straight from file to file where the system can, the bytes never in this process's memory; returns
    how many were written."""
    path, offset, length, identity = lazy_span(tensor)
    with open(path, "rb", buffering=0) as f:
        done = _copy_range(f, target, offset, length)
        _check_unchanged(path, f, identity, done == length)
    return done


def _copy_range(source: Any, target: Any, offset: int, length: int) -> int:
    done = 0
    try:
        while done < length:
            n = os.copy_file_range(source.fileno(), target.fileno(), min(_COPY_BLOCK, length - done), offset + done)
            if n <= 0:
                break
            done += n
    except (AttributeError, OSError):
        pass
    # Not Linux, a file system that refuses, or one that copies nothing: the rest through a buffer.
    source.seek(offset + done)
    while done < length:
        block = memoryview(source.read(min(_COPY_BLOCK, length - done)))
        if not block:
            break
        done += len(block)
        while block:
            block = block[target.write(block):]
    return done


def _check_unchanged(path: str, f: Any, identity: str, complete: bool) -> None:
    """After a read: the file is still the one the model was read with (InputChanged when not)."""
    if not complete or (identity != SPILLED and file_identity(os.fstat(f.fileno())) != identity):
        raise InputChanged(f"{path} changed while npufix ran (the model's external data no longer holds the bytes "
                           f"the model was read with); nothing written: rerun on a file that stays put")


def tensor_value(tensor: onnx.TensorProto) -> np.ndarray:
    """``onnx.numpy_helper.to_array``, reading a weight left in its data file from there."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL and is_lazy(tensor):
        return lazy_array(tensor)
    return numpy_helper.to_array(tensor)
