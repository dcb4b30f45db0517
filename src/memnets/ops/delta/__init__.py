"""The NAM sequence op: ``nam_scan`` (whole sequence) and ``nam_step`` (one token).

``impl`` picks the implementation: ``"reference"`` (time loop, :mod:`.reference`),
``"chunked"`` (chunkwise-parallel, :mod:`.chunked`), ``"fla"`` (the Triton kernels of
flash-linear-attention, :mod:`.fla_backend`, CUDA only, when installed) or ``"auto"``. Each implementation
states why it cannot run through :func:`supports`; forcing one that cannot run raises with
those reasons.
"""
from __future__ import annotations

from typing import Any, Union

import torch

from ..._checks import check_positive_int, check_prob, check_shape, check_tensor
from .._amp import autocast_device, to_float32
from .chunked import nam_scan_chunked
from .fla_backend import fla_reasons, nam_scan_fla
from .reference import nam_scan_reference, nam_step_reference
from ..varlen import check_cu_seqlens, nam_scan_varlen

__all__ = ["nam_scan", "nam_step", "supports", "resolve_impl", "IMPLS"]

IMPLS = ("reference", "chunked", "fla")
Prob = Union[torch.Tensor, float, int, None]


def supports(impl: str, q: torch.Tensor, *, chunk_size: int = 64) -> list[str]:
    """Reasons why ``impl`` cannot run on these inputs (empty list: it can)."""
    reasons: list[str] = []
    if impl not in IMPLS:
        return [f"unknown impl {impl!r}; expected one of {('auto',) + IMPLS}"]
    if impl == "chunked":
        if not isinstance(chunk_size, int) or chunk_size < 1:
            reasons.append(f"chunk_size must be a positive int, got {chunk_size!r}")
        if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            reasons.append(f"dtype {q.dtype} has no triangular solve")
    if impl == "fla":
        reasons.extend(fla_reasons(q))
    return reasons


def resolve_impl(impl: str, q: torch.Tensor, *, chunk_size: int = 64) -> str:
    """The implementation ``nam_scan`` would run for ``impl`` on these inputs."""
    if impl == "auto":
        # fla's chunked Triton kernels on CUDA in float16 / bfloat16 (in float32 fla has only
        # step-by-step kernels; our chunked path keeps float32 matmuls there).
        if q.dtype in (torch.float16, torch.bfloat16) and q.device.type == "cuda" and not supports("fla", q):
            return "fla"
        # The time loop wins only for very short sequences.
        if q.shape[1] > 4 and not supports("chunked", q, chunk_size=chunk_size):
            return "chunked"
        return "reference"
    reasons = supports(impl, q, chunk_size=chunk_size)
    if reasons:
        raise ValueError(f"impl={impl!r} cannot run: " + "; ".join(reasons))
    return impl


def _prob_seq(name: str, p: Prob, shape: tuple[int, ...], ref: torch.Tensor) -> torch.Tensor | None:
    if p is None:
        return None
    if isinstance(p, (float, int)) and not isinstance(p, bool):
        return torch.full(shape, float(p), dtype=ref.dtype, device=ref.device)
    symbols = ["B", "T", "H"][: len(shape)] if len(shape) == 3 else ["B", "H"]
    check_shape(name, p, symbols, list(shape))
    if not p.is_floating_point():
        raise TypeError(f"`{name}` expected a floating-point tensor, got {p.dtype}")
    return p.to(ref.dtype)


def _check_values(q, k, v, probs: dict[str, Prob], state: torch.Tensor | None) -> None:
    """The opt-in value checks of ``validate=True`` (each forces a device sync)."""
    for name, p in probs.items():
        if p is None:
            continue
        if isinstance(p, torch.Tensor):
            check_prob(name, p, check_range=True)
        elif not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"`{name}` expected a value in [0, 1], got {p!r}")
    for name, x in (("q", q), ("k", k), ("v", v), ("initial_state", state)):
        if x is not None and not bool(torch.isfinite(x).all()):
            raise ValueError(f"`{name}` expected finite values, got NaN or Inf")


def _validate(q, k, v, initial_state, seq: bool, cu_seqlens=None):
    """Shape and dtype checks; ``(B, H, dk, dv, N, offsets)`` with ``N`` the number of states
    (``B``, or the number of packed sequences with ``cu_seqlens``, whose offsets come last)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
    lead = ["B", "T", "H"] if seq else ["B", "H"]
    nd = len(lead) + 1
    if k.dim() != nd:
        check_shape("k", k, lead + ["dk"], [None] * nd)
    if k.shape[0] == 0 or (seq and k.shape[1] == 0 and cu_seqlens is None):
        raise ValueError(f"`k` expected non-empty batch{' and time' if seq else ''} dims, got {list(k.shape)}")
    dk = k.shape[-1]
    check_shape("q", q, lead + ["dk"], list(k.shape))
    if v.dim() != nd:
        check_shape("v", v, lead + ["dv"], list(k.shape[:-1]) + [None])
    dv = v.shape[-1]
    check_shape("v", v, lead + ["dv"], list(k.shape[:-1]) + [dv])
    if not k.is_floating_point():
        raise TypeError(f"`k` expected a floating-point tensor, got {k.dtype}")
    B, H = k.shape[0], k.shape[-2]
    N, offsets = B, None
    if cu_seqlens is not None:
        offsets = check_cu_seqlens(cu_seqlens, k.shape[1])
        if B != 1:
            raise ValueError(
                f"`k` expected batch size 1 with `cu_seqlens` (the sequences concatenated along time, "
                f"[1, T, H, dk]), got {list(k.shape)}"
            )
        N = len(offsets) - 1
    if initial_state is not None:
        check_shape("initial_state", initial_state, ["N" if offsets else "B", "H", "dv", "dk"], [N, H, dv, dk])
    for name, t in (("q", q), ("v", v), ("initial_state", initial_state)):
        if t is not None and (t.dtype != k.dtype or t.device != k.device):
            raise TypeError(
                f"`{name}` expected dtype {k.dtype} on {k.device} like `k`, got {t.dtype} on {t.device}"
            )
    return B, H, dk, dv, N, offsets


def _zero_state(k: torch.Tensor, v: torch.Tensor, offsets) -> torch.Tensor:
    """Zeros ``[N, H, dv, dk]``: one state per batch element, or per packed sequence (``offsets``)."""
    n = k.shape[0] if offsets is None else len(offsets) - 1
    return k.new_zeros(n, k.shape[-2], v.shape[-1], k.shape[-1])


def _prepare(q, k, v, p_w, p_e, p_r, state, seq: bool, validate: bool, cu_seqlens=None, zero_state: bool = True):
    """Checks shared by nam_scan / nam_step; probabilities as tensors, the state as zeros if None
    (one per packed sequence with ``cu_seqlens``; left None with ``zero_state=False``); also the
    packed offsets (or None)."""
    B, H, _, _, _, offsets = _validate(q, k, v, state, seq=seq, cu_seqlens=cu_seqlens)
    shape = (B, k.shape[1], H) if seq else (B, H)
    pw, pe, pr = (_prob_seq(n, p, shape, k) for n, p in (("p_w", p_w), ("p_e", p_e), ("p_r", p_r)))
    if pw is None or pe is None:
        raise ValueError(f"`p_w` and `p_e` are required (tensors {list(shape)} or floats)")
    if validate:
        _check_values(q, k, v, {"p_w": p_w, "p_e": p_e, "p_r": p_r}, state)
    if state is None and zero_state:
        state = _zero_state(k, v, offsets)
    return pw, pe, pr, state, offsets


def nam_scan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    p_w: Prob,
    p_e: Prob,
    p_r: Prob = None,
    *,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    impl: str = "auto",
    chunk_size: int = 64,
    validate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a multi-head NAM memory over a sequence (docs/maths.md §1), read after write.

    For every batch element b, head h and step t::

        S_t = S_{t-1} + p_w,t v_t k_tᵀ − p_e,t (S_{t-1} k_t) k_tᵀ
        o_t = p_r,t S_t q_t

    Keys and queries are used as given; normalise them with :func:`memnets.ops.unit` for
    NAM semantics. ``p_e = p_w = β`` is the delta rule (DeltaNet / delta-rule FWP).

    Args:
        q: queries ``[B, T, H, dk]``.
        k: keys ``[B, T, H, dk]``.
        v: values ``[B, T, H, dv]``.
        p_w: write probabilities ``[B, T, H]`` (or a Python float).
        p_e: erase probabilities ``[B, T, H]`` (or a Python float).
        p_r: read probabilities ``[B, T, H]``, a float, or ``None`` (= 1).
        initial_state: ``[B, H, dv, dk]`` (``[N, H, dv, dk]`` with ``cu_seqlens``); zeros when ``None``.
            The state ``S`` is ``[dv, dk]`` (it maps keys to values: ``o = S q``); fla keeps
            its transpose, ``[B, H, dk, dv]`` (:mod:`.fla_backend` converts).
        cu_seqlens: a packed batch of N variable-length sequences, in flash-linear-attention's
            convention: q, k, v and the probabilities have batch size 1 and hold the sequences
            one after the other along time (``[1, T, H, d]``, ``T = Σ lᵢ``), and ``cu_seqlens``
            is the 1-D int32/int64 tensor of offsets ``[0, l₁, l₁ + l₂, …, T]`` (a sequence may
            be empty). Each sequence runs as if alone, from its own initial state
            ``initial_state[n]``, and the final states are per sequence: ``[N, H, dv, dk]``. Bad
            offsets (not starting at 0, decreasing, not ending at T, not a 1-D integer tensor)
            raise ValueError. The reference and chunked scans run the sequences as padded
            batches (:mod:`memnets.ops.varlen`); fla takes ``cu_seqlens`` itself.
        impl: ``"auto"``, ``"reference"``, ``"chunked"`` or ``"fla"``. ``"auto"`` takes fla's
            chunked kernels for float16 / bfloat16 CUDA tensors when fla imports, else
            ``"chunked"`` (``"reference"`` for T <= 4). ``"fla"`` uses the delta-rule kernels when
            ``p_e`` is ``p_w`` (the same object, or equal floats) and the generalised delta rule
            otherwise; in float32 it runs fla's step-by-step fused kernels.
        chunk_size: chunk length of the chunked implementation (fla: its own default).
        validate: also check values (probabilities in [0, 1], finite q, k, v and state);
            off by default because it forces a device sync.
    Returns:
        ``(outputs [B, T, H, dv], final_state [B, H, dv, dk])`` (``[N, H, dv, dk]`` with
        ``cu_seqlens``). Under autocast (CPU or CUDA)
        the chunked and reference scans run in float32 with autocast off, inputs cast up, and
        return float32; fla's kernels take the bfloat16 / float16 tensors as they are.
    """
    if impl == "chunked":
        check_positive_int("chunk_size", chunk_size)
    dev = autocast_device(q, k, v, p_w, p_e, p_r, initial_state)
    if dev is not None and resolve_impl(impl, q, chunk_size=chunk_size) != "fla":
        # under autocast the chunked and reference scans run in float32, autocast off (ops/_amp.py)
        q32, k32, v32, pw32, pr32, s32 = to_float32((q, k, v, p_w, p_r, initial_state))
        pe32 = pw32 if p_e is p_w else to_float32(p_e)
        with torch.autocast(dev, enabled=False):
            return nam_scan(q32, k32, v32, pw32, pe32, pr32, initial_state=s32, cu_seqlens=cu_seqlens,
                            impl=impl, chunk_size=chunk_size, validate=validate)
    same = p_e is p_w or (
        isinstance(p_e, (float, int)) and isinstance(p_w, (float, int)) and float(p_e) == float(p_w))
    pw, pe, pr, initial_state, offsets = _prepare(q, k, v, p_w, p_e, p_r, initial_state, True, validate,
                                                  cu_seqlens=cu_seqlens, zero_state=False)
    which = resolve_impl(impl, q, chunk_size=chunk_size)
    if which == "fla":  # fla starts from zeros itself: no state made here (a launch less a call)
        return nam_scan_fla(q, k, v, pw, None if same else pe, pr, initial_state, delta=same,
                            cu_seqlens=cu_seqlens)
    if initial_state is None:
        initial_state = _zero_state(k, v, offsets)
    if offsets is not None:  # packed sequences: padded batches through the same kernels
        if which == "chunked":
            def kernel(*args):
                return nam_scan_chunked(*args, chunk_size)
        else:
            kernel = nam_scan_reference
        return nam_scan_varlen(kernel, q, k, v, pw, pe, pr, initial_state, offsets)
    if which == "chunked":
        return nam_scan_chunked(q, k, v, pw, pe, pr, initial_state, chunk_size)
    return nam_scan_reference(q, k, v, pw, pe, pr, initial_state)


def nam_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    p_w: Prob,
    p_e: Prob,
    p_r: Prob = None,
    *,
    initial_state: torch.Tensor | None = None,
    validate: bool = False,
    **deprecated: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of :func:`nam_scan` (recurrent decoding) with the same state layout.

    Args:
        q, k: ``[B, H, dk]``; v: ``[B, H, dv]``; p_w, p_e, p_r: ``[B, H]`` or floats.
        initial_state: the state before this token, ``[B, H, dv, dk]``, or ``None`` (zeros);
            the keyword :func:`nam_scan` takes too (``state=``, its former name, still works
            with a DeprecationWarning).
        validate: value checks as in :func:`nam_scan` (a device sync).
    Returns:
        ``(output [B, H, dv], new_state [B, H, dv, dk])``.
    """
    if deprecated:
        if set(deprecated) != {"state"}:
            raise TypeError(f"nam_step() got an unexpected keyword argument {next(k for k in deprecated if k != 'state')!r}")
        if initial_state is not None:
            raise TypeError("nam_step() got both initial_state= and its former name state=; pass initial_state= only")
        import warnings

        warnings.warn("nam_step(state=...) is now nam_step(initial_state=...), the keyword nam_scan takes",
                      DeprecationWarning, stacklevel=2)
        initial_state = deprecated["state"]
    pw, pe, pr, state, _ = _prepare(q, k, v, p_w, p_e, p_r, initial_state, False, validate)
    return nam_step_reference(q, k, v, pw, pe, pr, state)
