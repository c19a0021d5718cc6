"""The prober: sends probe models to a judge, keeps every call and bisects a numeric limit.

A numeric limit is bisected: the value doubles from 1 (or a given start) while the judge accepts (up to a cap),
then a binary search between the last accepted and the first rejected value finds the largest accepted one. The
search assumes the judge's answer is monotone in the value (every compiler limit the profiles record is a bound).
Verdicts are cached by the SHA-256 of the probe's bytes: no model is judged twice.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.judge.candidates import unbuildable
from onnx_npu_fix.judge.command import FAIL, PASS, TIMEOUT, Judge, Verdict


@dataclass(frozen=True)
class Call:
    """One judge call (cache hits are not calls): the probe, its parameters, the model's SHA-256, the verdict."""

    probe: str
    params: dict[str, Any]
    sha256: str
    verdict: Verdict

    def evidence(self) -> str:
        what = self.verdict.text()
        return f"sha256 {self.sha256[:12]}, {what}"

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "params": self.params, "sha256": self.sha256, "verdict": self.verdict.kind,
                "signature": self.verdict.signature, "exit_code": self.verdict.exit_code,
                "seconds": round(self.verdict.seconds, 3)}


@dataclass(frozen=True)
class Bracket:
    """A bisected limit: the largest accepted and the smallest rejected value (None: none seen), and why the
    search stopped short (``undecided``: a timeout, a rejection at 1)."""

    probe: str
    accepted: Call | None
    rejected: Call | None
    value: int | None
    cap: int
    undecided: str | None = None

    def evidence(self, key: str) -> str:
        sample = self.accepted or self.rejected
        fixed = ", ".join(f"{k} {v}" for k, v in sample.params.items() if k != key) if sample else ""
        parts = [f"probe {self.probe}" + (f" ({fixed})" if fixed else "")]
        if self.accepted is not None:
            parts.append(f"{self.accepted.params[key]} accepted ({self.accepted.evidence()})")
        if self.rejected is not None:
            parts.append(f"{self.rejected.params[key]} rejected ({self.rejected.evidence()})")
        return "; ".join(parts)


@dataclass
class Learned:
    """One profile key the probe set, with its evidence (a one-line comment)."""

    key: str
    value: Any
    evidence: str


@dataclass
class ProbeResult:
    """What :func:`probe` learned and how."""

    learned: dict[str, Learned] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    unbuildable: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    """The --like models fixed under the learned profile, each judged: model, sha256, verdict, signature."""
    cached: int = 0
    judge_seconds: float = 0.0
    interrupted: bool = False


class Prober:
    """Sends probe models to a judge and keeps every call (the report), the cache hits and the unbuildable ones."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.result = ProbeResult()
        self.started = time.perf_counter()
        self._seen: dict[str, Call] = {}

    def ask(self, probe: str, params: dict[str, Any], model: onnx.ModelProto) -> Call | None:
        """The judge's call on ``model`` (a cached one when these bytes were judged before); None when the model
        cannot be built (recorded with the reason, never sent)."""
        reason = unbuildable(model)
        if reason is not None:
            self.result.unbuildable.append({"probe": probe, "params": params, "reason": reason})
            progress.emit(progress.JudgeCall(f"probe {probe} {_params_text(params)}: not built ({reason})"))
            return None
        data = model.SerializeToString()
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._seen:
            self.result.cached += 1
            return self._seen[digest]
        verdict = self.judge.judge(data)
        call = Call(probe, params, digest, verdict)
        self._seen[digest] = call
        self.result.calls.append(call)
        self.result.judge_seconds += verdict.seconds
        progress.emit(progress.JudgeCall(
            f"judge call {len(self.result.calls)}: {probe} {_params_text(params)} -> {verdict.text()}  "
            f"({time.perf_counter() - self.started:.1f}s)"))
        return call

    def bisect(self, probe: str, key: str, build: Callable[[int], onnx.ModelProto], cap: int,
               fixed: dict[str, Any], start: int = 1) -> Bracket:
        """The largest value of ``key`` in ``start``..``cap`` the judge accepts (module docstring)."""
        def ask(value: int) -> Call | None:
            return self.ask(probe, {**fixed, key: value}, build(value))

        accepted = rejected = None
        value = start
        while True:
            call = ask(value)
            stop = _stop_reason(call, value, accepted)
            if stop is not None:
                return Bracket(probe, accepted, rejected, None, cap, stop)
            if call.verdict.kind == PASS:
                accepted = call
                if value >= cap:
                    return Bracket(probe, accepted, None, None, cap)
                value = min(2 * value, cap)
            else:
                rejected = call
                break
        while rejected.params[key] - accepted.params[key] > 1:
            middle = (accepted.params[key] + rejected.params[key]) // 2
            call = ask(middle)
            if call is None or call.verdict.kind == TIMEOUT:
                return Bracket(probe, accepted, rejected, None, cap, _undecided(call, middle))
            accepted, rejected = (call, rejected) if call.verdict.kind == PASS else (accepted, call)
        return Bracket(probe, accepted, rejected, accepted.params[key], cap)


def _stop_reason(call: Call | None, value: int, accepted: Call | None) -> str | None:
    if call is None or call.verdict.kind == TIMEOUT:
        return _undecided(call, value)
    if call.verdict.kind == FAIL and accepted is None:
        return f"rejected already at {value} ({call.evidence()})"
    return None


def _undecided(call: Call | None, value: int) -> str:
    if call is None:
        return f"the probe at {value} could not be built"
    return f"the judge timed out at {value} ({call.evidence()})"


def _params_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def constraints(result: ProbeResult) -> dict[str, Any]:
    """The learned profile keys as FixOptions values."""
    values = {key: learned.value for key, learned in result.learned.items()}
    if "forbidden_ops" in values:
        values["forbidden_ops"] = tuple(sorted(values["forbidden_ops"]))
    return values
