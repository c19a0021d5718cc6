#!/usr/bin/env bash
# torch + torchvision + segmentation-models-pytorch + timm + onnxruntime (for vendor/export_real_models.py) into a
# Python 3.11 venv at DIR. torch/torchvision: the release pip finds on this machine's disk where one lies there
# (EXPORT_TORCH / EXPORT_TORCHVISION override the pins; elsewhere pip downloads them).
# Usage: vendor/install_exports.sh DIR        then: DIR/bin/python vendor/export_real_models.py MODELS_DIR
set -euo pipefail
dir="${1:?usage: $0 DIR}"
. "$(dirname "$0")/_python.sh"
python="$(find_python 3.11)"
"$python" -m venv "$dir"
"$dir/bin/pip" install -q "torch==${EXPORT_TORCH:-2.14.1}" "torchvision==${EXPORT_TORCHVISION:-0.29.1}" \
    segmentation-models-pytorch timm onnx onnxruntime "numpy<3"
"$dir/bin/python" -c 'import torch, torchvision, segmentation_models_pytorch, onnxruntime' >/dev/null
echo "exports venv in $dir: torch $("$dir/bin/python" -c 'import torch; print(torch.__version__)')"
