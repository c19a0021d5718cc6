from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FIXTURES = os.path.join(ROOT, "fixtures")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True, scope="session")
def sigint_raises_keyboard_interrupt():
    """The signal tests raise SIGINT here and in the npufix processes they start, and expect exit 130. A suite
    started in the background by a non-interactive shell inherits SIGINT *ignored* (POSIX: asynchronous commands
    ignore SIGINT without job control), and so would every child; with a handler installed here, exec gives each
    child the default again, and Python its KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def fixture_path():
    def get(name: str) -> str:
        return os.path.join(FIXTURES, name)

    return get


@pytest.fixture
def no_model_copies(monkeypatch):
    """The pass manager may not keep a copy of the model: a run that can read its input again restores by
    reading (the scheduler's copy_model raises)."""
    from onnx_npu_fix.pipeline import scheduler as pipeline
    def refuse(model):
        raise AssertionError("the pass manager kept a copy although it can read the input again")

    monkeypatch.setattr(pipeline, "copy_model", refuse)


@dataclass(frozen=True)
class FixedFixture:
    """One ``npufix FIXTURE -o OUT ARGS --report REPORT -v`` run through click's runner."""

    result: Result
    out: Path
    report: dict


@pytest.fixture(scope="session")
def fixed_fixture(tmp_path_factory):
    """Fix a fixture model once per session for each set of arguments: several modules check the same fix from
    different sides (test_cli's --check of the output, test_real_models' structure and equivalence). The run is
    verbose and writes a report, so every reader finds what it needs; callers must not change the files."""
    from onnx_npu_fix.cli import main

    done: dict[tuple[str, tuple[str, ...]], FixedFixture] = {}

    def fix(name: str, *args: str) -> FixedFixture:
        key = (name, tuple(args))
        if key not in done:
            out_dir = tmp_path_factory.mktemp("fixed")
            out, report = out_dir / name, out_dir / "report.json"
            result = CliRunner().invoke(main, [os.path.join(FIXTURES, name), "-o", str(out), *args, "--report",
                                               str(report), "-v"], catch_exceptions=False)
            done[key] = FixedFixture(result, out, json.loads(report.read_text()) if report.exists() else {})
        return done[key]

    return fix
