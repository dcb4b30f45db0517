"""NSP / Reduce masked-completion tasks (docs/maths.md §11, §12)."""
from __future__ import annotations

import pytest
import torch

from memnets.tasks import nsp
from memnets.tasks.nsp import DELIM, EOS, MASK, PAD


def _problem(row: torch.Tensor) -> list[int]:
    """Token ids of one window with the PAD shift removed (trailing PADs kept only inside)."""
    ids = row.tolist()
    start = ids.index(DELIM)
    end = ids.index(EOS)
    return ids[start:end + 1]


def _digits_to_int(ds: list[int]) -> int:
    return sum(d * 10 ** i for i, d in enumerate(ds))  # little-endian


@pytest.mark.parametrize("task", ["fib", "palindrome", "reduce", "addition"])
def test_deterministic_and_seed_dependent(task):
    a = nsp.make_split(task, 1, 10, 64, seed=3)
    b = nsp.make_split(task, 1, 10, 64, seed=3)
    c = nsp.make_split(task, 1, 10, 64, seed=4)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)


@pytest.mark.parametrize("task", ["fib", "palindrome", "reduce"])
def test_layout_and_masks(task):
    batch = nsp.make_split(task, 1, 6, 60, seed=0)
    assert batch.inputs.shape == (60, nsp.window_width(task, 6))
    for i in range(60):
        inp, tgt = batch.inputs[i], batch.targets[i]
        # outside the mask slots the target is the input
        slots = inp == MASK
        assert torch.equal(inp[~slots], tgt[~slots])
        assert int(slots.sum()) >= 1
        assert not bool((tgt == MASK).any())
        p = _problem(inp)
        assert p[0] == DELIM and p[-1] == EOS
        # everything before the problem is PAD (the random left shift)
        first = inp.tolist().index(DELIM)
        assert all(t == PAD for t in inp[:first].tolist())


def test_fib_is_an_addition():
    batch = nsp.make_split("fib", 1, 10, 200, seed=1)
    for i in range(200):
        p_in, p_tg = _problem(batch.inputs[i]), _problem(batch.targets[i])
        delims = [j for j, t in enumerate(p_in) if t == DELIM]
        assert len(delims) == 3
        a = p_in[delims[0] + 1:delims[1]]
        b = p_in[delims[1] + 1:delims[2]]
        y = p_tg[delims[2] + 1:-1]
        n = int(batch.digits[i])
        assert len(b) == n and b[-1] != 0  # b has exactly n digits
        assert 1 <= len(a) <= n
        assert all(t == MASK for t in p_in[delims[2] + 1:-1])
        assert _digits_to_int(y) == _digits_to_int(a) + _digits_to_int(b)
        assert y[-1] != 0


def test_palindrome_target_is_reversal():
    batch = nsp.make_split("palindrome", 1, 8, 100, seed=2)
    for i in range(100):
        p_in, p_tg = _problem(batch.inputs[i]), _problem(batch.targets[i])
        n = int(batch.digits[i])
        d = p_in[1:1 + n]
        assert p_in[1 + n] == DELIM
        assert p_in[2 + n:2 + 2 * n] == [MASK] * n  # the input never holds the answer
        assert p_tg[2 + n:2 + 2 * n] == d[::-1]


def test_reduce_target_drops_zeros():
    batch = nsp.make_split("reduce", 1, 10, 300, seed=5)
    zeros = 0
    total = 0
    for i in range(300):
        p_in, p_tg = _problem(batch.inputs[i]), _problem(batch.targets[i])
        n = int(batch.digits[i])
        d = p_in[1:1 + n]
        nz = [x for x in d if x != 0]
        assert p_tg[2 + n:2 + 2 * n] == nz + [PAD] * (n - len(nz))
        zeros += sum(x == 0 for x in d)
        total += n
    assert 0.4 < zeros / total < 0.6  # each digit is 0 with probability 1/2


@pytest.mark.parametrize("name,lo,hi", [("train", 1, 10), ("id", 5, 10), ("od_easy", 11, 13), ("od_hard", 14, 16)])
def test_split_digit_ranges(name, lo, hi):
    if name != "train":
        assert nsp.DEFAULT_SPLITS[name] == (lo, hi)
    else:
        assert nsp.TRAIN_DIGITS == (lo, hi)
    batch = nsp.make_split("palindrome", lo, hi, 90, seed=0)
    assert int(batch.digits.min()) == lo and int(batch.digits.max()) == hi
    n_masks = (batch.inputs == MASK).sum(1)
    assert torch.equal(n_masks, batch.digits)


def test_metrics_counts():
    batch = nsp.make_split("palindrome", 2, 3, 4, seed=0)
    logits = torch.nn.functional.one_hot(batch.targets, nsp.VOCAB_SIZE).float()
    m = nsp.sequence_metrics(logits, batch.inputs, batch.targets)
    assert int(m["seq_correct"]) == 4 and int(m["tok_correct"]) == batch.targets.numel()
    # break one answer slot of sample 0: sequence fails, answer accuracy drops by one
    logits2 = logits.clone()
    j = int((batch.inputs[0] == MASK).nonzero()[0])
    logits2[0, j] = torch.roll(logits2[0, j], 1)
    m2 = nsp.sequence_metrics(logits2, batch.inputs, batch.targets)
    assert int(m2["seq_correct"]) == 3 and int(m2["ans_correct"]) == int(m["ans_total"]) - 1


def test_bad_input_raises():
    with pytest.raises(ValueError, match="task"):
        nsp.make_split("sort", 1, 3, 4, seed=0)
    with pytest.raises(ValueError, match="width"):
        nsp.generate("fib", torch.tensor([5]), 10, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="lo <= hi"):
        nsp.make_split("fib", 5, 3, 4, seed=0)
