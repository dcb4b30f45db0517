"""Associative retrieval tasks (docs/maths.md §6; Schlag, Irie & Schmidhuber 2021, Sec. 4.1-4.2) and
multi-query associative recall (MQAR; Arora et al. 2023 "Zoology", used in DeltaNet papers).

Every generator is deterministic given its ``torch.Generator`` and returns a NamedTuple of
tensors. Key symbols are integers; values are vectors (``"random"``) or one-hot rows
(``"onehot"``, with their class ids in ``value_ids``).

* :func:`retrieval_batch` — setting 1 (capacity): ``S`` pairs, the keys are the ``S``
  symbols of a vocabulary of size ``S`` in random order (each key once), then every key is
  queried once (random order). Target = the value stored with it.
* :func:`edit_retrieval_batch` — setting 2 (editing): ``T ≥ S`` writes over the ``S``
  symbols, every key written at least once and some re-assigned new values; the target of a
  query is the LATEST value written to that key.
* :func:`mqar_batch` — token sequences ``k₁ v₁ k₂ v₂ … k_P v_P`` then zeros with the keys
  re-appearing later (power-law distances, as in Zoology); the label at a query position is
  the value token stored with that key, ``-100`` elsewhere.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .._checks import check_positive_int

__all__ = [
    "RetrievalBatch",
    "MQARBatch",
    "VALUE_KINDS",
    "retrieval_batch",
    "edit_retrieval_batch",
    "mqar_batch",
    "latest_write_index",
]

VALUE_KINDS = ("random", "onehot")


class RetrievalBatch(NamedTuple):
    """A batch of the key–value retrieval settings (B = batch, T = writes, Q = queries).

    keys: ``[B, T]`` long, symbols in ``[0, num_keys)``.
    values: ``[B, T, dv]`` float, the value written with each key.
    value_ids: ``[B, T]`` long, class of each value for ``"onehot"`` values (``-1`` for ``"random"``).
    queries: ``[B, Q]`` long, the queried symbols (``Q = num_keys``, each key once).
    targets: ``[B, Q, dv]`` float, the value to retrieve for each query.
    target_index: ``[B, Q]`` long, the write step ``t`` whose value is the target (the latest
        write of that key), used for nearest-candidate accuracy.
    """

    keys: torch.Tensor
    values: torch.Tensor
    value_ids: torch.Tensor
    queries: torch.Tensor
    targets: torch.Tensor
    target_index: torch.Tensor


class MQARBatch(NamedTuple):
    """A batch of multi-query associative recall: ``inputs [B, T]`` and ``labels [B, T]`` long.

    ``labels[b, t] = -100`` except at query positions, where it is the value token stored
    with the key ``inputs[b, t]``.
    """

    inputs: torch.Tensor
    labels: torch.Tensor


def _check_generator(generator: object) -> torch.Generator:
    if generator is None:
        g = torch.Generator()
        g.manual_seed(0)
        return g
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"`generator` expected a torch.Generator or None, got {type(generator).__name__}")
    return generator


def _values(shape: tuple[int, int], value_dim: int, value_kind: str, num_values: int | None,
            g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Values ``[B, T, dv]`` and their ids ``[B, T]`` (``-1`` for random vectors)."""
    if value_kind == "random":
        v = torch.randn(*shape, value_dim, generator=g) / value_dim ** 0.5  # E‖v‖² = 1
        return v, torch.full(shape, -1, dtype=torch.long)
    if value_kind == "onehot":
        n = value_dim if num_values is None else num_values
        if n > value_dim:
            raise ValueError(f"`num_values`={n} must be <= `value_dim`={value_dim} for one-hot values")
        ids = torch.randint(0, n, shape, generator=g)
        return F.one_hot(ids, value_dim).float(), ids
    raise ValueError(f"`value_kind` expected one of {VALUE_KINDS}, got {value_kind!r}")


def latest_write_index(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """For each query, the last write step holding that key: ``keys [B, T]``, ``queries [B, Q]``
    → ``[B, Q]`` long (``-1`` if the key was never written)."""
    T = keys.shape[1]
    match = keys.unsqueeze(1) == queries.unsqueeze(2)  # [B, Q, T]
    steps = torch.arange(T).expand_as(match)
    return torch.where(match, steps, torch.full_like(steps, -1)).max(dim=-1).values


def _batch(keys, values, value_ids, queries) -> RetrievalBatch:
    idx = latest_write_index(keys, queries)  # [B, Q]
    targets = torch.gather(values, 1, idx.unsqueeze(-1).expand(-1, -1, values.shape[-1]))  # [B, Q, dv]
    return RetrievalBatch(keys, values, value_ids, queries, targets, idx)


def retrieval_batch(batch_size: int, num_pairs: int, value_dim: int = 64, *, value_kind: str = "random",
                    num_values: int | None = None, generator: torch.Generator | None = None) -> RetrievalBatch:
    """Setting 1 of Schlag et al. (2021): store ``S = num_pairs`` pairs, query every key.

    Keys are a random permutation of the vocabulary ``{0..S-1}``; queries another permutation.
    Random values are ``N(0, 1/dv)`` vectors (expected squared norm 1); one-hot values pick a
    class in ``[0, num_values)`` (default ``dv``).

    Example::

        >>> g = torch.Generator().manual_seed(0)
        >>> b = retrieval_batch(2, 3, value_dim=4, value_kind="onehot", generator=g)
        >>> b.keys.shape, b.values.shape, b.queries.shape, b.targets.shape
        (torch.Size([2, 3]), torch.Size([2, 3, 4]), torch.Size([2, 3]), torch.Size([2, 3, 4]))
        >>> bool((b.keys[0, b.target_index[0]] == b.queries[0]).all())   # each target is its key's value
        True
    """
    B = check_positive_int("batch_size", batch_size)
    S = check_positive_int("num_pairs", num_pairs)
    check_positive_int("value_dim", value_dim)
    g = _check_generator(generator)
    keys = torch.stack([torch.randperm(S, generator=g) for _ in range(B)])  # [B, S]
    values, ids = _values((B, S), value_dim, value_kind, num_values, g)
    queries = torch.stack([torch.randperm(S, generator=g) for _ in range(B)])  # [B, S]
    return _batch(keys, values, ids, queries)


def edit_retrieval_batch(batch_size: int, num_keys: int, num_writes: int | None = None, value_dim: int = 64, *,
                         value_kind: str = "random", num_values: int | None = None,
                         generator: torch.Generator | None = None) -> RetrievalBatch:
    """Setting 2 of Schlag et al. (2021): keys are re-assigned new values; the latest wins.

    ``num_writes`` (default ``2·num_keys``) writes: every one of the ``num_keys`` symbols once
    plus ``num_writes − num_keys`` extra writes of random symbols, in a random order, each
    with a fresh value. Then every key is queried once; its target is the value of its last
    write.

    Example::

        >>> g = torch.Generator().manual_seed(0)
        >>> b = edit_retrieval_batch(1, 2, 4, value_dim=3, generator=g)
        >>> b.keys.shape, b.queries.shape
        (torch.Size([1, 4]), torch.Size([1, 2]))
        >>> t = int(b.target_index[0, 0]); int(b.keys[0, t]) == int(b.queries[0, 0])
        True
        >>> bool((b.keys[0, t + 1:] != b.queries[0, 0]).all())    # no later write of that key
        True
    """
    B = check_positive_int("batch_size", batch_size)
    S = check_positive_int("num_keys", num_keys)
    T = 2 * S if num_writes is None else check_positive_int("num_writes", num_writes)
    if T < S:
        raise ValueError(f"`num_writes`={T} must be >= `num_keys`={S} (every key is written)")
    check_positive_int("value_dim", value_dim)
    g = _check_generator(generator)
    rows = []
    for _ in range(B):
        extra = torch.randint(0, S, (T - S,), generator=g)
        seq = torch.cat([torch.arange(S), extra])  # [T]
        rows.append(seq[torch.randperm(T, generator=g)])
    keys = torch.stack(rows)  # [B, T]
    values, ids = _values((B, T), value_dim, value_kind, num_values, g)
    queries = torch.stack([torch.randperm(S, generator=g) for _ in range(B)])  # [B, S]
    return _batch(keys, values, ids, queries)


def mqar_batch(batch_size: int, seq_len: int = 512, num_pairs: int = 64, vocab_size: int = 8192, *,
               power_a: float = 0.01, generator: torch.Generator | None = None) -> MQARBatch:
    """Multi-query associative recall (Zoology's MQAR), re-derived.

    Token 0 is filler. Keys are distinct tokens from ``[1, V/2)``, values tokens from
    ``[V/2, V)``. Positions ``0..2P-1`` hold ``k₁ v₁ … k_P v_P``; the remaining ``T − 2P``
    positions hold zeros except every key once more, at even offsets ``2·gap`` of the query
    region, with gaps drawn without replacement from a power law ``p(gap) ∝ gap^(a−1)``
    (many queries soon after the context). ``labels`` is the stored value at each query
    position, ``-100`` elsewhere (a next-token target for ``inputs``).

    Example::

        >>> g = torch.Generator().manual_seed(0)
        >>> b = mqar_batch(1, seq_len=16, num_pairs=2, vocab_size=16, generator=g)
        >>> b.inputs.shape, int((b.labels != -100).sum())
        (torch.Size([1, 16]), 2)
        >>> t = int((b.labels[0] != -100).nonzero()[0]); k = int(b.inputs[0, t])
        >>> int(b.inputs[0, (b.inputs[0, :4] == k).nonzero()[0] + 1]) == int(b.labels[0, t])
        True
    """
    B = check_positive_int("batch_size", batch_size)
    T = check_positive_int("seq_len", seq_len)
    P = check_positive_int("num_pairs", num_pairs)
    V = check_positive_int("vocab_size", vocab_size, minimum=4)
    if V // 2 - 1 < P:
        raise ValueError(f"`vocab_size`={V} too small for `num_pairs`={P} distinct keys (need V/2 - 1 >= P)")
    space = (T - 2 * P) // 2
    if space < P:
        raise ValueError(f"`seq_len`={T} too short: need seq_len >= 4 * num_pairs = {4 * P}")
    g = _check_generator(generator)
    gap_p = power_a * torch.arange(1, space + 1, dtype=torch.float64) ** (power_a - 1)  # [space]
    inputs = torch.zeros(B, T, dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    for b in range(B):
        keys = torch.randperm(V // 2 - 1, generator=g)[:P] + 1  # [P] in [1, V/2)
        values = torch.randint(V // 2, V, (P,), generator=g)  # [P]
        inputs[b, 0:2 * P:2], inputs[b, 1:2 * P:2] = keys, values
        gaps = torch.multinomial(gap_p, P, replacement=False, generator=g)  # [P] in [0, space)
        pos = 2 * P + 2 * gaps
        inputs[b, pos] = keys
        labels[b, pos] = values
    return MQARBatch(inputs, labels)
