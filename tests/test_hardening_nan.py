"""NaN locality: a NaN or Inf at step t reaches no output before t, in every implementation of
nam_scan and in causal nam_attention / linear_attention, as in the step-by-step recurrence;
and the attention's edge arguments (empty sequences, bad chunk sizes) get clear errors."""
import pytest
import torch

from memnets.ops import nam_attention, nam_scan
from memnets.ops.attention import linear_attention, nam_attention_quadratic
from memnets.ops.delta import IMPLS, supports
from memnets.ops.nam import unit

D64 = torch.float64


def _scan_inputs(B, T, H, dk, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = unit(torch.randn(B, T, H, dk, generator=g, dtype=D64))
    k = unit(torch.randn(B, T, H, dk, generator=g, dtype=D64))
    v = torch.randn(B, T, H, dv, generator=g, dtype=D64)
    pw, pe, pr = (torch.rand(B, T, H, generator=g, dtype=D64) for _ in range(3))
    return {"q": q, "k": k, "v": v, "p_w": pw, "p_e": pe, "p_r": pr}


def _impls():
    x = torch.zeros(1, 8, 1, 2, dtype=D64)
    return ["auto"] + [i for i in IMPLS if not supports(i, x)]


@pytest.mark.parametrize("impl", _impls())
@pytest.mark.parametrize("name", ["k", "v", "p_w", "p_e", "q", "p_r"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("T,chunk", [(8, 64), (40, 16)])
def test_nam_scan_nonfinite_at_t_leaves_earlier_outputs_finite(impl, name, bad, T, chunk):
    x = _scan_inputs(3, T, 2, 4, 3)
    t0, t1 = 5, T - 3  # sequence 0 goes bad at t0, sequence 1 at t1, sequence 2 stays clean
    x[name] = x[name].clone()
    x[name][0, t0, 1] = bad
    x[name][1, t1, 0] = bad
    ref, _ = nam_scan(x["q"], x["k"], x["v"], x["p_w"], x["p_e"], x["p_r"], impl="reference")
    o, _ = nam_scan(x["q"], x["k"], x["v"], x["p_w"], x["p_e"], x["p_r"], impl=impl, chunk_size=chunk)
    assert torch.isfinite(o[0, :t0]).all() and torch.isfinite(o[1, :t1]).all() and torch.isfinite(o[2]).all()
    torch.testing.assert_close(o[0, :t0], ref[0, :t0])
    torch.testing.assert_close(o[1, :t1], ref[1, :t1])
    torch.testing.assert_close(o[2], ref[2])
    assert not torch.isfinite(o[0, t0]).all()  # and the bad step itself is not hidden


def test_nam_scan_nonfinite_in_packed_sequences_stays_in_its_sequence():
    x = _scan_inputs(1, 30, 2, 4, 3)
    x["k"] = x["k"].clone()
    x["k"][0, 17, 0] = float("nan")  # the second sequence, [10, 30), from step 17 on
    cu = torch.tensor([0, 10, 30])
    o, _ = nam_scan(x["q"], x["k"], x["v"], x["p_w"], x["p_e"], x["p_r"], cu_seqlens=cu, impl="chunked",
                    chunk_size=8)
    assert torch.isfinite(o[0, :17]).all()
    assert not torch.isfinite(o[0, 17]).all()


def test_nam_scan_finite_inputs_unchanged_by_the_check():
    x = _scan_inputs(2, 50, 2, 4, 3)
    a, sa = nam_scan(x["q"], x["k"], x["v"], x["p_w"], x["p_e"], x["p_r"], impl="chunked", chunk_size=16)
    b, sb = nam_scan(x["q"], x["k"], x["v"], x["p_w"], x["p_e"], x["p_r"], impl="reference")
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(sa, sb)


def _attn_inputs(B, H, S, dk, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, S, dk, generator=g, dtype=D64), torch.randn(B, H, S, dk, generator=g, dtype=D64),
            torch.randn(B, H, S, dv, generator=g, dtype=D64))


@pytest.mark.parametrize("fn", ["nam", "quadratic", "linear"])
@pytest.mark.parametrize("which", ["key", "value"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("S,chunk", [(8, 64), (50, 16)])
def test_causal_attention_nonfinite_at_t_leaves_earlier_outputs_finite(fn, which, bad, S, chunk):
    q, k, v = _attn_inputs(3, 2, S, 4, 3)
    t0, t1 = 5, S - 3
    x = {"key": k.clone(), "value": v.clone()}
    x[which][0, 1, t0, 0] = bad
    x[which][1, 0, t1, 1] = bad
    if fn == "nam":
        o = nam_attention(q, x["key"], x["value"], is_causal=True, chunk_size=chunk)
        ref = nam_attention(q, k, v, is_causal=True, chunk_size=chunk)
    elif fn == "quadratic":
        o = nam_attention_quadratic(q, x["key"], x["value"], is_causal=True)
        ref = nam_attention_quadratic(q, k, v, is_causal=True)
    else:
        o = linear_attention(q, x["key"], x["value"], causal=True, chunk_size=chunk)
        ref = linear_attention(q, k, v, causal=True, chunk_size=chunk)
    assert torch.isfinite(o[0, :, :t0]).all() and torch.isfinite(o[1, :, :t1]).all() and torch.isfinite(o[2]).all()
    torch.testing.assert_close(o[0, :, :t0], ref[0, :, :t0])
    torch.testing.assert_close(o[1, :, :t1], ref[1, :, :t1])
    torch.testing.assert_close(o[2], ref[2])


def test_causal_attention_huge_later_values_do_not_cancel_earlier_prefixes():
    q, k, v = _attn_inputs(1, 1, 64, 4, 3)
    v2 = v.clone()
    v2[0, 0, 40] = 1e300  # finite, in the third chunk of 16
    a = nam_attention(q, k, v2, is_causal=True, chunk_size=16)
    b = nam_attention(q, k, v, is_causal=True, chunk_size=16)
    torch.testing.assert_close(a[..., :40, :], b[..., :40, :])


@pytest.mark.parametrize("which", ["key", "value"])
def test_causal_attention_packed_sequences(which):
    q, k, v = _attn_inputs(1, 2, 30, 4, 3)
    x = {"key": k.clone(), "value": v.clone()}
    x[which][0, 0, 20, 0] = float("nan")
    cu = torch.tensor([0, 12, 30])
    o = nam_attention(q, x["key"], x["value"], is_causal=True, chunk_size=8, cu_seqlens=cu)
    assert torch.isfinite(o[..., :20, :]).all()
    o = nam_attention_quadratic(q, x["key"], x["value"], is_causal=True, cu_seqlens=cu)
    assert torch.isfinite(o[..., :20, :]).all()


def test_attention_empty_sequences():
    q = torch.zeros(2, 3, 0, 4)
    v = torch.zeros(2, 3, 0, 5)
    for causal in (False, True):
        assert nam_attention(q, q, v, is_causal=causal).shape == (2, 3, 0, 5)
        assert linear_attention(q, q, v, causal=causal).shape == (2, 3, 0, 5)


@pytest.mark.parametrize("chunk", [0, -3, 2.5, True, "8"])
def test_attention_bad_chunk_size(chunk):
    q, k, v = _attn_inputs(1, 1, 6, 4, 3)
    with pytest.raises(ValueError, match="chunk_size"):
        nam_attention(q, k, v, is_causal=True, chunk_size=chunk)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_attention(q, k, v, causal=True, chunk_size=chunk)
    with pytest.raises(ValueError, match="chunk_size"):
        nam_attention(q, k, v, chunk_size=chunk)


@pytest.mark.parametrize("name", ["k", "v", "p_w", "p_e"])
def test_the_c_value_tape_is_local_too(name):
    from memnets.ops.nam_tape import available, nam_tape_scan
    if not available(torch.zeros(1, dtype=D64)):
        pytest.skip("no C kernel here")
    x = _scan_inputs(2, 12, 2, 4, 3)
    x[name] = x[name].clone()
    x[name][0, 5, 1] = float("nan")
    S0 = torch.zeros(2, 2, 3, 4, dtype=D64)
    o, _ = nam_tape_scan(x["q"], x["k"], x["v"], x["p_w"], x["p_e"], x["p_r"], S0)
    assert torch.isfinite(o[0, :5]).all() and torch.isfinite(o[1]).all()
