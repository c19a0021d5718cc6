"""Input sets in Polygraphy's JSON (``polygraphy run --save-inputs`` / ``--load-inputs``), read and written
without Polygraphy.

The file is a JSON list of feed dicts (input name -> array), or one feed dict. Polygraphy encodes each array as
an object ``{"array": <base64 of the array's .npy bytes (np.save)>, "polygraphy_class": "ndarray"}``; files of
older Polygraphy versions mark it ``{"ndarray": "polygraphy_serialized_json_type", ...}`` and may hold the .npy
bytes as latin-1 text instead of base64. The document and its arrays are read by io.data_files (nesting depth and
each array's claimed size checked before anything is allocated; numbers only, never code).
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io import data_files

TYPE_MARKER = "polygraphy_class"
LEGACY_MARKER = "polygraphy_serialized_json_type"


def encode_feeds(feeds: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, dict[str, str]]]:
    """``feeds`` as Polygraphy's JSON document (a list of feed dicts of encoded arrays), for io.save.write_json."""
    return [{name: _encode(np.asarray(value)) for name, value in feed.items()} for feed in feeds]


def _encode(array: np.ndarray) -> dict[str, str]:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return {"array": base64.b64encode(buffer.getvalue()).decode("ascii"), TYPE_MARKER: "ndarray"}


def read_feeds(path: str, text: str) -> list[dict[str, np.ndarray]]:
    """The input sets of a Polygraphy JSON file (``text``, read from ``path``): InputError with one line naming
    ``path`` when it is not JSON, not feed dicts, or holds something other than arrays."""
    document = data_files.load_json(text, f"--validation-data {path}",
                                    object_pairs_hook=lambda pairs: _decode_object(path, pairs))
    sets = document if isinstance(document, list) else [document]
    for k, feed in enumerate(sets):
        if not isinstance(feed, dict) or not all(isinstance(v, np.ndarray) for v in feed.values()):
            raise InputError(f"--validation-data {path}: item {k} is not a feed dict of arrays (input name -> "
                             f"array, as polygraphy run --save-inputs writes)")
    return sets


def _decode_object(path: str, pairs: list[tuple[str, Any]]) -> Any:
    obj = dict(pairs)
    kind = obj.get(TYPE_MARKER)
    if kind is None:
        kind = next((key for key, value in obj.items() if isinstance(value, str) and value == LEGACY_MARKER), None)
    if kind is None:
        return obj
    if kind != "ndarray" or not isinstance(obj.get("array"), str):
        raise InputError(f"--validation-data {path}: holds a Polygraphy {kind}, not an array; give the file "
                         f"polygraphy run --save-inputs wrote")
    return _decode_array(path, obj["array"])


def _decode_array(path: str, payload: str) -> np.ndarray:
    try:
        data = base64.b64decode(payload.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        data = payload.encode("latin-1", errors="replace")  # older Polygraphy: the .npy bytes as latin-1 text
    return data_files.array_from_bytes(data, f"--validation-data {path}: an array")
