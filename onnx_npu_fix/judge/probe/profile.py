"""The learned profile (TOML in the shipped profiles' format, each line with its evidence) and the probe's
``--report`` record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from onnx_npu_fix.judge.probe.prober import ProbeResult, constraints

PROBE_REPORT_VERSION = 1
"""The version of ``npufix probe --report`` (pipeline/schemas/probe.schema.json)."""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's for these characters)."""
    import json

    return json.dumps(" ".join(text.split()), ensure_ascii=False)


def _comment(text: str) -> str:
    return " ".join(text.split())


def render_profile(result: ProbeResult, *, name: str, command: str, base: Any = None) -> str:
    """The learned profile as TOML in the shipped profiles' format; ``base``: a TargetProfile whose constraints
    and notes the learned ones override (each kept line says where it came from)."""
    values = constraints(result)
    calls = len(result.calls)
    lines = [f"# Learned by npufix probe from the judge {_comment(command)}: {calls} judge call"
             f"{'' if calls == 1 else 's'} ({result.judge_seconds:.1f} s), {result.cached} answered from the cache.",
             "# Each learned line says which probe model (its parameters and sha256 prefix) the judge accepted or "
             "rejected; the calls are in the probe report.", ""]
    for check in result.checks:
        lines.insert(-1, f"# {check['model']} fixed under this profile: the judge says {check['verdict_text']} "
                         f"(sha256 {check['sha256'][:12]})")
    sources = [f"npufix probe --judge {command}"] + (list(base.sources) if base is not None else [])
    description = f"learned by npufix probe ({calls} judge calls)"
    if base is not None:
        description += f" over {base.name}"
    lines += ["[target]", f"name = {_toml_string(name)}", f"description = {_toml_string(description)}",
              "sources = [" + ", ".join(_toml_string(s) for s in sources) + "]", "", "[constraints]"]
    base_constraints = dict(base.constraints) if base is not None else {}
    for key, value in base_constraints.items():
        if key not in values:
            lines.append(f"{key} = {_toml_value(value)}  # from --base-target {base.name}")
    for key, learned in result.learned.items():
        lines.append(f"{key} = {_toml_value(values[key])}  # {_comment(learned.evidence)}")
    notes = {**(dict(base.notes) if base is not None else {}), **result.notes}
    if result.interrupted:
        notes["interrupted"] = "the probe was interrupted: the keys not listed were not probed"
    if notes:
        lines += ["", "[notes]"] + [f"{_note_key(key)} = {_toml_string(text)}" for key, text in notes.items()]
    return "\n".join(lines) + "\n"


def _note_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_string(key)


def probe_record(result: ProbeResult, *, command: str, like: Sequence[str], base_target: str | None,
                 output: str | None, seconds: float) -> dict[str, Any]:
    """The ``--report`` JSON of a probe: every judge call, what was not built, what was learned."""
    return {
        "report_version": PROBE_REPORT_VERSION,
        "mode": "probe",
        "judge": command,
        "like": list(like),
        "base_target": base_target,
        "output": output,
        "interrupted": result.interrupted,
        "judge_calls": len(result.calls),
        "cached": result.cached,
        "judge_seconds": round(result.judge_seconds, 3),
        "seconds": round(seconds, 3),
        "learned": {key: constraints(result)[key] for key in result.learned},
        "notes": dict(result.notes),
        "calls": [c.to_json() for c in result.calls],
        "unbuildable": list(result.unbuildable),
        "checks": [{k: v for k, v in c.items() if k != "verdict_text"} for c in result.checks],
    }
