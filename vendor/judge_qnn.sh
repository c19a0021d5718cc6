#!/bin/sh
# Judge one ONNX model: vendor/judge_qnn.sh MODEL [options of python -m onnx_npu_fix.judges.qnn --help]
# NPUFIX_QNN_PYTHON: the Python of the venv made by vendor/install_qnn.sh.
: "${NPUFIX_QNN_PYTHON:?set NPUFIX_QNN_PYTHON to the Python of the venv made by vendor/install_qnn.sh}"
. "$(dirname "$0")/_judge.sh"
run_judge "$NPUFIX_QNN_PYTHON" qnn "$@"
