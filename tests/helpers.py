"""Small helpers shared by several test files (tests/ is on sys.path under pytest)."""
from __future__ import annotations

import torch

from memnets.tasks.ntm_tasks import CopyTask, bits_per_sequence


def copy_cost_before_after(model: torch.nn.Module, task: CopyTask, steps: int = 100,
                           lr: float = 1e-2, batch_size: int = 16) -> tuple[float, float]:
    """Train ``model`` on ``task`` for ``steps`` Adam steps; the held-out copy cost (bits per
    sequence on 64 fixed sequences) before and after."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    held_out = task.make_batch(64, torch.Generator().manual_seed(99))

    def cost() -> float:
        with torch.no_grad():
            return float(bits_per_sequence(model(held_out.inputs)[0], held_out.targets, held_out.mask))

    start = cost()
    for _ in range(steps):
        b = task.make_batch(batch_size, g)
        loss = bits_per_sequence(model(b.inputs)[0], b.targets, b.mask)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
    return start, cost()


def backbone_names() -> list[str]:
    """Every sequence backbone (memnets.models.seq.BACKBONES), for parametrize."""
    from memnets.models.seq import BACKBONES
    return list(BACKBONES)


def tiny_backbone_model(backbone: str) -> torch.nn.Module:
    """A SequenceTaskModel of ``backbone`` at its tiny size (vocabulary 16, seed 0); skips the
    test when the backbone cannot be built here."""
    import pytest

    from memnets.models.seq import SIZES, SequenceTaskModel, backbone_available
    ok, why = backbone_available(backbone)
    if not ok:
        pytest.skip(f"backbone {backbone!r} not available: {why}")
    torch.manual_seed(0)
    kw = dict(SIZES["tiny"][backbone])
    return SequenceTaskModel(backbone, vocab_size=16, d_model=kw.pop("d_model"), **kw)


def triton_missing() -> list[str]:
    """What the Triton kernel tests need and is not installed: triton (not older than
    ``memnets.ops.gpu.MIN_TRITON``), and numpy for the interpreter where there is no GPU."""
    import importlib.util

    from memnets.ops.gpu import MIN_TRITON, triton_version

    need = ("triton",) + (() if torch.cuda.is_available() else ("numpy",))
    missing = [m for m in need if importlib.util.find_spec(m) is None]
    version = triton_version()
    if version is not None and version < MIN_TRITON:
        missing.append("triton>={}.{} ({}.{} is installed)".format(*MIN_TRITON, *version))
    return missing


def triton_marks() -> list:
    """``pytestmark`` of a Triton kernel test module: the ``interpret`` tier (``make
    test-triton``), the ``triton_interpreter`` fixture (the interpreter where there is no GPU),
    and a skip, with the reason, where triton or numpy is not installed."""
    import pytest

    missing = triton_missing()
    return [pytest.mark.interpret, pytest.mark.usefixtures("triton_interpreter"),
            pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)} "
                               "(pip install 'memnets[gpu]' numpy)")]


class _Counting:
    """A Triton kernel whose launches are counted (``kernel[grid](...)``)."""

    def __init__(self, kernel, name, counts):
        self.kernel, self.name, self.counts = kernel, name, counts

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.counts[self.name] += 1
            self.counts.warps.setdefault(self.name, set()).add(kwargs.get("num_warps"))
            return launch(*args, **kwargs)
        return run


def counting_kernels(module, monkeypatch, names=("forward_step", "backward_step", "forward_seq", "backward_seq")):
    """Count the launches of ``module.kernels()``'s kernels by name (``counts.warps``: the
    ``num_warps`` each was launched with)."""
    import collections

    counts = collections.Counter()
    counts.warps = {}
    real = module.kernels()
    monkeypatch.setattr(module, "kernels", lambda: tuple(_Counting(k, n, counts) for k, n in zip(real, names)))
    return counts
