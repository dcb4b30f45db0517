"""Older releases of what memnets runs on: the forms it falls back on under an older PyTorch,
held to the current ones, and the Triton release below which its kernels are not used.

``pyproject.toml`` accepts torch >= 2.4; the functions later releases added are replaced there
by forms of memnets' own (checked here by hiding the new function, and by the whole fast test
tier under torch 2.4.1: README, "Versions")."""
import pytest
import torch

from memnets.train import loop


def _model_with_grads(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model[2].bias.requires_grad_(False)  # a parameter without a gradient is left out
    model(torch.randn(4, 5)).pow(2).sum().mul(10.0).backward()
    return model


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_gradient_norm_and_clipping_without_torch_2_6_functions(monkeypatch, max_norm):
    new = _model_with_grads(0)
    params, norm = loop._gradient_norm(new)
    loop._clip_with_norm(params, max_norm, norm)
    monkeypatch.delattr(torch.nn.utils, "get_total_norm", raising=False)
    monkeypatch.delattr(torch.nn.utils, "clip_grads_with_norm_", raising=False)
    old = _model_with_grads(0)
    params_old, norm_old = loop._gradient_norm(old)
    assert len(params_old) == len(params) == 3
    torch.testing.assert_close(norm_old, norm)
    loop._clip_with_norm(params_old, max_norm, norm_old)
    for a, b in zip(new.parameters(), old.parameters()):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad)
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params_old]))
    assert float(total) == pytest.approx(min(float(norm), max_norm), rel=1e-5)


def test_gradient_norm_of_no_gradients_is_zero(monkeypatch):
    monkeypatch.delattr(torch.nn.utils, "get_total_norm", raising=False)
    params, norm = loop._gradient_norm(torch.nn.Linear(2, 2))
    assert params == [] and float(norm) == 0.0


@pytest.fixture
def triton_installed_as(monkeypatch):
    """``set(dist, version)``: make the package metadata say that ``dist`` installs the
    ``triton`` module at ``version`` (nothing else changes); the caches are cleared around."""
    import importlib.metadata
    import importlib.util

    from memnets.ops import gpu

    real_spec, real_version = importlib.util.find_spec, importlib.metadata.version

    def set_(dist: str, version: str) -> None:
        def find_spec(name, *args, **kwargs):
            return object() if name == "triton" else real_spec(name, *args, **kwargs)

        def metadata_version(name):
            if name == dist:
                return version
            if name in gpu._TRITON_DISTS:
                raise importlib.metadata.PackageNotFoundError(name)
            return real_version(name)
        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        monkeypatch.setattr(importlib.metadata, "version", metadata_version)
        gpu.triton_release.cache_clear()
        gpu._importable.cache_clear()
    yield set_
    monkeypatch.undo()
    gpu.triton_release.cache_clear()
    gpu._importable.cache_clear()


def test_a_triton_older_than_the_kernels_need_is_not_used_and_said_so(triton_installed_as, monkeypatch):
    from memnets.ops import gpu

    monkeypatch.delenv("MEMNETS_TRITON", raising=False)
    triton_installed_as("triton", "3.4.0")
    assert gpu.triton_version() == (3, 4)
    with pytest.warns(RuntimeWarning, match=r"triton 3\.4 is older than 3\.5.*PyTorch paths"):
        assert not gpu.triton_ok()
    assert not gpu.triton_ok()  # said once


@pytest.mark.parametrize("dist, version, expected", [("triton", "3.5.1", (3, 5)), ("triton", "3.9.0", (3, 9)),
                                                     ("pytorch-triton", "3.6.0+git1234abcd", (3, 6))])
def test_a_recent_triton_is_used(triton_installed_as, monkeypatch, recwarn, dist, version, expected):
    from memnets.ops import gpu

    monkeypatch.delenv("MEMNETS_TRITON", raising=False)
    triton_installed_as(dist, version)
    assert gpu.triton_version() == expected
    assert gpu.triton_ok()
    assert not [w for w in recwarn if "older than" in str(w.message)]
    monkeypatch.setenv("MEMNETS_TRITON", "0")
    assert not gpu.triton_ok()
