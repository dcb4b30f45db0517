"""Triton kernels: the recurrent memories' CUDA path.

On CUDA the memories' time loops run as fused Triton kernels instead of dozens of small ATen
ops per time step (which is what the PyTorch paths issue, each a kernel launch). Each kernel
sits beside the plain reference of its op and is held to it in float32 and float64, values and
gradients; on a machine without a GPU the same kernels run on CPU tensors through Triton's
interpreter (``TRITON_INTERPRET=1``, set before the kernels are first used), which is how the
tests check them everywhere.

* :func:`triton_ok` — Triton importable, recent enough (:data:`MIN_TRITON`) and not switched
  off (``MEMNETS_TRITON=0``).
* :func:`use_triton` — whether an op runs its Triton kernel for tensors like ``x``: on CUDA,
  or on the CPU inside :func:`cuda_path` in interpreter mode.
* :func:`cuda_path` — a context in which CPU tensors take the CUDA code path: Triton kernels
  (through the interpreter) instead of the CPU's C kernels and loops. ``memnets bench launches``
  counts the launches of that path without a GPU.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import warnings

import torch

__all__ = ["MIN_TRITON", "triton_release", "triton_version", "triton_ok", "interpreting", "decorating",
           "fix_interpreter", "lazy_kernels", "use_triton", "on_cuda_path", "cuda_path", "cuda_code_path", "env_var",
           "warps_from_env"]

_FORCED = [0]
_COMPILE_ONLY = [0]  # inside compile_check.compile_only: launches compile for a GPU instead of running


#: The oldest Triton release the kernels are built with: every kernel compiles for sm_90 under
#: triton 3.5.1, 3.6.0 and 3.9.0 (``python -m memnets.bench.compile_check``); under 3.4.0 the
#: float64 attention kernels do not, under 3.3.1 neither LSAM's nor the half-precision attention
#: backward. torch 2.9 and later bring triton 3.5 or newer.
MIN_TRITON = (3, 5)

#: The distributions that install the ``triton`` module: triton itself, or PyTorch's own builds of it.
_TRITON_DISTS = ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")


@functools.lru_cache(maxsize=None)
def triton_release() -> str | None:
    """The installed Triton's version as its package's metadata gives it (``"3.6.0"``), read
    without importing it; None where it is not installed or its version is not known."""
    if importlib.util.find_spec("triton") is None:
        return None
    for dist in _TRITON_DISTS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def triton_version() -> tuple[int, int] | None:
    """``(major, minor)`` of :func:`triton_release`; None where that is not known."""
    found = re.match(r"(\d+)\.(\d+)", triton_release() or "")
    return (int(found[1]), int(found[2])) if found else None


@functools.lru_cache(maxsize=None)
def _importable() -> bool:
    """Triton is installed and not older than :data:`MIN_TRITON` (said once where it is older)."""
    if importlib.util.find_spec("triton") is None:
        return False
    version = triton_version()
    if version is not None and version < MIN_TRITON:
        warnings.warn(f"memnets: triton {version[0]}.{version[1]} is older than {MIN_TRITON[0]}.{MIN_TRITON[1]}, "
                      "the oldest memnets' Triton kernels are built with: on CUDA the recurrent memories and "
                      "nam_attention run their PyTorch paths (more kernel launches, slower). A newer triton "
                      "(torch 2.9 or later brings one) runs the kernels.", RuntimeWarning, stacklevel=3)
        return False
    return True


def triton_ok() -> bool:
    """Triton is installed, not older than :data:`MIN_TRITON`, and ``MEMNETS_TRITON`` is not ``0``."""
    return os.environ.get("MEMNETS_TRITON", "1") != "0" and _importable()


def _env_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreting() -> bool:
    """Triton runs interpreted in this process: kernels run on CPU tensors.

    Triton decorates its own library (``tl.sum`` …) when it is first imported, interpreted or
    compiled as ``TRITON_INTERPRET`` says then, and a kernel of the other mode cannot call it.
    So this is the mode triton was imported in, whatever ``TRITON_INTERPRET`` says now; before
    triton is imported, ``TRITON_INTERPRET`` (which importing it now would follow)."""
    if "triton" not in sys.modules:
        return _env_interpret() and _importable()
    try:
        import triton.language.standard as standard
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:  # noqa: BLE001 - a triton without these: not interpreted
        return False
    return isinstance(standard.sum, InterpretedFunction)


@contextlib.contextmanager
def env_var(name: str, value: str | None):
    """Set the environment variable ``name`` to ``value`` (None: unset it) for the context's
    duration, and restore what it was after."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


WARP_COUNTS = (1, 2, 4, 8, 16, 32)


def warps_from_env(name: str) -> int | None:
    """The warps per program that the environment variable ``name`` asks a kernel for (one of
    :data:`WARP_COUNTS`), or None where it is unset or empty: the kernel's own choice."""
    env = os.environ.get(name, "").strip()
    if not env:
        return None
    if env not in tuple(map(str, WARP_COUNTS)):
        raise ValueError(f"{name} expected one of {', '.join(map(str, WARP_COUNTS))}, got {env!r}")
    return int(env)


def decorating():
    """Define kernels inside this context: ``TRITON_INTERPRET`` is set to the mode triton was
    imported in (:func:`interpreting`) while they are decorated, and restored after."""
    return env_var("TRITON_INTERPRET", "1" if interpreting() else "0")


def on_cuda_path(x: torch.Tensor) -> bool:
    """Whether tensors like ``x`` take the CUDA code path: CUDA tensors, or any inside :func:`cuda_path`."""
    return x.is_cuda or _FORCED[0] > 0


def use_triton(x: torch.Tensor) -> bool:
    """Whether an op with a Triton kernel runs it for tensors like ``x``: on the CUDA path
    (:func:`on_cuda_path`), Triton usable (:func:`triton_ok`), and for CPU tensors the
    interpreter on; never while ``torch.compile`` traces (the compiled graph takes the
    reference path, :func:`memnets.ops._impl.runs_fused`)."""
    if not on_cuda_path(x) or not triton_ok() or torch.compiler.is_compiling():
        return False
    return x.is_cuda or interpreting() or _COMPILE_ONLY[0] > 0


def fix_interpreter() -> bool:
    """Triton's interpreter up to 3.6 reads a scalar kernel argument (held as a one-element
    array) with ``int(array)``, which NumPy 2.4 and later refuse, so a kernel's
    ``for t in range(T)`` fails there with "only 0-dimensional arrays can be converted to Python
    scalars"; later Triton flattens the array first. This gives an older interpreter that
    behaviour (compiled kernels are not concerned). Called where kernels are defined in
    interpreted mode; returns whether it patched (once per process)."""
    try:
        import numpy as np
        from triton.runtime import interpreter
    except Exception:  # noqa: BLE001 - no interpreter to fix
        return False
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "memnets_fixed_index", False):
        return False
    try:
        if "squeeze" in inspect.getsource(original):
            return False
    except (OSError, TypeError):
        return False

    def index(self):
        return int(np.asarray(self.handle.data).reshape(-1)[0])

    def patched(tensor, *scope):  # 3.6 passes a scope that sets (and later restores) attributes
        original(tensor, *scope)
        if scope:
            scope[0].set_attr(tensor, "__index__", index)
        else:
            tensor.__index__ = index

    patched.memnets_fixed_index = True
    interpreter._patch_lang_tensor = patched
    return True


def lazy_kernels(define):
    """Decorator for a module's ``kernels()`` function that defines its Triton kernels: they are
    defined on first use, inside :func:`decorating`, once per Triton mode (so a process that
    chooses the interpreter before its first kernel gets interpreted kernels)."""
    cache: dict = {}

    @functools.wraps(define)
    def kernels():
        mode = interpreting()
        if mode not in cache:
            if mode:
                fix_interpreter()
            with decorating():
                cache[mode] = define()
        return cache[mode]

    return kernels


@contextlib.contextmanager
def cuda_code_path(device: torch.device | str = "cpu"):
    """CPU tensors down the CUDA code path as a test or a count wants it: :func:`cuda_path` with
    the C kernels off (``MEMNETS_NATIVE=0``); nothing changes for a CUDA device."""
    if torch.device(device).type == "cuda":
        yield
        return
    with env_var("MEMNETS_NATIVE", "0"), cuda_path():
        yield


@contextlib.contextmanager
def cuda_path():
    """Run CPU tensors down the CUDA code path (Triton kernels through the interpreter when
    ``TRITON_INTERPRET=1``; no C kernels): for tests and launch counts without a GPU."""
    _FORCED[0] += 1
    try:
        yield
    finally:
        _FORCED[0] -= 1
