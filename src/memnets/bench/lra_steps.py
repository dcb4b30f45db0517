"""Per-step time of the LRA classifiers (forward + backward + optimiser step) for each attention kind.

    python -m memnets.bench.lra_steps [--scale cpu|paper ...] [--length 2000] [--batch-size 32]
        [--steps 20] [--warmup 5] [--repeats 2] [--device auto|cpu|cuda] [--out FILE.json]

Each step is a step of the training engine: the ``listops`` task of
:mod:`memnets.train.families.lra` with the model sizes, optimiser and gradient clipping of the
``lra/listops-softmax`` (``cpu``) or ``lra/listops-paper-softmax`` (``paper``) preset
(:class:`memnets.models.lra.LRAClassifier`; vocabulary 16, 10 classes), the task's
``train_step`` (loss) and the engine's :func:`memnets.train.loop.update` (backward, clipping,
optimiser step), for softmax, Linear, NAM and NAM with ``length_norm=True``. It feeds one fixed
batch of random tokens with random lengths in ``[length // 4, length)`` (the rest padding) and
reports the mean seconds per step over ``--steps`` steps after ``--warmup`` steps (the device
synchronised), each kind ``--repeats`` times in turn, plus the peak GPU memory on CUDA. The
speed-ups are softmax's time over each kind's, per repetition.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from ..train.env import resolve_device

__all__ = ["KINDS", "SCALES", "step_config", "step_time", "main"]

KINDS = (("softmax", None), ("linear", None), ("nam", None), ("nam+ln", {"length_norm": True}))
SCALES = {"cpu": "lra/listops-softmax", "paper": "lra/listops-paper-softmax"}  # scale -> preset


def step_config(kind: str, scale: str = "cpu", length: int = 2000, batch_size: int = 32, device: str = "cpu",
                options: dict | None = None):
    """The :class:`~memnets.train.config.RunConfig` of ``scale``'s preset with attention ``kind``
    (``nam+ln``: NAM with ``length_norm``), sequence length ``length`` and ``batch_size``."""
    from ..train import load_config

    if options and set(options) != {"length_norm"}:
        raise ValueError(f"`options` expected only 'length_norm', got {sorted(options)}")
    norm = bool((options or {}).get("length_norm"))
    return load_config(SCALES[scale], [f"model.backbone={kind.split('+')[0]}", f"task.options.max_len={length}",
                                       f"batch_size={batch_size}", f"task.train_size={max(batch_size, 2)}",
                                       f"model.options.nam_length_norm={str(norm).lower()}", f"device={device}"])


def step_time(kind: str, scale: str = "cpu", length: int = 2000, batch_size: int = 32, steps: int = 20,
              warmup: int = 5, device: str | torch.device = "cpu", options: dict | None = None) -> tuple[float, float]:
    """``(seconds per step, peak GiB on CUDA else 0)`` of one LRA classifier."""
    from ..train.loop import update
    from ..train.optim import make_optimizer
    from ..train.task import get_task

    device = torch.device(device)
    cfg = step_config(kind, scale, length, batch_size, str(device), options)
    task = get_task(cfg.task.name)
    torch.manual_seed(0)
    model = task.build_model(cfg).to(device)
    opt = make_optimizer(cfg.optim, model.parameters())
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(length // 4, length, (batch_size,), generator=g)
    x = torch.randint(1, 16, (batch_size, length), generator=g) * (torch.arange(length) < lens[:, None])
    y = torch.randint(0, 10, (batch_size,), generator=g)
    batch = (x.to(device), y.to(device))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model.train()
    n = 0

    def step():
        nonlocal n
        n += 1
        loss, _ = task.train_step(model, batch, cfg, device)
        update(cfg, model, opt, loss, n)

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
    p.add_argument("--scale", nargs="+", choices=sorted(SCALES), default=["cpu", "paper"])
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
