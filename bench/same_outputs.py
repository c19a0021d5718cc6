"""Prove that a change left npufix's results as they were: run it over every fixture, and a copy of each with its
weights in external data, with several option sets and write one manifest of what each run produced (exit code,
SHA-256 of every written model and segment, the build record without its timings and paths); ``--compare A B``
diffs two manifests.

    PYTHONPATH=<old checkout> .venv/bin/python bench/same_outputs.py --out /tmp/before
    PYTHONPATH=.              .venv/bin/python bench/same_outputs.py --out /tmp/after
    .venv/bin/python bench/same_outputs.py --compare /tmp/before/manifest.json /tmp/after/manifest.json

Every run's validation sessions take two threads (``NPUFIX_VALIDATION_THREADS``): the count npufix would pick
follows the machine's load and can move an output's last bit, and so the error figures of a record. The checkout on
PYTHONPATH is the one measured (the script runs ``python -m onnx_npu_fix`` in each run's own
directory, so the working directory's checkout does not shadow it). A quantized U-Net is
made with onnxruntime's own quantizer from fixtures/unet.onnx, seeded, so the QDQ paths are covered too.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted(p for p in (ROOT / "fixtures").glob("*.onnx"))

# option sets every fixture runs with; the last ones only where they make sense (see RUNS_FOR)
OPTION_SETS: dict[str, list[str]] = {
    "default": ["--max-dilation", "4", "--align", "8"],
    "stm32n6": ["--target", "stm32n6"],
    "bm1684x": ["--target", "bm1684x"],
    "rk3588": ["--target", "rk3588"],
    "tidl": ["--target", "tidl", "--max-dilation", "4"],
    "exact-resize": ["--align", "16", "--resize-mode", "exact", "--s2b-layout", "batch", "--max-dilation", "2"],
    "check": ["--check", "--target", "stm32n6"],
    "split": ["--sram", "48KiB", "--split", "{dir}/segments", "--align", "8"],
}
# What a fixture needs to run at all: static shapes for the dynamic exports, a value for Silero's sample rate.
FIXTURE_ARGS: dict[str, list[str]] = {
    "tcn_dynamic": ["--input-shape", "mix:1,1,4096"],
    "torch_convtasnet": ["--input-shape", "mix:1,4096"],
    "torch_convtasnet_causal": ["--input-shape", "mix:1,4096"],
    "torchaudio_convtasnet": ["--input-shape", "mix:1,1,4096"],
    "silero_vad": ["--input-shape", "input:1,512", "--input-shape", "state:2,1,128", "--freeze-input", "sr=16000"],
}
# Record fields that differ between two runs of the same code (timings) or between two output directories.
VOLATILE = {"seconds", "validate_seconds", "command", "path", "directory", "npufix_version"}


def quantized_unet(out: Path) -> Path:
    """fixtures/unet.onnx quantized (QDQ, per-channel int8 weights) by onnxruntime, on seeded calibration data."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    source = ROOT / "fixtures" / "unet.onnx"
    graph_input = onnx.load(str(source)).graph.input[0]
    shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    batches = [{graph_input.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]

    class Batches(CalibrationDataReader):
        def get_next(self):
            return batches.pop() if batches else None

    path = out / "unet_qdq.onnx"
    quantize_static(str(source), str(path), Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return path


def external_copies(models: list[Path], out: Path) -> list[Path]:
    """Each model saved again with every initializer of 1 KiB or more in a ``.data`` file beside it (onnx's own
    writer), so the external-data paths (reading, weights left in their file, writing) run on every fixture."""
    import onnx

    copies = []
    for model in models:
        path = out / "external" / f"{model.stem}{EXTERNAL_SUFFIX}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save_model(onnx.load(str(model)), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
        copies.append(path)
    return copies


EXTERNAL_SUFFIX = "_external"


def strip(record):
    if isinstance(record, dict):
        return {k: strip(v) for k, v in record.items() if k not in VOLATILE}
    if isinstance(record, list):
        return [strip(v) for v in record]
    return record


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_run(model: Path, label: str, out: Path) -> tuple[str, dict]:
    key = f"{model.stem}/{label}"
    work = out / model.stem / label
    work.mkdir(parents=True, exist_ok=True)
    args = [a.replace("{dir}", str(work)) for a in OPTION_SETS[label]]
    report = work / "record.json"
    fixture_args = FIXTURE_ARGS.get(model.stem.removesuffix(EXTERNAL_SUFFIX), [])
    if "--check" in args:  # a check reads the model as it is: --freeze-input is refused there (exit 2)
        fixture_args = [a for a in fixture_args if a != "--freeze-input" and not a.startswith("sr=")]
    cmd = [sys.executable, "-m", "onnx_npu_fix", str(model), *fixture_args, *args, "--report", str(report)]
    if "--check" not in args:
        cmd += ["-o", str(work / "out.onnx")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work,
                          env={**os.environ, "PYTHONHASHSEED": "0", "NPUFIX_VALIDATION_THREADS": "2"})
    files = {str(p.relative_to(work)): digest(p) for p in sorted(work.rglob("*")) if p.is_file()
             and p.name != "record.json"}
    record = json.loads(report.read_text()) if report.exists() else None
    return key, {"exit": proc.returncode, "files": files, "record": strip(record)}


def measure(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    models = [*FIXTURES, quantized_unet(out)]
    models += external_copies(models, out)
    jobs = [(m, label) for m in models for label in OPTION_SETS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(pool.map(lambda job: one_run(job[0], job[1], out), jobs))
    (out / "manifest.json").write_text(json.dumps(dict(sorted(results.items())), indent=1, sort_keys=True))
    codes: dict[int, int] = {}
    for r in results.values():
        codes[r["exit"]] = codes.get(r["exit"], 0) + 1
    print(f"{len(results)} runs, exit codes {dict(sorted(codes.items()))}; manifest: {out / 'manifest.json'}")


def compare(a: Path, b: Path) -> int:
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    differ = [k for k in sorted(set(left) | set(right)) if left.get(k) != right.get(k)]
    for key in differ:
        print(f"DIFFERS {key}")
        for part in ("exit", "files", "record"):
            if (left.get(key) or {}).get(part) != (right.get(key) or {}).get(part):
                print(f"   {part}")
    print(f"{len(left)} vs {len(right)} runs; {len(differ)} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        parser.error("--out DIR or --compare A B")
    measure(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
