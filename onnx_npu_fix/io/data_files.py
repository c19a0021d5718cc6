"""The one reader of user data files (``--validation-data``, ``--freeze-input``): .npy, .npz and JSON text, bounded.

Every file is checked before anything is allocated for it:

- it is a regular file (``stat`` before it is opened, ``fstat`` after, opened non-blocking): a FIFO, a device or a
  socket is refused, as reading one waits for a writer that may never come or never ends;
- it holds at most ``MAX_DATA_BYTES``;
- an array's header (.npy, an .npz member, an array inside JSON) claims no more elements than the bytes that follow
  it hold, and no object dtype (a file holds numbers only, never code);
- JSON nests at most ``MAX_JSON_DEPTH`` levels (Python's parser recurses per level).

Each refusal is an InputError of one line that starts with the ``where`` the caller gives (the option and the
file) and says what to do.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import stat
import zipfile
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from onnx_npu_fix.errors import InputError, first_line

MAX_DATA_BYTES = 4 << 30
"""Bytes a data file, or the arrays of one run's input sets, may hold at most."""
MAX_JSON_DEPTH = 64
"""Nesting levels of a JSON data file at most (Polygraphy's input sets take three)."""
_ZIP_MAGIC = b"PK\x03\x04"
_NPY_MAGIC = b"\x93NUMPY"
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_DEPTH_CHUNK = 1 << 20


def open_regular(path: str, where: str) -> IO[bytes]:
    """``path`` opened for reading, once it is known to be a regular file of at most ``MAX_DATA_BYTES``."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise _not_regular(where)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise InputError(f"{where}: cannot read it ({first_line(exc)})") from None
    f = os.fdopen(fd, "rb")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # replaced between the two looks
        f.close()
        raise _not_regular(where)
    if info.st_size > MAX_DATA_BYTES:
        f.close()
        raise InputError(f"{where}: {info.st_size} bytes, more than a data file may hold ({MAX_DATA_BYTES}); "
                         f"give fewer or smaller input sets")
    return f


def _not_regular(where: str) -> InputError:
    return InputError(f"{where}: not a regular file (a FIFO, a device or a socket); give a file numpy (.npy, "
                      f".npz) or Polygraphy (.json) wrote")


def read_text(path: str, where: str) -> str:
    """The UTF-8 text of a regular file (see :func:`open_regular`)."""
    with open_regular(path, where) as f:
        try:
            return f.read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{where}: cannot read it ({first_line(exc)})") from None


def load_json(text: str, where: str, *, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None
              ) -> Any:
    """The JSON document ``text``, its nesting depth checked before it is parsed."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise InputError(f"{where}: JSON nested {depth} levels deep, more than {MAX_JSON_DEPTH}; give the file "
                         f"polygraphy run --save-inputs wrote")
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not JSON ({first_line(exc)})") from None


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets inside strings do not count), counted
    without recursion."""
    skeleton = _JSON_STRING.sub('""', text)
    depth = deepest = 0
    for start in range(0, len(skeleton), _DEPTH_CHUNK):
        codes = np.frombuffer(skeleton[start:start + _DEPTH_CHUNK].encode("latin-1", "replace"), np.uint8)
        steps = (np.isin(codes, (ord("["), ord("{"))).astype(np.int64)
                 - np.isin(codes, (ord("]"), ord("}"))).astype(np.int64))
        if steps.size:
            levels = depth + np.cumsum(steps)
            deepest = max(deepest, int(levels.max()))
            depth = int(levels[-1])
    return deepest


def read_npy(path: str, where: str) -> np.ndarray:
    """The array of an .npy file."""
    with open_regular(path, where) as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC:
            raise InputError(f"{where}: an .npz archive, expected one array (.npy)")
        f.seek(0)
        return read_array(f, size, where)


def array_from_bytes(data: bytes, where: str) -> np.ndarray:
    """The array of .npy bytes held in memory (an array inside a JSON file); .npz bytes give their first
    member."""
    if data[:len(_ZIP_MAGIC)] == _ZIP_MAGIC:
        with NpzArchive(io.BytesIO(data), where) as archive:
            if not archive.members:
                raise InputError(f"{where}: an empty array archive")
            return archive.array(next(iter(archive.members)))
    return read_array(io.BytesIO(data), len(data), where)


def read_array(stream: IO[bytes], size: int, where: str) -> np.ndarray:
    """The .npy array at the start of ``stream`` (``size`` bytes in all), its header checked against ``size``
    before its data is allocated."""
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    except (ValueError, EOFError, OSError, SyntaxError) as exc:
        raise InputError(f"{where}: not an .npy array ({first_line(exc)}); save it with numpy.save") from None
    if dtype.hasobject:
        raise InputError(f"{where}: holds Python objects ({dtype}), not numbers; save a numeric array")
    if any(d < 0 for d in shape):
        raise InputError(f"{where}: its header gives a negative dimension {shape}; save it with numpy.save")
    count = math.prod(shape)
    needed = count * dtype.itemsize
    available = size - stream.tell()
    if needed > available:
        raise InputError(f"{where}: its header claims {count} elements of {dtype} ({needed} bytes), the file holds "
                         f"{available} bytes after it: it is truncated or was not written by numpy.save; save the "
                         f"array again")
    if needed > MAX_DATA_BYTES:
        raise InputError(f"{where}: {count} elements of {dtype} ({needed} bytes), more than a data file may hold "
                         f"({MAX_DATA_BYTES}); give fewer or smaller input sets")
    flat = np.empty(count, dtype)
    view = memoryview(flat.view(np.uint8)) if needed else memoryview(b"")
    filled = 0
    while filled < needed:
        got = stream.readinto(view[filled:])
        if not got:
            raise InputError(f"{where}: ends after {filled} of its {needed} data bytes; save the array again")
        filled += got
    return flat.reshape(shape[::-1]).transpose() if fortran_order else flat.reshape(shape)


class NpzArchive:
    """An .npz archive whose members are read one at a time, each bounded like an .npy file (its header against
    the size the archive's directory records); ``members``: key (the member's name without ``.npy``) -> its
    ZipInfo, readable before any member is."""

    def __init__(self, source: str | IO[bytes], where: str) -> None:
        self.where = where
        stream = open_regular(source, where) if isinstance(source, str) else source
        if stream.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
            stream.close()
            raise InputError(f"{where}: a single array (.npy); expected an .npz keyed by input name")
        stream.seek(0)
        try:
            self.zip = zipfile.ZipFile(stream)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            stream.close()
            raise InputError(f"{where}: cannot read it as .npz ({type(exc).__name__}: {first_line(exc)})") from None
        self.members = {(name[:-len(".npy")] if name.endswith(".npy") else name): self.zip.getinfo(name)
                        for name in self.zip.namelist()}
        total = sum(info.file_size for info in self.members.values())
        if total > MAX_DATA_BYTES:
            self.close()
            raise InputError(f"{where}: its members hold {total} bytes, more than a data file may hold "
                             f"({MAX_DATA_BYTES}); give fewer or smaller input sets")

    def array(self, key: str) -> np.ndarray:
        info = self.members[key]
        where = f"{self.where} ('{key}')"
        try:
            with self.zip.open(info) as member:
                return read_array(member, info.file_size, where)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise InputError(f"{where}: cannot read it ({type(exc).__name__}: {first_line(exc)})") from None

    def close(self) -> None:
        fp = self.zip.fp
        self.zip.close()
        if fp is not None:
            fp.close()

    def __enter__(self) -> NpzArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
