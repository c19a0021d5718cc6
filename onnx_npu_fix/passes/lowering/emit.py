"""What lowering rules share to write their replacements: constants in the anchor's element type, and Clip in the
form the model's opset reads."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnx_npu_fix.passes.rules import Emit, Match, View


def float_type(view: View, name: str) -> np.dtype | None:
    """The numpy dtype of float tensor ``name`` (float32 / float16 / float64), or None (another or unknown type:
    a lowering with float constants does not apply)."""
    elem = view.index.elem_type(name)
    if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
        return None
    return helper.tensor_dtype_to_np_dtype(elem)


def scalar(out: Emit, match: Match, value: float, suffix: str) -> str:
    """A scalar constant of the match's element type (``match.dtype``)."""
    return out.const(np.array(value, match.dtype), suffix)


def clip(out: Emit, match: Match, x: str, low: float, high: float, *, outputs: list[str] | None = None) -> str:
    """Clip(x, low, high): bounds as inputs from opset 11, as attributes before (``match.opset``)."""
    if match.opset >= 11:
        return out.node("Clip", [x, scalar(out, match, low, "low"), scalar(out, match, high, "high")],
                        outputs=outputs)
    return out.node("Clip", [x], outputs=outputs, min=float(low), max=float(high))
