"""memnets.attention: every layer against a plain quadratic / loop reference (float64)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import memnets
from memnets.attention import (
    DeltaAttentionState,
    DeltaRuleAttention,
    build_attention,
    dpfp_feature_map,
    elu_sum_feature_map,
    fast_weight_scan,
    fast_weight_step,
    feature_dim,
)

D, H = 12, 3


KINDS_CAUSAL = [("softmax", False), ("softmax", True), ("nam", False), ("nam", True),
                ("linear", False), ("linear", True), ("delta", True)]


def _layer(kind, causal, seed=0, **kw):
    torch.manual_seed(seed)
    return build_attention(kind, D, H, causal=causal, **kw).double().eval()


def _proj(layer, x):
    """Plain q, k, v projections [B, H, S, dh] from the layer's weights."""
    qkv = x @ layer.qkv.weight.T + layer.qkv.bias
    B, S, _ = x.shape
    q, k, v = qkv.split(D, dim=-1)
    return [t.reshape(B, S, H, D // H).permute(0, 2, 1, 3) for t in (q, k, v)]


def _out(layer, y):  # y [B, H, S, dh]
    return y.permute(0, 2, 1, 3).flatten(-2) @ layer.out.weight.T + layer.out.bias


def reference(layer, kind, causal, x, mask):
    """Quadratic forms written out: scores [B, H, S, S], masked, times V."""
    B, S, _ = x.shape
    q, k, v = _proj(layer, x)
    keep = torch.ones(B, S, dtype=torch.bool) if mask is None else mask
    allowed = keep[:, None, None, :].expand(B, 1, S, S).clone()
    if causal:
        allowed &= torch.ones(S, S, dtype=torch.bool).tril()
    if kind == "softmax":
        s = q @ k.transpose(-1, -2) / math.sqrt(D // H)
        s = s.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        return _out(layer, p @ v)
    if kind == "nam":
        s = F.normalize(q, dim=-1, eps=1e-6) @ F.normalize(k, dim=-1, eps=1e-6).transpose(-1, -2)
        return _out(layer, (s * allowed) @ v)
    if kind == "linear":
        s = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-1, -2) * allowed
        return _out(layer, (s @ v) / (s.sum(-1, keepdim=True) + 1e-6))
    # delta: a time loop per batch element and head
    beta = torch.sigmoid(x @ layer.beta.weight.T + layer.beta.bias)  # [B, S, H]
    y = torch.zeros_like(v)
    for b in range(B):
        for h in range(H):
            W = torch.zeros(D // H, D // H, dtype=x.dtype)
            for t in range(S):
                fk, fq = elu_sum_feature_map(k[b, h, t]), elu_sum_feature_map(q[b, h, t])
                if keep[b, t]:
                    W = W + beta[b, t, h] * torch.outer(v[b, h, t] - W @ fk, fk)
                y[b, h, t] = W @ fq
    return _out(layer, y)


def _mask(B=2, S=7):
    m = torch.ones(B, S, dtype=torch.bool)
    m[1, 4:] = False
    return m


@pytest.mark.parametrize("kind,causal", KINDS_CAUSAL)
@pytest.mark.parametrize("masked", [False, True])
def test_layer_matches_reference(kind, causal, masked):
    layer = _layer(kind, causal)
    torch.manual_seed(1)
    x = torch.randn(2, 7, D, dtype=torch.float64, requires_grad=True)
    mask = _mask() if masked else None
    y, y_ref = layer(x, mask=mask), reference(layer, kind, causal, x, mask)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-10)
    g = torch.randn_like(y)
    params = [x, *layer.parameters()]
    for a, b in zip(torch.autograd.grad((y * g).sum(), params), torch.autograd.grad((y_ref * g).sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kind,causal", KINDS_CAUSAL)
def test_layer_gradcheck(kind, causal):
    layer = _layer(kind, causal)
    x = torch.randn(1, 4, D, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, True, False]])
    assert torch.autograd.gradcheck(lambda t: layer(t, mask=mask), (x,))


@pytest.mark.parametrize("kind", ["softmax", "nam", "linear", "delta"])
def test_causal_does_not_see_future(kind):
    layer = _layer(kind, True)
    torch.manual_seed(2)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    y = layer(x)
    for t in (0, 4, 7):
        x2 = x.clone()
        x2[:, t + 1:] += torch.randn_like(x2[:, t + 1:])
        y2 = layer(x2)
        torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=0, atol=1e-12)
        assert (y2[:, t + 1:] - y[:, t + 1:]).abs().max() > 1e-6  # the future does move


@pytest.mark.parametrize("kind,causal", KINDS_CAUSAL)
def test_padding_is_ignored(kind, causal):
    layer = _layer(kind, causal)
    torch.manual_seed(3)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    mask = _mask()
    x2 = x.clone()
    x2[1, 4:] = 100 * torch.randn(3, D, dtype=torch.float64)
    y, y2 = layer(x, mask=mask), layer(x2, mask=mask)
    torch.testing.assert_close(y2[mask], y[mask], rtol=1e-9, atol=1e-10)
    if not causal:  # without the mask, the padded tokens would change every output
        assert (layer(x2)[1, :4] - layer(x)[1, :4]).abs().max() > 1e-3


def test_softmax_row_without_visible_key_is_finite():
    layer = _layer("softmax", True)
    x = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0, :2] = False  # left padding: rows 0 and 1 of batch 0 see no key
    y = layer(x, mask=mask)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(y[0, 0], layer.out.bias)  # zero mixture, then the output bias


@pytest.mark.parametrize("kind,causal", KINDS_CAUSAL)
def test_zero_input_no_nan(kind, causal):
    layer = _layer(kind, causal)
    with torch.no_grad():
        layer.qkv.bias.zero_()  # zero queries, keys and values
    x = torch.zeros(2, 6, D, dtype=torch.float64, requires_grad=True)
    y = layer(x, mask=_mask(S=6))
    (y * torch.randn_like(y)).sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_delta_chunked_equals_reference_values_and_grads():
    torch.manual_seed(4)
    B, T, Hh, dk, dv = 2, 37, 2, 5, 3  # odd sizes, several chunks of 8
    q, k = torch.randn(B, T, Hh, dk, dtype=torch.float64), torch.randn(B, T, Hh, dk, dtype=torch.float64)
    v = torch.randn(B, T, Hh, dv, dtype=torch.float64)
    beta = torch.rand(B, T, Hh, dtype=torch.float64)
    w0 = torch.randn(B, Hh, dv, 2 * dk * 2, dtype=torch.float64)
    wm = torch.rand(B, T) > 0.2
    leaves = [t.requires_grad_() for t in (q, k, v, beta, w0)]
    gy, gw = torch.randn(B, T, Hh, dv, dtype=torch.float64), torch.randn_like(w0)
    results = {}
    for impl in ("reference", "chunked"):
        y, w = fast_weight_scan(q, k, v, beta, feature_map="dpfp2", write_mask=wm, initial_state=w0,
                                impl=impl, chunk_size=8)
        grads = torch.autograd.grad((y * gy).sum() + (w * gw).sum(), leaves)
        results[impl] = (y, w, grads)
    (y1, w1, g1), (y2, w2, g2) = results["reference"], results["chunked"]
    torch.testing.assert_close(y2, y1)
    torch.testing.assert_close(w2, w1)
    for name, a, b in zip(("q", "k", "v", "beta", "w0"), g1, g2):
        torch.testing.assert_close(b, a, msg=lambda m, n=name: f"grad of {n}: {m}")


@pytest.mark.parametrize("rule", ["delta", "sum"])
def test_fast_weight_scan_gradcheck(rule):
    torch.manual_seed(5)
    B, T, Hh, d = 1, 5, 1, 2
    args = [torch.randn(B, T, Hh, d, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    beta = torch.rand(B, T, Hh, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, beta):
        y, w = fast_weight_scan(q, k, v, beta, update_rule=rule, impl="chunked", chunk_size=4)
        return y, w

    assert torch.autograd.gradcheck(f, (*args, beta))


def test_sum_rule_is_unnormalised_linear_attention():
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 9, 2, 4, dtype=torch.float64) for _ in range(3))
    y, w = fast_weight_scan(q, k, v, None, update_rule="sum")
    fq, fk = elu_sum_feature_map(q), elu_sum_feature_map(k)
    s = torch.einsum("bthd,bshd->bhts", fq, fk).tril()
    torch.testing.assert_close(y, torch.einsum("bhts,bshe->bthe", s, v))
    torch.testing.assert_close(w, torch.einsum("bshe,bshd->bhed", v, fk))


def test_delta_whole_equals_halves_and_steps():
    layer = _layer("delta", True)
    torch.manual_seed(7)
    x = torch.randn(2, 11, D, dtype=torch.float64)
    y, st = layer(x, return_state=True)
    ya, sa = layer(x[:, :5], return_state=True)
    yb, sb = layer(x[:, 5:], state=sa, return_state=True)
    torch.testing.assert_close(torch.cat([ya, yb], 1), y)
    torch.testing.assert_close(sb.weights, st.weights)
    assert isinstance(st, DeltaAttentionState) and st.weights.shape == (2, H, D // H, D // H)
    # zero initial state == no state
    torch.testing.assert_close(layer(x, state=layer.init_state(2, dtype=torch.float64)), y)
    # token by token through fast_weight_step
    q, k, v = (t.transpose(1, 2) for t in _proj(layer, x))  # [B, S, H, dh]
    beta = torch.sigmoid(layer.beta(x))
    w, outs = None, []
    for t in range(11):
        o, w = fast_weight_step(q[:, t], k[:, t], v[:, t], beta[:, t], w)
        outs.append(o)
    torch.testing.assert_close(_out(layer, torch.stack(outs, 2)), y)
    # the layer's own step
    s, ys = None, []
    for t in range(11):
        yt, s = layer.step(x[:, t], s)
        ys.append(yt)
    torch.testing.assert_close(torch.stack(ys, 1), y)
    torch.testing.assert_close(s.weights, st.weights)


def test_delta_layer_fused_equals_reference_with_grads():
    x = torch.randn(2, 21, D, dtype=torch.float64)
    mask = _mask(S=21)
    grads = []
    for impl in ("reference", "fused"):
        torch.manual_seed(8)
        layer = DeltaRuleAttention(D, H, impl=impl, chunk_size=4, feature_map="dpfp1").double()
        y, st = layer(x, mask=mask, return_state=True)
        loss = (y * torch.cos(torch.arange(D, dtype=torch.float64))).sum() + st.weights.sum()
        grads.append((y, torch.autograd.grad(loss, list(layer.parameters()))))
    torch.testing.assert_close(grads[1][0], grads[0][0])
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(b, a)


def test_delta_dpfp_option_and_beta_one_overwrites():
    layer = DeltaRuleAttention(D, H, feature_map="dpfp3").double()
    assert layer.feature_size == feature_dim("dpfp3", D // H) == 2 * (D // H) * 3
    y, st = layer(torch.randn(1, 4, D, dtype=torch.float64), return_state=True)
    assert st.weights.shape == (1, H, D // H, 24) and torch.isfinite(y).all()
    # β = 1, same key twice: W₂φ = a·v₂ + (1 − a)·a·v₁ with a = ‖φ‖² (delta rule by hand)
    k = torch.randn(1, 1, 1, 4, dtype=torch.float64).expand(1, 2, 1, 4)
    v = torch.tensor([[[[1.0, 2.0]], [[-3.0, 5.0]]]], dtype=torch.float64)
    y, w = fast_weight_scan(k, k, v, torch.ones(1, 2, 1, dtype=torch.float64))
    fk = elu_sum_feature_map(k[0, 0, 0])
    torch.testing.assert_close(w[0, 0] @ fk, v[0, 1, 0] * (fk @ fk) + (1 - fk @ fk) * (v[0, 0, 0] * (fk @ fk)))


def test_feature_maps_hand_cases():
    x = torch.tensor([1.0, -2.0])
    # r = [1, 0, 0, 2]; roll 1 -> [2, 1, 0, 0]; product [2, 0, 0, 0]; sum-normalised
    torch.testing.assert_close(dpfp_feature_map(x, 1), torch.tensor([1.0, 0, 0, 0]))
    phi = dpfp_feature_map(torch.randn(5, 6), 3)
    assert phi.shape == (5, 36) and (phi >= 0).all()
    torch.testing.assert_close(phi.sum(-1), torch.ones(5))
    torch.testing.assert_close(elu_sum_feature_map(torch.zeros(4)), torch.full((4,), 0.25))
    assert torch.equal(dpfp_feature_map(torch.zeros(3), 2), torch.zeros(12))  # no NaN


def test_bad_inputs_raise():
    layer = _layer("nam", False)
    with pytest.raises(ValueError, match="`x` expected"):
        layer(torch.randn(2, 5, D + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="`mask` expected"):
        layer(torch.randn(2, 5, D, dtype=torch.float64), mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="`mask` expected a bool"):
        layer(torch.randn(2, 5, D, dtype=torch.float64), mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="causal only"):
        build_attention("delta", D, H, causal=False)
    with pytest.raises(ValueError, match="`kind` expected"):
        build_attention("sparse", D, H)
    with pytest.raises(ValueError, match="divisible"):
        build_attention("softmax", 10, 3)
    with pytest.raises(ValueError, match="feature_map"):
        DeltaRuleAttention(D, H, feature_map="relu")
    dl = _layer("delta", True)
    with pytest.raises(ValueError, match="state.weights"):
        dl(torch.randn(2, 5, D, dtype=torch.float64), state=DeltaAttentionState(torch.zeros(2, H, 4, 5)))
    with pytest.raises(ValueError, match="`beta` is required"):
        fast_weight_scan(*(torch.randn(1, 3, 1, 2) for _ in range(3)), None)


def test_registered_and_trainable():
    assert {"attn_softmax", "attn_nam", "attn_linear", "attn_delta"} <= set(memnets.available_models())
    layer = memnets.build_model("attn_nam", d_model=8, num_heads=2, causal=True)
    assert layer(torch.randn(1, 3, 8)).shape == (1, 3, 8)
    # dropout is active in training and off in eval
    drop = build_attention("linear", 8, 2, dropout=0.5)
    x = torch.randn(2, 6, 8)
    assert not torch.equal(drop(x), drop(x))
    drop.eval()
    assert torch.equal(drop(x), drop(x))


def _run_docstring_example(module):
    """Execute the indented block after ``Example::`` in a module docstring."""
    import textwrap

    block = module.__doc__.split("Example::", 1)[1]
    lines = [ln for ln in block.splitlines()[1:]]
    code = []
    for ln in lines:
        if ln.strip() and not ln.startswith("    "):
            break
        code.append(ln)
    ns: dict = {}
    exec(textwrap.dedent("\n".join(code)), {"torch": torch}, ns)
    return ns


def test_docstring_example_runs():
    import memnets.attention as mod

    ns = _run_docstring_example(mod)
    assert ns["y"].shape == (2, 10, 64)


def test_bench_rows():
    from memnets.bench.models_attention import run_cases

    rows = run_cases(lengths=[16], repeat=1)
    assert [r["model"] for r in rows] == ["transformer[nam]", "transformer[linear]", "transformer[nam]",
                                          "transformer[linear]", "transformer[delta]"]
    assert all(r["ratio"] > 0 and r["baseline_ms"] > 0 for r in rows)


@pytest.mark.parametrize("kind,causal", [("nam", True), ("linear", True), ("softmax", True), ("nam", False), ("delta", True)])
@pytest.mark.parametrize("S", [1, 33, 70])
def test_layers_across_chunk_boundaries(kind, causal, S):
    """Several ragged chunks of the causal prefix-state form (chunk length 32 here)."""
    layer = _layer(kind, causal)
    torch.manual_seed(9)
    x = torch.randn(2, S, D, dtype=torch.float64)
    mask = torch.ones(2, S, dtype=torch.bool)
    mask[1, S // 2 + 1:] = False
    torch.testing.assert_close(layer(x, mask=mask), reference(layer, kind, causal, x, mask), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_nam_length_norm_divides_by_the_keys_summed(causal):
    """``NAMAttention(length_norm=True)`` is the plain layer's mixed values divided by the
    number of valid keys each position sums over, and padding still changes nothing."""
    from memnets.attention import NAMAttention

    torch.manual_seed(0)
    plain = NAMAttention(8, 2, causal=causal).double()
    normed = NAMAttention(8, 2, causal=causal, length_norm=True).double()
    normed.load_state_dict(plain.state_dict())
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4], dtype=torch.bool)
    seen = []  # the mixed values before the output projection
    for m in (plain, normed):
        m.out.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
        m(x, mask)
    n = mask.double().cumsum(1) if causal else mask.double().sum(1, keepdim=True).expand(3, 6)
    torch.testing.assert_close(seen[1], seen[0] / n.clamp_min(1)[..., None])
    y = normed(x, mask)
    x2 = x.clone()
    x2[~mask] = 1e3  # padded positions hold garbage
    torch.testing.assert_close(normed(x2, mask)[mask], y[mask])


def test_delta_layer_impl_vocabulary():
    """auto | reference | fused; the old name ``chunked`` maps to ``fused`` with a FutureWarning."""
    assert DeltaRuleAttention(D, H).impl == "auto"
    with pytest.warns(FutureWarning, match="chunked"):
        assert DeltaRuleAttention(D, H, impl="chunked").impl == "fused"
    with pytest.raises(ValueError, match="impl"):
        DeltaRuleAttention(D, H, impl="fla")
