"""Products of one row with a weight matrix inside a Triton program, for the kernels that run a
whole time loop in one launch.

The DNC's and the NTM's recurrences couple a step to the next through one product per step,
``z_t = gx_t + x_{t-1} W_0ᵀ`` (and ``dx_{t-1} = dz_t W_0`` back), which their per-step form runs
as a cuBLAS call between two launches of the step's kernel. Every sequence of the batch is one
program of that kernel and depends on no other, so the program can do its own row of the product
and go on to the next step itself: one launch for the whole time loop instead of two per step.
Each program then reads all of ``W_0`` once per step (from L2 on a GPU: the programs share it),
which pays while ``W_0`` is small and costs more than cuBLAS's one read of it when it is large;
:func:`time_loop_in_kernel` chooses by its size, and ``MEMNETS_TIME_LOOP`` overrides the choice.

Inside such a loop the compiler hoists out of it whatever the step computes from values that do
not change over time (the program's row, the sizes, and the offsets and masks made of them) and
keeps it in registers through every step, where the step kernel launched alone makes those values
as it goes. At the NTM's 128 × 20 that took 212 bytes of spills a thread in the backward (sm_90,
triton 3.9; the DNC's at LSTM 64, 8 bytes, and its forward 252 registers where the step alone
took 72). So the loops hand the step's body its program's row and its sizes each plus
``zb = t // T``: zero at every step, which the compiler cannot know, so what is made of them is
made inside the step again (no spills in either loop under triton 3.9; under 3.6, 120 bytes left
in the NTM's backward at 128 × 20, from 436; ``python -m memnets.bench.compile_check``). The
NTM's backward loop passes its buffers' offsets made with ``B + zb`` for the batch size likewise
(180 bytes to 120 under 3.6).
"""
from __future__ import annotations

import os

from . import lazy_kernels

__all__ = ["TIME_LOOP_ENV", "KERNEL_LOOP_MAX", "time_loop_in_kernel", "kernels", "block", "tile"]

TIME_LOOP_ENV = "MEMNETS_TIME_LOOP"
KERNEL_LOOP_MAX = 1 << 16  # weight elements up to which the time loop runs in one kernel (256 KB in float32)
TILE = 2048  # elements of W_0 one program holds at a time


def time_loop_in_kernel(rows: int, cols: int, fits: bool = True) -> bool:
    """Whether a recurrence whose per-step product has a ``[rows, cols]`` weight runs its whole
    time loop in one kernel (module docstring): ``MEMNETS_TIME_LOOP=kernel`` always,
    ``=steps`` never (one launch of the step's kernel and one matmul per step), unset or
    ``auto`` when the weight has at most :data:`KERNEL_LOOP_MAX` elements and the caller says
    its step ``fits`` in a loop (registers to spare for the loop's pointers)."""
    choice = os.environ.get(TIME_LOOP_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "kernel", "steps"):
        raise ValueError(f"{TIME_LOOP_ENV} expected one of auto, kernel, steps, got {choice!r}")
    if choice != "auto":
        return choice == "kernel"
    return rows * cols <= KERNEL_LOOP_MAX and fits


def block(n: int) -> int:
    """The power of two (at least 2) that holds ``n`` lanes."""
    return max(2, 1 << (n - 1).bit_length())


def tile(full: int) -> int:
    """Rows (or columns) of the weight one step of the product loads beside a ``full``-wide
    block: :data:`TILE` elements at a time, at least 2."""
    return max(2, min(full, TILE // full))


@lazy_kernels
def kernels():
    """``(row_addmv, row_vecmm)``: ``@triton.jit`` helpers that kernels call (each kernel module
    puts them into its own globals, where Triton looks a called function up)."""
    import triton
    import triton.language as tl

    @triton.jit
    def row_addmv(y_ptr, w_ptr, x_ptr, M, K, BK: tl.constexpr, BM: tl.constexpr):
        """``y[:M] += W[:M, :K] x[:K]`` (``W`` row-major, contiguous), ``BM`` rows of ``W`` at a
        time; ``BK`` holds ``K``."""
        ik = tl.arange(0, BK)
        mk = ik < K
        x = tl.load(x_ptr + ik, mask=mk, other=0.0)
        for m0 in range(0, M, BM):
            im = m0 + tl.arange(0, BM)
            mm = im < M
            w = tl.load(w_ptr + im[:, None] * K + ik[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
            y = tl.load(y_ptr + im, mask=mm, other=0.0) + tl.sum(w * x[None, :], 1)
            tl.store(y_ptr + im, y, mask=mm)

    @triton.jit
    def row_vecmm(y_ptr, w_ptr, x_ptr, M, K, BM: tl.constexpr, BK: tl.constexpr):
        """``y[:K] = x[:M] W[:M, :K]`` (``W`` row-major, contiguous), ``BK`` columns of ``W`` at a
        time; ``BM`` holds ``M``."""
        im = tl.arange(0, BM)
        mm = im < M
        x = tl.load(x_ptr + im, mask=mm, other=0.0)
        for k0 in range(0, K, BK):
            ik = k0 + tl.arange(0, BK)
            mk = ik < K
            w = tl.load(w_ptr + im[:, None] * K + ik[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
            tl.store(y_ptr + ik, tl.sum(w * x[:, None], 0), mask=mk)

    globals().update(triton=triton, tl=tl)  # where Triton looks a kernel's names up
    return row_addmv, row_vecmm
