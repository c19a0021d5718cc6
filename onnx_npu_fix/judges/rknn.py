"""Judge: Rockchip rknn-toolkit2 build (int8; a QDQ model is loaded as quantized) for one platform.

Run by the rknn-toolkit2 venv's Python (vendor/judge_rknn.sh). Accepted = build() returns 0; cpu_ops = the rows
of the verbose "Network Layer Information Table" whose Target column is CPU (inputs/outputs excluded);
rejected = the first error line of rknn's log (e.g. "ValueError: assignment destination is read-only").
"""

from __future__ import annotations

import os
import re
import time

import numpy as np
import onnx

from onnx_npu_fix.judges.common import (
    Verdict,
    error_line,
    finish,
    input_shapes,
    is_qdq,
    parser,
    run_captured,
    sample,
    workdir,
)

# "D RKNN: [12:19:04.368] 39   Gather   INT8   CPU   (1,64,1,1000),(2997)   (1,64,1,2997)   0/0/0   85   Gather:name"
_LAYER_ROW = re.compile(r"\]\s+(\d+)\s+(\w+)\s+\w+\s+(CPU|NPU)\s.*\s(\S+)\s*$")


def cpu_layers(log: str) -> list[tuple[str, str]]:
    rows, in_table = [], False
    for line in log.splitlines():
        if "Network Layer Information Table" in line:
            in_table = True
            continue
        match = _LAYER_ROW.search(line) if in_table else None
        if match and match.group(3) == "CPU" and match.group(2) not in ("InputOperator", "OutputOperator"):
            rows.append((match.group(2), match.group(4)))
    return rows


def build(model_path: str, platform: str, work: str, shapes: dict, quantize: bool) -> tuple[int, str]:
    from rknn.api import RKNN

    files = []
    for i, (shape, dtype) in enumerate(shapes.values()):
        path = os.path.join(work, f"calib_{i}.npy")
        np.save(path, sample(shape, dtype))
        files.append(path)
    dataset = os.path.join(work, "dataset.txt")
    with open(dataset, "w") as f:
        f.write(" ".join(files) + "\n")
    rknn = RKNN(verbose=True)
    rknn.config(target_platform=platform)
    if rknn.load_onnx(model=model_path, inputs=list(shapes), input_size_list=[s for s, _ in shapes.values()]) != 0:
        return 10, "load_onnx failed"
    if rknn.build(do_quantization=quantize, dataset=dataset if quantize else None) != 0:
        return 11, "build failed"
    return 0, "built"


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--platform", default="rv1106", help="rv1106 / rk3566 / rk3588 / ...")
    args = p.parse_args()
    started = time.time()
    model_path = os.path.abspath(args.model)
    model = onnx.load(model_path, load_external_data=False)
    shapes = input_shapes(model, args.input_shape)
    work = workdir(args)
    args.json = args.json and os.path.abspath(args.json)
    os.chdir(work)  # rknn writes its check*.onnx intermediates into the working directory
    result, error, log = run_captured(
        lambda: build(model_path, args.platform, work, shapes, quantize=not is_qdq(model)),
        os.path.join(work, "rknn.log"))
    code, what = (12, f"{type(error).__name__}: {error}") if error else result
    if code != 0:
        # rknn re-raises its own errors with the whole traceback as the message: keep the last "XxxError: ..." line
        raised = [ln.strip() for ln in log.splitlines() if re.match(r"\s*\w*(Error|Exception): ", ln)]
        message = raised[-1][-300:] if code == 12 and raised else error_line(log, what)
        finish(args, Verdict(False, message), started)
    finish(args, Verdict(True, what, cpu_layers(log)), started)


if __name__ == "__main__":
    main()
