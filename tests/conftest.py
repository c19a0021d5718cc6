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
