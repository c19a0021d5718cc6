"""The hostile-input corpus: broken files, unusual models and bad output paths, through the real CLI.

Every case ends either in a one-line error with exit 2 and nothing written, or in exit 0/1 with a written model
that computes what the input computes (proven with onnxruntime, or with onnx's reference evaluator where
onnxruntime cannot run the model). Never a traceback (CliRunner runs with catch_exceptions=False, so an escaping
exception fails the test), never a partial file or a leftover temporary file in the output directory, never a
change to the input. The corpus is written by tests/hostile/build_hostile.py; ``CASES`` and ``PATH_CASES`` below
say what each input must do.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner, Result
from hostile.build_hostile import build
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from onnx_npu_fix.cli import main
from onnx_npu_fix.ir.graph import dynamic_inputs, get_attr, subgraph_outer_inputs
from onnx_npu_fix.pipeline.inputs import make_inputs
from onnx_npu_fix.pipeline.validation.comparison import compare
from onnx_npu_fix.pipeline.validation.session import Runner

RESULT = (0, 1)  # a written model: 0 clean, 1 with "unfixed:" constraints listed
OPTION_SETS = {"default": (), "npu": ("--max-dilation", "2", "--align", "8")}


@dataclass(frozen=True)
class Case:
    model: str
    """Corpus name (tests/hostile/build_hostile.py)."""
    code: int | tuple[int, ...]
    """2: a one-line error, nothing written; 0 / 1: a written model that matches the input (either is
    acceptable when the tuple holds both)."""
    phrase: tuple[str, ...] = ()
    """For exit 2: the error contains one of these (case-insensitive)."""
    args: tuple[str, ...] = ()
    check: str = "ort"
    """How a written model is proven: ort (onnxruntime), reference (onnx.reference, for models onnxruntime
    cannot run), structure (the same non-Identity/Dropout nodes, for models nothing can run)."""
    note: bool = False
    """The run must end by saying that nothing was validated (--validate none)."""

    @property
    def id(self) -> str:
        return self.model + "".join("+" + a.lstrip("-") for a in self.args if a.startswith("--"))


CASES = [
    # Files that are not (whole) ONNX models.
    Case("empty", 2, ("empty file",)),
    Case("random_bytes", 2, ("not an ONNX model",)),
    Case("protobuf_like", 2, ("not an ONNX model",)),
    Case("truncated_in_weight", 2, ("truncated",)),
    Case("truncated_at_field", 2, ("not an ONNX model",)),
    Case("text_format", 2, ("not an ONNX model",)),
    Case("tensor_proto", 2, ("not an ONNX model",)),
    Case("graph_proto", 2, ("not an ONNX model",)),
    Case("node_proto", 2, ("not an ONNX model",)),
    Case("unsorted_nodes", 2, ("topologically sorted",)),
    Case("duplicate_output", 2, ("single static assignment",)),
    Case("no_outputs", 2, ("no outputs",)),
    Case("unknown_rank", 2, ("shape",)),
    # External data.
    Case("external_ok", RESULT),
    Case("external_missing", 2, ("external data file",)),
    Case("external_truncated", 2, ("external data",)),
    Case("external_outside_dir", 2, ("outside",)),
    # Opsets and IR versions onnxruntime does not run.
    # onnxruntime cannot run the original: nothing can be validated, so nothing is written unless asked for.
    Case("opset_3", 2, ("cannot run the original",)),
    Case("opset_3", RESULT, args=("--validate", "none"), check="reference", note=True),
    Case("opset_99", 2, ("cannot run the original",)),
    Case("opset_99", RESULT, args=("--validate", "none"), check="reference", note=True),
    Case("ir_version_99", 2, ("ir_version 99",)),
    # Valid but unusual models.
    Case("custom_domain", 2, ("cannot run the original",)),
    Case("custom_domain", RESULT, args=("--validate", "none"), check="reference", note=True),
    Case("custom_domain_ort", RESULT),
    Case("if_subgraph", RESULT),
    Case("loop_subgraph", RESULT),
    Case("dynamic_batch", 2, ("--input-shape x:",)),
    Case("dynamic_batch", RESULT, args=("--input-shape", "x:3,8,32")),
    Case("newline_in_name", 2, ("--input-shape",)),
    # Batch 0: every output is empty, so no comparison could show a difference.
    Case("zero_batch", 2, ("has no elements",)),
    Case("zero_batch", RESULT, args=("--validate", "none"), note=True),
    Case("zero_concat", RESULT),
    Case("zero_spatial", 2, ("cannot run the original",)),
    Case("zero_spatial", RESULT, args=("--validate", "none"), check="reference", note=True),
    Case("non_ascii_names", RESULT, args=("-v",)),
    Case("long_names", RESULT, args=("-v",)),
    Case("conv_dynamic_weight", RESULT),
    Case("string_input", 2, ("--no-validate",)),
    Case("string_input", RESULT, args=("--no-validate",)),
    Case("string_output", RESULT),
    Case("huge_input", 2, ("--no-validate",)),
    Case("huge_input", RESULT, args=("--no-validate",), check="structure"),
    Case("overridable_initializer", RESULT),
    Case("local_function", RESULT),
    Case("sparse_initializer", (0, 1, 2), ("sparse",)),
    Case("optional_io", RESULT),
    Case("node_names", RESULT, check="reference"),
    Case("plain", 0),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return build(tmp_path_factory.mktemp("corpus"))


def invoke(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _params(cases, ids):
    return [pytest.param(c, opts, id=f"{ids(c)}-{name}")
            for c in cases for name, opts in OPTION_SETS.items()]


# --- assertions ---------------------------------------------------------------------------------


def assert_one_line_error(result, phrases) -> str:
    """The error is one line, the last; before it only the lines of passes that finished (printed as each pass
    finishes, e.g. fold-constants before onnxruntime refuses the original at the first validation)."""
    from onnx_npu_fix.passes import PASSES

    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert lines and "Traceback" not in result.output
    assert all(line.split()[0] in PASSES for line in lines[:-1]), result.output
    text = lines[-1]
    assert not phrases or any(p.lower() in text.lower() for p in phrases), text
    return text


def assert_written_result(text: str, exit_code: int, case: Case, original: onnx.ModelProto, written_path: Path,
                          opts) -> None:
    """A written model: the exit code is explained, the model is valid, its interface unchanged, and it computes
    what the original computes."""
    assert "Traceback" not in text
    assert written_path.exists(), text
    if exit_code == 1:
        assert "unfixed:" in text, text  # exit 1 with a written model means constraints remain, listed
    if case.note:
        assert text.splitlines()[-1].startswith("validation: none (requested)"), text
    written = onnx.load(str(written_path))  # external data (if any) must sit next to the output, not the input
    onnx.checker.check_model(written)
    assert _interface(written) == _interface(original)
    if exit_code == 0 and "--max-dilation" in opts:
        limit = int(opts[opts.index("--max-dilation") + 1])
        for node in written.graph.node:
            if node.op_type == "Conv":
                assert max(get_attr(node, "dilations", [1]) or [1]) <= limit, node.name
    if case.check == "structure":
        assert _computing_nodes(written) == _computing_nodes(original)
        return
    feeds = _feeds(case, original, written)
    if case.check == "ort":
        ref, got = _run_ort(original, feeds), _run_ort(written, feeds)
    else:
        ref, got = _run_reference(original, feeds), _run_reference(written, feeds)
    assert_same_outputs(ref, got)


def assert_same_outputs(ref, got) -> None:
    """Numeric outputs within the exact tolerance (validation.comparison.compare); anything else (strings) equal."""
    numeric = [({k: v for k, v in r.items() if v.dtype != object}, {k: v for k, v in g.items() if v.dtype != object})
               for r, g in zip(ref, got)]
    cmp = compare([r for r, _ in numeric], [g for _, g in numeric], exact=True, rtol=1e-4, atol=1e-5,
                  max_approx_error=0.0)
    assert cmp.passed, cmp.to_json()
    for r, g in zip(ref, got):
        assert r.keys() == g.keys()
        for name in r:
            if r[name].dtype == object:
                assert np.array_equal(r[name], g[name]), name


def _interface(model: onnx.ModelProto):
    """Graph inputs a caller can feed (an initializer-backed input counts while something reads it) and outputs."""
    inits = {t.name for t in model.graph.initializer}
    read = {name for n in model.graph.node for name in [*n.input, *subgraph_outer_inputs(n)]}
    return ([(i.name, i.type.tensor_type.elem_type) for i in model.graph.input
             if i.name not in inits or i.name in read],
            [(o.name, o.type.tensor_type.elem_type) for o in model.graph.output])


def _computing_nodes(model: onnx.ModelProto):
    return [(n.op_type, n.domain, [a.SerializeToString() for a in n.attribute])
            for n in model.graph.node if n.op_type not in ("Identity", "Dropout")]


def _feeds(case: Case, original: onnx.ModelProto, written: onnx.ModelProto):
    rng = np.random.default_rng(7)
    if case.model == "if_subgraph":  # both branches of every If
        return [{"x": rng.standard_normal((2, 3)).astype(np.float32), "c": np.array(c)}
                for c in (True, False) for _ in range(2)]
    if case.model == "overridable_initializer":  # the default of 'scale' is overridden, as a caller may
        return [{"x": rng.standard_normal((2, 3)).astype(np.float32),
                 "scale": rng.standard_normal(3).astype(np.float32)} for _ in range(2)]
    if case.model == "string_input":
        return [{"s": np.array(["MiXeD", "ÄÖÜ", ""], dtype=object)}]
    static = written if dynamic_inputs(original) else original  # --input-shape froze the written model
    return [f for seed in range(3) for f in make_inputs(static, 1, seed)]


def _run_ort(model: onnx.ModelProto, feeds):
    runner = Runner(model)
    try:
        return runner.run_all(feeds)
    finally:
        runner.close()


class Frobnicate(OpRun):
    """The corpus's custom op (com.example), for the reference evaluator: x * gain."""

    op_domain = "com.example"

    def _run(self, x, gain=None):
        return (x * np.float32(gain),)


def _run_reference(model: onnx.ModelProto, feeds):
    evaluator = ReferenceEvaluator(model, new_ops=[Frobnicate])
    names = [o.name for o in model.graph.output]
    return [dict(zip(names, evaluator.run(None, f))) for f in feeds]


# --- the corpus through the CLI -----------------------------------------------------------------


@pytest.mark.parametrize("case,opts", _params(CASES, lambda c: c.id))
def test_hostile_input(case: Case, opts, corpus, tmp_path):
    src = corpus[case.model]
    before = src.read_bytes()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "fixed.onnx"
    report = tmp_path / "report.json"
    result = invoke(src, "-o", out, "--report", report, *opts, *case.args)
    assert src.read_bytes() == before
    codes = case.code if isinstance(case.code, tuple) else (case.code,)
    assert result.exit_code in codes, result.output
    if result.exit_code == 2:
        assert_one_line_error(result, case.phrase)
        assert os.listdir(out_dir) == []  # nothing written, no temporary file left
        return
    assert set(os.listdir(out_dir)) <= {"fixed.onnx", "fixed.onnx.data"}, os.listdir(out_dir)
    original = onnx.load(str(src))
    assert_written_result(result.output, result.exit_code, case, original, out, opts)
    record = json.loads(report.read_text(encoding="utf-8"), parse_constant=_reject_non_json)
    assert record["exit_code"] == result.exit_code
    assert record["output"]["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()


def _reject_non_json(token: str):
    raise AssertionError(f"the build record holds {token}, which is not JSON")


@pytest.mark.parametrize("case", [c for c in CASES if not c.args], ids=lambda c: c.id)
def test_check_mode_on_hostile_input(case: Case, corpus, tmp_path, monkeypatch):
    """--check reads the same inputs and writes nothing: a one-line error (exit 2) for a file it cannot use, else
    0/1 with the violations listed (it needs no validation inputs, so dynamic or string inputs are fine), never a
    traceback."""
    monkeypatch.chdir(tmp_path)
    result = invoke(corpus[case.model], "--check", *OPTION_SETS["npu"])
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 2:
        assert_one_line_error(result, ())
    assert os.listdir(tmp_path) == []


def test_corpus_is_deterministic(tmp_path):
    first, second = build(tmp_path / "a"), build(tmp_path / "b")
    assert {k: v.read_bytes() for k, v in first.items()} == {k: v.read_bytes() for k, v in second.items()}


def test_subgraphs_are_kept_and_outer_names_survive(corpus, tmp_path):
    """Cleanup leaves the Identity nodes whose outputs only a subgraph reads (and says why), removes the plain one,
    and every name a subgraph reads from an enclosing scope is still defined there."""
    for name in ("if_subgraph", "loop_subgraph"):
        out = tmp_path / f"{name}.onnx"
        # The Loop has a constant trip count: fold-constants unrolls it (tests/test_control_flow.py); skipped here
        # so that the subgraph stays and cleanup's handling of what it reads is what is tested.
        skip = ("--skip", "fold-constants") if name == "loop_subgraph" else ()
        result = invoke(corpus[name], "-o", out, "-v", *skip)
        assert result.exit_code in RESULT, result.output
        fixed = onnx.load(str(out))
        graph = fixed.graph
        defined = ({o for n in graph.node for o in n.output} | {i.name for i in graph.input}
                   | {t.name for t in graph.initializer})
        with_subgraphs = [n for n in graph.node if n.op_type in ("If", "Loop")]
        assert with_subgraphs
        for node in with_subgraphs:
            assert subgraph_outer_inputs(node) <= defined, node.name
        assert "t" in defined  # produced by the Identity only subgraphs read
        assert "id_removable" not in {n.name for n in graph.node}
        assert "subgraph" in result.output  # -v: the kept Identity says why


# --- output and report paths --------------------------------------------------------------------


@dataclass(frozen=True)
class PathCase:
    id: str
    setup: Callable[[Path, dict[str, Path]], tuple[Path, list]]
    """(work dir, corpus) -> (input model, CLI arguments after it)."""
    code: int
    phrase: tuple[str, ...] = ()
    writes: str | None = None
    """For a successful run: the file (in the work dir) that must appear."""


def _copy_plain(work: Path, corpus) -> Path:
    src = work / "in.onnx"
    shutil.copy(corpus["plain"], src)
    return src


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _touch(path: Path) -> Path:
    path.write_text("x")
    return path


def _copy_as(work: Path, corpus, name: str) -> Path:
    src = work / name
    shutil.copy(corpus["plain"], src)
    return src


def _hard_link(path: Path, target: Path) -> Path:
    os.link(target, path)
    return path


def _symlink(path: Path, target: Path) -> Path:
    path.symlink_to(target)
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _readonly_dir(work: Path) -> Path:
    ro = work / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        (ro / "probe").write_text("x")
    except PermissionError:
        return ro
    (ro / "probe").unlink()
    ro.chmod(0o755)
    pytest.skip("running as root: chmod 555 does not stop writes (the /proc case covers an unwritable place)")


def _external_input(work: Path, corpus) -> Path:
    for name in ("external_ok.onnx", "external_ok.weights"):
        shutil.copy(corpus["external_ok"].parent / name, work / name)
    return work / "external_ok.onnx"


def _newline_path(work: Path, corpus) -> Path:
    path = work / "bad\nname.onnx"
    path.write_bytes(b"")
    return path


PATH_CASES = [
    PathCase("out_is_directory", lambda w, c: (_copy_plain(w, c), ["-o", _mkdir(w / "adir")]),
             2, ("is a directory",)),
    PathCase("out_under_a_file", lambda w, c: (_copy_plain(w, c), ["-o", _touch(w / "afile") / "o.onnx"]),
             2, ("does not exist", "not a directory")),
    PathCase("out_in_readonly_dir", lambda w, c: (_copy_plain(w, c), ["-o", _readonly_dir(w) / "o.onnx"]),
             2, ("not writable",)),
    PathCase("out_in_proc", lambda w, c: (_copy_plain(w, c), ["-o", "/proc/npufix-hostile.onnx"]),
             2, ("not writable", "cannot write", "cannot be written")),
    PathCase("out_symlink_to_input", lambda w, c: (_copy_plain(w, c), ["-o", _symlink(w / "l.onnx", w / "in.onnx")]),
             2, ("is the input",)),
    PathCase("out_dotdot_to_input", lambda w, c: (_copy_plain(w, c), ["-o", _mkdir(w / "d") / ".." / "in.onnx"]),
             2, ("is the input",)),
    PathCase("out_name_too_long", lambda w, c: (_copy_plain(w, c), ["-o", w / ("x" * 300 + ".onnx")]),
             2, ("too long", "cannot write", "cannot be written")),
    PathCase("out_is_fifo", lambda w, c: (_copy_plain(w, c), ["-o", _fifo(w / "pipe")]),
             2, ("not a regular file",)),
    PathCase("out_empty_string", lambda w, c: (_copy_plain(w, c), ["-o", ""]),
             2, ("is a directory", "empty")),
    PathCase("out_is_input_external_data",
             lambda w, c: (_external_input(w, c), ["-o", w / "external_ok.weights"]),
             2, ("is the input", "external data")),
    PathCase("report_in_missing_dir",
             lambda w, c: (_copy_plain(w, c), ["-o", w / "o.onnx", "--report", w / "nope" / "r.json"]),
             2, ("does not exist",)),
    PathCase("report_is_output", lambda w, c: (_copy_plain(w, c), ["-o", w / "o.onnx", "--report", w / "o.onnx"]),
             2, ("--report",)),
    PathCase("report_is_input", lambda w, c: (_copy_plain(w, c), ["-o", w / "o.onnx", "--report", w / "in.onnx"]),
             2, ("is the input",)),
    PathCase("report_is_output_data",
             lambda w, c: (_copy_plain(w, c), ["-o", w / "o.onnx", "--report", w / "o.onnx.data"]),
             2, ("the output's external data",)),
    PathCase("report_is_input_external_data",
             lambda w, c: (_external_input(w, c), ["-o", w / "o.onnx", "--report", w / "external_ok.weights"]),
             2, ("the input's external data",)),
    PathCase("report_symlink_to_output",
             lambda w, c: (_copy_plain(w, c), ["-o", w / "o.onnx", "--report", _symlink(w / "r.json", w / "o.onnx")]),
             2, ("the output model",)),
    PathCase("out_trailing_slash", lambda w, c: (_copy_plain(w, c), ["-o", f"{w}/new.onnx/"]),
             2, ("names a directory",)),
    PathCase("out_data_is_directory",
             lambda w, c: (_copy_plain(w, c), ["-o", _mkdir(w / "o.onnx.data").with_suffix("")]),
             2, ("o.onnx.data is a directory",)),
    PathCase("newline_in_input_path", lambda w, c: (_newline_path(w, c), ["-o", w / "o.onnx"]),
             2, ("empty file",)),
    # Every file the run writes (segments and manifest, plot and sidecar, report, output) against every
    # other and every file it reads, before any work
    PathCase("report_is_split_manifest",
             lambda w, c: (_copy_plain(w, c), ["-o", w / "o.onnx", "--sram", "1MiB", "--split", _mkdir(w / "seg"),
                                               "--report", w / "seg" / "manifest.json"]),
             2, ("inside",)),
    PathCase("out_in_split_dir_external",
             lambda w, c: (_external_input(w, c), ["-o", _mkdir(w / "seg") / "segment_00.onnx", "--sram", "1MiB",
                                                   "--split", w / "seg"]),
             2, ("inside",)),
    PathCase("out_is_split_dir",
             lambda w, c: (_copy_plain(w, c), ["-o", w / "segs", "--sram", "1MiB", "--split", w / "segs"]),
             2, ("same file",)),
    PathCase("plot_sidecar_is_input",
             lambda w, c: (_copy_as(w, c, "m.png.json"), ["-o", w / "o.onnx", "--memory-plot", w / "m.png"]),
             2, ("same file",)),
    PathCase("plot_sidecar_is_input_check",
             lambda w, c: (_copy_as(w, c, "m.png.json"), ["--check", "--target", "stm32n6", "--memory-plot",
                                                          w / "m.png"]),
             2, ("same file",)),
    PathCase("plot_is_output",
             lambda w, c: (_copy_plain(w, c), ["-o", w / "o.svg", "--memory-plot", w / "o.svg"]),
             2, ("same file",)),
    PathCase("plot_is_report",
             lambda w, c: (_copy_plain(w, c), ["-o", w / "o.onnx", "--report", w / "p.png", "--memory-plot",
                                               w / "p.png"]),
             2, ("same file",)),
    PathCase("plot_hard_link_of_output",
             lambda w, c: (_copy_plain(w, c), ["-o", _touch(w / "o.onnx"), "--memory-plot",
                                               _hard_link(w / "h.png", w / "o.onnx")]),
             2, ("same file",)),
    PathCase("plot_dotdot_to_report",
             lambda w, c: (_copy_plain(w, c), ["-o", w / "o.onnx", "--report", w / "p.png", "--memory-plot",
                                               _mkdir(w / "d") / ".." / "p.png"]),
             2, ("same file",)),
    PathCase("non_ascii_output_path", lambda w, c: (_copy_plain(w, c), ["-o", w / "выход 🚀.onnx"]),
             0, writes="выход 🚀.onnx"),
]


def _snapshot(directory: Path) -> dict[str, object]:
    """Every entry under ``directory``: file bytes, symlink target, or the kind of a special file (never read)."""
    state: dict[str, object] = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            key = os.path.relpath(path, directory)
            if stat.S_ISLNK(mode):
                state[key] = ("link", os.readlink(path))
            elif stat.S_ISREG(mode):
                state[key] = Path(path).read_bytes()
            else:
                state[key] = ("kind", stat.S_IFMT(mode))
    return state


def _is_fifo(path: Path) -> bool:
    try:
        return path.is_fifo()
    except OSError:  # e.g. a name too long for the file system
        return False


@pytest.mark.parametrize("case,opts", _params(PATH_CASES, lambda c: c.id))
def test_output_and_report_paths(case: PathCase, opts, corpus, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "cwd").mkdir()
    monkeypatch.chdir(work / "cwd")  # a relative or empty path must not land in the repository
    src, args = case.setup(work, corpus)
    before = _snapshot(work)
    # Hold a FIFO open for reading, so an npufix that writes into it cannot block the test.
    readers = [os.open(a, os.O_RDWR | os.O_NONBLOCK) for a in args if isinstance(a, Path) and _is_fifo(a)]
    try:
        result = invoke(src, *args, *opts)
    finally:
        for fd in readers:
            os.close(fd)
    after = _snapshot(work)
    if case.code == 2:
        assert_one_line_error(result, case.phrase)
        assert after == before  # nothing written, nothing replaced, no temporary file left
        return
    assert result.exit_code == case.code, result.output
    assert set(after) - set(before) == {case.writes}
    assert {k: v for k, v in after.items() if k in before} == before
    assert_written_result(result.output, result.exit_code, Case("plain", case.code), onnx.load(str(src)),
                          work / case.writes, opts)


# --- a few through a real process ---------------------------------------------------------------


def _npufix(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onnx_npu_fix", *map(str, args)], capture_output=True,
                          text=True, encoding="utf-8", errors="replace", env=env, timeout=120)


def test_subprocess_truncated_file(corpus, tmp_path):
    out = tmp_path / "o.onnx"
    proc = _npufix(corpus["truncated_in_weight"], "-o", out)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "truncated" in proc.stderr
    assert os.listdir(tmp_path) == []


def test_subprocess_non_ascii_names_in_c_locale(corpus, tmp_path):
    """-v prints every changed node's name; an ASCII-only terminal must not turn that into a crash."""
    out = tmp_path / "o.onnx"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": "ascii"}
    proc = _npufix(corpus["non_ascii_names"], "-o", out, "-v", *OPTION_SETS["npu"], env=env)
    assert proc.returncode in RESULT, proc.stderr
    assert "Traceback" not in proc.stderr
    original = onnx.load(str(corpus["non_ascii_names"]))
    assert_written_result(proc.stderr, proc.returncode, Case("non_ascii_names", RESULT), original, out,
                          OPTION_SETS["npu"])


def test_subprocess_loop_subgraph(corpus, tmp_path):
    out = tmp_path / "o.onnx"
    proc = _npufix(corpus["loop_subgraph"], "-o", out, *OPTION_SETS["npu"])
    assert proc.returncode in RESULT, proc.stderr
    assert "Traceback" not in proc.stderr
    original = onnx.load(str(corpus["loop_subgraph"]))
    assert_written_result(proc.stderr, proc.returncode, Case("loop_subgraph", RESULT), original, out,
                          OPTION_SETS["npu"])


def _small_file_limit() -> None:
    """In the child: files may not grow past 600 bytes (a full disk, as seen by write()), and going past the
    limit is an error (EFBIG) instead of the SIGXFSZ that would kill the process."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE stands in for a full disk")
def test_subprocess_disk_full_while_writing(corpus, tmp_path):
    out = tmp_path / "o.onnx"
    assert corpus["plain"].stat().st_size > 600
    proc = subprocess.run([sys.executable, "-m", "onnx_npu_fix", str(corpus["plain"]), "-o", str(out)],
                          capture_output=True, text=True, preexec_fn=_small_file_limit, timeout=120)
    assert os.listdir(tmp_path) == []  # no partial model, no temporary file
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "rror" in line]
    assert len(errors) == 1 and "too large" in errors[0].lower(), proc.stderr
