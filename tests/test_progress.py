"""Progress: the library emits events (onnx_npu_fix.progress) as passes are settled and long steps advance; the CLI
prints each pass line as it finishes and, when asked or on a terminal, a progress line."""

from __future__ import annotations

import threading

import pytest
from click.testing import CliRunner
from helpers import break_cleanup

from onnx_npu_fix import api, progress
from onnx_npu_fix.cli import main
from onnx_npu_fix.config.options import FixOptions


class _Log(list):
    """Events (and markers) in the order they happened, with the status each record had when announced."""

    def __call__(self, event):
        if isinstance(event, progress.PassFinished):
            self.append(("finished", event.record.name, str(event.record.status), id(event.record)))
        elif isinstance(event, progress.Step):
            self.append(("step", event.task, event.done, event.total, threading.current_thread().name))


def _spy_on(monkeypatch, log, cls):
    original = cls.run

    def run(self, model, options):
        log.append(("ran", self.name))
        return original(self, model, options)

    monkeypatch.setattr(cls, "run", run)


def test_each_pass_is_announced_once_when_settled_in_order(tmp_path, fixture_path, monkeypatch):
    from onnx_npu_fix.passes.dilated_conv import DilatedConvPass

    log = _Log()
    _spy_on(monkeypatch, log, DilatedConvPass)
    outcome = api.run(fixture_path("tcn.onnx"), tmp_path / "o.onnx", FixOptions(max_dilation=4), on_event=log)
    finished = [e for e in log if e[0] == "finished"]
    report = outcome.report.passes
    # every record once, in order, with the status it ends with (a grouped pass is announced after its group)
    assert [(name, status, ident) for _, name, status, ident in finished] == \
        [(r.name, str(r.status), id(r)) for r in report]
    assert {r.status for r in report} >= {"validated"}
    # printed as they finish: fold-constants before dilated-conv even ran
    assert log.index(finished[0]) < log.index(("ran", "dilated-conv"))


def test_a_replayed_group_announces_only_what_the_report_keeps(tmp_path, fixture_path, monkeypatch):
    break_cleanup(monkeypatch)
    log = _Log()
    outcome = api.run(fixture_path("unet.onnx"), tmp_path / "o.onnx", FixOptions(keep_going=True), on_event=log)
    finished = [(name, status, ident) for kind, name, status, ident in (e for e in log if e[0] == "finished")]
    assert finished == [(r.name, str(r.status), id(r)) for r in outcome.report.passes]
    assert ("cleanup", "rolled back") in [(n, s) for n, s, _ in finished]


def test_validation_steps_come_from_the_run_and_its_reference_worker(tmp_path, fixture_path):
    log = _Log()
    outcome = api.run(fixture_path("tcn.onnx"), tmp_path / "o.onnx", FixOptions(max_dilation=4, n_inputs=3),
                      on_event=log)
    steps = [e for e in log if e[0] == "step"]
    reference = [(done, total) for _, task, done, total, _ in steps if task == "reference outputs"]
    assert reference == [(1, 3), (2, 3), (3, 3)]
    assert {thread for _, task, *_, thread in steps if task == "reference outputs"} != {"MainThread"}
    validation = [(task, done, total) for _, task, done, total, _ in steps if task.startswith("validating ")]
    first = next(r for r in outcome.report.passes if r.status == "validated")
    label = "validating " + ", ".join(first.validated_with or [first.name])  # the group checked together
    assert validation[:3] == [(label, 1, 3), (label, 2, 3), (label, 3, 3)]


def test_nobody_listens_outside_a_run_and_runs_do_not_share_listeners(tmp_path, fixture_path):
    outer, inner = _Log(), _Log()
    with progress.listening(outer):
        api.run(fixture_path("tcn.onnx"), tmp_path / "o.onnx", FixOptions(max_dilation=4), on_event=inner)
        progress.emit(progress.Step("after", 1, 1))
    progress.emit(progress.Step("outside", 1, 1))  # nobody listens: no error, nowhere
    assert outer == [("step", "after", 1, 1, "MainThread")]
    assert any(e[0] == "finished" for e in inner)


def test_the_cli_prints_each_pass_line_once_and_a_progress_line_only_when_asked(tmp_path, fixture_path):
    def run(*extra):
        return CliRunner().invoke(main, [fixture_path("tcn.onnx"), "-o", str(tmp_path / "o.onnx"),
                                         "--max-dilation", "4", *extra], catch_exceptions=False)

    plain, asked, quiet = run(), run("--progress"), run("-q", "--no-progress")
    for result in (plain, asked):
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert [line.split()[0] for line in lines if line.startswith(("fold-constants", "dilated-conv"))] == \
            ["fold-constants", "dilated-conv"]
    assert "progress:" not in plain.output  # not a terminal, not asked: no progress line in a CI log
    assert "progress: reference outputs 1/3" in asked.output or "progress: validating cleanup" in asked.output
    kept = [line.split()[0] for line in asked.output.splitlines() if not line.startswith("progress: ")]
    assert kept == [line.split()[0] for line in plain.output.splitlines()]  # the same summary, nothing repeated
    assert quiet.output == ""


@pytest.mark.parametrize("asked,quiet,expected", [(True, True, True), (False, False, False), (None, True, False)])
def test_progress_line_choice(asked, quiet, expected):
    from onnx_npu_fix.cli import _wants_progress_line

    assert _wants_progress_line(asked, quiet) is expected
