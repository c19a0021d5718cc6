"""Judge: Kendryte nncase 1.9 compile for the K210 (uint8 post-training quantization on N(0,1) samples).

Run by the nncase venv's Python (vendor/judge_nncase.sh). Accepted = a kmodel is generated; cpu_ops = the ops of
the CPU module of nncase's final schedule (it splits the graph into k210 modules and a CPU one);
rejected = nncase's exception text (e.g. "Can't find value info ...", "Allocator has ran out of memory").
"""

from __future__ import annotations

import glob
import os
import re
import time

import numpy as np
import onnx

from onnx_npu_fix.judges.common import Verdict, finish, input_shapes, parser, run_captured, sample, workdir

# a buffer line of nncase's codegen/*.sched dump: "%3(/pool/MaxPool.reduce_max(Pool))\t : <f32 [1,20,32,32] ..."
_BUFFER = re.compile(r"^%\d+\((.*)\((\w+)\)\)\s+:")


def placed_ops(dump: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(CPU ops, KPU ops) as (op type, node name), from the final schedule of each module nncase generated:
    main.sched is the RISC-V CPU's, k210_*.sched the KPU's; quantize / dequantize / download steps not counted."""
    cpu, kpu = [], []
    for path in sorted(glob.glob(os.path.join(dump, "codegen", "*.sched"))):
        placed = kpu if os.path.basename(path).startswith("k210") else cpu
        for line in open(path, encoding="utf-8", errors="replace"):
            match = _BUFFER.match(line)
            if match and not re.search(r"/(quantize|dequantize|act|kpu_download|kpu_upload)$", match.group(1)):
                placed.append((match.group(2), match.group(1)))
    return cpu, kpu


def compile_k210(model_path: str, shapes: dict, work: str, samples: int) -> bytes:
    import nncase

    options = nncase.CompileOptions()
    options.target = "k210"
    options.input_type = "float32"
    options.quant_type = "uint8"
    options.dump_ir = True
    options.dump_dir = os.path.join(work, "dump")
    compiler = nncase.Compiler(options)
    compiler.import_onnx(open(model_path, "rb").read(), nncase.ImportOptions())
    ptq = nncase.PTQTensorOptions()
    ptq.samples_count = samples
    (shape, dtype), *_ = shapes.values()
    ptq.set_tensor_data(np.stack([sample(shape, dtype, seed) for seed in range(samples)]).tobytes())
    compiler.use_ptq(ptq)
    compiler.compile()
    return compiler.gencode_tobytes()


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2, help="calibration samples")
    args = p.parse_args()
    started = time.time()
    model_path = os.path.abspath(args.model)
    shapes = input_shapes(onnx.load(model_path, load_external_data=False), args.input_shape)
    work = workdir(args)
    kmodel, error, _ = run_captured(lambda: compile_k210(model_path, shapes, work, args.samples),
                                    os.path.join(work, "nncase.log"))
    if error is not None:
        text = str(error).strip().splitlines() or [""]
        finish(args, Verdict(False, f"{type(error).__name__}: {text[0][:300]}"), started)
    with open(os.path.join(work, "m.kmodel"), "wb") as f:
        f.write(kmodel)
    cpu, kpu = placed_ops(os.path.join(work, "dump"))
    finish(args, Verdict(True, f"kmodel {len(kmodel)} bytes", cpu, {"kpu_ops": kpu}), started)


if __name__ == "__main__":
    main()
