#!/usr/bin/env bash
# Arm Vela 5.2 (Ethos-U55 / U65 judge) and onnx2tf 1.29 (ONNX -> int8 TFLite, which Vela reads) into a Python 3.11
# venv at DIR. onnx2tf runs onnxsim on its input *in place*: onnx_npu_fix/judges/vela.py always hands it a copy.
# Usage: vendor/install_vela.sh DIR        then: NPUFIX_VELA_PYTHON=DIR/bin/python
set -euo pipefail
dir="${1:?usage: $0 DIR}"
. "$(dirname "$0")/_python.sh"
python="$(find_python 3.11)"
"$python" -m venv "$dir"
# onnx2tf 1.29 declares its own dependencies (tensorflow, tf-keras, onnx, onnxsim, ...): let pip resolve them.
"$dir/bin/pip" install -q "ethos-u-vela==5.2.0" "onnx2tf==1.29.*"
"$dir/bin/vela" --version
echo "vela $("$dir/bin/vela" --version) and onnx2tf $("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("onnx2tf"))') in $dir"
