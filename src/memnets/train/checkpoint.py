"""Atomic checkpoints and the run-directory lock.

A checkpoint is two files, ``checkpoints/step-<N>.safetensors`` (model weights, with the
model config in its metadata) and ``checkpoints/step-<N>.state.pt`` (optimiser state, RNG
states, loop position; read back with ``torch.load(weights_only=True)``), plus the pointer
``checkpoints/last.json`` naming them. Every file is written to a temporary name and moved
into place with ``os.replace``; the pointer is replaced last, so a crash at any moment leaves
the previous complete checkpoint in force. After the pointer moves, step files older than the
previous committed checkpoint are removed, so two complete checkpoints stay on disk.

A file that cannot be read back (truncated, tampered, a torn ``last.json``) raises
:class:`CorruptCheckpointError` (a ValueError) naming it; :func:`load_checkpoint` then falls
back to the newest older checkpoint that loads and says so on stderr.
"""
from __future__ import annotations

import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

__all__ = ["atomic_write_bytes", "atomic_write_text", "save_checkpoint", "load_checkpoint",
           "has_checkpoint", "save_weights", "load_weights", "RunLock", "RunLockedError",
           "CorruptCheckpointError"]


class CorruptCheckpointError(ValueError):
    """A checkpoint file (weights, state or ``last.json``) that cannot be read back; the message
    names the file. ``path`` holds it."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = Path(path)
        super().__init__(f"checkpoint file {self.path} is corrupt or truncated: {reason}")


def _reason(e: BaseException) -> str:
    """The exception's type and first line, plus a line naming a refused pickle global if any."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    extra = [x for x in lines[1:] if "Unsupported global" in x][:1]
    return f"{type(e).__name__}: " + " ".join((lines[:1] + extra))[:400]


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


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; :class:`CorruptCheckpointError` if it cannot be parsed,
    FileNotFoundError if it is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights file {path}")
    try:
        return load_file(str(path))
    except Exception as e:  # SafetensorError, OSError, ... from a damaged file
        raise CorruptCheckpointError(path, _reason(e)) from e


def load_weights(path: str | Path, model: torch.nn.Module) -> None:
    """Load safetensors weights into ``model`` (strict).

    Raises :class:`CorruptCheckpointError` for an unreadable file; a file that parses but does
    not fit ``model`` raises torch's RuntimeError from ``load_state_dict``.
    """
    model.load_state_dict(read_weights(path), strict=True)


def save_checkpoint(ckpt_dir: str | Path, step: int, model: torch.nn.Module, state: dict[str, Any],
                    metadata: dict[str, str] | None = None) -> None:
    """Write step files, then ``last.json`` (the commit point), then prune step files older than
    the previously committed checkpoint (which stays as a fallback)."""
    d = Path(ckpt_dir)
    stem = f"step-{step:09d}"
    try:
        prev = _read_pointer(d)
    except (CorruptCheckpointError, FileNotFoundError):
        prev = None
    keep = {stem} | ({prev["weights"].split(".")[0]} if prev else set())
    save_weights(d / f"{stem}.safetensors", model, metadata)
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(d / f"{stem}.state.pt", buf.getvalue())
    atomic_write_text(d / "last.json", json.dumps({"step": step, "weights": f"{stem}.safetensors",
                                                   "state": f"{stem}.state.pt"}))
    for p in d.glob("step-*"):
        if p.name.split(".")[0] not in keep:
            p.unlink(missing_ok=True)


def has_checkpoint(ckpt_dir: str | Path) -> bool:
    """Whether ``ckpt_dir`` holds a ``last.json`` pointer (readable or not)."""
    return (Path(ckpt_dir) / "last.json").is_file()


_STEP = re.compile(r"step-(\d+)\.safetensors")


def _read_pointer(d: Path) -> dict[str, Any]:
    """``last.json`` as ``{"step", "weights", "state"}``; CorruptCheckpointError if torn or malformed."""
    path = d / "last.json"
    try:
        ptr = json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptCheckpointError(path, _reason(e)) from e
    ok = (isinstance(ptr, dict) and isinstance(ptr.get("step"), int)
          and all(isinstance(ptr.get(k), str) and "/" not in ptr[k] and not ptr[k].startswith(".")
                  for k in ("weights", "state")))
    if not ok:
        raise CorruptCheckpointError(path, f"unexpected content {str(ptr)[:100]!r}")
    return ptr


def _load_one(d: Path, weights: str, state: str, model: torch.nn.Module) -> dict[str, Any]:
    tensors = read_weights(d / weights)
    spath = d / state
    if not spath.is_file():
        raise CorruptCheckpointError(spath, "missing")
    try:
        st = torch.load(spath, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated zip, or a pickle that weights_only refuses
        raise CorruptCheckpointError(spath, _reason(e)) from e
    if not isinstance(st, dict) or "step" not in st:
        raise CorruptCheckpointError(spath, "not a training-state dictionary")
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise ValueError(f"weights file {d / weights} does not fit the model: {_reason(e)}") from e
    return st


def load_checkpoint(ckpt_dir: str | Path, model: torch.nn.Module, *, fallback: bool = True) -> dict[str, Any]:
    """Load the last checkpoint's weights into ``model``; return its state dict.

    The checkpoint named by ``last.json`` is tried first; if it (or the pointer itself) is
    corrupt and ``fallback`` is true, the older ``step-*`` checkpoints in the directory are
    tried newest first, and the one used is reported on stderr. The returned dict gets the
    key ``"checkpoint"`` (the stem used, e.g. ``"step-000000008"``). Raises
    :class:`CorruptCheckpointError` naming the first corrupt file when none loads, and
    ValueError when a checkpoint loads but does not fit ``model`` (a different model).
    """
    d = Path(ckpt_dir)
    candidates: list[tuple[str, str]] = []
    first_error: CorruptCheckpointError | None = None
    try:
        ptr = _read_pointer(d)
        candidates.append((ptr["weights"], ptr["state"]))
    except CorruptCheckpointError as e:
        first_error = e
        if not fallback:
            raise
        print(f"{e}; looking for step files", file=sys.stderr, flush=True)
    if fallback:
        steps = sorted((int(m.group(1)), m.group(0)) for p in d.glob("step-*.safetensors")
                       if (m := _STEP.fullmatch(p.name)))
        for _, name in reversed(steps):
            pair = (name, name.replace(".safetensors", ".state.pt"))
            if pair not in candidates:
                candidates.append(pair)
    for weights, state in candidates:
        try:
            st = _load_one(d, weights, state, model)
        except (CorruptCheckpointError, FileNotFoundError) as e:
            err = e if isinstance(e, CorruptCheckpointError) else CorruptCheckpointError(d / weights, "missing")
            first_error = first_error or err
            if not fallback:
                raise err from e
            print(f"{err}; trying an older checkpoint", file=sys.stderr, flush=True)
            continue
        st["checkpoint"] = weights.split(".")[0]
        if first_error is not None:
            print(f"resuming from {st['checkpoint']} (step {st['step']}) instead", file=sys.stderr, flush=True)
        return st
    if first_error is None:
        raise FileNotFoundError(f"no checkpoint in {d}")
    raise first_error


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
