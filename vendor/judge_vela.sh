#!/bin/sh
# Judge one ONNX model: vendor/judge_vela.sh MODEL [options of vendor/judge_vela.py --help]
# NPUFIX_VELA_PYTHON: the Python of the venv made by vendor/install_vela.sh.
: "${NPUFIX_VELA_PYTHON:?set NPUFIX_VELA_PYTHON to the Python of the venv made by vendor/install_vela.sh}"
exec "$NPUFIX_VELA_PYTHON" "$(dirname "$0")/judge_vela.py" "$@"
