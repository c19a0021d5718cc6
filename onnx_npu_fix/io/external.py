"""External data: a model written with its weights in a ``.data`` file beside it (:func:`write_with_external_data`,
the output above 2 GB), and the scratch models onnxruntime maps its weights from (:class:`MappedWeights`)."""

from __future__ import annotations

import functools
import mmap
import os
import tempfile
import threading
from typing import Any

import numpy as np
import onnx

from onnx_npu_fix.io.atomic import create_unique, remove_file, remove_tree
from onnx_npu_fix.io.serialize import (
    GRAPH_TAG,
    copy_without_initializers,
    graph_field,
    tensor_header,
    varint,
    wire_fields,
)
from onnx_npu_fix.ir import weights
from onnx_npu_fix.ir.graph import payload_bytes


def uses_external_data(model: onnx.ModelProto) -> bool:
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
        copy_without_initializers(model, target)
    with open(data_file, "wb") as data:
        for tensor in model.graph.initializer:
            lazy = weights.is_lazy(tensor)
            big = lazy or (tensor.data_location != onnx.TensorProto.EXTERNAL and tensor.HasField("raw_data")
                           and payload_bytes(tensor) >= threshold)
            if not big:
                if not in_place:
                    target.graph.initializer.append(tensor)
                continue
            offset = data.tell()
            if lazy:
                data.flush()  # the copy writes at the file's position, past what the buffer holds
                length = weights.copy_lazy(tensor, data)
            else:
                raw = tensor.raw_data  # one copy out of the message; every read of the field makes another
                data.write(raw)
                length = len(raw)
                del raw
            ref = tensor if in_place else onnx.TensorProto(name=tensor.name, data_type=tensor.data_type,
                                                           dims=tensor.dims)
            _refer(ref, location, offset, length)
            if in_place:
                tensor.ClearField("raw_data")
            else:
                target.graph.initializer.append(ref)
    with open(model_file, "wb") as f:
        f.write(target.SerializeToString())


def _refer(ref: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Make ``ref`` refer to ``length`` bytes at ``offset`` of data file ``location``."""
    del ref.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        ref.external_data.add(key=key, value=value)
    ref.data_location = onnx.TensorProto.EXTERNAL


PAGE = mmap.ALLOCATIONGRANULARITY
"""Every weight in a :class:`MappedWeights` file starts at a multiple of this (the unit in which mmap takes file
offsets: 4 KiB on Linux, 64 KiB on Windows), so that a loader can map each tensor in place instead of copying it.
onnxruntime 1.32 maps them: a session's heap then holds no copy of the weights, whose pages are the file's."""


class _RunDirectory:
    """A run-owned temporary directory (``PREFIX`` + random, in the system's temporary directory) with one data
    file (``DATA``), both made at the first write. The directory's name is registered before it exists, so a
    signal during its creation cannot orphan it; :meth:`_remove` (the owner's close, in a ``finally``) removes it."""

    PREFIX = "npufix-"
    DATA = "weights.data"

    def __init__(self) -> None:
        self.directory: str | None = None
        self._file: Any = None
        self._lock = threading.Lock()

    def _register(self, name: str | None) -> None:
        self.directory = name

    def _data_file(self) -> Any:
        """The data file, open for reading and writing, unbuffered (made with the directory if need be)."""
        if self._file is None:
            if self.directory is None:  # else an earlier attempt made it and failed after: the same one, reused
                create_unique(tempfile.gettempdir(), self.PREFIX, "", functools.partial(os.mkdir, mode=0o700),
                              self._register)
            assert self.directory is not None
            fd = os.open(os.path.join(self.directory, self.DATA), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            self._file = os.fdopen(fd, "r+b", buffering=0)
        return self._file

    def _remove(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.directory is not None:
            remove_tree(self.directory)
            self.directory = None


class MappedWeights(_RunDirectory):
    """Scratch models for onnxruntime, their weights in one data file it maps instead of copying (validation: the
    original's session and each candidate's). Lives in a run-owned temporary directory that :meth:`close`
    removes (the caller closes it in a ``finally``: every exit path, KeyboardInterrupt and SIGTERM included); the
    directory's name is registered before it exists, so a signal during its creation cannot orphan it.

    Each raw initializer of ``threshold`` bytes or more is written once: a later model whose tensor of the same
    name holds the same bytes (compared with those written, not hashed) refers to the same place, so a pass that
    changed two weights writes two weights. Thread-safe (the original's reference thread and the pass manager).
    """

    PREFIX = "npufix-validate-"

    def __init__(self, *, threshold: int = 1024) -> None:
        super().__init__()
        self.threshold = threshold
        self._end = 0
        self._placed: dict[str, tuple[int, int]] = {}
        self._lazy_placed: dict[tuple[str, int, int, str], tuple[int, int]] = {}
        self._models = 0
        self._kept: str | None = None
        self._spans: dict[str, tuple[int, list[tuple[int, int, int]]]] = {}
        """Per model file written by :meth:`write_bytes`: the identity of the bytes object it was written from,
        and where their large raw weights lie (start, end, offset in the data file), for :meth:`keep` to leave
        out: only for those very bytes, which the caller holds from one call to the other."""
        self._recipes: dict[str, tuple[int, list[tuple[int, int, int]]]] = {}
        """Per kept file written from a scratch model's spans: the length of the bytes kept and the spans, what
        :meth:`read_kept` joins back."""
        self.last_written: str | None = None
        """The model file written last (by :meth:`write` or :meth:`write_bytes`)."""
        self._closed = False

    def _open(self) -> Any:
        if self._closed:  # a late writer (a worker thread a signal left running) must not create it again
            raise OSError("the scratch directory was removed")
        return self._data_file()

    def write(self, model: onnx.ModelProto) -> str:
        """Write ``model`` (left as it is) for onnxruntime; returns the model file's path."""
        with self._lock:
            data = self._open()
            assert self.directory is not None
            shell = onnx.ModelProto()
            copy_without_initializers(model, shell)
            for tensor in model.graph.initializer:
                if weights.is_lazy(tensor):
                    offset, length = self._place_lazy(data, tensor)
                elif (tensor.data_location == onnx.TensorProto.EXTERNAL or not tensor.HasField("raw_data")
                        or payload_bytes(tensor) < self.threshold):
                    shell.graph.initializer.append(tensor)
                    continue
                else:
                    raw = tensor.raw_data  # one copy out of the message; every read of the field makes another
                    if not self._maps(tensor, raw):
                        shell.graph.initializer.append(tensor)
                        continue
                    offset, length = self._place(data, tensor.name, raw), len(raw)
                    del raw
                ref = shell.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
                _refer(ref, "weights.data", offset, length)
            return self._write_shell(shell)

    def write_references(self, model: onnx.ModelProto) -> str:
        """``model`` written for the onnx checker alone, nothing copied: each weight left in a data file
        (ir.weights) refers to a stand-in for that file here, a sparse file of its size (the checker asks that
        a referenced file be a regular file of the model's directory, not a link, and reads none of its bytes;
        the weights were checked as they were read or computed). Returns the model file's path."""
        with self._lock:
            self._open()
            assert self.directory is not None
            shell = onnx.ModelProto()
            copy_without_initializers(model, shell)
            stand_ins: dict[str, str] = {}
            for tensor in model.graph.initializer:
                if not weights.is_lazy(tensor):
                    shell.graph.initializer.append(tensor)
                    continue
                source, offset, length, _ = weights.lazy_span(tensor)
                name = stand_ins.get(source)
                if name is None:
                    name = stand_ins[source] = f"stand-in-{len(stand_ins)}.data"
                    with open(os.path.join(self.directory, name), "wb") as f:
                        f.truncate(os.path.getsize(source))
                ref = shell.graph.initializer.add()
                ref.CopyFrom(tensor)
                _refer(ref, name, offset, length)
            return self._write_shell(shell)

    def _write_shell(self, shell: onnx.ModelProto) -> str:
        assert self.directory is not None
        self._models += 1
        path = os.path.join(self.directory, f"model-{self._models}.onnx")
        with open(path, "wb") as f:
            f.write(shell.SerializeToString())
        self.last_written = path
        return path

    def write_bytes(self, data: bytes) -> str:
        """:meth:`write` for a model given as its bytes, without parsing them into a proto (which would hold
        its weights a second time beside them): the graph's initializer entries are found in the wire format,
        each large raw weight written straight from ``data``; the rest is parsed as a small shell. ValueError
        for a layout protobuf accepts but this does not take apart (a field given twice, to be merged)."""
        view = memoryview(data)
        tag_start, start, end = graph_field(data)
        kept, entries = [], []
        for number, field_start, value_start, value_end in wire_fields(data, start, end):
            (entries if number == 5 else kept).append((field_start, value_start, value_end))
        graph = b"".join(view[a:c] for a, _, c in kept)
        shell = onnx.ModelProto()
        shell.ParseFromString(b"".join((view[:tag_start], GRAPH_TAG, varint(len(graph)), graph, view[end:])))
        del graph
        spans = []
        with self._lock:
            file = self._open()
            assert self.directory is not None
            for _, a, c in entries:
                header, raw, start = tensor_header(view, a, c)
                if raw is None or header.data_location == onnx.TensorProto.EXTERNAL or not self._maps(header, raw):
                    shell.graph.initializer.add().ParseFromString(view[a:c])
                    continue
                offset = self._place(file, header.name, raw)
                ref = shell.graph.initializer.add(name=header.name, data_type=header.data_type, dims=header.dims)
                _refer(ref, "weights.data", offset, len(raw))
                spans.append((start, start + len(raw), offset))
            path = self._write_shell(shell)
            self._spans[path] = (id(data), spans)
            return path

    def keep(self, data: bytes, scratch: str | None = None) -> str:
        """``data`` (a serialized model) written to a new file of the directory; returns its path, for
        :meth:`read_kept`. The pass manager's restore point: read back only for a replay or a rollback; it
        replaces the one kept before, which is removed (the run goes back no further than the last validated
        model). ``scratch``: a model file :meth:`write_bytes` wrote from these very bytes; then their large raw
        weights, which the data file holds already, are not written again, only what lies between them (the
        restore point of a model whose weights are large is then about the size of its graph, not of the model)."""
        recipe = self._spans.get(scratch) if scratch is not None else None
        if recipe is not None and recipe[0] != id(data):
            recipe = None
        with self._lock:
            self._open()
            assert self.directory is not None
            self._models += 1
            path = os.path.join(self.directory, f"kept-{self._models}.onnx")
            view, start = memoryview(data), 0
            with open(path, "wb") as f:
                for a, b, _ in recipe[1] if recipe is not None else ():
                    f.write(view[start:a])
                    start = b
                f.write(view[start:])
            if self._kept is not None:
                remove_file(self._kept)
                self._recipes.pop(self._kept, None)
            if recipe is not None:
                self._recipes[path] = (len(data), recipe[1])
            self._kept = path
            return path

    def read_kept(self, path: str) -> bytes:
        """The bytes :meth:`keep` was given for ``path``: the file, with the raw weights it left out read back
        from the data file into their places."""
        with self._lock:
            recipe = self._recipes.get(path)
            with open(path, "rb") as f:
                if recipe is None:
                    return f.read()
                data, pieces, start = self._open(), [], 0
                for a, b, offset in recipe[1]:
                    pieces.append(f.read(a - start))
                    data.seek(offset)
                    pieces.append(_read_exactly(data, b - a))
                    start = b
                pieces.append(f.read())
            # (joined: the pieces and the bytes are two model sizes for a moment, on a replay or rollback only)
            return b"".join(pieces)

    def _maps(self, tensor: onnx.TensorProto, raw: bytes | memoryview) -> bool:
        """Whether ``tensor``'s raw data (``raw``) goes to the data file: ``threshold`` bytes or more, and exactly
        as many as its dims and type say. A weight whose length disagrees stays in the model file, where the onnx
        checker run on that file (validator.check_structure) sees it and says so, as it would on the whole model;
        so does a packed 4-bit one (payload_bytes counts it at twice its size), which costs only its copy."""
        return self.threshold <= len(raw) == payload_bytes(tensor)

    def _place(self, data: Any, name: str, raw: bytes | memoryview) -> int:
        """The offset of ``raw`` (tensor ``name``) in the data file: where it was written, else at the next page."""
        placed = self._placed.get(name)
        if placed is not None and placed[1] == len(raw):
            data.seek(placed[0])
            if _same_bytes(data, raw):
                return placed[0]
        offset = -(-self._end // PAGE) * PAGE
        data.seek(offset)
        view = memoryview(raw)
        while view:
            view = view[data.write(view):]
        self._end = offset + len(raw)
        self._placed[name] = (offset, len(raw))
        return offset

    def _place_lazy(self, data: Any, tensor: onnx.TensorProto) -> tuple[int, int]:
        """Where a weight left in the input's data file (ir.weights) lies in the data file, and its length:
        copied there from file to file at the next page the first time, the same place after."""
        span = weights.lazy_span(tensor)
        placed = self._lazy_placed.get(span)
        if placed is None:
            offset = -(-self._end // PAGE) * PAGE
            data.seek(offset)
            length = weights.copy_lazy(tensor, data)
            self._end = offset + length
            placed = self._lazy_placed[span] = (offset, length)
            self._placed[tensor.name] = placed  # the same bytes inline (a serialized model) are found there
        return placed

    def close(self) -> None:
        """Remove the directory and everything in it (a session that still maps the data keeps its pages)."""
        with self._lock:
            self._closed = True
            self._remove()
            self._placed.clear()
            self._lazy_placed.clear()


def _read_exactly(file: Any, size: int) -> bytes:
    """``size`` bytes from an unbuffered ``file`` (one read may return fewer)."""
    data = weights.read_up_to(file, size)
    if len(data) < size:
        raise OSError("the scratch data file is shorter than a weight placed in it")
    return data


def _same_bytes(file: Any, raw: bytes | memoryview, block: int = 1 << 20) -> bool:
    """Whether ``file`` holds ``raw`` from where it stands: compared a block at a time as bytes (a memoryview
    compares byte by byte through its item format, far slower; a copy of a whole weight would be a transient)."""
    view = memoryview(raw)
    for start in range(0, len(view), block):
        part = view[start:start + block].tobytes()
        if file.read(len(part)) != part:
            return False
    return True



class SpillFile(_RunDirectory):
    """The large weights a run's passes compute for a model whose weights stay in the input's data file
    (ir.weights.spilling): appended to one file of a run-owned temporary directory, the tensors referring to
    them as to the input's, so that the proto holds no weight the run made either (a fold of every weight of a
    model would otherwise hold them all). The output's writer copies them from here file to file. Created at
    the first weight; :meth:`close` removes it (the caller closes it in a ``finally``, once the output is
    staged: every exit path)."""

    PREFIX = "npufix-weights-"
    DATA = "computed.data"

    def put(self, tensor: onnx.TensorProto, value: Any) -> None:
        with self._lock:
            file = self._data_file()
            assert self.directory is not None
            offset = file.seek(0, os.SEEK_END)
            view = memoryview(np.ascontiguousarray(value)).cast("B")
            length = len(view)
            while view:
                view = view[file.write(view):]
            weights.leave_in_file(tensor, os.path.join(self.directory, self.DATA), offset, length, weights.SPILLED)

    def close(self) -> None:
        with self._lock:
            self._remove()
