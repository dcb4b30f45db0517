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
"""
from __future__ import annotations

import warnings
from typing import Mapping

__all__ = ["IMPLS", "resolve_impl", "check_impl", "nam_scan_impl"]

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
