"""Long Range Arena ListOps, generated with the LRA rules (docs/maths.md §11; data README §4).

A tree is either a digit ``0..9`` (a leaf) or a node ``(op, [child, ...])`` with ``op`` one of
``"[MIN" "[MAX" "[MED" "[SM"``. Its value is the minimum, maximum, ``int(numpy.median)`` (even
count: mean of the two middle values, truncated) or the sum modulo 10 of its children's
values, so the label is one of 10 classes.

The sampler (:func:`sample_tree`) follows the LRA generator: at ``depth < max_depth`` draw
``r ~ U[0, 1)``, else ``r = 1``; if ``r > value_p`` (0.25) the tree is a uniform digit, else a
node with ``k ~ U{2..max_args}`` children sampled at ``depth + 1`` and a uniform operator.
The length counts operators, digits and closing brackets. :func:`make_listops` keeps distinct
trees with ``min_len < length < max_len`` (strict) and returns padded token ids.

Text form (the LRA TSV): a node with arguments ``a1 .. ak`` prints as the left-nested chain
``( ( ( op a1 ) a2 ) .. ak ) ] )``. Model input: delete the parentheses, write ``]`` as ``X``,
split on whitespace. Vocabulary: ``0`` padding, digits ``1..10``, operators ``11..14``, ``X`` 15.

Worked example::

    >>> tree = ("[MAX", [2, ("[MED", [3, 8, 1, 6]), 9])
    >>> evaluate(tree)                       # MED(3, 8, 1, 6) = int(4.5) = 4; MAX(2, 4, 9) = 9
    9
    >>> to_text(("[MAX", [2, 9]))
    '( ( ( [MAX 2 ) 9 ) ] )'
    >>> tokens(tree)
    ['[MAX', '2', '[MED', '3', '8', '1', '6', 'X', '9', 'X']
    >>> encode(tokens(tree))
    [12, 3, 13, 4, 9, 2, 7, 15, 10, 15]
"""
from __future__ import annotations

import csv
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np
import torch

__all__ = [
    "OPERATORS", "VOCAB", "PAD", "VOCAB_SIZE", "NUM_CLASSES", "ListOpsData",
    "sample_tree", "tree_length", "evaluate", "tokens", "encode", "to_text", "from_text",
    "generate_trees", "make_listops", "cached_listops", "split_listops", "write_tsv", "read_tsv",
]

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
#: token string -> id; 0 is padding.
VOCAB = {**{str(d): d + 1 for d in range(10)}, **{op: 11 + i for i, op in enumerate(OPERATORS)}, "X": 15}
PAD = 0
VOCAB_SIZE = 16
NUM_CLASSES = 10
_ID2TOK = {i: t for t, i in VOCAB.items()}

Tree = Union[int, tuple]


def sample_tree(rng: random.Random, depth: int = 1, max_depth: int = 10, max_args: int = 10,
                value_p: float = 0.25) -> tuple[Tree, int]:
    """One LRA ListOps tree and its length (operators + digits + closing brackets)."""
    r = rng.random() if depth < max_depth else 1.0
    if r > value_p:
        return rng.randint(0, 9), 1
    k = rng.randint(2, max_args)
    children, length = [], 2
    for _ in range(k):
        child, n = sample_tree(rng, depth + 1, max_depth, max_args, value_p)
        children.append(child)
        length += n
    return (OPERATORS[rng.randrange(len(OPERATORS))], children), length


def tree_length(tree: Tree) -> int:
    """Tokens of the model input: 1 per digit, 2 per operator node (the operator and ``X``)."""
    if isinstance(tree, int):
        return 1
    return 2 + sum(tree_length(c) for c in tree[1])


def evaluate(tree: Tree) -> int:
    """The value of ``tree`` in ``0..9``: MIN, MAX, ``int(numpy.median)``, or sum mod 10."""
    if isinstance(tree, int):
        return tree
    op, children = tree
    args = [evaluate(c) for c in children]
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        return int(np.median(args))
    if op == "[SM":
        return sum(args) % 10
    raise ValueError(f"`tree` has unknown operator {op!r}; expected one of {OPERATORS}")


def tokens(tree: Tree) -> list[str]:
    """Model-input token strings of ``tree`` (``]`` written as ``X``, no parentheses)."""
    if isinstance(tree, int):
        return [str(tree)]
    out = [tree[0]]
    for c in tree[1]:
        out.extend(tokens(c))
    out.append("X")
    return out


def encode(toks: list[str]) -> list[int]:
    """Token strings -> ids (``0`` is padding, never produced)."""
    try:
        return [VOCAB[t] for t in toks]
    except KeyError as e:
        raise ValueError(f"`toks` contains unknown token {e.args[0]!r}; expected one of {list(VOCAB)}") from None


def to_text(tree: Tree) -> str:
    """The LRA text form: ``( ( ( [MAX 2 ) 9 ) ] )`` for ``[MAX 2 9 ]``."""
    if isinstance(tree, int):
        return str(tree)
    s = tree[0]
    for c in tree[1]:
        s = f"( {s} {to_text(c)} )"
    return f"( {s} ] )"


def _parse(toks: list[str], i: int) -> tuple[Tree, int]:
    t = toks[i]
    if t in OPERATORS:
        children, i = [], i + 1
        while i < len(toks) and toks[i] != "X":
            child, i = _parse(toks, i)
            children.append(child)
        if i >= len(toks):
            raise ValueError("`text` has an operator without its closing bracket")
        return (t, children), i + 1
    if t.isdigit() and len(t) == 1:
        return int(t), i + 1
    raise ValueError(f"`text` contains unexpected token {t!r}")


def from_text(text: str) -> Tree:
    """Inverse of :func:`to_text` (parentheses dropped, ``]`` read as ``X``, as LRA does)."""
    toks = text.replace("(", " ").replace(")", " ").replace("]", "X").split()
    if not toks:
        raise ValueError("`text` is empty")
    tree, i = _parse(toks, 0)
    if i != len(toks):
        raise ValueError(f"`text` has {len(toks) - i} trailing tokens after a complete tree")
    return tree


def generate_trees(n: int, seed: int, min_len: int = 500, max_len: int = 2000, max_depth: int = 10,
                   max_args: int = 10, value_p: float = 0.25, max_tries: int | None = None) -> list[Tree]:
    """``n`` distinct trees with ``min_len < length < max_len`` from ``random.Random(seed)``."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"`n` expected a non-negative int, got {n!r}")
    if not (0 <= min_len < max_len - 1):
        raise ValueError(f"`min_len`, `max_len` expected 0 <= min_len < max_len - 1, got {min_len}, {max_len}")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[Tree] = []
    tries, limit = 0, max_tries if max_tries is not None else 10_000 * max(n, 1)
    while len(out) < n:
        tries += 1
        if tries > limit:
            raise RuntimeError(f"only {len(out)} of {n} trees with {min_len} < length < {max_len} "
                               f"after {limit} samples")
        tree, length = sample_tree(rng, 1, max_depth, max_args, value_p)
        if not (min_len < length < max_len):
            continue
        key = to_text(tree)
        if key in seen:
            continue
        seen.add(key)
        out.append(tree)
    return out


@dataclass
class ListOpsData:
    """Encoded ListOps: ``tokens [N, pad_to]`` int64 (0 = padding, right-padded),
    ``lengths [N]`` int64, ``labels [N]`` int64 in ``0..9``."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.labels.shape[0]

    def subset(self, idx) -> "ListOpsData":
        return ListOpsData(self.tokens[idx], self.lengths[idx], self.labels[idx])


def _encode_trees(trees: list[Tree], pad_to: int) -> ListOpsData:
    toks = torch.zeros(len(trees), pad_to, dtype=torch.long)
    lengths = torch.zeros(len(trees), dtype=torch.long)
    labels = torch.zeros(len(trees), dtype=torch.long)
    for i, t in enumerate(trees):
        ids = encode(tokens(t))[:pad_to]                              # LRA truncates to the model length
        toks[i, : len(ids)] = torch.tensor(ids)
        lengths[i] = len(ids)
        labels[i] = evaluate(t)
    return ListOpsData(toks, lengths, labels)


def make_listops(n: int, seed: int, min_len: int = 500, max_len: int = 2000, pad_to: int | None = None,
                 **sampler) -> ListOpsData:
    """``n`` distinct seeded trees with ``min_len < length < max_len``, encoded and padded to
    ``pad_to`` (default ``max_len``) positions. ``sampler`` goes to :func:`generate_trees`."""
    trees = generate_trees(n, seed, min_len, max_len, **sampler)
    return _encode_trees(trees, pad_to if pad_to is not None else max_len)


def cached_listops(n: int, seed: int, min_len: int = 500, max_len: int = 2000,
                   cache_dir: str | os.PathLike | None = None, use_cache: bool = True) -> ListOpsData:
    """:func:`make_listops` with its result cached on disk (generation is rejection sampling:
    about 20 trees per second at ``max_len`` 2000, so 96,000 take over an hour on one core).

    The file is ``<cache_dir>/listops_s<seed>_<min_len>-<max_len>_n<n>.pt`` (default
    ``cache_dir``: ``<memnets cache>/listops``, see :func:`memnets.datadir.cache_dir`), tokens
    stored as uint8; it is written atomically, and a damaged file is regenerated. A cached set
    of more trees than asked for with the same seed and lengths serves as well (the first ``n``
    trees are the same stream).
    """
    from ..datadir import cache_dir as _cache_root

    root = Path(cache_dir) if cache_dir is not None else _cache_root() / "listops"
    stem = f"listops_s{seed}_{min_len}-{max_len}_n"
    if use_cache and root.is_dir():
        sizes = sorted(int(p.name[len(stem):-3]) for p in root.glob(stem + "*.pt") if p.name[len(stem):-3].isdigit())
        for size in [s for s in sizes if s >= n]:
            try:
                d = torch.load(root / f"{stem}{size}.pt", weights_only=True)
                data = ListOpsData(d["tokens"].long(), d["lengths"], d["labels"])
                if data.tokens.shape[1] == max_len and len(data) == size:
                    return data.subset(slice(0, n))
            except Exception:  # a damaged cache file is ignored (and rewritten below)
                pass
    data = make_listops(n, seed, min_len, max_len)
    if use_cache:
        from ..train.checkpoint import atomic_save

        blob = {"tokens": data.tokens.to(torch.uint8), "lengths": data.lengths, "labels": data.labels}
        atomic_save(root / f"{stem}{n}.pt", lambda tmp: torch.save(blob, tmp))
    return data


def split_listops(data, counts: tuple[int, int, int] = (96_000, 2_000, 2_000)) -> dict:
    """Split a set (or list) in iteration order into ``train``/``val``/``test`` of ``counts``
    (LRA: 96,000 / 2,000 / 2,000 of 100,000)."""
    if len(counts) != 3 or any(c < 0 for c in counts):
        raise ValueError(f"`counts` expected three non-negative ints, got {counts!r}")
    if sum(counts) > len(data):
        raise ValueError(f"`counts` sum to {sum(counts)} but `data` has only {len(data)} items")
    a, b = counts[0], counts[0] + counts[1]
    pick = (lambda s: data.subset(slice(*s))) if isinstance(data, ListOpsData) else (lambda s: data[slice(*s)])
    return {"train": pick((0, a)), "val": pick((a, b)), "test": pick((b, b + counts[2]))}


def write_tsv(path: str | os.PathLike, trees: list[Tree]) -> None:
    """Write the LRA TSV (header ``Source\\tTarget``), atomically."""
    import io

    from ..train.checkpoint import atomic_write_text

    buf = io.StringIO(newline="")
    w = csv.writer(buf, delimiter="\t", lineterminator="\n")
    w.writerow(["Source", "Target"])
    for t in trees:
        w.writerow([to_text(t), evaluate(t)])
    atomic_write_text(path, buf.getvalue())


def read_tsv(path: str | os.PathLike) -> tuple[list[Tree], list[int]]:
    """Read an LRA ListOps TSV: the trees and the ``Target`` labels as written."""
    with open(path, newline="") as f:
        r = csv.reader(f, delimiter="\t")
        header = next(r, None)
        if header != ["Source", "Target"]:
            raise ValueError(f"`path` {str(path)!r}: expected header ['Source', 'Target'], got {header!r}")
        trees, labels = [], []
        for row in r:
            trees.append(from_text(row[0]))
            labels.append(int(row[1]))
    return trees, labels
