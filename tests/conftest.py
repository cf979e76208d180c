"""Shared test setup: the repo root on sys.path, and paths to the shared real data."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"real problem sets not found at {SHARED_DATA}")
    return SHARED_DATA
