"""The library entry points: load a model, fix it, save it atomically.

    model = load_model("in.onnx")
    result = fix(model, FixOptions(max_dilation=4, align=8))
    if result.ok:
        save_model(result.model, "out.onnx")
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.external_data_helper
from google.protobuf.message import DecodeError

from onnx_npu_fix.errors import InputError, first_line
from onnx_npu_fix.graph import TWO_GB, approx_model_bytes, write_with_external_data
from onnx_npu_fix.options import FixOptions
from onnx_npu_fix.passes import DEFAULT_ORDER, PASSES
from onnx_npu_fix.passes.base import Pass
from onnx_npu_fix.pipeline import FixResult, prepare, run_passes
from onnx_npu_fix.structure import structural_problem
from onnx_npu_fix.validate import Reference


@dataclass
class LoadedModel:
    model: onnx.ModelProto
    path: str
    external_files: set[str]
    """Absolute paths of the external data files the model was read from (empty for a self-contained file)."""
    data: bytes | None = None
    """The bytes read, for a self-contained file read with ``keep_bytes`` (None otherwise, or once
    :func:`start_reference` took them)."""


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and sanity-check an ONNX model (external data included). Raises InputError with a one-line reason."""
    return read_model(path).model


def read_model(path: str | os.PathLike, *, keep_bytes: bool = False) -> LoadedModel:
    """:func:`load_model`, also saying which external data files the model came from. ``keep_bytes``: keep the
    file's bytes in ``LoadedModel.data`` for :func:`start_reference` (which takes them over)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected an .onnx file")
    if os.path.getsize(path) == 0:
        raise InputError(f"{path}: empty file, expected an ONNX model")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        model = onnx.ModelProto()
        model.ParseFromString(raw)
    except DecodeError as exc:
        raise InputError(f"{path}: not an ONNX model (protobuf decode failed: {exc}); "
                         f"was the file truncated?") from None
    except FileNotFoundError as exc:
        raise InputError(f"{path}: external data file missing ({exc.filename or exc}); "
                         f"keep the .data file next to the model") from None
    except Exception as exc:  # noqa: BLE001 - onnx raises many types for unreadable files
        raise InputError(f"{path}: cannot load as ONNX ({type(exc).__name__}: {first_line(exc)})") from None
    if not model.HasField("graph") or model.ir_version <= 0 or not model.opset_import:
        raise InputError(f"{path}: not an ONNX model (no graph, IR version or opset); is it another protobuf?")
    base_dir = os.path.dirname(os.path.abspath(path))
    external = external_data_files(model, base_dir)
    for location in sorted(external):
        if not os.path.isfile(location):
            raise InputError(f"{path}: external data file {location} is missing; keep the .data file next to "
                             f"the model")
    try:
        if external:
            onnx.external_data_helper.load_external_data_for_model(model, base_dir)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: cannot read external data ({type(exc).__name__}: {first_line(exc)})") from None
    sparse = len(model.graph.sparse_initializer) > 0
    densify_sparse_initializers(model)
    if not model.graph.output:
        raise InputError(f"{path}: the graph has no outputs; nothing to validate or fix")
    try:
        if not external and not sparse:
            onnx.checker.check_model(raw)  # the bytes just read: no re-serialization of the model
        elif approx_model_bytes(model) < TWO_GB:
            onnx.checker.check_model(model)
        else:
            onnx.checker.check_model(path)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: the model fails the onnx checker: {first_line(exc)}") from None
    problem = structural_problem(model)
    if problem:
        raise InputError(f"{path}: invalid model: {problem}")
    return LoadedModel(model, path, external, raw if keep_bytes and not external and not sparse else None)


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


def check_output_path(output: str | os.PathLike, input_path: str | os.PathLike | None = None, *,
                      protected: Iterable[str] = (), what: str = "-o") -> None:
    """Fail early (before any work) when ``output`` cannot be written or would overwrite the input.

    Protected: the input file and ``protected`` (its external data files, from :func:`read_model`). Refused:
    empty paths, directories, existing non-regular files (a FIFO or device would be replaced by the atomic
    rename), unwritable directories and names the file system cannot hold (probed by creating and removing a
    file there).
    """
    output = os.fspath(output)
    if not output:
        raise InputError(f"{what}: empty path")
    guarded = set(protected)
    if input_path is not None:
        guarded.add(os.path.abspath(input_path))
    for candidate in (output, output + ".data"):
        for other in guarded:
            if os.path.exists(candidate) and os.path.exists(other) and os.path.samefile(candidate, other):
                raise InputError(f"{what} {output} is the input or its external data ({other}); npufix never "
                                 f"modifies its input, choose another path")
    directory = os.path.dirname(os.path.abspath(output))
    if os.path.isdir(output):
        raise InputError(f"{what} {output}: is a directory, expected a file path")
    if os.path.lexists(output) and not os.path.isfile(output):
        raise InputError(f"{what} {output}: exists and is not a regular file (a device or FIFO); choose a file path")
    if not os.path.isdir(directory):
        what_is = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise InputError(f"{what} {output}: directory {directory} {what_is}")
    probe = os.path.join(directory, os.path.basename(output))
    if not os.path.exists(probe):
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise InputError(f"{what} {output}: cannot write there ({exc.strerror})") from None
    elif not os.access(probe, os.W_OK) or not os.access(directory, os.W_OK):
        raise InputError(f"{what} {output}: not writable")


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
            os.chmod(tmp, 0o666 & ~_umask())
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
    os.chmod(tmp, 0o666 & ~_umask())
    tmp_data = None
    try:
        if external_data:
            fd, tmp_data = tempfile.mkstemp(prefix=".npufix-", suffix=".data.tmp", dir=directory)
            os.close(fd)
            os.chmod(tmp_data, 0o666 & ~_umask())
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def select_passes(only: Sequence[str] | None = None, skip: Sequence[str] = ()) -> list[Pass]:
    """The default order, restricted to ``only`` (kept in default order) and without ``skip``.

    Unknown names raise InputError listing the valid ones.
    """
    known = list(PASSES)
    for name in [*(only or ()), *skip]:
        if name not in PASSES:
            raise InputError(f"unknown pass '{name}'; passes: {', '.join(known)}")
    chosen = [cls() for cls in DEFAULT_ORDER if (only is None or cls.name in only) and cls.name not in skip]
    extra = [PASSES[n]() for n in (only or ()) if n in PASSES and PASSES[n] not in DEFAULT_ORDER]
    return chosen + extra


def start_reference(source: LoadedModel | str | os.PathLike, options: FixOptions) -> Reference | None:
    """Start computing the original's outputs on a worker thread, while the passes run (pass the result to
    :func:`fix`, and close it when done). ``source``: what :func:`read_model` returned; onnxruntime should only
    see models the onnx checker passed. The reference is the model as read: for a self-contained file,
    onnxruntime loads the file and the bytes read (``source.data``, taken over and let go once hashed) prove that
    it loaded those bytes — a file replaced or removed meanwhile stops the run with InputError (see
    validate.Reference); for a model with external data, the model in memory, serialized now. None when the run
    will not validate, when ``--input-shape`` overrides or repeated node names (which onnxruntime refuses,
    :func:`fix` renames) make the model as read the wrong one to run, or when a model above 2 GB leaves the pass
    manager to compute the reference itself."""
    if not isinstance(source, LoadedModel):
        source = read_model(source, keep_bytes=True)
    data, source.data = source.data, None  # taken over, even when not used: no copy outlives this call
    if options.validate == "none" or options.input_shapes:
        return None
    names = [node.name for node in source.model.graph.node if node.name]
    if len(set(names)) != len(names):
        return None  # onnxruntime refuses repeated node names: the pass manager runs the renamed (prepared) model
    if data is None:
        if approx_model_bytes(source.model) >= TWO_GB:
            return None
        return Reference(source.model.SerializeToString())
    path = os.path.abspath(source.path)
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # onnxruntime only opens UTF-8 paths: it gets the bytes read instead
        return Reference(data)
    return Reference(data, read_from=path)


def fix(model: onnx.ModelProto, options: FixOptions | None = None,
        passes: Sequence[Pass] | None = None, *, reference: Reference | None = None,
        on_serialized: Callable[[bytes], None] | None = None,
        source: str | os.PathLike | None = None) -> FixResult:
    """Run the passes (default order unless given) over a copy-free ``model``; see :class:`FixResult`.

    ``reference``: from :func:`start_reference` on what :func:`read_model` returned (``model`` unchanged since).
    ``on_serialized``: called with the output's bytes before its last validation runs (e.g. EarlyWrite.start);
    FixResult.serialized is that same object when they are the result.
    ``source``: the file ``model`` was read from by :func:`read_model`, unchanged since: a rollback to the input
    reads it again instead of the pass manager keeping a copy of the model."""
    options = options or FixOptions()
    prepare(model, options)
    reload = None if source is None else functools.partial(_read_prepared, os.fspath(source), options, reference)
    return run_passes(model, options, list(passes) if passes is not None else select_passes(),
                      reference=reference, on_serialized=on_serialized, reload=reload)


def _read_prepared(path: str, options: FixOptions, reference: Reference | None = None) -> onnx.ModelProto:
    """The input read again (a rollback to it), proven to be the bytes the reference was built from."""
    loaded = read_model(path, keep_bytes=True)
    expected = reference.digest() if reference is not None else None
    if expected is not None and (loaded.data is None or hashlib.sha256(loaded.data).digest() != expected):
        raise InputError(f"{path} changed while npufix ran (it no longer holds the bytes that were read); "
                         f"nothing written: rerun on a file that stays put")
    model = loaded.model
    prepare(model, options)
    return model
