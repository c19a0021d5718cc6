"""One tracked figure of the asv suite over the commits measured, as a PNG plot and a Markdown table.

    python bench/asv_plot.py                                   # b/a, every model, docs/img/asv-b-over-a.png
    python bench/asv_plot.py --of c/a --png /tmp/c.png         # another ratio of track_ratio
    python bench/asv_plot.py --benchmark track_peak_mb --of b --png /tmp/b.png   # a step's peak
    python bench/asv_plot.py --benchmark track_b_minus_h_per_node --png /tmp/per-node.png
    python bench/asv_plot.py --benchmark track_cpu_seconds --of b --over a   # b/a in CPU time, from the steps

It reads asv's own results (``.asv/results/<machine>/<commit>-<env>.json``, written by ``asv run``), orders the
commits as the history does, draws one line per model and prints the same figures as a table (commits as
rows) for bench/results.md. ``asv publish`` draws every figure in HTML; this is the one the docs show as an image.
"""

from __future__ import annotations

import argparse
import ast
import glob
import itertools
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "whole_process.WholeProcess."


def load_series(results_dir: str, machine: str, benchmark: str, of: str | None,
                over: str | None = None) -> list[tuple[int, str, dict]]:
    """(commit date, short hash, {model: value}) per results file of ``machine``, oldest commit first; ``of``
    picks the second parameter (a ratio of ``track_ratio``, a step of ``track_seconds``), and a benchmark of one
    parameter ignores it. With ``over``, each value is divided by the same model's value of that parameter."""
    rows = []
    for path in glob.glob(os.path.join(results_dir, machine, "*.json")):
        if os.path.basename(path) == "machine.json":
            continue
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        found = data["results"].get(PREFIX + benchmark)
        if found is None:
            continue
        column = dict(zip(data["result_columns"], found))
        params = [[ast.literal_eval(p) for p in axis] for axis in column["params"]]
        found = {combo: value for combo, value in zip(itertools.product(*params), column["result"])
                 if value is not None and not (isinstance(value, float) and math.isnan(value))}
        values = {}
        for combo, value in found.items():
            if len(combo) == 1 or combo[1] == of:
                values[combo[0]] = value
        if over is not None:
            values = {model: value / found[(model, over)] for model, value in values.items() if (model, over) in found}
        rows.append((data["date"], data["commit_hash"], values))
    order = _history_order([commit for _, commit, _ in rows])
    rows.sort(key=lambda row: (order.get(row[1], len(order)), row[0]))
    return [(date, commit[:7], values) for date, commit, values in rows]


def _history_order(commits: list[str]) -> dict[str, int]:
    """Each commit's place in the repository's history, oldest first. asv's own date is the author date, which a
    cherry-pick or a rebase keeps: ordered by it, a commit would be drawn before its parent. Commits this clone
    does not have fall back to that date, after the ones it has."""
    try:
        history = subprocess.run(["git", "-C", ROOT, "rev-list", "--topo-order", "--reverse", "--all"],
                                 capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return {}
    wanted = set(commits)
    return {commit: i for i, commit in enumerate(c for c in history if c in wanted)}


def _models(rows: list[tuple[int, str, dict]]) -> list[str]:
    """The models in the suite's own order (its parameters'), each once."""
    return list(dict.fromkeys(model for _, _, values in rows for model in values))


def table(rows: list[tuple[int, str, dict]], label: str) -> str:
    models = _models(rows)
    lines = [f"| commit | {' | '.join(models)} |", "|---|" + "---|" * len(models)]
    for _, commit, values in rows:
        cells = [f"{values[m]:.2f}" if m in values else "–" for m in models]
        lines.append(f"| {commit} | {' | '.join(cells)} |")
    return f"{label}\n\n" + "\n".join(lines)


def plot(rows: list[tuple[int, str, dict]], label: str, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    commits = [commit for _, commit, _ in rows]
    models = _models(rows)
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    for model in models:
        xs = [i for i, (_, _, values) in enumerate(rows) if model in values]
        ax.plot(xs, [rows[i][2][model] for i in xs], marker="o", label=model)
    ax.set_xticks(range(len(commits)), commits)
    ax.set_xlabel("commit (oldest first)")
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(f"npufix, asv: {label} per commit")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=os.path.join(ROOT, ".asv", "results"), help="asv's results_dir")
    parser.add_argument("--machine", default=None, help="the machine's name in asv (default: the only one)")
    parser.add_argument("--benchmark", default="track_ratio", help="a track_* method of WholeProcess")
    parser.add_argument("--of", default="b/a", help="the second parameter: track_ratio's b/a, c/a, c/d or "
                        "check/a; a step (a, h, g, g_out, b, c, check, d) of track_seconds or track_peak_mb")
    parser.add_argument("--over", default=None, help="divide by this step's figure (with --of a step): "
                        "--benchmark track_cpu_seconds --of b --over a is b/a in CPU time")
    parser.add_argument("--png", default=os.path.join(ROOT, "docs", "img", "asv-b-over-a.png"))
    args = parser.parse_args(argv)
    machines = [d for d in sorted(os.listdir(args.results)) if os.path.isdir(os.path.join(args.results, d))]
    machine = args.machine or (machines[0] if len(machines) == 1 else None)
    if machine is None:
        parser.error(f"--machine: choose one of {', '.join(machines) or '(none: run asv first)'}")
    rows = load_series(args.results, machine, args.benchmark, args.of, args.over)
    if not rows:
        print(f"no results of {args.benchmark} for {machine} in {args.results}", file=sys.stderr)
        return 1
    label = args.benchmark.removeprefix("track_")
    label = args.of if label == "ratio" else label if label == "b_minus_h_per_node" else f"{label} ({args.of})"
    if args.over:
        label = f"{args.of}/{args.over}" + (" in CPU time" if args.benchmark == "track_cpu_seconds" else "")
    plot(rows, label, args.png)
    print(table(rows, f"{label} (asv, {machine}; {args.png})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
