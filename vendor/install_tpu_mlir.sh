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
# tpu-mlir imports torch on its ONNX path only for `torch.tensor(x).numpy()` (transform/OnnxOpt.py, constant
# folding). On Python 3.10 PyPI has only CUDA builds of torch (several GB): by default (TPU_TORCH=shim) a module
# `torch` with just that function is written instead; TPU_TORCH=2.11.0 (any version) installs the real one.
if [ "${TPU_TORCH:-shim}" = shim ]; then
    site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    if ! "$dir/bin/python" -c 'import torch' 2>/dev/null || [ -f "$site/torch/NPUFIX_SHIM" ]; then
        mkdir -p "$site/torch"
        touch "$site/torch/NPUFIX_SHIM"
        cat > "$site/torch/__init__.py" <<'PY'
"""Stand-in written by npufix's vendor/install_tpu_mlir.sh: tpu-mlir's ONNX path calls only torch.tensor(x).numpy()."""
import numpy as _np

__version__ = "0+npufix.shim"


class _Tensor:
    def __init__(self, data):
        self._data = _np.array(data)

    def numpy(self):
        return self._data


def tensor(data):
    return _Tensor(data)


class _Stub(metaclass=type("_StubMeta", (type,), {"__getattr__": lambda cls, name: cls})):
    """Any other torch name (onnxruntime_extensions defines unused classes on torch.nn.Module & co at import)."""


def __getattr__(name):
    return _Stub
PY
    fi
else
    "$dir/bin/pip" install -q "torch==$TPU_TORCH"
fi
"$dir/bin/model_transform" --help >/dev/null
echo "tpu-mlir $("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("tpu_mlir"))') in $dir/bin"
