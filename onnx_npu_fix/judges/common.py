"""What every vendor judge shares: arguments, the model's input shapes, calibration data, the verdict.

A judge is run by the vendor toolchain's own Python (the vendor/judge_*.sh wrappers pick it), so this module
only needs numpy and onnx, which every toolchain venv has. Contract of a judge (what `npufix reduce --judge`
and vendor/acceptance_matrix.py rely on):

- exit 0 and a last line ``JUDGE: accepted ...`` when the compiler produces its artefact (and, with
  ``--fail-on-cpu``, places every op on the NPU);
- exit 1 and a line ``JUDGE: rejected: <the compiler's own error line>`` otherwise;
- exit 2 on bad usage (no model, a dynamic input without ``--input-shape``);
- exit 3 and ``JUDGE: no verdict: ...`` when a step before the compiler failed (Vela's onnx2tf conversion): the
  compiler never saw the model, so this is neither acceptance nor rejection.
- ``--json FILE``: the verdict as one JSON object (verdict, message, cpu_ops: [[op type, layer name], ...] when
  the compiler reports placement, else null; seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import onnx

_ERROR_LINE = re.compile(r"(ASSERT|Assertion|Error|error:|ERROR|FAIL|Exception|Traceback|Abort|abort)")


@dataclass
class Verdict:
    accepted: bool
    message: str
    cpu_ops: list[tuple[str, str]] | None = None
    """(op type, layer name) of every layer the compiler placed on the CPU; None if it does not say."""
    extra: dict = field(default_factory=dict)
    undecided: bool = False
    """True when the compiler never saw the model (a converter before it failed)."""


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("model", help="the ONNX model to judge")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:D0,D1,...",
                   help="shape of a graph input whose dims are not all fixed (repeatable)")
    p.add_argument("--fail-on-cpu", action="store_true",
                   help="also reject when the compiler places any op on the CPU (where it reports placement)")
    p.add_argument("--json", metavar="FILE", help="write the verdict as JSON to FILE")
    p.add_argument("--workdir", help="keep the compiler's files here (default: a temporary directory)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds for one compiler run")
    return p


def input_shapes(model: onnx.ModelProto, overrides: list[str]) -> dict[str, tuple[list[int], np.dtype]]:
    """Graph inputs (initializers excluded) -> (static shape, numpy dtype); exits 2 when a dim is unknown."""
    given = {}
    for text in overrides:
        name, _, dims = text.rpartition(":")
        given[name] = [int(d) for d in dims.split(",") if d]
    inits = {t.name for t in model.graph.initializer}
    shapes = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tensor = vi.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if vi.name in given:
            shapes[vi.name] = (given[vi.name], dtype)
            continue
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim]
        if any(d is None for d in dims):
            print(f"JUDGE: usage: input {vi.name!r} has a dynamic shape: pass --input-shape {vi.name}:...")
            sys.exit(2)
        shapes[vi.name] = (dims, dtype)
    return shapes


def sample(shape: list[int], dtype: np.dtype, seed: int = 0) -> np.ndarray:
    """Calibration / probe data: N(0,1) for float inputs, zeros for integer and bool inputs."""
    if np.issubdtype(dtype, np.floating):
        return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def is_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def error_line(log: str, default: str = "failed") -> str:
    """The compiler's own error line: the first failed assertion (a native compiler's abort, which the Python
    driver around it re-raises as a generic error), else the exception line of a Python traceback, else the first
    line naming an error, else the last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    asserted = [ln for ln in lines if re.search(r"\bASSERT\b|Assertion .* failed", ln)]
    if asserted:
        return asserted[0][-300:]
    if any(ln.startswith("Traceback") for ln in lines):  # a Python tool died: its exception line says why
        raised = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", ln)]
        if raised:
            return raised[-1][-300:]
    for ln in lines:
        if _ERROR_LINE.search(ln) and "WARNING" not in ln and "warning" not in ln:
            return ln[-300:]
    return lines[-1][-300:] if lines else default


def run_captured(action, log_path: str) -> tuple[object, BaseException | None, str]:
    """Run ``action()`` with Python's and the native libraries' stdout / stderr sent to ``log_path``.

    Vendor toolchains print from C++ and from Python's logging; their own exception is a verdict, not a crash
    of the judge. Returns (result, exception or None, the whole log)."""
    import traceback

    saved = os.dup(1), os.dup(2)
    result, error = None, None
    with open(log_path, "w+", encoding="utf-8", errors="replace") as log_file:
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        buffer = io.StringIO()
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                try:
                    result = action()
                except Exception as exc:  # noqa: BLE001 - the compiler's exception is the verdict
                    traceback.print_exc()
                    error = exc
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        log_file.write(buffer.getvalue())
        log_file.seek(0)
        log = log_file.read()
    return result, error, log


def workdir(args: argparse.Namespace) -> str:
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
        return os.path.abspath(args.workdir)
    return tempfile.mkdtemp(prefix="npufix-judge-")


def finish(args: argparse.Namespace, verdict: Verdict, started: float) -> None:
    """Print the verdict line, write --json, exit 0 (accepted) or 1 (rejected)."""
    accepted = verdict.accepted and not (args.fail_on_cpu and verdict.cpu_ops)
    message = verdict.message
    if verdict.accepted and not accepted:
        message = f"{len(verdict.cpu_ops)} ops on the CPU: " + ", ".join(f"{op} {name}" for op, name in
                                                                          verdict.cpu_ops[:5])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            label = "no verdict" if verdict.undecided else "accepted" if accepted else "rejected"
            json.dump({"verdict": label, "compiled": verdict.accepted,
                       "message": message, "cpu_ops": verdict.cpu_ops, "seconds": round(time.time() - started, 1),
                       **verdict.extra}, f)
    if verdict.undecided:
        print(f"JUDGE: no verdict: {message}")
        sys.exit(3)
    cpu = "" if verdict.cpu_ops is None else f" ({len(verdict.cpu_ops)} CPU ops)"
    print(f"JUDGE: accepted{cpu}" if accepted else f"JUDGE: rejected: {message}")
    sys.exit(0 if accepted else 1)
