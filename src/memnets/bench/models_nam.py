"""Benchmark cases for the NAM recurrent models, aggregated by ``memnets bench models``.

- LSAM (8 heads of 32) against ``torch.nn.LSTM`` of the same hidden size, B=32, T=100,
  hidden 256, forward + backward of the output sum. Bar: ratio ≤ 1.5. Also the
  bidirectional layer against a bidirectional LSTM with the same output width (128 per
  direction).
- NAM-TM at a typical small configuration (input 64, hidden 128, 4 tapes, tape length 32,
  bidirectional GRU controller), B=32, T=50, against ``torch.nn.LSTM`` (hidden 128; bar:
  ratio ≤ 3.0) and against its own per-step reference (``impl="reference"``; bar ≤ 1/3).
- The bidirectional LSAM on a ``PackedSequence`` (sequences of different lengths) against the
  bidirectional ``torch.nn.LSTM`` on the same packed batch, and against itself padded; the
  NAM-TM on a packed batch against itself padded.
- The NAM-TM's pieces, each C kernel of :mod:`memnets.ops._native` against the PyTorch path it
  replaces: heads and key tape, value tape (against the chunked ``nam_scan``), GRU controller.

Baseline and ours run alternately and the medians are compared, so that a change of machine
load affects both alike. ``quick`` shrinks every size (a smoke test, not a measurement).
"""
from __future__ import annotations


import torch
import torch.nn.functional as F

from ..ops.lsam.loops import loops
from ..ops.lsam.native import kernel as lsam_kernel
from ..memories.lsam import LSAM
from ..memories.nam_tm import NAMTuringMachine
from ..ops import _native, nam_scan
from ..ops.gru import gru_module_forward
from ..ops.nam_tape import nam_tape_scan
from ..ops.nam_tm_heads import nam_tm_heads
from .timing import fwd_bwd, paired, pytorch_path

__all__ = ["run_cases"]


def _row(model, config, baseline, timing, note) -> dict:
    tb, to, cpu_ratio = timing
    return {"model": model, "config": config, "baseline": baseline, "baseline_ms": 1e3 * tb,
            "ours_ms": 1e3 * to, "ratio": to / tb, "note": f"{note}; CPU-time ratio {cpu_ratio:.2f}"}


def _lsam_cases(quick: bool, repeat: int) -> list[dict]:
    B, T, D, H = (8, 20, 64, 4) if quick else (32, 100, 256, 8)
    rows = []
    for bi in (False, True):
        torch.manual_seed(0)
        x = torch.randn(B, T, D, requires_grad=True)
        lstm = torch.nn.LSTM(D, D // 2 if bi else D, batch_first=True, bidirectional=bi)
        lsam = LSAM(D, D, H, bidirectional=bi)
        timing = paired(fwd_bwd(lambda: lstm(x)[0], [*lstm.parameters(), x]),
                         fwd_bwd(lambda: lsam(x)[0], [*lsam.parameters(), x]), repeat)
        cfg = f"B={B} T={T} hidden={D} heads={H}" + (" bidirectional" if bi else "")
        note = ("bar: ratio <= 1.5" if not bi else "LSTM 2 x hidden/2, same output width") + \
            f"; fwd+bwd, float32, {torch.get_num_threads()} threads" + \
            f"; LSAM step {'in C' if lsam_kernel(x) else 'loops compiled' if loops()[2] else 'loops in Python'}"
        rows.append(_row("LSAM" + (" (bi)" if bi else ""), cfg, "torch.nn.LSTM", timing, note))
    return rows


def _packed_cases(quick: bool, repeat: int) -> list[dict]:
    """The bidirectional LSAM on a packed batch (``PackedSequence``, lengths drawn evenly from
    T/4 … T) against a bidirectional ``torch.nn.LSTM`` on the same packed batch, and against
    itself on the padded batch (what packing costs: a scan per direction, the reversals and
    gathers)."""
    B, T, D, H = (8, 20, 64, 4) if quick else (32, 100, 256, 8)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    lengths[0] = T
    torch.manual_seed(0)
    x = torch.randn(B, T, D, requires_grad=True)
    lstm = torch.nn.LSTM(D, D // 2, batch_first=True, bidirectional=True)
    lsam = LSAM(D, D, H, bidirectional=True)

    def packed():
        return torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)

    ours = fwd_bwd(lambda: lsam(packed())[0].data, [*lsam.parameters(), x])
    cfg = f"B={B} T={T} hidden={D} heads={H} bidirectional, {len(set(lengths.tolist()))} distinct lengths"
    note = f"fwd+bwd, float32, {torch.get_num_threads()} threads"
    return [
        _row("LSAM (bi) packed", cfg, "torch.nn.LSTM packed",
             paired(fwd_bwd(lambda: lstm(packed())[0].data, [*lstm.parameters(), x]), ours, repeat),
             note + "; LSTM 2 x hidden/2 on the same PackedSequence"),
        _row("LSAM (bi) packed", cfg, "LSAM (bi) padded", paired(fwd_bwd(lambda: lsam(x)[0], [*lsam.parameters(), x]),
                                                                 ours, repeat),
             note + "; the padded run's backward direction starts in the padding (not the same function)"),
        _nam_tm_packed_case(quick, repeat),
    ]


def _nam_tm_packed_case(quick: bool, repeat: int) -> dict:
    """The NAM-TM of the NAM-TM rows on a packed batch (lengths drawn evenly from T/2 … T)
    against itself on the padded batch: what packing costs it (the controller's reversals within
    each length, the held heads and closed writes after each end, packing and unpacking)."""
    B, T, Fi, D, Tn, L = (8, 12, 16, 32, 2, 8) if quick else (32, 50, 64, 128, 4, 32)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    torch.manual_seed(0)
    x = torch.randn(B, T, Fi, requires_grad=True)
    tm = NAMTuringMachine(Fi, D, num_tapes=Tn, tape_length=L)
    pack = torch.nn.utils.rnn.pack_padded_sequence
    params = [*tm.parameters(), x]
    timing = paired(fwd_bwd(lambda: tm(x)[0], params),
                    fwd_bwd(lambda: tm(pack(x, lengths, batch_first=True, enforce_sorted=False))[0].data, params),
                    repeat)
    cfg = f"B={B} T={T} in={Fi} hidden={D} tapes={Tn} L={L} biGRU controller, " \
          f"{len(set(lengths.tolist()))} distinct lengths"
    return _row("NAM-TM packed", cfg, "NAM-TM padded", timing,
                f"one call over the padded batch; fwd+bwd, float32, {torch.get_num_threads()} threads; the padded "
                "run's backward direction starts in the padding (not the same function)")


def _nam_tm_case(quick: bool, repeat: int) -> list[dict]:
    B, T, Fi, D, Tn, L = (8, 12, 16, 32, 2, 8) if quick else (32, 50, 64, 128, 4, 32)
    torch.manual_seed(0)
    x = torch.randn(B, T, Fi, requires_grad=True)
    lstm = torch.nn.LSTM(Fi, D, batch_first=True)
    tm = NAMTuringMachine(Fi, D, num_tapes=Tn, tape_length=L)
    timing = paired(fwd_bwd(lambda: lstm(x)[0], [*lstm.parameters(), x]),
                     fwd_bwd(lambda: tm(x)[0], [*tm.parameters(), x]), repeat)
    cfg = f"B={B} T={T} in={Fi} hidden={D} tapes={Tn} L={L} biGRU controller"
    row = _row("NAM-TM", cfg, "torch.nn.LSTM", timing,
               f"bar: ratio <= 3.0 (LSTM of the same hidden size); impl={tm.impl}; {torch.get_num_threads()} threads")
    ref = NAMTuringMachine(Fi, D, num_tapes=Tn, tape_length=L, impl="reference")
    ref.load_state_dict(tm.state_dict())
    timing = paired(fwd_bwd(lambda: ref(x)[0], [*ref.parameters(), x]),
                     fwd_bwd(lambda: tm(x)[0], [*tm.parameters(), x]), max(2, repeat // 2))
    row_ref = _row("NAM-TM", cfg, "NAM-TM impl=reference", timing,
                   f"bar: ratio <= 0.33 (fused vs its per-step reference); {torch.get_num_threads()} threads")
    return [row, row_ref]


def _nam_tm_piece_cases(quick: bool, repeat: int) -> list[dict]:
    """The NAM-TM's pieces at the bench configuration, each C kernel against the PyTorch path
    it replaces (the TorchScript head loops, the chunked ``nam_scan``, the TorchScript GRU
    loops), forward+backward. Only where the kernels load (memnets.ops._native)."""
    B, T, Tn, L, C = (8, 12, 2, 8, 16) if quick else (32, 50, 4, 32, 32)
    if not all(_native.status().values()):
        return []
    g = torch.Generator().manual_seed(0)
    N, cfg = B * Tn, f"B={B} T={T} tapes={Tn} L={L} C={C}"

    def leaf(*shape, fn=lambda z: z):
        return fn(torch.randn(*shape, generator=g)).requires_grad_()
    act = leaf(B, T, Tn, 2, 4, fn=lambda z: z.softmax(-1))
    q, k = (leaf(B, T, Tn, C, fn=lambda z: F.normalize(z, dim=-1)) for _ in range(2))
    pw, pe, pr = (leaf(B, T, Tn, fn=torch.sigmoid) for _ in range(3))
    h0, K0 = leaf(N, 2, L, fn=lambda z: z.softmax(-1)), leaf(N, C, L, fn=torch.zeros_like)
    heads = [act, q, k, pw, pe, h0, K0]
    hr, hw = (leaf(B, T, Tn, L, fn=lambda z: z.softmax(-1)) for _ in range(2))
    tape = [hr, hw, leaf(B, T, Tn, C), pw, pe, pr, leaf(B, Tn, C, L, fn=torch.zeros_like)]
    gru = torch.nn.GRU(64, 64, batch_first=True, bidirectional=True)
    x = leaf(B, T, 64)

    def run_heads():
        nam_tm_heads(*heads, [0, 1, 2, 3], batch_major=True)[0].sum().backward()

    def run_tape_kernel():
        sum(z.sum() for z in nam_tape_scan(*tape)).backward()

    def run_tape_chunked():
        sum(z.sum() for z in nam_scan(*tape[:6], initial_state=tape[6], chunk_size=25)).backward()

    def run_gru():
        gru_module_forward(gru, x).sum().backward()
    base = "PyTorch path (MEMNETS_NATIVE=0)"
    return [_row("NAM-TM heads + key tape", cfg, base + ": TorchScript loops",
                 paired(pytorch_path(run_heads), run_heads, repeat), "C kernel nam_tm_heads.c"),
            _row("NAM-TM value tape", cfg + " read after write", "nam_scan chunked (chunk 25)",
                 paired(run_tape_chunked, run_tape_kernel, repeat), "C kernel nam_tape.c"),
            _row("NAM-TM controller", f"bidirectional GRU 64 per direction, B={B} T={T}", base + ": TorchScript loops",
                 paired(pytorch_path(run_gru), run_gru, repeat), "C kernel gru.c (products stay in PyTorch)")]


def run_cases(quick: bool = False) -> list[dict]:
    """Rows with keys model, config, baseline, baseline_ms, ours_ms, ratio (ours / baseline), note."""
    repeat = 2 if quick else 7
    return [*_lsam_cases(quick, repeat), *_packed_cases(quick, repeat), *_nam_tm_case(quick, repeat),
            *_nam_tm_piece_cases(quick, repeat)]
