"""The paths a run writes, checked before any work: never the input or a file it reads, never a directory, a
device or an unwritable place. :class:`WritePlan` is the one place every mode (a fixing run, ``--check``,
``--judge``, ``reduce``, ``--split``) checks them in."""

from __future__ import annotations

import os
from collections.abc import Iterable

from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io.atomic import signals_held


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
    if output.endswith(("/", os.sep)):
        raise InputError(f"{what} {output}: ends with a path separator, which names a directory; give a file path")
    if what == "-o" and os.path.isdir(output + ".data"):
        raise InputError(f"{what} {output}: {output}.data is a directory, and the external weights of the output "
                         f"would be written there; remove it or choose another path")
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
            # The probe is the output's own name (a name the file system refuses fails here, not at the commit):
            # a signal between its creation and its removal would leave an empty output, so signals wait.
            with signals_held():
                fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            raise InputError(f"{what} {output}: cannot write there ({exc.strerror})") from None
    elif not os.access(probe, os.W_OK) or not os.access(directory, os.W_OK):
        raise InputError(f"{what} {output}: not writable")


def _same_file(a: str, b: str) -> bool:
    """One file: the same resolved path (symlinks, ``..``), the same inode (hard links), or names equal but for
    case in one directory of a file system that ignores case (checked even before the files exist)."""
    real_a, real_b = os.path.normcase(os.path.realpath(a)), os.path.normcase(os.path.realpath(b))
    if real_a == real_b:
        return True
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:
        pass
    dir_a, dir_b = os.path.dirname(real_a), os.path.dirname(real_b)
    if os.path.basename(real_a).casefold() != os.path.basename(real_b).casefold():
        return False
    try:
        same_dir = dir_a == dir_b or os.path.samefile(dir_a, dir_b)
    except OSError:
        return False
    return same_dir and _case_blind(dir_a)


def check_run_paths(input_path: str, output: str | None, report_path: str,
                    external_files: Iterable[str] = ()) -> None:
    """The report must be none of the files the run reads (the input, its external data) or writes (the output,
    its ``.data``), and writable; checked before any work. The message names both paths."""
    files = [(input_path, "the input model"), *((f, "the input's external data") for f in sorted(external_files))]
    if output is not None:
        files += [(output, "the output model"), (output + ".data", "the output's external data")]
    for other, what in files:
        if _same_file(report_path, other):
            raise InputError(f"--report {report_path} is {what} ({other}); choose another path")
    check_output_path(report_path, input_path, protected=external_files, what="--report")


def check_split_dir(directory: str | os.PathLike) -> None:
    """--split DIR must be a new or empty directory whose parent exists (checked before any work); a symbolic
    link that loops or points nowhere is neither."""
    directory = os.fspath(directory)
    if os.path.islink(directory) and not os.path.exists(directory):
        raise InputError(f"--split {directory}: is a symbolic link that loops or points nowhere; remove it or "
                         f"choose a new directory")
    if os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
        raise InputError(f"--split {directory}: exists and is not an empty directory; npufix does not overwrite "
                         f"segments, choose a new directory or remove it")
    parent = os.path.dirname(os.path.abspath(directory))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise InputError(f"--split {directory}: parent directory {parent} does not exist or is not writable")


# --- the run's write plan ---------------------------------------------------------------------------------------


class WritePlan:
    """Every path a run reads and every path it will write, known before any work, so that no file of the run
    can be another (a report that replaces the split's manifest, a plot sidecar that overwrites the
    input, an output inside the split directory, a reduced model written over the input's weights). Two paths
    are the same file when they resolve to one (symlinks, ``..``), are hard links of one inode, or differ only in
    case on a file system that ignores case; a path inside a directory the run writes (``--split``) is in it.

    ``input_path`` and ``external_files`` (its external data, from :func:`read_model`; empty before it is read:
    check again once it is) are read. :meth:`reads` / :meth:`writes` add entries (``what``: the option or role,
    for the message). :meth:`check` checks each destination on its own (:func:`check_output_path`,
    :func:`check_split_dir`; ``probe`` False: a file named after another destination, checked with it), the
    report against the files of the run (:func:`check_run_paths`), then every pair, raising InputError naming
    both paths of the first clash."""

    def __init__(self, input_path: str | os.PathLike | None = None, external_files: Iterable[str] = ()) -> None:
        self._input = None if input_path is None else os.fspath(input_path)
        self._external = sorted(external_files)
        self._reads: list[tuple[str, str]] = []
        self._writes: list[tuple[str, str, bool, bool]] = []
        if self._input is not None:
            self.reads(self._input, "the input model")
        for path in self._external:
            self.reads(path, "the input's external data")

    def reads(self, path: str | os.PathLike, what: str) -> WritePlan:
        self._reads.append((os.fspath(path), what))
        return self

    def writes(self, path: str | os.PathLike, what: str, *, directory: bool = False, probe: bool = True) -> WritePlan:
        self._writes.append((os.fspath(path), what, directory, probe))
        return self

    @property
    def written(self) -> list[str]:
        """The planned destinations (files and directories), in the order they were planned."""
        return [path for path, _, _, _ in self._writes]

    def check(self) -> None:
        outputs = [path for path, what, _, _ in self._writes if what == "-o"]
        for path, what, is_dir, probe in self._writes:
            if is_dir:
                check_split_dir(path)
            elif what == "--report" and self._input is not None:
                check_run_paths(self._input, outputs[0] if outputs else None, path, self._external)
            elif probe:
                check_output_path(path, self._input, protected=self._external, what=what)
        self._check_pairs()

    def _check_pairs(self) -> None:
        for i, (path, what, is_dir, _) in enumerate(self._writes):
            others = [(p, w, False, "reads") for p, w in self._reads]
            others += [(p, w, d, "writes") for p, w, d, _ in self._writes[:i]]
            for other, other_what, other_dir, verb in others:
                clash = _same_file(path, other) or (is_dir and _inside(other, path)) or (
                    other_dir and _inside(path, other))
                if clash:
                    raise InputError(f"{what} {path} and {other_what} {other} are the same file or one is inside "
                                     f"the other (the run {verb} {other}); nothing written, choose another path")


def _inside(path: str, directory: str) -> bool:
    """``path`` is strictly below ``directory`` (resolved; case-folded where the file system ignores case)."""
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        if _same_file(parent, directory):
            return True
        up = os.path.dirname(parent)
        if up == parent:
            return False
        parent = up


def _case_blind(directory: str) -> bool:
    """The file system of ``directory`` treats names that differ only in case as one (macOS, Windows)."""
    probe = os.path.realpath(directory)
    flipped = os.path.join(os.path.dirname(probe), os.path.basename(probe).swapcase())
    if flipped == probe or not os.path.basename(probe):
        return os.path.normcase("A") == os.path.normcase("a")
    try:
        return os.path.samefile(probe, flipped)
    except OSError:
        return False
