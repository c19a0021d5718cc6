"""The package tree is the architecture: no import cycles, each layer imports only from the layers below it, and
the "Layout" block of docs/contributing.md lists what is in the tree, and only that.

Imports are read from the source with ``ast`` (nothing is imported), every ``import`` / ``from ... import``
counted wherever it stands: at module level, inside a function (a lazy import is still a dependency) or under
``if TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

PACKAGE = "onnx_npu_fix"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# Lowest first: a layer may import from itself and from the layers before it, never from one after it. The vendor
# judges come first: they run under a vendor toolchain's Python, with numpy and onnx and nothing else of npufix's.
LAYERS = ("judges", "host", "ir", "config", "io", "analysis", "passes", "constraints", "pipeline", "judge", "plugins",
          "api", "cli", "__main__")
# Usable from every layer: the exceptions and exit codes, the progress events, and the package root
# (``__version__``; its public names are loaded on attribute access, so ``onnx_npu_fix/__init__.py`` imports
# nothing at module level).
SHARED = ("errors", "progress", "")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imported(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, module-level?) for every import of a package module in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    found: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` imports mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for target in dict.fromkeys(targets):  # once per statement, however many names it imports
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                found.append((target, node.lineno, id(node) in top_level))
    return found


def _with_parents(importer: str, target: str) -> set[str]:
    """``target`` and the packages Python runs on the way to it (their ``__init__``), except those that
    contain the importer (already being imported when it runs)."""
    implied = {target}
    parts = target.split(".")
    for k in range(1, len(parts)):
        parent = ".".join(parts[:k])
        if not (importer == parent or importer.startswith(parent + ".")):
            implied.add(parent)
    return implied & set(MODULES)


def _graph(*, module_level_only: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for target, _, top in _imported(module, path):
            if top or not module_level_only:
                graph[module] |= _with_parents(module, target) - {module}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that returns to its start, or None (depth-first search, sorted order)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def _layer(module: str) -> str:
    return module.removeprefix(PACKAGE).lstrip(".").split(".")[0]


def test_the_import_reader_sees_every_kind_of_import():
    # The checks below are only as good as the reader: it must see relative, lazy and from-package imports.
    name = f"{PACKAGE}.pipeline.validation.validator"
    validator = _imported(name, MODULES[name])
    assert ("onnx_npu_fix.pipeline.inputs", True) in {(t, top) for t, _, top in validator}
    cli = {(t, top) for t, _, top in _imported("onnx_npu_fix.cli", MODULES["onnx_npu_fix.cli"])}
    assert ("onnx_npu_fix.api", False) in cli  # ``from onnx_npu_fix import api`` inside a function
    assert _with_parents("onnx_npu_fix.constraints", "onnx_npu_fix.passes.base") == {
        "onnx_npu_fix.passes.base", "onnx_npu_fix.passes"}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module_level_only", [True, False], ids=["module-level", "with-lazy-imports"])
def test_no_import_cycle(module_level_only):
    cycle = _cycle(_graph(module_level_only=module_level_only))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_belongs_to_a_layer():
    # A new sub-package or top-level module must take its place in LAYERS (or SHARED) first.
    unplaced = sorted(m for m in MODULES if _layer(m) not in LAYERS + SHARED)
    assert not unplaced, f"modules in no layer: {unplaced}; add their sub-package to LAYERS in this test"


def test_each_layer_imports_only_from_the_layers_below_it():
    rank = {layer: k for k, layer in enumerate(LAYERS)}
    upward = []
    for module, path in MODULES.items():
        here = _layer(module)
        for target, line, _ in _imported(module, path):
            there = _layer(target)
            if there in SHARED:
                continue
            if here in SHARED or rank[there] > rank[here]:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line} ({here}) imports {target} ({there})")
    assert not upward, "imports against the layer order " + " <- ".join(LAYERS) + ":\n" + "\n".join(upward)


# --- the map of the tree (docs/contributing.md) -----------------------------------------------------------------------

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
    for directory, subdirs, files in os.walk(str(ROOT)):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        rel = os.path.relpath(directory, ROOT.parent).replace(os.sep, "/") + "/"
        found.update(rel + d + "/" for d in subdirs)
        found.update(rel + f for f in files if f.endswith(".py") and f not in PLUMBING)
    return found


def _summarised(listed: dict[str, str]) -> set[str]:
    """Directories the map describes as a whole: listed, but none of their files are."""
    return {d for d in listed if d.endswith("/") and not any(p != d and p.startswith(d) for p in listed)}


def _pass_modules() -> set[str]:
    from onnx_npu_fix.passes import PASSES

    return {cls.__module__.replace(".", "/") + ".py" for cls in PASSES.values()}


def _named_in(summary: str, relative: str) -> bool:
    """A path inside a summarised directory is covered when its summary names it: the file, or the sub-directory
    it is in (``lowering/``: one module per op, which a new rule adds without touching the map)."""
    directory = relative.split("/")[0] + "/" if "/" in relative else None
    if directory is not None and re.search(r"(?<![\w/])" + re.escape(directory), summary):
        return True
    return os.path.basename(relative) in summary


def test_layout_map_lists_the_package_tree():
    """Every module and sub-package is on the map and everything on the map exists, so the map cannot fall behind
    the tree. A directory the map describes in one line (passes/: "one pass per file") may hold its passes
    unlisted; any other file in it, or the sub-directory it is in, must be named in that line."""
    text = open(ROOT.parent / "docs" / "contributing.md", encoding="utf-8").read()
    listed = _listed(_layout_block(text))
    assert PACKAGE + "/" in listed and "cli.py" not in listed  # the parser saw the package's indentation
    in_package = {p for p in listed if p.startswith(PACKAGE + "/")}
    tree = _tree()
    assert sorted(in_package - tree) == [], "listed in the Layout (docs/contributing.md) but not in the tree"
    passes = _pass_modules()
    unlisted = set()
    for path in tree - in_package:
        summary = next((d for d in _summarised(listed) if path.startswith(d)), None)
        if summary is None or (path not in passes and not _named_in(listed[summary], path[len(summary):])):
            unlisted.add(path)
    assert sorted(unlisted) == [], "in the tree but not in the Layout (docs/contributing.md)"
    others = {p for p in listed if not p.startswith(PACKAGE + "/") and "/" not in p[:-1]}
    assert sorted(p for p in others if not os.path.exists(ROOT.parent / p)) == []


def test_layout_parser_reads_nesting_and_summaries():
    """The parser the test above relies on: indentation makes paths, a file-less directory is a summary."""
    lines = ["pkg/", "  a.py            one", "  sub/              two", "    b.py            three",
             "                    more of three", "  whole/            many files; x.py is the helper", "docs/"]
    listed = _listed(lines)
    assert listed == {"pkg/": "", "pkg/a.py": "one", "pkg/sub/": "two", "pkg/sub/b.py": "three more of three",
                      "pkg/whole/": "many files; x.py is the helper", "docs/": ""}
    assert _summarised(listed) == {"pkg/whole/", "docs/"}


# --- the shape of the code ----------------------------------------------------------------------------------------

MAX_FUNCTION_LINES = 80


def test_no_library_function_is_longer_than_80_lines():
    """A function a reader can hold in view: ``def`` line to last line, docstring included (the house rule; ruff's
    C901 in pyproject bounds the branching)."""
    long = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}: {lines} lines")
    assert long == [], "\n".join(long)
