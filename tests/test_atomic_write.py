"""The one atomic write (io/atomic.py): every file npufix writes goes through a temporary sibling that is fsynced,
given the mode the umask says, renamed into place, and its directory fsynced; any failure leaves nothing behind.
"""

from __future__ import annotations

import os
import stat

import onnx
import pytest
from onnx import TensorProto, helper

from onnx_npu_fix.io import save
from onnx_npu_fix.io.atomic import atomic_dir, atomic_write
from onnx_npu_fix.io.save import EarlyWrite, save_model, write_json


@pytest.fixture
def fsynced(monkeypatch):
    """The (inode, is a directory) of everything os.fsync is called on."""
    calls: list[tuple[int, bool]] = []
    real = os.fsync

    def record(fd):
        info = os.fstat(fd)
        calls.append((info.st_ino, stat.S_ISDIR(info.st_mode)))
        return real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return calls


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(previous)


def _inode(path) -> tuple[int, bool]:
    info = os.stat(path)
    return info.st_ino, stat.S_ISDIR(info.st_mode)


def _model() -> onnx.ModelProto:
    weight = helper.make_tensor("w", TensorProto.FLOAT, [512], [0.5] * 512)  # 2 KiB: external with external_data
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_atomic_write_fsyncs_the_file_and_the_directory(tmp_path, fsynced):
    target = tmp_path / "out.bin"
    with atomic_write(target) as tmp:
        assert os.path.dirname(tmp) == str(tmp_path) and not target.exists()
        with open(tmp, "wb") as f:
            f.write(b"payload")
    assert target.read_bytes() == b"payload" and os.listdir(tmp_path) == ["out.bin"]
    assert _inode(target) in fsynced  # the file, before its rename (the same inode after it)
    assert _inode(tmp_path) in fsynced  # the directory, after the rename


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failure_mid_write_leaves_no_temporary_file_and_the_old_file(tmp_path, error):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(error), atomic_write(target) as tmp:
        with open(tmp, "w") as f:
            f.write("half of the new")
        raise error()
    assert os.listdir(tmp_path) == ["out.json"] and target.read_text() == "old"


def test_the_mode_follows_the_umask(tmp_path, umask_027):
    write_json(str(tmp_path / "r.json"), {"a": 1})
    save_model(_model(), tmp_path / "m.onnx", external_data=True)
    for name in ("r.json", "m.onnx", "m.onnx.data"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o640, name
    with atomic_dir(tmp_path / "seg") as tmp:
        write_json(os.path.join(tmp, "manifest.json"), {})
    assert stat.S_IMODE(os.stat(tmp_path / "seg").st_mode) == 0o750


def test_a_model_with_external_data_fsyncs_both_files(tmp_path, fsynced):
    save_model(_model(), tmp_path / "m.onnx", external_data=True)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    assert {_inode(tmp_path / "m.onnx"), _inode(tmp_path / "m.onnx.data"), _inode(tmp_path)} <= set(fsynced)
    loaded = onnx.load(str(tmp_path / "m.onnx"))
    assert onnx.numpy_helper.to_array(loaded.graph.initializer[0]).tolist() == [0.5] * 512


def test_a_model_whose_data_file_fails_leaves_nothing(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(save, "write_with_external_data", fail)
    with pytest.raises(OSError):
        save_model(_model(), tmp_path / "m.onnx", external_data=True)
    assert os.listdir(tmp_path) == []


def test_atomic_dir_appears_whole_or_not_at_all(tmp_path, fsynced):
    (tmp_path / "seg").mkdir()  # an empty directory is replaced
    with atomic_dir(tmp_path / "seg") as tmp:
        write_json(os.path.join(tmp, "manifest.json"), {"segments": []})
        assert not (tmp_path / "seg" / "manifest.json").exists()
    assert os.listdir(tmp_path / "seg") == ["manifest.json"] and sorted(os.listdir(tmp_path)) == ["seg"]
    assert _inode(tmp_path / "seg" / "manifest.json") in fsynced and _inode(tmp_path) in fsynced
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "other") as tmp:
        write_json(os.path.join(tmp, "manifest.json"), {})
        raise KeyboardInterrupt()
    assert sorted(os.listdir(tmp_path)) == ["seg"]


def test_the_early_write_is_fsynced_when_committed(tmp_path, fsynced):
    target = tmp_path / "out.onnx"
    early = EarlyWrite(target)
    data = b"the bytes validated"
    try:
        early.start(data)
        assert early.commit(data)
    finally:
        early.close()
    assert target.read_bytes() == data and _inode(target) in fsynced and _inode(tmp_path) in fsynced
