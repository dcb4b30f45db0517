"""Variable-length batches as ``torch.nn.utils.rnn.PackedSequence``, as ``torch.nn.LSTM`` takes them.

A packed batch holds sequences of different lengths sorted longest first; at time ``t`` the
first ``batch_sizes[t]`` of them are still running. :func:`run_segments` runs a recurrence over
the stretches of time in which that number stays the same, each stretch on the sequences still
running, with the state the previous stretch left them; a sequence's final state is its state
after its own last step, and no padding ever enters a state. So the result is exactly what
running every sequence alone over its own length gives (``tests/test_packed.py`` holds each
module to that, values and gradients), at one call of the recurrence per distinct length.

The recurrence must be causal and carry over through its state: running ``x[:, :a]`` then
``x[:, a:]`` from the state the first call returned equals running ``x``. The NTM (and the DNC
on CUDA) take packed batches through their ``forward`` this way. The fast-weight memory and LSAM
take them in one call over the padded batch: a step that does not write leaves their state
exactly as it was, so each sequence simply stops writing after its end (:func:`forward_packed`'s
``write_mask``; LSAM closes its write gate through one more input column,
``LSAM._forward_packed``). The DNC's CPU recurrence takes them in one call too, reading each
sequence's final state at its own last step and sending that state's gradient in there
(:func:`forward_packed`'s ``lengths``; ``DNCRecurrence``'s ``lengths``). The NAM Turing Machine
takes them in one call as well: its controller runs over each sequence's own length (a reverse
direction from each sequence's end, :func:`reverse_within`), and past each end its write
probabilities are 0 and both heads NO-OP, so tapes and heads stay exactly where the sequence
left them (a model without the NOOP action refuses a packed batch).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import PackedSequence

from ..ops.gpu.graphs import modules_off
from ..ops.varlen import reverse_within
from ..state import map_state

__all__ = ["unpack_sorted", "repack", "run_segments", "reverse_within", "segments", "lengths_of", "running",
           "sort_state", "unsort_state", "forward_packed"]


def segments(batch_sizes: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(t0, t1, b)``: the stretches ``[t0, t1)`` of time in which ``b`` sequences are running."""
    sizes = [int(s) for s in batch_sizes]
    out: list[tuple[int, int, int]] = []
    t0 = 0
    for t in range(1, len(sizes) + 1):
        if t == len(sizes) or sizes[t] != sizes[t0]:
            out.append((t0, t, sizes[t0]))
            t0 = t
    return out


def running(batch_sizes: torch.Tensor, device) -> torch.Tensor:
    """``[T, B]`` bool, True where sequence ``b`` (sorted order) is running at time ``t``."""
    B = int(batch_sizes[0])
    return (torch.arange(B)[None, :] < batch_sizes[:, None]).to(device)


def unpack_sorted(packed: PackedSequence, name: str = "x") -> torch.Tensor:
    """The batch of a packed sequence as ``[B, T, F]``, longest first (the packed order), zeros
    after each sequence's end."""
    if not isinstance(packed, PackedSequence):
        raise TypeError(f"`{name}` expected a PackedSequence, got {type(packed).__name__}")
    data, batch_sizes = packed.data, packed.batch_sizes
    if data.dim() != 2:
        raise ValueError(f"`{name}` expected packed data [sum of lengths, features], got {list(data.shape)}")
    valid = running(batch_sizes, data.device)  # [T, B]
    x = data.new_zeros(*valid.shape, data.shape[1]).index_put((valid,), data)  # [T, B, F], time-major as packed
    return x.transpose(0, 1)


def repack(y: torch.Tensor, like: PackedSequence) -> PackedSequence:
    """``y [B, T, D]`` in the packed (longest-first) order as a PackedSequence with ``like``'s
    lengths and order."""
    valid = running(like.batch_sizes, y.device)
    return PackedSequence(y.transpose(0, 1)[valid], like.batch_sizes, like.sorted_indices, like.unsorted_indices)


def lengths_of(batch_sizes: torch.Tensor) -> torch.Tensor:
    """Each sequence's length (packed order) from the packed ``batch_sizes``."""
    B = int(batch_sizes[0])
    return (batch_sizes[None, :] > torch.arange(B)[:, None]).sum(1)


def _narrow(state: Any, dim: int, start: int, length: int) -> Any:
    return map_state(lambda s: s.narrow(dim, start, length), state)


def _cat(states: list[Any], dim: int) -> Any:
    first = states[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(states, dim)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_cat(list(parts), dim) for parts in zip(*states)))
    if isinstance(first, (tuple, list)):
        return type(first)(_cat(list(parts), dim) for parts in zip(*states))
    if isinstance(first, dict):
        return {k: _cat([s[k] for s in states], dim) for k in first}
    return first


def run_segments(fn: Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]], x: torch.Tensor,
                 batch_sizes: torch.Tensor, state: Any = None, state_dim: int = 0,
                 time_dim: int = 1) -> tuple[torch.Tensor, Any]:
    """Run ``fn(x_piece, state) -> (y_piece, state)`` over a padded, longest-first batch ``x``
    (``[B, T, ·]``, or ``[T, B, ·]`` with ``time_dim=0``) stretch by stretch of :func:`segments`.

    ``state``: every tensor's batch dim is ``state_dim`` (``None``: ``fn`` makes it on the first
    stretch, where every sequence runs). Returns ``(y, state)``: ``y`` like ``x`` with zeros after
    each sequence's end, the state of each sequence after its own last step."""
    bdim = 1 - time_dim
    B = x.shape[bdim]
    if int(batch_sizes[0]) != B or len(batch_sizes) != x.shape[time_dim]:
        raise ValueError(f"`x` expected batch {int(batch_sizes[0])} and time {len(batch_sizes)} "
                         f"(the packed batch's), got {list(x.shape)}")
    pieces, done = [], []
    for t0, t1, b in segments(batch_sizes):
        if state is not None:
            had = _state_batch(state, state_dim)
            if had > b:  # the sequences past b ended at t0: their state is final
                done.append(_narrow(state, state_dim, b, had - b))
                state = _narrow(state, state_dim, 0, b)
        y, state = fn(x.narrow(time_dim, t0, t1 - t0).narrow(bdim, 0, b), state)
        pad = [0, 0] * (y.dim() - bdim - 1) + [0, B - b]
        pieces.append(F.pad(y, pad) if b < B else y)
    return torch.cat(pieces, time_dim), _cat([state] + done[::-1], state_dim)


def _state_batch(state: Any, dim: int) -> int:
    sizes: list[int] = []
    map_state(lambda s: sizes.append(s.shape[dim]), state)
    return sizes[0]


def sort_state(state: Any, packed: PackedSequence, dim: int) -> Any:
    """A state given in the batch's own order (as ``torch.nn.LSTM``'s ``hx``), every tensor's
    batch dim at ``dim``, in the packed (longest-first) order."""
    if state is None or packed.sorted_indices is None:
        return state
    return map_state(lambda s: s.index_select(dim, packed.sorted_indices.to(s.device)), state)


def unsort_state(state: Any, packed: PackedSequence, dim: int) -> Any:
    """The inverse of :func:`sort_state`: a state in the packed order back in the batch's own."""
    if packed.unsorted_indices is None:
        return state
    return map_state(lambda s: s.index_select(dim, packed.unsorted_indices.to(s.device)), state)


def forward_packed(forward: Callable, packed: PackedSequence, state: Any = None, state_dim: int = 0,
                   write_mask: str | None = None, lengths: str | None = None, return_aux: bool = False,
                   **kwargs) -> tuple[PackedSequence, Any]:
    """``forward(x [B, T, F], state, **kwargs) -> (y [B, T, D], state, ...)`` of a causal
    recurrence on a packed batch: ``(y as a PackedSequence, final state)``. ``state`` in the
    batch's own order (as the packed batch was made, like ``torch.nn.LSTM``'s ``hx``), every
    tensor's batch dim at ``state_dim``; the final state is returned in that order too.

    ``write_mask``: the name of ``forward``'s keyword for a ``[B, T]`` bool mask of the steps
    that write (a step that does not leaves the state exactly as it was): then one call on the
    padded batch, writing only up to each sequence's end. ``lengths``: the name of its keyword
    for the ``[B]`` lengths, where ``forward`` takes each sequence's final state after its own
    last step itself (the outputs past an end are dropped): then one call on the padded batch
    too. Else :func:`run_segments`.
    ``return_aux``: the module's own flag, refused here (per-step traces need a padded batch)."""
    if return_aux:
        raise ValueError("`return_aux` needs a padded tensor `x` [B, T, input_size], not a PackedSequence")
    x = unpack_sorted(packed)
    state = sort_state(state, packed, state_dim)
    if write_mask is not None:
        valid = running(packed.batch_sizes, x.device).t()  # [B, T]
        y, state = forward(x, state, **{write_mask: valid}, **kwargs)[:2]
        y = y * valid[..., None]
    elif lengths is not None:  # repack keeps each sequence's outputs up to its end only
        y, state = forward(x, state, **{lengths: lengths_of(packed.batch_sizes)}, **kwargs)[:2]
    else:
        with modules_off():  # a module graphed whole would capture a graph per stretch's shape
            y, state = run_segments(lambda xs, st: forward(xs, st, **kwargs)[:2], x, packed.batch_sizes, state,
                                    state_dim)
    return repack(y, packed), unsort_state(state, packed, state_dim)
