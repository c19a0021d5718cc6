"""Print the declared floor of every dependency as a pin (``onnx>=1.14`` -> ``onnx==1.14``): the requirements of the
minimum-pins test environment (``make test-min``), read from pyproject.toml so that the floors tested are the
floors declared. Runtime dependencies and the ``test`` extra; ruff (lint only) is left out."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = {"ruff"}


def floors(text: str) -> list[str]:
    pins = []
    blocks = re.findall(r"^(?:dependencies|test)\s*=\s*\[(.*?)\]", text, re.M | re.S)
    for block in blocks:
        for requirement in re.findall(r'"([^"]+)"', block):
            found = re.match(r"^\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][^;,\s]*)\s*(;.*)?$", requirement)
            if not found:
                raise SystemExit(f"pyproject.toml: {requirement!r} has no '>=' floor to pin")
            name, version, marker = found.groups()
            if name.lower() not in SKIP:
                pins.append(f"{name}=={version}{marker or ''}")
    return pins


if __name__ == "__main__":
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        print("\n".join(floors(f.read())))
