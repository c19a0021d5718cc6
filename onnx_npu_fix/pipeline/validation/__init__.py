"""Numerical validation: onnxruntime runs (CPU, graph optimizations off) on the input sets of pipeline/inputs.py,
per-output comparison under the run's criteria, and the Validator that judges each candidate of a pass-manager
run against the last accepted model."""
