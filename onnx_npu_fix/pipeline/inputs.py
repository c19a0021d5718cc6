"""The validation inputs of a run: loaded from ``--validation-data``, or generated (``--input-range``).

Loaded data (like Polygraphy's ``--load-inputs`` and onnxsim's ``--input-data-path``) replaces generated inputs:

  FILE.npz          one input set: one array per graph input, keyed by the input's name
  FILE.json         Polygraphy's ``--save-inputs`` JSON: a list of feed dicts, each one input set (io.polygraphy_json)
  FOLDER/           every ``*.npz`` and ``*.json`` in it (sorted by name) holds input sets; ``<input>.npy`` files (one
                    per graph input, a ``/`` in the input's name written as ``_``) form one more set

Every graph input that is not an initializer must be given, with the graph input's element type and, on every
static dimension, its size; an array for a name that is no graph input is an error too (a typo would otherwise
leave that input generated). Each problem is one InputError line naming the file and the input.

Generated inputs: floats ~ N(0, 1), integers in [0, 8), bools fair coins, or with ``--input-range name:lo,hi``
floats uniform in [lo, hi) and integers in [lo, hi]. An integer input whose values decide a shape (it reaches a
Reshape target, a Slice bound, Expand / Tile / ConstantOfShape / Range / Pad / TopK operands...) cannot be
generated meaningfully, nor can one that decides an If condition or a Loop's trip count: either is an
InputError that asks for ``--validation-data``.

How many sets: ``--validation-inputs`` (default 3). When the run may make an approximate change, its verdict is a
pooled relative L2 error, which on a tiny output depends on the seed; then sets are added until each graph output
has at least ``APPROX_MIN_ELEMENTS`` elements compared, within ``MAX_SETS`` sets and ``MAX_EXTRA_BYTES`` of inputs
and outputs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io import data_files, polygraphy_json
from onnx_npu_fix.ir.graph import dynamic_inputs, format_shape, shape_of_value_info
from onnx_npu_fix.ir.ops import is_default_domain

Feeds = dict[str, np.ndarray]

_MAX_INPUT_BYTES = 4 << 30  # random validation inputs above this are refused (the machine would swap or die)

_NUMPY_OF_ONNX = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.INT16: np.int16,
    onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.UINT32: np.uint32,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.UINT64: np.uint64,
    onnx.TensorProto.BOOL: np.bool_,
}


def make_inputs(model: onnx.ModelProto, n: int, seed: int, *,
                ranges: Mapping[str, tuple[float, float]] | None = None) -> list[Feeds]:
    """``n`` input sets from one seeded generator: floats ~ N(0, 1), integers in [0, 8), bools fair coins.

    Integer inputs stay small and non-negative because they are usually indices or lengths. ``ranges``: per
    input, floats uniform in [lo, hi) and integers in [lo, hi] instead (``--input-range``).
    Raises InputError when an input's shape is not static.
    """
    dynamic = dynamic_inputs(model)
    if dynamic:
        name, shape = next(iter(dynamic.items()))
        raise InputError(
            f"input '{name}' has dynamic shape {format_shape(shape)}; freeze it with "
            f"--input-shape {name}:<dims> (e.g. --input-shape {name}:1,1,16000)"
        )
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        elem = vi.type.tensor_type.elem_type
        dtype = _NUMPY_OF_ONNX.get(elem)
        if dtype is None:
            raise InputError(f"input '{vi.name}' has element type "
                             f"{onnx.TensorProto.DataType.Name(elem)}, which validation cannot generate; "
                             f"give its values with --validation-data FILE.npz, or use --no-validate")
        shape = tuple(shape_of_value_info(vi) or ())
        nbytes = int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
        if nbytes * n > _MAX_INPUT_BYTES:
            raise InputError(f"input '{vi.name}' {format_shape(shape)} needs {nbytes / 2**30:.1f} GiB per validation "
                             f"input; use --no-validate or a smaller --input-shape")
        specs.append((vi.name, shape, dtype))
    feeds: list[Feeds] = []
    for _ in range(n):
        feed: Feeds = {}
        for name, shape, dtype in specs:
            if ranges and name in ranges:
                feed[name] = _in_range(rng, shape, dtype, *ranges[name], name=name)
            elif np.issubdtype(dtype, np.floating):
                feed[name] = rng.standard_normal(shape).astype(dtype)
            elif dtype == np.bool_:
                feed[name] = rng.integers(0, 2, shape).astype(np.bool_)
            else:
                feed[name] = rng.integers(0, 8, shape).astype(dtype)
        feeds.append(feed)
    return feeds


def numpy_dtype(elem_type: int) -> type | None:
    """The numpy type of an ONNX element type validation can feed (None: one it cannot, e.g. strings)."""
    return _NUMPY_OF_ONNX.get(elem_type)


def _in_range(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, lo: float, hi: float, *,
              name: str) -> np.ndarray:
    """Values for ``--input-range``: floats uniform in [lo, hi), integers in [lo, hi], bools in {lo, hi} & {0, 1}."""
    if np.issubdtype(dtype, np.floating):
        # Bounds beyond the type (or a span beyond float64) would feed ±inf: inputs on which every model agrees.
        biggest = float(np.finfo(dtype).max)
        if max(abs(lo), abs(hi)) > biggest or not math.isfinite(hi - lo):
            raise InputError(f"--input-range {name}:{lo:g},{hi:g} exceeds the {np.dtype(dtype).name} range "
                             f"(±{biggest:.4g}): its values would be infinite and could not tell models apart; "
                             f"give finite bounds within it")
        return rng.uniform(lo, hi, shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(max(0, math.ceil(lo)), min(1, math.floor(hi)) + 1, shape).astype(np.bool_)
    info = np.iinfo(dtype)
    low, high = max(info.min, math.ceil(lo)), min(info.max, math.floor(hi))
    if low > high:
        raise InputError(f"--input-range {name}:{lo:g},{hi:g} holds no {np.dtype(dtype).name} value")
    return rng.integers(low, high, shape, endpoint=True).astype(dtype)


APPROX_MIN_ELEMENTS = 4096
"""Elements of each output an approximate verdict is measured on (at least, within MAX_SETS)."""
MAX_SETS = 1024
"""Most generated input sets for an approximate verdict."""
MAX_EXTRA_BYTES = 64 << 20
"""Most bytes of generated inputs and kept outputs for an approximate verdict (a large model gets fewer sets)."""

# Operand positions whose values decide a shape, a count or an axis: (op type) -> input indices.
SHAPE_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Slice": (1, 2, 3, 4), "Pad": (1, 3), "Resize": (3,), "Squeeze": (1,), "Unsqueeze": (1,), "TopK": (1,),
    "Split": (1,), "OneHot": (1,), "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,), "CenterCropPad": (1, 2), "NonMaxSuppression": (2,), "Col2Im": (1, 2),
    # control flow: a random condition or trip count runs an arbitrary branch (silero-vad's sample rate)
    "If": (0,), "Loop": (0, 1),
}
# Ops whose output does not depend on the input's values (only on its shape): a trace stops there.
_VALUE_BLIND = ("Shape", "Size")

_INTEGER = (onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
            onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64)


def parse_input_ranges(specs: Sequence[str]) -> dict[str, tuple[float, float]]:
    """``["x:0,1", ...]`` -> ``{"x": (0.0, 1.0)}``; InputError unless every spec is NAME:LO,HI, finite, LO <= HI."""
    ranges: dict[str, tuple[float, float]] = {}
    for spec in specs:
        name, sep, bounds = spec.rpartition(":")
        parts = bounds.split(",")
        try:
            lo, hi = (float(parts[0]), float(parts[1])) if sep and name and len(parts) == 2 else (None, None)
        except ValueError:
            lo = hi = None
        if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            raise InputError(f"input range '{spec}' is not NAME:LO,HI with finite LO <= HI (e.g. x:0,1)")
        ranges[name] = (lo, hi)
    return ranges


def validation_feeds(model: onnx.ModelProto, *, n_inputs: int, seed: int, data: str | None = None,
                     ranges: Sequence[str] = (), approximate: bool = False) -> list[Feeds]:
    """The input sets every validation of the run uses (see the module docstring).

    ``model``: prepared (shapes inferred, input shapes frozen). ``approximate``: the run may make an approximate
    change (more sets for small outputs). Raises InputError with one line for unusable data or ranges.
    """
    ranges = parse_input_ranges(ranges)
    feedable = _feedable_inputs(model)
    for name in ranges:
        if name not in feedable:
            raise InputError(f"--input-range names '{name}', which is not a graph input "
                             f"(inputs: {', '.join(feedable) or 'none'})")
    if data is not None:
        return load_validation_data(model, data)
    for name, (node, position) in shape_inputs(model).items():
        if name not in ranges:
            what = "a branch" if node.op_type in ("If", "Loop") else "a shape"
            raise InputError(f"input '{name}' decides {what} ({node.op_type} '{node.name}' input {position}): "
                             f"random values cannot validate it; give real values with --validation-data "
                             f"FILE.npz (or --input-range {name}:lo,hi, or --validate none)")
    n = n_inputs
    if approximate:
        n = max(n, sets_for_approximate(model))
    return make_inputs(model, n, seed, ranges=ranges)


def sets_for_approximate(model: onnx.ModelProto) -> int:
    """Input sets needed for every graph output to have APPROX_MIN_ELEMENTS elements compared (within MAX_SETS
    and MAX_EXTRA_BYTES of inputs and outputs); 1 when no output's size is known."""
    shapes = {vi.name: shape_of_value_info(vi) for vi in [*model.graph.output, *model.graph.value_info]}
    smallest = None
    for out in model.graph.output:
        shape = shapes.get(out.name)
        if shape is None or any(not isinstance(d, int) for d in shape):
            continue
        size = math.prod(shape)
        if size > 0:
            smallest = size if smallest is None else min(smallest, size)
    if smallest is None:
        return 1
    wanted = -(-APPROX_MIN_ELEMENTS // smallest)
    # Each set's inputs are generated and its outputs kept (the original's and the last model's): both count.
    per_set = 0
    inits = {t.name for t in model.graph.initializer}
    for vi in [*model.graph.input, *model.graph.output]:
        dtype = numpy_dtype(vi.type.tensor_type.elem_type)
        shape = shapes.get(vi.name, shape_of_value_info(vi))
        if vi.name in inits or dtype is None or shape is None or any(not isinstance(d, int) for d in shape):
            continue
        per_set += math.prod(shape) * np.dtype(dtype).itemsize
    affordable = MAX_EXTRA_BYTES // per_set if per_set else MAX_SETS
    return max(1, min(wanted, MAX_SETS, affordable))


def shape_inputs(model: onnx.ModelProto) -> dict[str, tuple[onnx.NodeProto, int]]:
    """Integer graph inputs whose values reach a shape or control-flow operand (SHAPE_OPERANDS), directly or
    through other ops: name -> (the first such node in graph order, operand position)."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    origin: dict[str, set[str]] = {}  # tensor -> the integer graph inputs its values depend on
    for vi in graph.input:
        if vi.name not in inits and vi.type.tensor_type.elem_type in _INTEGER:
            origin[vi.name] = {vi.name}
    if not origin:
        return {}
    found: dict[str, tuple[onnx.NodeProto, int]] = {}
    for node in graph.node:
        positions = SHAPE_OPERANDS.get(node.op_type, ()) if is_default_domain(node) else ()
        sources: set[str] = set()
        for k, name in enumerate(node.input):
            deps = origin.get(name)
            if not deps:
                continue
            if k in positions:
                for dep in deps:
                    found.setdefault(dep, (node, k))
            sources |= deps
        if sources and node.op_type not in _VALUE_BLIND:
            for out in node.output:
                if out:
                    origin[out] = sources
    return found


def load_validation_data(model: onnx.ModelProto, path: str) -> list[Feeds]:
    """The input sets stored at ``path`` (an .npz file or a folder), checked against the graph inputs."""
    if not os.path.exists(path):
        raise InputError(f"--validation-data {path}: no such file or directory")
    if os.path.isdir(path):
        names = sorted(os.listdir(path))
        sets = []
        for name in names:
            if name.endswith(".npz"):
                sets.append(_read_npz(model, os.path.join(path, name)))
            elif name.endswith(".json"):
                sets.extend(_read_polygraphy(os.path.join(path, name)))
        npy = [n for n in names if n.endswith(".npy")]
        if npy:
            files = [os.path.join(path, n) for n in npy]
            sets.append((path, {_input_of_npy(model, n): data_files.read_npy(f, f"--validation-data {f}")
                                for n, f in zip(npy, files)}))
        if not sets:
            raise InputError(f"--validation-data {path}: the folder holds no .npz, .json or .npy files")
    elif path.lower().endswith(".json"):
        sets = _read_polygraphy(path)
    else:
        sets = [_read_npz(model, path)]
    return [_check_set(model, where, arrays) for where, arrays in sets]


def _read_polygraphy(path: str) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The input sets of a Polygraphy ``--save-inputs`` file, each named ``path[k]`` in messages."""
    sets = polygraphy_json.read_feeds(path, data_files.read_text(path, f"--validation-data {path}"))
    if not sets:
        raise InputError(f"--validation-data {path}: holds no input set (an empty list)")
    return [(f"{path}[{k}]" if len(sets) > 1 else path, feed) for k, feed in enumerate(sets)]


NPY_HEADER_BYTES = 1 << 16
"""Most bytes an .npy header may take beyond its data (a version 2/3 header is at most this big in practice)."""


def _read_npz(model: onnx.ModelProto, path: str) -> tuple[str, dict[str, np.ndarray]]:
    """The arrays of one .npz, after its directory was checked: every key a graph input and no member larger
    than its input's static shape needs, so an unknown or oversized member is refused before it is read."""
    where = f"--validation-data {path}"
    with data_files.NpzArchive(path, where) as archive:
        _check_directory(model, path, archive)
        return path, {key: archive.array(key) for key in archive.members}


def _check_directory(model: onnx.ModelProto, path: str, archive: data_files.NpzArchive) -> None:
    inputs = {vi.name: vi for vi in model.graph.input}
    for key in archive.members:
        if key not in inputs:
            raise InputError(f"--validation-data {path}: '{key}' is not a graph input "
                             f"(inputs: {', '.join(inputs) or 'none'})")
    for key, info in archive.members.items():
        vi = inputs.get(key)
        shape = shape_of_value_info(vi) if vi is not None else None
        dtype = numpy_dtype(vi.type.tensor_type.elem_type) if vi is not None else None
        if shape is None or dtype is None or not all(isinstance(d, int) for d in shape):
            continue
        needed = math.prod(shape) * np.dtype(dtype).itemsize
        if info.file_size > needed + NPY_HEADER_BYTES:
            raise InputError(f"--validation-data {path}: '{key}' holds {info.file_size} bytes, more than input "
                             f"'{key}' {format_shape(shape)} {np.dtype(dtype).name} can take ({needed} bytes)")


def _input_of_npy(model: onnx.ModelProto, file_name: str) -> str:
    stem = file_name[:-len(".npy")]
    for name in _feedable_inputs(model):
        if stem in (name, name.replace("/", "_")):
            return name
    return stem  # reported as unknown by _check_set


def _feedable_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs a caller may feed: every input, initializer-backed ones included (they are defaults)."""
    return [vi.name for vi in model.graph.input]


def _check_set(model: onnx.ModelProto, where: str, arrays: dict[str, np.ndarray]) -> Feeds:
    inits = {t.name for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input}
    for name in arrays:
        if name not in inputs:
            raise InputError(f"--validation-data {where}: '{name}' is not a graph input "
                             f"(inputs: {', '.join(inputs) or 'none'})")
    feeds: Feeds = {}
    for name, vi in inputs.items():
        if name not in arrays:
            if name in inits:
                continue  # an initializer-backed input keeps its default
            raise InputError(f"--validation-data {where}: no array for graph input '{name}'")
        value = arrays[name]
        elem = vi.type.tensor_type.elem_type
        dtype = numpy_dtype(elem)
        wanted = onnx.TensorProto.DataType.Name(elem)
        if elem == onnx.TensorProto.STRING and value.dtype.kind in "US":
            value = value.astype(object)  # onnxruntime feeds strings as object arrays
        elif dtype is None:
            raise InputError(f"--validation-data {where}: input '{name}' is {wanted}, which validation cannot "
                             f"feed; use --validate none")
        elif value.dtype != np.dtype(dtype):
            raise InputError(f"--validation-data {where}: input '{name}' is {value.dtype}, the model takes "
                             f"{wanted}; convert it (e.g. array.astype(np.{np.dtype(dtype).name}))")
        shape = shape_of_value_info(vi)
        if shape is not None and (len(shape) != value.ndim or any(
                isinstance(d, int) and d != v for d, v in zip(shape, value.shape))):
            raise InputError(f"--validation-data {where}: input '{name}' has shape {list(value.shape)}, the "
                             f"model takes {format_shape(shape)}")
        feeds[name] = value
    return feeds
