"""The one atomic write: every file npufix writes goes through a temporary sibling that is fsynced and renamed
into place (:func:`atomic_write`, :func:`atomic_dir`), and every file of a run is committed together
(:class:`Transaction`, with SIGINT / SIGTERM held during the renames: :func:`signals_held`)."""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import threading
from collections.abc import Callable, Iterator

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


def create_unique(directory: str, prefix: str, suffix: str, make: Callable[[str], None],
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


def remove_file(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def remove_tree(path: str) -> None:
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
                create_unique(self.directory, ".npufix-", ".previous",
                               functools.partial(os.link, self.path, follow_symlinks=False),
                               self._register_previous)
            except OSError:  # no hard links here (FAT, some network shares): a copy
                create_unique(self.directory, ".npufix-", ".previous", _make_private_file,
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
                remove_tree(self.path)
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
            remove_file(self.previous)
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
            create_unique(self.directory, ".npufix-", self.suffix, _make_private_file, self._register)
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
            remove_file(self.tmp)
            self.tmp = None


class AtomicDir(_Staged):
    """A directory built under a temporary sibling name and renamed into place (which may exist only as an empty
    directory): :meth:`create`, fill :attr:`tmp`, :meth:`commit` or :meth:`discard` (removes it all)."""

    def create(self) -> str:
        try:
            create_unique(self.directory, ".npufix-split-", "", functools.partial(os.mkdir, mode=0o700),
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
            remove_tree(self.tmp)
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
