"""Small C kernels for the CPU, compiled on first use with the system C compiler.

A kernel is a C file beside this module, with no dependency beyond the C library, called
through :mod:`ctypes` on tensors' data pointers (the caller checks dtype, device and
layout). It is compiled once per machine into a cache folder (``MEMNETS_CACHE``, else
``$XDG_CACHE_HOME/memnets``, else ``~/.cache/memnets``) under a name that hashes the source,
the compiler, its flags and the CPU, so a changed kernel or another CPU compiles anew.
If that folder cannot be written, ``$TMPDIR/memnets-native-<uid>`` is used. A folder is used
only when it is owned by this user and writable by no one else (else a warning, and the
PyTorch path), and a library is loaded only when its SHA-256 is the one recorded beside it
when it was built (else it is built again): a library is never loaded as found.
Where no compiler works, :func:`load` returns ``None`` and callers use their PyTorch path;
``MEMNETS_NATIVE=0`` turns the kernels off; ``MEMNETS_NATIVE_CFLAGS`` adds compiler flags
(e.g. ``-g`` to profile them). :func:`ranges` and :func:`parallel` split a
call over the threads PyTorch is allowed (``torch.get_num_threads()``): ctypes releases
the GIL while a kernel runs.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..gpu import on_cuda_path

__all__ = ["load", "functions", "enabled", "status", "pointer", "ranges", "parallel", "cache_dir", "LONG", "INT", "PTR"]

_HERE = Path(__file__).resolve().parent
# reassociation lets sums vectorise; no flag here assumes finite values, so NaN and inf propagate
_MATH = ["-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math", "-ffp-contract=fast"]
_FLAGS = (["-O3", "-march=native", *_MATH, "-shared", "-fPIC"], ["-O3", *_MATH, "-shared", "-fPIC"])
_LIBS: Dict[str, Optional[ctypes.CDLL]] = {}
_LOCK = threading.Lock()
_POOL: Optional[ThreadPoolExecutor] = None
_POOL_PID = 0  # a forked child has the pool object but none of its threads: it makes its own


def enabled() -> bool:
    """False when ``MEMNETS_NATIVE`` is ``0`` (or ``false``/``no``/``off``)."""
    return os.environ.get("MEMNETS_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    root = os.environ.get("MEMNETS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "memnets")
    return Path(root) / "native"


# the lines of /proc/cpuinfo that name the processor and its features: x86 ("model name",
# "flags"), ARM ("CPU implementer", "CPU part", "Features", ...), POWER ("cpu"), RISC-V ("isa", "uarch")
_CPU_KEYS = ("model name", "flags", "features", "cpu implementer", "cpu architecture", "cpu variant",
             "cpu part", "cpu revision", "cpu family", "vendor_id", "model", "cpu", "isa", "uarch",
             "hardware", "processor")


def _cpu_id(path: str = "/proc/cpuinfo") -> str:
    """The processor's identity for the cache key of a ``-march=native`` build: its cpuinfo
    lines that name it and its features (never empty: the machine and processor otherwise)."""
    lines: set = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for ln in f:
                key = ln.split(":", 1)[0].strip().lower()
                if key in _CPU_KEYS and not (key == "processor" and ln.split(":", 1)[-1].strip().isdigit()):
                    lines.add(ln.strip())
    except OSError:
        pass
    return "".join(sorted(lines)) or f"{platform.machine()} {platform.processor()}"


_WARNED: set = set()


def _warn(message: str, key: Optional[tuple] = None) -> None:
    """One warning per ``key`` (else per distinct message) and process."""
    key = key or (message,)
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _private(path: Path, want_dir: bool) -> Optional[str]:
    """Why ``path`` cannot be trusted to hold code this process runs (None when it can): it
    must be ours (owned by this user) and writable by no one else."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    if want_dir != stat.S_ISDIR(st.st_mode) or (not want_dir and not stat.S_ISREG(st.st_mode)):
        return f"{path} is not a {'folder' if want_dir else 'regular file'}"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _folders() -> List[Path]:
    return [cache_dir(), Path(tempfile.gettempdir()) / f"memnets-native-{os.getuid()}"]


def _tag(text: bytes, compiler: str, flags: list) -> str:
    return hashlib.sha256(b"\0".join([text, compiler.encode(), " ".join(flags).encode(),
                                      platform.machine().encode(), _cpu_id().encode()])).hexdigest()[:16]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _verified(lib: Path) -> bool:
    """Whether ``lib`` is the library this user built: a private regular file whose SHA-256 is the
    one recorded beside it when it was built."""
    side = lib.with_name(lib.name + ".sha256")
    if _private(lib, False) is not None or _private(side, False) is not None:
        return False
    try:
        return side.read_text().strip() == _digest(lib)
    except OSError:
        return False


def _publish(tmp: Path, lib: Path) -> None:
    """Move the built ``tmp`` to ``lib`` whole (a concurrent build or load finds all or nothing),
    its digest recorded first in ``lib.sha256``."""
    side = lib.with_name(lib.name + ".sha256")
    os.chmod(tmp, 0o755)  # whatever the umask: writable by this user only
    fd, stmp = tempfile.mkstemp(suffix=".sha256", dir=lib.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(_digest(tmp) + "\n")
        os.replace(stmp, side)
    finally:
        Path(stmp).unlink(missing_ok=True)
    os.replace(tmp, lib)


def _compile(src: Path, compiler: str, flags: list, out: Path) -> bool:
    try:
        res = subprocess.run([compiler, *flags, "-o", str(out), str(src), "-lm"], capture_output=True,
                             timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    return res.returncode == 0 and out.exists()


def _build(name: str) -> Optional[ctypes.CDLL]:
    src = _HERE / f"{name}.c"
    extra = os.environ.get("MEMNETS_NATIVE_CFLAGS", "").split()
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None or not src.exists():
        return None
    text = src.read_bytes() + b"".join(h.read_bytes() for h in sorted(_HERE.glob("*.h")))
    refused: List[str] = []
    for flags in _FLAGS:
        flags = [*flags, *extra]
        tag = _tag(text, compiler, flags)
        for folder in _folders():
            try:
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError:
                continue  # cannot be made: the next folder
            why = _private(folder, True)
            if why is not None:  # another user could have put a library there: never load from it
                refused.append(why)
                continue
            lib = folder / f"{name}-{tag}.so"
            if not _verified(lib):  # absent, half-written, truncated or replaced: build it (again)
                try:
                    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
                    os.close(fd)
                except OSError:
                    continue  # not writable: the next folder
                try:
                    if not _compile(src, compiler, flags, Path(tmp)):
                        break  # these flags do not compile here: the next flags
                    _publish(Path(tmp), lib)
                except OSError:
                    continue
                finally:
                    Path(tmp).unlink(missing_ok=True)
            try:
                return ctypes.CDLL(str(lib))
            except OSError as e:
                _warn(f"memnets: the C kernel {lib} does not load ({e}); using the PyTorch path", (name, "load"))
                continue
    if refused:
        _warn(f"memnets: C kernel {name!r} not loaded, its cache folder is not private: {'; '.join(refused)}; "
              "using the PyTorch path (set MEMNETS_CACHE to a folder only you can write)")
    return None


def load(name: str) -> Optional[ctypes.CDLL]:
    """The compiled kernel ``<name>.c`` of this folder, or ``None`` (no compiler, a failed
    build, or ``MEMNETS_NATIVE=0``). Built at most once per process."""
    if not enabled():
        return None
    with _LOCK:
        if name not in _LIBS:
            _LIBS[name] = _build(name)
        return _LIBS[name]


LONG, INT, PTR = ctypes.c_long, ctypes.c_int, ctypes.c_void_p  # the argument types of the kernels


def functions(name: str, x: torch.Tensor, signatures: Dict[str, list]) -> Optional[tuple]:
    """The functions ``<f>_f32`` (or ``_f64``, after ``x``'s dtype) of kernel ``name`` for each
    ``f`` of ``signatures`` (name -> argument types), ready to call on data pointers; ``None``
    when ``x`` is not a float32/float64 CPU tensor, ``torch.compile`` is tracing, or the kernel
    does not load here."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or on_cuda_path(x):
        return None  # (inside memnets.ops.gpu.cuda_path CPU tensors take the CUDA path: no C kernel)
    if torch.compiler.is_compiling():  # torch.compile traces the PyTorch path: no data behind its tensors
        return None
    lib = load(name)
    if lib is None:
        return None
    suffix = "f32" if x.dtype == torch.float32 else "f64"
    out = []
    for fn, argtypes in signatures.items():
        try:
            f = getattr(lib, f"{fn}_{suffix}")
        except AttributeError:  # not the library this module's sources build
            _warn(f"memnets: the C kernel {name!r} has no function {fn}_{suffix}; using the PyTorch path")
            return None
        if f.argtypes is None:
            f.argtypes, f.restype = argtypes, None
        out.append(f)
    return tuple(out)


def pointer(kernel: str, name: str, x: torch.Tensor, dtype: torch.dtype, device,
            shape: Optional[tuple] = None) -> int:
    """The data pointer of the buffer ``x`` a C kernel will read or write, after checking what
    the kernel trusts: ``shape`` (when given), contiguity, dtype and device; a ``ValueError``
    naming ``kernel`` and ``name`` otherwise."""
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{kernel} native step: `{name}` expected shape {list(shape)}, got {list(x.shape)}")
    if not x.is_contiguous() or x.dtype != dtype or x.device != torch.device(device):
        raise ValueError(f"{kernel} native step: `{name}` expected a contiguous {dtype} tensor on {device}, "
                         f"got {x.dtype} on {x.device} (contiguous: {x.is_contiguous()})")
    return x.data_ptr()


def status() -> Dict[str, bool]:
    """Whether each kernel of this folder builds and loads here (building them if needed):
    what a run on the CPU really uses, for its env record."""
    return {src.stem: load(src.stem) is not None for src in sorted(_HERE.glob("*.c"))}


def ranges(n: int, work: int, min_work: int = 1 << 18) -> List[Tuple[int, int]]:
    """``[0, n)`` split into ``torch.get_num_threads()`` ranges (one range when ``work``, the
    number of multiply-adds, is below ``min_work`` per range)."""
    threads = max(1, min(torch.get_num_threads(), n, work // min_work))
    bounds = [n * i // threads for i in range(threads + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def parallel(fn: Callable[[int, int, int], None], parts: List[Tuple[int, int]]) -> None:
    """``fn(i, n0, n1)`` for each range ``parts[i] = (n0, n1)``, on as many threads."""
    global _POOL, _POOL_PID
    if len(parts) == 1:
        fn(0, *parts[0])
        return
    with _LOCK:
        if _POOL is None or _POOL._max_workers < len(parts) - 1 or _POOL_PID != os.getpid():
            if _POOL is not None and _POOL_PID == os.getpid():
                _POOL.shutdown(wait=False)  # its threads end once idle (a forked child has none of them)
            _POOL = ThreadPoolExecutor(max_workers=len(parts) - 1, thread_name_prefix="memnets-native")
            _POOL_PID = os.getpid()
        # submitted under the lock: a pool replaced by another thread has taken this work already
        futures = [_POOL.submit(fn, i, *parts[i]) for i in range(1, len(parts))]
    fn(0, *parts[0])
    for f in futures:
        f.result()
