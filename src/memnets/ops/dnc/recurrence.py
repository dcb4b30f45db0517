"""The DNC recurrence over a whole sequence as one autograd Function (docs/maths.md §8; the fused path).

:class:`DNCRecurrence` runs every time step of the LSTM controller (all layers) and of the
memory access — retention, usage, sort-based allocation, content weightings, write weighting,
erase/add write, temporal link, precedence, directional and read weightings, read — without
autograd, into preallocated ``[T, ...]`` buffers, and walks the steps in reverse in a
hand-derived backward. What does not depend on the recurrence is batched over the sequence:
the input half of the first controller layer (one matmul before the loop, its gradients
after), and outside the Function the readout and the row permutation of the interface
layer. Inside, the backward first computes every local
derivative that depends on forward values only, for all steps at once (gate derivatives,
the allocation Jacobian with the sort permutation held constant, the retention products,
…), so that the reverse loop is a short chain of multiplies and small matmuls; the recurrent
weight gradients are one matmul each after the loop.

At the DNC's usual sizes every op is tiny, so the fixed costs matter: the ``[T, ...]``
buffers and their per-step views are explicit workspace objects
(:class:`~memnets.ops.dnc.workspace.ForwardWorkspace`,
:class:`~memnets.ops.dnc.workspace.BackwardWorkspace`) kept in a small pool (per shape, dtype
and device) and reused by the next call of the same shape instead of being allocated, faulted in
and sliced again. A forward workspace goes back to the pool when its backward has run (a
second backward through the same graph, with ``retain_graph=True``, recomputes the forward
from the saved inputs) or when the graph is freed; :func:`~memnets.ops.dnc.workspace.clear_workspaces`
empties the pool.

On float32 / float64 CPU tensors the access part of each step, forward and backward, is one
call of a C kernel for all batch rows (:mod:`memnets.ops.dnc.native`), with the same buffers.

The per-equation reference is ``DNC(impl="reference")``; tests hold both equal in float64
(values, final state, gradients of every parameter, the input and the initial state) and
run ``gradcheck`` on this Function. Not twice differentiable.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .backward import run_backward
from .forward import run_forward
from .workspace import POOL, BackwardWorkspace, ForwardWorkspace
from .._amp import backward_without_autocast

__all__ = ["DNCRecurrence"]


def _checked_lengths(dims: tuple, x: torch.Tensor) -> torch.Tensor | None:
    """``dims``' optional per-sequence lengths, checked (``[B]`` integers in 1..T)."""
    if len(dims) < 3 or dims[2] is None:
        return None
    lengths, (B, T) = dims[2], x.shape[:2]
    if lengths.shape != (B,) or lengths.dtype != torch.int64:
        raise ValueError(f"DNCRecurrence: `lengths` expected int64 [{B}], got {lengths.dtype} {list(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 1 or int(lengths.max()) > T):
        raise ValueError(f"DNCRecurrence: `lengths` expected values in 1..{T}, got {lengths.tolist()}")
    return lengths.to(x.device)


class DNCRecurrence(torch.autograd.Function):
    """``apply(dims, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0,
    reads0, w0, w1, b1, …)``.

    dims = (R, W) or (R, W, lengths): ``lengths`` ``[B]`` (int64, each in 1..T) ends each
    sequence early: its final state is its state after step ``lengths[b]`` and the final
    state's gradients enter the reverse loop there (a batch of sequences of different lengths
    in one call, :mod:`memnets.memories.packed`); the steps after are computed on whatever
    the input holds there and reach nothing but their own outputs. x ``[B, T, F]``: the input
    sequence; w_x ``[4C, F]``, b_x ``[4C]``: the input half of the first LSTM layer.
    w_xi ``[I, C]``, b_xi ``[I]``: the interface layer, rows permuted by
    :func:`interface_permutation`. Initial state: h0, c0 ``[B, layers, C]``, mem0 ``[B, N, W]``,
    usage0 ``[B, N]``, link0 ``[B, N, N]``, prec0 ``[B, N]``, wr0 ``[B, R, N]``, ww0 ``[B, N]``,
    reads0 ``[B, R, W]``. w0 ``[4C, R·W + C]``: the recurrent weight of layer 0 (acting on
    ``[r_{t-1}; h_{t-1}]``); w_l ``[4C, 2C]``, b_l ``[4C]`` for the layers above (acting on
    ``[h^{l-1}_t; h^l_{t-1}]``).

    Returns ``(HR [T, B, R·W + C], h [B, layers, C], c [B, layers, C], memory, usage, link,
    precedence, read_weights, write_weights)``: ``[r_t | h_t]`` of every step (the read vectors
    and the top controller layer's output, what the readout sees), then the final state.
    """

    @staticmethod
    def forward(ctx, dims, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0,
                *upper):
        R, W = dims[:2]
        lengths = _checked_lengths(dims, x)
        B, T = x.shape[:2]
        G4 = w_x.shape[0]
        C, N, Lc = G4 // 4, mem0.shape[1], 1 + len(upper) // 2
        ws = [w0] + list(upper[0::2])
        bs = [None] + list(upper[1::2])
        key = ("fwd", T, B, C, N, W, R, Lc, x.dtype, x.device)
        ctx.lease = POOL.lease(key, lambda: ForwardWorkspace(T, B, C, N, W, R, Lc, x.dtype, x.device))
        f = ctx.lease.space
        with torch.inference_mode():  # cheaper dispatch than no_grad; the buffers are ordinary tensors
            run_forward(f, R, W, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0,
                        ws, bs)
        with torch.no_grad():
            X = f.X
            if Lc == 1:
                HR = X[0][1:].clone()  # [r_t | h_t]
            else:
                HR = torch.cat([f.RD.view(T, B, R * W), X[Lc - 1][1:, :, C:]], -1)
            if lengths is None:  # the state after the last step: views, and copies of the workspace's rows
                at = lambda buf: buf[T]  # noqa: E731
                own = lambda buf: buf[T].clone(memory_format=torch.contiguous_format)  # noqa: E731
            else:  # row b's state after its own step lengths[b] (advanced indexing copies already)
                rows = torch.arange(B, device=x.device)
                at = own = lambda buf: buf[lengths, rows]  # noqa: E731
            hT = torch.stack([at(X[layer])[:, (R * W if layer == 0 else C):] for layer in range(Lc)], 1)
            cT = torch.stack([at(f.CB[layer]) for layer in range(Lc)], 1)
            out = (HR, hT, cT, own(f.MEM), own(f.U), own(f.LNK), own(f.PREC), own(f.WR), own(f.WW))
        ctx.dims = (R, W, Lc, key, lengths)
        ctx.save_for_backward(x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0,
                              *upper)
        return out

    @staticmethod
    @backward_without_autocast
    @once_differentiable
    def backward(ctx, dHR, dhT, dcT, dM, du, dL, dp, dwr, dww):
        R, W, Lc, key, lengths = ctx.dims
        x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0, reads0, w0, *upper = ctx.saved_tensors
        ws = [w0] + list(upper[0::2])
        B, T = x.shape[:2]
        C, N = w_x.shape[0] // 4, mem0.shape[1]
        f = ctx.lease.space
        if f is None:  # a second backward through the same graph: recompute the forward
            f = ctx.lease.space = POOL.take(key, lambda: ForwardWorkspace(T, B, C, N, W, R, Lc, x.dtype, x.device))
            with torch.inference_mode():
                run_forward(f, R, W, x, w_x, b_x, w_xi, b_xi, h0, c0, mem0, usage0, link0, prec0, wr0, ww0,
                            reads0, ws, [None] + list(upper[1::2]))
        bkey = ("bwd",) + key[1:]
        g = POOL.take(bkey, lambda: BackwardWorkspace(T, B, C, N, W, R, Lc, x.dtype, x.device))
        f.backward_views(R, W, Lc)
        with torch.inference_mode():
            grads = run_backward(f, g, R, W, x, w_x, w_xi, ws, dHR, dhT, dcT, dM, du, dL, dp, dwr, dww,
                                 need_dx=ctx.needs_input_grad[1], lengths=lengths)
        grads = [None if d is None else d.clone() for d in grads]  # ordinary tensors (none aliasing the workspace)
        POOL.give(bkey, g)
        ctx.lease.release()
        return (None, *grads)
