"""Write a plugin pass as a function over an onnx-graphsurgeon graph.

    import onnx_graphsurgeon as gs
    from onnx_npu_fix.plugins.graphsurgeon import graphsurgeon_pass

    @graphsurgeon_pass(name="decompose-hardswish", summary="HardSwish -> x * HardSigmoid(x)", exact=True)
    def decompose_hardswish(graph: gs.Graph, options) -> None:
        for node in graph.nodes: ...

onnx-graphsurgeon is the graph API these users already write, so the adapter does the rest: it imports the model
into a ``gs.Graph``, calls the function, runs ``graph.cleanup().toposort()``, exports, and puts the result back
into the model the pass manager holds — which then validates, rolls back and reports it like any built-in pass.
The function may return the :class:`~.passes.base.Change` records it wants reported; otherwise the adapter
reports the nodes that were removed and added (a node whose attributes changed counts as both), and the
initializers whose values changed. A function that changes nothing leaves the model untouched ("no change").

Cost: an import/export round trip costs many times a load and save (docs/contributing.md), which is why the
built-in passes edit the protobuf directly; for a plugin that runs once per build it is a fair price.
onnx-graphsurgeon is an optional extra (``graphsurgeon``; from a checkout: ``pip install '.[graphsurgeon]'``).
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import onnx

from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.ir.graph import name_unnamed_nodes
from onnx_npu_fix.ir.ops import is_default_domain
from onnx_npu_fix.passes.base import Change, Pass, PassResult

GraphFunction = Callable[[Any, FixOptions], "Iterable[Change] | None"]


def import_graphsurgeon() -> Any:
    try:
        import onnx_graphsurgeon
    except ImportError:
        raise InputError("this plugin pass needs onnx-graphsurgeon: pip install onnx-graphsurgeon (in a checkout of "
                         "npufix: pip install '.[graphsurgeon]')") from None
    return onnx_graphsurgeon


def graphsurgeon_pass(*, name: str, summary: str, exact: bool = True,
                      run_after: str | None = None) -> Callable[[GraphFunction], type[Pass]]:
    """Turn ``fn(graph: gs.Graph, options: FixOptions)`` into a pass class (see the module docstring)."""

    def wrap(fn: GraphFunction) -> type[Pass]:
        attrs = {"name": name, "summary": summary, "exact": exact, "run_after": run_after,
                 "function": staticmethod(fn), "run": _run, "__doc__": fn.__doc__, "__module__": fn.__module__}
        return type(fn.__name__, (Pass,), attrs)

    return wrap


def _run(self: Pass, model: onnx.ModelProto, options: FixOptions) -> PassResult:
    gs = import_graphsurgeon()
    before_nodes = _node_signatures(model.graph)
    before_weights = _initializer_digests(model.graph)
    graph = gs.import_onnx(model)
    returned = self.function(graph, options)
    graph.cleanup().toposort()
    exported = gs.export_onnx(graph, do_type_check=False)
    removed = before_nodes - _node_signatures(exported.graph)
    added = _node_signatures(exported.graph) - before_nodes
    after_weights = _initializer_digests(exported.graph)
    rewritten = sorted(n for n, digest in after_weights.items() if before_weights.get(n, digest) != digest)
    if not (removed or added or rewritten or set(before_weights) != set(after_weights)):
        return PassResult()
    _put_back(model, exported)
    name_unnamed_nodes(model.graph)
    changes = list(returned or ())
    if not changes:
        changes = [Change(*_who(sig), "removed") for sig in sorted(removed.elements())]
        changes += [Change(*_who(sig), "added") for sig in sorted(added.elements())]
        changes += [Change(n, "initializer", "rewritten") for n in rewritten]
    for change in changes:
        if not isinstance(change, Change):
            raise TypeError(f"{self.name} returned {type(change).__name__}; return Change records or None")
    return PassResult(changes=changes)


def _put_back(model: onnx.ModelProto, exported: onnx.ModelProto) -> None:
    """The exported graph replaces the model's; opsets merge (an op a function added may need a domain)."""
    model.graph.CopyFrom(exported.graph)
    have = {o.domain: o for o in model.opset_import}
    for opset in exported.opset_import:
        held = have.get(opset.domain)
        if held is None:
            model.opset_import.add().CopyFrom(opset)
        elif opset.version > held.version and not is_default_domain(opset):
            held.version = opset.version


def _node_signatures(graph: onnx.GraphProto) -> collections.Counter:
    """Each node as (name, op, its serialized bytes): a multiset, so reordering alone is no change."""
    return collections.Counter((n.name, n.op_type, n.SerializeToString(deterministic=True)) for n in graph.node)


def _who(signature: tuple[str, str, bytes]) -> tuple[str, str]:
    return signature[0], signature[1]


def _initializer_digests(graph: onnx.GraphProto) -> dict[str, str]:
    return {t.name: hashlib.sha1(t.SerializeToString(deterministic=True)).hexdigest() for t in graph.initializer}
