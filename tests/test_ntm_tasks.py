"""NTM algorithmic tasks (docs/maths.md §11): determinism, layouts, targets, masks and the bits metric."""
import math

import pytest
import torch

from memnets.tasks.ntm_tasks import (AssociativeRecallTask, CopyTask, PrioritySortTask, RepeatCopyTask, TaskBatch,
                                     bit_errors, bits_per_sequence)

ALL = [CopyTask(), RepeatCopyTask(), AssociativeRecallTask(), PrioritySortTask()]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("task", ALL, ids=lambda t: type(t).__name__)
def test_deterministic_shapes_and_iterable(task):
    a = task.make_batch(5, _gen(3))
    b = task.make_batch(5, _gen(3))
    c = task.make_batch(5, _gen(4))
    assert isinstance(a, TaskBatch)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(a.inputs, c.inputs) or a.inputs.shape != c.inputs.shape
    B, T, _ = a.inputs.shape
    assert a.inputs.shape[-1] == task.input_size and a.targets.shape == (B, T, task.output_size)
    assert a.mask.shape == (B, T) and set(a.mask.unique().tolist()) <= {0.0, 1.0}
    assert set(a.targets.unique().tolist()) <= {0.0, 1.0}
    task.batch_size, task.seed = 5, 3
    first = next(iter(task))
    assert torch.equal(first.inputs, a.inputs)


def test_copy_layout():
    task = CopyTask(min_len=1, max_len=6, bits=4)
    batch = task.make_batch(8, _gen(0))
    for x, y, m in zip(*batch):
        L = int(m.sum())
        assert x[L, 4] == 1 and x[:, 4].sum() == 1  # one delimiter, right after the data
        assert torch.equal(y[L + 1: 2 * L + 1], x[:L, :4])  # target is the input sequence
        assert m[L + 1: 2 * L + 1].all() and m.sum() == L
        assert x[L + 1:].abs().sum() == 0
    lens = {int(m.sum()) for m in CopyTask(1, 20).make_batch(64, _gen(1)).mask}
    assert min(lens) >= 1 and max(lens) <= 20 and len(lens) > 5


def test_repeat_copy_layout():
    task = RepeatCopyTask(min_len=2, max_len=2, min_repeats=3, max_repeats=3, bits=2)
    x, y, m = (t[0] for t in task.make_batch(1, _gen(0)))
    assert x.shape[0] == 1 + 2 + 1 + 6 + 1
    seq = x[1:3, :2]
    assert torch.equal(y[4:10, :2], seq.repeat(3, 1))
    assert y[10, 2] == 1 and y[:, 2].sum() == 1
    assert math.isclose(float(x[3, 3]), (3 - 5.5) / math.sqrt(99 / 12), rel_tol=1e-6)
    assert m.sum() == 7 and m[4:].all()


def test_associative_recall_target_is_next_item():
    task = AssociativeRecallTask(min_items=3, max_items=5, item_len=3, bits=6)
    for x, y, m in zip(*task.make_batch(16, _gen(2))):
        T = int(torch.nonzero(m)[-1]) + 1
        n = (T - 8) // 4
        items = [x[i * 4 + 1: i * 4 + 4, :6] for i in range(n)]
        query = x[4 * n + 1: 4 * n + 4, :6]
        q = [i for i in range(n - 1) if torch.equal(items[i], query)]
        assert q, "query must be one of the first n-1 items"
        assert any(torch.equal(y[T - 3: T], items[i + 1]) for i in q)
        assert m.sum() == 3


def test_priority_sort_targets_sorted():
    task = PrioritySortTask(n_in=6, n_out=4, bits=5)
    x, y, m = (t[0] for t in task.make_batch(1, _gen(5)))
    prio = x[:6, 5]
    order = torch.argsort(prio, descending=True)[:4]
    assert torch.equal(y[7:11], x[:6, :5][order])
    assert x[6, 6] == 1 and m.sum() == 4 and m[7:].all()
    with pytest.raises(ValueError, match="n_out"):
        PrioritySortTask(n_in=3, n_out=4)


def test_bits_per_sequence_and_bit_errors():
    targets = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    # logits 0: every scored bit costs exactly 1 bit -> 4 bits for the sequence
    assert math.isclose(float(bits_per_sequence(torch.zeros(1, 3, 2), targets, mask)), 4.0, rel_tol=1e-6)
    perfect = (targets * 2 - 1) * 50
    assert float(bits_per_sequence(perfect, targets, mask)) < 1e-6
    assert float(bit_errors(perfect, targets, mask)) == 0.0
    wrong = -perfect
    assert float(bit_errors(wrong, targets, mask)) == 4.0  # only the 4 scored bits count
    assert float(bit_errors(wrong, targets)) == 6.0
    with pytest.raises(ValueError, match="targets"):
        bits_per_sequence(torch.zeros(1, 3, 2), torch.zeros(1, 3, 3))
    with pytest.raises(ValueError, match="mask"):
        bits_per_sequence(torch.zeros(1, 3, 2), targets, torch.ones(1, 2))


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_len"):
        CopyTask(min_len=5, max_len=2)
    with pytest.raises(ValueError, match="batch_size"):
        CopyTask().make_batch(0)
