"""Atomic checkpoints and the run-directory lock.

A checkpoint is two files, ``checkpoints/step-<N>.safetensors`` (model weights, with the
model config in its metadata) and ``checkpoints/step-<N>.state.pt`` (optimiser state, RNG
states, loop position; read back with ``torch.load(weights_only=True)``), plus the pointer
``checkpoints/last.json`` naming them. Every file is written to a temporary name and moved
into place with ``os.replace``; the pointer is replaced last, so a crash at any moment leaves
the previous complete checkpoint in force. After the pointer moves, step files older than the
previous committed checkpoint are removed, so two complete checkpoints stay on disk.

A checkpoint that cannot be written (a full disk, a file-size limit) raises
:class:`CheckpointWriteError`, one line saying that the previous checkpoint is kept; nothing
of the new one stays behind.

A file that cannot be read back (truncated, tampered, a torn ``last.json``) raises
:class:`CorruptCheckpointError` (a ValueError) naming it; :func:`load_checkpoint` then falls
back to the newest older checkpoint that loads and says so on stderr.

**The atomic writer.** This module holds memnets' one temp-file + ``os.replace`` writer;
every file memnets writes that must never be seen half-written (checkpoints, pretrained
weights, caches, downloads, results) is written through it:

* :func:`atomic_write` ``(path, write)``: ``write(f)`` fills a binary file object opened on a
  temporary file beside ``path``; it is flushed, fsync'ed and renamed onto ``path``.
* :func:`atomic_write_bytes` / :func:`atomic_write_text`: the same for bytes or a string.
* :func:`atomic_save` ``(path, save)``: for writers that want a file name (``torch.save``,
  safetensors' ``save_file``): ``save(tmp)`` writes the temporary file, which is then renamed.
* :func:`move_into_place` ``(src, dst)``: the rename alone, for a file or folder completed
  elsewhere on the same file system (a verified download, an unpacked archive).

On any error the temporary file is removed and ``path`` keeps its previous content. The
folder of ``path`` is created if missing. Importing this module does not import torch or
safetensors (they are imported by the functions that need them), so light tools such as
``memnets data`` can use the writer.
"""
from __future__ import annotations

import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable

if TYPE_CHECKING:
    import torch

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_text", "atomic_save", "move_into_place",
           "save_checkpoint", "load_checkpoint", "has_checkpoint", "save_weights", "load_weights", "RunLock",
           "RunLockedError", "CorruptCheckpointError", "CheckpointWriteError"]


_HEAVY = {"torch": ("torch", None), "save_file": ("safetensors.torch", "save_file"),
          "load_file": ("safetensors.torch", "load_file")}


def __getattr__(name: str) -> Any:
    """``torch``, ``save_file`` and ``load_file`` are module attributes imported on first use."""
    if name not in _HEAVY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attr = _HEAVY[name]
    value = importlib.import_module(module)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value
    return value


def _heavy(name: str) -> Any:
    """The module attribute ``name`` of :data:`_HEAVY` (imported on first use, or as replaced)."""
    return globals()[name] if name in globals() else __getattr__(name)


class CorruptCheckpointError(ValueError):
    """A checkpoint file (weights, state or ``last.json``) that cannot be read back; the message
    names the file. ``path`` holds it."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = Path(path)
        super().__init__(f"checkpoint file {self.path} is corrupt or truncated: {reason}")


class CheckpointWriteError(OSError, ValueError):
    """A checkpoint or weights file that could not be written (a full disk, a file-size limit, a
    read-only folder): nothing of it was committed, and what was there before stays in force.
    The message is one line that says so; ``last_step`` is the step of the checkpoint kept (None
    if none, or for a weights file)."""

    def __init__(self, message: str, last_step: int | None = None) -> None:
        self.last_step = last_step
        super().__init__(message)

    def __str__(self) -> str:
        return self.args[0]


def _reason(e: BaseException) -> str:
    """The exception's type and first line, plus a line naming a refused pickle global if any."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    extra = [x for x in lines[1:] if "Unsupported global" in x][:1]
    return f"{type(e).__name__}: " + " ".join((lines[:1] + extra))[:400]


def move_into_place(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Rename ``src`` onto ``dst`` in one step (``os.replace``: atomic on one file system; an
    existing file ``dst`` is replaced, a folder ``dst`` must not exist or be empty). Returns ``dst``."""
    os.replace(src, dst)
    return Path(dst)


def _temp_beside(path: Path) -> tuple[int, str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)


def atomic_save(path: str | os.PathLike, save: Callable[[str], Any]) -> Path:
    """Write ``path`` atomically with a writer that takes a file name: ``save(tmp)`` writes the
    temporary file ``tmp`` beside ``path``, which then replaces ``path``. Returns ``path``."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    os.close(fd)
    try:
        save(tmp)
        return move_into_place(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> Path:
    """Write ``path`` atomically: ``write(f)`` fills a binary file object on a temporary file beside
    ``path``; it is flushed and fsync'ed, then replaces ``path``. Returns ``path``."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        return move_into_place(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write_bytes(path, text.encode(encoding))


def save_weights(path: str | Path, model: torch.nn.Module, metadata: dict[str, str] | None = None) -> None:
    """Model weights to safetensors, atomically (tensors made contiguous, shared storage cloned)."""
    tensors = {k: v.detach().contiguous().clone().cpu() for k, v in model.state_dict().items()}
    save_file = _heavy("save_file")
    try:
        atomic_save(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
    except _write_errors() as e:  # a full disk, a file-size limit, a read-only folder
        kept = "its previous version is kept" if Path(path).is_file() else "nothing was written"
        last = _last_step(Path(path).parent)
        if last is not None:  # a file of a checkpoint folder (best.safetensors): what resumes
            kept += f"; the last good checkpoint (step {last}) is kept"
        raise CheckpointWriteError(f"could not write {path} ({_reason(e)}); {kept}", last) from e


def _write_errors() -> tuple[type[BaseException], ...]:
    """The errors a failed write raises: OSError, and safetensors' own error for its writer."""
    import safetensors

    return (OSError, getattr(safetensors, "SafetensorError", OSError))


def _last_step(d: Path) -> int | None:
    """The step of the checkpoint ``d/last.json`` names (None when there is none readable)."""
    try:
        return int(_read_pointer(d)["step"])
    except (CorruptCheckpointError, OSError, KeyError, TypeError, ValueError):
        return None


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; :class:`CorruptCheckpointError` if it cannot be parsed,
    FileNotFoundError if it is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights file {path}")
    try:
        return _heavy("load_file")(str(path))
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
    prev_stem = prev["weights"].split(".")[0] if prev else None
    keep = {stem} | ({prev_stem} if prev_stem else set())
    torch = _heavy("torch")
    buf = io.BytesIO()
    torch.save(state, buf)
    try:
        save_weights(d / f"{stem}.safetensors", model, metadata)
        atomic_write_bytes(d / f"{stem}.state.pt", buf.getvalue())
        atomic_write_text(d / "last.json", json.dumps({"step": step, "weights": f"{stem}.safetensors",
                                                       "state": f"{stem}.state.pt"}))
    except _write_errors() as e:  # a full disk, a file-size limit, a read-only folder
        if stem != prev_stem:  # what was written of this one is never committed: remove it
            for suffix in (".safetensors", ".state.pt"):
                (d / f"{stem}{suffix}").unlink(missing_ok=True)
        last = prev.get("step") if prev else None
        kept = f"the last good checkpoint (step {last}) is kept" if prev else "there is no earlier checkpoint"
        cause = e.__cause__ if isinstance(e, CheckpointWriteError) and e.__cause__ is not None else e
        raise CheckpointWriteError(f"could not write the checkpoint of step {step} to {d} ({_reason(cause)}); "
                                   f"{kept}", last) from e
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
    torch = _heavy("torch")
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
                pid = lock_holder(self.path.parent)
                if pid is not None:
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


def lock_holder(run_dir: str | Path) -> int | None:
    """The pid of the live process holding ``run_dir``'s :class:`RunLock`, or None (no lock, or
    a stale one left by a dead process)."""
    try:
        pid = int((Path(run_dir) / "lock").read_text().strip() or "0")
    except (OSError, ValueError):
        return None
    return pid if pid and _alive(pid) else None


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
