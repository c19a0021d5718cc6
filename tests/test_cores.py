"""The validation sessions' thread count (host/cores.py): one when other processes keep a core busy, decided once
per run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from onnx_npu_fix.host import cores


def _sample(busy: float, own: float, at: float, cores_: int = 2) -> cores.Sample:
    return cores.Sample(busy=busy, own=own, at=at, cores=cores_)


def test_the_cores_others_used_decide():
    start = _sample(100.0, 1.0, 50.0)
    # 1 s on 2 cores: busy 1.9 s, 0.9 of it this process's: others took one core, one is left.
    assert cores.threads_between(start, _sample(101.9, 1.9, 51.0)) == 1
    # Busy as long as this process was (plus 0.1 s of someone's): the second core was free.
    assert cores.threads_between(start, _sample(101.0, 1.9, 51.0)) == 2
    # On 8 cores one busy elsewhere leaves plenty: still two (the most a validation session takes).
    assert cores.threads_between(_sample(100.0, 1.0, 50.0, 8), _sample(101.9, 1.9, 51.0, 8)) == cores.MAX_THREADS
    # Every core busy elsewhere: one all the same.
    assert cores.threads_between(start, _sample(102.9, 1.9, 51.0)) == 1
    # Too short a window, or no /proc/stat: no verdict (the caller takes two).
    assert cores.threads_between(start, _sample(100.1, 1.05, 50.1)) is None
    assert cores.threads_between(_sample(-1.0, 1.0, 50.0), _sample(-1.0, 1.9, 51.0)) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat")
def test_processes_spinning_next_to_npufix_take_a_thread_and_the_run_keeps_its_count():
    # One spinning process per core this process may use: whatever the machine, none is left idle.
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(len(os.sched_getaffinity(0)))]
    try:
        time.sleep(0.3)  # started
        cores.mark()
        time.sleep(0.4)  # npufix reading and checking: idle here, so the spinners are what "others" did
        assert cores.session_threads() == 1
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    time.sleep(0.4)
    assert cores.session_threads() == 1, "the run's first session decided: every later one runs alike"
    cores.mark()  # (a new run measures again; outside a run the sessions get two)


@pytest.mark.parametrize("value, expected", [("1", 1), ("2", 2), ("7", None), ("", None), ("one", None)])
def test_the_environment_fixes_the_count_whatever_the_load(monkeypatch, value, expected):
    """NPUFIX_VALIDATION_THREADS: the count of a run whose records must reproduce (the count can move an output's
    last bit); a value that is not a count npufix uses is ignored."""
    monkeypatch.setenv(cores.FIXED, value)
    monkeypatch.setattr(cores, "threads_between", lambda start, end: 1)  # a machine that looks busy
    cores.mark()
    assert cores.session_threads() == min(expected or 1, os.cpu_count() or 1)
    cores.mark()
