"""Causal NAM attention on CUDA through flash-linear-attention's chunked kernel.

Causal :func:`memnets.ops.nam_attention` is ``o_t = Σ_{s<=t} (μ(q_t)·μ(k_s)) v_s`` (times
``scale``): linear attention without a normaliser on unit queries and keys. fla's
``chunk_linear_attn(q, k, v, scale, normalize=False)`` computes exactly
``scale · Σ_{s<=t} (q_t·k_s) v_s`` in its ``[B, T, H, D]`` layout, so on CUDA, for bfloat16 and
float16 inputs ``[B, H, S, D]`` with head dims up to 256, ``nam_attention`` hands it the unit
(and scaled) queries and keys, transposed to that layout. float32 and float64 keep the chunked
PyTorch path (fla's chunked kernels may multiply in TF32). The mapping is checked on the CPU
against fla's own step-by-step reference (tests/test_triton_attention.py) and on a GPU against
the chunked PyTorch path (the same file, where CUDA is available).
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from . import triton_ok

__all__ = ["fla_linear_attention", "use_fla_attention", "nam_attention_fla"]

DTYPES = (torch.bfloat16, torch.float16)


@functools.lru_cache(maxsize=None)
def fla_linear_attention() -> Optional[Callable]:
    """fla's ``chunk_linear_attn``, or None where fla is not installed or does not import."""
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception:  # noqa: BLE001 - any import failure means: not usable here
        return None
    return chunk_linear_attn


def use_fla_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether causal ``nam_attention`` runs fla's kernel on these inputs (module docstring)."""
    return (q.is_cuda and q.dim() == 4 and q.dtype in DTYPES and q.shape[-1] <= 256 and v.shape[-1] <= 256
            and q.shape == k.shape and triton_ok() and not torch.compiler.is_compiling()
            and fla_linear_attention() is not None)


def nam_attention_fla(qn: torch.Tensor, kn: torch.Tensor, v: torch.Tensor,
                      kernel: Optional[Callable] = None) -> torch.Tensor:
    """``o_t = Σ_{s<=t} (qn_t·kn_s) v_s`` for ``[B, H, S, D]`` inputs (``qn``, ``kn``: unit and
    scaled already) by fla's chunked linear attention (``kernel``: that function by default)."""
    kernel = kernel or fla_linear_attention()
    o, _ = kernel(qn.transpose(1, 2), kn.transpose(1, 2), v.transpose(1, 2), scale=1.0, normalize=False)
    return o.transpose(1, 2)
