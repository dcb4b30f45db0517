"""The NTM algorithmic tasks of Graves et al. (2014) (docs/maths.md §11): copy, repeat copy,
associative recall and priority sort, plus the paper's cost metric in bits per sequence.

Every task is seeded and deterministic: ``task.make_batch(batch_size, generator)`` draws
from a ``torch.Generator`` and returns a :class:`TaskBatch` of ``inputs [B, T, in]``,
``targets [B, T, out]`` and ``mask [B, T]`` (1 where the output is scored). Sequences of a
batch may differ in length; they are left-aligned and zero-padded, and the mask marks each
sequence's own output positions. Each task is also a ``torch.utils.data.IterableDataset``
yielding batches forever from its ``seed`` (pass ``batch_size=None`` to the DataLoader).
"""
from __future__ import annotations

import math
from typing import Iterator, NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.data import IterableDataset

from .._checks import check_positive_int, check_shape

__all__ = [
    "TaskBatch",
    "CopyTask",
    "RepeatCopyTask",
    "AssociativeRecallTask",
    "PrioritySortTask",
    "bits_per_sequence",
    "bit_errors",
]


class TaskBatch(NamedTuple):
    """One batch: ``inputs [B, T, in]``, ``targets [B, T, out]`` (0/1), ``mask [B, T]`` (0/1)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor


def _randint(lo: int, hi: int, n: int, g: torch.Generator) -> list[int]:
    """n integers uniform in [lo, hi]."""
    return torch.randint(lo, hi + 1, (n,), generator=g).tolist()


def _bits(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, shape, generator=g).float()


class _Task(IterableDataset):
    """Shared seeding and iteration; subclasses define sizes and ``_sample``."""

    input_size: int
    output_size: int

    def __init__(self, batch_size: int = 1, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.seed = int(seed)

    def _sample(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def make_batch(self, batch_size: int | None = None, generator: torch.Generator | None = None) -> TaskBatch:
        """A batch of ``batch_size`` (default ``self.batch_size``) sequences drawn from ``generator``
        (default: a fresh generator seeded with ``self.seed``)."""
        B = check_positive_int("batch_size", self.batch_size if batch_size is None else batch_size)
        if generator is None:
            generator = torch.Generator().manual_seed(self.seed)
        samples = [self._sample(generator) for _ in range(B)]
        T = max(s[0].shape[0] for s in samples)
        inputs = torch.zeros(B, T, self.input_size)
        targets = torch.zeros(B, T, self.output_size)
        mask = torch.zeros(B, T)
        for b, (x, y, m) in enumerate(samples):
            inputs[b, : x.shape[0]] = x
            targets[b, : y.shape[0]] = y
            mask[b, : m.shape[0]] = m
        return TaskBatch(inputs, targets, mask)

    def __iter__(self) -> Iterator[TaskBatch]:
        g = torch.Generator().manual_seed(self.seed)
        while True:
            yield self.make_batch(self.batch_size, g)


class CopyTask(_Task):
    """Copy (Graves et al. 2014, §4.1): read a sequence of random 8-bit vectors, then a
    delimiter, then write the sequence back. Train lengths 1–20, test up to 120.

    Channels: inputs ``bits + 1`` (the last is the delimiter flag), targets ``bits``.
    A sequence of length L takes ``T = 2L + 1`` steps; the mask covers steps ``L+1 .. 2L``.

    Worked example (bits = 2, L = 2, sequence (1,0), (1,1))::

        t        0      1      2      3      4
        input  1,0,0  1,1,0  0,0,1  0,0,0  0,0,0
        target  0,0    0,0    0,0    1,0    1,1
        mask     0      0      0      1      1
    """

    def __init__(self, min_len: int = 1, max_len: int = 20, bits: int = 8, batch_size: int = 1, seed: int = 0):
        super().__init__(batch_size, seed)
        self.min_len = check_positive_int("min_len", min_len)
        self.max_len = check_positive_int("max_len", max_len, minimum=min_len)
        self.bits = check_positive_int("bits", bits)
        self.input_size, self.output_size = bits + 1, bits

    def _sample(self, g):
        L = _randint(self.min_len, self.max_len, 1, g)[0]
        seq = _bits((L, self.bits), g)
        x = torch.zeros(2 * L + 1, self.bits + 1)
        x[:L, : self.bits] = seq
        x[L, self.bits] = 1.0
        y = torch.zeros(2 * L + 1, self.bits)
        y[L + 1:] = seq
        m = torch.zeros(2 * L + 1)
        m[L + 1:] = 1.0
        return x, y, m


class RepeatCopyTask(_Task):
    """Repeat copy (Graves et al. 2014, §4.2): a sequence of random 8-bit vectors (length
    1–10), then the number of repeats (1–10) on its own channel, normalised to mean 0 and
    variance 1 over the training range; the target is the sequence repeated that many times
    followed by an end marker on an extra output channel.

    Channels: inputs ``bits + 2`` (start flag, repeat count), targets ``bits + 1`` (end flag).
    A start flag at t = 0 precedes the sequence; ``T = 1 + L + 1 + L·n + 1``.

    Worked example (bits = 1, L = 2, sequence (1), (0), n = 2; count c = (2 − 5.5)/2.872)::

        t        0      1      2      3      4    5    6    7    8
        input  0,1,0  1,0,0  0,0,0  0,0,c   0    0    0    0    0
        target  0,0    0,0    0,0    0,0   1,0  0,0  1,0  0,0  0,1
        mask     0      0      0      0     1    1    1    1    1
    """

    def __init__(self, min_len: int = 1, max_len: int = 10, min_repeats: int = 1, max_repeats: int = 10,
                 bits: int = 8, batch_size: int = 1, seed: int = 0):
        super().__init__(batch_size, seed)
        self.min_len = check_positive_int("min_len", min_len)
        self.max_len = check_positive_int("max_len", max_len, minimum=min_len)
        self.min_repeats = check_positive_int("min_repeats", min_repeats)
        self.max_repeats = check_positive_int("max_repeats", max_repeats, minimum=min_repeats)
        self.bits = check_positive_int("bits", bits)
        self.input_size, self.output_size = bits + 2, bits + 1
        # normalisation of the count over the published training range 1..10
        self.repeat_mean, self.repeat_std = 5.5, math.sqrt((10 ** 2 - 1) / 12)

    def _sample(self, g):
        L = _randint(self.min_len, self.max_len, 1, g)[0]
        n = _randint(self.min_repeats, self.max_repeats, 1, g)[0]
        seq = _bits((L, self.bits), g)
        T = L + 2 + L * n + 1
        x = torch.zeros(T, self.bits + 2)
        x[0, self.bits] = 1.0
        x[1: L + 1, : self.bits] = seq
        x[L + 1, self.bits + 1] = (n - self.repeat_mean) / self.repeat_std
        y = torch.zeros(T, self.bits + 1)
        y[L + 2: T - 1, : self.bits] = seq.repeat(n, 1)
        y[T - 1, self.bits] = 1.0
        m = torch.zeros(T)
        m[L + 2:] = 1.0
        return x, y, m


class AssociativeRecallTask(_Task):
    """Associative recall (Graves et al. 2014, §4.3): items of 3 random 6-bit vectors, each
    item preceded by a delimiter on channel ``bits``; then a query item (one of the first
    n − 1) between two delimiters on channel ``bits + 1``; the target is the item that came
    after the query. Train with 2–6 items, test with up to 12 (here 20).

    ``T = 4 n + 1 + 3 + 1 + 3``; the mask covers the last 3 steps.

    Worked example (bits = 1, item_len = 1, items (1), (0), query = item 0)::

        t        0      1      2      3      4      5      6      7
        input  0,1,0  1,0,0  0,1,0  0,0,0  0,0,1  1,0,0  0,0,1  0,0,0
        target   0      0      0      0      0      0      0      0
        mask     0      0      0      0      0      0      0      1
    """

    def __init__(self, min_items: int = 2, max_items: int = 6, item_len: int = 3, bits: int = 6,
                 batch_size: int = 1, seed: int = 0):
        super().__init__(batch_size, seed)
        self.min_items = check_positive_int("min_items", min_items, minimum=2)
        self.max_items = check_positive_int("max_items", max_items, minimum=min_items)
        self.item_len = check_positive_int("item_len", item_len)
        self.bits = check_positive_int("bits", bits)
        self.input_size, self.output_size = bits + 2, bits

    def _sample(self, g):
        n, k, bits = _randint(self.min_items, self.max_items, 1, g)[0], self.item_len, self.bits
        items = _bits((n, k, bits), g)
        q = _randint(0, n - 2, 1, g)[0]
        T = n * (k + 1) + 1 + k + 1 + k
        x = torch.zeros(T, bits + 2)
        for i in range(n):
            x[i * (k + 1), bits] = 1.0
            x[i * (k + 1) + 1: (i + 1) * (k + 1), :bits] = items[i]
        s = n * (k + 1)
        x[s, bits + 1] = 1.0
        x[s + 1: s + 1 + k, :bits] = items[q]
        x[s + 1 + k, bits + 1] = 1.0
        y = torch.zeros(T, bits)
        y[T - k:] = items[q + 1]
        m = torch.zeros(T)
        m[T - k:] = 1.0
        return x, y, m


class PrioritySortTask(_Task):
    """Priority sort (Graves et al. 2014, §4.5): 20 random 8-bit vectors, each with a scalar
    priority uniform in [−1, 1] on its own channel, then a delimiter; the target is the 16
    highest-priority vectors in descending order of priority.

    Channels: inputs ``bits + 2`` (priority, delimiter), targets ``bits``;
    ``T = n_in + 1 + n_out``; the mask covers the last ``n_out`` steps.

    Worked example (bits = 1, n_in = 2, n_out = 1, vectors (1) with priority −0.5 and (0)
    with priority 0.3)::

        t          0          1        2      3
        input  1,-0.5,0   0,0.3,0   0,0,1   0,0,0
        target    0          0        0      0
        mask      0          0        0      1
    """

    def __init__(self, n_in: int = 20, n_out: int = 16, bits: int = 8, batch_size: int = 1, seed: int = 0):
        super().__init__(batch_size, seed)
        self.n_in = check_positive_int("n_in", n_in)
        self.n_out = check_positive_int("n_out", n_out)
        if n_out > n_in:
            raise ValueError(f"`n_out` expected <= n_in = {n_in}, got {n_out}")
        self.bits = check_positive_int("bits", bits)
        self.input_size, self.output_size = bits + 2, bits

    def _sample(self, g):
        n, k, bits = self.n_in, self.n_out, self.bits
        seq = _bits((n, bits), g)
        prio = torch.rand(n, generator=g) * 2 - 1
        T = n + 1 + k
        x = torch.zeros(T, bits + 2)
        x[:n, :bits] = seq
        x[:n, bits] = prio
        x[n, bits + 1] = 1.0
        order = torch.argsort(prio, descending=True)[:k]
        y = torch.zeros(T, bits)
        y[n + 1:] = seq[order]
        m = torch.zeros(T)
        m[n + 1:] = 1.0
        return x, y, m


def _check_outputs(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    check_shape("logits", logits, ["B", "T", "out"], [None, None, None])
    check_shape("targets", targets, ["B", "T", "out"], list(logits.shape))
    if mask is None:
        return torch.ones(logits.shape[:2], dtype=logits.dtype, device=logits.device)
    check_shape("mask", mask, ["B", "T"], list(logits.shape[:2]))
    return mask.to(logits.dtype)


def bits_per_sequence(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Cost in bits per sequence (Graves et al. 2014): binary cross-entropy in bits, summed
    over the scored positions and channels of each sequence, averaged over the batch.

    Args:
        logits: ``[B, T, out]`` (pre-sigmoid). targets: ``[B, T, out]`` in [0, 1].
        mask: ``[B, T]`` of scored positions (default: all).
    Returns:
        a differentiable scalar ≥ 0 (usable as the training loss).
    """
    m = _check_outputs(logits, targets, mask)
    bce = F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype), reduction="none")  # [B, T, out]
    return (bce.sum(-1) * m).sum() / (logits.shape[0] * math.log(2.0))


def bit_errors(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Average number of wrong bits per sequence (output thresholded at σ = 0.5) over the batch."""
    m = _check_outputs(logits, targets, mask)
    wrong = ((logits > 0).to(targets.dtype) != targets).to(logits.dtype).sum(-1)  # [B, T]
    return (wrong * m).sum() / logits.shape[0]
