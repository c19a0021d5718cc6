#!/usr/bin/env bash
# Kendryte nncase 1.9 (K210 judge; the K210 target needs no .NET) into a Python 3.10 venv at DIR.
# Usage: vendor/install_nncase.sh DIR        then: NPUFIX_NNCASE_PYTHON=DIR/bin/python
set -euo pipefail
dir="${1:?usage: $0 DIR}"
. "$(dirname "$0")/_python.sh"
python="$(find_python 3.10)"   # nncase 1.9 ships wheels up to cp310
"$python" -m venv "$dir"
"$dir/bin/pip" install -q "nncase==1.9.0.20230322" "numpy<2" "onnx==1.14.1"
"$dir/bin/python" -c 'import nncase' >/dev/null
echo "nncase $("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("nncase"))') in $dir"
