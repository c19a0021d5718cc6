"""Write npufix's hostile-input corpus into a directory: broken files and unusual but valid models.

    python tests/hostile/build_hostile.py OUTDIR

Deterministic (one seeded generator, fixed names), so tests build the corpus into a temporary directory instead
of committing binaries. ``build(outdir)`` returns ``{case name: model path}``; the expected behaviour of each
case is the table in tests/test_hostile.py. Files that are not models (external data, decoys) sit next to them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20240607
OPSET = 17
IR = 8
LONG = 5000  # characters in the "very long" names

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), *, opset: int = OPSET, ir: int = IR,
           extra_opsets: tuple[tuple[str, int], ...] = (), name: str = "hostile") -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir, producer_name="build_hostile")


def _vi(name: str, shape, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, order="C"), name)  # (ascontiguousarray turns 0-d into 1-d)


def _weights(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# --- valid models -------------------------------------------------------------------------------


def small_conv(rng: np.random.Generator, channels: int = 8, length: int = 32) -> onnx.ModelProto:
    """x -> Identity -> Conv(k3, pad 1) -> Relu -> y: the plain model behind the file and path cases."""
    return _model(
        [helper.make_node("Identity", ["x"], ["xi"], name="id_in"),
         helper.make_node("Conv", ["xi", "w", "b"], ["c"], name="conv", pads=[1, 1], kernel_shape=[3]),
         helper.make_node("Relu", ["c"], ["y"], name="relu")],
        [_vi("x", [1, channels, length])], [_vi("y", [1, 8, length])],
        [_init("w", _weights(rng, 8, channels, 3)), _init("b", _weights(rng, 8))])


def opset_model(opset: int, *, ir: int = IR) -> onnx.ModelProto:
    """x -> Identity -> Relu -> Add(x) -> y at an arbitrary opset / IR version (ops that exist since opset 1)."""
    return _model(
        [helper.make_node("Identity", ["x"], ["xi"], name="id"),
         helper.make_node("Relu", ["xi"], ["r"], name="relu"),
         helper.make_node("Add", ["r", "x"], ["y"], name="add")],
        [_vi("x", [2, 3])], [_vi("y", [2, 3])], opset=opset, ir=ir)


def custom_domain(rng: np.random.Generator) -> onnx.ModelProto:
    """An op of a domain nobody implements between removable Identity/Dropout nodes."""
    return _model(
        [helper.make_node("Identity", ["x"], ["xi"], name="id"),
         helper.make_node("Frobnicate", ["xi"], ["f"], name="frob", domain="com.example", gain=2.0),
         helper.make_node("Dropout", ["f"], ["d"], name="drop"),
         helper.make_node("Relu", ["d"], ["y"], name="relu")],
        [_vi("x", [1, 4])], [_vi("y", [1, 4])], extra_opsets=(("com.example", 1),))


def custom_domain_ort(rng: np.random.Generator) -> onnx.ModelProto:
    """A com.microsoft contrib op onnxruntime runs (Gelu), so cleanup around it can be validated."""
    return _model(
        [helper.make_node("Dropout", ["x"], ["d"], name="drop"),
         helper.make_node("Gelu", ["d"], ["g"], name="gelu", domain="com.microsoft"),
         helper.make_node("Identity", ["g"], ["gi"], name="id"),
         helper.make_node("Mul", ["gi", "k"], ["y"], name="mul")],
        [_vi("x", [2, 5])], [_vi("y", [2, 5])], [_init("k", _weights(rng, 5))],
        extra_opsets=(("com.microsoft", 1),))


def if_subgraph(rng: np.random.Generator) -> onnx.ModelProto:
    """Two Ifs whose branches read outer tensors produced through Identity nodes:
    - ``branch``: the then-branch holds a Dropout and reads an outer initializer only the branches use, the
      else-branch an Identity of the outer tensor;
    - ``passthrough``: the then-branch is only an Identity of the outer tensor.
    Beside them, a removable Identity (so cleanup changes the graph and validation runs) and an Identity from an
    If output to a graph output."""
    then_g = helper.make_graph(
        [helper.make_node("Dropout", ["t"], ["then_d"], name="then_drop"),
         helper.make_node("Add", ["then_d", "only_in_branch"], ["then_o"], name="then_add")],
        "then", [], [_vi("then_o", [2, 3])])
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["t"], ["else_i"], name="else_id"),
         helper.make_node("Mul", ["else_i", "t"], ["else_o"], name="else_mul")],
        "else", [], [_vi("else_o", [2, 3])])
    pass_then = helper.make_graph([helper.make_node("Identity", ["t2"], ["pass_id"], name="pass_then_id")],
                                  "pass_then", [], [_vi("pass_id", [2, 3])])
    pass_else = helper.make_graph([helper.make_node("Neg", ["t2"], ["pass_neg"], name="pass_else_neg")],
                                  "pass_else", [], [_vi("pass_neg", [2, 3])])
    return _model(
        [helper.make_node("Identity", ["x"], ["t"], name="id_outer"),
         helper.make_node("Identity", ["x"], ["t2"], name="id_outer2"),
         helper.make_node("If", ["c"], ["if_o"], name="branch", then_branch=then_g, else_branch=else_g),
         helper.make_node("If", ["c"], ["pass_o"], name="passthrough", then_branch=pass_then,
                          else_branch=pass_else),
         helper.make_node("Identity", ["x"], ["v"], name="id_removable"),
         helper.make_node("Relu", ["v"], ["w"], name="relu"),
         helper.make_node("Add", ["w", "if_o"], ["y"], name="add"),
         helper.make_node("Identity", ["if_o"], ["z"], name="id_to_output")],
        [_vi("x", [2, 3]), _vi("c", [], TensorProto.BOOL)],
        [_vi("y", [2, 3]), _vi("z", [2, 3]), _vi("pass_o", [2, 3])],
        [_init("only_in_branch", _weights(rng, 2, 3))])


def loop_subgraph(rng: np.random.Generator) -> onnx.ModelProto:
    """Loop (3 iterations) whose body reads an outer Identity output, holds a Dropout and an Identity, and nests
    an If whose branches read the outermost tensor again (two scopes up)."""
    then_g = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "t"], ["in_then"], name="nested_then_add")],
        "nested_then", [], [_vi("in_then", [2, 3])])
    else_g = helper.make_graph(
        [helper.make_node("Sub", ["acc_in", "t"], ["in_else"], name="nested_else_sub")],
        "nested_else", [], [_vi("in_else", [2, 3])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond_id"),
         helper.make_node("Dropout", ["t"], ["body_d"], name="body_drop"),
         helper.make_node("Cast", ["i"], ["i_f"], name="body_cast", to=F),
         helper.make_node("Mul", ["body_d", "i_f"], ["body_m"], name="body_mul"),
         helper.make_node("Less", ["i", "one"], ["first"], name="body_less"),
         helper.make_node("If", ["first"], ["body_if"], name="body_if",
                          then_branch=then_g, else_branch=else_g),
         helper.make_node("Add", ["body_if", "body_m"], ["acc_out"], name="body_add"),
         helper.make_node("Relu", ["acc_out"], ["scan_out"], name="body_relu")],
        "body", [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("acc_in", [2, 3])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [2, 3]), _vi("scan_out", [2, 3])])
    return _model(
        [helper.make_node("Identity", ["x"], ["t"], name="id_outer"),
         helper.make_node("Loop", ["trip", "keep_going", "acc0"], ["acc", "scans"], name="loop", body=body),
         helper.make_node("Identity", ["acc"], ["acc_i"], name="id_removable"),
         helper.make_node("Relu", ["acc_i"], ["y"], name="relu")],
        [_vi("x", [2, 3])], [_vi("y", [2, 3]), _vi("scans", [3, 2, 3])],
        [_init("trip", np.array(3, np.int64)), _init("keep_going", np.array(True)),
         _init("acc0", _weights(rng, 2, 3)), _init("one", np.array(1, np.int64))])


def dynamic_batch(rng: np.random.Generator) -> onnx.ModelProto:
    m = small_conv(rng)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    return m


def unknown_rank(rng: np.random.Generator) -> onnx.ModelProto:
    m = small_conv(rng)
    m.graph.input[0].type.tensor_type.ClearField("shape")
    m.graph.output[0].type.tensor_type.ClearField("shape")
    return m


def newline_in_name(rng: np.random.Generator) -> onnx.ModelProto:
    """A dynamic input whose name holds a newline: every message naming it must still be one line."""
    m = dynamic_batch(rng)
    m.graph.input[0].name = "in\nput"
    m.graph.node[0].input[0] = "in\nput"
    return m


def zero_batch(rng: np.random.Generator) -> onnx.ModelProto:
    m = small_conv(rng)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 0
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 0
    return m


def zero_concat(rng: np.random.Generator) -> onnx.ModelProto:
    """Concat with a zero-sized constant and a zero-sized Slice of the input; Shape of the empty tensor."""
    return _model(
        [helper.make_node("Identity", ["x"], ["xi"], name="id"),
         helper.make_node("Slice", ["xi", "s0", "s0", "ax"], ["empty"], name="slice_empty"),
         helper.make_node("Concat", ["xi", "nothing", "empty"], ["cat"], name="cat", axis=1),
         helper.make_node("Shape", ["empty"], ["empty_shape"], name="shape_of_empty"),
         helper.make_node("Cast", ["empty_shape"], ["es_f"], name="cast", to=F),
         helper.make_node("ReduceSum", ["es_f"], ["total"], name="sum", keepdims=0),
         helper.make_node("Add", ["cat", "total"], ["y"], name="add")],
        [_vi("x", [1, 4, 16])], [_vi("y", [1, 4, 16])],
        [_init("nothing", np.zeros((1, 0, 16), np.float32)), _init("s0", np.array([0], np.int64)),
         _init("ax", np.array([1], np.int64))])


def zero_spatial(rng: np.random.Generator) -> onnx.ModelProto:
    """A time axis of length 0 through a 1x1 Conv."""
    return _model(
        [helper.make_node("Identity", ["x"], ["xi"], name="id"),
         helper.make_node("Conv", ["xi", "w"], ["y"], name="conv", kernel_shape=[1])],
        [_vi("x", [1, 8, 0])], [_vi("y", [1, 8, 0])], [_init("w", _weights(rng, 8, 8, 1))])


def named_model(rng: np.random.Generator, names: dict[str, str]) -> onnx.ModelProto:
    """x -> Identity -> dilated Conv (d=4, 8 -> 8 channels) -> Dropout -> Relu -> Reshape(constant shape) -> y,
    every name from ``names``; passes that create nodes derive new names from these."""
    n = names
    return _model(
        [helper.make_node("Identity", [n["x"]], [n["xi"]], name=n["id"]),
         helper.make_node("Conv", [n["xi"], n["w"], n["b"]], [n["c"]], name=n["conv"], kernel_shape=[3],
                          dilations=[4], pads=[4, 4]),
         helper.make_node("Dropout", [n["c"]], [n["d"]], name=n["drop"]),
         helper.make_node("Relu", [n["d"]], [n["r"]], name=n["relu"]),
         helper.make_node("Reshape", [n["r"], n["shape"]], [n["y"]], name=n["reshape"])],
        [_vi(n["x"], [1, 8, 40])], [_vi(n["y"], [1, 8, 40])],
        [_init(n["w"], _weights(rng, 8, 8, 3)), _init(n["b"], _weights(rng, 8)),
         _init(n["shape"], np.array([1, 8, 40], np.int64))], name=n["graph"])


NON_ASCII = {"x": "入力/σ-ß", "xi": "Ünïcödé→∂", "w": "вес·W", "b": "偏置 b", "c": "κόμβος:conv",
             "d": "ドロップ", "r": "ReLU出力", "shape": "形状 ∑", "y": "出力 🚀 y", "id": "恒等/Identity",
             "conv": "Свёртка/Conv_0", "drop": "شبكة/Dropout", "relu": "ReLU✓", "reshape": "变形⇄",
             "graph": "граф"}
LONG_NAMES = {k: (k + "_") * (LONG // (len(k) + 1)) + "z" * (LONG % (len(k) + 1)) for k in NON_ASCII}


def conv_dynamic_weight(rng: np.random.Generator) -> onnx.ModelProto:
    """A Conv whose weight is a graph input (no static value): dilation 4, 3 -> 5 channels (unaligned)."""
    return _model(
        [helper.make_node("Identity", ["x"], ["xi"], name="id"),
         helper.make_node("Conv", ["xi", "w"], ["y"], name="conv_dyn_w", kernel_shape=[3], dilations=[4],
                          pads=[4, 4])],
        [_vi("x", [1, 3, 32]), _vi("w", [5, 3, 3])], [_vi("y", [1, 5, 32])])


def unsorted_nodes(rng: np.random.Generator) -> onnx.ModelProto:
    m = small_conv(rng)
    nodes = list(m.graph.node)[::-1]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def duplicate_output(rng: np.random.Generator) -> onnx.ModelProto:
    """Two nodes write the same tensor (not SSA)."""
    return _model(
        [helper.make_node("Relu", ["x"], ["r"], name="relu_a"),
         helper.make_node("Neg", ["x"], ["r"], name="neg_b"),
         helper.make_node("Identity", ["r"], ["y"], name="id")],
        [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def string_input(rng: np.random.Generator) -> onnx.ModelProto:
    """A STRING graph input, which validation cannot invent values for."""
    return _model(
        [helper.make_node("Identity", ["s"], ["si"], name="id"),
         helper.make_node("Reshape", ["si", "shape"], ["y"], name="reshape")],
        [_vi("s", [3], TensorProto.STRING)], [_vi("y", [3, 1], TensorProto.STRING)],
        [_init("shape", np.array([3, 1], np.int64))])


def overridable_initializer(rng: np.random.Generator) -> onnx.ModelProto:
    """``scale`` is a graph input with an initializer as its default: not a constant, nothing may fold it."""
    return _model(
        [helper.make_node("Identity", ["x"], ["xi"], name="id"),
         helper.make_node("Add", ["scale", "one"], ["s1"], name="add_one"),
         helper.make_node("Mul", ["xi", "s1"], ["y"], name="mul")],
        [_vi("x", [2, 3]), _vi("scale", [3])], [_vi("y", [2, 3])],
        [_init("scale", np.array([1.0, 2.0, 3.0], np.float32)), _init("one", np.ones(3, np.float32))])


def local_function(rng: np.random.Generator) -> onnx.ModelProto:
    """A model-local function (com.local.Swishy) whose body holds an Identity and a Dropout."""
    fn = helper.make_function(
        "com.local", "Swishy", ["a"], ["b"],
        [helper.make_node("Identity", ["a"], ["a_id"]),
         helper.make_node("Sigmoid", ["a_id"], ["sig"]),
         helper.make_node("Dropout", ["sig"], ["sig_d"]),
         helper.make_node("Mul", ["a", "sig_d"], ["b"])],
        opset_imports=[helper.make_opsetid("", OPSET)])
    model = _model(
        [helper.make_node("Identity", ["x"], ["xi"], name="id"),
         helper.make_node("Swishy", ["xi"], ["sw"], name="swishy", domain="com.local"),
         helper.make_node("Relu", ["sw"], ["y"], name="relu")],
        [_vi("x", [2, 3])], [_vi("y", [2, 3])], extra_opsets=(("com.local", 1),))
    model.functions.append(fn)
    return model


def sparse_initializer(rng: np.random.Generator) -> onnx.ModelProto:
    """A MatMul weight stored as a sparse_initializer (COO)."""
    dense = np.zeros((4, 3), np.float32)
    dense[[0, 2, 3], [1, 0, 2]] = [1.5, -2.0, 0.25]
    flat = np.flatnonzero(dense)
    sparse = helper.make_sparse_tensor(_init("w", dense.reshape(-1)[flat]), _init("w_idx", flat.astype(np.int64)),
                                       dense.shape)
    model = _model(
        [helper.make_node("Identity", ["x"], ["xi"], name="id"),
         helper.make_node("MatMul", ["xi", "w"], ["y"], name="matmul")],
        [_vi("x", [2, 4])], [_vi("y", [2, 3])])
    model.graph.sparse_initializer.append(sparse)
    return model


def optional_io(rng: np.random.Generator) -> onnx.ModelProto:
    """Empty-name optional inputs and outputs: Clip without min, Dropout whose mask is unused, Resize without roi."""
    return _model(
        [helper.make_node("Clip", ["x", "", "hi"], ["clipped"], name="clip"),
         helper.make_node("Dropout", ["clipped"], ["d", "mask"], name="drop"),
         helper.make_node("Resize", ["d", "", "scales"], ["y"], name="resize", mode="nearest")],
        [_vi("x", [1, 2, 3, 3])], [_vi("y", [1, 2, 6, 6])],
        [_init("hi", np.array(0.5, np.float32)), _init("scales", np.array([1, 1, 2, 2], np.float32))])


def node_names(rng: np.random.Generator) -> onnx.ModelProto:
    """Three nodes called "same", two with no name at all."""
    return _model(
        [helper.make_node("Identity", ["x"], ["a"], name="same"),
         helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Dropout", ["b"], ["c"], name="same"),
         helper.make_node("Neg", ["c"], ["d"]),
         helper.make_node("Abs", ["d"], ["y"], name="same")],
        [_vi("x", [2, 3])], [_vi("y", [2, 3])])


def string_output(rng: np.random.Generator) -> onnx.ModelProto:
    """Integer input -> ai.onnx.ml LabelEncoder -> STRING graph output: validation must compare words."""
    return _model(
        [helper.make_node("Identity", ["x"], ["xi"], name="id"),
         helper.make_node("LabelEncoder", ["xi"], ["y"], name="labels", domain="ai.onnx.ml",
                          keys_int64s=list(range(8)), values_strings=[f"label-{k}" for k in "abcdefgh"],
                          default_string="?")],
        [_vi("x", [2, 3], TensorProto.INT64)], [_vi("y", [2, 3], TensorProto.STRING)],
        extra_opsets=(("ai.onnx.ml", 2),))


def huge_input(rng: np.random.Generator) -> onnx.ModelProto:
    """A declared input of 2**40 elements (4 TiB): nothing may try to allocate it."""
    return _model([helper.make_node("Identity", ["x"], ["xi"], name="id"),
                   helper.make_node("Relu", ["xi"], ["y"], name="relu")],
                  [_vi("x", [1, 1 << 40])], [_vi("y", [1, 1 << 40])])


def no_outputs(rng: np.random.Generator) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["r"], name="relu")], [_vi("x", [2, 3])], [])


# --- writers ------------------------------------------------------------------------------------


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _save(path: Path, model: onnx.ModelProto) -> Path:
    return _write(path, model.SerializeToString())


def _external(path: Path, model: onnx.ModelProto, location: str) -> Path:
    """Save ``model`` with every initializer in ``location`` (relative to the model's directory)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    onnx.external_data_helper.convert_model_to_external_data(model, all_tensors_to_one_file=True,
                                                             location=location, size_threshold=0)
    onnx.save_model(model, str(path))
    return path


def _protobuf_like(rng: np.random.Generator) -> bytes:
    """Well-formed protobuf wire data whose field numbers a ModelProto does not use: it decodes, to nothing."""
    out = bytearray()
    for field in rng.choice([3, 9, 11, 12, 13, 15, 16, 17, 30, 99], size=40):
        out += bytes([(int(field) << 3 | 2) & 0x7F | 0x80, int(field) >> 4]) if field >= 16 else \
            bytes([int(field) << 3 | 2])
        payload = rng.integers(0, 256, int(rng.integers(0, 20)), dtype=np.uint8).tobytes()
        out += bytes([len(payload)]) + payload
    return bytes(out)


def build(outdir: str | os.PathLike) -> dict[str, Path]:
    """Write the corpus into ``outdir`` (created if needed); return ``{case: model path}``."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    cases: dict[str, Path] = {}

    def add(name: str, make: Callable[[Path], Path]) -> None:
        cases[name] = make(out / f"{name}.onnx")

    base = small_conv(rng)
    base_bytes = base.SerializeToString()
    weight = numpy_helper.to_array(base.graph.initializer[0]).tobytes()
    mid_weight = base_bytes.find(weight) + len(weight) // 2
    opset_field = onnx.ModelProto(opset_import=base.opset_import).SerializeToString()
    assert base_bytes.endswith(opset_field)  # fields are written by number: the graph (7) before opset_import (8)
    graph_end = len(base_bytes) - len(opset_field)

    # Broken files.
    add("empty", lambda p: _write(p, b""))
    add("random_bytes", lambda p: _write(p, rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()))
    add("protobuf_like", lambda p: _write(p, _protobuf_like(rng)))
    add("truncated_in_weight", lambda p: _write(p, base_bytes[:mid_weight]))
    add("truncated_at_field", lambda p: _write(p, base_bytes[:graph_end]))
    add("text_format", lambda p: _write(p, onnx.printer.to_text(base).encode()))
    add("tensor_proto", lambda p: _write(p, _init("w", _weights(rng, 16, 16)).SerializeToString()))
    add("graph_proto", lambda p: _write(p, base.graph.SerializeToString()))
    add("node_proto", lambda p: _write(p, base.graph.node[1].SerializeToString()))

    # External data.
    add("external_ok", lambda p: _external(p, small_conv(rng), "external_ok.weights"))
    add("external_missing", lambda p: _external(p, small_conv(rng), "external_missing.weights"))
    (out / "external_missing.weights").unlink()
    add("external_truncated", lambda p: _external(p, small_conv(rng), "external_truncated.weights"))
    data = out / "external_truncated.weights"
    data.write_bytes(data.read_bytes()[:40])
    # The model one directory down names "../outside_dir.weights": a location outside the model's directory.
    (out / "sub").mkdir(exist_ok=True)
    # onnx refuses to write such a location, so write a normal one and edit it.
    outside = _external(out / "sub" / "external_outside_dir.onnx", small_conv(rng), "outside_dir.weights")
    os.replace(out / "sub" / "outside_dir.weights", out / "outside_dir.weights")
    moved = onnx.load_model(str(outside), load_external_data=False)
    for tensor in moved.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../outside_dir.weights"
    cases["external_outside_dir"] = _save(outside, moved)

    # Opsets / IR versions onnxruntime does not run.
    add("opset_3", lambda p: _save(p, opset_model(3)))
    add("opset_99", lambda p: _save(p, opset_model(99)))
    add("ir_version_99", lambda p: _save(p, opset_model(OPSET, ir=99)))

    # Valid but unusual models.
    builders: dict[str, Callable[[np.random.Generator], onnx.ModelProto]] = {
        "custom_domain": custom_domain,
        "custom_domain_ort": custom_domain_ort,
        "if_subgraph": if_subgraph,
        "loop_subgraph": loop_subgraph,
        "dynamic_batch": dynamic_batch,
        "unknown_rank": unknown_rank,
        "newline_in_name": newline_in_name,
        "zero_batch": zero_batch,
        "zero_concat": zero_concat,
        "zero_spatial": zero_spatial,
        "non_ascii_names": lambda r: named_model(r, NON_ASCII),
        "long_names": lambda r: named_model(r, LONG_NAMES),
        "conv_dynamic_weight": conv_dynamic_weight,
        "unsorted_nodes": unsorted_nodes,
        "duplicate_output": duplicate_output,
        "string_input": string_input,
        "overridable_initializer": overridable_initializer,
        "local_function": local_function,
        "sparse_initializer": sparse_initializer,
        "optional_io": optional_io,
        "node_names": node_names,
        "string_output": string_output,
        "huge_input": huge_input,
        "no_outputs": no_outputs,
        "plain": small_conv,
    }
    for name, make in builders.items():
        add(name, lambda p, make=make: _save(p, make(rng)))
    return cases


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_hostile.py OUTDIR")
    for case, path in build(sys.argv[1]).items():
        print(f"{case:<22} {path}")
