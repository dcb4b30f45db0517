"""FastWeightMemory (docs/maths.md §6): reference loop, state passing, hand-built recall, training."""
from __future__ import annotations

import pytest
import torch

import memnets
from memnets.attention import get_feature_map
from memnets.memories.fast_weights import FastWeightMemory, FastWeightState

def _mem(rule="delta", fmap="elu", seed=0, **kw):
    torch.manual_seed(seed)
    kw.setdefault("num_heads", 2)
    return FastWeightMemory(8, update_rule=rule, feature_map=fmap, **kw).double()


def reference(mem, x, w=None):
    """Plain loop over batch, head and time straight from docs/maths.md §6."""
    B, T, _ = x.shape
    H, dk, dv = mem.num_heads, mem.key_size, mem.value_size
    phi = get_feature_map(mem.feature_map)
    q = (x @ mem.query.weight.T).reshape(B, T, H, dk)
    k = (x @ mem.key.weight.T).reshape(B, T, H, dk)
    v = (x @ mem.value.weight.T).reshape(B, T, H, dv)
    y = torch.zeros(B, T, H, dv, dtype=x.dtype)
    W = torch.zeros(B, H, dv, mem.feature_size, dtype=x.dtype) if w is None else w.clone()
    for b in range(B):
        for h in range(H):
            for t in range(T):
                fk, fq = phi(k[b, t, h]), phi(q[b, t, h])
                if mem.update_rule == "delta":
                    beta = torch.sigmoid(x[b, t] @ mem.beta.weight[h] + mem.beta.bias[h])
                    W[b, h] = W[b, h] + beta * torch.outer(v[b, t, h] - W[b, h] @ fk, fk)
                else:
                    W[b, h] = W[b, h] + torch.outer(v[b, t, h], fk)
                y[b, t, h] = W[b, h] @ fq
    y = y.flatten(-2)
    return (mem.out(y) if mem.out is not None else y), W


@pytest.mark.parametrize("rule,fmap", [("delta", "elu"), ("delta", "dpfp2"), ("sum", "elu"), ("sum", "dpfp1")])
def test_forward_matches_reference_and_steps(rule, fmap):
    mem = _mem(rule, fmap, output_size=5)
    torch.manual_seed(1)
    x = torch.randn(2, 13, 8, dtype=torch.float64)
    w0 = 0.1 * torch.randn(2, 2, mem.value_size, mem.feature_size, dtype=torch.float64)
    y, st = mem(x, FastWeightState(w0))
    y_ref, w_ref = reference(mem, x, w0)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(st.weights, w_ref)
    s, ys = FastWeightState(w0), []
    for t in range(13):
        yt, s = mem.step(x[:, t], s)
        ys.append(yt)
    torch.testing.assert_close(torch.stack(ys, 1), y)
    torch.testing.assert_close(s.weights, st.weights)


def test_fused_equals_reference_impl_with_grads():
    mems = {impl: _mem("delta", "dpfp1", impl=impl, chunk_size=4) for impl in ("reference", "fused")}
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    grads = {}
    for impl, mem in mems.items():
        y, st = mem(x)
        loss = (y * torch.linspace(-1, 1, 8, dtype=torch.float64)).sum() + st.weights.pow(2).sum()
        grads[impl] = torch.autograd.grad(loss, list(mem.parameters()))
    for a, b in zip(grads["reference"], grads["fused"]):
        torch.testing.assert_close(b, a)


def test_whole_equals_halves_and_read():
    mem = _mem()
    x = torch.randn(3, 9, 8, dtype=torch.float64)
    y, st = mem(x)
    ya, sa = mem(x[:, :4])
    yb, sb = mem(x[:, 4:], sa)
    torch.testing.assert_close(torch.cat([ya, yb], 1), y)
    torch.testing.assert_close(sb.weights, st.weights)
    # read == W φ(W_q x) without writing; state unchanged
    xq = torch.randn(3, 5, 8, dtype=torch.float64)
    fq = get_feature_map("elu")((xq @ mem.query.weight.T).reshape(3, 5, 2, 4))
    expect = torch.einsum("bhvf,bthf->bthv", st.weights, fq).flatten(-2)
    torch.testing.assert_close(mem.read(xq, st), expect)
    torch.testing.assert_close(mem.read(xq[:, 2], st), expect[:, 2])


def _recall_memory(rule):
    """x = [key (4) | value (2)]; identity key/query maps, value map picks the last 2; β = 1."""
    mem = FastWeightMemory(6, num_heads=1, key_size=4, value_size=2, update_rule=rule,
                           feature_map="dpfp1").double()
    with torch.no_grad():
        eye = torch.eye(6, dtype=torch.float64)
        mem.query.weight.copy_(eye[:4])
        mem.key.weight.copy_(eye[:4])
        mem.value.weight.copy_(eye[4:])
        if mem.beta is not None:
            mem.beta.weight.zero_()
            mem.beta.bias.fill_(1e3)  # σ = 1
    return mem


@pytest.mark.parametrize("rule", ["delta", "sum"])
def test_hand_built_overwrite(rule):
    # DPFP-1 of [1, 1, 0, 0] is the one-hot e_1, of [0, 0, 1, 1] is e_3: orthonormal features.
    ka, kb = [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]
    x = torch.tensor([[ka + [1.0, 2.0], kb + [5.0, -1.0], ka + [-3.0, 4.0]]], dtype=torch.float64)
    mem = _recall_memory(rule)
    _, st = mem(x)
    q = torch.tensor([ka + [0.0, 0.0], kb + [0.0, 0.0]], dtype=torch.float64).unsqueeze(0)
    got = mem.read(q, st)[0]
    want_a = [-3.0, 4.0] if rule == "delta" else [-2.0, 6.0]  # delta replaces, sum adds up
    torch.testing.assert_close(got, torch.tensor([want_a, [5.0, -1.0]], dtype=torch.float64))


def test_write_mask_skips_writes():
    mem = _mem("sum")
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    mask = torch.tensor([[True] * 6, [True, True, False, True, False, False]])
    _, st = mem(x, mask=mask)
    _, st_b = mem(x[1:, [0, 1, 3]])
    torch.testing.assert_close(st.weights[1:], st_b.weights)


def test_zero_input_no_nan():
    mem = _mem("delta", "dpfp3", output_size=3)
    x = torch.zeros(2, 5, 8, dtype=torch.float64, requires_grad=True)
    y, st = mem(x)
    (y.sum() + st.weights.sum()).backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in mem.parameters())


def test_bad_inputs_raise():
    mem = _mem()
    with pytest.raises(ValueError, match="`x` expected"):
        mem(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match="state.weights"):
        mem(torch.randn(2, 5, 8, dtype=torch.float64), FastWeightState(torch.zeros(2, 2, 4, 5)))
    with pytest.raises(ValueError, match="`x_t` expected"):
        mem.step(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="update_rule"):
        FastWeightMemory(8, update_rule="hebb")
    with pytest.raises(ValueError, match="feature_map"):
        FastWeightMemory(8, feature_map="dpfp4")
    with pytest.raises(ValueError, match="divisible"):
        FastWeightMemory(7, num_heads=2)
    with pytest.raises(TypeError, match="`mask`"):
        mem(torch.randn(1, 3, 8, dtype=torch.float64), mask=torch.ones(1, 3))


def test_registered_and_trains():
    torch.manual_seed(0)
    mem = memnets.build_model("fast_weights", input_size=8, num_heads=2, output_size=4)
    assert isinstance(mem, FastWeightMemory)
    opt = torch.optim.Adam(mem.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        x = torch.randn(8, 12, 8)
        target = x[..., :4].cumsum(1) / torch.arange(1, 13).view(1, 12, 1)  # running mean
        y, _ = mem(x)
        loss = (y - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:3]) / 3


def test_docstring_example_runs():
    import textwrap

    import memnets.memories.fast_weights as mod

    block = mod.__doc__.split("Example::", 1)[1]
    ns: dict = {}
    exec(textwrap.dedent(block), {"torch": torch, "FastWeightMemory": FastWeightMemory}, ns)
    assert ns["y"].shape == (2, 50, 32) and ns["state"].weights.shape == (2, 4, 8, 16)


def test_impl_vocabulary():
    """auto (kept: the scan picks per call) | reference | fused; ``chunked`` is a deprecated alias."""
    assert _mem().impl == "auto" and _mem(impl="fused").impl == "fused"
    with pytest.warns(FutureWarning, match="chunked"):
        assert _mem(impl="chunked").impl == "fused"
    with pytest.raises(ValueError, match="impl"):
        _mem(impl="fast")
