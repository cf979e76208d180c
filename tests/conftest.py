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


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models are all small ops: one torch thread is as fast, and far steadier on a busy machine."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tok():
    """The real Qwen BPE of the tiny test model (a module may define its own)."""
    from data.models import load_tokenizer
    return load_tokenizer("tiny-qwen3")


@pytest.fixture(scope="module")
def sb():
    """A real sandbox, one slot (a module may define its own)."""
    from sandbox import Sandbox
    with Sandbox(slots=1, timeout_s=4.0) as s:
        yield s
