"""npufix: rewrite ONNX models so embedded NPU compilers accept them, and prove the rewrite exact.

The public API (docs/api.md); names are loaded on first use, so ``import onnx_npu_fix`` stays cheap:

    import onnx_npu_fix as npufix
    outcome = npufix.run("in.onnx", "out.onnx", npufix.FixOptions(max_dilation=4))
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "run": "api", "RunOutcome": "api", "fix": "api", "check": "api", "select_passes": "api",
    "reduce": "api", "ReduceOutcome": "api", "Judge": "judge.command", "reduce_model": "judge.reduce",
    "load_model": "io.load", "save_model": "io.save",
    "FixResult": "pipeline.scheduler", "FixReport": "pipeline.report",
    "FixOptions": "config.options", "load_target": "config.targets", "apply_target": "config.targets",
    "check_model": "constraints", "CheckReport": "constraints", "Violation": "constraints",
    "NpufixError": "errors", "InputError": "errors", "OptionError": "errors", "PassFailed": "errors",
    "StrictRefused": "errors",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'onnx_npu_fix' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"onnx_npu_fix.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
