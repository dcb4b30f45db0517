"""Atomic checkpoints and the run-directory lock.

A checkpoint is two files, ``checkpoints/step-<N>.safetensors`` (model weights, with the
model config in its metadata) and ``checkpoints/step-<N>.state.pt`` (optimiser state, RNG
states, loop position; read back with ``torch.load(weights_only=True)``), plus the pointer
``checkpoints/last.json`` naming them. Every file is written to a temporary name and moved
into place with ``os.replace``; the pointer is replaced last, so a crash at any moment leaves
the previous complete checkpoint in force. Older step files are removed afterwards.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

__all__ = ["atomic_write_bytes", "atomic_write_text", "save_checkpoint", "load_checkpoint",
           "has_checkpoint", "save_weights", "load_weights", "RunLock", "RunLockedError"]


def _atomic(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``."""
    _atomic(Path(path), lambda f: f.write(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def save_weights(path: str | Path, model: torch.nn.Module, metadata: dict[str, str] | None = None) -> None:
    """Model weights to safetensors, atomically (tensors made contiguous, shared storage cloned)."""
    path = Path(path)
    tensors = {k: v.detach().contiguous().clone().cpu() for k, v in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_weights(path: str | Path, model: torch.nn.Module) -> None:
    """Load safetensors weights into ``model`` (strict)."""
    model.load_state_dict(load_file(str(path)), strict=True)


def save_checkpoint(ckpt_dir: str | Path, step: int, model: torch.nn.Module, state: dict[str, Any],
                    metadata: dict[str, str] | None = None) -> None:
    """Write step files, then ``last.json`` (the commit point), then prune older step files."""
    d = Path(ckpt_dir)
    stem = f"step-{step:09d}"
    save_weights(d / f"{stem}.safetensors", model, metadata)
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(d / f"{stem}.state.pt", buf.getvalue())
    atomic_write_text(d / "last.json", json.dumps({"step": step, "weights": f"{stem}.safetensors",
                                                   "state": f"{stem}.state.pt"}))
    for p in d.glob("step-*"):
        if not p.name.startswith(stem):
            p.unlink(missing_ok=True)


def has_checkpoint(ckpt_dir: str | Path) -> bool:
    return (Path(ckpt_dir) / "last.json").is_file()


def load_checkpoint(ckpt_dir: str | Path, model: torch.nn.Module) -> dict[str, Any]:
    """Load the last checkpoint's weights into ``model``; return its state dict."""
    d = Path(ckpt_dir)
    ptr = json.loads((d / "last.json").read_text())
    load_weights(d / ptr["weights"], model)
    return torch.load(d / ptr["state"], map_location="cpu", weights_only=True)


class RunLockedError(RuntimeError):
    """Another live process holds the run directory."""


class RunLock:
    """An exclusive ``<run_dir>/lock`` file holding the owner's pid.

    Taken with ``O_CREAT | O_EXCL``; a lock left by a dead process (e.g. after SIGKILL) is
    taken over. Use as a context manager.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "lock"

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    pid = int(self.path.read_text().strip() or "0")
                except (OSError, ValueError):
                    pid = 0
                if pid and _alive(pid):
                    raise RunLockedError(f"run directory {self.path.parent} is in use by process {pid} "
                                         f"(lock file {self.path})") from None
                self.path.unlink(missing_ok=True)  # stale lock
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return
        raise RunLockedError(f"could not take the lock {self.path}")

    def release(self) -> None:
        try:
            if self.path.read_text().strip() == str(os.getpid()):
                self.path.unlink()
        except OSError:
            pass

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
