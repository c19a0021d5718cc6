"""Exceptions the library raises; the CLI maps them to exit codes (see README, "Exit codes")."""

from __future__ import annotations


class NpufixError(Exception):
    """Base class. The message is one line that says what to do."""

    exit_code = 1


class InputError(NpufixError):
    """The input cannot be used as given: unreadable file, bad option, dynamic shape a pass needs fixed."""

    exit_code = 2


class PassFailed(NpufixError):
    """A pass produced a model that fails the checker or numerical validation (exit 1)."""

    exit_code = 1

    def __init__(self, message: str, *, pass_name: str) -> None:
        super().__init__(message)
        self.pass_name = pass_name


class StrictRefused(NpufixError):
    """``--strict``: the run would need an approximate change; nothing written (exit 4)."""

    exit_code = 4


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), at most 300 characters: the form
    every one-line error of npufix quotes a library's complaint in."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
