"""Passes from outside the package: ``--plugin`` specs and installed entry points (``loader``), and
passes written as onnx-graphsurgeon functions (``graphsurgeon``).
"""
