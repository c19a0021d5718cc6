"""``npufix reduce``: judges that reject a structural pattern (tests/pattern_judge.py, run as real
subprocesses) on small models, the fixtures and random graphs. Each reduction must end 1-minimal (removing any node
left makes the judge pass, or the candidate unbuildable), keep the original signature, and take at most
3·log2(n) + 10 judge calls when one node is the cause.

The random-graph and fixture cases judge in-process with the same code (pattern_judge.judge_bytes): a judge
subprocess starts a Python, and hundreds of them would cost minutes.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys

import numpy as np
import onnx
import pattern_judge
import pytest
from click.testing import CliRunner
from helpers import prepared
from onnx import TensorProto, helper, numpy_helper

from onnx_npu_fix import api
from onnx_npu_fix.cli import main
from onnx_npu_fix.errors import EXIT_OK, EXIT_USAGE
from onnx_npu_fix.judge.candidates import CandidateBuilder
from onnx_npu_fix.judge.command import FAIL, PASS, TIMEOUT, Judge, JudgeError, error_line, mask
from onnx_npu_fix.judge.record import remaining_nodes
from onnx_npu_fix.judge.reduce import NothingToReduce, reduce_model

JUDGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pattern_judge.py")
PATTERN_JUDGE = f"{shlex.quote(sys.executable)} {shlex.quote(JUDGE)}"


def subprocess_judge(patterns: str, **kwargs) -> Judge:
    return Judge(f"{PATTERN_JUDGE} {patterns} {{model}}", **kwargs)


class InProcessJudge(Judge):
    """The pattern judge without a subprocess: the same verdicts and signatures (Judge._verdict), counted alike."""

    def __init__(self, patterns: str) -> None:
        super().__init__(f"{PATTERN_JUDGE} {patterns} {{model}}")
        self.patterns = patterns.split(",")

    def _run(self, data: bytes):
        self.calls += 1
        code, output = pattern_judge.judge_bytes(self.patterns, data, onnx.ModelProto)
        return self._verdict(code, output, 0.0)


# --- models ----------------------------------------------------------------------------------------------------


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return prepared(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _float(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _pad_chain(n: int, at: int) -> onnx.ModelProto:
    """A chain of n unary ops on [1,4,8] with a Mul -> rank-3 Pad pair at position ``at``."""
    nodes, x = [], "x"
    for k in range(n):
        if k == at:
            nodes += [helper.make_node("Mul", [x, "two"], [f"m{k}"], name=f"mul{k}"),
                      helper.make_node("Pad", [f"m{k}", "pads"], [f"t{k}"], name=f"pad{k}")]
        else:
            nodes.append(helper.make_node(("Relu", "Sigmoid", "Tanh")[k % 3], [x], [f"t{k}"], name=f"n{k}"))
        x = f"t{k}"
    inits = [numpy_helper.from_array(np.array(2, np.float32), "two"),
             numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0], np.int64), "pads")]
    return _model(nodes, [_float("x", [1, 4, 8])], [_float(x, [1, 4, 8])], inits)


def _weight(name, shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _branchy_convtranspose() -> onnx.ModelProto:
    """Two Conv branches joined by an Add, a ConvTranspose of stride 8 on one of them, more ops after."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["a1"], name="relu_a"),
        helper.make_node("Conv", ["x", "w2"], ["b"], name="conv_b", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["b"], ["b1"], name="sig_b"),
        helper.make_node("Add", ["a1", "b1"], ["s"], name="add"),
        helper.make_node("ConvTranspose", ["s", "wt"], ["u"], name="up", strides=[8, 8]),
        helper.make_node("Relu", ["u"], ["u1"], name="relu_u"),
        helper.make_node("Conv", ["u1", "w3"], ["y"], name="conv_y"),
        helper.make_node("Tanh", ["b1"], ["z"], name="tanh_z"),
    ]
    inits = [_weight("w1", [4, 4, 3, 3]), _weight("w2", [4, 4, 3, 3], 1), _weight("wt", [4, 4, 8, 8], 2),
             _weight("w3", [2, 4, 1, 1], 3)]
    return _model(nodes, [_float("x", [1, 4, 4, 4])], [_float("y", [1, 2, 32, 32]), _float("z", [1, 4, 4, 4])],
                  inits)


def _wide_conv() -> onnx.ModelProto:
    """A Concat of three branches to 600 channels, read by a Conv (more than 512 input channels)."""
    nodes = [helper.make_node("Conv", ["x", f"w{k}"], [f"c{k}"], name=f"branch{k}") for k in range(3)]
    nodes += [helper.make_node("Concat", ["c0", "c1", "c2"], ["cat"], name="cat", axis=1),
              helper.make_node("Relu", ["cat"], ["r"], name="relu"),
              helper.make_node("Conv", ["r", "wide"], ["y"], name="wide_conv"),
              helper.make_node("Sigmoid", ["y"], ["out"], name="sig")]
    inits = [_weight(f"w{k}", [200, 8, 1, 1], k) for k in range(3)] + [_weight("wide", [8, 600, 1, 1], 5)]
    return _model(nodes, [_float("x", [1, 8, 2, 2])], [_float("out", [1, 8, 2, 2])], inits)


def _two_patterns() -> onnx.ModelProto:
    """A ConvTranspose of stride 8 (1-D) early, a Mul -> rank-3 Pad later: the judge reports the Pad first."""
    nodes = [
        helper.make_node("ConvTranspose", ["x", "wt"], ["u"], name="up", strides=[8]),
        helper.make_node("Relu", ["u"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["r"], ["s"], name="sig"),
        helper.make_node("Mul", ["s", "two"], ["m"], name="mul"),
        helper.make_node("Tanh", ["m"], ["t"], name="tanh"),
        helper.make_node("Mul", ["t", "two"], ["m2"], name="mul2"),
        helper.make_node("Pad", ["m2", "pads"], ["y"], name="pad"),
    ]
    inits = [_weight("wt", [4, 4, 8]), numpy_helper.from_array(np.array(2, np.float32), "two"),
             numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 1], np.int64), "pads")]
    return _model(nodes, [_float("x", [1, 4, 4])], [_float("y", [1, 4, 34])], inits)


# --- what every reduction must satisfy ---------------------------------------------------------------------------


def _check_minimal(model: onnx.ModelProto, reduction, judge: Judge) -> list[str]:
    """The minimal model fails with the signature, and removing any one of its nodes does not (1-minimal)."""
    verdict = judge.judge(reduction.model.SerializeToString())
    assert verdict.kind == FAIL and verdict.signature == reduction.signature
    builder = CandidateBuilder(reduction.model)
    for v in builder.removable:
        candidate = builder.build([u for u in builder.removable if u != v])
        if isinstance(candidate, str):
            continue  # unbuildable: no judge would see it
        other = judge.judge(candidate.data)
        assert not (other.kind == FAIL and other.signature == reduction.signature), \
            f"still fails without {reduction.model.graph.node[v].name}"
    return [node.op_type for node in reduction.model.graph.node]


def _bound(model: onnx.ModelProto) -> float:
    return 3 * math.log2(len(model.graph.node)) + 10


def test_rank3_pad_after_mul_on_a_chain_subprocess_judge():
    model = _pad_chain(20, 13)
    judge = subprocess_judge("pad3-mul")
    reduction = reduce_model(model, judge)
    assert "Assertion" in reduction.signature and "<n>" in reduction.signature  # line number masked
    assert reduction.nodes_before == 21 and reduction.nodes_after == 2
    assert reduction.calls <= _bound(model)
    good = reduction.min_good
    assert good is not None and judge.judge(good.SerializeToString()).kind == PASS
    assert sorted(_check_minimal(model, reduction, judge)) == ["Mul", "Pad"]


@pytest.mark.parametrize("build, pattern, expected", [
    (_branchy_convtranspose, "convt-stride", ["ConvTranspose"]),
    (_wide_conv, "conv-channels", ["Conv"]),
], ids=["convtranspose-stride", "conv-512-channels"])
def test_single_node_causes_on_branchy_models_subprocess_judge(build, pattern, expected):
    model = build()
    judge = subprocess_judge(pattern)
    reduction = reduce_model(model, judge)
    assert _check_minimal(model, reduction, judge) == expected
    assert reduction.calls <= _bound(model)


def test_the_signature_keeps_the_reducer_on_the_first_failure_subprocess_judge():
    model = _two_patterns()
    judge = subprocess_judge("pad3-mul,convt-stride")
    reduction = reduce_model(model, judge)
    assert "Assertion" in reduction.signature
    assert sorted(_check_minimal(model, reduction, judge)) == ["Mul", "Pad"]
    # the prefix holding the ConvTranspose alone failed too, with the other message: not counted as failing
    assert reduction.other_failures >= 1
    assert any(t.verdict is not None and t.verdict.kind == FAIL and "ConvTranspose" in t.verdict.signature
               for t in reduction.trials)


@pytest.mark.parametrize("fixture, pattern", [
    ("tcn.onnx", "dilation:128"), ("unet.onnx", "op:Resize"), ("lraspp.onnx", "op:GlobalAveragePool"),
    ("dilated2d.onnx", "dilation:4"),
])
def test_fixtures(fixture_path, fixture, pattern):
    model = prepared(onnx.load(fixture_path(fixture)))
    judge = InProcessJudge(pattern)
    reduction = reduce_model(model, judge)
    assert len(_check_minimal(model, reduction, judge)) == 1
    assert reduction.calls <= _bound(model)


def _random_graph(seed: int, planted: str) -> onnx.ModelProto:
    """A random DAG of unary and binary ops on [1,4,8] tensors with one planted cause: a Mul -> Pad pair
    (``pad3-mul``) or a single Tanh (``op:Tanh``)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(12, 40))
    tensors, nodes = ["x"], []
    plant_at = int(rng.integers(2, n - 2))
    for k in range(n):
        a = tensors[int(rng.integers(len(tensors)))]
        if k == plant_at and planted == "pad3-mul":
            nodes += [helper.make_node("Mul", [a, "two"], [f"m{k}"], name=f"mul{k}"),
                      helper.make_node("Pad", [f"m{k}", "pads"], [f"t{k}"], name=f"pad{k}")]
        elif k == plant_at:
            nodes.append(helper.make_node("Tanh", [a], [f"t{k}"], name=f"tanh{k}"))
        elif rng.random() < 0.4:
            b = tensors[int(rng.integers(len(tensors)))]
            nodes.append(helper.make_node(("Add", "Max", "Min")[k % 3], [a, b], [f"t{k}"], name=f"bin{k}"))
        else:
            nodes.append(helper.make_node(("Relu", "Sigmoid", "Neg")[k % 3], [a], [f"t{k}"], name=f"un{k}"))
        tensors.append(f"t{k}")
    read = {i for node in nodes for i in node.input}
    outputs = [t for t in tensors[1:] if t not in read]
    inits = [numpy_helper.from_array(np.array(2, np.float32), "two"),
             numpy_helper.from_array(np.array([0] * 6, np.int64), "pads")]
    return _model(nodes, [_float("x", [1, 4, 8])], [_float(t, [1, 4, 8]) for t in outputs], inits)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("planted", ["pad3-mul", "op:Tanh"])
def test_random_graphs(seed, planted):
    model = _random_graph(seed, planted)
    judge = InProcessJudge(planted)
    reduction = reduce_model(model, judge)
    kept = _check_minimal(model, reduction, judge)
    if planted == "op:Tanh":
        assert kept == ["Tanh"] and reduction.calls <= _bound(model)
    else:
        assert sorted(kept) == ["Mul", "Pad"]


# --- the judge ---------------------------------------------------------------------------------------------------


def test_signature_is_the_first_error_line_masked():
    assert error_line("ok\nwarning: x\nlayer 3 error: bad\nFAIL later") == "layer 3 error: bad"
    traceback = ("start\nTraceback (most recent call last):\n  File \"/a/b.py\", line 3, in f\n    raise Error\n"
                 "ValueError: assignment destination is read-only\nError after")
    assert error_line(traceback) == "ValueError: assignment destination is read-only"
    assert mask("/src/Module.cpp:575 getI64Array: Assertion at 0x7ffe and ./x/y.txt") == \
        "<path>:<n> getI<n>Array: Assertion at <hex> and <path>"
    assert error_line("all good") is None


def test_judge_rules_and_cache(tmp_path):
    say = tmp_path / "say.sh"
    say.write_text('cat "$1" > /dev/null; echo "$2"; exit "$3"\n')
    say.chmod(0o755)

    def verdict(text, code, **kwargs):
        return Judge(f"{say} {{model}} '{text}' {code}", **kwargs).judge(b"model")

    assert verdict("error: at /tmp/x.c:12", 1).signature == "error: at <path>:<n>"
    assert verdict("fine", 0).kind == PASS
    assert verdict("CPU fallback: Conv_3", 0, fail_regex=["CPU fallback"]).signature == "CPU fallback: Conv_<n>"
    assert verdict("BUILD OK", 1, pass_regex=["BUILD OK"]).kind == PASS  # --pass-regex: the status is ignored
    assert verdict("nothing", 0, pass_regex=["BUILD OK"]).kind == FAIL
    assert verdict("bad 12 at 7", 3, signature=r"bad (\d+)").signature == "12"
    assert verdict("quiet", 4).signature == "quiet"  # no error line: the last line, masked
    judge = Judge(f"{say} {{model}} 'error: x' 1")
    assert judge.judge(b"a") == judge.judge(b"a") and (judge.calls, judge.cached) == (1, 1)
    judge.judge(b"b")
    assert judge.calls == 2


def test_a_hanging_judge_is_a_timeout_of_its_own_kind():
    verdict = subprocess_judge("sleep", timeout=0.5).judge(b"")
    assert verdict.kind == TIMEOUT and verdict.exit_code is None


@pytest.mark.parametrize("template, message", [
    ("/no/such/compiler {model}", "'/no/such/compiler' is not an executable"),
    ("no-such-compiler-xyz {model}", "'no-such-compiler-xyz' is not an executable"),
    (f"{PATTERN_JUDGE} pad", "has no {model}"),
])
def test_unusable_judges_are_refused(template, message):
    with pytest.raises(JudgeError, match=message.replace("{", r"\{").replace("}", r"\}")):
        Judge(template)


# --- the command -------------------------------------------------------------------------------------------------


def _write(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def _reduce_cli(*args: str):
    return CliRunner().invoke(main, ["reduce", *args])


def test_cli_writes_the_minimal_model_the_nearest_passing_one_and_the_record(tmp_path):
    source = _write(_pad_chain(8, 5), tmp_path / "chain.onnx")
    out, good, report = tmp_path / "min.onnx", tmp_path / "good.onnx", tmp_path / "r.json"
    result = _reduce_cli(source, "--judge", f"{PATTERN_JUDGE} pad3-mul {{model}}", "-o", str(out),
                         "--min-good", str(good), "--report", str(report), "--target", "bm1684x")
    assert result.exit_code == EXIT_OK, result.output
    assert "judge call 1: 9 nodes -> fail:" in result.output and f"wrote {out}" in result.output
    record = json.loads(report.read_text())
    assert record["nodes_before"] == 9 and record["nodes_after"] == 2
    judged = [t for t in record["trials"] if t["verdict"] != "unbuildable"]
    assert record["judge_calls"] == len(judged) + 1  # the whole model's call is not a trial
    pad = next(n for n in record["nodes"] if n["op"] == "Pad")
    assert pad["inputs"][0]["shape"] == [1, 4, 8] and pad["attributes"] == {}
    assert any("rank-3 Pad" in why and "remainder_pad" in why for why in pad["likely"])
    assert sorted(n.op_type for n in onnx.load(str(out)).graph.node) == ["Mul", "Pad"]
    assert len(onnx.load(str(good)).graph.node) == 1
    _check_against_its_schema(record)
    bullet = _reduce_page().split("**`--report`**")[1].split("\n- **")[0]
    documented = set(re.findall(r"`([a-z_]+)(?:\[\])?`", bullet))
    assert set(record) <= documented and set(pad) <= documented and set(record["trials"][0]) <= documented


def _check_against_its_schema(record: dict) -> None:
    """The record holds the schema shipped for it, and the schema can fail (a trial without its verdict)."""
    jsonschema = pytest.importorskip("jsonschema")
    from onnx_npu_fix.pipeline.report import schema

    validator = jsonschema.Draft202012Validator(schema("reduce"))
    validator.validate(record)
    assert not validator.is_valid(dict(record, trials=[{"nodes": 3}]))


def _reduce_page() -> str:
    page = os.path.join(os.path.dirname(JUDGE), "..", "docs", "reduce.md")
    return open(page, encoding="utf-8").read()


def test_every_reduce_option_is_documented():
    from onnx_npu_fix.cli import reduce_command

    section = _reduce_page()
    for param in reduce_command.params:
        if param.name not in ("model", "quiet", "verbose"):
            assert any(re.search(f"`{o}[ `]", section) for o in param.opts), param.opts


@pytest.mark.parametrize("args, message", [
    (["--judge", "/no/such/compiler {model}"], "'/no/such/compiler' is not an executable"),
    (["--judge", f"{PATTERN_JUDGE} pad3-mul"], "has no {model}"),
    (["--judge", f"{PATTERN_JUDGE} op:Cos {{model}}"], "the judge passes the model"),
    (["--judge", f"{PATTERN_JUDGE} sleep {{model}}", "--judge-timeout", "0.5"], "the judge timed out"),
], ids=["not-executable", "no-model", "nothing-to-reduce", "timeout"])
def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    source = _write(_pad_chain(4, 2), tmp_path / "chain.onnx")
    result = _reduce_cli(source, *args, "-o", str(tmp_path / "min.onnx"), "--report", str(tmp_path / "r.json"))
    assert result.exit_code == EXIT_USAGE, result.output
    lines = [line for line in result.output.splitlines() if not line.startswith("judge call")]
    assert len(lines) == 1 and message in lines[0], result.output
    assert sorted(os.listdir(tmp_path)) == ["chain.onnx"]


def test_dynamic_inputs_need_input_shape(tmp_path):
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [_float("x", ["n", 4])], [_float("y", ["n", 4])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    source = _write(model, tmp_path / "dyn.onnx")
    result = _reduce_cli(source, "--judge", f"{PATTERN_JUDGE} op:Relu {{model}}", "-o", str(tmp_path / "m.onnx"))
    assert result.exit_code == EXIT_USAGE and "--input-shape x:<dims>" in result.output
    with pytest.raises(NothingToReduce):
        api.reduce(source, tmp_path / "m.onnx", InProcessJudge("op:Cos"), api.FixOptions(input_shapes={"x": [2, 4]}))


@pytest.mark.parametrize("args", [["./reduce", "-o", "out.onnx"], ["-o", "out.onnx", "--", "reduce"]])
def test_a_model_named_reduce_is_reached_as_a_path_or_after_double_dash(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == EXIT_USAGE and "reduce: no such file" in result.output, result.output


def test_a_traceback_signature_and_the_likely_cause_of_a_pad_before_a_conv():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Pad", ["r", "pads"], ["p"], name="same_pad"),
             helper.make_node("Conv", ["p", "w"], ["c"], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="sig")]
    inits = [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"), _weight("w", [4, 4, 3, 3])]
    model = _model(nodes, [_float("x", [1, 4, 6, 6])], [_float("y", [1, 4, 6, 6])], inits)
    reduction = reduce_model(model, InProcessJudge("pad-conv"))
    assert reduction.signature == "ValueError: assignment destination is read-only"  # a traceback's last line
    nodes = {n["name"]: n for n in remaining_nodes(reduction.model, api.FixOptions())}
    assert set(nodes) == {"same_pad", "conv"}
    assert any("constant pads before Conv conv" in why for why in nodes["same_pad"]["likely"])


def _input_shape(model: onnx.ModelProto) -> list[int]:
    return [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]


def test_shrink_halves_sizes_the_failure_does_not_need():
    wide = reduce_model(_wide_conv(), InProcessJudge("conv-channels"), shrink=True)
    # 600 channels are the cause (300 would pass): they stay; the 2x2 map does not matter
    assert _input_shape(wide.model) == [1, 600, 1, 1] and wide.steps["shrink"] == 1
    chain = reduce_model(_pad_chain(6, 3), InProcessJudge("pad3-mul"), shrink=True)
    assert _input_shape(chain.model) == [1, 4, 1]  # the Mul's channels are no conv's: they stay
    judge = InProcessJudge("pad3-mul")
    assert judge.judge(chain.model.SerializeToString()).signature == chain.signature
