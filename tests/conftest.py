"""Shared test fixtures: deterministic seeds and the real-data directory."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def data_dir() -> Path | None:
    """MEMNETS_DATA, else ../shared/data beside the repository; None if neither exists."""
    env = os.environ.get("MEMNETS_DATA")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if cand.is_dir():
            return cand
    return None


@pytest.fixture
def real_data_dir() -> Path:
    d = data_dir()
    if d is None:
        msg = "real data not found: set MEMNETS_DATA or place shared/data beside the repository"
        print(msg)
        pytest.skip(msg)
    return d


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tests run tiny models, where intra-op threading costs more than it gives (and a loaded
    machine makes it far worse); one thread keeps timings stable."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
