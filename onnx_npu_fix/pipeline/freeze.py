"""``--freeze-input NAME=VALUE``: a graph input becomes a constant initializer of the value given.

This changes the model's interface on purpose (the input is gone; the build record lists it under
``frozen_inputs``), so that what depends on it folds: Silero VAD's ``If`` nodes choose the 16 kHz or the 8 kHz
branch from its ``sr`` input, and with ``sr`` frozen fold-constants inlines the chosen branch. Validation compares
the frozen model with the original fed the same value for that input (api.fix, pipeline ``reference_feeds``).

A value is a number (``16000``, ``0.5``, ``true``), a list (``1,2,3`` or ``[[1,2],[3,4]]``) or the path of an
``.npy`` file (read by io.data_files). It takes the input's declared element type — refused when it does not fit
(``1.5`` for an int64 input, ``300`` for uint8) — and must have the declared shape where dims are declared (a
symbolic dim takes any size). Every problem is an InputError (a one-line usage error).
"""

from __future__ import annotations

import ast
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io import data_files
from onnx_npu_fix.ir.graph import format_shape, shape_of_value_info

_SHOWN_ELEMENTS = 16  # values up to this many elements go into the record as they are; larger ones as a SHA-256


@dataclass
class FrozenInput:
    name: str
    value: np.ndarray
    """In the input's element type and shape."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": str(self.value.dtype), "shape": list(self.value.shape)}
        if self.value.size <= _SHOWN_ELEMENTS:
            out["value"] = self.value.tolist()
        else:
            out["sha256"] = hashlib.sha256(np.ascontiguousarray(self.value).tobytes()).hexdigest()
        return out

    def text(self) -> str:
        shown = self.to_json().get("value", f"<{self.value.size} values>")
        return f"{self.name} = {shown} ({self.value.dtype} {format_shape(self.value.shape)})"


def parse_freeze_spec(spec: str) -> tuple[str, str]:
    """``NAME=VALUE`` -> (name, value text); the name may hold '=' (the value is after the last one)."""
    name, sep, value = spec.rpartition("=")
    if not sep or not name or not value.strip():
        raise InputError(f"--freeze-input '{spec}' is not NAME=VALUE (e.g. sr=16000, mask=1,0,1 or x=x.npy)")
    return name, value.strip()


def parse_freeze_specs(specs: Sequence[str]) -> dict[str, str]:
    """Every ``--freeze-input`` spec by name; InputError for two values of one input (the last one winning
    silently would freeze a value the user may not have meant)."""
    values: dict[str, str] = {}
    for spec in specs:
        name, value = parse_freeze_spec(spec)
        if name in values:
            raise InputError(f"--freeze-input gives input '{name}' two values ({values[name]} and {value}); "
                             f"give one")
        values[name] = value
    return values


def read_value(name: str, text: str) -> np.ndarray:
    """The array a ``--freeze-input`` value text stands for (element type not yet applied)."""
    if text.endswith(".npy") or os.path.exists(text):
        return data_files.read_npy(text, f"--freeze-input {name}={text}")
    literal = text.replace("true", "True").replace("false", "False")
    try:
        parsed = ast.literal_eval(literal)
        value = np.asarray(parsed)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = None
    if value is None or value.dtype == object or value.dtype.kind not in "biuf":
        raise InputError(f"--freeze-input {name}: cannot read '{text}' as a number, a list (1,2,3 or "
                         f"[[1,2],[3,4]]) or an .npy file")
    return value


def freeze_inputs(model: onnx.ModelProto, values: Mapping[str, Any]) -> dict[str, FrozenInput]:
    """Replace each named graph input of ``model`` (in place) by an initializer holding its value.

    ``values``: input name -> an array-like, or the command line's value text (see the module docstring).
    Raises InputError for an unknown name, an unreadable value, or one that does not fit the input's type/shape.
    """
    graph = model.graph
    by_name = {vi.name: vi for vi in graph.input}
    frozen: dict[str, FrozenInput] = {}
    for name, raw in values.items():
        vi = by_name.get(name)
        if vi is None:
            names = ", ".join(i.name for i in graph.input) or "none"
            raise InputError(f"--freeze-input names '{name}', which is not a graph input (inputs: {names})")
        value = read_value(name, raw) if isinstance(raw, str) else np.asarray(raw)
        frozen[name] = FrozenInput(name, _fit(name, vi, value))
    if not frozen:
        return frozen
    kept = [vi for vi in graph.input if vi.name not in frozen]
    del graph.input[:]
    graph.input.extend(kept)
    # An initializer-backed input (a default the caller could override) is replaced by the frozen value.
    inits = [t for t in graph.initializer if t.name not in frozen]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    graph.initializer.extend(numpy_helper.from_array(f.value, name) for name, f in frozen.items())
    return frozen


def _fit(name: str, vi: onnx.ValueInfoProto, value: np.ndarray) -> np.ndarray:
    """``value`` in the input's element type and declared shape, or an InputError saying why not."""
    elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except (KeyError, TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        what = onnx.TensorProto.DataType.Name(elem) if elem else "not a tensor"
        raise InputError(f"--freeze-input {name}: the input's type ({what}) cannot be given on the command line")
    shape = shape_of_value_info(vi) if vi.type.HasField("tensor_type") else None
    if shape is not None:
        fits = len(shape) == value.ndim and all(not isinstance(d, int) or d == n for d, n in zip(shape, value.shape))
        if not fits:
            raise InputError(f"--freeze-input {name}: the value has shape {format_shape(value.shape)}, the input "
                             f"is declared {format_shape(shape)}")
    if dtype.kind == "b":
        if value.dtype.kind != "b" and not np.isin(value, (0, 1)).all():
            raise InputError(f"--freeze-input {name}: the input is bool; give true/false or 0/1")
        return value.astype(np.bool_)
    if dtype.kind in "iu":
        if value.dtype.kind == "f" and not (np.isfinite(value).all() and (value == np.round(value)).all()):
            raise InputError(f"--freeze-input {name}: the input is {dtype}; {value.ravel()[:4].tolist()} are not "
                             f"whole numbers")
        info = np.iinfo(dtype)
        if value.size and (value.min() < info.min or value.max() > info.max):
            raise InputError(f"--freeze-input {name}: a value is outside the range of {dtype} "
                             f"[{info.min}, {info.max}]")
        return value.astype(dtype)
    converted = value.astype(dtype)
    if value.dtype.kind in "iuf" and np.isinf(converted).any() and np.isfinite(value).all():
        raise InputError(f"--freeze-input {name}: a value overflows {dtype}")
    return converted
