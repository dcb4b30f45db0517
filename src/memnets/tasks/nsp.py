"""Algorithmic masked-completion tasks of the NAM paper's Table 1 (docs/maths.md §11, §12).

Every sample is a fixed-width window of token ids (vocabulary of 16, :data:`VOCAB_SIZE`),
with the problem placed after a random left shift and padded with ``PAD``. The input holds
``MASK`` tokens in the answer slots; the target is the input with the masks replaced by the
answer. A model predicts every position in one pass (no decoding loop).

Tasks (digits little-endian, ``n`` = the sample's digit count):

- ``fib`` (alias ``addition``): one addition ``a + b``; ``b`` has exactly ``n`` digits, ``a``
  a random length in ``[1, n]``; layout ``DELIM a DELIM b DELIM MASK×|y| EOS`` with
  ``y = a + b``.
- ``palindrome``: ``DELIM d DELIM MASK×n EOS``; the answer slots hold ``d`` reversed.
- ``reduce``: each digit is 0 with probability ½ (else uniform 1..9);
  ``DELIM d DELIM MASK×n EOS``; the answer slots hold the non-zero digits in order, then
  ``PAD`` for the slots left over.

Splits (docs/maths.md §11): train 1–10 digits, ``id`` 5–10, ``od_easy`` 11–13, ``od_hard`` 14–16.
Each split's window width is set by its largest digit count, so longer splits have wider
windows. Digit counts are stratified (equal numbers of samples per count).

Metrics (:func:`sequence_metrics`): sequence accuracy counts a sample correct only if every
position of the window is predicted correctly (the paper's metric); token accuracy is given
both over the whole window (the paper's training metric) and over the answer slots only
(positions whose input is ``MASK``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "DIGITS", "DELIM", "PAD", "START", "EOS", "MASK", "SPARE", "VOCAB_SIZE", "TOKEN_CHARS",
    "TASKS", "DEFAULT_SPLITS", "TRAIN_DIGITS", "NSPBatch", "window_width", "generate",
    "make_split", "sequence_metrics", "decode", "NSPSplit",
]

DIGITS = 10
DELIM, PAD, START, EOS, MASK, SPARE = 10, 11, 12, 13, 14, 15
VOCAB_SIZE = 16
TOKEN_CHARS = "0123456789_.SEM?"  # one printable character per token id

TASKS = ("fib", "addition", "palindrome", "reduce")
TRAIN_DIGITS = (1, 10)
DEFAULT_SPLITS = {"id": (5, 10), "od_easy": (11, 13), "od_hard": (14, 16)}


class NSPBatch(NamedTuple):
    """A batch of samples. ``inputs, targets``: int64 ``[N, W]``; ``digits``: int64 ``[N]``."""

    inputs: torch.Tensor
    targets: torch.Tensor
    digits: torch.Tensor


def _canonical(task: str) -> str:
    if task not in TASKS:
        raise ValueError(f"`task` expected one of {list(TASKS)}, got {task!r}")
    return "fib" if task == "addition" else task


def window_width(task: str, max_digits: int) -> int:
    """Window width W for ``task`` when the longest sample has ``max_digits`` digits.

    Fib: ``3 (n+1) + 2`` (room for ``a``, ``b`` and an ``n+1``-digit sum); palindrome and
    reduce: ``2 (n+1) + 2``. The extra slot leaves room for a random shift.
    """
    task = _canonical(task)
    return 3 * (max_digits + 1) + 2 if task == "fib" else 2 * (max_digits + 1) + 2


def _stratified(n: int, lo: int, hi: int) -> torch.Tensor:
    """Digit counts ``[n]``: equal shares of ``lo..hi`` in increasing order."""
    idx = torch.arange(n, dtype=torch.int64)
    return lo + (idx * (hi - lo + 1)) // max(n, 1)


def _uniform_int(lo: torch.Tensor, hi: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Integers uniform in ``[lo, hi]`` elementwise (inclusive)."""
    u = torch.rand(lo.shape, generator=g, dtype=torch.float64)
    return (lo + torch.floor(u * (hi - lo + 1).double()).long()).clamp(max=hi)


def _random_number(length: torch.Tensor, width: int, g: torch.Generator) -> torch.Tensor:
    """Little-endian digits ``[N, width]`` of numbers with exactly ``length`` digits (>0 if 1 digit)."""
    n = length.shape[0]
    d = torch.randint(0, 10, (n, width), generator=g)
    top = torch.randint(1, 10, (n,), generator=g)  # leading digit never 0
    pos = torch.arange(width)[None, :]
    d = torch.where(pos == (length - 1)[:, None], top[:, None], d)
    return torch.where(pos < length[:, None], d, torch.zeros_like(d))


def _add(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Little-endian digit sum of ``a, b`` ``[N, w]`` → (digits ``[N, w+1]``, length ``[N]``)."""
    n, w = a.shape
    out = torch.zeros(n, w + 1, dtype=torch.int64)
    carry = torch.zeros(n, dtype=torch.int64)
    for j in range(w):  # a ripple-carry loop over digit positions, vectorised over samples
        s = a[:, j] + b[:, j] + carry
        out[:, j], carry = s % 10, s // 10
    out[:, w] = carry
    nz = (out != 0).long() * torch.arange(1, w + 2)[None, :]
    return out, nz.max(dim=1).values.clamp(min=1)


def _take(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``src[i, idx[i, p]]`` with out-of-range indices clamped (callers mask them)."""
    return torch.gather(src, 1, idx.clamp(0, src.shape[1] - 1))


def generate(task: str, digits: torch.Tensor, width: int, generator: torch.Generator) -> NSPBatch:
    """Generate one sample per entry of ``digits`` (int64 ``[N]``, each ≥ 1) in windows of ``width``.

    Deterministic given ``generator``'s state. Raises ValueError when ``width`` is too small.

    Worked example (palindrome, n = 3, digits 4 0 7, shift 1, width 10)::

        inputs   . _ 4 0 7 _ M M M E      (. = PAD, _ = DELIM, M = MASK, E = EOS)
        targets  . _ 4 0 7 _ 7 0 4 E

    Fib with a = 5, b = 98 (n = 2; little-endian: a = 5, b = 8 9, y = 103 → 3 0 1), shift 0,
    width 11::

        inputs   _ 5 _ 8 9 _ M M M E .
        targets  _ 5 _ 8 9 _ 3 0 1 E .

    Reduce with d = 3 0 0 5 (n = 4), shift 0, width 12::

        inputs   _ 3 0 0 5 _ M M M M E .
        targets  _ 3 0 0 5 _ 3 5 . . E .
    """
    task = _canonical(task)
    if not isinstance(digits, torch.Tensor) or digits.dim() != 1:
        raise ValueError("`digits` expected an int64 tensor [N]")
    digits = digits.long()
    n = digits.shape[0]
    hi = int(digits.max()) if n else 1
    if n and int(digits.min()) < 1:
        raise ValueError(f"`digits` expected values >= 1, got min {int(digits.min())}")
    need = 3 * hi + 5 if task == "fib" else 2 * hi + 3  # longest possible problem
    if width < need:
        raise ValueError(f"`width` expected >= {need} for {hi}-digit {task}, got {width}")
    pos = torch.arange(width)[None, :]
    if task == "fib":
        la = _uniform_int(torch.ones_like(digits), digits, generator)
        a = _random_number(la, hi, generator)
        b = _random_number(digits, hi, generator)
        y, ly = _add(a, b)
        length = la + digits + ly + 4  # DELIM a DELIM b DELIM y EOS
    else:
        d = torch.randint(0, 10, (n, hi), generator=generator)
        if task == "reduce":
            keep = torch.rand(n, hi, generator=generator) < 0.5
            d = torch.where(keep, torch.randint(1, 10, (n, hi), generator=generator), torch.zeros_like(d))
        d = torch.where(pos[:, :hi] < digits[:, None], d, torch.zeros_like(d))
        length = 2 * digits + 3  # DELIM d DELIM MASK×n EOS
    shift = _uniform_int(torch.zeros_like(digits), width - length, generator)
    p = pos - shift[:, None]  # [N, W] position relative to the problem's first token
    inp = torch.full((n, width), PAD, dtype=torch.int64)
    inp = torch.where(p == 0, torch.full_like(inp, DELIM), inp)
    if task == "fib":
        b0 = la[:, None] + 2
        m0 = b0 + digits[:, None] + 1
        e0 = m0 + ly[:, None]
        inp = torch.where((p >= 1) & (p < b0 - 1), _take(a, p - 1), inp)
        inp = torch.where((p == b0 - 1) | (p == m0 - 1), torch.full_like(inp, DELIM), inp)
        inp = torch.where((p >= b0) & (p < m0 - 1), _take(b, p - b0), inp)
        answer = _take(y, p - m0)
    else:
        m0 = digits[:, None] + 2
        e0 = m0 + digits[:, None]
        inp = torch.where((p >= 1) & (p < m0 - 1), _take(d, p - 1), inp)
        inp = torch.where(p == m0 - 1, torch.full_like(inp, DELIM), inp)
        if task == "palindrome":
            answer = _take(d, e0 - 1 - p)  # slot j holds d[n-1-j]
        else:
            rank = torch.cumsum((d != 0).long(), dim=1) - 1  # [N, hi] rank among non-zeros
            rank = torch.where(d != 0, rank, torch.full_like(rank, hi))
            packed = torch.full((n, hi + 1), PAD, dtype=torch.int64)
            packed.scatter_(1, rank, d)  # zeros land in the spare last column
            packed[:, hi] = PAD
            answer = _take(packed, p - m0)
    slots = (p >= m0) & (p < e0)
    inp = torch.where(p == e0, torch.full_like(inp, EOS), inp)
    tgt = torch.where(slots, answer, inp)
    inp = torch.where(slots, torch.full_like(inp, MASK), inp)
    return NSPBatch(inp, tgt, digits)


@dataclass(frozen=True)
class NSPSplit:
    """A named digit range: ``lo..hi`` digits, ``size`` samples (docs/maths.md §11)."""

    lo: int
    hi: int
    size: int


def make_split(task: str, lo: int, hi: int, size: int, seed: int, width: int | None = None) -> NSPBatch:
    """``size`` samples with ``lo..hi`` digits (stratified), reproducible from ``seed``.

    ``width`` defaults to :func:`window_width` ``(task, hi)``. Returns :class:`NSPBatch`.
    """
    if not (1 <= lo <= hi):
        raise ValueError(f"digit range expected 1 <= lo <= hi, got lo={lo}, hi={hi}")
    if size < 1:
        raise ValueError(f"`size` expected >= 1, got {size}")
    g = torch.Generator().manual_seed(int(seed))
    return generate(task, _stratified(size, lo, hi), width or window_width(task, hi), g)


def sequence_metrics(logits: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Counts for the task metrics from ``logits`` ``[N, W, V]`` and ids ``[N, W]``.

    Returns summed (not averaged) counts so shards and batches can be added up:
    ``seq_correct`` (samples with every window position right), ``tok_correct`` /
    ``tok_total`` (whole window), ``ans_correct`` / ``ans_total`` (answer slots, input == MASK),
    ``n`` (samples).
    """
    pred = logits.argmax(-1)
    ok = pred == targets
    ans = inputs == MASK
    return {
        "seq_correct": ok.all(dim=1).sum(),
        "tok_correct": ok.sum(),
        "tok_total": torch.tensor(ok.numel()),
        "ans_correct": (ok & ans).sum(),
        "ans_total": ans.sum(),
        "n": torch.tensor(ok.shape[0]),
    }


def decode(ids: torch.Tensor) -> str:
    """One sample's ids ``[W]`` as a string of :data:`TOKEN_CHARS` separated by spaces."""
    return " ".join(TOKEN_CHARS[int(i)] for i in ids)
