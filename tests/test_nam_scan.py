"""nam_scan / nam_step (docs/maths.md §1): chunked == reference (values and every gradient, float64),
state carrying, gradcheck, degenerate inputs, bfloat16 and input checks."""
from __future__ import annotations

import pytest
import torch

from memnets.ops import nam_scan, nam_scan_resolve_impl, nam_scan_supports, nam_step, nam_write, nam_read, unit

D64 = torch.float64
NAMES = ["q", "k", "v", "p_w", "p_e", "p_r", "initial_state"]


def make_inputs(B=2, T=10, H=3, dk=5, dv=7, *, seed=0, dtype=D64, with_state=True, with_pr=True):
    g = torch.Generator().manual_seed(seed)
    q = unit(torch.randn(B, T, H, dk, generator=g, dtype=dtype))
    k = unit(torch.randn(B, T, H, dk, generator=g, dtype=dtype))
    v = torch.randn(B, T, H, dv, generator=g, dtype=dtype)
    pw = torch.rand(B, T, H, generator=g, dtype=dtype)
    pe = torch.rand(B, T, H, generator=g, dtype=dtype)  # p_e != p_w
    pr = torch.rand(B, T, H, generator=g, dtype=dtype) if with_pr else None
    S0 = torch.randn(B, H, dv, dk, generator=g, dtype=dtype) if with_state else None
    return dict(q=q, k=k, v=v, p_w=pw, p_e=pe, p_r=pr, initial_state=S0)


def run(inputs, impl, chunk_size=64):
    args = {n: t for n, t in inputs.items() if n != "initial_state"}
    return nam_scan(**args, initial_state=inputs["initial_state"], impl=impl, chunk_size=chunk_size)


def grads(inputs, impl, cot_o, cot_s, chunk_size=64):
    leaves = {n: t.detach().clone().requires_grad_() for n, t in inputs.items() if t is not None}
    full = {n: leaves.get(n) for n in inputs}
    o, s = run(full, impl, chunk_size)
    ((o * cot_o).sum() + (s * cot_s).sum()).backward()
    return o.detach(), s.detach(), {n: t.grad for n, t in leaves.items()}


@pytest.mark.parametrize("T", [1, 63, 64, 100])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("with_pr", [False, True])
def test_chunked_matches_reference_values_and_grads(T, with_state, with_pr):
    inputs = make_inputs(T=T, with_state=with_state, with_pr=with_pr, seed=T)
    g = torch.Generator().manual_seed(1)
    B, H, dk, dv = 2, 3, 5, 7
    cot_o = torch.randn(B, T, H, dv, generator=g, dtype=D64)
    cot_s = torch.randn(B, H, dv, dk, generator=g, dtype=D64)
    o_r, s_r, g_r = grads(inputs, "reference", cot_o, cot_s)
    o_c, s_c, g_c = grads(inputs, "chunked", cot_o, cot_s)
    torch.testing.assert_close(o_c, o_r, rtol=0, atol=1e-10)
    torch.testing.assert_close(s_c, s_r, rtol=0, atol=1e-10)
    assert set(g_r) == set(g_c)
    for name in g_r:
        assert g_c[name] is not None, name
        torch.testing.assert_close(g_c[name], g_r[name], rtol=0, atol=1e-10, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 200])
def test_chunk_size_does_not_change_result(chunk_size):
    inputs = make_inputs(T=37, seed=3)
    o_r, s_r = run(inputs, "reference")
    o_c, s_c = run(inputs, "chunked", chunk_size)
    torch.testing.assert_close(o_c, o_r, rtol=0, atol=1e-10)
    torch.testing.assert_close(s_c, s_r, rtol=0, atol=1e-10)


def test_matches_plain_primitives_loop():
    """The scan equals RD(WR(...)) applied token by token with the public primitives."""
    inp = make_inputs(B=1, T=6, H=2, seed=4)
    o, s = run(inp, "chunked")
    S = inp["initial_state"]
    for t in range(6):
        S = nam_write(S, inp["k"][:, t], inp["v"][:, t], inp["p_w"][:, t], inp["p_e"][:, t])
        torch.testing.assert_close(o[:, t], nam_read(S, inp["q"][:, t], inp["p_r"][:, t]))
    torch.testing.assert_close(s, S)


@pytest.mark.parametrize("impl", ["reference", "chunked"])
def test_whole_equals_halves_equals_steps(impl):
    inp = make_inputs(T=50, seed=5)
    o, s = run(inp, impl, chunk_size=16)
    first = {n: (t[:, :21] if n != "initial_state" else t) for n, t in inp.items()}
    o1, s1 = run(first, impl, 16)
    second = {n: (t[:, 21:] if n != "initial_state" else s1) for n, t in inp.items()}
    o2, s2 = run(second, impl, 16)
    torch.testing.assert_close(torch.cat([o1, o2], 1), o, rtol=0, atol=1e-10)
    torch.testing.assert_close(s2, s, rtol=0, atol=1e-10)
    state = inp["initial_state"]
    outs = []
    for t in range(50):
        y, state = nam_step(inp["q"][:, t], inp["k"][:, t], inp["v"][:, t], inp["p_w"][:, t],
                            inp["p_e"][:, t], inp["p_r"][:, t], initial_state=state)
        outs.append(y)
    torch.testing.assert_close(torch.stack(outs, 1), o, rtol=0, atol=1e-10)
    torch.testing.assert_close(state, s, rtol=0, atol=1e-10)


@pytest.mark.parametrize("impl", ["reference", "chunked"])
def test_gradcheck(impl):
    inp = make_inputs(B=1, T=5, H=2, dk=3, dv=2, seed=6)
    names = [n for n in NAMES if inp[n] is not None]
    leaves = [inp[n].detach().clone().requires_grad_() for n in names]

    def f(*xs):
        d = dict(zip(names, xs))
        args = {n: d[n] for n in NAMES if n != "initial_state"}
        return nam_scan(**args, initial_state=d["initial_state"], impl=impl, chunk_size=2)

    assert torch.autograd.gradcheck(f, leaves)


def test_delta_rule_special_case_and_float_probs():
    inp = make_inputs(T=20, seed=7, with_pr=False)
    beta = inp["p_w"]
    o1, s1 = nam_scan(inp["q"], inp["k"], inp["v"], beta, beta, impl="chunked")
    S = inp["k"].new_zeros(2, 3, 7, 5)
    for t in range(20):  # M + β (v − M k) kᵀ
        k, v, b = inp["k"][:, t], inp["v"][:, t], beta[:, t, :, None]
        S = S + (b * (v - (S @ k[..., None])[..., 0]))[..., None] * k[..., None, :]
    torch.testing.assert_close(s1, S)
    o2, s2 = nam_scan(inp["q"], inp["k"], inp["v"], 1.0, 0.0, impl="chunked")  # pure sum rule
    torch.testing.assert_close(s2, torch.einsum("bthv,bthk->bhvk", inp["v"], inp["k"]))


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("p", [0.0, 1.0])
def test_degenerate_inputs_no_nan(impl, p):
    B, T, H, d = 2, 9, 2, 4
    q = torch.zeros(B, T, H, d, requires_grad=True)
    k = torch.zeros(B, T, H, d, requires_grad=True)
    v = torch.randn(B, T, H, d, requires_grad=True)
    pw = torch.full((B, T, H), p, requires_grad=True)
    pe = torch.full((B, T, H), p, requires_grad=True)
    S0 = torch.zeros(B, H, d, d, requires_grad=True)
    o, s = nam_scan(unit(q), unit(k), v, pw, pe, initial_state=S0, impl=impl, chunk_size=4)
    (o.sum() + s.sum()).backward()
    for t in (o, s, q.grad, k.grad, v.grad, pw.grad, pe.grad, S0.grad):
        assert torch.isfinite(t).all()
    assert torch.all(s == 0)  # zero keys write nothing


def test_bfloat16_runs_close_to_float32():
    inp = make_inputs(T=40, seed=8, dtype=torch.float32)
    o32, s32 = run(inp, "chunked", 16)
    bf = {n: (t.bfloat16() if t is not None else None) for n, t in inp.items()}
    o16, s16 = run(bf, "chunked", 16)
    assert o16.dtype == torch.bfloat16 and s16.dtype == torch.bfloat16
    torch.testing.assert_close(o16.float(), o32, rtol=0.05, atol=0.1)


def test_auto_picks_and_forced_impl_checks():
    q = torch.zeros(1, 100, 1, 2)
    assert nam_scan_resolve_impl("auto", q) == "chunked"
    assert nam_scan_resolve_impl("auto", q[:, :2]) == "reference"
    assert nam_scan_supports("chunked", q, chunk_size=0)
    assert nam_scan_supports("nonsense", q)
    with pytest.raises(ValueError, match="impl='fast'"):
        nam_scan(q, q, q, 1.0, 1.0, impl="fast")
    with pytest.raises(ValueError, match="chunk_size"):
        nam_scan(q, q, q, 1.0, 1.0, impl="chunked", chunk_size=0)


@pytest.mark.parametrize(
    "change, name",
    [
        (dict(q=torch.zeros(2, 10, 3)), "`q`"),
        (dict(k=torch.zeros(2, 10, 3, 4)), "`q`"),
        (dict(v=torch.zeros(2, 9, 3, 7)), "`v`"),
        (dict(v=torch.zeros(2, 10, 7)), "`v`"),
        (dict(p_w=torch.zeros(2, 10)), "`p_w`"),
        (dict(p_e=torch.zeros(2, 10, 3, 1)), "`p_e`"),
        (dict(p_r=torch.zeros(2, 11, 3)), "`p_r`"),
        (dict(initial_state=torch.zeros(2, 3, 5, 7)), "`initial_state`"),
        (dict(q=torch.zeros(0, 10, 3, 5), k=torch.zeros(0, 10, 3, 5), v=torch.zeros(0, 10, 3, 7)), "`k`"),
    ],
)
def test_bad_input_names_argument(change, name):
    inp = make_inputs(T=10, dtype=torch.float32)
    inp.update(change)
    with pytest.raises(ValueError, match=name) as err:
        run(inp, "auto")
    assert "expected" in str(err.value)


def test_dtype_mismatch_raises_type_error():
    inp = make_inputs(T=4, dtype=torch.float32)
    inp["v"] = inp["v"].double()
    with pytest.raises(TypeError, match="`v`"):
        run(inp, "auto")


@pytest.mark.parametrize("C", [1, 2, 5, 16, 33, 64])
def test_unit_lower_inverse(C):
    from memnets.ops.delta.chunked import unit_lower_inverse

    g = torch.Generator().manual_seed(C)
    A = (0.5 * torch.randn(3, 2, C, C, generator=g, dtype=torch.float64)).tril(-1)
    inv = unit_lower_inverse(A)
    eye = torch.eye(C, dtype=torch.float64)
    assert inv.shape == A.shape
    torch.testing.assert_close(inv @ (eye + A), eye.expand_as(A), atol=1e-10, rtol=0)
    assert torch.equal(inv.triu(1), torch.zeros_like(inv))  # stays lower-triangular


def test_fla_path_gets_the_callers_state_and_makes_none(monkeypatch):
    """On the fla path ``nam_scan`` hands fla the caller's initial state as given (fla starts
    from zeros itself when there is none): no zero state is made and launched per call."""
    import memnets.ops.delta as delta

    seen = []

    def fake_fla(q, k, v, pw, pe, pr, state, *, delta, cu_seqlens):
        seen.append((state, pe, delta))
        return v.clone(), torch.zeros(k.shape[0], k.shape[2], v.shape[-1], k.shape[-1])

    monkeypatch.setattr(delta, "resolve_impl", lambda impl, q, chunk_size=64: "fla")
    monkeypatch.setattr(delta, "nam_scan_fla", fake_fla)
    q, k, v = (torch.randn(2, 5, 3, 4) for _ in range(3))
    pw = torch.rand(2, 5, 3)
    nam_scan(q, k, v, pw, pw)
    assert seen[-1] == (None, None, True)
    s0 = torch.randn(2, 3, 4, 4)
    nam_scan(q, k, v, pw, torch.rand(2, 5, 3), initial_state=s0)
    assert seen[-1][0] is s0 and seen[-1][2] is False
    # the other paths still start from zeros: the chunked scan equals the reference one
    monkeypatch.undo()
    a = nam_scan(q, k, v, pw, pw, impl="chunked")
    b = nam_scan(q, k, v, pw, pw, initial_state=torch.zeros(2, 3, 4, 4), impl="reference")
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])
