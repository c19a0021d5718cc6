"""How many threads an onnxruntime session of the validation may use: two, or one when other processes keep one
of this process's cores busy.

Why: validation runs are compute-bound, and two intra-op threads on a machine whose other core is taken (a CI
runner with a parallel job, a build next to it) only fight for it: there one thread costs less CPU and less wall
time than two; with both cores idle two threads finish sooner (for a little more CPU), so two stay the default
there.

What "busy" means is measured, not guessed: between :func:`mark` (the start of a run) and the run's first session,
the busy time of the cores this process may run on (``/proc/stat``) less this process's own CPU time is what
others used; the sessions get as many threads as that leaves cores idle (rounded; at least one, at most two).
The count is decided once per run, so the original and every candidate run with the same one: the count can move
an output's last bit (onnxruntime's Sigmoid computes the end of each thread's share of the elements another way),
so two models are only ever compared under one count. ``NPUFIX_VALIDATION_THREADS`` (1 or 2) fixes it, for
records that must reproduce whatever the machine's load.
Without ``/proc/stat`` (not Linux), or a window too short to tell, the sessions get two.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

MAX_THREADS = 2
"""Intra-op threads of a validation session at most: the runs are short, and the original's runs overlap the
passes on the main thread."""

MIN_WINDOW = 0.2
"""Seconds of measurement below which the other processes' share of the cores is not judged (at 100 ticks a
second, a 2-core window of 0.2 s holds 40 ticks)."""


@dataclass(frozen=True)
class Sample:
    """The busy time of the cores this process may run on, and this process's CPU time, at one moment."""

    busy: float
    """Seconds those cores spent doing anything but idling since boot; -1 without /proc/stat."""
    own: float
    """This process's CPU time (user + system, every thread)."""
    at: float
    """time.monotonic() when taken."""
    cores: int = 1
    """How many cores this process may run on."""


def sample() -> Sample:
    times = os.times()
    busy, cores = _busy_seconds()
    return Sample(busy, times.user + times.system, time.monotonic(), cores)


def threads_between(start: Sample, end: Sample) -> int | None:
    """The intra-op threads for what ``start`` .. ``end`` saw, or None when the window cannot tell (too short,
    no /proc/stat)."""
    window = end.at - start.at
    if start.busy < 0 or end.busy < 0 or window < MIN_WINDOW:
        return None
    elsewhere = ((end.busy - start.busy) - (end.own - start.own)) / window
    return max(1, min(MAX_THREADS, round(end.cores - elsewhere)))


_lock = threading.Lock()
_started: Sample | None = None
_decided: int | None = None


def mark() -> None:
    """A run starts: the window opens here, and the run's first session decides the count."""
    global _started, _decided
    with _lock:
        _started, _decided = sample(), None


def session_threads() -> int:
    """The intra-op threads for a session of this run (decided at its first session, kept until the next
    :func:`mark`; two before any). Process-wide: runs on several threads of one process share the latest mark's."""
    global _decided
    with _lock:
        if _decided is None:
            _decided = (_fixed() or (threads_between(_started, sample()) if _started is not None else None)
                        or MAX_THREADS)
        return min(_decided, os.cpu_count() or 1)


FIXED = "NPUFIX_VALIDATION_THREADS"
"""The environment variable that fixes the count (1 or 2; anything else is ignored)."""


def _fixed() -> int | None:
    value = os.environ.get(FIXED, "").strip()
    return int(value) if value in {str(n) for n in range(1, MAX_THREADS + 1)} else None


def _busy_seconds() -> tuple[float, int]:
    """Non-idle seconds since boot of the cores this process may run on (``/proc/stat``'s ``cpuN`` lines: user,
    nice, system, idle, iowait, irq, softirq, steal, ...; idle and iowait are idle), or -1 without them; and how
    many cores those are."""
    try:
        allowed = {f"cpu{n}" for n in os.sched_getaffinity(0)}
        with open("/proc/stat", encoding="ascii") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and not line.startswith("cpu ")]
    except (OSError, AttributeError, ValueError):
        return -1.0, os.cpu_count() or 1
    ticks = 0
    for fields in lines:
        if fields[0] in allowed and len(fields) >= 6:  # (idle and iowait are its 4th and 5th figures)
            values = [int(v) for v in fields[1:9]]
            ticks += sum(values) - values[3] - values[4]
    return ticks / os.sysconf("SC_CLK_TCK"), len(allowed)
