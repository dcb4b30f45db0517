"""Packed variable-length batches: ``cu_seqlens`` in flash-linear-attention's convention.

N sequences of lengths l₁ … l_N are concatenated along time into one row of batch size 1
(``[1, T, H, D]`` for :func:`memnets.ops.nam_scan`, ``[..., T, D]`` for the attentions),
``T = Σ lᵢ``, and described by ``cu_seqlens = [0, l₁, l₁ + l₂, …, T]``: a 1-D int32 / int64
tensor of cumulative offsets (fla's and FlashAttention's ``cu_seqlens``). Sequence n occupies
the rows ``cu_seqlens[n] : cu_seqlens[n + 1]``; an empty sequence (two equal offsets) is
allowed. Every sequence runs as if alone: from its own initial state (``[N, H, dv, dk]``),
giving its own final state, and no token sees a token of another sequence.

How the reference and chunked scans and the attentions run a packed batch: the tokens are
gathered into padded batches ``[m, L, ...]`` (one row per sequence, zeros after its end), run
through the ordinary batched kernels, and gathered back; there is no loop over sequences.
Padded scan steps have ``k = 0`` and ``p_w = p_e = 0``, so they leave the state exactly as it
was (``S + 0``): a row's state after ``L`` steps is its sequence's final state, in exact
arithmetic and in floating point. Padded keys and values are zero, so they add nothing to an
attention sum. Sequences never share a row, so a NaN in one cannot reach another.

To bound the padding, sequences are grouped by length (:func:`group_lengths`): each group
pads to its longest sequence ``L`` and holds the sequences longer than ``L / 2`` (all the
remaining ones once ``L <= floor``), so the kernels see at most about twice the real tokens
plus ``floor`` per short sequence, in about ``log₂(max length / floor) + 1`` calls (the
group lengths at least halve from one group to the next).
fla's kernels (``impl="fla"``) take ``cu_seqlens`` natively and skip all of this.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

__all__ = [
    "check_cu_seqlens", "group_lengths", "Packing", "nam_scan_varlen", "attention_varlen",
    "same_sequence_mask", "sequence_ids", "keys_seen", "PAD_FLOOR", "reverse_within",
]

#: Sequences no longer than this share one padded group whatever their lengths.
PAD_FLOOR = 64

_NAME = "cu_seqlens"


def check_cu_seqlens(cu_seqlens: object, total: int, name: str = _NAME) -> list[int]:
    """The offsets of ``cu_seqlens`` as a list ``[0, …, total]``, or ValueError naming ``name``.

    ``cu_seqlens`` must be a 1-D int32 / int64 tensor of N + 1 >= 2 offsets that starts at 0,
    never decreases and ends at ``total``, the packed length T. Reading the values is one device
    sync when ``cu_seqlens`` lives on a GPU.
    """
    what = f"a 1-D int32/int64 tensor [N + 1] of cumulative sequence offsets [0, l1, l1 + l2, ..., T={total}]"
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"`{name}` expected {what}, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"`{name}` expected dtype torch.int32 or torch.int64, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"`{name}` expected {what} (at least 2 entries), got shape {list(cu_seqlens.shape)}")
    offsets = [int(x) for x in cu_seqlens.tolist()]
    if offsets[0] != 0:
        raise ValueError(f"`{name}` expected to start at 0, got {offsets[0]} (in {_show(offsets)})")
    for n in range(len(offsets) - 1):
        if offsets[n + 1] < offsets[n]:
            raise ValueError(
                f"`{name}` expected non-decreasing offsets, got {offsets[n]} then {offsets[n + 1]} at "
                f"entries {n} and {n + 1} (in {_show(offsets)})"
            )
    if offsets[-1] != total:
        raise ValueError(
            f"`{name}` expected to end at the packed length T = {total}, got {offsets[-1]} (in {_show(offsets)})"
        )
    return offsets


def _show(offsets: Sequence[int], limit: int = 12) -> str:
    if len(offsets) <= limit:
        return str(list(offsets))
    return "[" + ", ".join(map(str, offsets[: limit - 2])) + f", ..., {offsets[-1]}]"


def group_lengths(lengths: Sequence[int], floor: int | None = None) -> list[tuple[list[int], int]]:
    """Sequences grouped for padding: ``[(sequence ids, padded length L), …]``.

    Longest first; a group pads to its longest sequence ``L`` and takes every remaining
    sequence longer than ``L / 2``, or every remaining one once ``L <= floor``
    (default :data:`PAD_FLOOR`). ``L = 0`` only when every remaining sequence is empty.
    """
    floor = PAD_FLOOR if floor is None else floor
    order = sorted(range(len(lengths)), key=lambda n: -lengths[n])  # stable: ties keep their order
    groups: list[tuple[list[int], int]] = []
    i = 0
    while i < len(order):
        L = lengths[order[i]]
        j = i + 1
        if L <= floor:
            j = len(order)
        else:
            while j < len(order) and 2 * lengths[order[j]] > L:
                j += 1
        groups.append((order[i:j], L))
        i = j
    return groups


class Packing:
    """Index maps between a packed time axis ``[T, ...]`` and padded groups ``[m, L, ...]``.

    Built once per call from the offsets (on the CPU, then moved to ``device``).
    """

    def __init__(self, offsets: Sequence[int], device: torch.device, floor: int | None = None):
        self.offsets = list(offsets)
        self.total = self.offsets[-1]
        self.lengths = [b - a for a, b in zip(self.offsets[:-1], self.offsets[1:])]
        self.num_seqs = len(self.lengths)
        self.groups = group_lengths(self.lengths, floor)
        starts = torch.tensor(self.offsets[:-1], dtype=torch.long)
        lens = torch.tensor(self.lengths, dtype=torch.long)
        self.src: list[torch.Tensor] = []  # [m * L] rows of the zero-extended packed axis
        dst = torch.empty(self.total, dtype=torch.long)  # packed token -> row of the concatenated groups
        base = 0
        for ids, L in self.groups:
            idx = torch.tensor(ids, dtype=torch.long)
            ar = torch.arange(L)
            valid = ar[None, :] < lens[idx, None]  # [m, L]
            src = torch.where(valid, starts[idx, None] + ar[None, :], self.total)  # T: the zero row
            dst[src[valid]] = base + valid.flatten().nonzero().squeeze(1)
            self.src.append(src.flatten().to(device))
            base += len(ids) * L
        self.dst = dst.to(device)
        order = torch.tensor([n for ids, _ in self.groups for n in ids], dtype=torch.long)
        self.inverse = torch.argsort(order).to(device)  # group order -> sequence order
        self.ids = [torch.tensor(ids, dtype=torch.long, device=device) for ids, _ in self.groups]

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, ...] -> [T + 1, ...]`` with a zero row at the end (what padding reads)."""
        return torch.cat([x, x.new_zeros((1,) + x.shape[1:])], 0)

    def gather(self, g: int, x_ext: torch.Tensor) -> torch.Tensor:
        """Group ``g`` of a zero-extended packed tensor: ``[T + 1, ...] -> [m, L, ...]``."""
        ids, L = self.groups[g]
        return x_ext.index_select(0, self.src[g]).view((len(ids), L) + x_ext.shape[1:])

    def scatter(self, outs: list[torch.Tensor]) -> torch.Tensor:
        """Per-group outputs ``[m, L, ...]`` (groups with L > 0, in order) back to ``[T, ...]``."""
        flat = torch.cat([o.reshape((-1,) + o.shape[2:]) for o in outs], 0)
        return flat.index_select(0, self.dst)

    def unsort(self, per_group: list[torch.Tensor]) -> torch.Tensor:
        """Per-group per-sequence tensors ``[m, ...]`` back to sequence order ``[N, ...]``."""
        return torch.cat(per_group, 0).index_select(0, self.inverse)


ScanKernel = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]


def nam_scan_varlen(
    kernel: ScanKernel,
    q: torch.Tensor,  # [1, T, H, dk]
    k: torch.Tensor,  # [1, T, H, dk]
    v: torch.Tensor,  # [1, T, H, dv]
    p_w: torch.Tensor,  # [1, T, H]
    p_e: torch.Tensor,  # [1, T, H]
    p_r: torch.Tensor | None,  # [1, T, H] or None
    initial_state: torch.Tensor,  # [N, H, dv, dk]
    offsets: Sequence[int],
    floor: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed NAM scan through a batched ``kernel(q, k, v, p_w, p_e, p_r, state) -> (o, S)``
    (:func:`~memnets.ops.delta.reference.nam_scan_reference` or the chunked scan), one padded
    group at a time: ``(outputs [1, T, H, dv], final states [N, H, dv, dk])``."""
    pack = Packing(offsets, k.device, PAD_FLOOR if floor is None else floor)
    ext = [None if t is None else pack.pad(t[0]) for t in (q, k, v, p_w, p_e, p_r)]
    outs, finals = [], []
    for g, (ids, L) in enumerate(pack.groups):
        s0 = initial_state.index_select(0, pack.ids[g])
        if L == 0:  # only empty sequences: nothing to read, the state is the initial one
            finals.append(s0)
            continue
        qg, kg, vg, pwg, peg, prg = (None if t is None else pack.gather(g, t) for t in ext)
        o, s = kernel(qg, kg, vg, pwg, peg, prg, s0)
        outs.append(o)
        finals.append(s)
    H, dv = v.shape[2], v.shape[3]
    out = pack.scatter(outs) if outs else v.new_zeros(0, H, dv)
    return out.unsqueeze(0).to(v.dtype), pack.unsort(finals).to(v.dtype)


def attention_varlen(
    q: torch.Tensor,  # [..., T, dk]
    k: torch.Tensor,  # [..., T, dk]
    v: torch.Tensor,  # [..., T, dv]
    offsets: Sequence[int],
    *,
    causal: bool,
    chunk_size: int = 64,
    floor: int | None = None,
) -> torch.Tensor:
    """``o_t = Σ_s (q_t·k_s) v_s`` over the keys s of t's own sequence (``s <= t`` when causal):
    the unnormalised linear attention that :func:`memnets.ops.nam_attention` (on ``μ(q), μ(k)``)
    and :func:`memnets.ops.linear_attention` (on ``φ(q), φ(k)``) reduce to. ``[..., T, dv]``."""
    from .attention import _causal_chunked  # the dense kernel (ops/attention.py imports this module)

    pack = Packing(offsets, k.device, PAD_FLOOR if floor is None else floor)
    ext = [pack.pad(t.movedim(-2, 0)) for t in (q, k, v)]  # [T + 1, ..., D]
    outs = []
    for g, (ids, L) in enumerate(pack.groups):
        if L == 0:
            continue
        qg, kg, vg = (pack.gather(g, t).movedim(1, -2) for t in ext)  # [m, ..., L, D]
        if causal:
            o = _causal_chunked(qg, kg, vg, chunk_size)
        else:
            o = qg @ (kg.transpose(-1, -2) @ vg)  # padded keys and values are zero
        outs.append(o.movedim(-2, 1))  # [m, L, ..., dv]
    if not outs:
        return v.new_zeros(v.shape)
    return pack.scatter(outs).movedim(0, -2)  # [..., T, dv]


def same_sequence_mask(offsets: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """``[T, T]`` bool: True where query t and key s belong to the same sequence (block diagonal)."""
    seq = sequence_ids(offsets, device)
    return seq[:, None] == seq[None, :]


def sequence_ids(offsets: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """``[T]`` long: the sequence each packed token belongs to."""
    lens = torch.tensor([b - a for a, b in zip(offsets[:-1], offsets[1:])], dtype=torch.long)
    return torch.repeat_interleave(torch.arange(len(lens)), lens).to(device)


def keys_seen(valid: torch.Tensor, offsets: Sequence[int], causal: bool) -> torch.Tensor:
    """For packed per-token weights ``valid [T]`` (1 = a real key): the number of keys each token's
    attention sums over, within its own sequence (up to itself when ``causal``). ``[T]``."""
    seq = sequence_ids(offsets, valid.device)
    n = len(offsets) - 1
    if causal:
        # per-sequence running count: cumsum minus the count before the sequence's start
        c = valid.cumsum(0)
        before = torch.cat([c.new_zeros(1), c])[torch.tensor(offsets[:-1], device=valid.device)]  # [N]
        return c - before[seq]
    totals = valid.new_zeros(n).index_add_(0, seq, valid)
    return totals[seq]


def reverse_within(x: torch.Tensor, lengths: torch.Tensor, time_dim: int = 1) -> torch.Tensor:
    """Each sequence reversed within its own length (``x[b, L_b - 1 - t]`` at ``t < L_b``), the
    padding left where it is; its own inverse. ``x`` ``[B, T, ...]`` (``[T, B, ...]`` with
    ``time_dim=0``), ``lengths`` ``[B]``: a padded batch's sequence lengths, as a recurrence
    whose reverse direction must start at each sequence's end needs them."""
    T = x.shape[time_dim]
    t = torch.arange(T, device=lengths.device)[None, :]  # [1, T]
    L = lengths.to(torch.long)[:, None]  # [B, 1]
    idx = torch.where(t < L, L - 1 - t, t).to(x.device)  # [B, T]
    if time_dim == 0:
        idx = idx.t()
    idx = idx.reshape(*idx.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(time_dim, idx)
