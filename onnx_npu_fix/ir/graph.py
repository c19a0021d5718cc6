"""Shared graph helpers over the raw ONNX protobuf, used by every pass.

npufix edits the ``onnx.ModelProto`` directly instead of importing it into onnx-graphsurgeon: a graphsurgeon
round trip costs many times the load+save floor (docs/contributing.md's design notes), and the passes here
only need three maps built once per pass (producer, consumers, constants) plus an editor that rebuilds the node
list once. Every helper is O(size of the graph) at most; nothing walks the graph per match.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import sys
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx_npu_fix.ir import weights
from onnx_npu_fix.ir.ops import DEFAULT_DOMAINS, FLOAT_TYPES, SUBGRAPH_OPS, is_default_domain

Shape = tuple  # a tuple of int (static) / str (symbolic) / None (unknown) per axis



@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off for a bulk build: building maps of 100k fresh lists and wrappers
    triggers full collections that cost a third of the build, and none of it is garbage yet."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# --- attributes -------------------------------------------------------------------------------------


_INT, _FLOAT, _INTS = onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT, onnx.AttributeProto.INTS


def get_attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """The Python value of attribute ``name`` of ``node`` (lists as lists, strings decoded)."""
    for attr in node.attribute:
        if attr.name == name:
            # The common scalar and int-list cases directly: onnx.helper's generic decoder would cost as much as
            # the rest of a pass's per-node work. A reference attribute goes to the helper (it raises).
            kind = attr.type
            if not attr.ref_attr_name:
                if kind == _INT:
                    return attr.i
                if kind == _FLOAT:
                    return attr.f
                if kind == _INTS:
                    return list(attr.ints)
            value = helper.get_attribute_value(attr)
            if isinstance(value, bytes):
                return value.decode()
            if isinstance(value, (list, tuple)):
                return [v.decode() if isinstance(v, bytes) else v for v in value]
            return value
    return default


def set_attr(node: onnx.NodeProto, name: str, value: Any) -> None:
    """Set (or replace) attribute ``name``; ``None`` removes it."""
    for i, attr in enumerate(node.attribute):
        if attr.name == name:
            del node.attribute[i]
            break
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value))


# --- index ------------------------------------------------------------------------------------------


_UNREAD = object()


class GraphIndex:
    """Read-only maps over one graph, built once per pass: producer, consumers, initializers, shapes.

    ``shapes`` comes from the graph's inputs, outputs and value_info, so run :func:`infer_shapes` first
    when intermediate shapes are needed (the pass manager does that before every pass).
    """

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        graph = model.graph
        self.graph = graph
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        # The collector is off for the build: 100k fresh lists and wrappers trigger full collections that
        # cost as much as the build itself, and none of it is garbage yet.
        with paused_gc():
            self._map_edges(graph)
            self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
            self.graph_inputs: list[str] = [i.name for i in graph.input if i.name not in self.initializers]
            # An initializer also listed as a graph input is only a default: the caller may feed another value.
            self.overridable: set[str] = {i.name for i in graph.input if i.name in self.initializers}
            self.graph_outputs: list[str] = [o.name for o in graph.output]
            self.output_set = set(self.graph_outputs)
            # Shapes and types are parsed on first use: most passes ask for a few hundred of 100k tensors.
            self._value_infos: dict[str, onnx.ValueInfoProto] = {}
            for vi in itertools.chain(graph.input, graph.value_info, graph.output):
                self._value_infos[vi.name] = vi
        self._shape_cache: dict[str, Shape | None] = {}
        self._by_type: dict[bytes, Any] = {}  # a serialized TypeProto -> its shape
        self._static: dict[Shape, bool] = {}  # a shape -> whether every dimension is a known integer
        self._names: set[str] | None = None
        self._derived: dict[Callable[[GraphIndex], Any], Any] = {}

    def derived(self, compute: Callable[[GraphIndex], Any]) -> Any:
        """``compute(self)``, computed on the first request and kept: a figure of the whole graph that several
        readers of this index ask for (the cost table and the constraint check both need the constant names).
        Valid as long as the index is; what ``compute`` returns must not be modified by its readers."""
        found = self._derived.get(compute, _UNREAD)
        if found is _UNREAD:
            found = self._derived[compute] = compute(self)
        return found

    @classmethod
    def of(cls, model: onnx.ModelProto) -> GraphIndex:
        """An index of ``model``: the one shared for it (:func:`values_from`: --check's, built already;
        :func:`sharing_index`: the first one built while it is open), else a new one."""
        key = id(model)
        shared = _SHARED_INDEX.get(key)
        if shared is not None and shared.model is model:
            return shared
        index = cls(model)
        if key in _SHARING:
            _SHARED_INDEX[key] = index
        return index

    @classmethod
    def shared(cls, model: onnx.ModelProto) -> GraphIndex | None:
        """:meth:`of` while an index of ``model`` is shared or :func:`sharing_index` is open for it (the index is
        then read by others too), else None: for a walk that reads an index when one is to hand, and the graph
        itself rather than build one nobody else reads."""
        if id(model) in _SHARING:
            return cls.of(model)
        shared = _SHARED_INDEX.get(id(model))
        return shared if shared is not None and shared.model is model else None

    def _map_edges(self, graph: onnx.GraphProto) -> None:
        producer, consumers = self.producer, self.consumers
        get = consumers.get
        nodes = self.nodes = list(graph.node)
        # Each node's fields as read here, kept: the walks over this index (constant names, the cost table's op
        # counts and peak, its users) read these lists instead of the protos again (each read of a field builds
        # a Python object). Slices read each repeated field in one call.
        ops: list[str] = []
        domains: list[str] = []
        node_inputs: list[list[str]] = []
        node_outputs: list[list[str]] = []
        self.ops, self.domains, self.node_inputs, self.node_outputs = ops, domains, node_inputs, node_outputs
        for node in nodes:
            op, domain, inputs, outputs = node.op_type, node.domain, node.input[:], node.output[:]
            ops.append(op)
            domains.append(domain)
            node_inputs.append(inputs)
            node_outputs.append(outputs)
            for out in outputs:
                producer[out] = node
            for inp in inputs:
                users = get(inp)
                if users is None:
                    consumers[inp] = [node]
                else:
                    users.append(node)
            # Subgraph (If/Loop/Scan) bodies may read outer tensors implicitly; count them as consumers so no
            # pass believes such a tensor is unused or single-use. (may_hold_subgraphs on the fields just read.)
            if type_may_hold_subgraphs(op, domain):
                for outer in subgraph_outer_inputs(node):
                    consumers.setdefault(outer, []).append(node)
        # Empty names are absent optional inputs/outputs, not tensors (dropped once here, not tested per edge).
        producer.pop("", None)
        consumers.pop("", None)

    # constants -----------------------------------------------------------------------------------
    def const_value(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is an initializer (not overridable by a graph input) or a Constant.
        A shape-only stub's value comes from the model it was copied from, while :func:`values_from` says so."""
        if name in self.initializers and name not in self.overridable:
            tensor = self.initializers[name]
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                tensor = _VALUE_SOURCES.get(id(self.model), {}).get(name, tensor)
                if weights.is_lazy(tensor):
                    return weights.lazy_array(tensor)
            return numpy_helper.to_array(tensor)
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and is_default_domain(node):
            return constant_node_value(node)
        return None

    def has_value(self, name: str) -> bool:
        """Whether :meth:`const_value` of ``name`` is not None, without decoding an initializer's data."""
        if name in self.initializers:
            return name not in self.overridable
        return self.const_value(name) is not None

    def is_const(self, name: str) -> bool:
        if name in self.initializers and name not in self.overridable:
            return True
        node = self.producer.get(name)
        return node is not None and node.op_type == "Constant"

    def shape(self, name: str) -> Shape | None:
        """Dims of ``name`` (int, symbolic str or None per axis) from initializers and value_info, or None."""
        shape = self._shape_cache.get(name, _UNREAD)
        if shape is not _UNREAD:
            return shape
        init = self.initializers.get(name)
        if init is not None:
            shape = tuple(init.dims[:])
        else:
            vi = self._value_infos.get(name)
            if vi is None:
                shape = None
            else:
                # Read through the type's bytes: most tensors share a few types, and one serialization is
                # cheaper than a dim-by-dim read (every tensor's shape per cost table and check).
                key = vi.type.SerializeToString()
                shape = self._by_type.get(key, _UNREAD)
                if shape is _UNREAD:
                    shape = self._by_type[key] = shape_of_value_info(vi)
        self._shape_cache[name] = shape
        return shape

    def static_shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of ``name`` if every dimension is a known integer, else None."""
        shape = self.shape(name)
        if shape is None:
            return None
        static = self._static.get(shape)  # most tensors share a few shapes: each is tested once
        if static is None:
            static = self._static[shape] = all(isinstance(d, int) for d in shape)
        return shape if static else None

    def elem_type(self, name: str) -> int:
        init = self.initializers.get(name)
        if init is not None:
            return init.data_type
        vi = self._value_infos.get(name)
        return vi.type.tensor_type.elem_type if vi is not None else onnx.TensorProto.UNDEFINED

    def consumers_of(self, name: str) -> list[onnx.NodeProto]:
        return self.consumers.get(name, [])

    def single_consumer(self, name: str) -> onnx.NodeProto | None:
        """The only consumer of ``name`` when it has exactly one and is not a graph output."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.output_set:
            return None
        return users[0]

    def unique_name(self, base: str) -> str:
        """A tensor/node name not used anywhere in the graph, derived from ``base``; reserved on return."""
        if self._names is None:  # built on the first request: many passes never name anything
            # The names no map holds; a tensor name is looked up in the maps themselves, which the index never
            # changes (a union of them would copy every name on the first name a pass asks for).
            names = {n.name for n in self.graph.node}
            names.update(self.graph_inputs)
            names.update(self.graph_outputs)
            self._names = names
        name = base
        counter = itertools.count(1)
        while self._taken(name):
            name = f"{base}_{next(counter)}"
        self._names.add(name)
        return name

    def _taken(self, name: str) -> bool:
        """Whether ``name`` names a tensor or node of the graph, or was handed out by :meth:`unique_name`."""
        assert self._names is not None
        return (name in self._names or name in self.producer or name in self.consumers
                or name in self.initializers)


def shape_of_value_info(vi: onnx.ValueInfoProto) -> Shape | None:
    tensor_type = vi.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    # A non-zero dim_value can only be a set dim_value (the oneof's other member leaves it 0), so the usual
    # all-static shape needs one read per dim; only a 0 needs the oneof told apart (100k shapes per check).
    fields = tensor_type.shape.dim
    values = [dim.dim_value for dim in fields]
    if all(values):
        return tuple(values)
    dims: list[int | str | None] = []
    for dim in fields:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    return None


def may_hold_subgraphs(node: onnx.NodeProto) -> bool:
    """Whether ``node`` can carry graph attributes: control flow and custom-domain ops. A standard op cannot
    (the onnx checker every input model passes rejects attributes outside the op's schema), so at 100k nodes
    the attribute scan is skipped for the ops that make up nearly every graph."""
    # is_default_domain inlined: this runs for every node in most whole-graph scans (600k calls a run at 100k).
    return node.op_type in SUBGRAPH_OPS or node.domain not in DEFAULT_DOMAINS


def type_may_hold_subgraphs(op: str, domain: str) -> bool:
    """:func:`may_hold_subgraphs` of a node given by its op type and domain as read (GraphIndex.ops, domains)."""
    return op in SUBGRAPH_OPS or domain not in DEFAULT_DOMAINS


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The bodies held in ``node``'s attributes (If branches, Loop/Scan bodies)."""
    found: list[onnx.GraphProto] = []
    if not may_hold_subgraphs(node):
        return found
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            found.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            found.extend(attr.graphs)
    return found


def subgraph_outer_inputs(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing scope."""
    outer: set[str] = set()
    if not node.attribute or not may_hold_subgraphs(node):
        return outer
    for g in subgraphs(node):
        local = {i.name for i in g.input} | {t.name for t in g.initializer}
        for sub in g.node:
            local.update(sub.output)
        for sub in g.node:
            outer.update(i for i in sub.input if i and i not in local)
            outer.update(subgraph_outer_inputs(sub) - local)
        outer.update(o.name for o in g.output if o.name not in local)
    return outer


def has_subgraphs(node: onnx.NodeProto) -> bool:
    return bool(subgraphs(node))


def all_known(names: Iterable[str], known: set[str]) -> bool:
    """Whether every non-empty name in ``names`` is in ``known`` (empty names are absent optional inputs).

    A plain loop that stops at the first unknown name: in the per-node scans the first input (the data) usually
    decides, and a generator expression costs more than the test."""
    for name in names:
        if name and name not in known:
            return False
    return True


# --- editing ----------------------------------------------------------------------------------------


class GraphEditor:
    """Collects node replacements and new initializers, then rebuilds ``graph.node`` once.

    New nodes take the position of the node they replace (or sit just after it), so a graph that was
    topologically sorted stays sorted as long as the new nodes only read tensors available at that position.
    """

    def __init__(self, index: GraphIndex) -> None:
        self.index = index
        self._replace: dict[int, list[onnx.NodeProto]] = {}
        self._after: dict[int, list[onnx.NodeProto]] = {}
        self._prepend: list[onnx.NodeProto] = []
        self._new_initializers: list[onnx.TensorProto] = []

    def replace(self, node: onnx.NodeProto, new_nodes: Sequence[onnx.NodeProto]) -> None:
        self._replace[id(node)] = list(new_nodes)

    def remove(self, node: onnx.NodeProto) -> None:
        self._replace[id(node)] = []

    def insert_after(self, node: onnx.NodeProto, new_nodes: Sequence[onnx.NodeProto]) -> None:
        self._after.setdefault(id(node), []).extend(new_nodes)

    def prepend(self, new_nodes: Sequence[onnx.NodeProto]) -> None:
        """Nodes that read only graph inputs or initializers (placed first)."""
        self._prepend.extend(new_nodes)

    def add_initializer(self, base_name: str, value: np.ndarray, *, exact_name: bool = False) -> str:
        """Add a new initializer under a unique name derived from ``base_name`` (or exactly ``base_name``
        when the caller replaces the tensor's producer); return the name."""
        name = base_name if exact_name else self.index.unique_name(base_name)
        self._new_initializers.append(tensor_from_array(value, name))
        return name

    def pending_initializer(self, name: str) -> onnx.TensorProto | None:
        """An initializer added by :meth:`add_initializer` and not committed yet, or None."""
        return next((t for t in self._new_initializers if t.name == name), None)

    def make_node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str,
                  **attrs: Any) -> onnx.NodeProto:
        return helper.make_node(op_type, list(inputs), list(outputs), name=self.index.unique_name(name), **attrs)

    def commit(self) -> None:
        graph = self.index.graph
        if not self._after and not self._prepend and not any(self._replace.values()):
            if self._replace:  # removals only, the common edit: one stable sort, no position map
                _drop_nodes(graph.node, set(self._replace))
        elif self._replace or self._after or self._prepend:
            old = list(graph.node)
            new_nodes: list[onnx.NodeProto] = list(self._prepend)
            for node in old:
                key = id(node)
                new_nodes.extend(self._replace.get(key, (node,)))
                new_nodes.extend(self._after.get(key, ()))
            _reorder(graph.node, old, new_nodes)
        if self._new_initializers:
            graph.initializer.extend(self._new_initializers)
        self._replace.clear()
        self._after.clear()
        self._prepend.clear()
        self._new_initializers.clear()


def _drop_nodes(field: Any, dropped: set[int]) -> None:
    """Remove the nodes whose ids are in ``dropped`` from the repeated node field, keeping the others' order.

    A stable sort moves them to the end without copying a node (see :func:`_reorder`), then they are cut off.
    """
    present = sum(1 for n in field if id(n) in dropped)  # a caller may name a node twice or one not here
    if present:
        field.sort(key=lambda n: id(n) in dropped)
        del field[len(field) - present:]


def _reorder(field: Any, old: list[onnx.NodeProto], wanted: list[onnx.NodeProto]) -> None:
    """Make the repeated node field ``field``, whose elements are ``old``, hold ``wanted`` in that order.

    Nodes of ``old`` that stay are not copied: the new nodes are appended (one copy each, as any insertion
    costs), then a stable sort on the wanted position moves everything into place and the dropped nodes to
    the end, where they are cut off. Rebuilding the field instead copies every node, however few are deleted.
    Wrappers of kept nodes stay attached; those of dropped nodes stay readable.
    """
    old_ids = {id(n) for n in old}
    rank: dict[int, int] = {}  # id of a kept node -> its wanted position
    added: list[tuple[int, onnx.NodeProto]] = []  # (wanted position, node) for nodes copied in
    for i, node in enumerate(wanted):
        key = id(node)
        if key in old_ids and key not in rank:
            rank[key] = i
        else:
            added.append((i, node))  # a new node, or an old one wanted twice
    dropped = len(wanted)  # sorts after every wanted position
    keys = {key: rank.get(key, dropped) for key in old_ids}
    if added:
        field.extend(node for _, node in added)
        copies = field[len(old):]  # the field's own wrappers of the copies, alive while the sort keys them
        for copy, (i, _) in zip(copies, added):
            keys[id(copy)] = i
    field.sort(key=lambda n: keys[id(n)])
    del field[len(wanted):]


# numpy dtypes whose TensorProto is just dims + raw little-endian bytes (numpy_helper.from_array's result for
# them); from_array's generic path costs more per tensor, which adds up over tens of thousands of new biases.
_RAW_TYPES: dict[np.dtype, int] = {np.dtype(t): onnx.helper.np_dtype_to_tensor_dtype(np.dtype(t)) for t in (
    np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.bool_)} if sys.byteorder == "little" else {}


def _native(value: np.ndarray) -> np.ndarray:
    """``value`` as an array in the host's byte order (onnx's converter refuses others)."""
    value = np.asarray(value)
    return value if value.dtype.isnative else value.astype(value.dtype.newbyteorder("="))


def tensor_from_array(value: np.ndarray, name: str) -> onnx.TensorProto:
    """``numpy_helper.from_array(value, name)``, built directly for plain numeric arrays. A 0-d value stays 0-d
    (``np.ascontiguousarray`` would make it [1] and change the shapes downstream)."""
    value = _native(value)
    if not value.flags.c_contiguous:
        value = np.ascontiguousarray(value)
    data_type = _RAW_TYPES.get(value.dtype)
    if data_type is None:
        return numpy_helper.from_array(value, name)
    tensor = onnx.TensorProto(data_type=data_type, dims=value.shape)
    if not weights.spill(tensor, value):
        tensor.raw_data = value.tobytes()
    if name:  # as from_array: an empty name stays unset (proto2 would serialize an explicit "")
        tensor.name = name
    return tensor


def set_initializer(index: GraphIndex, name: str, value: np.ndarray) -> None:
    """Overwrite initializer ``name`` in place (callers make sure nothing else reads the old value)."""
    overwrite_tensor(index.initializers[name], value)


_DATA_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data",
                "external_data", "dims")


def overwrite_tensor(tensor: onnx.TensorProto, value: np.ndarray) -> None:
    """Give ``tensor`` (name kept) the type, dims and data of ``value``, copying the data into the protobuf once:
    a fresh TensorProto plus CopyFrom copies every weight twice more."""
    value = _native(value)
    data_type = _RAW_TYPES.get(value.dtype)
    if data_type is None:  # strings, exotic types, big-endian hosts: the generic converter
        tensor.CopyFrom(tensor_from_array(value, tensor.name))
        return
    # ClearField on every field, repeated ones included: ``del tensor.dims[:]`` would first build a Python wrapper
    # of the field (33k weights per run at 100k nodes).
    for field in _DATA_FIELDS:
        tensor.ClearField(field)
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.data_type = data_type
    tensor.dims.extend(value.shape)
    if not weights.spill(tensor, value):
        tensor.raw_data = value.tobytes()  # C order, whatever the array's strides


def private_initializer(index: GraphIndex, editor: GraphEditor, node: onnx.NodeProto, slot: int,
                        value: np.ndarray) -> None:
    """Give ``node`` input ``slot`` the new constant ``value``.

    Overwrites the initializer in place when ``node`` is its only reader; otherwise adds a fresh initializer,
    so a weight shared with another node is never corrupted.
    """
    name = node.input[slot] if slot < len(node.input) else ""
    readers = index.consumers_of(name) if name else []
    if (name and name in index.initializers and name not in index.overridable
            and len(readers) == 1 and name not in index.output_set):
        set_initializer(index, name, value)
        return
    base = name or f"{node.name}_in{slot}"
    new_name = editor.add_initializer(base, value)
    while len(node.input) <= slot:
        node.input.append("")
    node.input[slot] = new_name


def remove_unused_initializers(graph: onnx.GraphProto) -> list[str]:
    # Initializers that are also graph inputs belong to the model's interface: never removed.
    used: set[str] = {o.name for o in graph.output} | {i.name for i in graph.input}
    update = used.update
    for node in graph.node:
        update(node.input[:])  # a slice: one read of the repeated field
        if may_hold_subgraphs(node):
            update(subgraph_outer_inputs(node))
    return _drop_initializers(graph, used)


def _drop_initializers(graph: onnx.GraphProto, used: set[str], names: list[str] | None = None) -> list[str]:
    """Drop the initializers not in ``used``; ``names``: every initializer's name in order, when read already
    (a read of every name is a walk over the initializers)."""
    if names is None:
        names = [t.name for t in graph.initializer]
    removed = [name for name in names if name not in used]
    if removed:
        # A stable sort moves the unused ones to the end without copying a tensor (a copy of every kept one is
        # the model's size again); then they are cut off.
        graph.initializer.sort(key=lambda t: t.name not in used)
        del graph.initializer[len(graph.initializer) - len(removed):]
    return removed


def remove_dead_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Remove nodes none of whose outputs reaches a graph output; return the removed nodes."""
    nodes, dead, _ = _find_dead(model.graph)
    if not dead:
        return []
    _drop_nodes(model.graph.node, dead)
    return [n for n in nodes if id(n) in dead]


def remove_unused(model: onnx.ModelProto) -> tuple[list[onnx.NodeProto], list[str]]:
    """:func:`remove_dead_nodes` then :func:`remove_unused_initializers`, with one walk over the nodes instead
    of two (each walk touches every node): the tensors the live nodes read are what the dead-node walk
    collects anyway."""
    graph = model.graph
    nodes, dead, needed = _find_dead(graph)
    names = [t.name for t in graph.initializer]  # read once: the test below and the drop
    if "" in names:
        # An unnamed initializer is "used" by any absent optional input, which the walk does not record.
        return remove_dead_nodes(model), remove_unused_initializers(graph)
    if dead:
        _drop_nodes(graph.node, dead)
    needed.update(i.name for i in graph.input)  # the model's interface: never removed
    return [n for n in nodes if id(n) in dead], _drop_initializers(graph, needed, names)


def unused_after(model: onnx.ModelProto, *, gone: Container[int] = frozenset(),
                 bypassed: Container[int] = frozenset(),
                 index: GraphIndex | None = None) -> tuple[list[onnx.NodeProto], list[str]]:
    """Read-only: the nodes and initializers :func:`remove_unused` would drop once the nodes whose ids are in
    ``gone`` are removed (their outputs turned into initializers: they read nothing) and those in ``bypassed``
    are removed with their readers reading their first input instead (a pass-through). Neither kind is in the
    returned nodes. ``index``: one of ``model`` as it is, whose fields the walk reads instead of the nodes'."""
    graph = model.graph
    nodes, dead, needed = _find_dead(graph, gone, bypassed, index)
    needed.update(i.name for i in graph.input)  # the model's interface: never removed
    names = [t.name for t in graph.initializer]  # read once: the test below and the answer
    if "" in names and any(
            not name for n in nodes if id(n) not in dead and id(n) not in gone and id(n) not in bypassed
            for name in n.input):
        needed.add("")  # an unnamed initializer is "used" by any absent optional input (remove_unused)
    return [n for n in nodes if id(n) in dead], [name for name in names if name not in needed]


def drop_nodes(model: onnx.ModelProto, nodes: Iterable[onnx.NodeProto]) -> None:
    """Remove ``nodes`` from the main graph, keeping the others' order (and their wrappers attached)."""
    _drop_nodes(model.graph.node, {id(n) for n in nodes})


def drop_initializers(model: onnx.ModelProto, names: Iterable[str]) -> None:
    """Remove the initializers named ``names`` from the main graph, keeping the others' order."""
    gone = set(names)
    if gone:
        _drop_initializers(model.graph, {t.name for t in model.graph.initializer} - gone)


def _find_dead(graph: onnx.GraphProto, gone: Container[int] = frozenset(),
               bypassed: Container[int] = frozenset(),
               index: GraphIndex | None = None) -> tuple[list[onnx.NodeProto], set[int], set[str]]:
    """The nodes, the ids of those none of whose outputs reaches a graph output, and the names the others
    read (plus the graph outputs); ``gone``, ``bypassed`` and ``index`` as in :func:`unused_after`."""
    needed = {o.name for o in graph.output}
    # Backwards, each node with its fields (inputs, outputs, op type, domain): the index's, else read here
    # (slices: one read of each repeated field).
    if index is not None:
        nodes = index.nodes
        fields: Iterable[tuple[list[str], list[str], str, str]] = zip(
            reversed(index.node_inputs), reversed(index.node_outputs), reversed(index.ops), reversed(index.domains))
    else:
        nodes = list(graph.node)
        fields = ((n.input[:], n.output[:], n.op_type, n.domain) for n in reversed(nodes))
    dead: set[int] = set()
    update = needed.update
    for node, (inputs, outputs, op, domain) in zip(reversed(nodes), fields):
        key = id(node)
        if key in gone:
            continue
        if needed.isdisjoint(outputs):  # "" is never in needed: an absent output reaches nothing
            if key not in bypassed:
                dead.add(key)
            continue
        if key in bypassed:
            needed.add(inputs[0])
            continue
        update(inputs)
        needed.discard("")  # an absent optional input
        if type_may_hold_subgraphs(op, domain):
            update(subgraph_outer_inputs(node))
    return nodes, dead, needed


def name_unnamed_nodes(graph: onnx.GraphProto) -> int:
    """Give every unnamed node, and every repeat of a name, a unique name (``<op>_<n>``) so reports can point
    at it (onnxruntime also refuses duplicate node names). Returns the count of renamed nodes."""
    names = [node.name for node in graph.node]
    used = set(names)
    if "" not in used and len(used) == len(names):
        return 0  # the usual case: every node named once; one read of each name, no per-node writes
    used = set()
    for node in graph.node:
        if node.name and node.name not in used:
            used.add(node.name)
        elif node.name:
            node.name = ""  # a repeat: renamed below
    count = 0
    for i, node in enumerate(graph.node):
        if node.name:
            continue
        base = f"{node.op_type}_{i}"
        name = base
        suffix = itertools.count(1)
        while name in used:
            name = f"{base}_{next(suffix)}"
        used.add(name)
        node.name = name
        count += 1
    return count


# --- shapes -----------------------------------------------------------------------------------------


def infer_shapes(model: onnx.ModelProto, *, light: bool = False) -> None:
    """Refresh ``graph.value_info`` (and output shapes that were unknown) with onnx shape inference.

    Inference runs on a light copy whose large initializers carry dims but no data (only small constants feed
    shape computations), so this costs little on a 100 MB model and works on models above 2 GB.
    ``light``: ``model`` is such a copy already (:func:`shape_only_copy`): inference then reads a plain copy of it
    without its value_info, what a second shape-only copy would hold, without its per-initializer work.
    Raises onnx's InferenceError on an inconsistent graph.
    """
    if light:
        light_copy = onnx.ModelProto()
        light_copy.CopyFrom(model)
        light_copy.graph.ClearField("value_info")
    else:
        light_copy = shape_only_copy(model)
    # onnx's inference gets the copy's bytes and the copy goes first: its nodes are not in memory while onnx
    # holds its own (one graph's nodes fewer at the peak).
    data = light_copy.SerializeToString()
    del light_copy
    inferred = onnx.shape_inference.infer_shapes(data, check_type=True, strict_mode=True, data_prop=True)
    del data
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    by_name = {o.name: o for o in inferred.graph.output}
    for out in model.graph.output:
        new = by_name.get(out.name)
        if new is not None and new.type.tensor_type.HasField("shape"):
            # Only fill in what was unknown or symbolic: a declared static shape is the user's interface.
            old = shape_of_value_info(out)
            if old is None or not all(isinstance(d, int) for d in old):
                out.type.CopyFrom(new.type)


def keep_inferred_shapes(graph: onnx.GraphProto) -> bool:
    """After a pass that keeps every surviving tensor's shape (``Pass.keeps_shapes``): drop the value_info of
    tensors that no longer exist and say whether every node output still has its shape on record — if so, the
    shapes need no fresh inference (an onnx pass over the whole graph)."""
    recorded = [vi.name for vi in graph.value_info]  # each name read once (100k at 100k nodes)
    described = set(recorded)
    described.update(o.name for o in graph.output)
    produced: set[str] = set()
    update = produced.update
    for node in graph.node:
        update(node.output[:])  # a slice: one read of the repeated field
    produced.discard("")
    if not produced <= described:
        return False
    if not produced.issuperset(recorded):
        kept = [vi for vi, name in zip(graph.value_info, recorded) if name in produced]
        del graph.value_info[:]
        graph.value_info.extend(kept)
    return True


_LIGHT_LIMIT = 1024  # elements; initializers above this are replaced by data-less stand-ins for inference
# Floating-point initializers feed shape computations only as Resize/Upsample scales or Range bounds (a handful of
# values); larger ones are weights, stubbed too: 33k 576-element conv weights are most of a 100k-node chain.
_LIGHT_FLOAT_LIMIT = 64


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A full, independent copy of ``model`` (weights included): for work that must leave the original as it
    is. For shapes and structure only, :func:`shape_only_copy` is far cheaper."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


_VALUE_SOURCES: dict[int, dict[str, onnx.TensorProto]] = {}
"""Per shape-only copy (by id) while :func:`values_from` is open: the original initializers its stubs stand for."""
_SHARED_INDEX: dict[int, GraphIndex] = {}
"""Per model (by id) while :func:`values_from` or :func:`sharing_index` is open: the index GraphIndex.of answers."""
_SHARING: set[int] = set()
"""The models (by id) :func:`sharing_index` is open for."""


class SharedIndex:
    """What :func:`sharing_index` yields: once it is closed, the index it shared (None if nobody asked for one)."""

    index: GraphIndex | None = None


@contextlib.contextmanager
def sharing_index(model: onnx.ModelProto, index: GraphIndex | None = None) -> Iterator[SharedIndex]:
    """While open, :meth:`GraphIndex.of` of ``model`` answers one index: ``index`` (of ``model`` as it is, built
    already), else the first one it builds. For read-only callers on a model nothing changes meanwhile (the
    passes' finds, the pass manager's: scheduler._Run); the index is handed on (``SharedIndex.index``) for the
    next of them while the model stays as it is: each walk over the graph that an index serves is then one."""
    key = id(model)
    if key in _SHARING or key in _SHARED_INDEX:
        yield SharedIndex()  # already shared by an outer caller: it keeps the index
        return
    shared = SharedIndex()
    _SHARING.add(key)
    if index is not None and index.model is model:
        _SHARED_INDEX[key] = index
    try:
        yield shared
    finally:
        _SHARING.discard(key)
        found = _SHARED_INDEX.pop(key, None)
        shared.index = found if found is not None and found.model is model else None


@contextlib.contextmanager
def values_from(light: onnx.ModelProto, model: onnx.ModelProto, index: GraphIndex | None = None) -> Iterator[None]:
    """While open, :meth:`GraphIndex.const_value` over ``light`` (a :func:`shape_only_copy` of ``model``) decodes
    a stub's value from ``model``'s initializer of the same name: a read-only look at values (a pass's find) then
    needs no second, full copy of the weights. ``index`` (of ``light``, which must not change meanwhile) is
    what :meth:`GraphIndex.of` answers for ``light``."""
    _VALUE_SOURCES[id(light)] = {t.name: t for t in model.graph.initializer}
    if index is not None:
        _SHARED_INDEX[id(light)] = index
    try:
        yield
    finally:
        del _VALUE_SOURCES[id(light)]
        _SHARED_INDEX.pop(id(light), None)


def shape_only_copy(model: onnx.ModelProto, *, keep_value_info: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers above ``_LIGHT_LIMIT`` elements (``_LIGHT_FLOAT_LIMIT`` for floating
    point) carry dims but no data.

    For shape inference and read-only analysis: cheap on a 100 MB model, possible above 2 GB. Sized by element
    count, not ByteSize (a 5000-character name must not turn a 3-element shape constant into a stub).
    """
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    if keep_value_info:
        graph.value_info.extend(model.graph.value_info)
    graph.sparse_initializer.extend(model.graph.sparse_initializer)
    # Stubs are made in place from one template (a constructor with keywords and an append, which copies, costs
    # more per initializer); each field is read once.
    template = onnx.TensorProto(data_location=onnx.TensorProto.EXTERNAL)
    template.external_data.add(key="location", value="__npufix_shape_only__")
    add_stub, append = graph.initializer.add, graph.initializer.append
    for t in model.graph.initializer:
        dims = t.dims[:]
        numel = math.prod(dims)
        data_type = t.data_type
        if (numel > _LIGHT_LIMIT or (numel > _LIGHT_FLOAT_LIMIT and data_type in FLOAT_TYPES)
                or t.data_location == onnx.TensorProto.EXTERNAL):
            stub = add_stub()
            stub.CopyFrom(template)
            stub.name = t.name
            stub.data_type = data_type
            stub.dims.extend(dims)
        else:
            append(t)
    return light


def _numel(t: onnx.TensorProto) -> int:
    return math.prod(t.dims)


TWO_GB = 2**31 - 1  # protobuf's limit: larger models cannot be serialized as one message


def approx_model_bytes(model: onnx.ModelProto) -> int:
    """Serialized size, estimated from the initializers' payload without encoding the model.

    ``ModelProto.ByteSize()`` encodes the whole message (every weight copied) and raises above 2 GB with
    protobuf's upb backend, so size checks use this instead.
    """
    total = 16 * len(model.graph.node)
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            total += payload_bytes(t)
        elif weights.is_lazy(t):  # serialized with its bytes inline (io.serialize), as the model read eagerly
            total += weights.needed_bytes(t)
    return total


def payload_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes of ``tensor``'s data, from its dims when it is raw (reading ``raw_data`` copies the bytes, however
    large); at most twice the truth for packed 4-bit types, which is fine for a size check."""
    if weights.is_lazy(tensor):
        return weights.needed_bytes(tensor)
    if tensor.HasField("raw_data"):
        itemsize = _ITEMSIZE.get(tensor.data_type)
        if itemsize is None:
            try:
                itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
            except (KeyError, TypeError, ValueError):
                return len(tensor.raw_data)
            _ITEMSIZE[tensor.data_type] = itemsize
        return math.prod(tensor.dims[:]) * itemsize  # a slice: one read of the repeated field
    return tensor.ByteSize()


_ITEMSIZE: dict[int, int] = {}
"""Bytes per element by TensorProto data type, as payload_bytes first found them (the dtype lookup is most of
its cost per tensor, 300k tensors per run at 100k nodes)."""


def set_input_shapes(model: onnx.ModelProto, shapes: dict[str, Sequence[int]]) -> None:
    """Freeze graph input shapes (like onnxsim's --overwrite-input-shape). Unknown names raise KeyError. The name
    ``""`` (onnxsim's nameless form, ``--input-shape 1,3,224,224``) is the model's one input that is not an
    initializer; with several, KeyError("")."""
    by_name = {i.name: i for i in model.graph.input}
    if "" in shapes and "" not in by_name:
        fed = feedable_inputs(model)
        if len(fed) != 1:
            raise KeyError("")
        shapes = {(fed[0] if name == "" else name): dims for name, dims in shapes.items()}
    for name, dims in shapes.items():
        if name not in by_name:
            raise KeyError(name)
        shape = by_name[name].type.tensor_type.shape
        del shape.dim[:]
        for d in dims:
            shape.dim.add().dim_value = int(d)


def clear_negative_dims(graph: onnx.GraphProto) -> int:
    """Make every declared dimension below 0 (Paddle2ONNX writes ``dim_value: -1`` for "any size") an unknown
    one, in the graph's inputs and outputs: that is what it means, and strict shape inference otherwise refuses
    the model once a real size meets it ("differ in dimension 0: (1) vs (-1)"). The value_info needs nothing:
    :func:`infer_shapes` never shows it to onnx and replaces it (scanning it is a walk over every tensor). Returns
    how many were cleared."""
    cleared = 0
    for vi in (*graph.input, *graph.output):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value < 0:
                dim.Clear()
                cleared += 1
    return cleared


def feedable_inputs(model: onnx.ModelProto) -> list[str]:
    """The graph inputs a caller must feed: those that are not initializers (an initializer-backed input is a
    default)."""
    inits = {t.name for t in model.graph.initializer}
    return [vi.name for vi in model.graph.input if vi.name not in inits]


def dynamic_inputs(model: onnx.ModelProto) -> dict[str, Shape | None]:
    """Graph inputs (not initializers) whose shape is unknown or has a non-integer dimension."""
    inits = {t.name for t in model.graph.initializer}
    found: dict[str, Shape | None] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = shape_of_value_info(vi)
        if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
            found[vi.name] = shape
    return found


def format_shape(shape: Shape | None) -> str:
    if shape is None:
        return "?"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def format_bytes(n: int | None) -> str:
    """'412.0 KiB', '3.2 MiB', '96 B' (binary units)."""
    if n is None:
        return "?"
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


# --- measures ---------------------------------------------------------------------------------------


def conv_macs(model: onnx.ModelProto, index: GraphIndex | None = None) -> int:
    """Multiply-accumulates of every Conv and ConvTranspose with known shapes (run infer_shapes first)."""
    index = index or GraphIndex(model)
    total = 0
    for node in model.graph.node:
        total += node_macs(index, node)
    return total


def node_macs(index: GraphIndex, node: onnx.NodeProto) -> int:
    return macs_of(index, node.op_type, node.input[:], node.output[:])


def macs_of(index: GraphIndex, op: str, inputs: list[str], outputs: list[str]) -> int:
    """:func:`node_macs` of a node given by its op type, inputs and outputs as read (GraphIndex.ops...)."""
    if op not in ("Conv", "ConvTranspose") or len(inputs) < 2:
        return 0
    w_shape = index.static_shape(inputs[1])
    if op == "Conv":
        out_shape = index.static_shape(outputs[0])
        if w_shape is None or out_shape is None:
            return 0
        # every output element takes (C_in / group) * prod(kernel) MACs; W is [M, C/group, k...]. math.prod on
        # the int tuples: np.prod's array round trip per call adds up over every conv of the cost table.
        return math.prod(out_shape) * math.prod(w_shape[1:])
    in_shape = index.static_shape(inputs[0])
    if w_shape is None or in_shape is None:
        return 0
    # ConvTranspose: every input element scatters into (M / group) * prod(kernel) outputs; W is [C, M/group, k...]
    return math.prod(in_shape) * math.prod(w_shape[1:])


def opset_version(model: onnx.ModelProto, domain: str = "") -> int:
    for op in model.opset_import:
        if op.domain == domain or (domain == "" and op.domain in DEFAULT_DOMAINS):
            return op.version
    return 0


# --- convolution attributes -------------------------------------------------------------------------


class ConvGeometry:
    """Conv / ConvTranspose / pooling attributes with defaults filled in and ``auto_pad`` resolved.

    ``pads`` is always explicit ``[begin_0, ..., begin_n, end_0, ..., end_n]``. Resolving SAME_* needs the
    static input spatial shape (Conv: total pad = max(0, (ceil(L/s) - 1)*s + (K-1)*d + 1 - L), SAME_UPPER puts
    the odd unit at the end, SAME_LOWER at the beginning — the ONNX spec); ``resolved`` is False when it could
    not be resolved.
    """

    def __init__(self, node: onnx.NodeProto, kernel_shape: Sequence[int] | None,
                 input_spatial: Sequence[int] | None = None) -> None:
        kernel = get_attr(node, "kernel_shape") or (list(kernel_shape) if kernel_shape is not None else None)
        if kernel is None:
            raise ValueError(f"{node.name}: kernel shape unknown")
        n = len(kernel)
        self.kernel: list[int] = list(kernel)
        self.strides: list[int] = list(get_attr(node, "strides") or [1] * n)
        self.dilations: list[int] = list(get_attr(node, "dilations") or [1] * n)
        self.group: int = int(get_attr(node, "group", 1))
        self.auto_pad: str = get_attr(node, "auto_pad", "NOTSET") or "NOTSET"
        self.pads: list[int] = list(get_attr(node, "pads") or [0] * (2 * n))
        self.resolved = True
        if self.auto_pad == "VALID":
            self.pads = [0] * (2 * n)
        elif self.auto_pad in ("SAME_UPPER", "SAME_LOWER") and node.op_type != "ConvTranspose":
            if input_spatial is None or not all(isinstance(v, int) for v in input_spatial):
                self.resolved = False
            else:
                begins, ends = [], []
                for length, k, s, d in zip(input_spatial, self.kernel, self.strides, self.dilations):
                    out = -(-length // s)
                    total = max(0, (out - 1) * s + (k - 1) * d + 1 - length)
                    small, big = total // 2, total - total // 2
                    if self.auto_pad == "SAME_UPPER":
                        begins.append(small)
                        ends.append(big)
                    else:
                        begins.append(big)
                        ends.append(small)
                self.pads = begins + ends
        elif self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            self.resolved = False

    @property
    def rank(self) -> int:
        return len(self.kernel)

    def pad_pair(self, axis: int) -> tuple[int, int]:
        return self.pads[axis], self.pads[axis + self.rank]

    def output_length(self, axis: int, length: int) -> int:
        """Conv output length on spatial ``axis`` (floor mode)."""
        begin, end = self.pad_pair(axis)
        effective = (self.kernel[axis] - 1) * self.dilations[axis] + 1
        return (length + begin + end - effective) // self.strides[axis] + 1


def conv_geometry(index: GraphIndex, node: onnx.NodeProto) -> ConvGeometry:
    """ConvGeometry of a Conv/ConvTranspose using its weight shape and the input shape from ``index``."""
    w_shape = index.shape(node.input[1]) if len(node.input) > 1 else None
    kernel = list(w_shape[2:]) if w_shape is not None else None
    in_shape = index.shape(node.input[0])
    spatial = list(in_shape[2:]) if in_shape is not None else None
    return ConvGeometry(node, kernel, spatial)
