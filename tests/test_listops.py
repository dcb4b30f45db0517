"""LRA ListOps generator, evaluator, encoding and text form (docs/maths.md §11; data README §4)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from memnets.tasks.listops import (
    OPERATORS, VOCAB, VOCAB_SIZE, encode, evaluate, from_text, generate_trees, make_listops, read_tsv,
    sample_tree, split_listops, to_text, tokens, tree_length, write_tsv,
)


def test_evaluator_hand_trees():
    assert evaluate(("[MAX", [2, 9])) == 9
    assert evaluate(("[MIN", [4, 7, 3])) == 3
    assert evaluate(("[MED", [1, 2, 7, 8])) == 4          # mean of 2 and 7 = 4.5, truncated
    assert evaluate(("[MED", [0, 1])) == 0                # 0.5 -> 0
    assert evaluate(("[MED", [5, 1, 9])) == 5
    assert evaluate(("[SM", [9, 8, 7])) == 4              # 24 mod 10
    assert evaluate(("[SM", [("[MAX", [2, 9]), ("[MIN", [3, 6])])) == 2   # (9 + 3) mod 10
    with pytest.raises(ValueError, match="operator"):
        evaluate(("[FIRST", [1, 2]))


def test_med_matches_numpy_on_random_lists():
    rng = random.Random(3)
    for _ in range(50):
        args = [rng.randint(0, 9) for _ in range(rng.randint(2, 10))]
        assert evaluate(("[MED", args)) == int(np.median(args))


def test_text_form_and_tokens():
    assert to_text(("[MAX", [2, 9])) == "( ( ( [MAX 2 ) 9 ) ] )"
    tree = ("[SM", [1, ("[MIN", [4, 5]), 7])
    assert tokens(tree) == ["[SM", "1", "[MIN", "4", "5", "X", "7", "X"]
    assert encode(tokens(tree)) == [14, 2, 11, 5, 6, 15, 8, 15]
    assert from_text(to_text(tree)) == tree
    assert len(tokens(tree)) == tree_length(tree) == 8
    assert VOCAB_SIZE == 16 and set(VOCAB.values()) == set(range(1, 16))
    with pytest.raises(ValueError):
        from_text("( [MAX 2")
    with pytest.raises(ValueError):
        encode(["[FIRST"])


def test_sampler_length_matches_tokens_and_depth_limit():
    rng = random.Random(0)
    for _ in range(200):
        tree, n = sample_tree(rng, max_depth=4)
        assert n == tree_length(tree) == len(tokens(tree))
        assert 0 <= evaluate(tree) <= 9


def test_make_listops_constraints_and_determinism():
    a = make_listops(12, seed=5, min_len=20, max_len=80)
    b = make_listops(12, seed=5, min_len=20, max_len=80)
    c = make_listops(12, seed=6, min_len=20, max_len=80)
    assert a.tokens.shape == (12, 80) and a.tokens.dtype == torch.long
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.tokens, c.tokens)
    assert ((a.lengths > 20) & (a.lengths < 80)).all()
    for row, n in zip(a.tokens, a.lengths):
        assert (row[:n] > 0).all() and (row[n:] == 0).all()
        assert int(row[0]) in {VOCAB[o] for o in OPERATORS}       # a long tree starts with an operator
    assert len({tuple(r.tolist()) for r in a.tokens}) == 12        # distinct


def test_paper_length_range_and_label_spread():
    trees = generate_trees(8, seed=0)                              # 500 < length < 2000
    assert all(500 < tree_length(t) < 2000 for t in trees)
    d = make_listops(150, seed=1, min_len=30, max_len=200)
    counts = torch.bincount(d.labels, minlength=10)
    assert int((counts > 0).sum()) >= 6
    assert counts.max() < 0.6 * len(d)


def test_split_and_tsv_round_trip(tmp_path):
    trees = generate_trees(10, seed=2, min_len=10, max_len=60)
    parts = split_listops(trees, (6, 2, 2))
    assert parts["train"] + parts["val"] + parts["test"] == trees
    d = split_listops(make_listops(10, seed=2, min_len=10, max_len=60), (6, 2, 2))
    assert len(d["train"]) == 6 and len(d["test"]) == 2
    with pytest.raises(ValueError, match="counts"):
        split_listops(trees, (8, 2, 2))
    path = tmp_path / "basic_train.tsv"
    write_tsv(path, trees)
    assert path.read_text().splitlines()[0] == "Source\tTarget"
    back, labels = read_tsv(path)
    assert back == trees and labels == [evaluate(t) for t in trees]


def test_bad_arguments():
    with pytest.raises(ValueError, match="n"):
        generate_trees(-1, seed=0)
    with pytest.raises(ValueError, match="min_len"):
        generate_trees(1, seed=0, min_len=50, max_len=40)


def test_cached_listops_writes_reuses_and_serves_smaller_requests(tmp_path):
    from memnets.tasks.listops import cached_listops
    a = cached_listops(30, seed=3, min_len=20, max_len=60, cache_dir=tmp_path)
    files = list(tmp_path.glob("listops_s3_20-60_n30.pt"))
    assert len(files) == 1
    ref = make_listops(30, seed=3, min_len=20, max_len=60)
    assert torch.equal(a.tokens, ref.tokens) and torch.equal(a.labels, ref.labels)
    b = cached_listops(30, seed=3, min_len=20, max_len=60, cache_dir=tmp_path)  # read back
    assert torch.equal(a.tokens, b.tokens) and b.tokens.dtype == torch.long
    c = cached_listops(12, seed=3, min_len=20, max_len=60, cache_dir=tmp_path)  # first 12 of the 30
    assert torch.equal(c.tokens, make_listops(12, seed=3, min_len=20, max_len=60).tokens)
    assert len(list(tmp_path.glob("*.pt"))) == 1
    files[0].write_bytes(b"damaged")
    d = cached_listops(30, seed=3, min_len=20, max_len=60, cache_dir=tmp_path)  # regenerated
    assert torch.equal(d.tokens, ref.tokens)
