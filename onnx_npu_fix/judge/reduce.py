"""``npufix reduce``: the smallest sub-model a judge still rejects with the original failure.

The model (static shapes, constant-folded: api.reduce prepares it) is judged whole first; that failure's
signature is the one every candidate must reproduce to count as failing (judge/command.py) — a pass, a timeout,
another signature or an unbuildable candidate (never sent: judge/candidates.py) all count as "not this failure".
Then, over the removable nodes in topological order ``seq`` (n of them):

1. bisect from both ends: the shortest prefix ``seq[:j]`` that still fails (a binary search over ``j``: the
   prefix's dangling tensors are graph outputs), then the latest start ``i`` with ``seq[i:j]`` still failing (the
   cut tensors become graph inputs): 2·⌈log2 n⌉ judge calls on a failure that one node causes;
2. delta debugging (Zeller's ddmin) over the nodes left, for what bisection cannot remove (branches, or a cause
   made of several nodes): try each of k chunks alone, then each complement, doubling k until k is the number of
   nodes left. It ends 1-minimal: removing any single node of the result no longer reproduces the failure;
3. ``shrink`` (optional): attributes that are not the cause are made smaller where the op allows it exactly
   (judge/shrink.py), each change kept only when the failure stays.

The judge's cache (by the candidate's bytes) and a cache of the node sets tried keep repeated candidates free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_npu_fix import progress
from onnx_npu_fix.judge.candidates import Candidate, CandidateBuilder, judge_bytes
from onnx_npu_fix.judge.command import FAIL, PASS, TIMEOUT, Judge, JudgeError, Verdict


class NothingToReduce(JudgeError):
    """The judge accepts the model: there is no failure to reduce (exit 2)."""


@dataclass
class Trial:
    """One candidate tried: its node count, and the verdict (None: unbuildable, with ``reason``)."""

    nodes: int
    verdict: Verdict | None
    reason: str | None = None
    same: bool = False
    """It reproduces the original failure (same signature)."""

    def to_json(self) -> dict[str, Any]:
        if self.verdict is None:
            return {"nodes": self.nodes, "verdict": "unbuildable", "reason": self.reason}
        return {"nodes": self.nodes, "verdict": self.verdict.kind, "signature": self.verdict.signature,
                "same_failure": self.same, "seconds": round(self.verdict.seconds, 3)}


@dataclass
class Reduction:
    """What :func:`reduce_model` found."""

    model: onnx.ModelProto
    """The minimal model: it still fails with :attr:`signature`."""
    signature: str
    nodes_before: int
    nodes_after: int
    min_good: onnx.ModelProto | None = None
    """The passing candidate nearest the minimal model (most of its nodes, then fewest others), when the judge
    passed one; None otherwise."""
    calls: int = 0
    cached: int = 0
    unbuildable: int = 0
    timeouts: int = 0
    other_failures: int = 0
    """Candidates that failed with another signature (not counted as failing)."""
    seconds: float = 0.0
    judge_seconds: float = 0.0
    steps: dict[str, int] = field(default_factory=dict)
    """Nodes left after each step (bisect, ddmin, shrink)."""
    trials: list[Trial] = field(default_factory=list)


def reduce_model(model: onnx.ModelProto, judge: Judge, *, shrink: bool = False) -> Reduction:
    """Reduce ``model`` (static shapes, inferred; left as it is) to a 1-minimal sub-model ``judge`` rejects with
    the failure it reports on the whole model (see the module docstring).

    Raises NothingToReduce when the judge passes the model, JudgeError when it times out on it or, with a
    ``--signature`` regex, when the failure's output does not match it."""
    search = _Search(model, judge)
    seq = search.builder.removable
    whole = search.judge_whole()
    search.signature = whole.signature
    kept = search.bisect(seq)
    search.steps["bisect"] = len(kept)
    kept = search.ddmin(kept)
    search.steps["ddmin"] = len(kept)
    best = search.candidate(kept)
    if shrink:
        from onnx_npu_fix.judge.shrink import shrink_candidate

        best = shrink_candidate(best, search.fails_model)
        search.steps["shrink"] = len(best.nodes)
    return search.result(best)


class _Search:
    """The state of one reduction: the builder, the judge, the target signature, what was tried."""

    def __init__(self, model: onnx.ModelProto, judge: Judge) -> None:
        self.builder = CandidateBuilder(model)
        self.judge = judge
        self.started = time.perf_counter()
        self.signature: str | None = None
        self.nodes_before = len(model.graph.node)
        self.steps: dict[str, int] = {}
        self.trials: list[Trial] = []
        self._tried: dict[frozenset[int], bool] = {}
        self._built: dict[frozenset[int], Candidate] = {}
        self._passing: list[frozenset[int]] = []
        self.unbuildable = self.timeouts = self.other = 0
        # A judge may serve several reductions (and a fixing run): this one's figures are the difference.
        self._start = (judge.calls, judge.cached, judge.seconds)

    def judge_whole(self) -> Verdict:
        verdict = self.judge.judge(judge_bytes(self.builder.model))
        self._say(len(self.builder.model.graph.node), verdict)
        if verdict.kind == PASS:
            raise NothingToReduce("the judge passes the model (static shapes, constants folded): nothing to reduce")
        if verdict.kind == TIMEOUT:
            raise JudgeError(f"the judge timed out on the whole model (--judge-timeout {self.judge.timeout:g} s); "
                             f"raise --judge-timeout, nothing to reduce against")
        if verdict.signature is None:
            raise JudgeError("the judge fails the model, but its output does not match --signature; "
                             f"its output ends: {_last_line(verdict.output)}")
        return verdict

    def fails(self, kept: Sequence[int]) -> bool:
        """Whether the candidate keeping ``kept`` reproduces the original failure (cached per node set)."""
        key = frozenset(kept)
        if key in self._tried:
            return self._tried[key]
        built = self.builder.build(key)
        if isinstance(built, str):
            self.unbuildable += 1
            self.trials.append(Trial(len(key), None, built))
            self._tried[key] = False
            return False
        self._built[key] = built
        verdict, same = self._judge(built.data, len(key))
        self._tried[key] = same
        if verdict.kind == PASS:
            self._passing.append(key)
        return same

    def fails_model(self, data: bytes, nodes: int) -> bool:
        """Whether serialized candidate bytes fail with the original signature (``nodes``: for the log)."""
        return self._judge(data, nodes)[1]

    def _judge(self, data: bytes, nodes: int) -> tuple[Verdict, bool]:
        calls = self.judge.calls
        verdict = self.judge.judge(data)
        same = verdict.kind == FAIL and verdict.signature == self.signature
        if self.judge.calls > calls:  # a cache hit is not a new trial
            self.timeouts += verdict.kind == TIMEOUT
            self.other += verdict.kind == FAIL and not same
            self.trials.append(Trial(nodes, verdict, same=same))
            self._say(nodes, verdict, same)
        return verdict, same

    def bisect(self, seq: list[int]) -> list[int]:
        """The shortest failing prefix, then the latest failing start of it (module docstring, step 1)."""
        lo, hi = 1, len(seq)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.fails(seq[:mid]):
                hi = mid
            else:
                lo = mid + 1
        end = hi
        lo, hi = 0, end - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.fails(seq[mid:end]):
                lo = mid
            else:
                hi = mid - 1
        return seq[lo:end]

    def ddmin(self, items: list[int]) -> list[int]:
        """Zeller's ddmin over ``items`` (module docstring, step 2)."""
        n = 2
        while len(items) >= 2:
            chunks = [items[k * len(items) // n:(k + 1) * len(items) // n] for k in range(n)]
            chunks = [c for c in chunks if c]
            found = next((c for c in chunks if self.fails(c)), None)
            if found is not None:
                items, n = found, 2
                continue
            if n > 2:
                complements = ([v for v in items if v not in chunk] for chunk in map(set, chunks))
                found = next((c for c in complements if self.fails(c)), None)
                if found is not None:
                    items, n = found, max(n - 1, 2)
                    continue
            if n >= len(items):
                break
            n = min(len(items), 2 * n)
        return items

    def candidate(self, kept: Sequence[int]) -> Candidate:
        key = frozenset(kept)
        if key not in self._built:
            if not self.fails(kept):  # only the whole model can be here untried (nothing removable failed)
                raise JudgeError("no candidate reproduces the failure (every sub-model passes, fails otherwise or "
                                 "cannot be built)")
        return self._built[key]

    def result(self, best: Candidate) -> Reduction:
        good = self._nearest_passing(best.nodes)
        return Reduction(
            model=best.model, signature=self.signature or "", nodes_before=self.nodes_before,
            nodes_after=len(best.model.graph.node), min_good=good.model if good is not None else None,
            calls=self.judge.calls - self._start[0], cached=self.judge.cached - self._start[1],
            unbuildable=self.unbuildable, timeouts=self.timeouts, other_failures=self.other,
            seconds=time.perf_counter() - self.started, judge_seconds=self.judge.seconds - self._start[2],
            steps=dict(self.steps), trials=list(self.trials))

    def _nearest_passing(self, nodes: frozenset[int]) -> Candidate | None:
        if not self._passing:
            return None
        key = max(self._passing, key=lambda k: (len(k & nodes), -len(k - nodes)))
        return self._built[key]

    def _say(self, nodes: int, verdict: Verdict, same: bool = True) -> None:
        what = verdict.text() if same or verdict.kind != FAIL else f"other failure: {verdict.signature}"
        progress.emit(progress.JudgeCall(f"judge call {self.judge.calls}: {nodes} nodes -> {what}  "
                                         f"({time.perf_counter() - self.started:.1f}s)"))


def _last_line(output: str) -> str:
    lines = [s.strip() for s in output.splitlines() if s.strip()]
    return lines[-1][:200] if lines else "(nothing)"
