#!/bin/sh
# Judge one ONNX model with rknn-toolkit2: vendor/judge_rknn.sh MODEL --platform rv1106 [--fail-on-cpu] [--input-shape N:D,..]
# NPUFIX_RKNN_PYTHON: the Python of the venv made by vendor/install_rknn.sh.
: "${NPUFIX_RKNN_PYTHON:?set NPUFIX_RKNN_PYTHON to the Python of the rknn-toolkit2 venv (vendor/install_rknn.sh)}"
. "$(dirname "$0")/_judge.sh"
run_judge "$NPUFIX_RKNN_PYTHON" rknn "$@"
