"""Small C kernels for the CPU, compiled on first use with the system C compiler.

A kernel is a C file beside this module, with no dependency beyond the C library, called
through :mod:`ctypes` on tensors' data pointers (the caller checks dtype, device and
layout). It is compiled once per machine into a cache folder (``MEMNETS_CACHE``, else
``$XDG_CACHE_HOME/memnets``, else ``~/.cache/memnets``) under a name that hashes the source,
the compiler, its flags and the CPU, so a changed kernel or another CPU compiles anew.
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
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

__all__ = ["load", "functions", "enabled", "status", "ranges", "parallel", "cache_dir", "LONG", "INT", "PTR"]

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


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


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
    for flags in _FLAGS:
        flags = [*flags, *extra]
        tag = hashlib.sha256(b"\0".join([text, compiler.encode(), " ".join(flags).encode(),
                                         platform.machine().encode(), _cpu_id().encode()])).hexdigest()[:16]
        for folder in (cache_dir(), Path(tempfile.gettempdir()) / f"memnets-native-{os.getuid()}"):
            lib = folder / f"{name}-{tag}.so"
            if not lib.exists():
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
                    os.close(fd)
                except OSError:
                    continue  # not writable: the next folder
                try:
                    if not _compile(src, compiler, flags, Path(tmp)):
                        break  # these flags do not compile here: the next flags
                    try:
                        os.link(tmp, lib)  # publish whole: a concurrent build finds all or nothing
                    except FileExistsError:
                        pass
                finally:
                    Path(tmp).unlink(missing_ok=True)
            try:
                return ctypes.CDLL(str(lib))
            except OSError:
                continue
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
    when ``x`` is not a float32/float64 CPU tensor or the kernel does not load here."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return None
    lib = load(name)
    if lib is None:
        return None
    suffix = "f32" if x.dtype == torch.float32 else "f64"
    out = []
    for fn, argtypes in signatures.items():
        f = getattr(lib, f"{fn}_{suffix}")
        if f.argtypes is None:
            f.argtypes, f.restype = argtypes, None
        out.append(f)
    return tuple(out)


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
            _POOL = ThreadPoolExecutor(max_workers=len(parts) - 1, thread_name_prefix="memnets-native")
            _POOL_PID = os.getpid()
        pool = _POOL
    futures = [pool.submit(fn, i, *parts[i]) for i in range(1, len(parts))]
    fn(0, *parts[0])
    for f in futures:
        f.result()
