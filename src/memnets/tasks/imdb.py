"""Byte-level IMDB reviews: the Long Range Arena "Text" task (SPEC §11; data README §3).

Reads ``imdb/aclImdb_v1_labeled.tar.gz`` from the data directory with :mod:`tarfile` (nothing
is unpacked). Each review's UTF-8 bytes become ids ``byte + 1`` (``1..256``), ``0`` is padding;
reviews are truncated or right-padded to ``max_len`` (1000 in the released LRA base config,
4000 in the LRA paper). Label: ``pos`` = 1, ``neg`` = 0. Splits ``train`` and ``test``
(25,000 each; the test split doubles as validation in LRA). Rows are ordered by label
(neg, then pos), then by review id.

The encoded tensors are cached under ``memnets.datadir.cache_dir() / "imdb"`` (keyed by the
archive's size and modification time and ``max_len``), written atomically, so later loads
skip the archive.

Example::

    data = load_imdb("train", max_len=1000)        # ImdbData, tokens [25000, 1000] int64
    encode_bytes(b"Hi", 4)                          # tensor([73, 106, 0, 0])
"""
from __future__ import annotations

import os
import re
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from ..datadir import DataError, cache_dir, data_file, verify_file

__all__ = ["ARCHIVE", "VOCAB_SIZE", "SPLITS", "ImdbData", "encode_bytes", "iter_reviews", "load_imdb"]

ARCHIVE = "imdb/aclImdb_v1_labeled.tar.gz"
VOCAB_SIZE = 257          # 0 = padding, 1..256 = byte + 1
SPLITS = ("train", "test")
_NAME = re.compile(r"^aclImdb/(train|test)/(pos|neg)/(\d+)_(\d+)\.txt$")


@dataclass
class ImdbData:
    """``tokens [N, max_len]`` int64 (0 = padding), ``lengths [N]`` (bytes kept, ≤ max_len),
    ``labels [N]`` (pos 1 / neg 0), ``ids [N]`` review ids, ``ratings [N]`` (1–4 neg, 7–10 pos)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    labels: torch.Tensor
    ids: torch.Tensor
    ratings: torch.Tensor

    def __len__(self) -> int:
        return self.labels.shape[0]


def encode_bytes(data: bytes, max_len: int) -> torch.Tensor:
    """``[max_len]`` int64 ids: ``byte + 1`` for the first ``max_len`` bytes, then zeros."""
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"`max_len` expected a positive int, got {max_len!r}")
    out = torch.zeros(max_len, dtype=torch.long)
    chunk = data[:max_len]
    if chunk:
        out[: len(chunk)] = torch.frombuffer(bytearray(chunk), dtype=torch.uint8).long() + 1
    return out


def _archive(data_dir) -> Path:
    path = data_file(ARCHIVE, data_dir)
    verify_file(path, data_dir)
    return path


def iter_reviews(split: str, data_dir=None, limit: int | None = None) -> Iterator[tuple[int, int, int, bytes]]:
    """Yield ``(label, review_id, rating, raw_bytes)`` for the reviews of ``split`` in archive
    order; with ``limit``, at most that many per label, stopping once both labels have them."""
    if split not in SPLITS:
        raise ValueError(f"`split` expected one of {SPLITS}, got {split!r}")
    path = _archive(data_dir)
    counts = {0: 0, 1: 0}
    try:
        with tarfile.open(path, "r:gz") as tf:
            for m in tf:
                hit = _NAME.match(m.name)
                if not m.isfile() or hit is None or hit.group(1) != split:
                    continue
                label = int(hit.group(2) == "pos")
                if limit is not None and counts[label] >= limit:
                    if all(c >= limit for c in counts.values()):
                        break
                    continue
                f = tf.extractfile(m)
                counts[label] += 1
                yield label, int(hit.group(3)), int(hit.group(4)), f.read()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"dataset archive {str(path)!r} could not be read: {e}") from e


def _encode(rows: list[tuple[int, int, int, bytes]], max_len: int) -> ImdbData:
    rows.sort(key=lambda r: (r[0], r[1]))
    n = len(rows)
    tokens = torch.zeros(n, max_len, dtype=torch.long)
    lengths = torch.zeros(n, dtype=torch.long)
    for i, (_, _, _, raw) in enumerate(rows):
        tokens[i] = encode_bytes(raw, max_len)
        lengths[i] = min(len(raw), max_len)
    return ImdbData(tokens, lengths, torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]),
                    torch.tensor([r[2] for r in rows]))


def load_imdb(split: str, max_len: int = 1000, data_dir=None, limit: int | None = None,
              cache: bool = True) -> ImdbData:
    """The encoded ``split`` (``"train"``/``"test"``), truncated/padded to ``max_len`` bytes.

    ``limit`` reads at most that many reviews per label (a fast subset; never cached).
    Raises FileNotFoundError / :class:`memnets.datadir.DataError` naming the archive when it
    is missing, corrupt or unreadable.
    """
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"`max_len` expected a positive int, got {max_len!r}")
    if limit is not None:
        return _encode(list(iter_reviews(split, data_dir, limit)), max_len)
    path = _archive(data_dir)
    st = path.stat()
    cfile = cache_dir() / "imdb" / f"{split}_L{max_len}_{st.st_size}_{st.st_mtime_ns}.pt"
    if cache and cfile.is_file():
        try:
            d = torch.load(cfile, weights_only=True)
            return ImdbData(d["tokens"].long(), d["lengths"], d["labels"], d["ids"], d["ratings"])
        except Exception:                                            # a damaged cache is rebuilt
            pass
    data = _encode(list(iter_reviews(split, data_dir)), max_len)
    if cache:
        try:
            cfile.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cfile.parent, suffix=".tmp")
            os.close(fd)
            torch.save({"tokens": data.tokens.to(torch.int16), "lengths": data.lengths, "labels": data.labels,
                        "ids": data.ids, "ratings": data.ratings}, tmp)
            os.replace(tmp, cfile)
        except OSError:
            pass                                                      # read-only cache: re-read next time
    return data
