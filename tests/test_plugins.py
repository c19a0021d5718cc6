"""Plugin passes: --plugin specs, installed entry points, their place in the order, and the graphsurgeon adapter.

Each plugin runs through the same pass manager as the built-in passes: validated, reported, failed and rolled
back the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import assert_equivalent, ops
from onnx import TensorProto, helper

from onnx_npu_fix.api import select_passes
from onnx_npu_fix.cli import main
from onnx_npu_fix.errors import InputError
from onnx_npu_fix.passes import DEFAULT_ORDER
from onnx_npu_fix.passes.base import Pass, PassResult
from onnx_npu_fix.plugins import loader as plugins

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "plugins", "decompose_hardswish.py")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def relu_model(path) -> str:
    """x -> Relu -> Add(x) -> y, [1, 4, 8] float."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Add", ["r", "x"], ["y"], name="add")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def hardswish_model(path) -> str:
    """x -> Conv 1x1 (8 ch) -> HardSwish -> Conv 1x1 -> y: the example plugin's target."""
    rng = np.random.default_rng(0)
    w1 = onnx.numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32), "w1")
    w2 = onnx.numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"),
         helper.make_node("HardSwish", ["c1"], ["h"], name="hswish"),
         helper.make_node("Conv", ["h", "w2"], ["y"], name="conv2")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], initializer=[w1, w2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def write_plugin(tmp_path, body: str, name: str = "myplugin.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


SCALE_PASS = textwrap.dedent("""
    import numpy as np
    import onnx
    from onnx_npu_fix.passes.base import Change, Pass, PassResult

    class ScaleOutput(Pass):
        '''y -> Mul(y, FACTOR): exact only when FACTOR is 1; the test sets it.'''
        name = "scale-output"
        summary = "multiply the graph output by a constant"
        exact = True
        FACTOR = {factor}

        def run(self, model, options):
            out = model.graph.output[0].name
            for node in model.graph.node:
                for i, name in enumerate(node.output):
                    if name == out:
                        node.output[i] = out + "/pre"
            model.graph.initializer.append(
                onnx.numpy_helper.from_array(np.array(self.FACTOR, np.float32), "scale-output/k"))
            model.graph.node.append(onnx.helper.make_node(
                "Mul", [out + "/pre", "scale-output/k"], [out], name="scale-output/mul"))
            return PassResult(changes=[Change("scale-output/mul", "Mul", "inserted")])
""")


def test_file_plugin_joins_the_run_and_is_validated(tmp_path):
    model = relu_model(tmp_path / "m.onnx")
    plugin = write_plugin(tmp_path, SCALE_PASS.format(factor=1.0))
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    result = invoke(model, "-o", out, "--plugin", f"{plugin}:ScaleOutput", "--report", report)
    assert result.exit_code == 0, result.output
    record = json.loads(report.read_text())
    names = [p["name"] for p in record["passes"]]
    assert names == [*(c.name for c in DEFAULT_ORDER), "scale-output"]  # no run_after: at the end
    mine = record["passes"][-1]
    assert mine["status"] == "validated" and mine["changes"][0]["node"] == "scale-output/mul"
    assert "Mul" in ops(onnx.load(out))
    assert_equivalent(onnx.load(model), onnx.load(out))


def test_wrong_plugin_fails_validation_and_writes_nothing(tmp_path):
    model = relu_model(tmp_path / "m.onnx")
    plugin = write_plugin(tmp_path, SCALE_PASS.format(factor=1.5))
    out = tmp_path / "o.onnx"
    result = invoke(model, "-o", out, "--plugin", plugin)  # the file defines one pass: no :Name needed
    assert result.exit_code != 0
    assert "pass scale-output failed" in result.output
    assert not out.exists()
    kept = invoke(model, "-o", out, "--plugin", plugin, "--keep-going")
    assert "rolled back" in kept.output or "scale-output" in kept.output
    assert_equivalent(onnx.load(model), onnx.load(out))  # rolled back: the output computes the original


@pytest.mark.parametrize("spec, message", [
    ("nowhere.py", "no such file"),
    ("{plugin}:Missing", "defines no 'Missing'"),
    ("{plugin}:NOT_A_PASS", "is a int, not a pass"),
    ("{two}", "defines 2 passes"),
    ("{clash}", "clashes with the built-in pass"),
    ("{broken}", "importing"),
    ("no_such_module_xyz:Pass", "no module named 'no_such_module_xyz'"),
    ("{badname}", "lower-case-with-dashes"),
    ("{badafter}", "run_after='no-such-pass'"),
    ("{ctor}", "pass 'scale-output' cannot be created: no config"),
    ("{ctor_exit}", "pass 'scale-output' cannot be created: it calls sys.exit(0)"),
])
def test_unusable_plugin_is_a_one_line_usage_error(tmp_path, spec, message):
    files = {
        "plugin": write_plugin(tmp_path, SCALE_PASS.format(factor=1.0) + "\nNOT_A_PASS = 3\n"),
        "two": write_plugin(tmp_path, SCALE_PASS.format(factor=1.0) + textwrap.dedent("""
            class Other(ScaleOutput):
                name = "other"
            """), "two.py"),
        "clash": write_plugin(tmp_path, SCALE_PASS.format(factor=1.0).replace('"scale-output"', '"cleanup"'),
                              "clash.py"),
        "broken": write_plugin(tmp_path, "raise RuntimeError('boom')\n", "broken.py"),
        "badname": write_plugin(tmp_path, SCALE_PASS.format(factor=1.0).replace('"scale-output"', '"Bad Name"'),
                                "badname.py"),
        "badafter": write_plugin(tmp_path, SCALE_PASS.format(factor=1.0).replace(
            "exact = True", "exact = True\n    run_after = 'no-such-pass'"), "badafter.py"),
        # a constructor that raises was an internal error (exit 5)
        "ctor": write_plugin(tmp_path, SCALE_PASS.format(factor=1.0).replace(
            "exact = True", "exact = True\n    def __init__(self):\n        raise RuntimeError('no config')"),
            "ctor.py"),
        "ctor_exit": write_plugin(tmp_path, SCALE_PASS.format(factor=1.0).replace(
            "exact = True", "exact = True\n    def __init__(self):\n        raise SystemExit(0)"), "ctor_exit.py"),
    }
    model = relu_model(tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    result = invoke(model, "-o", out, "--plugin", spec.format(**files))
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text and message in text, text
    assert not out.exists()


class _Probe(Pass):
    name = "probe"
    summary = "does nothing"

    def run(self, model, options):
        return PassResult()


class _After(_Probe):
    name = "after-bn"
    run_after = "fold-batchnorm"


def test_place_keeps_builtin_order_and_puts_plugins_where_named():
    names = [p.name for p in select_passes(None, (), plugins=[_Probe, _After])]
    builtin = [c.name for c in DEFAULT_ORDER]
    at = builtin.index("fold-batchnorm") + 1
    assert names == [*builtin[:at], "after-bn", *builtin[at:], "probe"]
    # --passes decides: after the built-in named before it; built-ins stay in default order whatever the list says
    chosen = select_passes(["dilated-conv", "probe", "cleanup", "reorder-memory"], (), plugins=[_Probe])
    assert [p.name for p in chosen] == ["cleanup", "reorder-memory", "dilated-conv", "probe"]
    first = select_passes(["probe", "cleanup"], (), plugins=[_Probe])
    assert [p.name for p in first] == ["probe", "cleanup"]
    # a loaded plugin not named in --passes does not run; a skipped one neither
    assert "probe" not in [p.name for p in select_passes(["cleanup"], (), plugins=[_Probe])]
    assert "probe" not in [p.name for p in select_passes(None, ["probe"], plugins=[_Probe])]


def test_two_plugins_with_one_name_are_refused():
    class Twin(_Probe):
        pass

    with pytest.raises(InputError, match="two plugin passes are named 'probe'"):
        select_passes(None, (), plugins=[_Probe, Twin])


def _fake_distribution(root, body: str) -> None:
    """A package 'vendorfix' that declares the entry point ``vendor-probe`` the way an installed wheel does."""
    (root / "vendorfix.py").write_text(textwrap.dedent(body))
    info = root / "vendorfix-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendorfix\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\nvendor-probe = vendorfix:VendorProbe\n")


VENDOR_PASS = """
    from onnx_npu_fix.passes.base import Pass, PassResult

    class VendorProbe(Pass):
        name = "vendor-probe"
        summary = "a vendor's rewrite, installed as a package"

        def run(self, model, options):
            return PassResult()
"""


def _npufix(args, root, **env):
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
                       **env)
    return subprocess.run([sys.executable, "-m", "onnx_npu_fix", *map(str, args)], capture_output=True,
                          text=True, env=environment, timeout=120)


def test_installed_plugin_is_listed_and_runs_only_when_named(tmp_path):
    _fake_distribution(tmp_path, VENDOR_PASS)
    listed = _npufix(["--list-passes"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith("vendor-probe"))
    assert "installed: vendorfix:VendorProbe" in line
    model = relu_model(tmp_path / "m.onnx")
    report = tmp_path / "r.json"
    plain = _npufix([model, "-o", tmp_path / "a.onnx", "--report", report], tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "vendor-probe" not in [p["name"] for p in json.loads(report.read_text())["passes"]]
    named = _npufix([model, "-o", tmp_path / "b.onnx", "--passes", "cleanup,vendor-probe", "--report", report],
                    tmp_path)
    assert named.returncode == 0, named.stderr
    assert [p["name"] for p in json.loads(report.read_text())["passes"]] == ["cleanup", "vendor-probe"]
    hidden = _npufix(["--list-passes"], tmp_path, **{plugins.DISABLE_AUTOLOAD: "1"})
    assert "vendor-probe" not in hidden.stdout


def test_broken_installed_plugin_is_named_in_the_listing_and_refused_when_used(tmp_path):
    _fake_distribution(tmp_path, "raise ImportError('needs vendor sdk')\n")
    listed = _npufix(["--list-passes"], tmp_path)
    assert listed.returncode == 0
    assert "vendor-probe" in listed.stdout and "needs vendor sdk" in listed.stdout
    model = relu_model(tmp_path / "m.onnx")
    used = _npufix([model, "-o", tmp_path / "o.onnx", "--passes", "cleanup,vendor-probe"], tmp_path)
    assert used.returncode == 2
    assert used.stderr.strip().count("\n") == 0 and "does not load: needs vendor sdk" in used.stderr


# --- the graphsurgeon adapter (onnx-graphsurgeon is in the test extra, so CI runs these) -------------------------

def _gs():
    return pytest.importorskip("onnx_graphsurgeon")


def test_example_graphsurgeon_plugin_through_the_cli(tmp_path):
    _gs()
    model = hardswish_model(tmp_path / "m.onnx")
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    result = invoke(model, "-o", out, "--plugin", EXAMPLE, "--report", report)
    assert result.exit_code == 0, result.output
    fixed = onnx.load(out)
    assert "HardSwish" not in ops(fixed) and {"HardSigmoid", "Mul"} <= set(ops(fixed))
    record = json.loads(report.read_text())
    names = [p["name"] for p in record["passes"]]
    assert names.index("decompose-hardswish") == names.index("fold-batchnorm") + 1  # its run_after
    mine = record["passes"][names.index("decompose-hardswish")]
    assert mine["status"] == "validated"
    actions = {(c["node"], c["action"]) for c in mine["changes"]}
    assert {("hswish", "removed"), ("hswish/hardsigmoid", "added"), ("hswish/mul", "added")} <= actions
    assert_equivalent(onnx.load(model), fixed)
    listed = invoke("--list-passes", "--plugin", EXAMPLE)
    assert "decompose-hardswish" in listed.output and "plugin: " in listed.output


def test_graphsurgeon_function_that_changes_nothing_leaves_the_model_untouched(tmp_path):
    from onnx_npu_fix.plugins.graphsurgeon import graphsurgeon_pass

    gs = _gs()

    @graphsurgeon_pass(name="look-only", summary="reads the graph")
    def look_only(graph, options):
        assert isinstance(graph, gs.Graph)

    model = onnx.load(hardswish_model(tmp_path / "m.onnx"))
    before = model.SerializeToString()
    result = look_only().run(model, None)
    assert not result.changed and model.SerializeToString() == before


def test_graphsurgeon_edit_of_a_weight_is_reported(tmp_path):
    from onnx_npu_fix.plugins.graphsurgeon import graphsurgeon_pass

    _gs()

    @graphsurgeon_pass(name="halve-w1", summary="halves a weight (not exact: for the report only)", exact=False)
    def halve(graph, options):
        w1 = graph.tensors()["w1"]
        w1.values = w1.values / 2

    model = onnx.load(hardswish_model(tmp_path / "m.onnx"))
    result = halve().run(model, None)
    assert [(c.node, c.action) for c in result.changes] == [("w1", "rewritten")]
    weight = next(t for t in model.graph.initializer if t.name == "w1")
    original = onnx.load(str(tmp_path / "m.onnx"))
    expected = onnx.numpy_helper.to_array(next(t for t in original.graph.initializer if t.name == "w1")) / 2
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(weight), expected)


def test_missing_graphsurgeon_is_a_clear_message(monkeypatch):
    from onnx_npu_fix.plugins import graphsurgeon as gs_adapter
    monkeypatch.setitem(sys.modules, "onnx_graphsurgeon", None)  # import now raises ImportError
    # npufix is not on PyPI: the hint names onnx-graphsurgeon itself and the extra of a source checkout
    with pytest.raises(InputError, match=r"pip install onnx-graphsurgeon \(in a checkout of npufix: pip install "
                                         r"'\.\[graphsurgeon\]'\)"):
        gs_adapter.import_graphsurgeon()


EXITING_PLUGIN = """
    import sys
    from onnx_npu_fix.passes.base import Pass, PassResult

    {at_import}

    class Exiting(Pass):
        name = "exiting"
        summary = "calls sys.exit"
        exact = True

        def run(self, model, options):
            {in_run}
            return PassResult()
"""


@pytest.mark.parametrize("validate", ["each", "final"])
@pytest.mark.parametrize("where, code, message", [
    ("import", 2, "myplugin.py fails: it calls sys.exit(0)"),
    ("run", 3, "pass exiting failed: SystemExit: it calls sys.exit(0)"),
])
def test_plugin_calling_sys_exit_is_named_not_a_silent_success(tmp_path, where, code, message, validate):
    # sys.exit(0) from plugin code used to end the run with exit 0, no output and no message.
    model = relu_model(tmp_path / "m.onnx")
    exit_call = "sys.exit(0)"
    plugin = write_plugin(tmp_path, EXITING_PLUGIN.format(at_import=exit_call if where == "import" else "",
                                                          in_run=exit_call if where == "run" else "pass"))
    out = tmp_path / "o.onnx"
    result = invoke(model, "-o", out, "--plugin", plugin, "--validate", validate)
    assert result.exit_code == code, result.output
    assert message in result.output
    assert not out.exists()


RETYPING_PLUGIN = """
    from onnx_npu_fix.passes.base import Change, Pass, PassResult

    class Retype(Pass):
        '''Declares the graph input and output [1, 4, 9] instead of [1, 4, 8]: consistent for shape
        inference, but not the model's interface any more.'''
        name = "retype"
        summary = "changes the graph interface"
        exact = True

        def run(self, model, options):
            for value in (model.graph.input[0], model.graph.output[0]):
                value.type.tensor_type.shape.dim[2].dim_value = 9
            return PassResult(changes=[Change("add", "Add", "retyped")])
"""


@pytest.mark.parametrize("validate", ["each", "final", "none"])
def test_plugin_changing_the_io_shapes_is_a_failed_pass_named(tmp_path, validate):
    # Names were checked, types and shapes were not: under --validate none the model was written with exit 0.
    model = relu_model(tmp_path / "m.onnx")
    plugin = write_plugin(tmp_path, RETYPING_PLUGIN)
    out = tmp_path / "o.onnx"
    result = invoke(model, "-o", out, "--plugin", plugin, "--validate", validate)
    assert result.exit_code == 3, result.output
    assert ("pass retype failed: the pass changed the type of graph input 'x' from float32[1, 4, 8] to "
            "float32[1, 4, 9]") in result.output
    assert not out.exists()
