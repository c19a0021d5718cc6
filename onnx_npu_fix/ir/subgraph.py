"""Splicing a subgraph (an If branch, a Loop body) into its enclosing graph, and tracing where a value comes from.

A subgraph reads three kinds of names: its own inputs (Loop: iteration number, condition, carried values), its own
tensors (node outputs, initializers) and, implicitly, tensors of the enclosing scopes (by name). Splicing it
into the enclosing graph means:

  * its inputs are *bound* to enclosing names (``bindings``);
  * its own tensors get names unique in the whole model (kept when already unique, else derived from ``prefix``,
    the name of the node being replaced), and its initializers move to the enclosing graph;
  * enclosing-scope names stay as they are (the enclosing graph defines them);
  * an ``Identity`` inside it becomes an alias (its readers read its input) instead of a node;
  * the producer of each subgraph output may take a name chosen by the caller (``targets``: the If's outputs,
    so graph output names never change); the caller aliases the outputs it could not place (a subgraph output
    that is an enclosing name or an initializer, or one tensor behind two outputs).

Nested subgraphs of spliced nodes are copied with their references to renamed tensors rewritten (names they
define themselves shadow the enclosing ones). Nothing here evaluates anything: the result is exact by
construction, the pass manager still validates it.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import onnx

from onnx_npu_fix.ir.graph import GraphIndex, subgraphs
from onnx_npu_fix.ir.ops import is_default_domain


@dataclass
class Spliced:
    """A subgraph's nodes and initializers renamed for the enclosing graph."""

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    """The enclosing-scope name holding each subgraph output (its target name when it could take it)."""


class ModelNames:
    """Every tensor and node name defined anywhere in a model (all scopes), to hand out unique ones."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.defined: Counter[str] = Counter()
        self.node_names: Counter[str] = Counter()
        for i in model.graph.input:
            self.defined[i.name] += 1
        self._count(model.graph)

    def _count(self, graph: onnx.GraphProto) -> None:
        for t in graph.initializer:
            self.defined[t.name] += 1
        for node in graph.node:
            self.node_names[node.name] += 1
            for out in node.output:
                if out:
                    self.defined[out] += 1
            for g in subgraphs(node):
                for i in g.input:
                    self.defined[i.name] += 1
                self._count(g)

    def tensor(self, preferred: str, derived: str) -> str:
        """``preferred`` when no other definition uses it, else a fresh name from ``derived``; reserved."""
        return self._pick(self.defined, preferred, derived)

    def node(self, preferred: str, derived: str) -> str:
        return self._pick(self.node_names, preferred, derived)

    @staticmethod
    def _pick(counts: Counter[str], preferred: str, derived: str) -> str:
        # ``preferred`` is always a name the subgraph being spliced defines; defined nowhere else, it is free
        # (the subgraph disappears with its node).
        if preferred and counts[preferred] <= 1:
            counts[preferred] = 2  # reserved: a second request for it gets a derived name
            return preferred
        name, counter = derived, itertools.count(1)
        while counts[name]:
            name = f"{derived}_{next(counter)}"
        counts[name] = 2
        return name


def splice(body: onnx.GraphProto, bindings: dict[str, str], names: ModelNames, prefix: str, *,
           targets: Sequence[str | None] = (), keep_names: bool = True) -> Spliced:
    """``body``'s nodes renamed for the enclosing graph (see the module docstring).

    ``bindings``: body input name -> enclosing name. ``targets[k]``: the name output ``k``'s producer should
    write (None: any). ``keep_names``: keep a body tensor's own name when it is unique in the model (an If
    branch, spliced once); False derives every name from ``prefix`` (a Loop body, spliced once per iteration).
    """
    names_of = _SpliceNames(body, bindings, names, prefix, keep_names)
    outputs: list[str | None] = []
    for k, out in enumerate(body.output):
        src = names_of.source(out.name)
        target = targets[k] if k < len(targets) else None
        if target and src in names_of.emitted_outputs and src not in names_of.rename:
            names_of.rename[src] = target
            outputs.append(target)
        else:
            outputs.append(None)
    result = Spliced()
    for tensor in body.initializer:
        moved = onnx.TensorProto()
        moved.CopyFrom(tensor)
        moved.name = names_of.fresh(tensor.name)
        result.initializers.append(moved)
    for i, node in enumerate(body.node):
        if node.output and node.output[0] in names_of.alias:
            continue  # an Identity: its readers read its input
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.name = names.node(node.name if keep_names else "", f"{prefix}/{node.name or node.op_type + str(i)}")
        for j, name in enumerate(new.input):
            new.input[j] = names_of.resolve(name)
        for j, name in enumerate(new.output):
            new.output[j] = names_of.fresh(name) if name else name
        for g in subgraphs(new):
            rename_references(g, names_of.resolve)
        result.nodes.append(new)
    result.outputs = [placed if placed is not None else names_of.resolve(out.name)
                      for placed, out in zip(outputs, body.output)]
    return result


class _SpliceNames:
    """What a name of the spliced ``body`` becomes in the enclosing graph. An Identity's output is its input
    (``alias``); a tensor the body defines gets a fresh name (its own when ``keep_names`` and unique in the
    model), a body input its binding, and an enclosing-scope name stays."""

    def __init__(self, body: onnx.GraphProto, bindings: dict[str, str], names: ModelNames, prefix: str,
                 keep_names: bool) -> None:
        self.bindings, self.names, self.prefix, self.keep_names = bindings, names, prefix, keep_names
        self.alias: dict[str, str] = {}
        for node in body.node:
            if node.op_type == "Identity" and is_default_domain(node) and node.input and node.input[0]:
                self.alias[node.output[0]] = node.input[0]
        self.emitted_outputs = {o for n in body.node if n.output and n.output[0] not in self.alias
                                for o in n.output if o}
        self.local_inits = {t.name for t in body.initializer}
        self.rename: dict[str, str] = {}

    def source(self, name: str) -> str:
        while name in self.alias:
            name = self.alias[name]
        return name

    def fresh(self, name: str) -> str:
        new = self.rename.get(name)
        if new is None:
            derived = f"{self.prefix}/{name}"
            new = self.names.tensor(name, derived) if self.keep_names else self.names.tensor("", derived)
            self.rename[name] = new
        return new

    def resolve(self, name: str) -> str:
        if not name:
            return name
        name = self.source(name)
        if name in self.bindings:
            return self.bindings[name]
        if name in self.emitted_outputs or name in self.local_inits:
            return self.fresh(name)
        return name  # an enclosing-scope tensor: the enclosing graph defines it under this name


def rename_references(graph: onnx.GraphProto, resolve: Callable[[str], str]) -> None:
    """Rewrite, in place, every name ``graph`` (and its nested subgraphs) reads from enclosing scopes through
    ``resolve``; names a scope defines itself shadow the enclosing ones and are left alone."""
    local = {i.name for i in graph.input}
    local.update(t.name for t in graph.initializer)
    for node in graph.node:
        local.update(o for o in node.output if o)
    for node in graph.node:
        for j, name in enumerate(node.input):
            if name and name not in local:
                node.input[j] = resolve(name)
        for g in subgraphs(node):
            rename_references(g, lambda n, _local=frozenset(local): n if n in _local else resolve(n))
    for out in graph.output:
        if out.name not in local:
            out.name = resolve(out.name)


def rename_in_graph(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Readers of ``mapping``'s keys read its values instead: node inputs of ``graph`` and names its subgraphs
    read from it. Graph outputs are not renamed (their names are the model's interface)."""
    if not mapping:
        return

    def resolve(name: str) -> str:
        while name in mapping:
            name = mapping[name]
        return name

    for node in graph.node:
        for j, name in enumerate(node.input):
            if name in mapping:
                node.input[j] = resolve(name)
        for g in subgraphs(node):
            rename_references(g, resolve)


# --- where a value comes from -------------------------------------------------------------------------

_SHAPE_OPS = frozenset({"Shape", "Size"})
_TRACE_LIMIT = 512  # nodes visited: a condition is a short chain from an input; the bound keeps checks linear


@dataclass
class Origin:
    """The graph inputs a tensor's value depends on: by value, and only through their shape."""

    values: list[str] = field(default_factory=list)
    shapes: list[str] = field(default_factory=list)
    other: bool = False
    """Depends on something else that is not constant (an op output npufix cannot see through)."""

    @property
    def constant_only(self) -> bool:
        """Computed from constants alone (nothing but folding stands between it and a constant)."""
        return not (self.values or self.shapes or self.other)

    def hint(self) -> str:
        """What would make the value constant, for a message ('' when nothing npufix offers)."""
        parts = [f"--freeze-input {n}=<value>" for n in self.values]
        parts += [f"--input-shape {n}:<dims>" for n in self.shapes]
        return " and ".join(parts)


def trace_origin(index: GraphIndex, name: str) -> Origin:
    """Walk producers back from ``name`` to the graph inputs its value depends on (see :class:`Origin`).
    A Shape/Size of a tensor depends only on that tensor's shape: a static one makes it a constant."""
    origin = Origin()
    inputs = set(index.graph_inputs) | index.overridable
    seen: set[tuple[str, bool]] = set()
    stack = [(name, False)]
    while stack and len(seen) < _TRACE_LIMIT:
        tensor, via_shape = stack.pop()
        if not tensor or (tensor, via_shape) in seen or (not via_shape and index.is_const(tensor)):
            continue
        seen.add((tensor, via_shape))
        if tensor in inputs:
            bucket = origin.shapes if via_shape else origin.values
            if tensor not in bucket:
                bucket.append(tensor)
            continue
        producer = index.producer.get(tensor)
        if producer is None:
            origin.other = True
            continue
        if producer.op_type in _SHAPE_OPS:
            if index.static_shape(producer.input[0]) is None:
                stack.append((producer.input[0], True))
            continue
        if not any(producer.input):  # a random op (or one with no inputs that is not Constant): not foldable
            origin.other = True
            continue
        if via_shape:
            # The shape of a computed tensor: static once its own inputs' shapes are (roughly); follow them.
            stack.extend((i, True) for i in producer.input if i and not index.is_const(i))
            continue
        stack.extend((i, False) for i in producer.input if i)
    return origin
