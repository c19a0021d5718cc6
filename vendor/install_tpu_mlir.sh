#!/usr/bin/env bash
# Sophgo tpu-mlir 1.30.2 (bm1684x judge) into a Python 3.10 venv at DIR (about 3 GB, download-bound).
# Usage: vendor/install_tpu_mlir.sh DIR        then: NPUFIX_TPU_MLIR=DIR/bin
set -euo pipefail
dir="${1:?usage: $0 DIR}"
. "$(dirname "$0")/_python.sh"
python="$(find_python 3.10)"   # tpu-mlir requires >=3.10,<3.11
"$python" -m venv "$dir"
"$dir/bin/pip" install -q tpu-mlir==1.30.2 onnx==1.14.1 onnxruntime==1.16.3 onnxsim==0.4.17 psutil
# Its bundled glibc 2.35 breaks on newer systems ("GLIBC_2.36 not found"): move it aside, the system's is used.
third_party="$("$dir/bin/python" -c 'import os, tpu_mlir; print(os.path.join(os.path.dirname(tpu_mlir.__file__), "lib", "third_party"))')"
mkdir -p "$dir/moved_glibc"
for lib in libc.so.6 libm.so.6 libpthread.so.0; do
    if [ -e "$third_party/$lib" ]; then mv "$third_party/$lib" "$dir/moved_glibc/"; fi
done
"$dir/bin/model_transform" --help >/dev/null
echo "tpu-mlir $("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("tpu_mlir"))') in $dir/bin"
