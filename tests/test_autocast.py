"""Every model under CPU bfloat16 autocast: forward and backward run, gradients are finite and
within bf16 tolerance of float32 (the fast recurrences run in float32 inside autocast,
memnets.ops._amp); and `memnets train ... amp=bf16` trains every backbone on the CPU."""
from __future__ import annotations

import json
import math

import pytest
import torch

import memnets
from memnets.models.seq import BACKBONES, SIZES, backbone_available
from memnets.ops import nam_scan, unit
from memnets.ops._amp import autocast_device, float32_under_autocast, to_float32
from memnets.train import ModelConfig, OptimConfig, RunConfig, TaskConfig, train

B, T, D = 3, 12, 16


def _seq(g):
    return (torch.randn(B, T, D, generator=g),)


# name -> (constructor kwargs, inputs from a generator, output of the forward -> tensor)
CASES = {
    "attn_delta": (dict(d_model=D, num_heads=2), _seq, lambda o: o),
    "attn_linear": (dict(d_model=D, num_heads=2), _seq, lambda o: o),
    "attn_nam": (dict(d_model=D, num_heads=2), _seq, lambda o: o),
    "attn_softmax": (dict(d_model=D, num_heads=2), _seq, lambda o: o),
    "conv4": (dict(hidden=8, blocks=2), lambda g: (torch.randn(2, 1, 28, 28, generator=g),), lambda o: o),
    "cosine_classifier": (dict(feature_dim=D, num_base_classes=5), lambda g: (torch.randn(B, D, generator=g),),
                          lambda o: o),
    "nam_fewshot": (dict(feature_dim=D, num_base_classes=5, hidden=32), lambda g: (torch.randn(B, D, generator=g),),
                    lambda o: o),
    "dnc": (dict(input_size=D, output_size=D, memory_slots=8, word_size=8, read_heads=2, controller_size=16),
            _seq, lambda o: o[0]),
    "ntm": (dict(input_size=D, output_size=D, memory_slots=8, word_size=8, controller_size=16), _seq,
            lambda o: o[0]),
    "fast_weights": (dict(input_size=D, num_heads=2), _seq, lambda o: o[0]),
    "lsam": (dict(input_size=D, hidden_size=16, num_heads=4, num_layers=2, bidirectional=True), _seq,
             lambda o: o[0]),
    "lsam_encdec": (dict(d_model=D, num_heads=4, dim_feedforward=32, dropout=0.0), _seq,
                    lambda o: o[0] if isinstance(o, tuple) else o),
    "lstm_attention": (dict(d_model=D, num_layers=2), _seq, lambda o: o),
    "memn2n": (dict(vocab_size=20, embedding_dim=D, hops=2, memory_size=6, sentence_size=5),
               lambda g: (torch.randint(1, 20, (B, 6, 5), generator=g), torch.randint(1, 20, (B, 5), generator=g)),
               lambda o: o[0] if isinstance(o, tuple) else o),
    "nam_tm": (dict(input_size=D, hidden_size=16, num_tapes=2, tape_length=8), _seq, lambda o: o[0]),
    "seq": (dict(backbone="lsam_encdec", vocab_size=10, d_model=16, num_heads=4, dim_feedforward=32),
            lambda g: (torch.randint(0, 10, (B, T), generator=g),), lambda o: o),
    "transformer": (dict(d_model=D, num_layers=2, num_heads=2, dim_feedforward=32), _seq, lambda o: o),
    "universal_transformer": (dict(d_model=D, num_heads=2, num_steps=2, dim_feedforward=32), _seq, lambda o: o),
}


def test_every_registered_model_has_an_autocast_case():
    names = {n for n in memnets.available_models() if not n.startswith("_test")}
    assert names - set(CASES) == set(), f"add these models to CASES: {sorted(names - set(CASES))}"


def _grads(name, amp: bool, backward_inside: bool = False):
    kw, make, pick = CASES[name]
    torch.manual_seed(0)
    model = memnets.build_model(name, **kw)
    model.train(False)  # no dropout: the two passes must see the same function
    inputs = make(torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        out = pick(model(*inputs))
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        loss = (out.float() * w).sum()
        if backward_inside:
            loss.backward()
    if not backward_inside:
        loss.backward()
    return out.detach().float(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_inside_the_autocast_region(name):
    """``loss.backward()`` called inside ``with torch.autocast(...)`` works for every model and
    gives the gradients of a backward called after it, up to bfloat16 rounding (PyTorch's own
    backward ops then run in the autocast dtype): the hand-written backward passes run with
    autocast off, as their forwards did (memnets.ops._amp.backward_without_autocast)."""
    out, grads = _grads(name, amp=True)
    out_in, grads_in = _grads(name, amp=True, backward_inside=True)
    torch.testing.assert_close(out_in, out, rtol=0, atol=0)
    assert grads_in.keys() == grads.keys()
    for n in grads:
        if grads[n] is None:
            assert grads_in[n] is None, n
        else:
            err = (grads_in[n] - grads[n]).norm() / grads[n].norm().clamp_min(1e-12)
            assert err < 3e-2, f"{n}: relative difference {err:.3g}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_bf16_autocast_forward_backward_matches_float32(name):
    out32, g32 = _grads(name, amp=False)
    out16, g16 = _grads(name, amp=True)
    assert torch.isfinite(out16).all()
    rel = ((out16 - out32).norm() / out32.norm().clamp_min(1e-6)).item()
    assert rel < 0.05, f"{name}: output differs from float32 by {rel:.3f} (relative norm)"
    assert g32.keys() == g16.keys()
    num = den = 0.0
    for n, a in g32.items():
        b = g16[n]
        if a is None:
            assert b is None, n
            continue
        assert b is not None and torch.isfinite(b).all(), f"{name}.{n}: gradient missing or not finite"
        num += (b.float() - a).norm().item() ** 2
        den += a.norm().item() ** 2
    rel = math.sqrt(num / max(den, 1e-30))
    # bf16 keeps 8 bits of mantissa (relative rounding 2^-9 ≈ 0.002); a few layers of it
    assert rel < 0.1, f"{name}: gradients differ from float32 by {rel:.3f} (relative norm over all parameters)"


def test_nam_scan_chunked_under_autocast_is_float32_and_matches_reference():
    g = torch.Generator().manual_seed(0)
    Bq, Tq, H, d = 2, 70, 2, 8  # T > chunk: several chunks
    q, k = (unit(torch.randn(Bq, Tq, H, d, generator=g)) for _ in range(2))
    v = torch.randn(Bq, Tq, H, d, generator=g)
    pw, pe = torch.rand(Bq, Tq, H, generator=g), torch.rand(Bq, Tq, H, generator=g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, pw, pe)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lin = torch.nn.Linear(d, d)  # an autocast op first: its output is bfloat16
        vb = lin(leaves[2])
        assert vb.dtype == torch.bfloat16
        out, state = nam_scan(leaves[0], leaves[1], vb, leaves[3], leaves[4], impl="chunked", chunk_size=16)
    assert out.dtype == torch.float32 and state.dtype == torch.float32
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)
    with torch.no_grad():
        ref, ref_state = nam_scan(q, k, vb.detach().float(), pw, pe, impl="reference")
    torch.testing.assert_close(out.detach(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state.detach(), ref_state, atol=1e-4, rtol=1e-4)


def test_float32_region_helper():
    x16 = torch.randn(3, dtype=torch.bfloat16)
    assert autocast_device(x16) is None  # autocast off
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_device(x16) == "cpu"
        assert autocast_device(x16, torch.zeros(1, dtype=torch.float64)) is None  # float64 runs as given

        @float32_under_autocast
        def f(a, pair):
            assert not torch.is_autocast_enabled("cpu")
            return a.dtype, pair[0].dtype, pair[1]

        assert f(x16, (x16, 3)) == (torch.float32, torch.float32, 3)
    st = memnets.memories.lsam.LSAMState(x16, x16)
    assert all(t.dtype == torch.float32 for t in to_float32(st)) and isinstance(to_float32(st), type(st))


def test_lsam_and_dnc_keep_their_state_across_calls_under_autocast():
    lsam = memnets.LSAM(D, 16, num_heads=4)
    dnc = memnets.DNC(D, D, memory_slots=8, word_size=8, read_heads=2, controller_size=16)
    x = torch.randn(B, T, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        xb = torch.nn.Linear(D, D)(x)  # bfloat16 input, as after any autocast projection
        for m in (lsam, dnc):
            y, st = m(xb)
            y2, st2 = m(xb, st)  # the state comes back in, float32
            assert y2.dtype == torch.float32 and torch.isfinite(y2).all()
            assert all(t.dtype == torch.float32 for t in torch.utils._pytree.tree_leaves(st2))


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
def test_memnets_train_amp_bf16_on_cpu_trains_every_backbone(tmp_path, backbone):
    if not backbone_available(backbone):
        pytest.skip(f"backbone {backbone} needs an optional package")
    tiny = dict(SIZES["tiny"][backbone])
    cfg = RunConfig(name="amp", epochs=1, batch_size=8, log_every=1, threads=1, amp="bf16",
                    model=ModelConfig(backbone, tiny.pop("d_model"), tiny),
                    task=TaskConfig(name="reduce", train_digits=(1, 3), train_size=16, eval_size=8,
                                    splits={"id": (2, 3), "od_easy": (4, 4), "od_hard": (5, 5)}),
                    optim=OptimConfig(lr=3e-3))
    res = train(cfg, tmp_path / "run", quiet=True)
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["autocast"] == "bfloat16"
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in recs if r["kind"] == "train"]
    assert res["steps"] == 2 and len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert all(0.0 <= s["tok_acc"] <= 1.0 for s in res["splits"].values())
