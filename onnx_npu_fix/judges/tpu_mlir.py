"""Judge: Sophgo tpu-mlir (model_transform + model_deploy, F16 by default) on one ONNX model.

Run by the tpu-mlir venv's Python (vendor/judge_tpu_mlir.sh). Accepted = a .bmodel is written; rejected = the
first ASSERT / Assertion / error line of the two steps (a bmodel has no CPU fallback, so cpu_ops stays null).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import onnx

from onnx_npu_fix.judges.common import Verdict, error_line, finish, input_shapes, parser, workdir


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--processor", default="bm1684x")
    p.add_argument("--quantize", default="F16")
    args = p.parse_args()
    started = time.time()
    model_path = os.path.abspath(args.model)
    shapes = input_shapes(onnx.load(model_path, load_external_data=False), args.input_shape)
    work = workdir(args)
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    run = dict(cwd=work, env=env, capture_output=True, text=True, timeout=args.timeout)
    # A rank-0 input (Silero's sample rate) is [1] to tpu-mlir: its OnnxConverter gives a scalar input the shape [1]
    # and refuses an --input_shapes entry of another rank ("input shapes error: ..., 1 vs 0" for []).
    shape_arg = str([s or [1] for s, _ in shapes.values()]).replace(" ", "")
    steps = [
        [os.path.join(bindir, "model_transform"), "--model_name", "m", "--model_def", model_path,
         "--input_shapes", shape_arg, "--mlir", "m.mlir"],
        [os.path.join(bindir, "model_deploy"), "--mlir", "m.mlir", "--quantize", args.quantize,
         "--processor", args.processor, "--model", "m.bmodel"],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, **run)
        except subprocess.TimeoutExpired:
            finish(args, Verdict(False, f"timeout after {args.timeout:.0f} s in {os.path.basename(step[0])}"),
                   started)
        log = done.stdout + done.stderr
        with open(os.path.join(work, os.path.basename(step[0]) + ".log"), "w", encoding="utf-8") as f:
            f.write(log)
        if done.returncode != 0:
            finish(args, Verdict(False, error_line(log)), started)
    ok = os.path.exists(os.path.join(work, "m.bmodel"))
    finish(args, Verdict(ok, "bmodel written" if ok else "no bmodel written"), started)


if __name__ == "__main__":
    main()
