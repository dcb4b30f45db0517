"""What a run records about where it ran (``env.json``) and distributed set-up helpers."""
from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["run_env", "model_impls", "DistInfo", "setup_distributed", "cleanup_distributed", "resolve_device"]


def _git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _nam_scan_impl() -> str | None:
    try:
        from ..ops.delta import resolve_impl

        q = torch.zeros(1, 64, 1, 16)  # [B, T, H, dk] — what "auto" picks for a typical sequence
        return resolve_impl("auto", q)
    except Exception:  # the op family may be absent or have another signature
        return None


def model_impls(model: torch.nn.Module) -> dict[str, str]:
    """The ``impl`` every submodule of ``model`` runs, by module path (``""`` for ``model``
    itself): ``"reference"`` or ``"fused"`` (resolved at construction), or ``"auto"`` where the op
    picks per call (the NAM scan; see ``nam_scan_impl``). Modules without an ``impl`` are left out."""
    return {name: impl for name, mod in model.named_modules()
            if isinstance(impl := getattr(mod, "impl", None), str)}


def run_env(device: torch.device, world_size: int = 1, model: torch.nn.Module | None = None) -> dict[str, Any]:
    """torch version, threads, device, git commit (when available), NAM scan implementation,
    with ``model`` the implementation each of its memories runs (``impls``, :func:`model_impls`),
    on the CPU which C kernels of :mod:`memnets.ops._native` load here (``native_kernels``;
    where one does not, its PyTorch path runs), and on CUDA the Triton release and whether
    memnets' Triton kernels run with it (``triton``, ``triton_kernels``)."""
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "cuda": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "world_size": world_size,
        "git_commit": _git_commit(),
        "nam_scan_impl": _nam_scan_impl(),
        "pid": os.getpid(),
    }
    if model is not None:
        env["impls"] = model_impls(model)
    if device.type == "cuda":  # memnets' Triton kernels, or (an older triton, none) the PyTorch paths
        from ..ops.gpu import triton_ok, triton_release

        env["triton"] = triton_release()
        env["triton_kernels"] = triton_ok()
    if device.type == "cpu":  # the C kernels (NAM-TM tapes and heads, GRU step, LSAM step) or their PyTorch paths
        from ..ops import _native

        env["native_kernels"] = _native.status()
    return env


@dataclass(frozen=True)
class DistInfo:
    """Process ``rank`` of ``world`` (1 when not distributed); ``local_rank`` picks the GPU."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> DistInfo:
    """Join the process group described by torchrun's environment (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def cleanup_distributed(info: DistInfo, barrier: bool = False) -> None:
    """Leave the process group. ``barrier``: first wait until every process got here (after a
    run that finished everywhere), so no process tears its connections down while another is
    still using them; after an error the others may never come, so there is no wait then."""
    if info.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            if barrier:
                dist.barrier()
            dist.destroy_process_group()


def resolve_device(name: str, info: DistInfo | None = None) -> torch.device:
    """``auto`` → ``cuda:<local_rank>`` when CUDA is available, else ``cpu`` (``info``
    defaults to a single, non-distributed process).

    Raises :class:`~memnets.train.config.ConfigError` for a device this machine lacks
    (``cuda`` without CUDA, ``cuda:N`` past the device count, ``mps`` without MPS).
    """
    from .config import ConfigError

    info = DistInfo() if info is None else info

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"`device`: {name!r} is not a torch device ({e})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"`device` is {name!r} but CUDA is not available on this machine; use device=cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"`device` is {name!r} but this machine has {torch.cuda.device_count()} CUDA "
                              "device(s)")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ConfigError(f"`device` is {name!r} but MPS is not available on this machine; use device=cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", info.local_rank)
    return dev
