"""Every knob of a run in one frozen dataclass, shared by the CLI, the pass manager and the passes.

FixOptions checks its own values (``__post_init__``) with :func:`check_value`, the one validator of option values:
types by the field's annotation, ranges from ``MINIMUM``, string choices from ``CHOICES`` / ``LIST_CHOICES``, ONNX
op types in ``OP_TYPE_LISTS``, positive input dims, and no NaN or infinity anywhere. The target profiles
(targets.py converts TOML sizes, then calls check_value) and the command line (FixOptions; its ``click.Choice``
lists are ``CHOICES``) go through the same rules, so a value is accepted everywhere or nowhere, with the same
message. A new field needs no code here unless it has a range or a fixed set of values (one line in
``MINIMUM`` / ``CHOICES``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx.defs

from onnx_npu_fix.errors import OptionError

# String options with a fixed set of values.
CHOICES: dict[str, tuple[str, ...]] = {
    "s2b_layout": ("auto", "spatial", "channel", "batch"),
    "bn_standalone": ("mul-add", "conv"),
    "resize_mode": ("nearest", "exact"),
    "validate": ("each", "final", "none"),
    "remainder_pad": ("concat", "pad4d", "pad"),
}
# List options whose every element must be one of a fixed set.
LIST_CHOICES: dict[str, tuple[str, ...]] = {
    "s2b_layouts": ("spatial", "channel", "batch"),
}
# Smallest value of a numeric option (for a tuple: of each element); numeric options not listed must be >= 0.
MINIMUM: dict[str, int] = {
    "max_dilation": 1, "n_inputs": 1, "max_rank": 1, "max_kernel": 1, "max_stride": 1, "max_stride_quantized": 1,
    "act_bytes": 1,
    "allowed_dilations": 1, "max_convtranspose_stride": 1, "allowed_kernels": 1, "resize_factors": 1,
    "linear_half_pixel_factors": 1,
}
# List options whose every element must be an ONNX op type (a misspelt one would silently match nothing).
OP_TYPE_LISTS: frozenset[str] = frozenset({"forbidden_ops", "initializer_inputs"})


@dataclass(frozen=True)
class FixOptions:
    # --- constraints / pass options -------------------------------------------------------------
    max_dilation: int | None = None
    """Largest dilation a Conv may keep on any axis (None: no limit, dilated-conv does nothing)."""
    s2b_layout: str = "auto"
    """Space-to-batch layout for dilated-conv: auto | spatial | channel | batch."""
    align: int = 8
    """Conv / ConvTranspose channel alignment (0 disables align-channels)."""
    align_io: bool = False
    """Also align channel counts of graph inputs/outputs inside the graph (Pad after inputs)."""
    bn_standalone: str = "mul-add"
    """How a BatchNormalization that cannot be folded is lowered: mul-add | conv."""
    resize_mode: str = "nearest"
    """resize-nearest: nearest (approximate) | exact (exact ConvTranspose/MatMul forms where they exist)."""
    max_approx_error: float = 0.5
    """Bound on the relative L2 error of each output for approximate passes."""
    large_tensor_bytes: int = 1 << 20
    """fold-constants does not materialise tensors larger than this."""
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Overrides for graph input shapes (freezes dynamic dims)."""
    freeze_inputs: dict[str, str] = field(default_factory=dict)
    """Graph inputs replaced by constants before the passes (``--freeze-input NAME=VALUE``): input name -> value
    text (a number, ``1,2,3``, ``[[1,2],[3,4]]`` or an .npy path; from Python also any array-like). See freeze.py."""
    # --- validation -------------------------------------------------------------------------------
    validate: str = "each"
    """each: after every pass that changed the graph; final: once, output against input; none."""
    n_inputs: int = 3
    seed: int = 0
    rtol: float = 1e-4
    atol: float = 1e-5
    output_rtol: dict[str, float] = field(default_factory=dict)
    output_atol: dict[str, float] = field(default_factory=dict)
    """Per graph output overrides of rtol / atol (``--rtol NAME:VALUE``, as polygraphy; see
    :func:`parse_tolerances`); a name that is not a graph output is refused when validation starts."""
    quant_steps: float = 1.0
    """Outputs made by a DequantizeLinear pass when ``|a - b| <= quant_steps * scale`` (their own step)."""
    keep_going: bool = False
    """Roll back a pass that fails validation and continue, instead of failing the run."""
    # --- validation data and approximations (docs/validation.md) --------------------------------
    validation_data: str | None = None
    """An .npz file (one input set), Polygraphy's --save-inputs JSON, or a folder of .npz / .json / <input>.npy
    files: the validation inputs, instead of generated ones (see onnx_npu_fix.pipeline.inputs)."""
    input_ranges: tuple[str, ...] = ()
    """``NAME:LO,HI`` per graph input: the range of its generated values (floats uniform, integers inclusive);
    parsed by inputs.parse_input_ranges."""
    strict: bool = False
    """Refuse any approximate change (StrictRefused, exit 4) instead of measuring it against max_approx_error."""
    # --- constraints checked by --check and after a fixing run (target profiles set these) ----------
    allowed_dilations: tuple[int, ...] | None = None
    """If set, every Conv dilation must be in this set (e.g. MDLA {1,2,4,8}); else only max_dilation."""
    concat_align: int = 0
    """Channel count of every Concat input must be a multiple of this (0: not checked)."""
    batch_one: bool = False
    """Every activation tensor must have batch (axis 0) 1."""
    max_rank: int | None = None
    """Largest tensor rank the target accepts (None: not checked; most NPU profiles set 4)."""
    forbidden_ops: tuple[str, ...] = ()
    """Op types the target cannot run; rewrites must not emit them and --check reports them."""
    allow_batchnorm: bool = False
    """Whether a BatchNormalization may remain (False: a violation fixed by fold-batchnorm)."""
    require_nearest_resize: bool = True
    """Whether a non-nearest Resize/Upsample is a violation (fixed by resize-nearest). False: the target runs
    linear / cubic Resizes as they are, and resize-nearest leaves them alone (no lossy rewrite it does not need)."""
    max_kernel: int | None = None
    """Largest Conv kernel extent on any axis worth reporting (None: not checked)."""
    max_stride: int | None = None
    """Largest Conv stride on any axis (None: not checked)."""
    max_stride_quantized: int | None = None
    """Largest stride on any axis of a Conv whose weight is quantized (a DequantizeLinear of a constant), where the
    target's limit for quantized Convs is lower than ``max_stride`` (rknn-toolkit2 2.5.0 on rv1106 splits a stride-8
    QDQ Conv into a float16 one it then refuses; the float Conv builds). None: not checked."""
    stride_limit_depthwise_only: bool = False
    """``max_stride`` limits depthwise Convs (and ConvTransposes) only: the compiler runs an ordinary Conv of any
    stride on its NPU (Vela 5.2: strides 4, 7 and 8 on 1-D and 2-D Convs did, a depthwise stride 4 did not)."""
    allowed_kernels: tuple[int, ...] | None = None
    """If set, every Conv kernel must be square, k x k with k one of these (K210 KPU: 1x1 or 3x3 only, no 1x3;
    None: not checked)."""
    symmetric_pads: bool = False
    """Every Conv must pad each spatial axis equally at both ends (a user profile's key: the nncase FAQ says so for
    the K210, but nncase 1.9 ran asymmetric pads on the KPU, so the k210 profile does not set it)."""
    initializer_inputs: tuple[str, ...] = ()
    """Op types whose inputs after the first (axes, shapes) the target's importer reads only from initializers: one
    made by a Constant node is a ``constant-node-input`` violation (nncase 1.9: Unsqueeze's ``axes``)."""
    squeeze_axes_ignored: bool = False
    """The target's importer removes every size-1 axis of a Squeeze whose axes are an input (opset >= 13), whatever
    they say: one that keeps a size-1 axis is a ``squeeze-axes`` violation (nncase 1.9)."""
    resize_scales_only: bool = False
    """The target's importer reads a Resize's output size only from its ``scales`` input: one given by ``sizes``
    (scales omitted) is a ``resize-sizes`` violation (nncase 1.9: "Can't pull input data for <>")."""
    allow_qdq: bool = True
    """Whether the target's compiler takes quantized ONNX (QuantizeLinear / DequantizeLinear or QOperator ops).
    False: a ``quantized-input`` violation (tpu-mlir 1.30.2 quantizes float models itself and refuses QDQ)."""
    resize_factors: tuple[int, ...] | None = None
    """If set, a Resize must scale H and W equally by one of these integer factors ((out - 1) / (in - 1) with
    align_corners), keep its size, or start from 1x1 (Vela's RESIZE_BILINEAR / NEAREST rule: 2, 4, 8)."""
    linear_half_pixel_factors: tuple[int, ...] | None = None
    """If set, a linear Resize with half_pixel coordinates only at these factors (Vela 5.2: x2 only)."""
    sram_bytes: int | None = None
    """Activation-memory budget for the memory estimate (None: only reported, never a violation)."""
    allow_control_flow: bool = True
    """Whether If / Loop / Scan may remain (False: each is a ``control-flow`` violation; NPU profiles set it)."""
    act_bytes: int = 1
    """Bytes per activation element in the memory estimate (1 for int8, 4 for float32)."""

    # --- fitting SRAM (reorder-memory, --split) ---------------------------------------------------
    schedule_budget: int = 20000
    """States the exact schedule search may expand (schedule.DEFAULT_SEARCH_BUDGET); deterministic, no wall time."""
    split_at: tuple[str, ...] = ()
    """--split-at: tensors after whose producer the split must cut."""


    # --- emission forms: which op forms the target's compiler runs on its NPU (target profiles set these) ----
    remainder_pad: str = "concat"
    """How dilated-conv pads a remainder (< k samples) before its phase Reshape: concat (Concat with a zeros
    constant, the default: tpu-mlir 1.30.2 aborts on a rank-3 Pad there) | pad4d (a Pad on a rank >= 4 view;
    rank-3 tensors are reshaped to [B,C,1,L] around it) | pad (a plain Pad of the tensor's own rank)."""
    lift_conv1d: bool = False
    """dilated-conv runs every 1-D Conv ([B,C,L]) as a 4-D one: Reshape [B,C,1,L] -> Conv kernel [1,K] -> Reshape."""
    s2b_layouts: tuple[str, ...] | None = None
    """Space-to-batch layouts whose ops the target runs on its NPU (None: all). With --s2b-layout auto only these
    are tried; a conv none of them can rewrite is left alone (do no harm) unless force_rewrite."""
    force_rewrite: bool = False
    """Rewrite a conv even when every form would put ops on the target's CPU (overrides the do-no-harm rule)."""
    allow_convtranspose: bool = True
    """Whether rewrites may emit ConvTranspose (False: resize-nearest's exact mode uses the MatMul form)."""
    fold_pad_into_conv: bool = False
    """fold-pad-conv folds a constant zero Pad on the spatial axes into the Conv that reads it (exact; for
    compilers that crash on their own Pad-into-Conv fusion: rknn-toolkit2 2.5.0, the Rockchip profiles)."""
    max_convtranspose_stride: int | None = None
    """Largest ConvTranspose stride the target compiles (None: no limit); exact Resize forms above it are
    split into stages (x8 -> x2 then x4)."""
    resize_separable: bool = False
    """resize-nearest's exact ConvTranspose forms of a 2-D Resize run one stage per axis, each a depthwise
    ConvTranspose with a 1-D kernel ([k,1] then [1,k]; the 2-D kernel is their outer product, so the sums are the
    same terms in another order): for compilers that refuse the large 2-D kernel or stride of the one-stage form."""

    # --- which constraints count (set by the CLI; a library caller may leave them) -------------------
    target: str | None = None
    """Name of the target profile these options came from (None: no target). With a target, the constraints
    that have no option of their own (static shapes, no leftover Dropout/Identity) count too."""
    requested: dict[str, str] | None = None
    """Which fields were asked for as constraints, and by whom: field -> "target" | "option". None: every
    constraint the options describe counts (built-in defaults included). See constraints.split_requested."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            checked = check_value(f.name, f.type, value)
            if checked is not value:
                object.__setattr__(self, f.name, checked)


def field_kind(annotation: Any) -> tuple[str, bool]:
    """(kind, nullable) of a FixOptions field annotation: the annotation without spaces and without ``| None``
    (annotations are strings under ``from __future__ import annotations``, PEP 604 unions that
    typing.get_type_hints cannot evaluate on Python 3.9). The kinds :func:`check_value` knows are ``KINDS``."""
    text = (annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation)))
    text = text.replace(" ", "")
    nullable = False
    for part in ("|None", "None|"):
        if part in text:
            text, nullable = text.replace(part, ""), True
    return text, nullable


def _type_word(value: Any) -> str:
    """What a value is, in words that read the same for a Python caller and a TOML profile."""
    words = {bool: "boolean", int: "integer", float: "float", str: "string", list: "list", tuple: "list",
             dict: "mapping"}
    return words.get(type(value), type(value).__name__)


def _bad(name: str, expected: str, value: Any) -> OptionError:
    return OptionError(f"{name} must be {expected}, got {_type_word(value)} {value!r}", field=name)


def _at_least(name: str, value: Any, shown: Any = None) -> None:
    low = MINIMUM.get(name, 0)
    if value < low:
        raise OptionError(f"{name} must be >= {low}, got {value if shown is None else shown!r}", field=name)


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, "true or false", value)
    return value


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, "an integer", value)
    _at_least(name, value)
    return value


def _check_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, "a number", value)
    if not math.isfinite(value):
        raise OptionError(f"{name} must be a finite number, got {value!r}", field=name)
    _at_least(name, value)
    return value if isinstance(value, float) else float(value)


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _bad(name, "a string", value)
    choices = CHOICES.get(name)
    if choices and value not in choices:
        raise OptionError(f"{name} must be one of {', '.join(choices)}, got {value!r}", field=name)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int_list(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(_is_int(v) for v in value):
        raise _bad(name, "a list of integers", value)
    if value:
        _at_least(name, min(value), list(value))
    return tuple(value)


def _check_str_list(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (tuple, list)) or any(not isinstance(v, str) for v in value):
        raise _bad(name, "a list of strings", value)
    if name in OP_TYPE_LISTS:
        _check_op_types(name, value)
    allowed = LIST_CHOICES.get(name)
    bad = [v for v in value if allowed and v not in allowed]
    if bad:
        raise OptionError(f"{name} values must be among {', '.join(allowed)}, got {', '.join(map(repr, bad))}",
                          field=name)
    return tuple(value)


def _check_op_types(name: str, names: Sequence[str]) -> None:
    """A typo such as "Prelu" would silently forbid nothing; only ONNX op types are accepted."""
    for op_type in names:
        if not onnx.defs.has(op_type):
            close = difflib.get_close_matches(op_type, [s.name for s in onnx.defs.get_all_schemas()], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise OptionError(f"{name}: {op_type!r} is not an ONNX op type{hint}", field=name)


def _check_shapes(name: str, value: Any) -> dict[str, tuple[int, ...]]:
    """Input name -> static shape. A dimension of 0 is no usable shape (an empty tensor): refused, like a
    negative one."""
    if not isinstance(value, dict):
        raise _bad(name, "a mapping of input name to dims", value)
    shapes: dict[str, tuple[int, ...]] = {}
    for key, dims in value.items():
        if not isinstance(key, str) or not isinstance(dims, (tuple, list)) or not all(_is_int(d) for d in dims):
            raise OptionError(f"{name}: input {key!r} must map to a list of integers, got {dims!r}", field=name)
        if any(d < 1 for d in dims):
            raise OptionError(f"{name}: input {key!r} has a dimension < 1: {list(dims)}", field=name)
        shapes[key] = tuple(dims)
    return shapes


def _check_float_map(name: str, value: Any) -> dict[str, float]:
    if not isinstance(value, dict) or any(not isinstance(k, str) for k in value):
        raise _bad(name, "a mapping of output name to number", value)
    return {key: _check_float(f"{name}[{key!r}]", number) for key, number in value.items()}


def parse_tolerances(option: str, values: Sequence[str]) -> tuple[float | None, dict[str, float]]:
    """``--rtol`` / ``--atol`` values as polygraphy writes them: a bare number is the default of every output,
    ``NAME:NUMBER`` overrides one output (split at the last colon: TensorFlow names such as ``out:0`` keep
    theirs). Returns (the default, or None when none was given; name -> value). Raises OptionError (one line)
    for a value that is not a finite number >= 0, or two values for one output."""
    default: float | None = None
    per_output: dict[str, float] = {}
    for text in values:
        name, sep, number = text.rpartition(":")
        try:
            value = float(number)
        except ValueError:
            raise OptionError(f"'{text}': expected a number or OUTPUT:NUMBER", field=option) from None
        if not math.isfinite(value) or value < 0:
            raise OptionError(f"'{text}': must be a finite number >= 0", field=option)
        if sep and not name:
            raise OptionError(f"'{text}': the output name before ':' is empty", field=option)
        if (name in per_output) if sep else (default is not None):
            raise OptionError(f"'{text}': two values for {f'output {name!r}' if sep else 'the default'}",
                              field=option)
        if sep:
            per_output[name] = value
        else:
            default = value
    return default, per_output


def check_output_names(options: FixOptions, outputs: Sequence[str]) -> None:
    """OptionError unless every output ``--rtol`` / ``--atol`` names is one of ``outputs`` (the graph's): a
    misspelt name would silently leave that output at the default tolerance."""
    for option, names in (("rtol", options.output_rtol), ("atol", options.output_atol)):
        unknown = [n for n in names if n not in outputs]
        if unknown:
            raise OptionError(f"--{option} names {', '.join(map(repr, unknown))}, which is not a graph output "
                              f"(outputs: {', '.join(outputs) or 'none'})", field=f"output_{option}")


def _check_str_map(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or any(not isinstance(k, str) or not isinstance(v, str)
                                          for k, v in value.items()):
        raise _bad(name, "a mapping of strings", value)
    return value


# The rules of each kind of field (the annotation as field_kind spells it): the one validator of option values.
_CHECKERS: dict[str, Callable[[str, Any], Any]] = {
    "bool": _check_bool,
    "int": _check_int,
    "float": _check_float,
    "str": _check_str,
    "tuple[int,...]": _check_int_list,
    "tuple[str,...]": _check_str_list,
    "dict[str,tuple[int,...]]": _check_shapes,
    "dict[str,str]": _check_str_map,
    "dict[str,float]": _check_float_map,
}
KINDS: frozenset[str] = frozenset(_CHECKERS)


def check_value(name: str, annotation: Any, value: Any) -> Any:
    """``value`` checked for the field ``name`` of type ``annotation`` (lists become tuples, ints floats where a
    float is expected); raises OptionError (an InputError and a ValueError) saying what is accepted. FixOptions,
    the target profiles (targets.py, after converting TOML sizes) and the CLI all go through this."""
    kind, nullable = field_kind(annotation)
    if value is None:
        if nullable:
            return value
        raise _bad(name, f"set ({kind})", value)
    checker = _CHECKERS.get(kind)
    return value if checker is None else checker(name, value)  # a kind without rules: another module checks it
