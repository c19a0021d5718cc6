"""``npufix reduce`` against Polygraphy's ``debug reduce`` (``--mode bisect`` and ``--mode linear``): nodes left,
judge calls and wall time on the same models and the same judges.

    python bench/reduce_vs_polygraphy.py                # every case, prints the markdown table (~15 min, 2 cores)
    python bench/reduce_vs_polygraphy.py --only chain60  # some cases only

A script, not a test (needs ``pip install polygraphy``: the ``bench`` extra). The judges are tests/pattern_judge.py
(a structural pattern with a compiler-like message, one Python process per call, as a vendor compiler is one
process), and the models are the test suite's builders (tests/test_reduce.py) and fixtures, all prepared by npufix
(static shapes, constants folded) and written once, so both tools see the same file. Judge calls are counted by the
judge itself (``PATTERN_JUDGE_LOG``); times are each tool's whole wall time. Polygraphy gets the failure's message
as ``--fail-regex`` where the model holds two failures (it knows no signature; npufix needs none).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time

import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
sys.path[:0] = [ROOT, TESTS]

import pattern_judge  # noqa: E402
import test_reduce as cases  # noqa: E402 - the test suite's model builders (tests/ is put on the path above)
from helpers import prepared  # noqa: E402

from onnx_npu_fix.judge.command import error_line, mask  # noqa: E402

JUDGE = os.path.join(TESTS, "pattern_judge.py")
POLYGRAPHY = os.path.join(os.path.dirname(sys.executable), "polygraphy")


def _fixture(name: str):
    return lambda: prepared(onnx.load(os.path.join(ROOT, "fixtures", name)))


# name -> (model builder, judge patterns, polygraphy --fail-regex or None)
CASES = {
    "chain60": (lambda: cases._pad_chain(60, 41), "pad3-mul", None),
    "random0": (lambda: cases._random_graph(0, "pad3-mul"), "pad3-mul", None),
    "random3": (lambda: cases._random_graph(3, "pad3-mul"), "pad3-mul", None),
    "convt-branchy": (cases._branchy_convtranspose, "convt-stride", None),
    "conv-512": (cases._wide_conv, "conv-channels", None),
    "two-failures": (cases._two_patterns, "pad3-mul,convt-stride", "Assertion"),
    "two-failures-no-regex": (cases._two_patterns, "pad3-mul,convt-stride", None),  # exit codes only
    "tcn.onnx": (_fixture("tcn.onnx"), "dilation:128", None),
    "unet.onnx": (_fixture("unet.onnx"), "op:Resize", None),
    "torch_unet.onnx": (_fixture("torch_unet.onnx"), "op:Resize", None),
}


def _counted(command: list[str], log: str, cwd: str) -> tuple[int, float, int]:
    """(exit status, wall seconds, judge calls) of ``command``."""
    if os.path.exists(log):
        os.remove(log)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env={**os.environ, "PATTERN_JUDGE_LOG": log},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    calls = sum(1 for _ in open(log)) if os.path.exists(log) else 0
    if done.returncode != 0:
        print(f"  {command[:3]}... exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return done.returncode, seconds, calls


def _nodes(path: str) -> int | None:
    return len(onnx.load(path).graph.node) if os.path.exists(path) else None


def run_case(name: str, work: str) -> list[str]:
    build, patterns, fail_regex = CASES[name]
    model = build()
    source = os.path.join(work, f"{name}.onnx")
    onnx.save(model, source)
    log = os.path.join(work, "calls.log")
    judge = f"{shlex.quote(sys.executable)} {shlex.quote(JUDGE)} {patterns}"
    ours = os.path.join(work, f"{name}.npufix.onnx")
    code, seconds, calls = _counted([sys.executable, "-m", "onnx_npu_fix", "reduce", source, "--judge",
                                     f"{judge} {{model}}", "-o", ours, "-q"], log, work)
    result = f"{_nodes(ours)}{_drift(ours, source, patterns)}" if code == 0 else f"error (exit {code})"
    row = [name, str(len(model.graph.node)), f"{result} / {calls} / {seconds:.0f}s"]
    for mode in ("bisect", "linear"):
        out = os.path.join(work, f"{name}.{mode}.onnx")
        command = [POLYGRAPHY, "debug", "reduce", source, "-o", out, "--mode", mode]
        if fail_regex:
            command += ["--fail-regex", fail_regex]
        command += ["--check", *shlex.split(judge), "polygraphy_debug.onnx"]  # --check takes the rest
        code, seconds, calls = _counted(command, log, work)
        result = f"{_nodes(out)}{_drift(out, source, patterns)}" if code == 0 else f"error (exit {code})"
        row.append(f"{result} / {calls} / {seconds:.0f}s")
    return row


def _drift(path: str, source: str, patterns: str) -> str:
    """'' when the reduced model fails with the original's message, else what it does instead."""
    if not os.path.exists(path):
        return " (no model)"
    messages = []
    for model in (source, path):
        with open(model, "rb") as f:
            code, output = pattern_judge.judge_bytes(patterns.split(","), f.read(), onnx.ModelProto)
        messages.append(mask(error_line(output) or "") if code else "passes")
    return "" if messages[0] == messages[1] else f" (other failure: {messages[1][:32]}…)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated case names: " + ", ".join(CASES))
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(CASES)
    print("| model (judge) | nodes | npufix reduce: nodes / calls / time | polygraphy bisect | polygraphy linear |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="npufix-reduce-bench-") as work:
        for name in names:
            row = run_case(name, work)
            row[0] = f"{row[0]} (`{CASES[name][1]}`)"
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
