"""Per-step time of the LRA classifiers (forward + backward + AdamW) for each attention kind.

    python -m memnets.bench.lra_steps [--scale cpu|paper ...] [--length 2000] [--batch-size 32]
        [--steps 20] [--warmup 5] [--repeats 2] [--device auto|cpu|cuda] [--out FILE.json]

Builds :class:`memnets.models.lra.LRAClassifier` with the ``cpu`` or ``paper`` preset
sizes of :data:`memnets.experiments.lra.PRESETS` (ListOps: vocabulary 16, 10 classes) for
softmax, Linear, NAM and NAM with ``length_norm=True``, feeds one fixed batch of random tokens with random lengths in
``[length // 4, length)`` (the rest padding), and reports the mean seconds per step over
``--steps`` steps after ``--warmup`` steps (the device synchronised), each kind ``--repeats``
times in turn, plus the peak GPU memory on CUDA. The speed-ups are softmax's time over each
kind's, per repetition.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from ..models.lra import LRAClassifier
from ..train.env import resolve_device

__all__ = ["KINDS", "step_time", "main"]

KINDS = (("softmax", None), ("linear", None), ("nam", None), ("nam+ln", {"length_norm": True}))


def _presets() -> dict:
    from ..experiments.lra import PRESETS  # the experiment's sizes, read on use

    return PRESETS


def _sizes(scale: str) -> dict:
    p = dict(_presets()[scale])
    ffn = p["listops"].get("ffn", p.get("ffn"))
    return dict(d_model=p["d_model"], num_layers=p["layers"], num_heads=p["heads"], dim_feedforward=ffn,
                pool=p["pool"])


def step_time(kind: str, scale: str = "cpu", length: int = 2000, batch_size: int = 32, steps: int = 20,
              warmup: int = 5, device: str | torch.device = "cpu", options: dict | None = None) -> tuple[float, float]:
    """``(seconds per step, peak GiB on CUDA else 0)`` of one LRA classifier."""
    device = torch.device(device)
    torch.manual_seed(0)
    model = LRAClassifier(16, 10, length, attention=kind.split("+")[0], attention_options=options,
                          **_sizes(scale)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(length // 4, length, (batch_size,), generator=g)
    x = torch.randint(1, 16, (batch_size, length), generator=g) * (torch.arange(length) < lens[:, None])
    y = torch.randint(0, 10, (batch_size,), generator=g)
    x, y = x.to(device), y.to(device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if cuda else 0.0
    return (time.perf_counter() - t0) / steps, peak


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m memnets.bench.lra_steps", description=__doc__.split("\n")[0])
    p.add_argument("--scale", nargs="+", choices=sorted(_presets()), default=["cpu", "paper"])
    p.add_argument("--length", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if min(a.length, a.batch_size, a.steps, a.repeats) < 1 or a.length < 4 or a.warmup < 0:
        p.error("--length >= 4, --batch-size, --steps, --repeats >= 1 and --warmup >= 0 expected")
    try:
        device = resolve_device(a.device)
    except ValueError as e:
        p.error(f"--device: {e}")
    if a.threads:
        torch.set_num_threads(a.threads)
    out = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           "torch": torch.__version__, "length": a.length, "batch_size": a.batch_size, "rows": []}
    for scale in a.scale:
        for rep in range(a.repeats):
            base = None
            for name, opts in KINDS:
                s, mem = step_time(name, scale, a.length, a.batch_size, a.steps, a.warmup, device, opts)
                base = s if name == "softmax" else base
                out["rows"].append({"scale": scale, "repeat": rep, "attention": name, "s_per_step": s,
                                    "speedup_vs_softmax": base / s, "peak_gib": mem})
                print(f"{scale:5s} repeat {rep} {name:8s} {1000 * s:8.1f} ms/step  {base / s:5.2f}x vs softmax"
                      + (f"  peak {mem:.2f} GiB" if device.type == "cuda" else ""), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
