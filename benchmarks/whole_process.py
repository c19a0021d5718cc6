"""Whole-process time and peak memory of npufix and of its floors, in one asv run per commit.

Every figure comes from a fresh process started by ``bench/bench.py``'s launcher (``run_child``: wall time, and
peak RSS from the kernel's rusage of that one child), so interpreter start and imports count as they do in a CI
step. For each model, built into a cache directory by ``bench/bench.py``'s builders (not committed), the steps
are run in interleaved rounds and the median of each is kept:

  a      the I/O floor: ``onnx.load`` + ``onnx.save`` (``bench.FLOOR``)
  h      the floor plus onnx's own checks (``bench.CHECKED``; not with external data)
  g      one onnxruntime session of the original, run once (``bench.ORT_ONCE``)
  g_out  the same on npufix's output (the output of b)
  b      ``npufix M -o OUT --max-dilation 4 --align 8 --no-validate``
  c      ``npufix M -o OUT --max-dilation 4 --align 8`` (the design card's command, validated)
  check  ``npufix M --max-dilation 4 --align 8 --check``
  d      ``onnxsim M OUT`` (its default command line), on the models where c/d is quoted

``setup_cache`` measures everything once per commit; the ``track_*`` benchmarks read its figures, so every ratio
is of figures taken in the same run. ``NPUFIX_ASV_QUICK=1`` measures the builders' small models in one round (a
smoke test of the suite); ``NPUFIX_ASV_MODELS=chain10k,chain30k`` measures those models only (the others' figures
are skipped, n/a); ``NPUFIX_BENCH_DIR`` moves the model cache (default: ``build/bench`` of this checkout,
shared with ``bench/bench.py``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import statistics
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_bench() -> Any:
    """``bench/bench.py`` of this checkout: the builders, the floors and the launcher have their one home there."""
    spec = importlib.util.spec_from_file_location("npufix_bench", os.path.join(ROOT, "bench", "bench.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench = _load_bench()

DESIGN_CARD = ("--max-dilation", "4", "--align", "8")
STEP_TIMEOUT = 1800.0
RSS_LIMIT = 16 * bench.GIB
ONNXSIM_MODELS = ("tcn", "unet")  # where the docs quote c/d; onnxsim takes minutes on the long chains
ROUNDS = 3  # timed rounds after one untimed one; models marked huge get one round and no warm-up

# The bench.py cases this suite runs, and a 270 MB model with external data in place of the 2.4 GB one.
_BY_NAME = {case.name: case for case in bench.CASES}
CASES = (*(_BY_NAME[name] for name in ("tcn", "unet", "unet-qdq", "chain10k", "chain30k")),
         dataclasses.replace(_BY_NAME["external2g"], name="external270m", title="270 MB, external data",
                             params=dict(layers=4, channels=4096)))
MODELS = [case.name for case in CASES]


def _quick() -> bool:
    return os.environ.get("NPUFIX_ASV_QUICK", "") == "1"


def _chosen() -> list[Any]:
    names = [name.strip() for name in os.environ.get("NPUFIX_ASV_MODELS", "").split(",") if name.strip()]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        raise ValueError(f"NPUFIX_ASV_MODELS: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    return [case for case in CASES if not names or case.name in names]


def _step_commands(name: str, path: str, external: bool, out_dir: str) -> dict[str, list[str]]:
    py = sys.executable
    npufix = [py, "-m", "onnx_npu_fix", path, *DESIGN_CARD]
    out = {key: os.path.join(out_dir, f"{key}.onnx") for key in ("a", "b", "c", "d", "h")}
    steps = {"a": [py, "-c", bench.FLOOR, path, out["a"], "1" if external else "0"],
             "b": [*npufix, "-o", out["b"], "--no-validate"],
             "c": [*npufix, "-o", out["c"]],
             "check": [*npufix, "--check"],
             "g": [py, "-c", bench.ORT_ONCE, path],
             "g_out": [py, "-c", bench.ORT_ONCE, out["b"]]}  # after b in every round: its output is there
    if not external:
        steps["h"] = [py, "-c", bench.CHECKED, path, out["h"]]
    if name in ONNXSIM_MODELS and not _quick():
        steps["d"] = [py, "-m", "onnxsim", path, out["d"]]
    return steps


def measure(case: Any, workdir: str) -> dict[str, Any]:
    """The case's model (built unless cached), then every step in interleaved rounds: per step the median wall
    time, the median CPU time, the largest peak RSS and the exit statuses seen."""
    path, stamp = bench.ensure_model(case, _quick(), workdir)
    out_dir = os.path.join(workdir, "asv-out", case.name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    steps = _step_commands(case.name, path, stamp["external_data"], out_dir)
    warm, rounds = (0, 1) if case.huge or _quick() else (1, ROUNDS)
    runs: dict[str, list[Any]] = {key: [] for key in steps}
    bench._warm_cache(path)
    for round_ in range(warm + rounds):
        for key, cmd in steps.items():
            # cwd out_dir: ``python -m onnx_npu_fix`` would import a checkout's package from the working directory
            run = bench.run_child(cmd, timeout=STEP_TIMEOUT, rss_limit=RSS_LIMIT, cwd=out_dir)
            if round_ >= warm:
                runs[key].append(run)
    shutil.rmtree(out_dir, ignore_errors=True)
    figures: dict[str, Any] = {"nodes": stamp["nodes"], "size": stamp["size"], "steps": {}}
    for key, done in runs.items():
        ok = [run for run in done if run.status in ("ok", "exit 1")]  # exit 1: written, findings left
        figures["steps"][key] = {
            "seconds": statistics.median(run.seconds for run in ok) if ok else None,
            "cpu_seconds": statistics.median(run.cpu_seconds for run in ok) if ok else None,
            "peak_rss": max(run.peak_rss for run in ok) if ok else None,
            "statuses": sorted({run.status for run in done}),
            "stderr": done[-1].stderr.strip().splitlines()[-3:] if not ok else [],
        }
    return figures


def _ratio(figures: dict[str, Any], model: str, ratio: str, field: str) -> float:
    """One of RATIOS of ``model``'s steps, in ``field`` (wall or CPU seconds)."""
    num, den = RATIOS[ratio]
    return _figure(figures, model, num, field) / _figure(figures, model, den, field)


def _per_node(figures: dict[str, Any], model: str, field: str) -> float:
    """(b - h) of ``model`` over its node count, in microseconds of ``field`` (wall or CPU seconds)."""
    spent = _figure(figures, model, "b", field) - _figure(figures, model, "h", field)
    return 1e6 * spent / figures[model]["nodes"]


def _figure(figures: dict[str, Any], model: str, step: str, field: str) -> float:
    """One step's figure; a step that failed on this model fails the benchmark."""
    found = figures[model]["steps"][step]
    if found[field] is None:
        raise RuntimeError(f"{step} on {model}: {found['statuses']} {found['stderr']}")
    return found[field]


STEPS = ["a", "h", "g", "g_out", "b", "c", "check", "d"]
RATIOS = {"b/a": ("b", "a"), "c/a": ("c", "a"), "c/d": ("c", "d"), "check/a": ("check", "a")}


class WholeProcess:
    """Figures of one measurement per commit (``setup_cache``), by model and step."""

    params = [MODELS, STEPS]
    param_names = ["model", "step"]

    def setup(self, figures: dict[str, Any], model: str, *figure: str) -> None:
        """Skips (n/a) a model not measured, and a step or a ratio the model does not run: h with external data,
        d off ONNXSIM_MODELS."""
        if model not in figures:
            raise NotImplementedError(f"{model} not measured (NPUFIX_ASV_MODELS)")
        needed = RATIOS.get(figure[0], figure) if figure else ("b", "h")
        missing = [step for step in needed if step not in figures[model]["steps"]]
        if missing:
            raise NotImplementedError(f"{', '.join(missing)} not run on {model}")

    def setup_cache(self) -> dict[str, Any]:
        workdir = os.path.abspath(os.environ.get("NPUFIX_BENCH_DIR", os.path.join(ROOT, "build", "bench")))
        return {case.name: measure(case, workdir) for case in _chosen()}

    setup_cache.timeout = 7200

    def track_seconds(self, figures: dict[str, Any], model: str, step: str) -> float:
        """Wall time of the whole process, median of the rounds."""
        return _figure(figures, model, step, "seconds")

    track_seconds.unit = "seconds"

    def track_cpu_seconds(self, figures: dict[str, Any], model: str, step: str) -> float:
        """User + system time of the whole process (all its threads), median of the rounds."""
        return _figure(figures, model, step, "cpu_seconds")

    track_cpu_seconds.unit = "seconds"

    def track_peak_mb(self, figures: dict[str, Any], model: str, step: str) -> float:
        """Peak resident set of the process (rusage), the largest of the rounds, in MB."""
        return round(_figure(figures, model, step, "peak_rss") / 1e6, 1)

    track_peak_mb.unit = "MB"

    def track_ratio(self, figures: dict[str, Any], model: str, ratio: str) -> float:
        """A ratio of two steps' median wall times in the same run: b/a, c/a, c/d, check/a."""
        return _ratio(figures, model, ratio, "seconds")

    track_ratio.params = [MODELS, list(RATIOS)]
    track_ratio.param_names = ["model", "ratio"]
    track_ratio.unit = "ratio"

    def track_ratio_cpu(self, figures: dict[str, Any], model: str, ratio: str) -> float:
        """The same ratios of median CPU times (user + system): steadier than wall time on a shared machine."""
        return _ratio(figures, model, ratio, "cpu_seconds")

    track_ratio_cpu.params = [MODELS, list(RATIOS)]
    track_ratio_cpu.param_names = ["model", "ratio"]
    track_ratio_cpu.unit = "ratio"

    def track_b_minus_h_per_node(self, figures: dict[str, Any], model: str) -> float:
        """npufix's own cost per node: (b - h) over the node count, in microseconds of wall time (h is
        everything a tool that checks as npufix does pays besides its own work)."""
        return _per_node(figures, model, "seconds")

    track_b_minus_h_per_node.params = [MODELS]
    track_b_minus_h_per_node.param_names = ["model"]
    track_b_minus_h_per_node.unit = "us/node"

    def track_b_minus_h_per_node_cpu(self, figures: dict[str, Any], model: str) -> float:
        """The same in CPU time (user + system): what the per-node cost cuts are judged by on a shared machine."""
        return _per_node(figures, model, "cpu_seconds")

    track_b_minus_h_per_node_cpu.params = [MODELS]
    track_b_minus_h_per_node_cpu.param_names = ["model"]
    track_b_minus_h_per_node_cpu.unit = "us/node"
