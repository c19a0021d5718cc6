"""The library entry points: load a model, fix it, save it atomically.

    model = load_model("in.onnx")
    result = fix(model, FixOptions(max_dilation=4, align=8))
    if result.ok:
        save_model(result.model, "out.onnx")
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence

import onnx
from google.protobuf.message import DecodeError

from onnx_npu_fix.errors import InputError
from onnx_npu_fix.options import FixOptions
from onnx_npu_fix.passes import DEFAULT_ORDER, PASSES
from onnx_npu_fix.passes.base import Pass
from onnx_npu_fix.pipeline import FixResult, prepare, run_passes

_TWO_GB = 2**31 - 1


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and sanity-check an ONNX model (external data included). Raises InputError with a one-line reason."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, expected an .onnx file")
    if os.path.getsize(path) == 0:
        raise InputError(f"{path}: empty file, expected an ONNX model")
    try:
        model = onnx.load(path)
    except DecodeError as exc:
        raise InputError(f"{path}: not an ONNX model (protobuf decode failed: {exc}); "
                         f"was the file truncated?") from None
    except FileNotFoundError as exc:
        raise InputError(f"{path}: external data file missing ({exc.filename or exc}); "
                         f"keep the .data file next to the model") from None
    except Exception as exc:  # noqa: BLE001 - onnx raises many types for unreadable files
        raise InputError(f"{path}: cannot load as ONNX ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    if not model.HasField("graph") or model.ir_version <= 0 or not model.opset_import:
        raise InputError(f"{path}: not an ONNX model (no graph, IR version or opset); is it another protobuf?")
    if not model.graph.output:
        raise InputError(f"{path}: the graph has no outputs; nothing to validate or fix")
    try:
        if model.ByteSize() < _TWO_GB:
            onnx.checker.check_model(model)
        else:
            onnx.checker.check_model(path)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: the model fails the onnx checker: {str(exc).strip().splitlines()[0]}") from None
    return model


def check_output_path(output: str | os.PathLike, input_path: str | os.PathLike | None = None) -> None:
    """Fail early (before any work) when ``output`` cannot be written or would overwrite the input."""
    output = os.fspath(output)
    if (input_path is not None and os.path.exists(output) and os.path.exists(input_path)
            and os.path.samefile(output, os.fspath(input_path))):
        raise InputError(f"-o {output} is the input file; npufix never modifies its input, choose another path")
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        raise InputError(f"-o {output}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise InputError(f"-o {output}: directory {directory} is not writable")
    if os.path.isdir(output):
        raise InputError(f"-o {output}: is a directory, expected a file path")


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, external_data: bool | None = None) -> None:
    """Write ``model`` atomically: a temporary file in the target directory, then a rename.

    Models above 2 GB, or when ``external_data`` is True, keep their weights in ``<name>.data`` next to the
    output (written fresh: onnx's writer appends to an existing data file).
    """
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    if external_data is None:
        external_data = model.ByteSize() >= _TWO_GB or _uses_external_data(model)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    data_name = os.path.basename(path) + ".data"
    tmp_data = None
    try:
        if external_data:
            tmp_dir = tempfile.mkdtemp(prefix=".npufix-", dir=directory)
            tmp_model = os.path.join(tmp_dir, os.path.basename(path))
            onnx.save(model, tmp_model, save_as_external_data=True, all_tensors_to_one_file=True,
                      location=data_name, size_threshold=1024)
            tmp_data = os.path.join(tmp_dir, data_name)
            os.replace(tmp_model, tmp)
            if os.path.exists(tmp_data):
                os.replace(tmp_data, os.path.join(directory, data_name))
            os.rmdir(tmp_dir)
        else:
            with open(tmp, "wb") as f:
                f.write(model.SerializeToString())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def select_passes(only: Sequence[str] | None = None, skip: Sequence[str] = ()) -> list[Pass]:
    """The default order, restricted to ``only`` (kept in default order) and without ``skip``.

    Unknown names raise InputError listing the valid ones.
    """
    known = list(PASSES)
    for name in [*(only or ()), *skip]:
        if name not in PASSES:
            raise InputError(f"unknown pass '{name}'; passes: {', '.join(known)}")
    chosen = [cls() for cls in DEFAULT_ORDER if (only is None or cls.name in only) and cls.name not in skip]
    extra = [PASSES[n]() for n in (only or ()) if n in PASSES and PASSES[n] not in DEFAULT_ORDER]
    return chosen + extra


def fix(model: onnx.ModelProto, options: FixOptions | None = None,
        passes: Sequence[Pass] | None = None) -> FixResult:
    """Run the passes (default order unless given) over a copy-free ``model``; see :class:`FixResult`."""
    options = options or FixOptions()
    prepare(model, options)
    return run_passes(model, options, list(passes) if passes is not None else select_passes())
