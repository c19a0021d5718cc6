"""The use case around the passes: the pass manager (``scheduler``: order, grouped validation, rollback,
timing), validation with onnxruntime and its inputs, input freezing, and the run's records and text.
"""
