"""Serialization in protobuf's wire format: a model's bytes in pieces with a transient of one run of weights
(:func:`serialized_parts`), and the wire-format walks that take a serialized model apart without parsing its
weights (:func:`wire_fields`, :func:`graph_field`, :func:`tensor_header`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import onnx

from onnx_npu_fix.ir import weights
from onnx_npu_fix.ir.graph import payload_bytes

SERIALIZE_CHUNK = 16 << 20
""":func:`serialized_parts` serializes the initializers in runs of about this many payload bytes."""


def serialized_parts(model: onnx.ModelProto) -> list[bytes]:
    """``model.SerializeToString()`` in pieces whose ``b"".join`` is byte for byte the same, made with a
    transient of one run of weights (:data:`SERIALIZE_CHUNK`, or one larger tensor) instead of protobuf's.

    Why: upb encodes a message backwards into a buffer it doubles as it fills and frees only at the end, then
    copies the result into the bytes object: serializing a model takes a transient larger than the model, on top
    of the model (the largest transient of a validated run). Here the model is a shell without initializers
    (serialized by upb, small), split where the graph's initializers belong (after ``node`` and ``name``, before
    field 10: upb writes known fields in field-number order and unknown ones last), with the initializers
    serialized a run at a time in between. A model or graph with unknown fields of its own (which the shell
    copy would lose) is serialized whole. The caller may drop ``model`` before joining the pieces."""
    graph = model.graph
    if not len(graph.initializer):
        return [model.SerializeToString()]
    if _unknown_fields(model) or _unknown_fields(graph):
        if weights.has_lazy(model):  # the shell would lose those fields: a copy with every weight read in
            model = copy_model_with_weights(model)
        return [model.SerializeToString()]
    shell = onnx.ModelProto()
    copy_without_initializers(model, shell)
    top = shell.SerializeToString()
    tag_start, value_start, value_end = graph_field(top)
    shell.graph.ClearField("node")
    shell.graph.ClearField("name")
    split = value_end - len(shell.graph.SerializeToString())  # the graph's fields after its initializers
    parts = [top[:tag_start], b"", top[value_start:split]]  # [1]: the graph's tag and length, set below
    parts.extend(_initializer_runs(graph.initializer))
    parts.append(top[split:value_end])
    parts[1] = GRAPH_TAG + varint(sum(len(part) for part in parts[2:]))
    parts.append(top[value_end:])
    return parts


GRAPH_TAG = bytes([7 << 3 | 2])  # ModelProto.graph: field 7, length-delimited
_INITIALIZER_TAG = bytes([5 << 3 | 2])  # GraphProto.initializer: field 5, length-delimited


def _initializer_runs(initializers: Any) -> Iterator[bytes]:
    """The serialized ``initializer`` entries of a graph, in order: runs of small tensors copied into a scratch
    GraphProto (whose bytes are exactly those entries), a tensor of :data:`RAW_ENTRY` raw bytes or more written
    field by field (:func:`_raw_entry`)."""
    run: list[onnx.TensorProto] = []
    held = 0
    for tensor in initializers:
        size = payload_bytes(tensor)
        if weights.is_lazy(tensor):
            if run:
                yield _entries(run)
                run, held = [], 0
            yield from _lazy_entry(tensor)
            continue
        if size >= RAW_ENTRY and tensor.HasField("raw_data") and not _unknown_fields(tensor):
            if run:
                yield _entries(run)
                run, held = [], 0
            yield from _raw_entry(tensor)
            continue
        if run and held + size > SERIALIZE_CHUNK:
            yield _entries(run)
            run, held = [], 0
        run.append(tensor)
        held += size
    if run:
        yield _entries(run)


RAW_ENTRY = 1 << 16
"""A raw tensor this large is serialized by :func:`_raw_entry`, its bytes copied once (by protobuf: copied into
a scratch graph, encoded into a buffer that doubles, copied out: three copies where this makes one)."""

_RAW_DATA_FIELD = 9  # TensorProto.raw_data


def _raw_entry(tensor: onnx.TensorProto) -> Iterator[bytes]:
    """``tensor``'s ``initializer`` entry as protobuf writes it (its fields in number order): the tag and
    length, the fields numbered below raw_data, raw_data's tag, length and bytes, the fields above it. Only the
    small fields go through protobuf; the bytes are read out of the message once."""
    below, above = onnx.TensorProto(), onnx.TensorProto()
    for desc, value in tensor.ListFields():
        if desc.number != _RAW_DATA_FIELD:
            _copy_field(below if desc.number < _RAW_DATA_FIELD else above, desc, value)
    head, tail, raw = below.SerializeToString(), above.SerializeToString(), tensor.raw_data
    raw_tag = bytes([_RAW_DATA_FIELD << 3 | 2]) + varint(len(raw))
    yield _INITIALIZER_TAG + varint(len(head) + len(raw_tag) + len(raw) + len(tail)) + head + raw_tag
    yield raw
    yield tail


_EXTERNAL_DATA_FIELD = 13  # TensorProto.external_data
_DATA_LOCATION_FIELD = 14  # TensorProto.data_location
_DEFAULT_LOCATION = bytes([_DATA_LOCATION_FIELD << 3, 0])  # data_location: DEFAULT, set (as onnx's loader sets it)


def _lazy_entry(tensor: onnx.TensorProto) -> Iterator[bytes]:
    """The ``initializer`` entry of a tensor left in its data file (ir.weights) as the model read with its
    external data loaded serializes it: its bytes as raw_data, no external_data, data_location DEFAULT set."""
    below, middle, above = onnx.TensorProto(), onnx.TensorProto(), onnx.TensorProto()
    for desc, value in tensor.ListFields():
        if desc.number < _RAW_DATA_FIELD:
            _copy_field(below, desc, value)
        elif desc.number > _DATA_LOCATION_FIELD:
            _copy_field(above, desc, value)
        elif desc.number not in (_EXTERNAL_DATA_FIELD, _DATA_LOCATION_FIELD):
            _copy_field(middle, desc, value)
    raw = weights.lazy_bytes(tensor)
    head = below.SerializeToString()
    tail = middle.SerializeToString() + _DEFAULT_LOCATION + above.SerializeToString()
    raw_tag = bytes([_RAW_DATA_FIELD << 3 | 2]) + varint(len(raw))
    yield _INITIALIZER_TAG + varint(len(head) + len(raw_tag) + len(raw) + len(tail)) + head + raw_tag
    yield raw
    yield tail


def copy_model_with_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose weights left in data files (ir.weights) are read in, as onnx's loader would."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in copy.graph.initializer:
        if weights.is_lazy(tensor):
            raw = weights.lazy_bytes(tensor)
            del tensor.external_data[:]
            tensor.raw_data = raw
            tensor.data_location = onnx.TensorProto.DEFAULT
    return copy


def model_bytes(model: onnx.ModelProto) -> bytes:
    """``model`` serialized: its weights left in data files inline (:func:`serialize_model`), else protobuf's
    own serialization of it."""
    return serialize_model(model) if weights.has_lazy(model) else model.SerializeToString()


def _entries(tensors: list[onnx.TensorProto]) -> bytes:
    """The bytes a GraphProto holding just ``tensors`` as initializers serializes to: each entry's tag, length and
    message. Each tensor serialized on its own: copying them into a scratch graph first copies every one of them
    (tens of thousands of small ones in a deep chain)."""
    pieces = []
    for tensor in tensors:
        data = tensor.SerializeToString()
        pieces.append(_INITIALIZER_TAG + varint(len(data)))
        pieces.append(data)
    return b"".join(pieces)


def _unknown_fields(message: Any) -> bool:
    from google.protobuf import unknown_fields

    return len(unknown_fields.UnknownFieldSet(message)) > 0


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def graph_field(top: bytes) -> tuple[int, int, int]:
    """Where ModelProto ``top`` (serialized) holds its graph: the tag's offset, the value's start and end."""
    found = [(a, b, c) for number, a, b, c in wire_fields(top, 0, len(top)) if number == 7]
    if len(found) != 1:  # protobuf merges a message field given twice; nothing here does that
        raise ValueError(f"{len(found)} graph fields in the serialized ModelProto")
    return found[0]



def wire_fields(data: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """The fields of the message serialized in ``data[start:end]``: (number, where its tag starts, where its
    value starts, where it ends)."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _read_varint(data, pos)
        wire = key & 7
        if wire == 0:
            value_start = pos
            _, pos = _read_varint(data, pos)
        elif wire == 2:
            length, value_start = _read_varint(data, pos)
            pos = value_start + length
        elif wire in (1, 5):
            value_start = pos
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unexpected wire type {wire} in a serialized ONNX message")
        yield key >> 3, field_start, value_start, pos


def tensor_header(view: memoryview, start: int,
                   end: int) -> tuple[onnx.TensorProto, memoryview | None, int]:
    """The TensorProto serialized in ``view[start:end]`` without its raw data (an empty ``raw_data`` stands in
    for it), that raw data as a view of ``view`` (None without), and where in ``view`` it starts."""
    other, raw, raw_start = [], None, 0
    for number, field_start, value_start, value_end in wire_fields(view, start, end):
        if number == 9:
            if raw is not None:
                raise ValueError("raw_data given twice in a serialized TensorProto")
            raw, raw_start = view[value_start:value_end], value_start
        else:
            other.append(view[field_start:value_end])
    header = onnx.TensorProto()
    header.ParseFromString(b"".join(other))
    if raw is not None:
        header.raw_data = b""
    return header, raw, raw_start


def serialize_model(model: onnx.ModelProto) -> bytes:
    """``model.SerializeToString()`` with a transient of one run of weights (see :func:`serialized_parts`)."""
    return b"".join(serialized_parts(model))


def copy_without_initializers(model: onnx.ModelProto, target: onnx.ModelProto) -> None:
    """Copy every field of ``model`` into ``target`` except the graph's initializers (the weights)."""
    _copy_fields(model, target, skip="graph")
    _copy_fields(model.graph, target.graph, skip="initializer")


def _copy_field(target: Any, desc: Any, value: Any) -> None:
    """Set field ``desc`` of ``target`` to ``value`` (as read from another message's ListFields)."""
    if getattr(desc, "is_repeated", None) or getattr(desc, "label", None) == 3:  # 3: LABEL_REPEATED
        getattr(target, desc.name).extend(value)
    elif desc.message_type is not None:
        getattr(target, desc.name).CopyFrom(value)
    else:
        setattr(target, desc.name, value)


def _copy_fields(source: Any, target: Any, *, skip: str) -> None:
    for desc, value in source.ListFields():
        if desc.name != skip:
            _copy_field(target, desc, value)

