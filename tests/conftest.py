import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "fixtures")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


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
