"""Packed variable-length batches (``cu_seqlens``, flash-linear-attention's convention): every
entry point equals running each sequence alone, values and gradients, in float64; bad offsets
raise a ValueError naming ``cu_seqlens``."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memnets.attention import DeltaRuleAttention, LinearAttention, NAMAttention, SoftmaxAttention, fast_weight_scan
from memnets.ops import linear_attention, nam_attention, nam_attention_quadratic, nam_scan, unit
from memnets.ops import varlen
from memnets.ops.delta.fla_backend import nam_scan_fla
from memnets.ops.varlen import group_lengths

D64 = torch.float64
SCAN_IMPLS = ["reference", "chunked", "auto"]


def cu(lengths) -> torch.Tensor:
    return torch.tensor([0] + [sum(lengths[: i + 1]) for i in range(len(lengths))], dtype=torch.int32)


@contextlib.contextmanager
def pad_floor(floor: int):
    """Set the length below which sequences share one padded group (small: several groups)."""
    old = varlen.PAD_FLOOR
    varlen.PAD_FLOOR = floor
    try:
        yield
    finally:
        varlen.PAD_FLOOR = old


def scan_inputs(lengths, H=2, dk=3, dv=4, *, seed=0, with_state=True, with_pr=True, dtype=D64):
    g = torch.Generator().manual_seed(seed)
    T, N = sum(lengths), len(lengths)
    return dict(
        q=unit(torch.randn(1, T, H, dk, generator=g, dtype=dtype)),
        k=unit(torch.randn(1, T, H, dk, generator=g, dtype=dtype)),
        v=torch.randn(1, T, H, dv, generator=g, dtype=dtype),
        p_w=torch.rand(1, T, H, generator=g, dtype=dtype),
        p_e=torch.rand(1, T, H, generator=g, dtype=dtype),
        p_r=torch.rand(1, T, H, generator=g, dtype=dtype) if with_pr else None,
        initial_state=torch.randn(N, H, dv, dk, generator=g, dtype=dtype) if with_state else None,
    )


def _scan_packed(L, lengths, impl, chunk_size, same):
    return nam_scan(L["q"], L["k"], L["v"], L["p_w"], L["p_w"] if same else L["p_e"], L.get("p_r"),
                    initial_state=L.get("initial_state"), cu_seqlens=cu(lengths), impl=impl, chunk_size=chunk_size)


def _scan_alone(L, lengths, same):
    """Each sequence through the unpacked reference scan; an empty one keeps its initial state."""
    H, dv, dk = L["v"].shape[2], L["v"].shape[3], L["k"].shape[3]
    outs, finals, start = [], [], 0
    for n, ln in enumerate(lengths):
        s0 = L["initial_state"][n:n + 1] if "initial_state" in L else L["k"].new_zeros(1, H, dv, dk)
        if ln == 0:
            finals.append(s0)
            continue
        sl = slice(start, start + ln)
        pr = L["p_r"][:, sl] if "p_r" in L else None
        o, s = nam_scan(L["q"][:, sl], L["k"][:, sl], L["v"][:, sl], L["p_w"][:, sl],
                        (L["p_w"] if same else L["p_e"])[:, sl], pr, initial_state=s0, impl="reference")
        outs.append(o)
        finals.append(s)
        start += ln
    out = torch.cat(outs, 1) if outs else L["v"][:, :0]
    return out, torch.cat(finals, 0)


def _values_and_grads(fn, inputs, seed=1):
    leaves = {n: t.detach().clone().requires_grad_() for n, t in inputs.items() if t is not None}
    o, s = fn(leaves)
    g = torch.Generator().manual_seed(seed)
    loss = (o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() + \
        (s * torch.randn(s.shape, generator=g, dtype=s.dtype)).sum()
    if loss.requires_grad:  # not when every sequence is empty and no initial state is given
        loss.backward()
    return o.detach(), s.detach(), {n: t.grad for n, t in leaves.items()}


def check_scan(lengths, impl, *, chunk_size=8, same=False, seed=0, atol=1e-10, **kw):
    inputs = scan_inputs(lengths, seed=seed, **kw)
    o1, s1, g1 = _values_and_grads(lambda L: _scan_packed(L, lengths, impl, chunk_size, same), inputs)
    o2, s2, g2 = _values_and_grads(lambda L: _scan_alone(L, lengths, same), inputs)
    assert o1.shape == (1, sum(lengths)) + inputs["v"].shape[2:]
    assert s1.shape == (len(lengths),) + s2.shape[1:]
    torch.testing.assert_close(o1, o2, rtol=0, atol=atol)
    torch.testing.assert_close(s1, s2, rtol=0, atol=atol)
    for name in g2:
        if name == "p_e" and same:
            continue
        ga = torch.zeros_like(inputs[name]) if g1[name] is None else g1[name]
        gb = torch.zeros_like(inputs[name]) if g2[name] is None else g2[name]
        torch.testing.assert_close(ga, gb, rtol=0, atol=atol, msg=lambda m: f"gradient of {name}: {m}")


# ---------------------------------------------------------------------------------------- nam_scan


@pytest.mark.parametrize("impl", SCAN_IMPLS)
@pytest.mark.parametrize("lengths", [[5, 1, 12, 7], [1], [1, 1, 1], [9, 0, 3, 0], [0, 4], [3, 0], [20]],
                         ids=["mixed", "one-token", "all-length-1", "empty-inside", "empty-first", "empty-last",
                              "single"])
def test_nam_scan_packed_equals_alone(impl, lengths):
    with pad_floor(2):  # several padded groups
        check_scan(lengths, impl)


@pytest.mark.parametrize("impl", SCAN_IMPLS)
@pytest.mark.parametrize("with_state, with_pr, same", [(False, False, False), (True, True, True),
                                                        (False, True, True)])
def test_nam_scan_packed_options(impl, with_state, with_pr, same):
    check_scan([6, 2, 0, 11], impl, with_state=with_state, with_pr=with_pr, same=same, seed=3)


@pytest.mark.parametrize("impl", SCAN_IMPLS)
def test_nam_scan_packed_long_sequences_default_grouping(impl):
    # lengths around and above PAD_FLOOR = 64: groups of different padded lengths
    check_scan([150, 70, 3, 65, 0, 40], impl, chunk_size=16, H=1, dk=2, dv=2, seed=5)


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=5), impl=st.sampled_from(SCAN_IMPLS),
       chunk_size=st.sampled_from([1, 3, 8, 64]), floor=st.sampled_from([0, 3, 64]),
       with_state=st.booleans(), same=st.booleans(), seed=st.integers(0, 10_000))
def test_nam_scan_packed_property(lengths, impl, chunk_size, floor, with_state, same, seed):
    with pad_floor(floor):
        check_scan(lengths, impl, chunk_size=chunk_size, same=same, seed=seed, with_state=with_state,
                   H=1, dk=3, dv=2)


@pytest.mark.parametrize("impl", SCAN_IMPLS)
def test_nam_scan_all_empty(impl):
    inputs = scan_inputs([0, 0, 0])
    s0 = inputs["initial_state"].clone().requires_grad_()
    o, s = nam_scan(inputs["q"], inputs["k"], inputs["v"], inputs["p_w"], inputs["p_e"],
                    initial_state=s0, cu_seqlens=cu([0, 0, 0]), impl=impl)
    assert o.shape == (1, 0, 2, 4)
    torch.testing.assert_close(s, s0, rtol=0, atol=0)
    s.sum().backward()
    torch.testing.assert_close(s0.grad, torch.ones_like(s0))
    o, s = nam_scan(inputs["q"], inputs["k"], inputs["v"], 1.0, 0.5, cu_seqlens=cu([0]), impl=impl)
    assert o.shape == (1, 0, 2, 4) and s.shape == (1, 2, 4, 3) and not s.any()


def test_nam_scan_float_probabilities_and_one_sequence_equals_unpacked():
    inputs = scan_inputs([17], seed=2)
    a = nam_scan(inputs["q"], inputs["k"], inputs["v"], 0.7, 0.4, initial_state=inputs["initial_state"],
                 cu_seqlens=torch.tensor([0, 17]), impl="chunked", chunk_size=4)
    b = nam_scan(inputs["q"], inputs["k"], inputs["v"], 0.7, 0.4, initial_state=inputs["initial_state"],
                 impl="chunked", chunk_size=4)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)


def test_nam_scan_nan_stays_in_its_sequence():
    lengths = [5, 6, 4]
    inputs = scan_inputs(lengths, seed=4)
    inputs["v"][0, 7] = float("nan")  # inside the second sequence
    for impl in ("reference", "chunked"):
        o, s = nam_scan(**{n: t for n, t in inputs.items() if n != "initial_state"},
                        initial_state=inputs["initial_state"], cu_seqlens=cu(lengths), impl=impl)
        assert torch.isfinite(o[:, :5]).all() and torch.isfinite(o[:, 11:]).all(), impl
        assert torch.isfinite(s[0]).all() and torch.isfinite(s[2]).all(), impl


def test_nam_scan_under_autocast_packed():
    inputs = scan_inputs([4, 9], dtype=torch.float32)
    args = {n: t for n, t in inputs.items() if n != "initial_state"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o, s = nam_scan(**args, initial_state=inputs["initial_state"], cu_seqlens=cu([4, 9]))
    o2, s2 = nam_scan(**args, initial_state=inputs["initial_state"], cu_seqlens=cu([4, 9]))
    assert o.dtype == torch.float32 and s.shape == (2, 2, 4, 3)
    torch.testing.assert_close(o, o2)
    torch.testing.assert_close(s, s2)


# ------------------------------------------------------------------------------------ bad offsets

BAD = [
    (torch.tensor([1, 3, 8]), "start at 0"),
    (torch.tensor([0, 5, 3, 8]), "non-decreasing"),
    (torch.tensor([0, 3, 7]), "end at the packed length T = 8"),
    (torch.tensor([0, 3, 9]), "end at the packed length T = 8"),
    (torch.tensor([0.0, 3.0, 8.0]), "dtype"),
    (torch.tensor([False, True]), "dtype"),
    (torch.tensor([[0, 3, 8]]), "1-D"),
    (torch.tensor([0]), "1-D"),
    (torch.tensor(8), "1-D"),
    ([0, 3, 8], "1-D"),
]


def _entry_points():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2, 3, generator=g, dtype=D64) for _ in range(3))
    p = torch.rand(1, 8, 2, generator=g, dtype=D64)
    x = torch.randn(1, 2, 8, 3, dtype=D64)
    yield "nam_scan", lambda c: nam_scan(q, k, v, p, p, cu_seqlens=c, impl="reference")
    yield "nam_scan_fla", lambda c: nam_scan_fla(q, k, v, p, p, cu_seqlens=c, kernels={})
    yield "nam_attention", lambda c: nam_attention(x, x, x, is_causal=True, cu_seqlens=c)
    yield "nam_attention_bidir", lambda c: nam_attention(x, x, x, cu_seqlens=c)
    yield "nam_attention_quadratic", lambda c: nam_attention_quadratic(x, x, x, is_causal=True, cu_seqlens=c)
    yield "linear_attention", lambda c: linear_attention(x, x, x, True, cu_seqlens=c)
    layer = DeltaRuleAttention(8, 2).double()
    yield "DeltaRuleAttention", lambda c: layer(torch.randn(1, 8, 8, dtype=D64), cu_seqlens=c)
    nam_layer = NAMAttention(8, 2, causal=True).double()
    yield "NAMAttention", lambda c: nam_layer(torch.randn(1, 8, 8, dtype=D64), cu_seqlens=c)


@pytest.mark.parametrize("bad, match", BAD, ids=[f"{i}-{m}" for i, (_, m) in enumerate(BAD)])
def test_bad_cu_seqlens_raise_value_error_naming_it(bad, match):
    for name, fn in _entry_points():
        with pytest.raises(ValueError, match=f"`cu_seqlens`.*{match}") as info:
            fn(bad)
        assert "cu_seqlens" in str(info.value), name


def test_packed_batch_needs_batch_size_one_and_one_state_per_sequence():
    inputs = scan_inputs([3, 5])
    q2, v2 = inputs["q"].expand(2, -1, -1, -1), inputs["v"].expand(2, -1, -1, -1)
    with pytest.raises(ValueError, match="batch size 1"):
        nam_scan(q2, q2, v2, 1.0, 1.0, cu_seqlens=cu([3, 5]))
    with pytest.raises(ValueError, match=r"`initial_state` expected \[N, H, dv, dk\] = \[2, 2, 4, 3\]"):
        nam_scan(inputs["q"], inputs["k"], inputs["v"], 1.0, 1.0, initial_state=inputs["initial_state"][:1],
                 cu_seqlens=cu([3, 5]))
    with pytest.raises(ValueError, match="batch size 1"):
        DeltaRuleAttention(8, 2)(torch.randn(2, 8, 8), cu_seqlens=cu([3, 5]))
    layer = DeltaRuleAttention(8, 2)
    with pytest.raises(ValueError, match=r"`state.weights` expected \[N, H"):
        layer(torch.randn(1, 8, 8), state=layer.init_state(1), cu_seqlens=cu([3, 5]))
    x = torch.randn(1, 2, 8, 3)
    with pytest.raises(ValueError, match="same length"):
        nam_attention(x, x[..., :6, :], x[..., :6, :], cu_seqlens=cu([3, 5]))


def test_cu_seqlens_int64_and_int32_agree():
    inputs = scan_inputs([4, 6])
    args = {n: t for n, t in inputs.items() if n != "initial_state"}
    a = nam_scan(**args, initial_state=inputs["initial_state"], cu_seqlens=cu([4, 6]).long())
    b = nam_scan(**args, initial_state=inputs["initial_state"], cu_seqlens=cu([4, 6]))
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


# --------------------------------------------------------------------------------------- attention


def _attention_alone(fn, q, k, v, lengths, **kw):
    outs, start = [], 0
    for ln in lengths:
        if ln:
            sl = slice(start, start + ln)
            outs.append(fn(q[..., sl, :], k[..., sl, :], v[..., sl, :], **kw))
        start += ln
    return torch.cat(outs, -2) if outs else v.new_zeros(v.shape)


def check_attention(fn, lengths, causal, *, seed=0, chunk=True, **kw):
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    q, k, v = (torch.randn(1, 2, T, d, generator=g, dtype=D64) for d in (3, 3, 4))
    inputs = dict(q=q, k=k, v=v)
    extra = dict(chunk_size=4) if chunk else {}

    def packed(L):
        return fn(L["q"], L["k"], L["v"], causal=causal, cu_seqlens=cu(lengths), **extra, **kw), L["v"].new_zeros(1)

    def alone(L):
        return _attention_alone(fn, L["q"], L["k"], L["v"], lengths, causal=causal, **extra, **kw), L["v"].new_zeros(1)

    o1, _, g1 = _values_and_grads(packed, inputs)
    o2, _, g2 = _values_and_grads(alone, inputs)
    torch.testing.assert_close(o1, o2, rtol=0, atol=1e-10)
    for name in g2:
        torch.testing.assert_close(g1[name], g2[name], rtol=0, atol=1e-10, msg=lambda m: f"gradient of {name}: {m}")


ATTENTIONS = [nam_attention, linear_attention]


@pytest.mark.parametrize("fn", ATTENTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("lengths", [[5, 1, 13, 7], [1, 1], [6, 0, 2, 0], [9]])
def test_attention_packed_equals_alone(fn, causal, lengths):
    with pad_floor(2):
        check_attention(fn, lengths, causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_quadratic_reference_packed_equals_alone(causal):
    check_attention(nam_attention_quadratic, [5, 1, 0, 8], causal, chunk=False)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 30, 3, generator=g, dtype=D64) for _ in range(3))
    c = cu([12, 0, 1, 17])
    torch.testing.assert_close(nam_attention(q, k, v, is_causal=causal, cu_seqlens=c, scale=0.5),
                               nam_attention_quadratic(q, k, v, is_causal=causal, cu_seqlens=c, scale=0.5),
                               rtol=0, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(0, 10), min_size=1, max_size=5).filter(lambda x: sum(x) > 0),
       causal=st.booleans(), fn=st.sampled_from(ATTENTIONS), floor=st.sampled_from([0, 4, 64]),
       seed=st.integers(0, 1000))
def test_attention_packed_property(lengths, causal, fn, floor, seed):
    with pad_floor(floor):
        check_attention(fn, lengths, causal, seed=seed)


def test_attention_all_empty():
    x = torch.randn(1, 2, 0, 3)
    assert nam_attention(x, x, x, is_causal=True, cu_seqlens=cu([0, 0])).shape == (1, 2, 0, 3)


# ------------------------------------------------------------------------------------------ layers


def _layer_alone(layer, x, lengths, **kw):
    outs, start = [], 0
    for ln in lengths:
        outs.append(layer(x[:, start:start + ln], **kw))
        start += ln
    return torch.cat(outs, 1)


@pytest.mark.parametrize("make", [
    lambda: NAMAttention(8, 2, causal=True),
    lambda: NAMAttention(8, 2, causal=False, length_norm=True),
    lambda: NAMAttention(8, 2, causal=True, length_norm=True),
    lambda: LinearAttention(8, 2, causal=True),
    lambda: LinearAttention(8, 2, causal=False),
    lambda: SoftmaxAttention(8, 2, causal=True),
    lambda: SoftmaxAttention(8, 2, causal=False),
    lambda: DeltaRuleAttention(8, 2, impl="fused", chunk_size=4),
    lambda: DeltaRuleAttention(8, 2, impl="reference"),
], ids=["nam-causal", "nam-bidir-lnorm", "nam-causal-lnorm", "linear-causal", "linear-bidir",
        "softmax-causal", "softmax-bidir", "delta-fused", "delta-reference"])
def test_attention_layers_packed_equal_alone(make):
    torch.manual_seed(0)
    layer = make().double()
    lengths = [5, 1, 9, 3]
    x = torch.randn(1, sum(lengths), 8, dtype=D64, requires_grad=True)
    y1 = layer(x, cu_seqlens=cu(lengths))
    y2 = _layer_alone(layer, x, lengths)
    torch.testing.assert_close(y1, y2, rtol=0, atol=1e-10)
    cot = torch.randn_like(y1)
    g1, = torch.autograd.grad((y1 * cot).sum(), x)
    g2, = torch.autograd.grad((y2 * cot).sum(), x)
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-10)


def test_layers_packed_with_a_key_mask():
    torch.manual_seed(1)
    lengths = [6, 4]
    x = torch.randn(1, 10, 8, dtype=D64)
    mask = torch.ones(1, 10, dtype=torch.bool)
    mask[0, [2, 7]] = False
    for layer in (NAMAttention(8, 2, causal=True, length_norm=True), LinearAttention(8, 2, causal=False),
                  SoftmaxAttention(8, 2, causal=True), DeltaRuleAttention(8, 2)):
        layer = layer.double()
        y1 = layer(x, mask=mask, cu_seqlens=cu(lengths))
        y2 = torch.cat([layer(x[:, :6], mask=mask[:, :6]), layer(x[:, 6:], mask=mask[:, 6:])], 1)
        torch.testing.assert_close(y1, y2, rtol=0, atol=1e-10, msg=lambda m: f"{type(layer).__name__}: {m}")


def test_delta_layer_packed_states_per_sequence():
    torch.manual_seed(2)
    layer = DeltaRuleAttention(8, 2, chunk_size=4).double()
    lengths = [7, 0, 3]
    x = torch.randn(1, 10, 8, dtype=D64)
    w0 = torch.randn(3, 2, 4, 4, dtype=D64) * 0.1
    y, st_ = layer(x, state=w0, return_state=True, cu_seqlens=cu(lengths))
    assert st_.weights.shape == (3, 2, 4, 4)
    y0, s0 = layer(x[:, :7], state=w0[:1], return_state=True)
    y2, s2 = layer(x[:, 7:], state=w0[2:], return_state=True)
    torch.testing.assert_close(y, torch.cat([y0, y2], 1), rtol=0, atol=1e-10)
    torch.testing.assert_close(st_.weights, torch.cat([s0.weights, w0[1:2], s2.weights]), rtol=0, atol=1e-10)


def test_fast_weight_scan_packed():
    g = torch.Generator().manual_seed(0)
    lengths = [4, 8]
    q, k, v = (torch.randn(1, 12, 2, 3, generator=g, dtype=D64) for _ in range(3))
    beta = torch.rand(1, 12, 2, generator=g, dtype=D64)
    y, w = fast_weight_scan(q, k, v, beta, cu_seqlens=cu(lengths), chunk_size=4)
    ya, wa = fast_weight_scan(q[:, :4], k[:, :4], v[:, :4], beta[:, :4])
    yb, wb = fast_weight_scan(q[:, 4:], k[:, 4:], v[:, 4:], beta[:, 4:])
    torch.testing.assert_close(y, torch.cat([ya, yb], 1), rtol=0, atol=1e-10)
    torch.testing.assert_close(w, torch.cat([wa, wb]), rtol=0, atol=1e-10)


# -------------------------------------------------------------------------------- fla pass-through


def _fla_like_kernels(seen: list):
    """fla's kernel signatures with ``cu_seqlens``, written from fla's documented recurrences in
    fla's layout (state ``[N, H, K, V]``, inputs ``[1, T, H, D]``), one sequence at a time."""

    def run(q, k, v, scale, initial_state, cu_seqlens, update):
        assert cu_seqlens is not None and cu_seqlens.dtype == torch.long and q.shape[0] == 1
        seen.append(cu_seqlens)
        offs = cu_seqlens.tolist()
        H, K, V = k.shape[2], k.shape[3], v.shape[3]
        outs, finals = [], []
        for n in range(len(offs) - 1):
            S = (initial_state[n] if initial_state is not None else k.new_zeros(H, K, V)).to(q.dtype)
            for t in range(offs[n], offs[n + 1]):
                S = update(S, t)
                outs.append(torch.einsum("hkv,hk->hv", S, q[0, t] * scale))
            finals.append(S)
        return torch.stack(outs)[None], torch.stack(finals)

    def delta(q, k, v, beta, scale, initial_state, output_final_state, cu_seqlens=None, **kw):
        def update(S, t):  # S + k (β (v − Sᵀ k))ᵀ
            u = beta[0, t, :, None] * (v[0, t] - torch.einsum("hkv,hk->hv", S, k[0, t]))
            return S + k[0, t, :, :, None] * u[:, None, :]
        return run(q, k, v, scale, initial_state, cu_seqlens, update)

    def iplr(q, k, v, a, b, scale, initial_state, output_final_state, cu_seqlens=None, gk=None, **kw):
        assert gk is None or not gk.any()

        def update(S, t):  # (I + b aᵀ) S + k vᵀ
            S = S + b[0, t, :, :, None] * torch.einsum("hk,hkv->hv", a[0, t], S)[:, None, :]
            return S + k[0, t, :, :, None] * v[0, t, :, None, :]
        return run(q, k, v, scale, initial_state, cu_seqlens, update)

    return {"delta_chunk": delta, "delta_recurrent": delta, "general_chunk": iplr, "general_recurrent": iplr}


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("same", [True, False], ids=["pe=pw", "pe!=pw"])
def test_fla_backend_passes_cu_seqlens(mode, same):
    lengths = [4, 0, 7, 1]
    inputs = scan_inputs(lengths, seed=7, dtype=torch.float32)
    seen: list = []
    kernels = _fla_like_kernels(seen)

    def fla(L):
        pe = L["p_w"] if same else L["p_e"]
        return nam_scan_fla(L["q"], L["k"], L["v"], L["p_w"], pe, L["p_r"], L["initial_state"], delta=same,
                            mode=mode, kernels=kernels, cu_seqlens=cu(lengths))

    o1, s1, g1 = _values_and_grads(fla, inputs)
    o2, s2, g2 = _values_and_grads(lambda L: _scan_alone(L, lengths, same), inputs)
    assert [c.tolist() for c in seen] == [[0, 4, 4, 11, 12]]
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-5)
    for name in g2:
        if name == "p_e" and same:
            continue
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-4, atol=1e-5, msg=lambda m: f"gradient of {name}: {m}")


FLA_CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
import triton.runtime.autotuner as autotuner
if not hasattr(autotuner.Autotuner, "_bench"):
    print(json.dumps({"skip": "this triton's Autotuner has no _bench to bypass"}))
    sys.exit(0)
autotuner.Autotuner._bench = lambda self, *args, config=None, **kw: [0.0, 0.0, 0.0]
from memnets.ops import nam_scan, unit
from memnets.ops.delta.fla_backend import fla_kernels, nam_scan_fla
fla_kernels()
g = torch.Generator().manual_seed(0)
lengths = [3, 0, 5, 1]
T, N, H, dk, dv = sum(lengths), len(lengths), 1, 8, 4
cu = torch.tensor([0, 3, 3, 8, 9])
base = dict(q=unit(torch.randn(1, T, H, dk, generator=g)), k=unit(torch.randn(1, T, H, dk, generator=g)),
            v=torch.randn(1, T, H, dv, generator=g), p_w=torch.rand(1, T, H, generator=g),
            p_e=torch.rand(1, T, H, generator=g), p_r=torch.rand(1, T, H, generator=g),
            state=torch.randn(N, H, dv, dk, generator=g))
co, cs = torch.randn(1, T, H, dv, generator=g), torch.randn(N, H, dv, dk, generator=g)
report = {}
for same in (True, False):
    res = []
    for fla in (False, True):
        L = {n: t.clone().requires_grad_() for n, t in base.items()}
        pe = L["p_w"] if same else L["p_e"]
        if fla:
            o, s = nam_scan_fla(L["q"], L["k"], L["v"], L["p_w"], None if same else pe, L["p_r"], L["state"],
                                mode="recurrent", cu_seqlens=cu)
        else:
            o, s = nam_scan(L["q"], L["k"], L["v"], L["p_w"], pe, L["p_r"], initial_state=L["state"],
                            cu_seqlens=cu, impl="reference")
        ((o * co).sum() + (s * cs).sum()).backward()
        res.append((o.detach(), s.detach(), {n: t.grad for n, t in L.items() if not (same and n == "p_e")}))
    (o1, s1, g1), (o2, s2, g2) = res
    err = {"out": (o2 - o1).abs().max().item(), "state": (s2 - s1).abs().max().item(), "shape": list(s2.shape)}
    for n, gr in g1.items():
        err["d" + n] = None if g2.get(n) is None else (g2[n] - gr).abs().max().item()
    report["pe=pw" if same else "pe!=pw"] = err
print(json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("fla", "triton", "numpy", "einops")),
                    reason="needs fla, triton, numpy and einops (pip install 'memnets[gpu]' numpy)")
def test_fla_recurrent_kernels_take_cu_seqlens():
    """fla's own step-by-step kernels (Triton's interpreter on the CPU, as tests/test_fla_interpret.py)
    on a packed batch with an empty sequence equal the packed reference scan, values and gradients."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(root / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, "-c", FLA_CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    for case, err in report.items():
        assert err.pop("shape") == [4, 1, 4, 8], case  # [N, H, dv, dk]: one final state per sequence
        missing = [n for n, e in err.items() if e is None]
        assert not missing, f"{case}: no gradient reached {missing} through fla's kernels"
        assert max(err.values()) < 2e-5, (case, err)


# -------------------------------------------------------------------------------------- grouping


@settings(deadline=None)
@given(lengths=st.lists(st.integers(0, 300), min_size=1, max_size=12), floor=st.sampled_from([0, 1, 16, 64]))
def test_group_lengths_cover_each_sequence_once_with_bounded_padding(lengths, floor):
    groups = group_lengths(lengths, floor)
    ids = sorted(n for g, _ in groups for n in g)
    assert ids == list(range(len(lengths)))
    for g, L in groups:
        assert L == max(lengths[n] for n in g)
        if L > floor:
            assert all(2 * lengths[n] > L for n in g)  # padding under 2x the real tokens
    assert len(groups) <= max(1, (max(lengths) // max(floor, 1)).bit_length() + 2)
