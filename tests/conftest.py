"""Shared test fixtures: deterministic seeds and the real-data directory; on a GPU, a pytest-xdist
worker whose CUDA context a failed test left unusable ends, so that a fresh one runs the rest."""
from __future__ import annotations

import contextlib
import os
import sys
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


class CudaSide:
    """Where a test's "CUDA" copy runs: a CUDA device, or (``cuda_path-cpu``) CPU tensors down
    the CUDA code path (:func:`memnets.ops.gpu.cuda_path`, C kernels off; Triton kernels through
    the interpreter when ``TRITON_INTERPRET=1``), so the GPU tests also run, and fail, in CI."""

    def __init__(self, name: str):
        self.name = name
        self.is_cuda = name == "cuda"
        self.device = torch.device("cuda" if self.is_cuda else "cpu")

    def __repr__(self) -> str:
        return f"CudaSide({self.name!r})"

    @contextlib.contextmanager
    def path(self):
        """The code path of this side: plain CUDA, or ``cuda_path()`` with ``MEMNETS_NATIVE=0``."""
        from memnets.ops.gpu import cuda_code_path

        with cuda_code_path("cuda" if self.is_cuda else "cpu"):
            yield


@pytest.fixture(params=[pytest.param("cpu", id="cuda_path-cpu"),
                        pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
                            not torch.cuda.is_available(), reason="CUDA is not available on this machine"))])
def cuda_side(request) -> CudaSide:
    """Each GPU test twice: on CUDA where there is one, and always on the CPU down the CUDA path."""
    return CudaSide(request.param)


@pytest.fixture(scope="module")
def triton_interpreter():
    """Without a GPU, Triton kernels run through Triton's interpreter: ``TRITON_INTERPRET=1``
    for the tests of the module that asks for it (not at import, so collecting that file changes
    nothing for the rest of a session). Triton follows it only if triton is first imported
    after this; ``make test-triton`` sets it for the whole run."""
    if torch.cuda.is_available():
        yield
        return
    from memnets.ops.gpu import env_var

    with env_var("TRITON_INTERPRET", "1"):
        yield


def end_worker_if_cuda_lost(nodeid: str, exit=os._exit) -> bool:
    """After a failed test on a pytest-xdist worker: if the test left this process's CUDA context
    unusable (an illegal memory access fails every later CUDA call in the process), end the
    worker. xdist reports the test as crashed (besides its own failure) and starts a fresh worker
    for the tests still to run, which would otherwise all fail with the same error. Returns
    whether it ended (``exit`` is called)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return False
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return False
    from memnets.bench.isolated import cuda_usable

    if cuda_usable():
        return False
    sys.stderr.write(f"\n{nodeid} left the CUDA context unusable: this worker ends, a fresh one runs the rest\n")
    sys.stderr.flush()
    exit(3)
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if outcome.get_result().failed:
        item._memnets_failed = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if getattr(item, "_memnets_failed", False):
        end_worker_if_cuda_lost(item.nodeid)
