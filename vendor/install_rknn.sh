#!/usr/bin/env bash
# Rockchip rknn-toolkit2 2.5.0 (rv1106 / rk3566 / rk3588 judge) into a Python 3.11 venv at DIR.
# Usage: vendor/install_rknn.sh DIR        then: NPUFIX_RKNN_PYTHON=DIR/bin/python
# rknn-toolkit2 pins torch<=2.4.0, which on x86_64 is a CUDA build of several GB; it only uses torch to load
# PyTorch models, so by default the pin is bypassed with the CPU torch pip finds locally (RKNN_FULL_DEPS=1: the pin).
set -euo pipefail
dir="${1:?usage: $0 DIR}"
. "$(dirname "$0")/_python.sh"
python="$(find_python 3.11)"
"$python" -m venv "$dir"
if [ "${RKNN_FULL_DEPS:-0}" = 1 ]; then
    "$dir/bin/pip" install -q rknn-toolkit2==2.5.0
else
    "$dir/bin/pip" install -q --no-deps rknn-toolkit2==2.5.0
    "$dir/bin/pip" install -q "numpy<2" "onnx==1.18.0" "onnxruntime==1.26.0" "protobuf==4.25.4" fast-histogram \
        flatbuffers opencv-python-headless psutil ruamel.yaml scipy tqdm packaging "setuptools<81" "torch==${RKNN_TORCH:-2.13.0}"
fi
"$dir/bin/python" -c 'from rknn.api import RKNN' >/dev/null
echo "rknn-toolkit2 $("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("rknn-toolkit2"))') in $dir"
