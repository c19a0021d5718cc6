#!/usr/bin/env bash
# onnxruntime-qnn 2.7.0 (Qualcomm HTP context generation on x86_64, used as a judge only) into a Python 3.11 venv.
# The wheel ships Qualcomm's QNN libraries under Qualcomm's licence: never copy or bundle them; npufix only runs them.
# Usage: vendor/install_qnn.sh DIR        then: NPUFIX_QNN_PYTHON=DIR/bin/python
set -euo pipefail
dir="${1:?usage: $0 DIR}"
. "$(dirname "$0")/_python.sh"
python="$(find_python 3.11)"
"$python" -m venv "$dir"
"$dir/bin/pip" install -q "onnxruntime-qnn==2.7.0" onnx
"$dir/bin/python" -c 'import os, onnxruntime_qnn as q; assert os.path.exists(q.get_library_path())'
echo "onnxruntime-qnn $("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("onnxruntime-qnn"))') in $dir"
