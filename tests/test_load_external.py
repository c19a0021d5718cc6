"""Reading a model whose weights are in external data files: the onnx checker reads the file and its data files
(not a serialized copy of the weights), the weights read are the file's, the files are never touched, and the
fixed model matches the original."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from helpers import assert_equivalent, file_state, save_external
from onnx import helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.config.options import FixOptions
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io.load import read_model


def test_external_weights_are_read_as_stored_and_the_files_left_alone(tmp_path, fixture_path):
    original = onnx.load(fixture_path("torch_unet.onnx"))  # a real torch export
    src = tmp_path / "in"
    src.mkdir()
    path = save_external(original, src)
    before = file_state(src)
    loaded = read_model(path)
    assert loaded.external_files == {os.path.normpath(path + ".data")}
    expected = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    got = {t.name: numpy_helper.to_array(t) for t in loaded.model.graph.initializer}
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert file_state(src) == before


def test_external_data_model_fixed_validated_and_equal(tmp_path, fixture_path):
    original = onnx.load(fixture_path("unet.onnx"))
    src = tmp_path / "in"
    src.mkdir()
    path = save_external(original, src)
    before = file_state(src)
    out = tmp_path / "out.onnx"
    outcome = api.run(path, out, FixOptions(max_dilation=4, align=8, resize_mode="exact"))
    assert outcome.exit_code == 0, outcome.error
    assert outcome.result.report.final is not None and outcome.result.report.final.passed
    assert file_state(src) == before
    assert_equivalent(original, onnx.load(str(out)))


def test_external_data_model_the_checker_refuses_is_an_input_error(tmp_path):
    """The checker still judges the whole model when it reads the file instead of a copy of the weights."""
    weight = numpy_helper.from_array(np.ones((8, 8), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["undefined"], ["z"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = save_external(model, tmp_path)
    with pytest.raises(InputError, match="fails the onnx checker"):
        read_model(path)
