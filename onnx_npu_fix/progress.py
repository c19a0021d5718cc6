"""Progress events: the library says what it has finished or how far a long step is; whoever runs it decides what
to show (the CLI prints each pass line as its pass is settled and, on a terminal, a progress line). Nothing here
prints.

    with progress.listening(print):        # any callable taking an event
        api.run("in.onnx", "out.onnx")

The listener is held in a context variable: it follows the run into the worker thread that computes the
original's outputs (validation.reference.Reference copies the context) and never leaks into another run. A
listener runs on the thread that emits, so it must be quick and thread-safe; what it raises ends the run as if the
run raised it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PassFinished:
    """A pass is settled (its status final: validated, unchanged, failed...), in the order of the passes; a pass
    validated with a group is settled with the group. ``record``: its pipeline.report.PassRecord."""

    record: Any


@dataclass(frozen=True)
class Step:
    """``done`` of ``total`` units of a long task: ``validating <passes>`` (a candidate's input sets run by
    onnxruntime; ``validation`` for the final run), ``reference outputs`` (the original's), ``schedule search``
    (states expanded of the budget), ``split validation``."""

    task: str
    done: int
    total: int | None = None


@dataclass(frozen=True)
class JudgeCall:
    """A judge command has given its verdict on a candidate (``npufix reduce``, ``--judge``): ``line`` says which
    candidate and what the judge said. A vendor compile takes seconds to minutes, so each call is worth a line."""

    line: str


Listener = Callable[[Any], None]
_LISTENER: contextvars.ContextVar[Listener | None] = contextvars.ContextVar("npufix_progress", default=None)


@contextlib.contextmanager
def listening(listener: Listener | None) -> Iterator[None]:
    """Send the events emitted inside the block (this context, and worker threads started with its copy) to
    ``listener``; None: to nobody."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def emit(event: Any) -> None:
    """Hand ``event`` to the listener of the current context, if any."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(event)


def listened() -> bool:
    """Whether someone listens (to skip building events nobody reads)."""
    return _LISTENER.get() is not None
