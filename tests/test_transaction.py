"""Every file a run writes is one transaction: the output, its external data, the report, the split
directory (segments and manifest), the memory plot and its sidecar are staged beside their destinations and
renamed into place only after every step passed. For every way a run ends, the directory holds exactly what the
exit code says: all of the run's files, or none of them (a failed pass: its report only).

Faults are fired from inside the process at each registered point (a temporary file or directory just created,
every staged file about to be renamed), never by timing: SIGINT and SIGTERM sent to the process itself, and a full
disk (ENOSPC).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from test_split import skip_unet

from onnx_npu_fix.analysis.memory import estimate
from onnx_npu_fix.cli import main
from onnx_npu_fix.io import atomic
from onnx_npu_fix.io.atomic import Transaction
from onnx_npu_fix.io.save import EarlyWrite

pytest.importorskip("matplotlib")

RUN_FILES = ["in.onnx", "out.onnx", "plot.png", "plot.png.json", "record.json", "seg"]


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return skip_unet().SerializeToString()


def _budget() -> int:
    est = estimate(skip_unet(), 4)
    return est.floor_bytes + (est.best_peak - est.floor_bytes) // 2


def _listing(directory: Path) -> dict[str, bytes | None]:
    """Every entry under ``directory`` (files with their bytes), temporary files included."""
    state: dict[str, bytes | None] = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            state[os.path.relpath(os.path.join(root, name), directory) + "/"] = None
        for name in files:
            path = os.path.join(root, name)
            state[os.path.relpath(path, directory)] = Path(path).read_bytes()
    return state


def _run(work: Path, *extra: str, sram: int | None = None):
    args = [str(work / "in.onnx"), "-o", str(work / "out.onnx"), "--act-bytes", "4", "--sram", str(sram or _budget()),
            "--align", "0", "--split", str(work / "seg"), "--memory-plot", str(work / "plot.png"),
            "--report", str(work / "record.json"), "-q", *extra]
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _work(tmp_path: Path, model_bytes: bytes, name: str = "w") -> Path:
    work = tmp_path / name
    work.mkdir()
    (work / "in.onnx").write_bytes(model_bytes)
    return work


class Faults:
    """Counts the registered points of a run and fires ``kind`` at point ``at`` (None: only count)."""

    def __init__(self, kind: str | None = None, at: int | None = None) -> None:
        self.kind, self.at, self.seen = kind, at, 0

    def point(self) -> None:
        k = self.seen
        self.seen += 1
        if k != self.at:
            return
        if self.kind == "SIGINT":
            signal.raise_signal(signal.SIGINT)
        elif self.kind == "SIGTERM":
            signal.raise_signal(signal.SIGTERM)
        else:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def install(self, monkeypatch) -> Faults:
        create_unique = atomic.create_unique

        def created(*args, **kwargs):
            result = create_unique(*args, **kwargs)
            self.point()  # the entry exists; the caller has not seen its name yet (the mkstemp race)
            return result

        flushes = {cls: cls.flush for cls in (atomic.AtomicFile, atomic.AtomicDir)}

        def flush(target):
            flushes[type(target)](target)
            self.point()  # about to be renamed: the last instant before the commit

        monkeypatch.setattr(atomic, "create_unique", created)
        for cls in flushes:
            monkeypatch.setattr(cls, "flush", flush)
        return self


EXIT = {"SIGINT": 130, "SIGTERM": 143, "ENOSPC": 2}


@pytest.mark.parametrize("kind", ["SIGINT", "SIGTERM", "ENOSPC"])
def test_a_fault_at_every_registered_point_leaves_the_directory_as_it_was(kind, tmp_path, model_bytes,
                                                                           monkeypatch):
    counting = Faults().install(monkeypatch)
    result = _run(_work(tmp_path, model_bytes, "count"))
    assert result.exit_code == 0, result.output
    points = counting.seen
    assert points >= 8  # segments, manifest, the directory, plot, sidecar, output, report, and their flushes
    monkeypatch.undo()
    for at in range(points):
        work = _work(tmp_path, model_bytes, f"{kind}{at}")
        before = _listing(work)
        Faults(kind, at).install(monkeypatch)
        result = _run(work)
        monkeypatch.undo()
        if kind == "ENOSPC" and result.exit_code == 0:
            # the early write's file could not be created: that only means no early write (written at the commit)
            assert sorted(os.listdir(work)) == RUN_FILES, at
            continue
        assert result.exit_code == EXIT[kind], (at, result.output)
        assert "nothing written" in result.output, (at, result.output)
        assert _listing(work) == before, at


def test_a_signal_during_the_renames_waits_until_every_file_is_in_place(tmp_path, model_bytes, monkeypatch):
    work = _work(tmp_path, model_bytes)
    rename = atomic.AtomicDir.rename

    def rename_then_signal(target):
        signal.raise_signal(signal.SIGTERM)  # the first rename of the commit (the split directory)
        rename(target)

    monkeypatch.setattr(atomic.AtomicDir, "rename", rename_then_signal)
    result = _run(work)
    assert result.exit_code == 143, result.output
    assert "written" in result.output and "nothing written" not in result.output
    assert sorted(os.listdir(work)) == RUN_FILES  # all of them: the exit code's message names them
    assert onnx.load(str(work / "out.onnx")).graph.node


def test_every_exit_path_leaves_only_its_committed_files(tmp_path, model_bytes, monkeypatch):
    """Exit 0 and 1: every file; 2 (a path clash found before any work), 4 (--strict refused an approximation),
    5 (an internal error after every file was staged) and the signals: none; 3 (a failed pass): the report that
    says so, nothing else. (2 after a failed rename: test_a_rename_that_fails_mid_commit_...)"""
    ok = _work(tmp_path, model_bytes, "ok")
    assert _run(ok).exit_code == 0 and sorted(os.listdir(ok)) == RUN_FILES
    segments = os.listdir(ok / "seg")
    assert "manifest.json" in segments and len(segments) >= 3 and not [n for n in segments if ".npufix" in n]

    violations = _work(tmp_path, model_bytes, "violations")
    result = _run(violations, sram=64)  # no single layer fits: exit 1, the model written, no segments
    assert result.exit_code == 1, result.output
    assert sorted(os.listdir(violations)) == [f for f in RUN_FILES if f != "seg"]

    clash = _work(tmp_path, model_bytes, "clash")
    result = CliRunner().invoke(main, [str(clash / "in.onnx"), "-o", str(clash / "o.svg"), "--memory-plot",
                                       str(clash / "o.svg")])
    assert result.exit_code == 2 and sorted(os.listdir(clash)) == ["in.onnx"], result.output

    failed = _work(tmp_path, model_bytes, "failed")
    from onnx_npu_fix.passes.cleanup import CleanupPass

    def broken(self, model, options):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(CleanupPass, "find", broken)
    result = _run(failed)
    monkeypatch.undo()
    assert result.exit_code == 3, result.output
    assert sorted(os.listdir(failed)) == ["in.onnx", "record.json"]

    strict = _work(tmp_path, model_bytes, "strict")
    linear = onnx.load_from_string(model_bytes)
    for node in linear.graph.node:
        if node.op_type == "Resize":
            next(a for a in node.attribute if a.name == "mode").s = b"linear"
    (strict / "in.onnx").write_bytes(linear.SerializeToString())
    result = _run(strict, "--strict")  # nearest for linear would be approximate: refused
    assert result.exit_code == 4, result.output
    assert sorted(os.listdir(strict)) == ["in.onnx"]

    internal = _work(tmp_path, model_bytes, "internal")
    from onnx_npu_fix import api

    def bug(*args, **kwargs):
        raise RuntimeError("a bug on purpose")

    monkeypatch.setattr(api, "_decide", bug)  # after every file was staged, before the commit
    result = CliRunner().invoke(main, [str(internal / "in.onnx"), "-o", str(internal / "out.onnx"), "--report",
                                       str(internal / "record.json"), "--memory-plot", str(internal / "plot.png")])
    monkeypatch.undo()
    assert result.exit_code == 5 and "internal error" in result.output, result.output
    assert sorted(os.listdir(internal)) == ["in.onnx"]

    for name, number, code in (("int", signal.SIGINT, 130), ("term", signal.SIGTERM, 143)):
        work = _work(tmp_path, model_bytes, name)
        monkeypatch.setattr(atomic.Transaction, "commit", lambda self, n=number: signal.raise_signal(n))
        result = _run(work)
        monkeypatch.undo()
        assert result.exit_code == code and sorted(os.listdir(work)) == ["in.onnx"], result.output


def test_the_early_write_owns_its_temporary_file_before_it_exists(tmp_path, monkeypatch):
    """A signal between the creation of the early write's temporary file and the moment its name is known
    (mkstemp's return) must not orphan it: discard() removes it."""
    create_unique = atomic.create_unique

    def created_then_interrupted(*args, **kwargs):
        create_unique(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic, "create_unique", created_then_interrupted)
    early = EarlyWrite(tmp_path / "out.onnx")
    with pytest.raises(KeyboardInterrupt):
        early.start(b"model bytes")
    early.close()
    assert os.listdir(tmp_path) == []


def test_a_transaction_renames_in_the_staged_order_and_discards_on_any_failure(tmp_path):
    order = []
    with Transaction() as files:
        for name in ("seg", "a", "b"):
            if name == "seg":
                Path(files.directory(tmp_path / name), "x").write_text("x")
            else:
                Path(files.file(tmp_path / name)).write_text(name)
        assert sorted(os.listdir(tmp_path)) != ["a", "b", "seg"]  # staged only
        original = atomic.AtomicFile.rename

        def rename(target):
            order.append(os.path.basename(target.path))
            original(target)

        atomic.AtomicFile.rename = rename
        try:
            files.commit()
        finally:
            atomic.AtomicFile.rename = original
    assert order == ["a", "b"] and sorted(os.listdir(tmp_path)) == ["a", "b", "seg"]

    with pytest.raises(OSError), Transaction() as files:
        Path(files.file(tmp_path / "c")).write_text("c")
        files.directory(tmp_path / "d")
        raise OSError(errno.ENOSPC, "full")
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "seg"]


def _old_run_files(work: Path) -> None:
    """The files of an earlier run at every destination (the split directory empty, as the write plan allows)."""
    for name in ("out.onnx", "plot.png", "plot.png.json", "record.json"):
        (work / name).write_bytes(b"earlier " + name.encode())
    (work / "seg").mkdir()


def test_a_rename_that_fails_mid_commit_puts_the_earlier_ones_back(tmp_path, model_bytes, monkeypatch):
    """The k-th rename of the commit fails (first file renamed, second not, ...): the files renamed before it
    are put back as they were (an earlier run's bytes, its empty split directory), and the exit code says nothing
    was written. Before, the first files stayed renamed under exit 2 ("only ... written"), which means nothing
    written. (Failures before the commit: the ENOSPC faults above.)"""
    replace, rename_all = os.replace, atomic.Transaction._rename_all
    calls = {"n": 0, "fail_at": None, "committing": False}

    def failing_replace(src, dst, **kwargs):
        if calls["committing"]:
            k = calls["n"]
            calls["n"] += 1
            if k == calls["fail_at"]:
                raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(dst))
        return replace(src, dst, **kwargs)

    def committing(self):
        # the run's commit (the segments' own, inside the staged directory, is a failure before it: ENOSPC above)
        calls["committing"] = any(path.endswith("out.onnx") for path in self.staged)
        try:
            rename_all(self)
        finally:
            calls["committing"] = False

    monkeypatch.setattr(os, "replace", failing_replace)
    monkeypatch.setattr(atomic.Transaction, "_rename_all", committing)
    assert _run(_work(tmp_path, model_bytes, "count")).exit_code == 0
    renames = calls["n"]
    assert renames == 5  # the split directory, plot, sidecar, output, report
    for k in range(renames):
        work = _work(tmp_path, model_bytes, f"k{k}")
        _old_run_files(work)
        before = _listing(work)
        calls.update(n=0, fail_at=k)
        result = _run(work)
        assert result.exit_code == 2, (k, result.output)
        assert "nothing written (the files renamed before it were put back)" in result.output, result.output
        assert _listing(work) == before, k


def test_a_rename_that_cannot_be_undone_is_named(tmp_path):
    """When putting a renamed file back fails too, the message names the file that holds this run's bytes."""
    with Transaction() as files:
        for name in ("a", "b"):
            Path(files.file(tmp_path / name)).write_text(name)
        replace, restore = os.replace, atomic.AtomicFile.restore
        targets = list(files._staged)

        def second_fails(src, dst, **kwargs):
            if os.path.basename(dst) == "b":
                raise OSError(errno.EIO, "I/O error", dst)
            return replace(src, dst, **kwargs)

        os.replace = second_fails
        atomic.AtomicFile.restore = lambda target: False
        try:
            with pytest.raises(OSError) as caught:
                files.commit()
        finally:
            os.replace, atomic.AtomicFile.restore = replace, restore
    assert caught.value.npufix_written == [targets[0].path]
    assert sorted(os.listdir(tmp_path)) == ["a"]  # no temporary or kept file left behind


def test_names_that_differ_only_in_case_are_one_file_where_the_file_system_ignores_case(tmp_path, model_bytes):
    """The write plan's clash check on a case-insensitive file system (macOS, Windows), simulated on this one:
    a directory reached under its swapped-case name too (a symlink) is what such a file system looks like to
    the probe, so ``OUT.onnx`` and ``out.onnx`` in it are one file — refused before any work, nothing written.
    The same names in a case-sensitive directory are two files."""
    from onnx_npu_fix.io import paths

    sensitive = _work(tmp_path, model_bytes, "sensitive")
    assert not paths._case_blind(str(sensitive))
    args = ["-o", "OUT.onnx", "--report", "out.onnx", "-q"]
    result = CliRunner().invoke(main, [str(sensitive / "in.onnx"), *(str(sensitive / a) if a.endswith("onnx")
                                                                      else a for a in args)])
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(sensitive)) == ["OUT.onnx", "in.onnx", "out.onnx"]

    blind = _work(tmp_path, model_bytes, "blind")
    (tmp_path / "BLIND").symlink_to(blind)  # the probe's swapped-case name reaches the same directory
    assert paths._case_blind(str(blind))
    for clash in (["-o", "OUT.onnx", "--report", "out.onnx"], ["-o", "IN.onnx"],
                  ["-o", "o.onnx", "--memory-plot", "p.png", "--report", "P.PNG.JSON"]):
        before = _listing(blind)
        argv = [str(blind / "in.onnx"), *(a if a.startswith("-") else str(blind / a) for a in clash)]
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 2, (clash, result.output)
        assert any(w in result.output for w in ("same file", "is the input", "is the output")), result.output
        assert _listing(blind) == before, clash


def test_an_existing_file_under_another_name_is_the_same_file_by_its_inode(tmp_path, model_bytes):
    """Once a file exists, its inode decides (a hard link, or what a case-insensitive file system returns for a
    differently-cased name): a report given as another name of the output is refused."""
    work = _work(tmp_path, model_bytes)
    (work / "old.json").write_text("{}")
    os.link(work / "old.json", work / "OUT.onnx")
    before = _listing(work)
    result = CliRunner().invoke(main, [str(work / "in.onnx"), "-o", str(work / "OUT.onnx"),
                                       "--report", str(work / "old.json")])
    assert result.exit_code == 2 and "--report" in result.output, result.output
    assert _listing(work) == before


def test_a_signal_while_the_output_path_is_probed_leaves_no_empty_output(tmp_path, model_bytes):
    """check_output_path creates the output's own name to learn that it can be written, then removes it: SIGTERM
    in between (here raised right after the probe is created) waits until the probe is gone, so the run ends
    with exit 143 and an empty directory, not an empty output file."""
    work = _work(tmp_path, model_bytes)
    program = ("import os, signal, sys\n"
               "import onnx_npu_fix.io.paths as paths\n"
               "real_close = os.close\n"
               "def close(fd):\n"
               "    real_close(fd)\n"
               "    signal.raise_signal(signal.SIGTERM)\n"
               "paths.os = type(os)('os_probe'); paths.os.__dict__.update(os.__dict__); paths.os.close = close\n"
               "from onnx_npu_fix.cli import main\n"
               "main()\n")
    done = subprocess.run([sys.executable, "-c", program, str(work / "in.onnx"), "-o", str(work / "out.onnx"), "-q"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, done.stderr
    assert sorted(os.listdir(work)) == ["in.onnx"]


@pytest.mark.parametrize("when", ["constructed", "started"])
def test_a_signal_as_the_reference_starts_leaves_no_worker_and_no_scratch_directory(tmp_path, model_bytes,
                                                                                    monkeypatch, when):
    """The original's worker thread writes its scratch model and waits for the input sets. A SIGINT landing
    after it started but before the run held it where its ``finally`` closes it left the thread waiting forever
    (the interpreter's exit waiting on it) and its scratch directory behind: the worker now starts only once the
    run holds it. Fired here right after the constructor returns, and right after start()."""
    from onnx_npu_fix import api
    from onnx_npu_fix.pipeline.validation.reference import Reference

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    real_start = Reference.start

    class Interrupted(Reference):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if when == "constructed":
                raise KeyboardInterrupt

        def start(self):
            started = real_start(self)
            if when == "started":
                raise KeyboardInterrupt
            return started

    monkeypatch.setattr(api, "Reference", Interrupted)
    work = _work(tmp_path, model_bytes)
    result = CliRunner().invoke(main, [str(work / "in.onnx"), "-o", str(work / "out.onnx"), "-q"])
    assert result.exit_code == 130, result.output
    assert not [t for t in threading.enumerate() if t.name.startswith("npufix-reference")]
    assert os.listdir(scratch) == [] and sorted(os.listdir(work)) == ["in.onnx"]
