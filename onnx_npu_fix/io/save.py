"""Writing: the one atomic write (:func:`atomic_write`, :func:`atomic_dir`: temporary sibling, fsync, rename), and
through it models (with external data above 2 GB, or early while validation still runs) and strict JSON records."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import json
import math
import mmap
import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import onnx

from onnx_npu_fix.ir.graph import TWO_GB, approx_model_bytes, payload_bytes

# --- the one atomic write ----------------------------------------------------------------------------------------
# Every file npufix writes goes through a temporary sibling that is renamed into place: a reader never sees half a
# file, a crash or Ctrl-C leaves the old file (or none), and fsync of the file before the rename and of the
# directory after it makes the rename survive a power loss with the new bytes, not an empty file.


def current_umask() -> int:
    """The process umask (read by setting and restoring it): files written through a temporary name get the mode
    a plain open() would have given them."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_path(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable. Best effort: some systems cannot open a directory (Windows) or
    refuse fsync on one (EINVAL on some network file systems); the rename itself has happened."""
    with contextlib.suppress(OSError):
        _fsync_path(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def _create_unique(directory: str, prefix: str, suffix: str, make: Callable[[str], None],
                   register: Callable[[str | None], None]) -> None:
    """A new file or directory (``make``) named ``prefix`` + random + ``suffix`` in ``directory``. The name is
    chosen and handed to ``register`` *before* the entry exists, so whoever discards it knows the name whatever
    instant a KeyboardInterrupt or SIGTERM lands at (a name returned by mkstemp would be lost if the signal came
    between the creation and the return)."""
    while True:
        name = os.path.join(directory, f"{prefix}{secrets.token_hex(8)}{suffix}")
        register(name)
        try:
            make(name)
            return
        except FileExistsError:
            register(None)  # someone else's file of that name: not ours to remove
            continue


def _make_private_file(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _remove_file(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class _Staged:
    """Something written under a temporary sibling name and renamed into place: a subclass creates it
    (:attr:`tmp`, registered before it exists), flushes it to disk, renames it and discards it; :meth:`commit` is
    the three in order, removing the temporary on any failure, then makes the rename durable."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self.directory = os.path.dirname(self.path)
        self.tmp: str | None = None
        self.previous: str | None = None
        """A hard link to (or a copy of) the file the rename replaces, while a :class:`Transaction` may still put
        it back (:meth:`keep_previous`)."""
        self._empty_dir_mode: int | None = None
        """The mode of the empty directory at :attr:`path` that the rename replaces (None: there is none)."""

    def _register(self, name: str | None) -> None:
        self.tmp = name

    def _register_previous(self, name: str | None) -> None:
        self.previous = name

    def keep_previous(self) -> None:
        """Before the rename: keep what is at :attr:`path` so that :meth:`restore` can put it back (a hard link
        beside it, a copy where the file system has none; an empty directory is only noted)."""
        if os.path.isdir(self.path) and not os.path.islink(self.path):
            self._empty_dir_mode = os.stat(self.path).st_mode & 0o7777  # the write plan allows only an empty one
        elif os.path.lexists(self.path):
            try:
                _create_unique(self.directory, ".npufix-", ".previous",
                               functools.partial(os.link, self.path, follow_symlinks=False),
                               self._register_previous)
            except OSError:  # no hard links here (FAT, some network shares): a copy
                _create_unique(self.directory, ".npufix-", ".previous", _make_private_file,
                               self._register_previous)
                shutil.copy2(self.path, self.previous, follow_symlinks=False)

    def restore(self) -> bool:
        """Undo the rename: :attr:`path` as it was before the commit. False when that failed (it then holds
        this run's file)."""
        try:
            if self.previous is not None:
                os.replace(self.previous, self.path)
                self.previous = None
            elif os.path.isdir(self.path) and not os.path.islink(self.path):
                _remove_tree(self.path)
                self._recreate_empty_dir()
            else:
                os.unlink(self.path)
        except OSError:
            return False
        return True

    def _recreate_empty_dir(self) -> None:
        if self._empty_dir_mode is not None and not os.path.lexists(self.path):
            os.mkdir(self.path)
            os.chmod(self.path, self._empty_dir_mode)

    def drop_previous(self) -> None:
        """The commit stands (or was undone): the kept file is not needed any more."""
        if self.previous is not None:
            _remove_file(self.previous)
            self.previous = None

    def flush(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def rename(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def discard(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def commit(self) -> None:
        """Flush, rename into place and make the rename durable. On any failure the temporary is removed."""
        try:
            self.flush()
            self.rename()
        except BaseException:
            self.discard()
            raise
        _fsync_directory(self.directory)


class AtomicFile(_Staged):
    """One file written through a temporary sibling: :meth:`create` it, write to :attr:`tmp` (by path), then
    :meth:`commit` (:meth:`flush`: fsync, mode from the umask; :meth:`rename`, fsync of the directory) or
    :meth:`discard`. :func:`atomic_write` is the usual form; a :class:`Transaction` holds several, :class:`EarlyWrite`
    keeps one open across a validation."""

    def __init__(self, path: str | os.PathLike, *, suffix: str = ".tmp") -> None:
        super().__init__(path)
        self.suffix = suffix

    def create(self) -> str:
        """Create the (empty, private) temporary file and return its path (registered in :attr:`tmp` before it
        exists, so :meth:`discard` removes it whenever an interrupt lands)."""
        try:
            _create_unique(self.directory, ".npufix-", self.suffix, _make_private_file, self._register)
        except BaseException:
            self.discard()
            raise
        return self.tmp

    def flush(self) -> None:
        """The staged bytes to disk, with the mode a plain open() would have given the file."""
        _fsync_path(self.tmp, os.O_WRONLY)
        os.chmod(self.tmp, 0o666 & ~current_umask())

    def rename(self) -> None:
        os.replace(self.tmp, self.path)
        self.tmp = None

    def discard(self) -> None:
        if self.tmp is not None:
            _remove_file(self.tmp)
            self.tmp = None


class AtomicDir(_Staged):
    """A directory built under a temporary sibling name and renamed into place (which may exist only as an empty
    directory): :meth:`create`, fill :attr:`tmp`, :meth:`commit` or :meth:`discard` (removes it all)."""

    def create(self) -> str:
        try:
            _create_unique(self.directory, ".npufix-split-", "", functools.partial(os.mkdir, mode=0o700),
                           self._register)
        except BaseException:
            self.discard()
            raise
        return self.tmp

    def flush(self) -> None:
        """The files inside were written with :func:`atomic_write` (fsynced, with the directory); the mode."""
        os.chmod(self.tmp, 0o777 & ~current_umask())

    def rename(self) -> None:
        if os.path.isdir(self.path):
            os.rmdir(self.path)  # empty (checked before any work): replaced by the finished directory
        try:
            os.replace(self.tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                self._recreate_empty_dir()  # as it was before this rename
            raise
        self.tmp = None

    def discard(self) -> None:
        if self.tmp is not None:
            _remove_tree(self.tmp)
            self.tmp = None


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait while the body runs (the renames of a commit happen all or none), then reach the
    handlers that were in place. Python-level handlers, not a thread's signal mask: the kernel may deliver a
    process signal to any thread, and CPython runs its handler in the main thread regardless. Main thread only
    (signal.signal's rule); elsewhere a no-op, since handlers run in the main thread anyway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not None:  # None: a handler not installed from Python, left alone
            previous[signum] = signal.signal(signum, lambda number, frame: pending.append(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in pending:
            signal.raise_signal(signum)


class Transaction:
    """Every file of a run, staged beside its destination and renamed into place together.

    :meth:`file` / :meth:`directory` stage (the temporary name registered before it is created); :meth:`commit`
    first flushes every staged entry (fsync, mode: where a full disk or an I/O error shows), then renames them in
    the order they were staged with SIGINT / SIGTERM held, then fsyncs the directories; :meth:`discard` (also on
    any exception leaving a ``with`` block) removes everything staged. A rename that fails puts the files renamed
    before it back as they were (each replaced file is kept as a hard link until the commit stands). A signal
    that arrives during the renames is raised once they are done. :attr:`committed` (also set on the exception as
    ``npufix_written``) names the files of this run that are in place: all of them after a signal during the
    renames, none after a failed rename (unless putting one back failed too).
    """

    def __init__(self) -> None:
        self._staged: list[AtomicFile | AtomicDir] = []
        self.committed: list[str] = []

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.discard()

    def file(self, path: str | os.PathLike, *, suffix: str = ".tmp") -> str:
        return self.adopt(AtomicFile(path, suffix=suffix)).create()

    def directory(self, path: str | os.PathLike) -> str:
        return self.adopt(AtomicDir(path)).create()

    def adopt(self, target: AtomicFile | AtomicDir) -> AtomicFile | AtomicDir:
        """Hold ``target`` (created or not): committed and discarded with the rest."""
        self._staged.append(target)
        return target

    @property
    def staged(self) -> list[str]:
        """The destinations staged, in commit order."""
        return [t.path for t in self._staged]

    def staged_at(self, path: str | os.PathLike) -> str | None:
        """Where the bytes staged for ``path`` are until the commit (None: nothing staged for it)."""
        path = os.path.abspath(os.fspath(path))
        return next((t.tmp for t in self._staged if t.path == path), None)

    def commit(self) -> None:
        try:
            for target in self._staged:
                target.flush()
        except BaseException:
            self.discard()
            raise
        try:
            with signals_held():
                self._rename_all()
        except BaseException as exc:
            exc.npufix_written = list(self.committed)
            self.discard()
            raise
        for target in self._staged:
            target.drop_previous()
        for directory in dict.fromkeys(t.directory for t in self._staged):
            _fsync_directory(directory)
        self._staged = []

    def _rename_all(self) -> None:
        """Rename every staged entry into place; when one rename fails, put the ones already renamed back as they
        were (:meth:`_Staged.restore`), so the run is all or nothing. :attr:`committed` is then what could not be
        put back (normally nothing)."""
        done: list[AtomicFile | AtomicDir] = []
        try:
            for target in self._staged:
                target.keep_previous()
                target.rename()
                done.append(target)
                self.committed.append(target.path)
        except BaseException:
            self.committed = [t.path for t in reversed(done) if not t.restore()]
            raise

    def discard(self) -> None:
        """Remove every staged entry not yet renamed into place (and any file kept to undo a rename)."""
        for target in self._staged:
            target.discard()
            target.drop_previous()
        self._staged = []


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, *, suffix: str = ".tmp") -> Iterator[str]:
    """Write ``path`` atomically: yields the path of a new temporary file next to it; write there (any writer
    that takes a path: protobuf bytes, matplotlib, onnx). On leaving the block the file is fsynced, given the
    mode the umask says, renamed onto ``path`` and the directory fsynced; on any exception (KeyboardInterrupt
    included) the temporary file is removed and ``path`` is left as it was. ``suffix``: the temporary name's
    ending (matplotlib picks the picture format from it)."""
    with Transaction() as files:
        yield files.file(path, suffix=suffix)
        files.commit()


@contextlib.contextmanager
def atomic_dir(directory: str | os.PathLike) -> Iterator[str]:
    """Create ``directory`` atomically: yields a new temporary sibling directory to fill; on leaving the block it
    gets the mode the umask says and is renamed onto ``directory`` (which may exist only as an empty directory),
    and the parent is fsynced. On any exception the temporary directory and everything in it are removed. Files
    written inside should use :func:`atomic_write` (which fsyncs them and this directory)."""
    with Transaction() as files:
        yield files.directory(directory)
        files.commit()


# --- models and records -----------------------------------------------------------------------------------------


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
        external_data = (serialized is None and approx_model_bytes(model) >= TWO_GB) or _uses_external_data(model)
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


PAGE = mmap.ALLOCATIONGRANULARITY
"""Every weight in a :class:`MappedWeights` file starts at a multiple of this (the unit in which mmap takes file
offsets: 4 KiB on Linux, 64 KiB on Windows), so that a loader can map each tensor in place instead of copying it.
onnxruntime 1.32 maps them: a session's heap then holds no copy of the weights, whose pages are the file's."""


class MappedWeights:
    """Scratch models for onnxruntime, their weights in one data file it maps instead of copying (validation: the
    original's session and each candidate's). Lives in a run-owned temporary directory that :meth:`close`
    removes (the caller closes it in a ``finally``: every exit path, KeyboardInterrupt and SIGTERM included); the
    directory's name is registered before it exists, so a signal during its creation cannot orphan it.

    Each raw initializer of ``threshold`` bytes or more is written once: a later model whose tensor of the same
    name holds the same bytes (compared with those written, not hashed) refers to the same place, so a pass that
    changed two weights writes two weights. Thread-safe (the original's reference thread and the pass manager).
    """

    def __init__(self, *, threshold: int = 1024) -> None:
        self.threshold = threshold
        self.directory: str | None = None
        self._file: Any = None
        self._end = 0
        self._placed: dict[str, tuple[int, int]] = {}
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
        self._lock = threading.Lock()

    def _register(self, name: str | None) -> None:
        self.directory = name

    def _open(self) -> Any:
        if self._closed:  # a late writer (a worker thread a signal left running) must not create it again
            raise OSError("the scratch directory was removed")
        if self._file is None:
            if self.directory is None:  # else an earlier attempt made it and failed after: the same one, reused
                _create_unique(tempfile.gettempdir(), "npufix-validate-", "", functools.partial(os.mkdir, mode=0o700),
                               self._register)
            assert self.directory is not None
            fd = os.open(os.path.join(self.directory, "weights.data"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            self._file = os.fdopen(fd, "r+b", buffering=0)
        return self._file

    def write(self, model: onnx.ModelProto) -> str:
        """Write ``model`` (left as it is) for onnxruntime; returns the model file's path."""
        with self._lock:
            data = self._open()
            assert self.directory is not None
            shell = onnx.ModelProto()
            _copy_without_initializers(model, shell)
            for tensor in model.graph.initializer:
                if (tensor.data_location == onnx.TensorProto.EXTERNAL or not tensor.HasField("raw_data")
                        or payload_bytes(tensor) < self.threshold):
                    shell.graph.initializer.append(tensor)
                    continue
                raw = tensor.raw_data  # one copy out of the message; every read of the field makes another
                if not self._maps(tensor, raw):
                    shell.graph.initializer.append(tensor)
                    continue
                ref = shell.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
                for key, value in (("location", "weights.data"), ("offset", str(self._place(data, tensor.name, raw))),
                                   ("length", str(len(raw)))):
                    ref.external_data.add(key=key, value=value)
                ref.data_location = onnx.TensorProto.EXTERNAL
                del raw
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
        tag_start, start, end = _graph_field(data)
        kept, entries = [], []
        for number, field_start, value_start, value_end in _wire_fields(data, start, end):
            (entries if number == 5 else kept).append((field_start, value_start, value_end))
        graph = b"".join(view[a:c] for a, _, c in kept)
        shell = onnx.ModelProto()
        shell.ParseFromString(b"".join((view[:tag_start], _GRAPH_TAG, _varint(len(graph)), graph, view[end:])))
        del graph
        spans = []
        with self._lock:
            file = self._open()
            assert self.directory is not None
            for _, a, c in entries:
                header, raw, start = _tensor_header(view, a, c)
                if raw is None or header.data_location == onnx.TensorProto.EXTERNAL or not self._maps(header, raw):
                    shell.graph.initializer.add().ParseFromString(view[a:c])
                    continue
                offset = self._place(file, header.name, raw)
                ref = shell.graph.initializer.add(name=header.name, data_type=header.data_type, dims=header.dims)
                for key, value in (("location", "weights.data"), ("offset", str(offset)), ("length", str(len(raw)))):
                    ref.external_data.add(key=key, value=value)
                ref.data_location = onnx.TensorProto.EXTERNAL
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
                _remove_file(self._kept)
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

    def close(self) -> None:
        """Remove the directory and everything in it (a session that still maps the data keeps its pages)."""
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()
                self._file = None
            if self.directory is not None:
                _remove_tree(self.directory)
                self.directory = None
            self._placed.clear()


SERIALIZE_CHUNK = 16 << 20
""":func:`serialized_parts` serializes the initializers in runs of about this many payload bytes."""


def serialized_parts(model: onnx.ModelProto) -> list[bytes]:
    """``model.SerializeToString()`` in pieces whose ``b"".join`` is byte for byte the same, made with a
    transient of one run of weights (:data:`SERIALIZE_CHUNK`, or one larger tensor) instead of protobuf's.

    Why: upb encodes a message backwards into a buffer it doubles as it fills and frees only at the end, then
    copies the result into the bytes object: serializing a model takes a transient larger than the model, on top
    of the model (the largest transient of a validated run). Here the model is a shell without initializers
    (serialized by upb, small), split where the graph's initializers belong (after ``node`` and ``name``, before
    field 10: upb writes known fields in field-number order and unknown ones last), with the initializers
    serialized a run at a time in between. A model or graph with unknown fields of its own (which the shell
    copy would lose) is serialized whole. The caller may drop ``model`` before joining the pieces."""
    graph = model.graph
    if not len(graph.initializer) or _unknown_fields(model) or _unknown_fields(graph):
        return [model.SerializeToString()]
    shell = onnx.ModelProto()
    _copy_without_initializers(model, shell)
    top = shell.SerializeToString()
    tag_start, value_start, value_end = _graph_field(top)
    shell.graph.ClearField("node")
    shell.graph.ClearField("name")
    split = value_end - len(shell.graph.SerializeToString())  # the graph's fields after its initializers
    parts = [top[:tag_start], b"", top[value_start:split]]  # [1]: the graph's tag and length, set below
    parts.extend(_initializer_runs(graph.initializer))
    parts.append(top[split:value_end])
    parts[1] = _GRAPH_TAG + _varint(sum(len(part) for part in parts[2:]))
    parts.append(top[value_end:])
    return parts


_GRAPH_TAG = bytes([7 << 3 | 2])  # ModelProto.graph: field 7, length-delimited
_INITIALIZER_TAG = bytes([5 << 3 | 2])  # GraphProto.initializer: field 5, length-delimited


def _initializer_runs(initializers: Any) -> Iterator[bytes]:
    """The serialized ``initializer`` entries of a graph, in order: runs of small tensors copied into a scratch
    GraphProto (whose bytes are exactly those entries), a tensor of :data:`RAW_ENTRY` raw bytes or more written
    field by field (:func:`_raw_entry`)."""
    run: list[onnx.TensorProto] = []
    held = 0
    for tensor in initializers:
        size = payload_bytes(tensor)
        if size >= RAW_ENTRY and tensor.HasField("raw_data") and not _unknown_fields(tensor):
            if run:
                yield _entries(run)
                run, held = [], 0
            yield from _raw_entry(tensor)
            continue
        if run and held + size > SERIALIZE_CHUNK:
            yield _entries(run)
            run, held = [], 0
        run.append(tensor)
        held += size
    if run:
        yield _entries(run)


RAW_ENTRY = 1 << 16
"""A raw tensor this large is serialized by :func:`_raw_entry`, its bytes copied once (by protobuf: copied into
a scratch graph, encoded into a buffer that doubles, copied out: three copies where this makes one)."""

_RAW_DATA_FIELD = 9  # TensorProto.raw_data


def _raw_entry(tensor: onnx.TensorProto) -> Iterator[bytes]:
    """``tensor``'s ``initializer`` entry as protobuf writes it (its fields in number order): the tag and
    length, the fields numbered below raw_data, raw_data's tag, length and bytes, the fields above it. Only the
    small fields go through protobuf; the bytes are read out of the message once."""
    below, above = onnx.TensorProto(), onnx.TensorProto()
    for desc, value in tensor.ListFields():
        if desc.number != _RAW_DATA_FIELD:
            _copy_field(below if desc.number < _RAW_DATA_FIELD else above, desc, value)
    head, tail, raw = below.SerializeToString(), above.SerializeToString(), tensor.raw_data
    raw_tag = bytes([_RAW_DATA_FIELD << 3 | 2]) + _varint(len(raw))
    yield _INITIALIZER_TAG + _varint(len(head) + len(raw_tag) + len(raw) + len(tail)) + head + raw_tag
    yield raw
    yield tail


def _entries(tensors: list[onnx.TensorProto]) -> bytes:
    scratch = onnx.GraphProto()
    scratch.initializer.extend(tensors)
    return scratch.SerializeToString()


def _unknown_fields(message: Any) -> bool:
    from google.protobuf import unknown_fields

    return len(unknown_fields.UnknownFieldSet(message)) > 0


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _graph_field(top: bytes) -> tuple[int, int, int]:
    """Where ModelProto ``top`` (serialized) holds its graph: the tag's offset, the value's start and end."""
    found = [(a, b, c) for number, a, b, c in _wire_fields(top, 0, len(top)) if number == 7]
    if len(found) != 1:  # protobuf merges a message field given twice; nothing here does that
        raise ValueError(f"{len(found)} graph fields in the serialized ModelProto")
    return found[0]


def _read_exactly(file: Any, size: int) -> bytes:
    """``size`` bytes from an unbuffered ``file`` (one read may return fewer)."""
    parts = []
    while size > 0:
        part = file.read(size)
        if not part:
            raise OSError("the scratch data file is shorter than a weight placed in it")
        parts.append(part)
        size -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _same_bytes(file: Any, raw: bytes | memoryview, block: int = 1 << 20) -> bool:
    """Whether ``file`` holds ``raw`` from where it stands: compared a block at a time as bytes (a memoryview
    compares byte by byte through its item format, far slower; a copy of a whole weight would be a transient)."""
    view = memoryview(raw)
    for start in range(0, len(view), block):
        part = view[start:start + block].tobytes()
        if file.read(len(part)) != part:
            return False
    return True


def _wire_fields(data: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """The fields of the message serialized in ``data[start:end]``: (number, where its tag starts, where its
    value starts, where it ends)."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _read_varint(data, pos)
        wire = key & 7
        if wire == 0:
            value_start = pos
            _, pos = _read_varint(data, pos)
        elif wire == 2:
            length, value_start = _read_varint(data, pos)
            pos = value_start + length
        elif wire in (1, 5):
            value_start = pos
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unexpected wire type {wire} in a serialized ONNX message")
        yield key >> 3, field_start, value_start, pos


def _tensor_header(view: memoryview, start: int,
                   end: int) -> tuple[onnx.TensorProto, memoryview | None, int]:
    """The TensorProto serialized in ``view[start:end]`` without its raw data (an empty ``raw_data`` stands in
    for it), that raw data as a view of ``view`` (None without), and where in ``view`` it starts."""
    other, raw, raw_start = [], None, 0
    for number, field_start, value_start, value_end in _wire_fields(view, start, end):
        if number == 9:
            if raw is not None:
                raise ValueError("raw_data given twice in a serialized TensorProto")
            raw, raw_start = view[value_start:value_end], value_start
        else:
            other.append(view[field_start:value_end])
    header = onnx.TensorProto()
    header.ParseFromString(b"".join(other))
    if raw is not None:
        header.raw_data = b""
    return header, raw, raw_start


def serialize_model(model: onnx.ModelProto) -> bytes:
    """``model.SerializeToString()`` with a transient of one run of weights (see :func:`serialized_parts`)."""
    return b"".join(serialized_parts(model))


def _copy_without_initializers(model: onnx.ModelProto, target: onnx.ModelProto) -> None:
    """Copy every field of ``model`` into ``target`` except the graph's initializers (the weights)."""
    _copy_fields(model, target, skip="graph")
    _copy_fields(model.graph, target.graph, skip="initializer")


def _copy_field(target: Any, desc: Any, value: Any) -> None:
    """Set field ``desc`` of ``target`` to ``value`` (as read from another message's ListFields)."""
    if getattr(desc, "is_repeated", None) or getattr(desc, "label", None) == 3:  # 3: LABEL_REPEATED
        getattr(target, desc.name).extend(value)
    elif desc.message_type is not None:
        getattr(target, desc.name).CopyFrom(value)
    else:
        setattr(target, desc.name, value)


def _copy_fields(source: Any, target: Any, *, skip: str) -> None:
    for desc, value in source.ListFields():
        if desc.name != skip:
            _copy_field(target, desc, value)


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
