"""The one ``impl`` vocabulary of the memories and layers: ``"auto" | "reference" | "fused"``.

``"reference"`` runs the equations as written (one op per equation or a plain time loop,
plain autograd: the slowest, the one the others are tested against, twice differentiable);
``"fused"`` runs the fast kernels of :mod:`memnets.ops` (hand-written backward passes,
whole-sequence or chunkwise-parallel scans); ``"auto"`` picks the fastest implementation
that applies.

* Memories with one fast path (LSAM, DNC) resolve ``"auto"`` to ``"fused"`` at construction
  (:func:`resolve_impl`) and keep the resolved value in ``model.impl``.
* Modules built on :func:`memnets.ops.nam_scan` (fast weights, delta-rule attention) keep
  ``"auto"``: the scan then chooses per call from the inputs (``chunked``, fla's kernels on
  CUDA, or the time loop for very short sequences); ``"fused"`` is the chunked scan
  (:func:`nam_scan_impl` maps the module's value to the op's).

``nam_scan`` itself is an op, not a memory: its ``impl`` names the algorithms
(``auto | reference | chunked | fla``).

Under ``torch.compile`` the memories take their reference paths (:func:`runs_fused`): the
hand-written backward passes, C kernels, TorchScript loops and reused workspaces of the fused
paths are opaque to the compiler and split the model into many graphs, while plain autograd
ops trace into one graph that the compiler can fuse and, with ``mode="reduce-overhead"``,
replay as a CUDA graph. The two paths compute the same function (the tests hold them equal).
:func:`compile_module` also lets the compiler trace ``nn.GRU`` / ``nn.LSTM`` (the NAM-TM's
controller, the LSTM baselines), so that every sequence model is one graph.
"""
from __future__ import annotations

import warnings
from typing import Mapping

import torch

__all__ = ["IMPLS", "resolve_impl", "check_impl", "nam_scan_impl", "runs_fused", "compile_module", "COMPILE_MODES"]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")

IMPLS = ("auto", "reference", "fused")

_NAM_SCAN = {"auto": "auto", "reference": "reference", "fused": "chunked"}


def check_impl(owner: str, impl: str, deprecated: Mapping[str, str] | None = None) -> str:
    """``impl`` of ``owner`` checked against :data:`IMPLS` (``"auto"`` kept as it is).

    A name in ``deprecated`` (an old spelling) maps to its new value with a FutureWarning;
    anything else raises ValueError naming the accepted values.
    """
    if deprecated and isinstance(impl, str) and impl in deprecated:
        new = deprecated[impl]
        warnings.warn(f"{owner}: impl={impl!r} is deprecated, use impl={new!r}", FutureWarning, stacklevel=3)
        impl = new
    if impl not in IMPLS:
        raise ValueError(f"`impl` expected one of {IMPLS}, got {impl!r}")
    return impl


def resolve_impl(owner: str, impl: str, deprecated: Mapping[str, str] | None = None) -> str:
    """:func:`check_impl`, then ``"auto"`` -> ``"fused"``: ``"reference"`` or ``"fused"``."""
    impl = check_impl(owner, impl, deprecated)
    return "fused" if impl == "auto" else impl


def nam_scan_impl(impl: str) -> str:
    """The :func:`memnets.ops.nam_scan` ``impl`` for a module's ``"auto" | "reference" | "fused"``."""
    return _NAM_SCAN[impl]


def runs_fused(impl: str) -> bool:
    """Whether a memory with this resolved ``impl`` runs its fused path now: not for
    ``"reference"``, and not while ``torch.compile`` traces it (module docstring)."""
    return impl != "reference" and not torch.compiler.is_compiling()


def compile_module(module: torch.nn.Module, mode: str = "default") -> torch.nn.Module:
    """``torch.compile(module)`` in ``mode`` (:data:`COMPILE_MODES`; ``"default"`` is torch's
    ``mode=None``), with dynamo's tracing of ``nn.GRU`` / ``nn.LSTM`` switched on
    (``torch._dynamo.config.allow_rnn``, process-wide; without it each RNN call splits the graph
    and a loop around one makes the whole frame run eagerly)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"`mode` expected one of {list(COMPILE_MODES)}, got {mode!r}")
    torch._dynamo.config.allow_rnn = True
    return torch.compile(module, mode=None if mode == "default" else mode)
