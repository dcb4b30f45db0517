"""Byte-level IMDB (LRA Text) on the real archive (docs/maths.md §11; data README §3)."""
from __future__ import annotations

import pytest
import torch

from memnets.datadir import DataError
from memnets.tasks.imdb import VOCAB_SIZE, encode_bytes, iter_reviews, load_imdb


def test_encode_bytes():
    assert encode_bytes(b"Hi", 4).tolist() == [73, 106, 0, 0]
    assert encode_bytes(bytes([0, 255]), 2).tolist() == [1, 256]
    assert encode_bytes("é".encode(), 3).tolist() == [0xC3 + 1, 0xA9 + 1, 0]   # UTF-8 bytes, not characters
    assert encode_bytes(b"abcdef", 3).tolist() == [98, 99, 100]               # truncation
    assert VOCAB_SIZE == 257
    with pytest.raises(ValueError, match="max_len"):
        encode_bytes(b"a", 0)


def test_subset_reader_known_review(real_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path))
    d = load_imdb("train", max_len=64, data_dir=real_data_dir, limit=2)
    assert d.tokens.shape == (4, 64) and d.labels.tolist() == [0, 0, 1, 1]
    pos0 = int(((d.labels == 1) & (d.ids == 0)).nonzero()[0])               # train/pos/0_9.txt
    assert int(d.ratings[pos0]) == 9
    text = b"Bromwell High is a cartoon comedy."
    assert d.tokens[pos0, : len(text)].tolist() == [b + 1 for b in text]
    assert (d.ratings[d.labels == 0] <= 4).all() and (d.ratings[d.labels == 1] >= 7).all()


def test_missing_and_corrupt_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="aclImdb_v1_labeled.tar.gz"):
        load_imdb("train", data_dir=tmp_path, limit=1)
    (tmp_path / "imdb").mkdir()
    (tmp_path / "imdb" / "aclImdb_v1_labeled.tar.gz").write_bytes(b"not a gzip file")
    with pytest.raises(DataError, match="aclImdb_v1_labeled.tar.gz"):
        load_imdb("train", data_dir=tmp_path, limit=1)
    with pytest.raises(ValueError, match="split"):
        next(iter_reviews("valid", data_dir=tmp_path))


@pytest.mark.slow
def test_full_counts_and_cache(real_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path))
    for split in ("train", "test"):
        d = load_imdb(split, max_len=32, data_dir=real_data_dir)
        assert len(d) == 25_000 and int(d.labels.sum()) == 12_500
        again = load_imdb(split, max_len=32, data_dir=real_data_dir)          # from the cache
        assert torch.equal(again.tokens, d.tokens) and torch.equal(again.labels, d.labels)
    assert len(list((tmp_path / "imdb").glob("*.pt"))) == 2
