"""Passes from outside npufix: installed packages, ``--plugin`` specs, and where they go in the order.

Deployment engineers keep vendor-specific rewrites of their own. A plugin pass is a :class:`~.passes.base.Pass`
subclass (or a graphsurgeon function wrapped by :func:`onnx_npu_fix.plugins.graphsurgeon.graphsurgeon_pass`); the pass
manager validates it, rolls it back and reports it exactly like a built-in pass. Two ways in:

- ``--plugin SPEC`` (repeatable): ``package.module:Name``, ``path/to/file.py:Name``, or ``path/to/file.py``
  when the file defines exactly one pass. Such a pass *joins the run*: it goes after the built-in pass it names
  in its ``run_after`` class attribute, else at the end of the order — unless ``--passes`` is given, which then
  decides (see :func:`place`).
- An installed package that declares an entry point in the group ``npufix.passes`` (``name = "module:Name"``).
  Installing a package must not change every run silently, so such a pass only runs when it is named: with
  ``--passes ...,name,...`` or ``--plugin name``. ``npufix --list-passes`` lists it.
  ``NPUFIX_DISABLE_PLUGIN_AUTOLOAD=1`` hides installed plugins altogether (as pytest's variable of that name does).

Every problem with a plugin — a spec that does not import, an object that is not a pass, a name that clashes
with another pass, a constructor that raises (:func:`instantiate`) — is an :class:`InputError` naming the spec
and what to do (exit 2, before any work).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from onnx_npu_fix.errors import InputError, first_line
from onnx_npu_fix.passes import DEFAULT_ORDER, PASSES
from onnx_npu_fix.passes.base import Pass
from onnx_npu_fix.pipeline.scheduler import FOREIGN_FAILURES, failure_text

ENTRY_POINT_GROUP = "npufix.passes"
DISABLE_AUTOLOAD = "NPUFIX_DISABLE_PLUGIN_AUTOLOAD"
_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def installed_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The passes installed packages declare (group ``npufix.passes``), by name; not imported yet."""
    if os.environ.get(DISABLE_AUTOLOAD):
        return {}
    found = importlib.metadata.entry_points()
    group = found.select(group=ENTRY_POINT_GROUP) if hasattr(found, "select") \
        else found.get(ENTRY_POINT_GROUP, ())  # Python 3.9: a dict of groups
    return {ep.name: ep for ep in group}


def load_entry_point(entry: importlib.metadata.EntryPoint) -> type[Pass]:
    origin = f"installed plugin '{entry.name}' ({entry.value})"
    try:
        obj = entry.load()
    except FOREIGN_FAILURES as exc:  # any import-time failure of foreign code means the same to the user
        raise InputError(f"{origin} does not load: {failure_text(exc)}; fix or uninstall that package, "
                         f"or set {DISABLE_AUTOLOAD}=1") from None
    cls = as_pass_class(obj, origin)
    if cls.name != entry.name:
        raise InputError(f"{origin} is registered as '{entry.name}' but its pass is named '{cls.name}'; "
                         f"the entry point name must be the pass name")
    return cls


_ORIGINS: dict[type, str] = {}


def origin_of(cls: type) -> str:
    """Where a plugin pass came from: the ``--plugin`` spec that loaded it, else ``module:Class``."""
    return _ORIGINS.get(cls) or f"{cls.__module__}:{cls.__qualname__}"


def load_spec(spec: str) -> type[Pass]:
    """The pass a ``--plugin`` spec names: ``module:Name``, ``file.py:Name``, ``file.py`` or an installed name."""
    cls = _load_spec(spec.strip())
    _ORIGINS.setdefault(cls, spec.strip())
    return cls


def _load_spec(spec: str) -> type[Pass]:
    installed = installed_entry_points()
    if spec in installed:
        return load_entry_point(installed[spec])
    target, _, attr = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not target:
        raise InputError(f"--plugin '{spec}': expected module:Name, path/to/file.py[:Name] or an installed "
                         f"plugin's name")
    origin = f"--plugin '{spec}'"
    module = _import_file(target, origin) if target.endswith(".py") else _import_module(target, origin)
    if attr:
        if not hasattr(module, attr):
            raise InputError(f"{origin}: {target} defines no '{attr}'")
        return as_pass_class(getattr(module, attr), origin)
    candidates = [obj for obj in vars(module).values()
                  if _is_pass_class(obj) and obj.__module__ == module.__name__]
    if len(candidates) != 1:
        names = ", ".join(sorted(c.__name__ for c in candidates)) or "none"
        raise InputError(f"{origin}: {target} defines {len(candidates)} passes ({names}); name one as "
                         f"{target}:Name")
    return as_pass_class(candidates[0], origin)


def load_all(plugins: Sequence[str | type[Pass]]) -> list[type[Pass]]:
    """``--plugin`` specs loaded (:func:`load_spec` checks what it loads) and pass classes checked, in order."""
    return [as_pass_class(spec, origin_of(spec)) if isinstance(spec, type) else load_spec(spec) for spec in plugins]


def as_pass_class(obj: Any, origin: str) -> type[Pass]:
    """``obj`` checked as a pass class the manager can run; InputError saying what is missing otherwise."""
    if not _is_pass_class(obj):
        kind = type(obj).__name__
        raise InputError(f"{origin} is a {kind}, not a pass: subclass onnx_npu_fix.Pass, or wrap a graphsurgeon "
                         f"function with onnx_npu_fix.plugins.graphsurgeon.graphsurgeon_pass")
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not _NAME.match(name):
        raise InputError(f"{origin}: the pass needs a class attribute name in lower-case-with-dashes "
                         f"(got {name!r})")
    if not isinstance(getattr(obj, "summary", None), str):
        raise InputError(f"{origin}: pass '{name}' needs a class attribute summary (one line)")
    if not isinstance(obj.exact, bool):
        raise InputError(f"{origin}: pass '{name}' has exact={obj.exact!r}; it must be True or False")
    if obj.run is Pass.run:
        raise InputError(f"{origin}: pass '{name}' does not implement run(model, options)")
    run_after = getattr(obj, "run_after", None)
    if run_after is not None and run_after not in PASSES:
        raise InputError(f"{origin}: pass '{name}' has run_after={run_after!r}, which is not a built-in pass "
                         f"({', '.join(PASSES)})")
    return obj


def registry(plugins: Sequence[type[Pass]] = ()) -> dict[str, type[Pass] | importlib.metadata.EntryPoint]:
    """Every pass that can be named: built-in, installed (entry points, loaded when used), and ``plugins``."""
    known: dict[str, type[Pass] | importlib.metadata.EntryPoint] = dict(PASSES)
    for name, entry in installed_entry_points().items():
        if name in PASSES:
            raise InputError(f"installed plugin '{name}' ({entry.value}) clashes with the built-in pass of that "
                             f"name; uninstall it or set {DISABLE_AUTOLOAD}=1")
        known[name] = entry
    for cls in plugins:
        held = known.get(cls.name)
        if held is cls:
            continue
        if cls.name in PASSES:
            raise InputError(f"plugin pass '{cls.name}' ({origin_of(cls)}) clashes with the built-in pass of that "
                             f"name; rename it")
        if isinstance(held, type):
            raise InputError(f"two plugin passes are named '{cls.name}' ({origin_of(held)}, {origin_of(cls)})")
        known[cls.name] = cls  # a --plugin spec wins over an installed entry point of the same name
    return known


def place(only: Sequence[str] | None, skip: Iterable[str], plugins: Sequence[type[Pass]],
          known: Mapping[str, Any]) -> list[type[Pass]]:
    """The run order.

    Built-in passes keep ``DEFAULT_ORDER`` whatever order ``only`` lists them in (their order is a tested
    contract). A pass outside it (an opt-in pass, an installed or a ``--plugin`` pass) goes right after the
    built-in pass that precedes it in ``only``, or first when none does; several such passes after the same
    built-in keep the order they were named in. Without ``only``, the default order runs, and each ``--plugin``
    pass joins it after its ``run_after`` pass (else at the end).
    """
    skip = set(skip)
    if only is None:
        order = [cls for cls in DEFAULT_ORDER if cls.name not in skip]
        for cls in plugins:
            if cls.name in skip:
                continue
            anchor = getattr(cls, "run_after", None)
            at = next((i + 1 for i, c in enumerate(order) if c.name == anchor), len(order))
            order.insert(at, cls)
        return order
    wanted = set(only) - skip
    default_names = {cls.name for cls in DEFAULT_ORDER}
    after: dict[str | None, list[type[Pass]]] = {}
    anchor: str | None = None
    for name in only:
        if name in default_names:
            anchor = name
        elif name in wanted and all(c.name != name for group in after.values() for c in group):
            after.setdefault(anchor, []).append(_load(known[name]))
    order = list(after.get(None, []))
    for cls in DEFAULT_ORDER:
        if cls.name in wanted:
            order.append(cls)
            order.extend(after.get(cls.name, []))
    return order


def instantiate(cls: type[Pass]) -> Pass:
    """An instance of ``cls``; a constructor of plugin code that raises (or calls sys.exit) makes the plugin
    unusable: an InputError naming it (exit 2, before any work), not an internal error."""
    try:
        return cls()
    except FOREIGN_FAILURES as exc:
        if any(cls is builtin for builtin in PASSES.values()):
            raise  # a built-in pass that cannot be built is npufix's bug
        raise InputError(f"{origin_of(cls)}: pass '{cls.name}' cannot be created: {failure_text(exc)}; fix its "
                         f"__init__ (a pass is created without arguments)") from None


def _load(held: type[Pass] | importlib.metadata.EntryPoint) -> type[Pass]:
    return held if isinstance(held, type) else load_entry_point(held)


def _is_pass_class(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, Pass) and obj is not Pass and not inspect.isabstract(obj)


def _import_module(name: str, origin: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise InputError(f"{origin}: no module named '{name}' (install it, or give a path to a .py file)") \
                from None
        raise InputError(f"{origin}: importing {name} fails: {first_line(exc)}") from None
    except FOREIGN_FAILURES as exc:  # foreign code may raise anything at import time, sys.exit() included
        raise InputError(f"{origin}: importing {name} fails: {failure_text(exc)}") from None


def _import_file(path: str, origin: str) -> Any:
    if not os.path.isfile(path):
        raise InputError(f"{origin}: {path}: no such file")
    # One module per absolute path, so two runs in one process (tests, the API) see one set of classes.
    name = "npufix_plugin_" + re.sub(r"\W", "_", os.path.abspath(path))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InputError(f"{origin}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except FOREIGN_FAILURES as exc:  # foreign code may raise anything at import time, sys.exit() included
        del sys.modules[name]
        raise InputError(f"{origin}: importing {path} fails: {failure_text(exc)}") from None
    return module
