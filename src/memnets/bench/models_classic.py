"""Benchmark cases for the classic memories (NTM, DNC), aggregated by ``memnets bench models``.

- DNC against the ``dnc`` package from PyPI (imported only if installed) at its README copy
  setup: LSTM controller 64, memory 16 × 20, 4 read heads, batch 32, copy length 20
  (T = 41), forward + backward, with a 1-layer and a 2-layer LSTM controller on both sides
  (the package's copy script defaults to 2). Bar: ours at least 3× faster (ratio ≤ 0.33).
- NTM at LSTM 100, memory 128 × 20, one read and one write head, batch 32, copy length 20,
  forward + backward, against the published ≈ 1.2 s per step of the implementation cited
  by seed 002 (a reference figure, not measured here). Target: ≤ 0.4 s. Also against the same
  NTM with ``MEMNETS_NATIVE=0`` (its memory access as tensor ops instead of the C step of
  :mod:`memnets.ops.ntm_access`), a training step and a forward alone.
- The DNC of the first case on a ``PackedSequence`` of 32 random lengths (21 to 41) against the
  same DNC on the padded batch: what one call per distinct length costs
  (:mod:`memnets.memories.packed`).
"""
from __future__ import annotations

import statistics
import time

import torch

from ..memories.dnc import DNC
from ..memories.ntm import NTM
from ..tasks.ntm_tasks import CopyTask, bits_per_sequence
from .timing import fwd_bwd, paired, pytorch_path, time_fn

__all__ = ["run_cases"]

NTM_REFERENCE_MS = 1200.0  # seed 002: ≈ 1.2 s per training step of the cited implementation


def _cpu_ms(fn, repeat: int) -> float:
    """Median process CPU time of ``fn()`` in ms (robust to other processes sharing the cores)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return 1e3 * statistics.median(times)


def _copy_batch(batch_size: int = 32, length: int = 20):
    return CopyTask(min_len=length, max_len=length, bits=8).make_batch(batch_size, torch.Generator().manual_seed(0))


def _step_fn(model: torch.nn.Module, run, batch):
    params = [p for p in model.parameters() if p.requires_grad]

    def fn() -> None:
        for p in params:
            p.grad = None
        y = run(batch.inputs)
        bits_per_sequence(y, batch.targets, batch.mask).backward()

    return fn


def _peer_dnc():
    """The ``dnc`` PyPI package's DNC class and version, or ``(None, reason)``."""
    try:
        from dnc import DNC as PeerDNC  # optional, not a project dependency
    except Exception as e:  # noqa: BLE001 - any import failure means no peer
        return None, f"peer not installed ({type(e).__name__})"
    try:
        from importlib.metadata import version

        ver = version("dnc")
    except Exception:  # noqa: BLE001
        ver = "unknown"
    return PeerDNC, ver


def _dnc_case(quick: bool, layers: int) -> dict:
    repeat = 3 if quick else 7
    batch = _copy_batch()
    torch.manual_seed(0)
    ours = DNC(9, 8, memory_slots=16, word_size=20, read_heads=4, controller_size=64, controller_layers=layers)
    ours_fn = _step_fn(ours, lambda x: ours(x)[0], batch)
    row = {"model": "dnc", "config": f"LSTM 64 x {layers} layer(s), memory 16x20, 4 read heads, B=32, T=41, fwd+bwd",
           "baseline": "dnc (PyPI)", "baseline_ms": None, "ours_ms": None, "ratio": None}
    peer_cls, info = _peer_dnc()
    if peer_cls is None:
        row.update(ours_ms=round(1e3 * time_fn(ours_fn, warmup=1, repeat=repeat), 1), note=info)
        return row
    torch.manual_seed(0)
    peer = peer_cls(input_size=9, hidden_size=64, rnn_type="lstm", num_layers=1, num_hidden_layers=layers,
                    nr_cells=16, cell_size=20, read_heads=4, batch_first=True, gpu_id=-1)
    head = torch.nn.Linear(9, 8)  # the peer outputs input_size features; map them to the 8 bits
    peer_params = list(peer.parameters()) + list(head.parameters())

    def peer_fn() -> None:
        for p in peer_params:
            p.grad = None
        out, _ = peer(batch.inputs, (None, None, None), reset_experience=True)
        bits_per_sequence(head(out), batch.targets, batch.mask).backward()

    # interleave the two so that load changes on a shared machine hit both alike
    ours_t, peer_t, ours_c, peer_c = [], [], [], []
    for _ in range(repeat):
        ours_t.append(time_fn(ours_fn, warmup=1 if not ours_t else 0, repeat=1))
        peer_t.append(time_fn(peer_fn, warmup=1 if not peer_t else 0, repeat=1))
        ours_c.append(_cpu_ms(ours_fn, 1))
        peer_c.append(_cpu_ms(peer_fn, 1))
    ours_ms, base_ms = 1e3 * statistics.median(ours_t), 1e3 * statistics.median(peer_t)
    oc, pc = statistics.median(ours_c), statistics.median(peer_c)
    row.update(ours_ms=round(ours_ms, 1), baseline_ms=round(base_ms, 1), ratio=round(ours_ms / base_ms, 3),
               note=f"dnc {info} with num_hidden_layers={layers}; median of {repeat} interleaved runs, "
                    f"1 thread; process CPU ms ours {oc:.0f} / peer {pc:.0f} = {oc / pc:.2f}; bar: ratio <= 0.33")
    return row


def _dnc_native_cases(quick: bool) -> list[dict]:
    """The 1-layer DNC of the first row with its access step in C (memnets.ops.dnc.native)
    against the same DNC with the C kernels off (its access as PyTorch ops): a training step,
    and a forward alone under ``torch.no_grad()`` (an evaluation)."""
    batch = _copy_batch()
    torch.manual_seed(0)
    dnc = DNC(9, 8, memory_slots=16, word_size=20, read_heads=4, controller_size=64)
    train = _step_fn(dnc, lambda x: dnc(x)[0], batch)

    def evaluate() -> None:
        with torch.no_grad():
            dnc(batch.inputs)
    return _against_the_ops("dnc access in C", "as above, 1 layer", "DNC", train, evaluate, 3 if quick else 7,
                            "each step's memory access one C call forward and one backward (memnets.ops.dnc.native)")


def _against_the_ops(model: str, config: str, name: str, train, evaluate, repeat: int, what: str) -> list[dict]:
    """Rows timing ``train`` (a training step) and ``evaluate`` (a forward under ``no_grad``)
    against themselves with the C kernels off (``MEMNETS_NATIVE=0``), interleaved."""
    rows = []
    for step, fn in (("training step", train), ("forward only (no_grad)", evaluate)):
        base, ours, cpu = paired(pytorch_path(fn), fn, repeat)
        rows.append({"model": model, "config": f"{config}; {step}", "baseline": f"the same {name}, MEMNETS_NATIVE=0",
                     "baseline_ms": round(1e3 * base, 1), "ours_ms": round(1e3 * ours, 1),
                     "ratio": round(ours / base, 3),
                     "note": f"{what}; median of {repeat} interleaved runs, 1 thread; CPU-time ratio {cpu:.2f}"})
    return rows


def _dnc_packed_case(quick: bool) -> dict:
    batch = _copy_batch()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(21, 42, (32,), generator=g)
    lengths[0] = 41
    torch.manual_seed(0)
    dnc = DNC(9, 8, memory_slots=16, word_size=20, read_heads=4, controller_size=64)
    x = batch.inputs.clone().requires_grad_()
    params = [*dnc.parameters(), x]
    pack = torch.nn.utils.rnn.pack_padded_sequence
    repeat = 3 if quick else 7
    base, ours, _ = paired(fwd_bwd(lambda: dnc(x)[0], params),  # interleaved, as the peer comparison
                           fwd_bwd(lambda: dnc(pack(x, lengths, batch_first=True, enforce_sorted=False))[0].data,
                                   params), repeat)
    return {"model": "dnc packed", "config": f"as above, 1 layer; a PackedSequence of lengths 21-41 "
                                             f"({len(set(lengths.tolist()))} distinct)",
            "baseline": "the same DNC on the padded batch", "baseline_ms": round(1e3 * base, 1),
            "ours_ms": round(1e3 * ours, 1), "ratio": round(ours / base, 3),
            "note": f"one call over the padded batch; median of {repeat} interleaved runs, 1 thread"}


def _ntm_case(quick: bool) -> list[dict]:
    """The NTM's training step: against the published figure of the implementation cited with
    the copy task, and against the same NTM with its memory access as PyTorch ops
    (``MEMNETS_NATIVE=0``; memnets.ops.ntm_access), a training step and a forward alone."""
    repeat = 3 if quick else 7
    batch = _copy_batch()
    torch.manual_seed(0)
    ntm = NTM(9, 8, memory_slots=128, word_size=20, read_heads=1, write_heads=1, controller_size=100)
    fn = _step_fn(ntm, lambda x: ntm(x)[0], batch)
    ours_ms = 1e3 * time_fn(fn, warmup=1, repeat=repeat)
    cpu_ms = _cpu_ms(fn, repeat)
    config = "LSTM 100, memory 128x20, 1 read + 1 write head, B=32, T=41"
    rows = [{"model": "ntm", "config": f"{config}, fwd+bwd",
             "baseline": "seed 002 cited implementation (published)", "baseline_ms": NTM_REFERENCE_MS,
             "ours_ms": round(ours_ms, 1), "ratio": round(ours_ms / NTM_REFERENCE_MS, 3),
             "note": f"baseline is the published ~1.2 s/step, not measured here; process CPU {cpu_ms:.0f} ms; "
                     "target <= 400 ms"}]

    def evaluate() -> None:
        with torch.no_grad():
            ntm(batch.inputs)
    return rows + _against_the_ops("ntm access in C", config, "NTM", fn, evaluate, repeat,
                                   "each step's memory access one C call (memnets.ops.ntm_access)")


def run_cases(quick: bool = False) -> list[dict]:
    """Rows for ``memnets bench models`` (keys: model, config, baseline, baseline_ms, ours_ms, ratio, note)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny per-step ops: one intra-op thread, the same for every model
    try:
        return [_dnc_case(quick, 1), _dnc_case(quick, 2), *_dnc_native_cases(quick), _dnc_packed_case(quick),
                *_ntm_case(quick)]
    finally:
        torch.set_num_threads(threads)
