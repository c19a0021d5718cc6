#!/bin/sh
# Judge one ONNX model with tpu-mlir: vendor/judge_tpu_mlir.sh MODEL [--input-shape N:D,..] [--processor bm1684x]
# NPUFIX_TPU_MLIR: the bin directory of the venv made by vendor/install_tpu_mlir.sh.
: "${NPUFIX_TPU_MLIR:?set NPUFIX_TPU_MLIR to the bin directory of the tpu-mlir venv (vendor/install_tpu_mlir.sh)}"
. "$(dirname "$0")/_judge.sh"
run_judge "$NPUFIX_TPU_MLIR/python" tpu_mlir "$@"
