"""Target profiles: the published constraints of an NPU as a TOML file, turned into FixOptions.

A profile is a TOML file with three tables::

    [target]
    name = "k210"
    description = "Kendryte K210 KPU, compiled by nncase 1.x"
    sources = ["https://github.com/kendryte/nncase/blob/release/1.0/docs/FAQ_EN.md"]

    [constraints]          # keys are FixOptions field names; each line cites its source in a comment
    max_kernel = 3         # nncase FAQ: Conv / DepthwiseConv 1x1 or 3x3
    sram_bytes = "2MiB"    # ints or "<n>KiB|MiB|GiB"

    [notes]                # facts npufix cannot check (yet): shown by --list-targets
    feature_map = "input maps <= 320x240 (nncase FAQ)"

Shipped profiles live in ``onnx_npu_fix/config/profiles/*.toml`` (one file per target, file stem = name). A
constraint the source leaves unknown is simply absent, so FixOptions' default drives the passes (but is no
constraint of the target: only the keys a profile sets count, see constraints.split_requested); the profile says
so in a comment.
Precedence when building the options of a run: FixOptions defaults < profile < options given on the command line
(``apply_target``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from onnx_npu_fix.config.options import KINDS, FixOptions, check_value, field_kind
from onnx_npu_fix.errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

__all__ = [
    "TargetProfile",
    "apply_target",
    "list_targets",
    "load_target",
    "parse_size",
    "render_target_list",
    "shipped_target_names",
]

_TARGET_KEYS = ("name", "description", "sources")
_TABLES = ("target", "constraints", "notes")

# Byte budgets that may be written with a unit ("384KiB"); act_bytes is bytes per element, not a budget.
_SIZE_FIELDS = frozenset({"sram_bytes", "large_tensor_bytes"})
# Fields that say who asked for what; a profile does not set them.
_NOT_SETTABLE = frozenset({"target", "requested"})

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_DECIMAL_UNITS = {"kb": "KiB", "mb": "MiB", "gb": "GiB"}
"""Refused (ambiguous), each with the binary unit a message suggests instead."""
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class TargetProfile:
    name: str
    description: str
    sources: tuple[str, ...]
    constraints: dict[str, Any] = field(default_factory=dict)
    """FixOptions field -> value, already converted (lists -> tuples, sizes -> int bytes)."""
    notes: dict[str, str] = field(default_factory=dict)
    """Facts of the target that no FixOptions field expresses yet; shown by --list-targets."""
    path: str = ""
    """Where the profile was read from (a shipped package file or the user's .toml)."""


# --- the FixOptions fields a profile may set ----------------------------------------------------------------


def _settable_fields() -> dict[str, Any]:
    """FixOptions field -> annotation, for every field a profile may set (a kind options.check_value knows)."""
    return {f.name: f.type for f in dataclasses.fields(FixOptions)
            if field_kind(f.type)[0] in KINDS and f.name not in _NOT_SETTABLE}


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {int: "integer", float: "float", str: "string", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )


# --- sizes ---------------------------------------------------------------------------------------------


def parse_size(text: str | int) -> int:
    """Bytes from an int or a string such as "384KiB", "2MiB", "4096" (binary units; K/M/G mean KiB/MiB/GiB).

    Decimal-looking units (KB, MB) are refused rather than guessed: embedded vendors use "KB" for both 1000 and
    1024 bytes. Raises ValueError with a message saying what is accepted."""
    if isinstance(text, bool):
        raise ValueError("expected a byte count, got a boolean")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a byte count cannot be negative ({text})")
        return text
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if match and unit in _DECIMAL_UNITS:
        raise ValueError(f"{text!r}: {match.group(2)} is ambiguous (vendors use it for both 1000 and 1024 bytes); "
                         f"the binary units are B, KiB, MiB, GiB (K, M, G mean the same), e.g. "
                         f"{match.group(1)}{_DECIMAL_UNITS[unit]}")
    if not match or unit not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size; write bytes (393216) or a binary unit: B, KiB, MiB, GiB "
                         f"(K, M, G mean the same), e.g. 384KiB, 2MiB")
    value = float(match.group(1)) * _UNITS[unit]
    if value != int(value):
        raise ValueError(_fraction_message(text, match.group(1), value, unit))
    return int(value)


def _fraction_message(text: str, number: str, value: float, unit: str) -> str:
    """Why a size that is not a whole number of bytes is refused, and what to write instead."""
    if unit in ("", "b"):
        # "0.5" almost always means half of a unit the user left out: a size without a unit is a byte count.
        return (f"{text!r} is {value:g} bytes, and a byte count is whole: if you meant a larger unit, write it, "
                f"e.g. {number}KiB or {number}MiB")
    kib = f" or {int(value) >> 10}KiB" if value >= 1024 else ""
    return (f"{text!r} is {value:.1f} bytes, not whole bytes: write a whole number of bytes or of a smaller unit, "
            f"e.g. {int(value)}{kib}")


def format_size(n: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} B"


# --- conversion of one [constraints] value ------------------------------------------------------------------


def _convert(key: str, annotation: Any, value: Any) -> Any:
    """The FixOptions value for a TOML value: a size string ("384KiB") becomes bytes and a freeze value that TOML
    typed (a number, a list) becomes the text the command line would give; then FixOptions' own validator
    (options.check_value) decides, so a profile accepts exactly what FixOptions accepts, with the same message.
    Raises ValueError (OptionError is one) saying what was expected."""
    if key in _SIZE_FIELDS and isinstance(value, str):
        try:
            value = parse_size(value)
        except ValueError as exc:
            raise ValueError(f"{key} {exc}") from None
    elif key == "freeze_inputs" and isinstance(value, dict):
        value = {name: v if isinstance(v, str) else json.dumps(v) for name, v in value.items()}
    return check_value(key, annotation, value)


# --- parsing a profile ------------------------------------------------------------------------------------


def _bad(where: str, message: str) -> InputError:
    return InputError(f"target profile {where}: {message}")


def parse_profile(text: str, *, where: str, default_name: str) -> TargetProfile:
    """Parse and check the TOML text of one profile. ``where`` names it in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _bad(where, f"not valid TOML ({exc}); fix the file or compare with a shipped profile") from None
    for table in data:
        if table not in _TABLES:
            raise _bad(where, f"unknown table [{table}]; a profile has only [target], [constraints], [notes]")
        if not isinstance(data[table], dict):
            raise _bad(where, f"{table} must be a table ([{table}]), got {_toml_type(data[table])}")

    target = data.get("target", {})
    for key in target:
        if key not in _TARGET_KEYS:
            raise _bad(where, f"unknown key {key!r} in [target]; allowed: {', '.join(_TARGET_KEYS)}")
    name = target.get("name", default_name)
    description = target.get("description", "")
    sources = target.get("sources", [])
    if not isinstance(name, str) or not name:
        raise _bad(where, "[target] name must be a non-empty string")
    if not isinstance(description, str):
        raise _bad(where, "[target] description must be a string")
    if not isinstance(sources, list) or any(not isinstance(s, str) for s in sources):
        raise _bad(where, '[target] sources must be a list of strings (URLs or document names), e.g. ["..."]')

    settable = _settable_fields()
    constraints: dict[str, Any] = {}
    for key, value in data.get("constraints", {}).items():
        if key not in settable:
            close = difflib.get_close_matches(key, list(settable), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise _bad(
                where,
                f"unknown key {key!r} in [constraints]; {hint}keys are FixOptions fields: {', '.join(settable)}",
            )
        try:
            constraints[key] = _convert(key, settable[key], value)
        except ValueError as exc:
            raise _bad(where, f"[constraints] {exc}") from None

    notes = data.get("notes", {})
    for key, value in notes.items():
        if not isinstance(value, str):
            raise _bad(where, f"[notes] {key} must be a string, got {_toml_type(value)}")
    return TargetProfile(
        name=name,
        description=description,
        sources=tuple(sources),
        constraints=constraints,
        notes=dict(notes),
        path=where,
    )


def load_target_file(path: str | Path) -> TargetProfile:
    """Load a user's profile file; its name defaults to the file stem."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"target profile {p} not found; give a shipped name (see --list-targets) or a .toml path")
    if not p.is_file():
        raise InputError(f"target profile {p} is not a file; give the path to a .toml profile")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"target profile {p} cannot be read ({exc.strerror}); check its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(str(p), "not UTF-8 text; save it as a UTF-8 .toml file") from None
    return parse_profile(text, where=str(p), default_name=p.stem)


# --- shipped profiles ------------------------------------------------------------------------------------


def _shipped_files() -> dict[str, Any]:
    """name -> Traversable of every shipped profile (package data onnx_npu_fix/config/profiles/*.toml)."""
    folder = resources.files("onnx_npu_fix.config") / "profiles"
    if not folder.is_dir():  # pragma: no cover - a broken install
        return {}
    return {
        entry.name[: -len(".toml")]: entry
        for entry in folder.iterdir()
        if entry.name.endswith(".toml") and entry.is_file()
    }


def shipped_target_names() -> list[str]:
    return sorted(_shipped_files())


def _load_shipped(name: str, entry: Any) -> TargetProfile:
    return parse_profile(entry.read_text(encoding="utf-8"), where=str(entry), default_name=name)


def list_targets() -> list[TargetProfile]:
    """Every shipped profile, sorted by name."""
    return [_load_shipped(name, entry) for name, entry in sorted(_shipped_files().items())]


def _looks_like_path(text: str) -> bool:
    return text.lower().endswith(".toml") or "/" in text or "\\" in text


def load_target(name_or_path: str) -> TargetProfile:
    """A shipped profile by name (case and '_' vs '-' do not matter) or a user's profile by path."""
    if _looks_like_path(name_or_path):
        return load_target_file(name_or_path)
    shipped = _shipped_files()
    key = name_or_path.strip().lower().replace("_", "-")
    if key in shipped:
        return _load_shipped(key, shipped[key])
    if Path(name_or_path).is_file():  # a profile file without the .toml suffix in the working directory
        return load_target_file(name_or_path)
    close = difflib.get_close_matches(key, list(shipped), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise InputError(
        f"unknown target {name_or_path!r}; {hint}choose one of {', '.join(sorted(shipped))} "
        "or give the path to a .toml profile"
    )


# --- using a profile --------------------------------------------------------------------------------------


def apply_target(profile: TargetProfile, base: FixOptions, explicit: dict[str, Any] | None = None) -> FixOptions:
    """``base`` with the profile's constraints, then the explicitly given options on top.

    ``explicit`` holds only the options the user actually gave (e.g. on the command line), so that
    ``--target mstar-ipu --max-dilation 2`` keeps the profile's other constraints but dilation 2."""
    explicit = dict(explicit or {})
    names = {f.name for f in dataclasses.fields(FixOptions)}
    unknown = sorted(set(explicit) - names)
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(unknown)}; see npufix --help")
    merged = {**profile.constraints, **explicit}
    if "input_shapes" in merged:  # never share a mutable dict between options objects
        merged["input_shapes"] = dict(merged["input_shapes"])
    # The profile's constraints count as asked for by the target, the explicit options as asked for by the user.
    # A field both set counts as the target's: the target requires that constraint, the option sets its value.
    requested = dict(base.requested or {})
    requested.update({key: "option" for key in explicit})
    requested.update({key: "target" for key in profile.constraints})
    merged.setdefault("target", profile.name)
    merged["requested"] = requested
    if "freeze_inputs" in merged:
        merged["freeze_inputs"] = dict(merged["freeze_inputs"])
    try:
        return dataclasses.replace(base, **merged)
    except InputError as exc:
        raise InputError(f"target profile {profile.path or profile.name}: {exc}") from None


def _format_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if key in _SIZE_FIELDS and isinstance(value, int):
        return format_size(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_format_value('', v)}" for k, v in value.items()) + "}"
    return str(value)


def render_target_list(profiles: list[TargetProfile]) -> str:
    """The text of ``npufix --list-targets``: per target its description, constraints, unchecked facts and
    sources."""
    lines: list[str] = []
    width = max((len(p.name) for p in profiles), default=0)
    for i, profile in enumerate(profiles):
        if i:
            lines.append("")
        lines.append(f"{profile.name.ljust(width)}  {profile.description}".rstrip())
        if profile.constraints:
            settings = ", ".join(f"{k}={_format_value(k, v)}" for k, v in profile.constraints.items())
            lines.append(f"  constraints: {settings}")
        else:
            lines.append("  constraints: (none; npufix defaults apply)")
        for key, note in profile.notes.items():
            lines.append(f"  not checked: {key}: {note}")
        for source in profile.sources:
            lines.append(f"  source: {source}")
    return "\n".join(lines) + ("\n" if lines else "")
