"""The package tree and its map: the README's "Layout" block lists what is in the tree, and only that."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "onnx_npu_fix"
PLUMBING = {"__init__.py", "__main__.py"}
"""Files every package has or that only make ``python -m`` work: not part of the map."""


def _layout_block(readme: str) -> list[str]:
    """The lines of the first fenced block under the "## Layout" heading."""
    section = readme.split("\n## Layout\n", 1)[1]
    block = re.search(r"^```[^\n]*\n(.*?)^```", section, re.M | re.S)
    assert block, "no fenced block under '## Layout'"
    return block.group(1).splitlines()


def _listed(lines: list[str]) -> dict[str, str]:
    """Path -> its description, for every entry of the map ("name.py" or "name/" first on a line; the indent says
    which directory it is in). Continuation lines (no file name first) add to the entry above."""
    entries: dict[str, str] = {}
    parents: list[tuple[int, str]] = []  # (indent, directory path) of the enclosing entries
    last = None
    for line in lines:
        found = re.match(r"^( *)([\w.-]+(?:\.py|/))(?:\s+(.*))?$", line)
        if not found:
            if last is not None and line.strip():
                entries[last] += " " + line.strip()
            continue
        indent, name, text = len(found.group(1)), found.group(2), found.group(3) or ""
        while parents and parents[-1][0] >= indent:
            parents.pop()
        last = (parents[-1][1] if parents else "") + name
        entries[last] = text
        if name.endswith("/"):
            parents.append((indent, last))
    return entries


def _tree() -> set[str]:
    """Every module and directory under the package, as the map spells them ("pkg/sub/", "pkg/sub/mod.py")."""
    found = {PACKAGE + "/"}
    for directory, subdirs, files in os.walk(os.path.join(ROOT, PACKAGE)):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        rel = os.path.relpath(directory, ROOT).replace(os.sep, "/") + "/"
        found.update(rel + d + "/" for d in subdirs)
        found.update(rel + f for f in files if f.endswith(".py") and f not in PLUMBING)
    return found


def _summarised(listed: dict[str, str]) -> set[str]:
    """Directories the map describes as a whole: listed, but none of their files are."""
    return {d for d in listed if d.endswith("/") and not any(p != d and p.startswith(d) for p in listed)}


def _pass_modules() -> set[str]:
    from onnx_npu_fix.passes import PASSES

    return {cls.__module__.replace(".", "/") + ".py" for cls in PASSES.values()}


def test_readme_layout_lists_the_package_tree():
    """Every module and sub-package is on the map and everything on the map exists, so the map cannot fall behind
    the tree. A directory the map describes in one line (passes/: "one pass per file") may hold its passes
    unlisted; any other file in it must be named in that line."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    listed = _listed(_layout_block(readme))
    assert PACKAGE + "/" in listed and "cli.py" not in listed  # the parser saw the package's indentation
    in_package = {p for p in listed if p.startswith(PACKAGE + "/")}
    tree = _tree()
    assert sorted(in_package - tree) == [], "listed in the README's Layout but not in the tree"
    passes = _pass_modules()
    unlisted = set()
    for path in tree - in_package:
        summary = next((d for d in _summarised(listed) if path.startswith(d)), None)
        if summary is None or (path not in passes and os.path.basename(path) not in listed[summary]):
            unlisted.add(path)
    assert sorted(unlisted) == [], "in the tree but not in the README's Layout"
    others = {p for p in listed if not p.startswith(PACKAGE + "/") and "/" not in p[:-1]}
    assert sorted(p for p in others if not os.path.exists(os.path.join(ROOT, p))) == []


def test_layout_parser_reads_nesting_and_summaries():
    """The parser the test above relies on: indentation makes paths, a file-less directory is a summary."""
    lines = ["pkg/", "  a.py            one", "  sub/              two", "    b.py            three",
             "                    more of three", "  whole/            many files; x.py is the helper", "docs/"]
    listed = _listed(lines)
    assert listed == {"pkg/": "", "pkg/a.py": "one", "pkg/sub/": "two", "pkg/sub/b.py": "three more of three",
                      "pkg/whole/": "many files; x.py is the helper", "docs/": ""}
    assert _summarised(listed) == {"pkg/whole/", "docs/"}
