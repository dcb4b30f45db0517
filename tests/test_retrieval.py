"""Retrieval task generators: deterministic, correct targets, latest value wins, MQAR layout."""
from __future__ import annotations

import doctest

import pytest
import torch

import memnets.tasks.retrieval as retrieval
from memnets.tasks.retrieval import edit_retrieval_batch, latest_write_index, mqar_batch, retrieval_batch


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_docstring_examples_run():
    res = doctest.testmod(retrieval, optionflags=doctest.ELLIPSIS)
    assert res.attempted >= 6 and res.failed == 0


@pytest.mark.parametrize("make", [
    lambda g: retrieval_batch(3, 5, 4, generator=g),
    lambda g: edit_retrieval_batch(3, 5, 9, 4, generator=g),
    lambda g: mqar_batch(3, 64, 8, 64, generator=g),
])
def test_deterministic(make):
    a, b, c = make(_g(1)), make(_g(1)), make(_g(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_setting1_keys_once_and_targets():
    b = retrieval_batch(4, 7, 5, generator=_g())
    for row in range(4):
        assert sorted(b.keys[row].tolist()) == list(range(7))
        assert sorted(b.queries[row].tolist()) == list(range(7))
        for q in range(7):
            t = int(b.target_index[row, q])
            assert int(b.keys[row, t]) == int(b.queries[row, q])
            assert torch.equal(b.targets[row, q], b.values[row, t])
    assert torch.equal(b.value_ids, torch.full((4, 7), -1))


def test_onehot_values():
    b = retrieval_batch(2, 6, 8, value_kind="onehot", num_values=3, generator=_g())
    assert torch.equal(b.values.sum(-1), torch.ones(2, 6))
    assert torch.equal(b.values.argmax(-1), b.value_ids)
    assert int(b.value_ids.max()) < 3
    with pytest.raises(ValueError, match="num_values"):
        retrieval_batch(2, 6, 4, value_kind="onehot", num_values=5)
    with pytest.raises(ValueError, match="value_kind"):
        retrieval_batch(2, 6, 4, value_kind="gauss")


def test_edits_latest_value_wins():
    b = edit_retrieval_batch(8, 4, 12, 3, generator=_g(3))
    assert b.keys.shape == (8, 12) and b.queries.shape == (8, 4)
    saw_edit = False
    for row in range(8):
        keys = b.keys[row].tolist()
        assert set(keys) == set(range(4))  # every key written at least once
        for q in range(4):
            k = int(b.queries[row, q])
            last = max(i for i, kk in enumerate(keys) if kk == k)  # plain loop reference
            assert int(b.target_index[row, q]) == last
            assert torch.equal(b.targets[row, q], b.values[row, last])
            saw_edit |= keys.count(k) > 1
    assert saw_edit  # some key really was re-assigned
    with pytest.raises(ValueError, match="num_writes"):
        edit_retrieval_batch(2, 5, 3)


def test_latest_write_index_hand_case():
    keys = torch.tensor([[0, 1, 0, 2, 1]])
    assert latest_write_index(keys, torch.tensor([[0, 1, 2, 3]])).tolist() == [[2, 4, 3, -1]]


def test_mqar_layout():
    B, T, P, V = 4, 128, 16, 128
    b = mqar_batch(B, T, P, V, generator=_g(5))
    assert b.inputs.shape == (B, T) and b.labels.shape == (B, T)
    for row in range(B):
        x, y = b.inputs[row], b.labels[row]
        keys, vals = x[0:2 * P:2], x[1:2 * P:2]
        assert len(set(keys.tolist())) == P and int(keys.min()) >= 1 and int(keys.max()) < V // 2
        assert int(vals.min()) >= V // 2 and int(vals.max()) < V
        q = (y != -100).nonzero().flatten()
        assert len(q) == P and int(q.min()) >= 2 * P  # queries come after the context
        for t in q.tolist():
            k = int(x[t])
            i = keys.tolist().index(k)  # the key is present earlier in the sequence
            assert int(y[t]) == int(vals[i])
        rest = torch.ones(T, dtype=torch.bool)
        rest[:2 * P] = False
        rest[q] = False
        assert int(x[rest].abs().sum()) == 0  # filler is token 0


def test_bad_input_raises():
    with pytest.raises(ValueError, match="num_pairs"):
        retrieval_batch(2, 0)
    with pytest.raises(TypeError, match="generator"):
        retrieval_batch(2, 3, generator=1)
    with pytest.raises(ValueError, match="seq_len"):
        mqar_batch(2, 32, 16, 128)
    with pytest.raises(ValueError, match="vocab_size"):
        mqar_batch(2, 512, 64, 64)
