#!/bin/sh
# Judge one ONNX model: vendor/judge_nncase.sh MODEL [options of vendor/judge_nncase.py --help]
# NPUFIX_NNCASE_PYTHON: the Python of the venv made by vendor/install_nncase.sh.
: "${NPUFIX_NNCASE_PYTHON:?set NPUFIX_NNCASE_PYTHON to the Python of the venv made by vendor/install_nncase.sh}"
exec "$NPUFIX_NNCASE_PYTHON" "$(dirname "$0")/judge_nncase.py" "$@"
