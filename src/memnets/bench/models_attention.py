"""Benchmark rows for the attention family: one training step of a Transformer encoder
(forward + backward + Adam step) with each linear-cost attention against softmax attention.

``run_cases(quick) -> list[dict]`` with the columns of :mod:`memnets.bench.models`
(``model, config, baseline, baseline_ms, ours_ms, ratio, note``); ``ratio = ours / softmax``
(lower is better). Full size: d_model 64, 2 layers, 4 heads, batch 4, S = 2000, float32;
``quick``: S = 256.
"""
from __future__ import annotations

import torch

from ..models.transformer import TransformerEncoder
from .timing import time_fn

__all__ = ["run_cases", "train_step_time"]


def train_step_time(attention: str, causal: bool, *, S: int, d_model: int = 64, num_layers: int = 2,
                    num_heads: int = 4, batch: int = 4, repeat: int = 3, seed: int = 0) -> float:
    """Median seconds of one Adam training step of a :class:`TransformerEncoder`."""
    torch.manual_seed(seed)
    model = TransformerEncoder(d_model, num_layers, num_heads, attention=attention, causal=causal)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(batch, S, d_model)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()

    return time_fn(step, warmup=1, repeat=repeat)


def run_cases(quick: bool = False, *, lengths: list[int] | None = None, repeat: int = 3) -> list[dict]:
    """Rows: each of nam / linear / delta against softmax, bidirectional and causal."""
    lengths = lengths or ([256] if quick else [2000])
    rows = []
    for S in lengths:
        for causal in (False, True):
            base = train_step_time("softmax", causal, S=S, repeat=repeat)
            for kind in ("nam", "linear", "delta"):
                if kind == "delta" and not causal:
                    continue  # the delta rule is causal only
                ours = train_step_time(kind, causal, S=S, repeat=repeat)
                rows.append({
                    "model": f"transformer[{kind}]",
                    "config": f"d=64 L=2 H=4 B=4 S={S} {'causal' if causal else 'bidirectional'}",
                    "baseline": "transformer[softmax]",
                    "baseline_ms": 1e3 * base,
                    "ours_ms": 1e3 * ours,
                    "ratio": ours / base,
                    "note": f"train step, {torch.get_num_threads()} threads",
                })
    return rows
