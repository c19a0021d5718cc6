"""Polygraphy interop: --validation-data reads Polygraphy's --save-inputs JSON, and --save-inputs writes the
inputs a run validated with in that format (also when validation fails), through the run's transaction."""

from __future__ import annotations

import base64
import io
import json
import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import break_cleanup

from onnx_npu_fix.cli import main
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.io.polygraphy_json import encode_feeds, read_feeds


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _npy_b64(array: np.ndarray, *, allow_pickle: bool = False) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return base64.b64encode(buffer.getvalue()).decode()


def test_arrays_round_trip_in_every_dtype():
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((2, 3)).astype(dtype), "i": np.arange(4, dtype=np.int64).reshape(1, 4),
              "b": np.array([True, False]), "s": np.float32(2.5) * np.ones((), np.float32)}
             for dtype in (np.float32, np.float16, np.float64)]
    back = read_feeds("f.json", json.dumps(encode_feeds(feeds)))
    assert len(back) == len(feeds)
    for got, sent in zip(back, feeds):
        assert list(got) == list(sent)
        for name in sent:
            assert got[name].dtype == sent[name].dtype and np.array_equal(got[name], sent[name])


def test_older_polygraphy_encodings_are_read():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    buffer = io.BytesIO()
    np.save(buffer, x, allow_pickle=False)
    legacy = {"x": {"ndarray": "polygraphy_serialized_json_type", "array": buffer.getvalue().decode("latin-1")}}
    single = {"x": {"array": _npy_b64(x), "polygraphy_class": "ndarray"}}  # one feed dict, not a list
    for document in (legacy, single):
        (feed,) = read_feeds("f.json", json.dumps(document))
        assert np.array_equal(feed["x"], x)


@pytest.mark.parametrize(("document", "says"), [
    ("[{", "not JSON"),
    ('[{"x": 1}]', "item 0 is not a feed dict of arrays"),
    ('[{"x": {"polygraphy_class": "RunResults", "lst": []}}]', "holds a Polygraphy RunResults, not an array"),
    (json.dumps([{"x": {"array": _npy_b64(np.array([{"a": 1}], dtype=object), allow_pickle=True),
                        "polygraphy_class": "ndarray"}}]), "holds Python objects"),
])
def test_what_is_not_input_sets_is_refused_in_one_line(document, says):
    with pytest.raises(InputError) as info:
        read_feeds("f.json", document)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_save_inputs_then_validation_data_replays_the_same_validation(tmp_path, fixture_path):
    saved, first, second = tmp_path / "inputs.json", tmp_path / "r1.json", tmp_path / "r2.json"
    result = invoke(fixture_path("tcn.onnx"), "-o", tmp_path / "o.onnx", "--max-dilation", "4", "--seed", "7",
                    "--save-inputs", saved, "--report", first)
    assert result.exit_code == 0, result.output
    assert f"wrote {saved} (3 input sets; polygraphy run MODEL --onnxrt --load-inputs {saved})" in result.output
    sets = read_feeds(str(saved), saved.read_text())
    from onnx_npu_fix.pipeline.inputs import make_inputs

    expected = make_inputs(onnx.load(fixture_path("tcn.onnx")), 3, 7)  # what --seed 7 generates
    assert [sorted(s) for s in sets] == [sorted(e) for e in expected]
    assert all(np.array_equal(s[k], e[k]) for s, e in zip(sets, expected) for k in e)
    record = json.loads(first.read_text())
    assert record["saved_inputs"] == {"path": str(saved), "sets": 3, "format": "polygraphy-json"}
    again = invoke(fixture_path("tcn.onnx"), "-o", tmp_path / "o2.onnx", "--max-dilation", "4",
                   "--validation-data", saved, "--report", second)
    assert again.exit_code == 0, again.output
    replay = json.loads(second.read_text())
    assert replay["final_validation"] == record["final_validation"]  # the same inputs, the same errors


def test_a_failing_run_still_saves_the_inputs_it_failed_on(tmp_path, fixture_path, monkeypatch):
    break_cleanup(monkeypatch)
    saved = tmp_path / "failing.json"
    result = invoke(fixture_path("tcn.onnx"), "-o", tmp_path / "o.onnx", "--save-inputs", saved)
    assert result.exit_code == 3 and "pass cleanup failed" in result.output
    assert sorted(os.listdir(tmp_path)) == ["failing.json"]  # no model; the case to replay
    assert len(read_feeds(str(saved), saved.read_text())) == 3


@pytest.mark.parametrize(("extra", "says"), [
    (["--check"], "--check validates nothing"),
    (["--validate", "none"], "with --validate none there are none"),
    (["--save-inputs", "{tmp}/in.npz"], "give a .json file name"),
    (["--report", "{tmp}/same.json", "--save-inputs", "{tmp}/same.json"], "are the same file"),
    (["--validation-data", "{tmp}/data.json", "--save-inputs", "{tmp}/data.json"], "are the same file"),
])
def test_save_inputs_is_checked_before_any_work(tmp_path, fixture_path, extra, says):
    x = np.zeros((1, 1, 16000), np.float32)
    (tmp_path / "data.json").write_text(json.dumps(encode_feeds([{"mix": x}])))
    before = sorted(os.listdir(tmp_path))
    args = [a.format(tmp=tmp_path) for a in extra]
    if "--save-inputs" not in args:
        args += ["--save-inputs", str(tmp_path / "in.json")]
    if "--check" not in args:
        args += ["-o", str(tmp_path / "o.onnx")]
    result = invoke(fixture_path("tcn.onnx"), *args)
    assert result.exit_code == 2, result.output
    assert says in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert sorted(os.listdir(tmp_path)) == before


# --- with Polygraphy itself (optional: skipped when it is not installed) -------------------------------------------


def test_polygraphy_reads_what_npufix_writes_and_npufix_reads_what_polygraphy_writes(tmp_path, fixture_path):
    serde = pytest.importorskip("polygraphy.json")
    saved = tmp_path / "npufix.json"
    assert invoke(fixture_path("unet.onnx"), "-o", tmp_path / "o.onnx", "--save-inputs", saved, "-q").exit_code == 0
    ours = read_feeds(str(saved), saved.read_text())
    theirs = serde.load_json(str(saved))  # what `polygraphy run --load-inputs` decodes
    assert len(theirs) == len(ours)
    assert all(np.array_equal(theirs[k][name], ours[k][name]) for k in range(len(ours)) for name in ours[k])
    rng = np.random.default_rng(1)
    written = tmp_path / "polygraphy.json"
    serde.save_json([{"image": rng.standard_normal((1, 1, 32, 32)).astype(np.float32)} for _ in range(2)],
                    str(written))
    report = tmp_path / "r.json"
    result = invoke(fixture_path("unet.onnx"), "-o", tmp_path / "o2.onnx", "--validation-data", written,
                    "--report", report, "-q")
    assert result.exit_code in (0, 1), result.output
    assert json.loads(report.read_text())["final_validation"]["passed"]
    assert read_feeds(str(written), written.read_text())[1]["image"].shape == (1, 1, 32, 32)


def test_a_folder_of_polygraphy_iteration_files_is_read_in_order(tmp_path, fixture_path):
    """Polygraphy's per-iteration folder (0000000000.json, ...: one feed dict or a list each) next to .npz sets."""
    from onnx_npu_fix.pipeline.inputs import load_validation_data

    model = onnx.load(fixture_path("tcn.onnx"))
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    sets = [{"mix": np.full(shape, k, np.float32)} for k in range(4)]
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "0000000000.json").write_text(json.dumps(encode_feeds(sets[:1])[0]))  # a single feed dict
    (folder / "0000000001.json").write_text(json.dumps(encode_feeds(sets[1:3])))
    np.savez(folder / "0000000002.npz", mix=sets[3]["mix"])
    loaded = load_validation_data(model, str(folder))
    assert [float(s["mix"].flat[0]) for s in loaded] == [0.0, 1.0, 2.0, 3.0]
    (folder / "0000000003.json").write_text(json.dumps(encode_feeds([{"mix": np.zeros(shape, np.float64)}])))
    with pytest.raises(InputError) as info:
        load_validation_data(model, str(folder))
    assert "0000000003.json: input 'mix' is float64, the model takes FLOAT" in str(info.value)
