"""Memory adapters for the capacity lab: every memory behind one interface, same widths.

Each adapter maps per-step inputs ``x [B, T, F]`` to read-outs of width ``dv`` and has two
entry points:

* ``write_read(x [B, T, F], xq [B, Q, F]) -> [B, Q, dv]``: write the whole sequence, then
  read every query against the final memory (queries do not write for the attention and
  fast-weight memories; recurrent memories read them as extra steps after the writes).
* ``causal(x [B, T, F]) -> [B, T, dv]``: read at every step after that step's write
  (token models, MQAR).

The attention and fast-weight adapters mix their values linearly, so they also give the
``T × T`` map of that causal read (``implied_attention(x) -> A [B, H, T, T]`` with
``causal(x) == o(Σ_s A[:, :, t, s] v_s)``, docs/maths.md §5, §6), the ``Q × T`` map of the
queries' reads after all writes (``implied_read(x, xq) -> A [B, H, Q, T]`` with
``write_read(x, xq) == o(Σ_s A[:, :, q, s] v_s)``) and their write gates over time
(``write_gates(x) -> {name: [B, T, H]}``): what ``memnets viz`` draws for a capacity run.

All adapters project with the same key width ``d_key`` (the fast-weight feature size is
then ``d_key`` for elu+1 and ``2·d_key·ν`` for DPFP-ν, as in Schlag et al. 2021, Sec. 4.1).
See :data:`MEMORIES` for the names, and :func:`build_adapter`.
"""
from __future__ import annotations

import importlib
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.delta import fast_weight_scan
from ..memories.fast_weights import FastWeightMemory
from ..ops import nam_scan, unit

__all__ = ["MEMORIES", "DEFAULT_MEMORIES", "RECURRENT", "build_adapter", "unavailable_reason",
           "SoftmaxAdapter", "FastWeightAdapter", "NAMAdapter", "RecurrentAdapter"]


class SoftmaxAdapter(nn.Module):
    """Softmax attention over the written pairs (docs/maths.md §5 baseline): ``softmax(q Kᵀ/√d) V``."""

    def __init__(self, in_size: int, d_key: int, d_value: int):
        super().__init__()
        self.q = nn.Linear(in_size, d_key, bias=False)
        self.k = nn.Linear(in_size, d_key, bias=False)
        self.v = nn.Linear(in_size, d_value, bias=False)
        self.o = nn.Linear(d_value, d_value)

    def write_read(self, x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
        """``x [B, T, F]`` written, ``xq [B, Q, F]`` read → ``[B, Q, dv]``."""
        y = F.scaled_dot_product_attention(self.q(xq), self.k(x), self.v(x))  # [B, Q, dv]
        return self.o(y)

    def causal(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, F]`` → ``[B, T, dv]``, step t attends to steps ≤ t."""
        y = F.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x), is_causal=True)  # [B, T, dv]
        return self.o(y)

    def implied_attention(self, x: torch.Tensor) -> torch.Tensor:
        """``A [B, 1, T, T]`` of :meth:`causal`: ``softmax(q Kᵀ/√d)`` over the steps ≤ t."""
        q, k = self.q(x), self.k(x)
        T = x.shape[1]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [B, T, T]
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)[:, None]

    def implied_read(self, x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
        """``A [B, 1, Q, T]`` of :meth:`write_read`: ``softmax(q Kᵀ/√d)`` over every written step."""
        q, k = self.q(xq), self.k(x)
        return torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]), -1)[:, None]

    def write_gates(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Softmax attention writes every step alike: no gates."""
        return {}

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """The values ``[B, T, 1, dv]`` that :meth:`implied_attention` mixes."""
        return self.v(x)[:, :, None]


class FastWeightAdapter(nn.Module):
    """Fast-weight programmer (docs/maths.md §6) through :class:`~memnets.memories.FastWeightMemory`:
    sum rule (linear attention when ``feature_map="elu"``; DPFP-ν) or delta rule."""

    def __init__(self, in_size: int, d_key: int, d_value: int, update_rule: str, feature_map: str):
        super().__init__()
        self.mem = FastWeightMemory(in_size, num_heads=1, key_size=d_key, value_size=d_value,
                                    output_size=d_value, update_rule=update_rule, feature_map=feature_map)

    def write_read(self, x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
        _, state = self.mem(x)
        return self.mem.read(xq, state)

    def causal(self, x: torch.Tensor) -> torch.Tensor:
        return self.mem(x)[0]

    def implied_attention(self, x: torch.Tensor) -> torch.Tensor:
        """``A [B, H, T, T]`` of :meth:`causal`: the fast weights are linear in the values, so the
        memory's own scan run with one-hot values ``v_s = e_s`` reads row ``t`` of ``A`` at step ``t``."""
        q, k, _, beta = self.mem._heads(x)
        return _one_hot_reads(x, q, lambda vals: fast_weight_scan(
            q, k, vals, beta, feature_map=self.mem.feature_map, update_rule=self.mem.update_rule,
            impl="reference")[0])

    def implied_read(self, x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
        """``A [B, H, Q, T]`` of :meth:`write_read`: the fast weights written with one-hot values
        ``v_s = e_s``, read by the queries."""
        q, k, _, beta = self.mem._heads(x)
        W = _one_hot_state(x, q, lambda vals: fast_weight_scan(
            q, k, vals, beta, feature_map=self.mem.feature_map, update_rule=self.mem.update_rule,
            impl="reference")[1])  # [B, H, T, dφ]
        fq = self.mem.phi(self.mem._heads(xq)[0])  # [B, Q, H, dφ]
        return torch.einsum("bhsf,bqhf->bhqs", W, fq)

    def write_gates(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The delta rule's write strength ``β [B, T, H]``; the sum rule has none."""
        beta = self.mem._heads(x)[3]
        return {} if beta is None else {"write strength β": beta}

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """The values ``[B, T, H, dv]`` that :meth:`implied_attention` mixes."""
        return self.mem._heads(x)[2]


def _one_hots(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The one-hot values ``v_s = e_s``, ``[B, T, H, T]``."""
    B, T, H = q.shape[:3]
    return torch.eye(T, dtype=x.dtype, device=x.device)[None, :, None, :].expand(B, T, H, T)


def _one_hot_reads(x: torch.Tensor, q: torch.Tensor, scan: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``A [B, H, T, T]``: ``scan(v)`` (a read ``[B, T, H, T]`` linear in the values) run on the
    one-hot values."""
    return scan(_one_hots(x, q)).transpose(1, 2)


def _one_hot_state(x: torch.Tensor, q: torch.Tensor, scan: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The final memory ``[B, H, T, dk]`` that ``scan(v)`` (linear in the values) writes from the
    one-hot values: row ``s`` of head ``h`` is what step ``s`` left in it."""
    return scan(_one_hots(x, q))


class NAMAdapter(nn.Module):
    """NAM memory (docs/maths.md §1): unit keys/queries, ``WR(M, μ(k), v, p_w, p_e)``, ``RD(M, μ(q), 1)``.

    ``separate_erase=False``: ``p_e = p_w = σ(W_w x)`` (the delta rule on unit keys);
    ``True``: an independent erase gate ``p_e = σ(W_e x)``.
    """

    def __init__(self, in_size: int, d_key: int, d_value: int, separate_erase: bool = False):
        super().__init__()
        self.q = nn.Linear(in_size, d_key, bias=False)
        self.k = nn.Linear(in_size, d_key, bias=False)
        self.v = nn.Linear(in_size, d_value, bias=False)
        self.p_w = nn.Linear(in_size, 1)
        self.p_e = nn.Linear(in_size, 1) if separate_erase else None
        self.o = nn.Linear(d_value, d_value)

    def _scan(self, x: torch.Tensor, q: torch.Tensor):
        k = unit(self.k(x)).unsqueeze(2)  # [B, T, 1, dk]
        p_w, p_e = self._gates(x)  # [B, T, 1] each
        return nam_scan(q, k, self.values(x), p_w, p_e, None)

    def write_read(self, x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
        _, M = self._scan(x, unit(self.q(x)).unsqueeze(2))  # M [B, 1, dv, dk]
        y = torch.einsum("bvk,bqk->bqv", M[:, 0], unit(self.q(xq)))  # [B, Q, dv]
        return self.o(y)

    def causal(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self._scan(x, unit(self.q(x)).unsqueeze(2))  # y [B, T, 1, dv]
        return self.o(y[:, :, 0])

    def _gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p_w = torch.sigmoid(self.p_w(x))  # [B, T, 1]
        return p_w, (torch.sigmoid(self.p_e(x)) if self.p_e is not None else p_w)

    def implied_attention(self, x: torch.Tensor) -> torch.Tensor:
        """``A [B, 1, T, T]`` of :meth:`causal`: the NAM memory is linear in the values, so its
        scan run with one-hot values ``v_s = e_s`` reads row ``t`` of ``A`` at step ``t``."""
        q, k = unit(self.q(x)).unsqueeze(2), unit(self.k(x)).unsqueeze(2)  # [B, T, 1, dk]
        p_w, p_e = self._gates(x)
        return _one_hot_reads(x, q, lambda vals: nam_scan(q, k, vals, p_w, p_e, None, impl="reference")[0])

    def implied_read(self, x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
        """``A [B, 1, Q, T]`` of :meth:`write_read`: the memory written with one-hot values
        ``v_s = e_s``, read at the unit queries."""
        q, k = unit(self.q(x)).unsqueeze(2), unit(self.k(x)).unsqueeze(2)  # [B, T, 1, dk]
        p_w, p_e = self._gates(x)
        M = _one_hot_state(x, q, lambda vals: nam_scan(q, k, vals, p_w, p_e, None, impl="reference")[1])
        return torch.einsum("bhsk,bqk->bhqs", M, unit(self.q(xq)))

    def write_gates(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``p_w`` (and ``p_e`` when it is a gate of its own), ``[B, T, 1]``."""
        p_w, p_e = self._gates(x)
        return {"write p_w": p_w} if self.p_e is None else {"write p_w": p_w, "erase p_e": p_e}

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """The values ``[B, T, 1, dv]`` that :meth:`implied_attention` mixes."""
        return self.v(x).unsqueeze(2)


class RecurrentAdapter(nn.Module):
    """A recurrent memory module (LSAM, NTM, DNC) run over ``[writes ; queries]``.

    The queries are extra time steps after the writes (their inputs carry a query flag);
    the outputs at those steps are the read-outs. ``make(in_size)`` builds the module, whose
    ``forward(x [B, T, in]) -> (y [B, T, out], state)``; a Linear maps ``out`` to ``dv``.
    """

    def __init__(self, in_size: int, d_value: int, make: Callable[[int], nn.Module], out_size: int):
        super().__init__()
        self.mem = make(in_size)
        self.o = nn.Linear(out_size, d_value)

    def write_read(self, x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
        y, _ = self.mem(torch.cat([x, xq], dim=1))  # [B, T + Q, out]
        return self.o(y[:, x.shape[1]:])

    def causal(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(self.mem(x)[0])


def _lsam(d_key: int):
    from ..memories.lsam import LSAM
    return lambda n: LSAM(n, hidden_size=d_key, num_heads=1), d_key


def _ntm(d_key: int, d_value: int):
    from ..memories.ntm import NTM
    return lambda n: NTM(n, d_value, memory_slots=d_key, word_size=d_value, controller_size=d_key), d_value


def _dnc(d_key: int, d_value: int):
    from ..memories.dnc import DNC
    return lambda n: DNC(n, d_value, memory_slots=d_key, word_size=d_value, read_heads=1,
                         controller_size=d_key), d_value


#: name -> (description, builder(in_size, d_key, d_value) -> adapter)
MEMORIES: dict[str, tuple[str, Callable[[int, int, int], nn.Module]]] = {
    "softmax": ("softmax attention", lambda n, k, v: SoftmaxAdapter(n, k, v)),
    "linear": ("linear attention, elu+1 (sum rule)", lambda n, k, v: FastWeightAdapter(n, k, v, "sum", "elu")),
    "dpfp1": ("sum-rule FWP, DPFP-1", lambda n, k, v: FastWeightAdapter(n, k, v, "sum", "dpfp1")),
    "dpfp2": ("sum-rule FWP, DPFP-2", lambda n, k, v: FastWeightAdapter(n, k, v, "sum", "dpfp2")),
    "dpfp3": ("sum-rule FWP, DPFP-3", lambda n, k, v: FastWeightAdapter(n, k, v, "sum", "dpfp3")),
    "delta": ("delta-rule FWP, elu+1", lambda n, k, v: FastWeightAdapter(n, k, v, "delta", "elu")),
    "delta_dpfp1": ("delta-rule FWP, DPFP-1", lambda n, k, v: FastWeightAdapter(n, k, v, "delta", "dpfp1")),
    "nam": ("NAM write, unit keys, p_e = p_w", lambda n, k, v: NAMAdapter(n, k, v, separate_erase=False)),
    "nam_erase": ("NAM write, separate erase gate p_e", lambda n, k, v: NAMAdapter(n, k, v, separate_erase=True)),
    "lsam": ("LSAM (1 head, hidden d_key)", lambda n, k, v: RecurrentAdapter(n, v, *_lsam(k))),
    "ntm": ("NTM (d_key slots x d_value words)", lambda n, k, v: RecurrentAdapter(n, v, *_ntm(k, v))),
    "dnc": ("DNC (d_key slots x d_value words, 1 read head)", lambda n, k, v: RecurrentAdapter(n, v, *_dnc(k, v))),
}
#: Memories run by default (the recurrent ones step through time in Python and are slow on CPU).
DEFAULT_MEMORIES = ("softmax", "linear", "dpfp1", "dpfp2", "dpfp3", "delta", "nam", "nam_erase")
RECURRENT = {"lsam": "memnets.memories.lsam", "ntm": "memnets.memories.ntm", "dnc": "memnets.memories.dnc"}


def unavailable_reason(name: str) -> str | None:
    """Why memory ``name`` cannot be built here (``None`` if it can)."""
    if name not in MEMORIES:
        return f"unknown memory {name!r}; expected one of {sorted(MEMORIES)}"
    if name in RECURRENT:
        try:
            importlib.import_module(RECURRENT[name])
        except ImportError as e:
            return f"{RECURRENT[name]} is not available ({e})"
    return None


def build_adapter(name: str, in_size: int, d_key: int = 64, d_value: int = 64) -> nn.Module:
    """Adapter for memory ``name`` (a key of :data:`MEMORIES`) with inputs of size ``in_size``."""
    reason = unavailable_reason(name)
    if reason:
        raise ValueError(f"`memory`: {reason}")
    if not (isinstance(d_key, int) and d_key > 0 and isinstance(d_value, int) and d_value > 0):
        raise ValueError(f"`d_key`, `d_value` expected positive ints, got {d_key!r}, {d_value!r}")
    return MEMORIES[name][1](in_size, d_key, d_value)

