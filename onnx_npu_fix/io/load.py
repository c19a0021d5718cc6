"""Reading a model: the file, its external data, sparse initializers made dense, the onnx checker and the
structural checks onnxruntime would otherwise fail on later; then :func:`prepare` (``--input-shape``, node names,
shapes) for the pass manager and the analyses alike. Every problem is an InputError with a one-line reason
(exit 2)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.external_data_helper
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError

from onnx_npu_fix.errors import InputChanged, InputError, first_line
from onnx_npu_fix.host.heap import release_freed_memory
from onnx_npu_fix.ir import weights
from onnx_npu_fix.ir.graph import (
    TWO_GB,
    approx_model_bytes,
    clear_negative_dims,
    feedable_inputs,
    infer_shapes,
    name_unnamed_nodes,
    set_input_shapes,
)
from onnx_npu_fix.ir.structure import structural_problem


@dataclass
class LoadedModel:
    model: onnx.ModelProto
    path: str
    external_files: set[str]
    """Absolute paths of the external data files the model was read from (empty for a self-contained file)."""
    data: bytes | None = None
    """The bytes read, for a self-contained file read with ``keep_bytes`` (None otherwise, or once
    :func:`start_reference` took them)."""
    identity: FileIdentity | None = None
    """The file as it was when read (see :class:`FileIdentity`); None when that cannot prove it unchanged."""
    digest: bytes | None = None
    """The SHA-256 of the file's bytes as read: what every later read of the input is compared with
    (:func:`read_unchanged`), and what the record names."""


@dataclass(frozen=True)
class FileIdentity:
    """Which file, and which version of it: device, inode, size, modification and change times. A rewrite in
    place moves the change time (which no user call can set back) and a replacement the inode, so a file whose
    identity is unchanged still holds the bytes read — provided its change time was older than the file system's
    clock tick when it was read (a write in the same tick could leave every field as it was: :func:`file_identity`
    then gives none, and the caller hashes the file again)."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


SETTLED_NS = 1_000_000_000
"""How long ago a file must have changed for its timestamps to tell a later write apart (file times come from a
coarse clock, a few milliseconds a tick; one second leaves room for file systems that keep less)."""


def file_identity(path: str, stat: os.stat_result | None = None) -> FileIdentity | None:
    """``path``'s :class:`FileIdentity` (from ``stat`` when given), or None when unreadable or changed too
    recently (within :data:`SETTLED_NS`) for its timestamps to reveal a rewrite."""
    try:
        stat = stat or os.stat(path)
    except OSError:
        return None
    if time.time_ns() - stat.st_ctime_ns < SETTLED_NS:
        return None
    return FileIdentity(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and sanity-check an ONNX model (external data included). Raises InputError with a one-line reason."""
    return read_model(path).model


def read_model(path: str | os.PathLike, *, keep_bytes: bool = False, lazy_weights: bool = False) -> LoadedModel:
    """:func:`load_model`, also saying which external data files the model came from. ``keep_bytes``: keep the
    file's bytes in ``LoadedModel.data`` for :func:`start_reference` (which takes them over). ``lazy_weights``:
    leave the large weights of a model with external data in their files (ir.weights), for a caller whose every
    reader and writer of the model knows them."""
    path = os.fspath(path)
    raw, identity = _read_file(path)
    # The checker first, on the bytes alone: its C++ copy of the model is freed before Python parses its own, so
    # the two never coexist (together they raised a self-contained model's peak above onnx.load's). A model it
    # refuses is parsed anyway and judged below, so that a file that is no model at all still gets the decode
    # error, and a model with external data the checker that sees its data.
    checked = _passes_checker(raw)
    model = _parse(raw, path)
    external = _load_external_data(model, path, lazy=lazy_weights)
    sparse = len(model.graph.sparse_initializer) > 0
    densify_sparse_initializers(model)
    if not model.graph.output:
        raise InputError(f"{path}: the graph has no outputs; nothing to validate or fix")
    try:
        if not external and not sparse:
            if not checked:
                onnx.checker.check_model(raw)  # again, for its message
        elif sparse and approx_model_bytes(model) < TWO_GB:
            onnx.checker.check_model(model)  # the densified model is not the file's
        else:
            # The file, with its data files beside it: the checker reads the model file (kilobytes) and checks the
            # data files it names, instead of a serialized copy of every weight plus its own parse of that copy
            # on top of the model just read. What only the weights' bytes tell (a truncated tensor) was checked
            # as they were read (_check_external_sizes).
            onnx.checker.check_model(path)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: the model fails the onnx checker: {first_line(exc)}") from None
    problem = structural_problem(model)
    if problem:
        raise InputError(f"{path}: invalid model: {problem}")
    kept = keep_bytes and not external and not sparse
    return LoadedModel(model, path, external, raw if kept else None, identity if kept else None,
                       hashlib.sha256(raw).digest())


def read_unchanged(path: str | os.PathLike, digest: bytes | None, *, keep_bytes: bool = False) -> LoadedModel:
    """The input read again (a candidate of the judge loop, a rollback), proven to hold the bytes read first
    (``digest``: :attr:`LoadedModel.digest`); InputError when it does not: a run never mixes two inputs."""
    loaded = read_model(path, keep_bytes=keep_bytes)
    if digest is not None and loaded.digest != digest:
        raise InputChanged(f"{os.fspath(path)} changed while npufix ran (it no longer holds the bytes that were "
                         f"read); nothing written: rerun on a file that stays put")
    return loaded


def _read_file(path: str) -> tuple[bytes, FileIdentity | None]:
    """The file's bytes and its identity as read (None when it changed while read, or too recently), or
    InputError for a path that holds no file to read."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected an .onnx file")
    if os.path.getsize(path) == 0:
        raise InputError(f"{path}: empty file, expected an ONNX model")
    try:
        with open(path, "rb") as f:
            before = file_identity(path, os.fstat(f.fileno()))
            raw = f.read()
            after = file_identity(path, os.fstat(f.fileno()))
            return raw, before if before == after else None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _passes_checker(raw: bytes) -> bool:
    """Whether the onnx checker accepts the serialized model ``raw`` as it stands (external data unread)."""
    try:
        onnx.checker.check_model(raw)
    except Exception:  # noqa: BLE001 - any refusal: read_model judges the parsed model and says why
        return False
    finally:
        release_freed_memory()  # what its C++ copy of the model left in the heap (heap.py)
    return True


def _parse(raw: bytes, path: str) -> onnx.ModelProto:
    """The ModelProto ``raw`` holds (external data not loaded yet)."""
    try:
        model = onnx.ModelProto()
        model.ParseFromString(raw)
    except DecodeError as exc:
        raise InputError(f"{path}: not an ONNX model (protobuf decode failed: {exc}); "
                         f"was the file truncated?") from None
    except Exception as exc:  # noqa: BLE001 - onnx raises many types for unreadable files
        raise InputError(f"{path}: cannot load as ONNX ({type(exc).__name__}: {first_line(exc)})") from None
    if not model.HasField("graph") or model.ir_version <= 0 or not model.opset_import:
        raise InputError(f"{path}: not an ONNX model (no graph, IR version or opset); is it another protobuf?")
    return model


def _load_external_data(model: onnx.ModelProto, path: str, *, lazy: bool = False) -> set[str]:
    """Load the external data ``model`` (read from ``path``) refers to; returns the files' absolute paths.
    ``lazy``: large tensors the files hold exactly are left there instead (ir.weights)."""
    base_dir = os.path.dirname(os.path.abspath(path))
    external = external_data_files(model, base_dir)
    for location in sorted(external):
        if not os.path.isfile(location):
            raise InputError(f"{path}: external data file {location} is missing; keep the .data file next to "
                             f"the model")
    if not external:
        return external
    try:
        files = {location: os.stat(location) for location in external} if lazy else {}
        left = [t for t in model.graph.initializer
                if lazy and t.data_location == onnx.TensorProto.EXTERNAL and _leave_in_file(t, base_dir, files)]
        names = {t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL} - {
            t.name for t in left}
        for tensor in left:  # hidden from onnx's loader, which reads every other external tensor (in nodes too)
            tensor.data_location = onnx.TensorProto.DEFAULT
        onnx.external_data_helper.load_external_data_for_model(model, base_dir)
        for tensor in left:
            tensor.data_location = onnx.TensorProto.EXTERNAL
        _check_external_sizes(model, path, names)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: cannot read external data ({type(exc).__name__}: {first_line(exc)})") from None
    return external


def _leave_in_file(tensor: onnx.TensorProto, base_dir: str, files: dict[str, os.stat_result]) -> bool:
    """Make ``tensor`` a reference to its bytes in its data file (ir.weights) if it is large and the file holds
    exactly its bytes where it says (what onnx's loader would read, and no more): True when it did."""
    if tensor.data_type in (0, onnx.TensorProto.STRING) or tensor.data_type in _PACKED_TYPES:
        return False
    info = onnx.external_data_helper.ExternalDataInfo(tensor)
    location = os.path.normpath(os.path.join(base_dir, info.location))
    st = files.get(location)
    expected = weights.needed_bytes(tensor)
    if st is None or expected < weights.LAZY_MIN_BYTES:
        return False
    offset = info.offset or 0
    length = info.length if info.length is not None else st.st_size - offset
    if length != expected or offset + length > st.st_size or len(unknown_fields.UnknownFieldSet(tensor)):
        return False  # (fields protobuf does not know would not survive the serialization of a reference)
    weights.leave_in_file(tensor, location, offset, length, weights.file_identity(st))
    return True


# 4-bit element types (onnx >= 1.16 / 1.18 name them; getattr keeps older onnx working).
_PACKED_TYPES = frozenset(getattr(onnx.TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1")
                          if hasattr(onnx.TensorProto, name))


def _check_external_sizes(model: onnx.ModelProto, path: str, names: set[str]) -> None:
    """Every tensor read from external data (``names``) holds as many bytes as its shape and type need (older onnx
    versions read a truncated file silently, and the checker then says something unrelated)."""
    for tensor in model.graph.initializer:
        if tensor.name not in names or tensor.data_type in (0, onnx.TensorProto.STRING):
            continue
        if tensor.data_type in _PACKED_TYPES:  # two elements a byte: the size rule below does not apply
            continue
        expected = weights.needed_bytes(tensor)
        if len(tensor.raw_data) < expected:
            raise InputError(f"{path}: external data of tensor {tensor.name} is truncated ({len(tensor.raw_data)} "
                             f"of {expected} bytes); keep the complete .data file next to the model")


def external_data_files(model: onnx.ModelProto, base_dir: str) -> set[str]:
    """Absolute paths of the external data files ``model``'s initializers refer to."""
    files = set()
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    files.add(os.path.normpath(os.path.join(base_dir, entry.value)))
    return files


def densify_sparse_initializers(model: onnx.ModelProto) -> None:
    """Replace sparse initializers by dense ones (shape inference and most compilers ignore sparse ones)."""
    graph = model.graph
    for sparse in graph.sparse_initializer:
        values = onnx.numpy_helper.to_array(sparse.values)
        indices = onnx.numpy_helper.to_array(sparse.indices).astype(np.int64)
        dims = tuple(sparse.dims)
        dense = np.zeros(int(np.prod(dims, dtype=np.int64)), dtype=values.dtype)
        flat = indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, dims)
        dense[flat] = values
        graph.initializer.append(onnx.numpy_helper.from_array(dense.reshape(dims), sparse.values.name))
    del graph.sparse_initializer[:]


def prepare(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None, *,
            strict: bool = True, light: bool = False) -> str | None:
    """Normalise ``model`` in place for the passes and the analyses: ``input_shapes`` frozen (``--input-shape``),
    unnamed nodes named, fresh shape information. An input-shape override naming no graph input is an InputError
    that lists the inputs.

    ``strict``: a model shape inference rejects is an InputError (the pass manager needs every shape). Otherwise
    (read-only analysis, where the failure is a finding) the first line of the inference error is returned and
    ``model`` carries whatever non-strict inference could find; None when inference succeeded.
    ``light``: ``model`` is a shape-only copy already (``graph.infer_shapes``)."""
    clear_negative_dims(model.graph)
    if input_shapes:
        try:
            set_input_shapes(model, dict(input_shapes))
        except KeyError as exc:
            if exc.args[0] == "":
                fed = feedable_inputs(model)
                raise InputError(f"--input-shape without a name needs a model with one input; this one has "
                                 f"{len(fed)} ({', '.join(fed) or 'none'}): write NAME:D1,D2,... for each") from None
            names = ", ".join(i.name for i in model.graph.input) or "none"
            raise InputError(f"--input-shape names '{exc.args[0]}', which is not a graph input "
                             f"(inputs: {names})") from None
    name_unnamed_nodes(model.graph)
    try:
        infer_shapes(model, light=light)
        release_freed_memory()  # what shape inference's copies left in the heap (heap.py)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types; all mean the same to the user
        if strict:
            raise InputError(f"shape inference fails on the input model: {first_line(exc)}; "
                             f"fix the model or freeze its inputs with --input-shape") from None
        error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _infer_what_can_be(model)
        return error
    return None


def _infer_what_can_be(model: onnx.ModelProto) -> None:
    """Non-strict shape inference into ``model``'s value_info (the declared ones stay when even that fails)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - keep the declared value_info
        return
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
