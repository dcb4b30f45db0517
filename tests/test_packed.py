"""Recurrent memories on ``torch.nn.utils.rnn.PackedSequence`` batches (memnets.memories.packed):
every module equals running each sequence alone over its own length from its own initial state,
outputs, final states and every gradient, in float64; packed in either order (sorted or not)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pack_sequence

from memnets import DNC, LSAM, NTM, NAMTuringMachine
from memnets.memories.fast_weights import FastWeightMemory
from memnets.memories.packed import reverse_within, run_segments, segments
from memnets.state import map_state

D64 = torch.float64
LENGTHS = [3, 7, 1, 7, 5]  # unsorted, a repeated length, a length of one

# name -> (build(input_size), state batch dim)
MODULES = {
    "lsam": (lambda n: LSAM(n, 8, 2), 1),
    "lsam-bi-2layers": (lambda n: LSAM(n, 8, 4, num_layers=2, bidirectional=True), 1),
    "lsam-bi-reference": (lambda n: LSAM(n, 8, 2, bidirectional=True, impl="reference"), 1),
    "lsam-time-major": (lambda n: LSAM(n, 8, 2, batch_first=False), 1),
    "ntm": (lambda n: NTM(n, 3, memory_slots=6, word_size=4, controller_size=8), 0),
    "dnc": (lambda n: DNC(n, 3, memory_slots=5, word_size=4, read_heads=2, controller_size=8), 0),
    "dnc-2layers": (lambda n: DNC(n, 3, memory_slots=5, word_size=4, read_heads=2, controller_size=8,
                                  controller_layers=2), 0),
    "dnc-reference": (lambda n: DNC(n, 3, memory_slots=5, word_size=4, read_heads=2, controller_size=8,
                                    impl="reference"), 0),
    "nam-tm": (lambda n: NAMTuringMachine(n, 8, num_tapes=2, tape_length=5), 1),
    "nam-tm-2layers-lstm-all": (lambda n: NAMTuringMachine(n, 8, num_tapes=2, tape_length=5, num_layers=2,
                                                            controller="lstm", normalize_heads="all",
                                                            separate_erase=True), 1),
    "nam-tm-transposed-keys-uni": (lambda n: NAMTuringMachine(n, 8, num_tapes=2, tape_length=5,
                                                              bidirectional_controller=False,
                                                              key_tape_mode="transposed"), 1),
    "nam-tm-no-jump-reference": (lambda n: NAMTuringMachine(n, 8, num_tapes=2, tape_length=5, impl="reference",
                                                            actions=("LEFT", "NOOP", "RIGHT")), 1),
    "fast-weights": (lambda n: FastWeightMemory(n, num_heads=2, key_size=4, value_size=4, output_size=6), 0),
    "fast-weights-sum-dpfp": (lambda n: FastWeightMemory(n, num_heads=2, key_size=4, value_size=4, output_size=6,
                                                         update_rule="sum", feature_map="dpfp1"), 0),
}


def _module(name: str, n: int = 4, seed: int = 0) -> tuple[torch.nn.Module, int]:
    torch.manual_seed(seed)
    build, dim = MODULES[name]
    return build(n).double(), dim


def _alone(module, seqs, states, dim):
    """Each sequence run by itself (batch of one) from its own state: outputs, final states."""
    ys, finals = [], []
    for b, x in enumerate(seqs):
        st_b = None if states is None else map_state(lambda s: s.narrow(dim, b, 1), states)
        xb = x[None] if getattr(module, "batch_first", True) else x[:, None]
        y, fin = module(xb, st_b)[:2]
        ys.append(y[0] if getattr(module, "batch_first", True) else y[:, 0])
        finals.append(fin)
    cat = lambda parts: (torch.cat(parts, dim) if isinstance(parts[0], torch.Tensor)
                         else type(parts[0])(*(cat(list(p)) for p in zip(*parts))))
    return ys, cat(finals)


def _leaves(state) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    map_state(out.append, state)
    return out


@pytest.mark.parametrize("sorted_", [False, True], ids=["unsorted", "sorted"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_packed_equals_each_sequence_alone(name, with_state, sorted_):
    module, dim = _module(name)
    lengths = sorted(LENGTHS, reverse=True) if sorted_ else LENGTHS
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randn(L, 4, generator=g, dtype=D64, requires_grad=True) for L in lengths]
    states = None
    if with_state:  # a state worth carrying: the module's own after a random prefix
        prefix = torch.randn(len(lengths), 3, 4, generator=g, dtype=D64)
        if not getattr(module, "batch_first", True):
            prefix = prefix.transpose(0, 1)
        states = map_state(lambda s: s.detach().requires_grad_(), module(prefix)[1])
    packed = pack_sequence(seqs, enforce_sorted=sorted_)
    y, final = module(packed, states)
    assert isinstance(y, torch.nn.utils.rnn.PackedSequence)
    assert torch.equal(y.batch_sizes, packed.batch_sizes)
    ys, finals = _alone(module, seqs, states, dim)
    padded, out_lengths = pad_packed_sequence(y, batch_first=True)
    assert out_lengths.tolist() == lengths
    for b, L in enumerate(lengths):
        torch.testing.assert_close(padded[b, :L], ys[b], rtol=1e-10, atol=1e-10)
        assert not padded[b, L:].any()
    for got, want in zip(_leaves(final), _leaves(finals)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)

    # gradients: a loss over every output and every final state
    g2 = torch.Generator().manual_seed(2)
    w_out = torch.randn(padded.shape, generator=g2, dtype=D64)
    w_fin = [torch.randn(t.shape, generator=g2, dtype=D64) for t in _leaves(final)]
    inputs = [*seqs, *module.parameters(), *([] if states is None else _leaves(states))]

    def loss(outs, fins):
        return sum((o * w_out[b, :o.shape[0]]).sum() for b, o in enumerate(outs)) + sum(
            (f * w).sum() for f, w in zip(_leaves(fins), w_fin))

    got = torch.autograd.grad(loss([padded[b, :L] for b, L in enumerate(lengths)], final), inputs,
                              allow_unused=True)
    want = torch.autograd.grad(loss(ys, finals), inputs, allow_unused=True)
    for a, b in zip(got, want):
        if b is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_packed_dnc_runs_its_recurrence_once(monkeypatch):
    """On the CPU's fused path a packed batch is one call of the whole-sequence recurrence over
    the padded batch (each sequence's final state taken at its own end), not one per length;
    the per-step reference path goes stretch by stretch."""
    from memnets.ops.dnc import recurrence

    calls = []
    apply = recurrence.DNCRecurrence.apply
    monkeypatch.setattr(recurrence.DNCRecurrence, "apply", lambda *a: calls.append(a[0]) or apply(*a))
    module, _ = _module("dnc")
    seqs = [torch.randn(L, 4, dtype=D64) for L in LENGTHS]
    y, _ = module(pack_sequence(seqs, enforce_sorted=False))
    assert len(calls) == 1 and calls[0][2].tolist() == sorted(LENGTHS, reverse=True)
    y.data.sum().backward()
    calls.clear()
    reference, _ = _module("dnc-reference")
    reference(pack_sequence(seqs, enforce_sorted=False))
    assert not calls


@pytest.mark.parametrize("lengths", [torch.tensor([0, 2]), torch.tensor([3, 4]),
                                     torch.tensor([2, 2], dtype=torch.int32)])
def test_dnc_recurrence_checks_its_lengths(lengths):
    """Lengths outside 1..T or of another dtype are refused before any step runs."""
    from memnets.ops.dnc.recurrence import DNCRecurrence

    x = torch.randn(2, 3, 4, dtype=D64)
    with pytest.raises(ValueError, match="`lengths` expected"):
        DNCRecurrence.apply((2, 4, lengths), x, *[torch.zeros(1)] * 14)


def test_packed_lsam_is_a_drop_in_for_lstm_packing():
    """The torch.nn.LSTM recipe unchanged: pad, pack_padded_sequence(enforce_sorted=False), run,
    pad_packed_sequence; the final state is read per sequence in the batch's own order."""
    torch.manual_seed(0)
    lsam = LSAM(4, 8, 2, bidirectional=True).double()
    lengths = torch.tensor([2, 6, 4])
    x = torch.randn(3, 6, 4, dtype=D64)
    x_junk = x.clone()
    for b, L in enumerate(lengths.tolist()):
        x_junk[b, L:] = 1e6  # whatever sits in the padding must not matter
    y, state = lsam(pack_padded_sequence(x_junk, lengths, batch_first=True, enforce_sorted=False))
    out, _ = pad_packed_sequence(y, batch_first=True)
    for b, L in enumerate(lengths.tolist()):
        y_b, s_b = lsam(x[b:b + 1, :L])
        torch.testing.assert_close(out[b:b + 1, :L], y_b)
        torch.testing.assert_close(state.h[:, b:b + 1], s_b.h)
        torch.testing.assert_close(state.memory[:, b:b + 1], s_b.memory)


def test_the_padded_forward_differs_where_packing_matters():
    """Why packing is needed: run padded, the backward direction starts in the padding."""
    torch.manual_seed(0)
    lsam = LSAM(4, 8, 2, bidirectional=True).double()
    x = torch.randn(2, 5, 4, dtype=D64)
    x[1, 3:] = 0
    lengths = torch.tensor([5, 3])
    padded, _ = lsam(x)
    packed, _ = pad_packed_sequence(lsam(pack_padded_sequence(x, lengths, batch_first=True))[0], batch_first=True)
    torch.testing.assert_close(packed[0], padded[0])  # full length: the same
    assert not torch.allclose(packed[1, :3, 4:], padded[1, :3, 4:])  # the backward half differs


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=6))
def test_segments_cover_time_and_reverse_is_an_involution(lengths):
    lengths = sorted(lengths, reverse=True)
    packed = pack_sequence([torch.zeros(L, 1) for L in lengths])
    segs = segments(packed.batch_sizes)
    assert segs[0][0] == 0 and segs[-1][1] == max(lengths)
    assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
    assert all(b == sum(L > t for L in lengths) for t0, t1, b in segs for t in range(t0, t1))
    x = torch.randn(len(lengths), max(lengths), 2)
    L = torch.tensor(lengths)
    torch.testing.assert_close(reverse_within(reverse_within(x, L), L), x)
    r = reverse_within(x, L)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(r[b, :n], x[b, :n].flip(0))
        torch.testing.assert_close(r[b, n:], x[b, n:])


def test_run_segments_rejects_a_batch_of_another_shape():
    packed = pack_sequence([torch.zeros(3, 1), torch.zeros(2, 1)])
    with pytest.raises(ValueError, match="`x` expected batch 2 and time 3"):
        run_segments(lambda x, s: (x, s), torch.zeros(3, 3, 1), packed.batch_sizes)


def test_packed_errors_name_the_argument():
    packed = pack_sequence([torch.zeros(3, 4, dtype=D64), torch.zeros(2, 4, dtype=D64)])
    dnc, _ = _module("dnc")
    with pytest.raises(ValueError, match="`return_aux` needs a padded tensor"):
        dnc(packed, return_aux=True)
    fw, _ = _module("fast-weights")
    with pytest.raises(ValueError, match="`mask` goes with a padded tensor"):
        fw(packed, mask=torch.ones(2, 3, dtype=torch.bool))
    lsam, _ = _module("lsam")
    with pytest.raises(ValueError, match=r"`x.data`"):
        lsam(pack_sequence([torch.zeros(3, 5, dtype=D64)]))
    with pytest.raises(ValueError, match=r"state.memory"):
        lsam(packed, lsam.init_state(3))
    tm = NAMTuringMachine(4, 8, num_tapes=2, actions=("LEFT", "RIGHT", "JUMP")).double()
    with pytest.raises(ValueError, match="needs the NOOP action"):
        tm(packed)
    with pytest.raises(ValueError, match="`return_aux` needs a padded tensor"):
        NAMTuringMachine(4, 8, num_tapes=2).double()(packed, return_aux=True)


def test_packed_lsam_trains():
    """A packed bidirectional LSAM learns to tell each sequence's length parity from its final
    states alone (needs the state at each sequence's own end)."""
    torch.manual_seed(0)
    lsam = LSAM(2, 16, 4, bidirectional=True)
    head = torch.nn.Linear(16, 2)
    opt = torch.optim.Adam([*lsam.parameters(), *head.parameters()], lr=1e-2)
    g = torch.Generator().manual_seed(0)

    def batch(n=32):
        lengths = torch.randint(1, 9, (n,), generator=g)
        seqs = [torch.cat([torch.ones(L, 1), torch.randn(L, 1, generator=g) * 0.1], 1) for L in lengths.tolist()]
        return pack_sequence(seqs, enforce_sorted=False), lengths % 2

    for _ in range(150):
        x, yb = batch()
        _, s = lsam(x)
        loss = torch.nn.functional.cross_entropy(head(torch.cat([s.h[0], s.h[1]], -1)), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, yb = batch(256)
    with torch.no_grad():
        _, s = lsam(x)
        acc = (head(torch.cat([s.h[0], s.h[1]], -1)).argmax(-1) == yb).float().mean().item()
    assert acc > 0.9, acc


def test_lsam_takes_an_unbatched_sequence_and_its_state_back():
    """As torch.nn.LSTM: ``x [T, input_size]`` (either ``batch_first``) gives ``[T, D]`` and a
    state without the batch dim, equal to the batch of one; the state continues the sequence."""
    for batch_first in (True, False):
        torch.manual_seed(0)
        lsam = LSAM(4, 8, 4, num_layers=2, bidirectional=True, batch_first=batch_first, dtype=D64)
        assert all(p.dtype == D64 for p in lsam.parameters())
        x = torch.randn(6, 4, dtype=D64)
        y, s = lsam(x)
        yb, sb = lsam(x[None] if batch_first else x[:, None])
        torch.testing.assert_close(y, yb[0] if batch_first else yb[:, 0])
        assert s.memory.shape == (4, 2, 2, 2) and s.h.shape == (4, 4)
        torch.testing.assert_close(s.memory, sb.memory[:, 0])
        y2, _ = lsam(x[:3], lsam(x[3:], s)[1])  # a state of its own taken back
        assert y2.shape == (3, 8)
    with pytest.raises(ValueError, match=r"`x` expected \[T, input_size\] = \[\?, 4\]"):
        lsam(torch.randn(6, 5, dtype=D64))


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5),
       st.sampled_from(["lsam-bi-2layers", "dnc", "fast-weights", "nam-tm"]))
def test_packed_equals_alone_for_any_lengths(lengths, name):
    module, dim = _module(name)
    g = torch.Generator().manual_seed(len(lengths))
    seqs = [torch.randn(L, 4, generator=g, dtype=D64) for L in lengths]
    y, final = module(pack_sequence(seqs, enforce_sorted=False))
    out, _ = pad_packed_sequence(y, batch_first=True)
    ys, finals = _alone(module, seqs, None, dim)
    for b, L in enumerate(lengths):
        torch.testing.assert_close(out[b, :L], ys[b], rtol=1e-10, atol=1e-10)
    for got, want in zip(_leaves(final), _leaves(finals)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
