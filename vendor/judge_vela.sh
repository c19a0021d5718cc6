#!/bin/sh
# Judge one ONNX model: vendor/judge_vela.sh MODEL [options of python -m onnx_npu_fix.judges.vela --help]
# NPUFIX_VELA_PYTHON: the Python of the venv made by vendor/install_vela.sh.
: "${NPUFIX_VELA_PYTHON:?set NPUFIX_VELA_PYTHON to the Python of the venv made by vendor/install_vela.sh}"
. "$(dirname "$0")/_judge.sh"
run_judge "$NPUFIX_VELA_PYTHON" vela "$@"
