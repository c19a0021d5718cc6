"""Two models' outputs compared over the input sets, output by output, and the criteria of a verdict: the exact
tolerance (atol scaled with the output's magnitude, rtol), equality for integer outputs, the approximate bound on
the relative L2 error (and its 95% upper confidence bound); the one-line summaries of a comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnx_npu_fix.pipeline.validation.session import Outputs


def bit_identical(a: Outputs, b: Outputs) -> bool:
    """Every output of ``a`` and ``b`` the same bytes (NaNs in the same places, -0.0 apart from 0.0)."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)


@dataclass
class OutputDiff:
    """One output compared over every input set: the statistics users compare with (max abs, mean abs, max rel,
    the relative L2 error, cosine), and the one the verdict used (``metric``: ``atol_needed`` against ``atol``
    for the exact criterion, ``rel_l2`` against the approximate bound, ``steps`` for quantized outputs,
    ``max_abs`` against 0 for integer ones) with its ``value`` and ``bound``."""

    name: str
    max_abs: float
    max_rel: float
    rel_l2: float
    cosine: float
    passed: bool
    needed_atol: float
    """The smallest absolute tolerance (with this output's rtol) under which this output would have passed."""
    mean_abs: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0
    """This output's tolerances (``--rtol NAME:VALUE`` / ``--atol NAME:VALUE``, else the run's)."""
    metric: str = ""
    value: float = 0.0
    bound: float = 0.0
    sets: int = 0
    """How many input sets were compared."""
    rel_l2_upper: float | None = None
    """The one-sided 95% upper confidence bound of ``rel_l2`` over those sets (:func:`rel_l2_upper`; None with
    fewer than two). An approximate verdict near its bound is measured on more sets and then needs this, not only
    the estimate, within the bound (see :meth:`Validator._at_the_edge`)."""

    def to_json(self) -> dict[str, Any]:
        return {k: (v if not isinstance(v, float) else float(f"{v:.6g}")) for k, v in self.__dict__.items()}


@dataclass
class Comparison:
    outputs: list[OutputDiff] = field(default_factory=list)
    criterion: str = ""
    exact: bool = True
    """Whether the exact tolerance applied (False: the approximate bound)."""
    error: str | None = None
    """Set when the outputs could not be compared at all (missing output, shape or dtype mismatch)."""
    rtol: float = 0.0
    atol: float = 0.0
    """The exact criterion's tolerances (the summary names the bound when the scaled atol carried an output)."""
    sets_not_run: int = 0
    """The run's input sets this model was not run on: its outputs on the first were bit-identical to the model's
    before it (an exact candidate; see validator.py's module docstring)."""
    sets_carried: int = 0
    """Of the sets compared (the final comparison's), those this model did not run: the outputs of the last model
    before it that ran them stand in (every model since was exact and bit-identical to its predecessor on the
    first set)."""

    @property
    def passed(self) -> bool:
        return self.error is None and all(o.passed for o in self.outputs)

    @property
    def worst(self) -> OutputDiff | None:
        return max(self.outputs, key=lambda o: (not o.passed, o.max_abs), default=None)

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    def to_json(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "passed": self.passed,
            "criterion": self.criterion,
            "error": self.error,
            "max_abs": float(f"{self.max_abs:.6g}"),
            "max_rel": float(f"{self.max_rel:.6g}"),
            "worst_output": worst.name if worst else None,
            "outputs": [o.to_json() for o in self.outputs],
            "sets_not_run": self.sets_not_run,
            "sets_carried": self.sets_carried,
        }


def compare(reference: Sequence[Outputs], candidate: Sequence[Outputs], *, exact: bool, rtol: float,
            atol: float, max_approx_error: float, output_rtol: Mapping[str, float] | None = None,
            output_atol: Mapping[str, float] | None = None, confident: bool = False) -> Comparison:
    """Compare every output over every input set.

    Exact: each element must satisfy ``|a - b| <= atol * max(1, max|ref|) + rtol * |ref|`` — atol scales with
    the output's magnitude because float32 reassociation errors do; ``output_rtol`` / ``output_atol`` override
    the tolerances of the outputs they name (as polygraphy's ``--rtol out:1e-3``). Integer/bool outputs must be
    equal. Approximate: the relative L2 error ``||a - b|| / ||b||`` of each output must not exceed
    ``max_approx_error`` — with ``confident``, its 95% upper confidence bound over the input sets must not.
    """
    output_rtol, output_atol = output_rtol or {}, output_atol or {}
    criterion = (f"|a-b| <= {atol:g}*max(1,max|ref|) + {rtol:g}*|ref|" if exact
                 else f"relative L2 error <= {max_approx_error:g}")
    overrides = [f"{name}: rtol {output_rtol.get(name, rtol):g}, atol {output_atol.get(name, atol):g}"
                 for name in dict.fromkeys([*output_rtol, *output_atol])]
    if exact and overrides:
        criterion += f" ({'; '.join(overrides)})"
    result = Comparison(criterion=criterion, exact=exact, rtol=rtol, atol=atol)
    names = list(reference[0].keys()) if reference else []
    for name in names:
        out_rtol, out_atol = output_rtol.get(name, rtol), output_atol.get(name, atol)
        stats = _Accumulator()
        for ref_set, cand_set in zip(reference, candidate):
            if name not in cand_set:
                result.error = f"output '{name}' is missing"
                return result
            ref, cand = ref_set[name], cand_set[name]
            if ref.shape != cand.shape:
                result.error = f"output '{name}' changed shape {list(ref.shape)} -> {list(cand.shape)}"
                return result
            if ref.dtype != cand.dtype:
                result.error = f"output '{name}' changed dtype {ref.dtype} -> {cand.dtype}"
                return result
            stats.add(ref, cand, out_rtol)
        result.outputs.append(stats.finish(name, exact=exact, rtol=out_rtol, atol=out_atol,
                                           max_approx_error=max_approx_error, confident=confident))
    return result


class _Accumulator:
    def __init__(self) -> None:
        self.max_abs = 0.0
        self.sum_abs = 0.0
        self.count = 0
        self.set_err_sq: list[float] = []  # per input set, for the confidence of the pooled relative L2 error
        self.set_ref_sq: list[float] = []
        self.max_rel = 0.0
        self.ref_mag = 0.0
        self.err_sq = 0.0
        self.ref_sq = 0.0
        self.cand_sq = 0.0
        self.dot = 0.0
        self.needed = 0.0  # max over elements of (|a-b| - rtol*|ref|), for the atol that would have passed
        self.non_finite_mismatch = False
        self.integer = False

    def add(self, ref: np.ndarray, cand: np.ndarray, rtol: float) -> None:
        if not (np.issubdtype(ref.dtype, np.number) or ref.dtype == np.bool_):
            # strings / objects: equal or not
            self.integer = True
            if not np.array_equal(ref, cand):
                self.max_abs = max(self.max_abs, 1.0)
                self.non_finite_mismatch = True
            return
        if not np.issubdtype(ref.dtype, np.floating):
            self.integer = True
            ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
        else:
            ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
            finite_ref, finite_cand = np.isfinite(ref64), np.isfinite(cand64)
            # Non-finite values must match exactly (same inf sign, NaN where NaN).
            if not np.array_equal(finite_ref, finite_cand) or not np.array_equal(
                    ref64[~finite_ref], cand64[~finite_cand], equal_nan=True):
                self.non_finite_mismatch = True
            ref64 = np.where(finite_ref, ref64, 0.0)
            cand64 = np.where(finite_cand, cand64, 0.0)
        if ref64.size == 0:
            return
        diff = np.abs(ref64 - cand64)
        absref = np.abs(ref64)
        self.max_abs = max(self.max_abs, float(diff.max()))
        self.sum_abs += float(diff.sum())
        self.count += diff.size
        self.max_rel = max(self.max_rel, float((diff / np.maximum(absref, 1e-6)).max()))
        self.ref_mag = max(self.ref_mag, float(absref.max()))
        self.set_err_sq.append(float(np.sum(diff * diff)))
        self.set_ref_sq.append(float(np.sum(ref64 * ref64)))
        self.err_sq += self.set_err_sq[-1]
        self.ref_sq += self.set_ref_sq[-1]
        self.cand_sq += float(np.sum(cand64 * cand64))
        self.dot += float(np.sum(ref64 * cand64))
        self.needed = max(self.needed, float((diff - rtol * absref).max()))

    def finish(self, name: str, *, exact: bool, rtol: float, atol: float, max_approx_error: float,
               confident: bool = False) -> OutputDiff:
        rel_l2 = float(np.sqrt(self.err_sq / self.ref_sq)) if self.ref_sq > 0 else float(np.sqrt(self.err_sq))
        denom = np.sqrt(self.ref_sq * self.cand_sq)
        cosine = float(self.dot / denom) if denom > 0 else (1.0 if self.err_sq == 0 else 0.0)
        scale = max(1.0, self.ref_mag)
        needed_atol = max(0.0, self.needed) / scale
        if self.integer:
            metric, value, bound = "max_abs", self.max_abs, 0.0
        elif exact:
            metric, value, bound = "atol_needed", needed_atol, atol
        else:
            metric, value, bound = "rel_l2", rel_l2, max_approx_error
        upper = rel_l2_upper(self.set_err_sq, self.set_ref_sq)
        if confident and metric == "rel_l2" and upper is not None:
            metric, value = "rel_l2_upper", upper
        passed = not self.non_finite_mismatch and value <= bound
        return OutputDiff(name=name, max_abs=self.max_abs, max_rel=self.max_rel, rel_l2=rel_l2,
                          cosine=cosine, passed=passed, needed_atol=needed_atol,
                          mean_abs=self.sum_abs / self.count if self.count else 0.0, rtol=rtol, atol=atol,
                          metric=metric, value=value, bound=bound, sets=len(self.set_err_sq), rel_l2_upper=upper)


# One-sided 95% quantiles of Student's t with 1..30 degrees of freedom (beyond: the normal's 1.645 and a margin).
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def rel_l2_upper(err_sq: Sequence[float], ref_sq: Sequence[float]) -> float | None:
    """The one-sided 95% upper confidence bound of the pooled relative L2 error ``sqrt(sum(err_sq) /
    sum(ref_sq))`` when each input set (independent draws) gave ``err_sq[i] = ||a - b||^2`` and ``ref_sq[i] =
    ||b||^2``: the ratio estimator's standard error by the delta method, ``se(R^2)^2 = sum((e_i - R^2 d_i)^2) /
    (n (n - 1) mean(d)^2)``, and Student's t with n - 1 degrees of freedom. None with fewer than two sets or no
    reference energy (nothing to estimate a spread from)."""
    n = len(err_sq)
    total = float(sum(ref_sq))
    if n < 2 or total <= 0:
        return None
    ratio = float(sum(err_sq)) / total
    spread = sum((e - ratio * d) ** 2 for e, d in zip(err_sq, ref_sq)) / ((n - 1) * n * (total / n) ** 2)
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.66
    return float(np.sqrt(max(ratio + t * np.sqrt(spread), 0.0)))


def sets_summary(comparison: Comparison | None) -> str:
    """", bit-identical on the first of 3 input sets (2 not run)" for a comparison that stopped after one set;
    for a final comparison that carried sets (Comparison.sets_carried), whose outputs those are."""
    if comparison is None or not comparison.sets_not_run:
        return ""
    total = comparison.sets_not_run + 1
    if comparison.sets_carried:
        return (f"; {comparison.sets_carried} of {total} input sets carried from the last model that ran them (the "
                f"output model ran the first, bit-identical there to the one before it)")
    return f", bit-identical on the first of {total} input sets ({comparison.sets_not_run} not run)"


def approximate_summary(comparison: Comparison | None) -> str:
    """", rel L2 0.436 (bound 0.5, 586 input sets)" for an approximate comparison: its worst output's error and
    sample; near the bound, the 95% upper confidence bound the verdict used."""
    diffs = [o for o in comparison.outputs if o.metric.startswith("rel_l2")] if comparison is not None else []
    if not diffs:
        return ""
    worst = max(diffs, key=lambda o: (o.value, o.rel_l2))
    sample = (f"95% upper confidence {worst.value:.3g} over {worst.sets} input sets, measured on more near the "
              f"bound" if worst.metric == "rel_l2_upper" else f"{worst.sets} input sets")
    return f", rel L2 {worst.rel_l2:.3g} (bound {worst.bound:g}; {sample})"
