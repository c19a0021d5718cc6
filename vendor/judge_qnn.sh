#!/bin/sh
# Judge one ONNX model: vendor/judge_qnn.sh MODEL [options of vendor/judge_qnn.py --help]
# NPUFIX_QNN_PYTHON: the Python of the venv made by vendor/install_qnn.sh.
: "${NPUFIX_QNN_PYTHON:?set NPUFIX_QNN_PYTHON to the Python of the venv made by vendor/install_qnn.sh}"
exec "$NPUFIX_QNN_PYTHON" "$(dirname "$0")/judge_qnn.py" "$@"
