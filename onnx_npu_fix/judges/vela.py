"""Judge: Arm Vela (Ethos-U) on the int8 TFLite that onnx2tf writes from the ONNX model.

Run by the Vela venv's Python (vendor/judge_vela.sh). onnx2tf runs onnxsim on its input *in place*, so it gets a
copy. No verdict (exit 3) = onnx2tf cannot convert or quantize the model; rejected = Vela fails; accepted = Vela writes
its optimised model; cpu_ops = the operators Vela leaves on the CPU (`--show-cpu-operations`).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import onnx

from onnx_npu_fix.judges.common import Verdict, error_line, finish, input_shapes, parser, sample, workdir

# Vela 5.2's network summary: "   CPU: ResizeBilinear = name (outputs [1, 32, 32, 8])" under "CPU operators = N"
_CPU_LINE = re.compile(r"^\s+CPU: (\w+) = (.*?)(?: \(outputs .*)?$")


# onnx2tf 1.29 (utils/common_functions.py download_test_image_data) fetches 20 MS-COCO crops from its GitHub
# release whenever every input is a 4-D 3-channel image -- for its own output check, even when -cind supplies the
# calibration data -- unless this file is in its working directory. Offline it dies there, so the judge writes the
# file itself: same name, shape and dtype, seeded uniform [0, 1) pixels (onnx2tf resizes them to the input).
_ONNX2TF_SAMPLE_IMAGES = ("calibration_image_sample_data_20x128x128x3_float32.npy", (20, 128, 128, 3))


def offline_sample_images(work: str) -> None:
    name, shape = _ONNX2TF_SAMPLE_IMAGES
    data = np.random.default_rng(0).random(shape, dtype=np.float32)
    np.save(os.path.join(work, name), data)


def onnx2tf(model_path: str, work: str, shapes: dict, timeout: float) -> tuple[str | None, str]:
    """The full-integer TFLite onnx2tf writes (or None) and its log."""
    copy = os.path.join(work, "copy.onnx")  # onnx2tf simplifies its input in place
    shutil.copyfile(model_path, copy)
    out = os.path.join(work, "tf")
    offline_sample_images(work)
    cmd = [os.path.join(os.path.dirname(sys.executable), "onnx2tf"), "-i", copy, "-o", out, "-oiqt", "-n"]
    for i, (name, (shape, dtype)) in enumerate(shapes.items()):
        # four calibration samples of one item each; a scalar input (Silero's sample rate) is its own item
        data = np.stack([sample(shape, dtype, seed)[0] if shape else sample(shape, dtype, seed) for seed in range(4)])
        if data.ndim == 4:  # onnx2tf calibrates in its own NHWC layout
            data = data.transpose(0, 2, 3, 1)
        path = os.path.join(work, f"calib_{i}.npy")
        np.save(path, data)
        cmd += ["-cind", name, path, "[[[[0.0]]]]" if data.ndim == 4 else "[0.0]",
                "[[[[1.0]]]]" if data.ndim == 4 else "[1.0]"]
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout)
    log = done.stdout + done.stderr
    found = glob.glob(os.path.join(out, "*_full_integer_quant.tflite"))
    return (found[0] if found else None), log


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--accelerator", default="ethos-u55-256", help="vela --accelerator-config")
    args = p.parse_args()
    started = time.time()
    model_path = os.path.abspath(args.model)
    shapes = input_shapes(onnx.load(model_path, load_external_data=False), args.input_shape)
    work = workdir(args)
    try:
        tflite, log = onnx2tf(model_path, work, shapes, args.timeout)
    except subprocess.TimeoutExpired:
        finish(args, Verdict(False, f"onnx2tf: timeout after {args.timeout:.0f} s", undecided=True), started)
    with open(os.path.join(work, "onnx2tf.log"), "w", encoding="utf-8") as f:
        f.write(log)
    if tflite is None:
        finish(args, Verdict(False, "onnx2tf: " + error_line(log), undecided=True, extra={"stage": "onnx2tf"}),
               started)
    vela = [os.path.join(os.path.dirname(sys.executable), "vela"), tflite, "--accelerator-config",
            args.accelerator, "--output-dir", os.path.join(work, "vela"), "--show-cpu-operations"]
    done = subprocess.run(vela, cwd=work, capture_output=True, text=True, timeout=args.timeout)
    log = done.stdout + done.stderr
    with open(os.path.join(work, "vela.log"), "w", encoding="utf-8") as f:
        f.write(log)
    if done.returncode != 0 or not glob.glob(os.path.join(work, "vela", "*_vela.tflite")):
        finish(args, Verdict(False, "vela: " + error_line(log), extra={"stage": "vela"}), started)
    cpu = [(m.group(1), m.group(2)) for m in map(_CPU_LINE.search, log.splitlines()) if m]
    npu = re.search(r"NPU operators\s*=\s*(\d+)", log)
    finish(args, Verdict(True, "vela model written", cpu,
                         {"npu_ops": int(npu.group(1)) if npu else None}), started)


if __name__ == "__main__":
    main()
