"""The vendor judges: one module per vendor compiler, each judging one ONNX model (``python -m
onnx_npu_fix.judges.tpu_mlir MODEL ...``; the contract every judge keeps is in common.py).

A judge runs under the vendor toolchain's own Python (the venv an install script in vendor/ makes), which has numpy
and onnx but not npufix's other dependencies: the modules here import nothing from the package outside this
sub-package (the lowest layer, tests/test_layout.py), and vendor/judge_*.sh run them with that Python and this
checkout on its path. `npufix reduce --judge` and `--judge` run them as any other judge command (judge/)."""
