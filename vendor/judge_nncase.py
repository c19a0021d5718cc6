"""Judge: Kendryte nncase 1.9 compile for the K210 (uint8 post-training quantization on N(0,1) samples).

Run by the nncase venv's Python (vendor/judge_nncase.sh). Accepted = a kmodel is generated; cpu_ops = the compute
ops of the final IR that do not run on the KPU (nncase splits the graph into a k210 module and a CPU one);
rejected = nncase's exception text (e.g. "Can't find value info ...", "Allocator has ran out of memory").
"""

from __future__ import annotations

import glob
import os
import re
import time

import numpy as np
import onnx
from _judge_common import Verdict, finish, input_shapes, parser, sample, workdir

# ops of the final IR that move data or are bookkeeping, not computation placed on a processor
_NOT_COMPUTE = {"input_node", "output_node", "constant", "bitcast", "ignore_node", "uninitialized", "copy",
                "k210.kpu_upload", "k210.kpu_download", "call"}


def final_ir_ops(dump: str) -> list[tuple[str, str]]:
    """(op, node name) of every op in the last IR dump nncase wrote (its final, scheduled graph)."""
    dumps = sorted(glob.glob(os.path.join(dump, "**", "*.dot"), recursive=True), key=os.path.getmtime)
    if not dumps:
        return []
    text = open(dumps[-1], encoding="utf-8", errors="replace").read()
    return re.findall(r'label="\{?\s*([\w.]+)\s*(?:\\n|\|)?\s*([^"|}]*)', text)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2, help="calibration samples")
    args = p.parse_args()
    started = time.time()
    import nncase

    model_path = os.path.abspath(args.model)
    shapes = input_shapes(onnx.load(model_path, load_external_data=False), args.input_shape)
    work = workdir(args)
    options = nncase.CompileOptions()
    options.target = "k210"
    options.input_type = "float32"
    options.quant_type = "uint8"
    options.dump_ir = True
    options.dump_dir = os.path.join(work, "dump")
    try:
        compiler = nncase.Compiler(options)
        compiler.import_onnx(open(model_path, "rb").read(), nncase.ImportOptions())
        ptq = nncase.PTQTensorOptions()
        ptq.samples_count = args.samples
        (shape, dtype), *_ = shapes.values()
        data = np.stack([sample(shape, dtype, seed) for seed in range(args.samples)])
        ptq.set_tensor_data(data.tobytes())
        compiler.use_ptq(ptq)
        compiler.compile()
        kmodel = compiler.gencode_tobytes()
    except Exception as exc:  # nncase's own errors are the verdict
        finish(args, Verdict(False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"), started)
    with open(os.path.join(work, "m.kmodel"), "wb") as f:
        f.write(kmodel)
    ops = final_ir_ops(options.dump_dir)
    cpu = [(op, name) for op, name in ops if not op.startswith("k210.") and op not in _NOT_COMPUTE]
    kpu = [op for op, _ in ops if op.startswith("k210.") and op not in _NOT_COMPUTE]
    finish(args, Verdict(True, f"kmodel {len(kmodel)} bytes", cpu, {"kpu_ops": len(kpu)}), started)


if __name__ == "__main__":
    main()
