"""Exceptions the library raises, and the exit codes the CLI maps them to (see README and docs/cli.md, "Exit codes").

Each exit code means one thing:

  0  success (written, everything validated, no requested constraint violated; --check: clean)
  1  requested constraints violated (--check: violations found; a fixing run: written, but ``unfixed:`` remain)
  2  usage error, unusable input, or an original that cannot be validated (nothing written)
  3  a pass failed (validation or crash), nothing written
  4  --strict: an approximate change would be needed, nothing written
  5  internal error (a bug), nothing written
  130 / 143  interrupted by SIGINT / SIGTERM (temporary files removed, nothing written)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_USAGE = 2
EXIT_PASS_FAILED = 3
EXIT_STRICT = 4
EXIT_INTERNAL = 5
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class NpufixError(Exception):
    """Base class. The message is one line that says what to do."""

    exit_code = EXIT_INTERNAL


class InputError(NpufixError):
    """The input cannot be used as given: unreadable file, bad option, dynamic shape a pass needs fixed."""

    exit_code = EXIT_USAGE


class InputChanged(InputError):
    """The input file no longer holds the bytes read at the start (replaced or rewritten while the run read it
    again): nothing written (exit 2). Never a candidate's own failure, which a judge loop would skip."""


class OptionError(InputError, ValueError):
    """An option value of the wrong type or out of range (FixOptions, a target profile or the command line).
    ``field`` is the FixOptions field it was given for."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class PassFailed(NpufixError):
    """A pass produced a model that fails the checker or numerical validation (exit 3)."""

    exit_code = EXIT_PASS_FAILED

    def __init__(self, message: str, *, pass_name: str) -> None:
        super().__init__(message)
        self.pass_name = pass_name


class StrictRefused(NpufixError):
    """``--strict``: the run would need an approximate change; nothing written (exit 4)."""

    exit_code = EXIT_STRICT


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), at most 300 characters: the form
    every one-line error of npufix quotes a library's complaint in."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
