"""Where a recurrent memory's training step spends its time on a GPU: wall time against the
time the GPU's kernels take (``torch.profiler``), with the kernels that take most.

``python -m memnets.bench.gpu_profile [--json PATH]`` (CUDA only): one training step (forward,
backward, Adam), float32, B=32, of LSAM (hidden 256, 8 heads, T=100, uni- and bidirectional),
the NAM-TM (bench width, T=50), the DNC (LSTM 64, memory 16x20, 4 reads, T=41) and the NTM
(LSTM 100, memory 128x20, T=41), the sizes of ``make gpu-check``; and ``nam_attention``
(bf16, B=1 H=8 d=64, S=32K, causal and not) forward and backward. ``wall_ms`` is the mean of ten
steps after three warm-ups; ``kernel_ms`` the sum of the device time of every kernel of one
profiled step. A wall time far above the kernel time means the step waits on the CPU's launches
(what CUDA-graph replay removes); close to it, on the kernels themselves. ``top_host`` lists the
host-side events by their own CPU time (ATen ops, CUDA runtime calls) and ``waits`` the calls
that wait on the device (synchronisations, blocking copies, ``item()``): where a step's wall time
goes when neither its kernels nor its launch count explain it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

__all__ = ["profile_step", "run", "main"]


def profile_step(step, repeat: int = 10, device: str | torch.device = "cuda") -> dict:
    """Wall time of ``step()`` and the device time of its kernels (one profiled call). On a
    CPU ``device`` (a check of this code) the "kernels" are the CPU's ATen ops, by self time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(repeat):
        step()
    sync()
    wall = (time.perf_counter() - t0) / repeat * 1e3
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        step()
        sync()
    if cuda:
        kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        time_of = lambda e: e.self_device_time_total  # noqa: E731
    else:
        kernels = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        time_of = lambda e: e.self_cpu_time_total  # noqa: E731
    total = sum(time_of(e) for e in kernels) / 1e3
    top = sorted(kernels, key=lambda e: -time_of(e))[:10]
    # the host's side: where the CPU time of the step goes (ops, launches, waits on the device)
    host = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU]
    top_cpu = sorted(host, key=lambda e: -e.self_cpu_time_total)[:12]
    waits = [e for e in host if any(w in e.key for w in ("Synchronize", "cudaMemcpy", "EventSynchronize",
                                                           "_local_scalar_dense"))]
    return {"wall_ms": round(wall, 3), "kernel_ms": round(total, 3), "launches": sum(e.count for e in kernels),
            "top": [{"kernel": e.key[:80], "count": e.count, "ms": round(time_of(e) / 1e3, 3)} for e in top],
            "host_ms": round(sum(e.self_cpu_time_total for e in host) / 1e3, 3),
            "top_host": [{"op": e.key[:80], "count": e.count, "self_ms": round(e.self_cpu_time_total / 1e3, 3)}
                         for e in top_cpu],
            "waits": [{"op": e.key[:80], "count": e.count, "self_ms": round(e.self_cpu_time_total / 1e3, 3)}
                      for e in waits]}


def run() -> dict:
    from ..memories.dnc import DNC
    from ..memories.lsam import LSAM
    from ..memories.nam_tm import NAMTuringMachine
    from ..memories.ntm import NTM
    from .gpu import _train_step

    dev = torch.device("cuda")
    cases = [
        ("LSAM hidden 256", lambda: LSAM(256, 256, 8), 100, 256),
        ("LSAM bi hidden 256", lambda: LSAM(256, 256, 8, bidirectional=True), 100, 256),
        ("NAM-TM bench width", lambda: NAMTuringMachine(64, 128, num_tapes=4, tape_length=32), 50, 64),
        ("DNC LSTM 64, 16x20", lambda: DNC(9, 8, memory_slots=16, word_size=20, read_heads=4, controller_size=64),
         41, 9),
        ("NTM LSTM 100, 128x20", lambda: NTM(9, 8, memory_slots=128, word_size=20, read_heads=1, write_heads=1,
                                             controller_size=100), 41, 9),
        ("nn.LSTM hidden 256", lambda: torch.nn.LSTM(256, 256, batch_first=True), 100, 256),
    ]
    out = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "rows": {}}
    for name, build, T, fi in cases:
        torch.manual_seed(0)
        model = build().to(dev)
        x = torch.randn(32, T, fi, device=dev)
        out["rows"][name] = profile_step(_train_step(model, x, lambda x, m=model: m(x)[0]))
        print(name, json.dumps(out["rows"][name]), flush=True)
    # causal nam_attention, bf16, S=32K, forward + backward: what runs around fla's kernel
    from ..ops import nam_attention
    from .gpu import _fwd_bwd
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(1, 8, 32768, 64, device=dev, generator=g).to(torch.bfloat16).requires_grad_()
               for _ in range(3))
    for causal in (True, False):
        name = f"nam_attention bf16 S=32K {'causal' if causal else 'non-causal'}"
        out["rows"][name] = profile_step(_fwd_bwd(lambda c=causal: nam_attention(q, k, v, is_causal=c), [q, k, v]))
        print(name, json.dumps(out["rows"][name]), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m memnets.bench.gpu_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, help="write the result here")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("CUDA is not available: nothing to profile", file=sys.stderr)
        return 2
    res = run()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
