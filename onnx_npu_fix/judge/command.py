"""Running a judge: a shell command template that says whether a vendor compiler accepts a candidate model.

``{model}`` in the template becomes the candidate's path (shell-quoted), ``{dir}`` a fresh scratch directory (the
candidate is written there as ``model.onnx``; the directory is removed after the call). The verdict:

- without ``pass_regex``: the candidate *fails* when the command exits non-zero or its output (stdout and stderr,
  interleaved) matches one of ``fail_regex``;
- with ``pass_regex`` (for tools whose exit status says nothing): it *passes* only when its output matches one of
  them and none of ``fail_regex``; the exit status is ignored;
- a call that outlives ``timeout`` seconds is a *timeout*: its own kind, neither a pass nor a fail. The command
  runs in a process group of its own, killed when the command exits or at the deadline, whichever comes first; a
  command that exits in time has its exit status judged, whatever helpers it leaves behind (its output goes to a
  file, so nothing waits for a helper that keeps it open).

The output is read without terminal control sequences (colours, cursor moves, titles) or other control characters
before anything is taken from it.

A failure's *signature* says which failure it is, so that a reduction never drifts to another one: by default the
first output line that matches ``Assertion``, ``Error``, ``error:`` or ``FAIL`` (a Python traceback counts by its
last line, the exception), with the scratch paths written as ``{model}`` / ``{dir}``, other paths as ``<path>``
and numbers as ``<n>`` (a channel count or a source line may differ between candidates, the failure does not);
without such a line, the last output line, masked alike, or ``exit status N``. ``signature`` (a regex) overrides
it: its first match (group 1 when it has groups), with only the scratch paths masked.

Verdicts are cached by the SHA-256 of the candidate's serialized bytes: a candidate judged before is not sent
again (:attr:`Judge.cached` counts those).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from onnx_npu_fix.errors import InputError

PASS, FAIL, TIMEOUT = "pass", "fail", "timeout"

ERROR_PATTERN = re.compile(r"Assertion|Error|error:|FAIL")
"""A line that names a failure (the default signature is the first one)."""
_TRACEBACK = "Traceback (most recent call last)"
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_PATH = re.compile(r"(?<![\w<])(?:[A-Za-z]:)?(?:~|\.{1,2})?(?:[/\\][\w.+@-]+)+[/\\]?"  # absolute, ./, ~/, C:\
                   r"|(?<![\w<])[\w.+@-]+(?:/[\w.+@-]+)+")  # relative: dir/file
_NUMBER = re.compile(r"\d+")
_SIGNATURE_LENGTH = 300
_OUTPUT_TAIL = 4000
"""Characters of a call's output kept in its verdict (compilers are chatty; the signature is taken first)."""
MAX_OUTPUT_BYTES = 1 << 24
"""Bytes of a call's output read at most (its first and last halves)."""
_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erasing
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"  # OSC: window titles, hyperlinks
    r"|\x1b[ -/]*[0-~]"  # the other escape sequences (character sets, keypad modes)
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # the other C0 controls (not tab, newline), DEL, C1 controls


class JudgeError(InputError):
    """The judge cannot be used as given (not executable, no ``{model}``, a bad regex; exit 2)."""


@dataclass(frozen=True)
class Verdict:
    """One judge call's outcome."""

    kind: str
    """pass | fail | timeout"""
    signature: str | None
    """Which failure (see the module docstring); None for a pass, a timeout or an unmatched ``--signature``."""
    exit_code: int | None
    """The command's exit status (None after a timeout)."""
    seconds: float
    output: str = field(repr=False, default="")
    """The last characters of the command's output."""

    @property
    def failed(self) -> bool:
        return self.kind == FAIL

    def text(self) -> str:
        if self.kind == FAIL:
            return f"fail: {self.signature}" if self.signature else f"fail (exit status {self.exit_code})"
        return "timeout" if self.kind == TIMEOUT else "pass"


class Judge:
    """A judge command with its verdict rules and cache (see the module docstring).

    ``timeout``: seconds per call (None: no limit). ``signature``: a regex that overrides the default signature.
    Raises JudgeError for a template without ``{model}``, a first word that is no executable, or a bad regex."""

    def __init__(self, template: str, *, fail_regex: Sequence[str] = (), pass_regex: Sequence[str] = (),
                 timeout: float | None = None, signature: str | None = None) -> None:
        self.template = template
        self.fail_regex = [_compile(r, "--fail-regex") for r in fail_regex]
        self.pass_regex = [_compile(r, "--pass-regex") for r in pass_regex]
        self.signature_regex = _compile(signature, "--signature") if signature else None
        if timeout is not None and not timeout > 0:
            raise JudgeError(f"--judge-timeout {timeout}: must be a positive number of seconds")
        self.timeout = timeout
        _check_template(template)
        self.calls = 0
        """Commands run (cache hits not counted)."""
        self.cached = 0
        """Candidates answered from the cache."""
        self.seconds = 0.0
        """Wall time spent in judge commands."""
        self._verdicts: dict[bytes, Verdict] = {}

    def judge(self, data: bytes) -> Verdict:
        """The verdict on the serialized model ``data`` (cached by its SHA-256)."""
        key = hashlib.sha256(data).digest()
        found = self._verdicts.get(key)
        if found is not None:
            self.cached += 1
            return found
        verdict = self._run(data)
        self._verdicts[key] = verdict
        return verdict

    def _run(self, data: bytes) -> Verdict:
        scratch = tempfile.mkdtemp(prefix="npufix-judge-")
        try:
            model_path = os.path.join(scratch, "model.onnx")
            with open(model_path, "wb") as f:
                f.write(data)
            command = substitute(self.template, {"{model}": model_path, "{dir}": scratch})
            started = time.perf_counter()
            self.calls += 1
            exit_code, output = _execute(command, self.timeout)
            seconds = time.perf_counter() - started
            self.seconds += seconds
            output = output.replace(model_path, "{model}").replace(scratch, "{dir}")
            return self._verdict(exit_code, output, seconds)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _verdict(self, exit_code: int | None, output: str, seconds: float) -> Verdict:
        tail = output[-_OUTPUT_TAIL:]
        if exit_code is None:
            return Verdict(TIMEOUT, None, None, seconds, tail)
        failing = any(r.search(output) for r in self.fail_regex)
        if self.pass_regex:
            failing = failing or not any(r.search(output) for r in self.pass_regex)
        else:
            failing = failing or exit_code != 0
        if not failing:
            return Verdict(PASS, None, exit_code, seconds, tail)
        return Verdict(FAIL, self.signature_of(output, exit_code), exit_code, seconds, tail)

    def signature_of(self, output: str, exit_code: int | None = None) -> str | None:
        """The signature of a failing call's ``output`` (see the module docstring)."""
        if self.signature_regex is not None:
            found = self.signature_regex.search(output)
            if found is None:
                return None
            text = found.group(1) if found.re.groups else found.group(0)
            return " ".join(text.split())[:_SIGNATURE_LENGTH]
        line = error_line(output)
        if line is None:
            lines = [s for s in output.splitlines() if s.strip()]
            if not lines:
                return f"exit status {exit_code}"
            line = lines[-1]
        return mask(line)


def error_line(output: str) -> str | None:
    """The first line of ``output`` that names a failure: one matching :data:`ERROR_PATTERN`, or the last line of a
    Python traceback (its exception; the frames inside the traceback are not candidates); None without one."""
    lines = output.splitlines()
    k = 0
    while k < len(lines):
        line = lines[k]
        if line.startswith(_TRACEBACK):
            k += 1
            while k < len(lines) and (not lines[k].strip() or lines[k][:1].isspace()):
                k += 1
            if k < len(lines):
                return lines[k]
            return None
        if ERROR_PATTERN.search(line):
            return line
        k += 1
    return None


def mask(line: str) -> str:
    """``line`` with paths, hexadecimal and decimal numbers masked and whitespace collapsed."""
    text = _PATH.sub("<path>", line)
    text = _HEX.sub("<hex>", text)
    text = _NUMBER.sub("<n>", text)
    return " ".join(text.split())[:_SIGNATURE_LENGTH]


def _compile(pattern: str, option: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.MULTILINE)
    except re.error as exc:
        raise JudgeError(f"{option} '{pattern}': not a regular expression ({exc})") from None


def _check_template(template: str) -> None:
    """``{model}`` is in the template and its command word is an executable (PATH or a path)."""
    if "{model}" not in template:
        raise JudgeError(f"--judge '{template}': the command template has no {{model}} (where the candidate "
                         f"model's path goes), e.g. --judge 'compile.sh {{model}}'")
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise JudgeError(f"--judge '{template}': cannot parse the command ({exc})") from None
    words = [w for w in words if not re.match(r"^[A-Za-z_]\w*=", w)]  # leading VAR=value assignments
    if not words:
        raise JudgeError(f"--judge '{template}': no command to run")
    program = words[0]
    if "{model}" in program or "{dir}" in program:
        return  # the candidate itself is run: there is nothing to check before it exists
    if os.sep in program or (os.altsep and os.altsep in program):
        usable = os.path.isfile(program) and os.access(program, os.X_OK)
    else:
        usable = shutil.which(program) is not None
    if not usable:
        raise JudgeError(f"--judge: '{program}' is not an executable (not found, or not executable); the "
                         f"command's first word must be a program, e.g. python3 judge.py {{model}}")



_PLACEHOLDER = re.compile(r"\{model\}|\{dir\}")


def _quoted(value: str, quote: str | None) -> str:
    """``value`` as one word where it stands: bare, inside the template's "..." or inside its '...'."""
    if quote == '"':
        return re.sub(r'([\\"$`])', r"\\\1", value)
    if quote == "'":
        return value.replace("'", "'\\''")
    return shlex.quote(value)


def substitute(template: str, values: dict[str, str]) -> str:
    """``template`` with each placeholder of ``values`` ({model}, {dir}) replaced by its path, quoted for the
    shell where the placeholder stands: a template may quote "{model}" itself, and a path may hold a space."""
    out: list[str] = []
    quote: str | None = None
    index = 0
    while index < len(template):
        found = _PLACEHOLDER.match(template, index)
        if found and found.group(0) in values:
            out.append(_quoted(values[found.group(0)], quote))
            index = found.end()
            continue
        char = template[index]
        if char == "\\" and quote != "'" and index + 1 < len(template):
            out.append(template[index:index + 2])
            index += 2
            continue
        if quote is None and char in "'\"":
            quote = char
        elif quote == char:
            quote = None
        out.append(char)
        index += 1
    return "".join(out)

def _execute(command: str, timeout: float | None) -> tuple[int | None, str]:
    """Run ``command`` in a shell, in a session and process group of its own; (exit status, or None when it
    outlived ``timeout``; its output, control sequences removed).

    The output goes to an anonymous temporary file, not a pipe: a helper the command leaves behind, even one in a
    session of its own that the group kill cannot reach, may keep its output open, and the call must neither wait
    for it nor take the shell's own exit for a timeout. Once the shell has exited or the deadline has passed, and
    on any exception (KeyboardInterrupt, SIGTERM), the whole group is killed: a compiler's children must not
    outlive the call."""
    with tempfile.TemporaryFile(prefix="npufix-judge-output-") as sink:
        process = subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL, stdout=sink,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            exited = _exited_by(process, timeout)
        finally:
            _kill_group(process)
            process.wait()
        return (process.returncode if exited else None), plain_text(_read_output(sink))


def _exited_by(process: subprocess.Popen, timeout: float | None) -> bool:
    """Whether ``process`` exits within ``timeout`` seconds (None: waits for it). The exited process is left
    unreaped where the system allows it (``waitid`` with ``WNOWAIT``): its id then still names its process group
    when the group is killed, and cannot have been given to an unrelated process."""
    if not hasattr(os, "waitid"):
        try:
            process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    flags = os.WEXITED | os.WNOWAIT
    if timeout is None:
        os.waitid(os.P_PID, process.pid, flags)
        return True
    deadline = time.monotonic() + timeout
    delay = 0.001
    while os.waitid(os.P_PID, process.pid, flags | os.WNOHANG) is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(2 * delay, 0.05)
    return True


def _read_output(sink: IO[bytes]) -> str:
    """The output written to ``sink``; of a longer one its first and last ``MAX_OUTPUT_BYTES // 2`` bytes (the
    signature is read from the first lines, the verdict keeps the last)."""
    size = sink.seek(0, os.SEEK_END)
    sink.seek(0)
    if size <= MAX_OUTPUT_BYTES:
        data = sink.read(size)
    else:
        half = MAX_OUTPUT_BYTES // 2
        head = sink.read(half)
        sink.seek(size - half)
        data = head + b"\n...\n" + sink.read(half)
    return data.decode("utf-8", "replace")


def plain_text(output: str) -> str:
    """``output`` without terminal control sequences (colours, cursor moves, titles, hyperlinks) and other control
    characters, line ends as ``\\n``: what a signature, a verdict and a profile comment may hold."""
    return _CONTROL.sub("", output.replace("\r\n", "\n").replace("\r", "\n"))


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
