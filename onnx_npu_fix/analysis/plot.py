"""``--memory-plot``: the live activation bytes per step, as data (a JSON sidecar) and as a picture.

The data come from the same estimate as ``--check`` (memory.py): the stored order's profile, the best order's
(schedule.best_schedule) and, after ``--split``, each segment's own profile placed on the best order's step axis:
each of the segment's nodes at the step its node has in the best order (a node the segment recomputes, e.g. a
weight DequantizeLinear, at the segment's first step), so a segment's peak is drawn at the step of the curve's
node that makes it. The picture (matplotlib, the optional extra ``plot``) draws them with the SRAM
budget as a horizontal line, and below them the tensors live at the best order's peak as bars from producer to last
reader, so a skip connection shows as a long bar.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import onnx

from onnx_npu_fix.analysis.memory import analysis_copy, estimate_index
from onnx_npu_fix.analysis.schedule import DEFAULT_SEARCH_BUDGET, best_schedule, liveness
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io.atomic import Transaction
from onnx_npu_fix.io.save import write_json
from onnx_npu_fix.ir.graph import GraphIndex, format_bytes

FORMATS = (".png", ".svg")
# npufix is installed from its source (not published on PyPI): the hint names what pip can find either way.
MISSING = "--memory-plot needs matplotlib: pip install matplotlib (in a checkout of npufix: pip install '.[plot]')"


def require_matplotlib() -> None:
    """Raise InputError (exit 2, one line) when the plotting extra is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InputError(MISSING) from None


def check_plot_path(path: str) -> None:
    if os.path.splitext(path)[1].lower() not in FORMATS:
        raise InputError(f"--memory-plot {path}: choose a .png or .svg file name")
    require_matplotlib()


def write_memory_plot(model: onnx.ModelProto, path: str | os.PathLike, options: FixOptions, *,
                      segments: Sequence[onnx.ModelProto] = (), cuts: Sequence[int] = (),
                      prepared: bool = True, transaction: Transaction | None = None) -> dict:
    """Draw the activation profile of ``model`` to ``path`` (.png / .svg) and its numbers to ``path + '.json'``,
    both atomically (io.atomic.atomic_write). ``prepared``: ``model`` has fresh inferred shapes (FixResult.model);
    otherwise a light analysis copy is made. ``segments`` / ``cuts``: a split's segment models and where each
    after the first starts (SplitOutcome.segments, its plan's cuts), drawn too. Returns the numbers.
    Raises InputError (exit 2) when matplotlib is missing. ``transaction``: both files are staged there (renamed
    into place with the run's other files); else committed now."""
    path = os.fspath(path)
    check_plot_path(path)
    if not prepared:
        model, _ = analysis_copy(model, options.input_shapes)
    data = profile_data(model, options.act_bytes, options.sram_bytes, segments=segments, cuts=cuts,
                        budget=options.schedule_budget)
    with Transaction() as own:
        files = transaction if transaction is not None else own
        draw(data, files.file(path, suffix=os.path.splitext(path)[1]))  # matplotlib reads the format from it
        write_json(path + ".json", data, transaction=files)
        if transaction is None:
            own.commit()
    return data


def profile_data(model: onnx.ModelProto, act_bytes: int = 1, sram_bytes: int | None = None, *,
                 segments: Sequence[onnx.ModelProto] = (), cuts: Sequence[int] = (),
                 budget: int = DEFAULT_SEARCH_BUDGET) -> dict[str, Any]:
    """The plotted numbers. ``model`` must have inferred shapes (the pass manager's output, or
    memory.analysis_copy). ``segments``/``cuts``: a split's segment models and the best-order steps where each
    after the first starts."""
    index = GraphIndex(model)
    lv = liveness(index, act_bytes)
    stored = estimate_index(index, act_bytes, sram_bytes, reorder=False)
    found = best_schedule(lv, budget)
    best = estimate_index(index, act_bytes, sram_bytes, found.order, reorder=False)
    series = [{"label": "stored order", "start": 0, "profile": stored.profile, "peak_bytes": stored.peak_bytes},
              {"label": "best order" + (" (optimal)" if found.optimal else ""), "start": 0,
               "profile": best.profile, "peak_bytes": best.peak_bytes}]
    step_of = {lv.nodes[v].name: step for step, v in enumerate(found.order)}
    bounds = [0, *cuts, len(found.order)]
    for k, segment in enumerate(segments):
        seg = estimate_index(GraphIndex(segment), act_bytes, sram_bytes, reorder=False)  # in its stored order
        profile = on_steps(seg.profile, [step_of.get(node.name, -1) for node in segment.graph.node],
                           bounds[k], bounds[k + 1])
        series.append({"label": f"segment {k}", "start": bounds[k], "profile": profile,
                       "peak_bytes": seg.peak_bytes,
                       "peak_step": step_of.get(seg.peak_node, bounds[k]) if seg.peak_node else None})
    live = [{"name": t.name, "bytes": t.bytes, "start": t.producer_step, "end": t.last_step,
             "producer": t.producer, "last_consumer": t.last_consumer} for t in best.live_at_peak if t.bytes]
    return {"act_bytes": act_bytes, "sram_bytes": sram_bytes, "steps": stored.steps, "series": series,
            "peak": {"series": series[1]["label"], "step": best.peak_step, "node": best.peak_node,
                     "bytes": best.peak_bytes, "live": live},
            "lower_bound_bytes": found.lower_bound}


def on_steps(profile: Sequence[int], steps: Sequence[int], start: int, end: int) -> list[int]:
    """A segment's ``profile`` (bytes per step of its own node order) on the whole model's steps
    ``start .. end - 1``: its node i runs at whole step ``steps[i]`` (outside the range, or -1: a node the segment
    recomputes, at ``start``); several nodes at one step give the largest, a step where none of its nodes runs
    keeps the bytes of the step before (nothing of the segment's starts or ends there)."""
    values: list[int | None] = [None] * max(0, end - start)
    for value, step in zip(profile, steps):
        k = step - start if start <= step < end else 0
        if values and (values[k] is None or value > values[k]):
            values[k] = value
    previous = profile[0] if profile else 0
    for k, value in enumerate(values):
        values[k] = previous = previous if value is None else value
    return values


LABEL_CHARS = 48
"""A tensor label longer than this is shortened in the middle (the sidecar keeps the full name)."""


def draw(data: dict[str, Any], path: str, *, title: str = "") -> None:
    """Write the picture of ``data`` (from :func:`profile_data`) to ``path`` (.png or .svg), byte for byte the
    same on every run: no date in the metadata, and the SVG's element ids from a fixed salt instead of a random
    one."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "npufix"}):
        fig = figure(data, title=title)
        metadata = {"Date": None} if path.lower().endswith(".svg") else {}
        fig.savefig(path, dpi=110, metadata=metadata)
    plt.close(fig)


def figure(data: dict[str, Any], *, title: str = ""):
    """The matplotlib Figure :func:`draw` saves (the caller closes it)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    live = sorted(data["peak"]["live"], key=lambda t: (t["start"], -t["bytes"]))[:16]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2] if live else [3, 0.01]})
    scale, unit = _unit(max([max(s["profile"], default=0) for s in data["series"]] + [data["sram_bytes"] or 0]))
    stored, best, *segments = data["series"]
    same = stored["profile"] == best["profile"]
    for s, style in ((best, dict(color="C3", lw=1.8)), (stored, dict(color="0.35", lw=1.0, ls="--"))):
        if s is stored and same:
            continue
        label = f"{'stored order = ' if same else ''}{s['label']}: peak {format_bytes(s['peak_bytes'])}"
        xs = list(range(s["start"], s["start"] + len(s["profile"]) + 1))  # step k spans [k - 0.5, k + 0.5)
        ys = [v / scale for v in s["profile"]] + [s["profile"][-1] / scale if s["profile"] else 0]
        top.step([x - 0.5 for x in xs], ys, where="post", label=label, **style)
    for s in segments:
        xs = [x - 0.5 for x in range(s["start"], s["start"] + len(s["profile"]) + 1)]
        ys = [v / scale for v in s["profile"]] + [s["profile"][-1] / scale if s["profile"] else 0]
        top.fill_between(xs, ys, step="post", alpha=0.35, label=f"{s['label']}: peak {format_bytes(s['peak_bytes'])}")
    if data["sram_bytes"]:
        top.axhline(data["sram_bytes"] / scale, color="k", lw=1.2, ls=":",
                    label=f"SRAM {format_bytes(data['sram_bytes'])}")
    peak = data["peak"]
    if peak["step"] is not None:
        top.axvline(peak["step"], color="C3", lw=0.8, alpha=0.5)
        right = peak["step"] > (data["steps"] - 1) / 2  # the label goes towards the middle: inside the figure
        top.annotate(f"peak {format_bytes(peak['bytes'])}\n{_short(peak['node'] or '')}",
                     (peak["step"], peak["bytes"] / scale), textcoords="offset points",
                     xytext=(-8 if right else 8, -4), fontsize=8, va="top", ha="right" if right else "left")
    top.set_ylabel(f"live activations ({unit})")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    # Beside the axes, not in them: "best" still covered the peak label on a split's plot.
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    top.set_title(title or f"Activation memory per step ({data['act_bytes']} B/element; estimate: no tiling)",
                  fontsize=10)
    if live:
        for row, t in enumerate(live):
            bottom.barh(row, t["end"] - t["start"] + 1, left=t["start"] - 0.5, height=0.6, color="C0", alpha=0.7)
            # A bar in the right half is labelled leftwards from its end, so the label stays inside the figure.
            right = t["start"] > (data["steps"] - 1) / 2
            bottom.text(t["end"] + 0.5 if right else t["start"] - 0.5, row,
                        f" {_short(t['name'])}  {format_bytes(t['bytes'])} ", va="center", fontsize=7,
                        ha="right" if right else "left", clip_on=True)
        bottom.axvline(peak["step"], color="C3", lw=0.8, alpha=0.5)
        bottom.set_yticks([])
        bottom.invert_yaxis()
        bottom.set_ylabel("live at the peak")
        bottom.grid(axis="x", alpha=0.3)
    bottom.set_xlabel("step (node in execution order)")
    fig.tight_layout()
    return fig


def _short(name: str) -> str:
    if len(name) <= LABEL_CHARS:
        return name
    half = (LABEL_CHARS - 1) // 2
    return f"{name[:half]}…{name[-half:]}"


def _unit(top: int) -> tuple[float, str]:
    if top >= 1 << 20:
        return float(1 << 20), "MiB"
    if top >= 1 << 10:
        return 1024.0, "KiB"
    return 1.0, "B"
