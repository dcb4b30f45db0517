"""Byte-level IMDB reviews: the Long Range Arena "Text" task (docs/maths.md §11).

Reads the labelled reviews ``aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt`` from the first
of these found in the data directory (:data:`SOURCES`): the official archive
``imdb/aclImdb_v1.tar.gz`` (what ``memnets data download imdb --to <data>`` fetches), the
repacked ``imdb/aclImdb_v1_labeled.tar.gz`` (labelled part only, same member names), or the
unpacked folder ``imdb/aclImdb/``. Archives are read with :mod:`tarfile` (nothing is
unpacked). Each review's UTF-8 bytes become ids ``byte + 1`` (``1..256``), ``0`` is padding;
reviews are truncated or right-padded to ``max_len`` (1000 in the released LRA base config,
4000 in the LRA paper). Label: ``pos`` = 1, ``neg`` = 0. Splits ``train`` and ``test``
(25,000 each; the test split doubles as validation in LRA). Rows are ordered by label
(neg, then pos), then by review id.

The encoded tensors are cached under ``memnets.datadir.cache_dir() / "imdb"`` (keyed by the
archive's size and modification time, or the folder's path and modification times, and
``max_len``), written atomically, so later loads skip the archive.

Example::

    data = load_imdb("train", max_len=1000)        # ImdbData, tokens [25000, 1000] int64
    encode_bytes(b"Hi", 4)                          # tensor([73, 106, 0, 0])
"""
from __future__ import annotations

import hashlib
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from ..data_download import IMDB_ARCHIVE, IMDB_FOLDER, IMDB_REPACK, missing_message
from ..datadir import DataError, cache_dir, resolve_data_dir, verify_file

__all__ = ["ARCHIVE", "OFFICIAL_ARCHIVE", "FOLDER", "SOURCES", "VOCAB_SIZE", "SPLITS", "ImdbData", "encode_bytes",
           "iter_reviews", "load_imdb"]

ARCHIVE = IMDB_REPACK                # "imdb/aclImdb_v1_labeled.tar.gz": the labelled part, repacked
OFFICIAL_ARCHIVE = IMDB_ARCHIVE      # "imdb/aclImdb_v1.tar.gz": the official archive
FOLDER = IMDB_FOLDER                 # "imdb/aclImdb": either archive, unpacked
SOURCES = (OFFICIAL_ARCHIVE, ARCHIVE, FOLDER)  # in the order they are looked for
VOCAB_SIZE = 257          # 0 = padding, 1..256 = byte + 1
SPLITS = ("train", "test")
_NAME = re.compile(r"^aclImdb/(train|test)/(pos|neg)/(\d+)_(\d+)\.txt$")
_FILE = re.compile(r"^(\d+)_(\d+)\.txt$")


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
    """The first of :data:`SOURCES` present (an archive checked against SHA256SUMS, or the folder)."""
    root = resolve_data_dir(data_dir)
    for rel in SOURCES:
        path = root / rel
        if rel == FOLDER:
            if path.is_dir():
                return path
        elif path.is_file():
            verify_file(path, root)
            return path
    raise FileNotFoundError(missing_message(
        "imdb", f"IMDB reviews not found in the data directory {str(root)!r}: expected {OFFICIAL_ARCHIVE} "
        f"(the official archive), {ARCHIVE}, or the unpacked folder {FOLDER}/", root))


def _iter_folder(path: Path, split: str, limit: int | None) -> Iterator[tuple[int, int, int, bytes]]:
    for label, sub in ((0, "neg"), (1, "pos")):
        d = path / split / sub
        if not d.is_dir():
            raise DataError(missing_message(
                "imdb", f"IMDB folder {str(path)!r} has no {split}/{sub}/ folder", path.parents[1]))
        files = sorted((int(m.group(1)), int(m.group(2)), f) for f in d.iterdir() if (m := _FILE.match(f.name)))
        for review_id, rating, f in files[:limit]:
            try:
                data = f.read_bytes()
            except OSError as e:
                raise DataError(f"review file {str(f)!r} could not be read: {e}") from e
            yield label, review_id, rating, data


def iter_reviews(split: str, data_dir=None, limit: int | None = None) -> Iterator[tuple[int, int, int, bytes]]:
    """Yield ``(label, review_id, rating, raw_bytes)`` for the reviews of ``split`` in archive
    order; with ``limit``, at most that many per label, stopping once both labels have them."""
    if split not in SPLITS:
        raise ValueError(f"`split` expected one of {SPLITS}, got {split!r}")
    path = _archive(data_dir)
    if path.is_dir():
        yield from _iter_folder(path, split, limit)
        return
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
    is missing (with the ``memnets data download imdb`` command that fetches it), corrupt or
    unreadable.
    """
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"`max_len` expected a positive int, got {max_len!r}")
    if limit is not None:
        return _encode(list(iter_reviews(split, data_dir, limit)), max_len)
    path = _archive(data_dir)
    if path.is_dir():  # the folder's path and its label folders' modification times
        stamp = [str(path.resolve())] + [str((path / split / s).stat().st_mtime_ns)
                                         for s in ("neg", "pos") if (path / split / s).is_dir()]
        key = "dir" + hashlib.sha1("\n".join(stamp).encode()).hexdigest()[:16]
    else:
        st = path.stat()
        key = f"{st.st_size}_{st.st_mtime_ns}"
    cfile = cache_dir() / "imdb" / f"{split}_L{max_len}_{key}.pt"
    if cache and cfile.is_file():
        try:
            d = torch.load(cfile, weights_only=True)
            return ImdbData(d["tokens"].long(), d["lengths"], d["labels"], d["ids"], d["ratings"])
        except Exception:                                            # a damaged cache is rebuilt
            pass
    data = _encode(list(iter_reviews(split, data_dir)), max_len)
    if cache:
        try:
            from ..train.checkpoint import atomic_save

            blob = {"tokens": data.tokens.to(torch.int16), "lengths": data.lengths, "labels": data.labels,
                    "ids": data.ids, "ratings": data.ratings}
            atomic_save(cfile, lambda tmp: torch.save(blob, tmp))
        except OSError:
            pass                                                      # read-only cache: re-read next time
    return data
