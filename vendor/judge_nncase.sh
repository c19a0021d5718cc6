#!/bin/sh
# Judge one ONNX model: vendor/judge_nncase.sh MODEL [options of python -m onnx_npu_fix.judges.nncase --help]
# NPUFIX_NNCASE_PYTHON: the Python of the venv made by vendor/install_nncase.sh.
: "${NPUFIX_NNCASE_PYTHON:?set NPUFIX_NNCASE_PYTHON to the Python of the venv made by vendor/install_nncase.sh}"
. "$(dirname "$0")/_judge.sh"
run_judge "$NPUFIX_NNCASE_PYTHON" nncase "$@"
