"""Tests for the shared graph helpers whose fast paths avoid copying nodes (graph.py)."""

from __future__ import annotations

import numpy as np
import onnx
from helpers import small_model
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix.ir.graph import (
    GraphEditor,
    GraphIndex,
    name_unnamed_nodes,
    remove_dead_nodes,
    remove_unused,
    remove_unused_initializers,
    sharing_index,
    tensor_from_array,
    unused_after,
)


def _chain(n: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"r{i}") for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1])])
    return helper.make_model(graph)


def _names(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node]


def test_editor_commit_orders_replacements_insertions_and_removals():
    model = _chain(5)
    index = GraphIndex(model)
    editor = GraphEditor(index)
    r = list(model.graph.node)
    editor.remove(r[1])
    editor.replace(r[2], [helper.make_node("Neg", ["t2"], ["a"], name="n2"),
                          helper.make_node("Neg", ["a"], ["t3"], name="n2b")])
    editor.insert_after(r[3], [helper.make_node("Relu", ["t4"], ["x"], name="after3")])
    editor.prepend([helper.make_node("Relu", ["t0"], ["p"], name="first")])
    editor.commit()
    assert _names(model) == ["first", "r0", "n2", "n2b", "r3", "after3", "r4"]
    # A kept node is edited in place, not copied: the index's wrapper still writes into the graph.
    index.producer["t5"].name = "renamed"
    assert _names(model)[-1] == "renamed"


def test_editor_commit_with_removals_only_keeps_order():
    model = _chain(6)
    editor = GraphEditor(GraphIndex(model))
    for node in list(model.graph.node)[::2]:
        editor.remove(node)
    editor.commit()
    assert _names(model) == ["r1", "r3", "r5"]


def test_remove_dead_nodes_returns_the_dead_in_graph_order():
    model = _chain(3)
    model.graph.node.extend([helper.make_node("Neg", ["t1"], ["d1"], name="dead1"),
                             helper.make_node("Neg", ["d1"], ["d2"], name="dead2"),
                             helper.make_node("Dropout", ["t2"], ["t9", ""], name="dead3")])
    dead = remove_dead_nodes(model)
    assert [n.name for n in dead] == ["dead1", "dead2", "dead3"]
    assert _names(model) == ["r0", "r1", "r2"]
    assert remove_dead_nodes(model) == []


def test_remove_unused_initializers_keeps_interface_and_order():
    model = _chain(2)
    for name in ("u1", "t1b", "u2"):
        model.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), name))
    model.graph.node[1].input.append("t1b")
    assert remove_unused_initializers(model.graph) == ["u1", "u2"]
    assert [t.name for t in model.graph.initializer] == ["t1b"]


def test_name_unnamed_nodes_names_blanks_and_repeats():
    model = _chain(3)
    model.graph.node[0].name = ""
    model.graph.node[2].name = "r1"
    assert name_unnamed_nodes(model.graph) == 2
    assert _names(model) == ["Relu_0", "r1", "Relu_2"]
    assert name_unnamed_nodes(model.graph) == 0


def test_tensor_from_array_matches_numpy_helper():
    for value in (np.arange(6, dtype=np.float32).reshape(2, 3).T, np.float16(1.5), np.array([True, False]),
                  np.arange(4, dtype=np.int64)[::-1], np.array(["a", "b"], dtype=object)):
        for name in ("t", ""):
            expected = numpy_helper.from_array(np.asarray(value), name)  # 0-d stays 0-d
            assert tensor_from_array(value, name).SerializeToString() == expected.SerializeToString()


def _with_dead_parts() -> onnx.ModelProto:
    model = _chain(3)
    graph = model.graph
    for name in ("w_live", "w_dead", "unused", "interface"):
        graph.initializer.append(numpy_helper.from_array(np.ones(1, np.float32), name))
    graph.input.append(helper.make_tensor_value_info("interface", TensorProto.FLOAT, [1]))
    graph.node[1].input.append("w_live")
    graph.node.extend([helper.make_node("Add", ["t1", "w_dead"], ["d"], name="dead")])
    return model


def test_remove_unused_equals_the_two_steps():
    one, two = _with_dead_parts(), _with_dead_parts()
    dead, unused = remove_unused(one)
    assert [n.name for n in dead] == [n.name for n in remove_dead_nodes(two)] == ["dead"]
    assert unused == remove_unused_initializers(two.graph) == ["w_dead", "unused"]
    assert one.SerializeToString() == two.SerializeToString()


def test_scalar_initializers_keep_their_rank():
    import numpy as np

    from onnx_npu_fix.ir.graph import GraphEditor, GraphIndex, tensor_from_array

    assert list(tensor_from_array(np.array(2.0, np.float32), "s").dims) == []
    assert list(tensor_from_array(np.float32(2.0), "s").dims) == []
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    assert onnx.numpy_helper.to_array(tensor_from_array(strided, "t")).tolist() == strided.tolist()
    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    editor = GraphEditor(GraphIndex(model))
    editor.add_initializer("c", np.array(3, np.int64))
    editor.commit()
    assert list(model.graph.initializer[0].dims) == []


def test_overwrite_tensor_replaces_type_dims_and_data_in_place():
    from onnx_npu_fix.ir.graph import overwrite_tensor

    tensor = numpy_helper.from_array(np.arange(6, dtype=np.int64).reshape(2, 3), "w")
    tensor.doc_string = "kept"
    tensor.external_data.add(key="location", value="stale.data")
    for value in (np.ones((4, 1), np.float32), np.arange(6, dtype=np.float64).reshape(3, 2).T,
                  np.array(2.5, np.float16), np.arange(3, dtype=">f4")):
        overwrite_tensor(tensor, value)
        assert tensor.name == "w" and not tensor.external_data
        assert tensor.data_location == onnx.TensorProto.DEFAULT
        got = numpy_helper.to_array(tensor)
        assert got.shape == value.shape and got.dtype == value.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got, value)


def _conv_chain_with_value_info(weights: int = 3) -> onnx.ModelProto:
    """Convs whose weights are large enough to be stubbed, a small int64 shape constant that is not, and a stale
    value_info entry inference must not keep."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for i in range(weights):
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [f"t{i}", f"w{i}"], [f"t{i + 1}"], name=f"c{i}", pads=[1, 1, 1, 1]))
    inits.append(numpy_helper.from_array(np.array([1, -1], np.int64), "shape"))
    nodes.append(helper.make_node("Reshape", [f"t{weights}", "shape"], ["out"], name="flat"))
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 4, 5, 5])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits,
                              value_info=[helper.make_tensor_value_info("t1", TensorProto.FLOAT, [1, 4, 5, 5])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_only_copy_stubs_large_initializers_and_keeps_small_ones():
    from onnx_npu_fix.ir.graph import shape_only_copy

    model = _conv_chain_with_value_info()
    light = shape_only_copy(model)
    by_name = {t.name: t for t in light.graph.initializer}
    assert [t.name for t in light.graph.initializer] == [t.name for t in model.graph.initializer]
    for i in range(3):
        stub = by_name[f"w{i}"]
        assert stub.data_location == TensorProto.EXTERNAL and not stub.raw_data
        assert list(stub.dims) == [4, 4, 3, 3] and stub.data_type == TensorProto.FLOAT
        assert [(e.key, e.value) for e in stub.external_data] == [("location", "__npufix_shape_only__")]
    assert by_name["shape"] == model.graph.initializer[-1]  # small: copied with its data
    assert not light.graph.value_info


def test_infer_shapes_of_a_light_copy_equals_inference_of_the_model():
    from onnx_npu_fix.ir.graph import infer_shapes, shape_only_copy

    model = _conv_chain_with_value_info()
    light = shape_only_copy(model, keep_value_info=True)
    infer_shapes(model)
    infer_shapes(light, light=True)
    assert [vi.SerializeToString() for vi in light.graph.value_info] == \
        [vi.SerializeToString() for vi in model.graph.value_info]
    assert light.graph.output[0] == model.graph.output[0]
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, 100]


def test_payload_bytes_from_dims_and_item_size():
    from onnx_npu_fix.ir.graph import payload_bytes

    for dtype in (np.float32, np.float16, np.int64, np.uint8):
        tensor = numpy_helper.from_array(np.zeros((3, 5), dtype), "t")
        assert payload_bytes(tensor) == len(tensor.raw_data) == 15 * np.dtype(dtype).itemsize
    packed = helper.make_tensor("f", TensorProto.FLOAT, [2], [1.0, 2.0])  # float_data, no raw_data
    assert payload_bytes(packed) == packed.ByteSize()


def test_sharing_index_answers_one_index_while_open_and_hands_it_on():
    """While sharing_index is open for a model, GraphIndex.of answers the first index built (or the one given) and
    GraphIndex.shared finds it; closed, both build or answer nothing, and the index is handed on."""
    model = small_model()
    assert GraphIndex.shared(model) is None
    assert GraphIndex.of(model) is not GraphIndex.of(model)  # nothing shared: a new index each time
    with sharing_index(model) as shared:
        first = GraphIndex.of(model)
        assert GraphIndex.of(model) is first and GraphIndex.shared(model) is first
        with sharing_index(model) as inner:  # an inner caller reads the outer one's, and takes nothing away
            assert GraphIndex.of(model) is first
        assert inner.index is None and GraphIndex.shared(model) is first
    assert shared.index is first and GraphIndex.shared(model) is None
    with sharing_index(model, first) as again:
        assert GraphIndex.of(model) is first
    assert again.index is first
    other = small_model()
    with sharing_index(model, GraphIndex(other)):  # an index of another model is not this one's
        assert GraphIndex.of(model) is not first and GraphIndex.of(model).model is model


def test_unused_after_reads_an_index_as_it_reads_the_nodes():
    """unused_after over an index's fields gives what the walk over the nodes gives: dead nodes (a branch nothing
    reads), unused initializers, a pass-through bypassed, a node gone."""
    model = small_model()
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.ones(4, np.float32), "spare"))
    graph.initializer.append(numpy_helper.from_array(np.ones(4, np.float32), "dead_bias"))
    graph.node.append(helper.make_node("Add", ["y", "dead_bias"], ["dead"], name="dead_add"))
    graph.node.append(helper.make_node("Relu", ["dead"], ["dead2"], name="dead_relu"))
    # (the nodes named by id are held, as a pass's plans hold theirs: a wrapper's id is only its while it lives)
    identity = next(n for n in graph.node if n.op_type == "Identity")
    first = graph.node[0]
    for kwargs in ({}, {"bypassed": {id(identity)}}, {"gone": {id(first)}}):
        plain = unused_after(model, **kwargs)
        indexed = unused_after(model, index=GraphIndex(model), **kwargs)
        assert [n.name for n in indexed[0]] == [n.name for n in plain[0]] and indexed[1] == plain[1]
    assert [n.name for n in unused_after(model)[0]] == ["dead_add", "dead_relu"]
    assert unused_after(model)[1] == ["spare", "dead_bias"]
