"""npufix: rewrite ONNX models so embedded NPU compilers accept them, and prove the rewrite exact."""

__version__ = "0.1.0"
