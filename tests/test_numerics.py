"""Extreme inputs to the ops give finite values and finite gradients; the NaN guard.

Zero vectors where the ops normalise, huge strengths (β, γ up to 1e15), tiny (1e-30) and
huge (1e15) magnitudes where the op is scale-free or bounded, in float32, float64 and
bfloat16. Every case backpropagates a random cotangent and checks each input's gradient.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memnets import ops
from memnets.train.nan_guard import NonFiniteError, check_finite, first_non_finite

SETTINGS = settings(max_examples=12, deadline=None, derandomize=True)
DTYPES = st.sampled_from([torch.float32, torch.float64, torch.bfloat16])
SCALES = st.sampled_from([0.0, 1e-30, 1e-8, 1.0, 1e8, 1e15])


def _finite(name: str, x: torch.Tensor) -> None:
    assert torch.isfinite(x.float()).all(), f"{name}: non-finite values {x}"


def _run(fn, inputs: dict[str, torch.Tensor], seed: int = 0):
    """Call ``fn(**inputs)``, check outputs, backprop a random cotangent, check every gradient."""
    leaves = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    out = fn(**leaves)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(seed)
    total = 0
    for i, o in enumerate(outs):
        _finite(f"output {i}", o)
        cot = torch.randn(o.shape, generator=g).to(o.dtype)
        total = total + (o * cot).float().sum()
    total.backward()
    for k, v in leaves.items():
        if v.requires_grad:
            assert v.grad is not None, f"no gradient for {k}"
            _finite(f"grad {k}", v.grad)
    return outs


def _rand(*shape, dtype=torch.float32, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


# ------------------------------------------------------------------ NAM


@SETTINGS
@given(dtype=DTYPES, scale=SCALES)
def test_unit_extreme(dtype, scale):
    x = _rand(3, 5, dtype=dtype, scale=scale)
    x[0] = 0.0  # an exact zero vector
    (y,) = _run(ops.unit, {"x": x})
    assert (y[0] == 0).all()
    norms = y[1:].float().norm(dim=-1)
    if scale >= 1.0:  # well above eps (1e-6) the output has unit norm
        assert torch.allclose(norms, torch.ones_like(norms), atol=2e-2)


@SETTINGS
@given(dtype=DTYPES, scale=st.sampled_from([0.0, 1e-30, 1.0, 1e8]), pw=st.sampled_from([0.0, 0.5, 1.0]))
def test_nam_read_write_extreme(dtype, scale, pw):
    M = _rand(2, 3, 4, dtype=dtype, scale=scale)
    k = ops.unit(_rand(2, 4, dtype=dtype, seed=1))
    v = _rand(2, 3, dtype=dtype, scale=scale, seed=2)
    p = torch.full((2,), pw, dtype=dtype)
    _run(lambda M, k, v, p: ops.nam_write(M, k, v, p, p), {"M": M, "k": k, "v": v, "p": p})
    _run(lambda M, q, p: ops.nam_read(M, q, p), {"M": M, "q": k, "p": p})


@SETTINGS
@given(dtype=st.sampled_from([torch.float32, torch.float64]), impl=st.sampled_from(["reference", "chunked"]),
       key_scale=st.sampled_from([0.0, 1e-30, 1.0, 1e15]), beta=st.sampled_from([0.0, 1.0, 0.5]))
def test_nam_scan_extreme(dtype, impl, key_scale, beta):
    B, T, H, d = 2, 7, 2, 4
    k = ops.unit(_rand(B, T, H, d, dtype=dtype, scale=key_scale))
    if key_scale == 0.0:
        assert (k == 0).all()
    q = ops.unit(_rand(B, T, H, d, dtype=dtype, scale=key_scale, seed=1))
    v = _rand(B, T, H, d, dtype=dtype, seed=2)
    p = torch.full((B, T, H), beta, dtype=dtype)
    o, S = _run(lambda q, k, v, p: ops.nam_scan(q, k, v, p, p, impl=impl, chunk_size=3),
                {"q": q, "k": k, "v": v, "p": p})
    # with unit keys and β ∈ [0, 1] the delta rule keeps every value bounded (docs/maths.md §1)
    assert S.abs().max() <= v.abs().max() * T + 1e-6


@pytest.mark.parametrize("impl", ["reference", "chunked"])
def test_nam_scan_bfloat16_finite_and_close(impl):
    B, T, H, d = 1, 9, 1, 4
    k = ops.unit(_rand(B, T, H, d, dtype=torch.float64)).to(torch.bfloat16)
    v = _rand(B, T, H, d, dtype=torch.bfloat16, seed=1)
    o, _ = _run(lambda k, v: ops.nam_scan(k, k, v, 1.0, 1.0, impl=impl, chunk_size=4), {"k": k, "v": v})
    ref, _ = ops.nam_scan(k.double(), k.double(), v.double(), 1.0, 1.0, impl="reference")
    assert (o.double() - ref).abs().max() < 0.05


@SETTINGS
@given(dtype=DTYPES, scale=SCALES, causal=st.booleans(),
       fn=st.sampled_from(["nam_attention", "nam_attention_quadratic"]))
def test_nam_attention_extreme(dtype, scale, causal, fn):
    """μ makes NAM attention scale-free in q and k; zero q/k rows give zero output, no NaN."""
    f = getattr(ops, fn)
    q = _rand(2, 6, 4, dtype=dtype, scale=scale)
    k = _rand(2, 6, 4, dtype=dtype, scale=scale, seed=1)
    v = _rand(2, 6, 3, dtype=dtype, seed=2)
    kw = {"causal": causal, "chunk_size": 4} if fn == "nam_attention" else {"causal": causal}
    (y,) = _run(lambda q, k, v: f(q, k, v, **kw), {"q": q, "k": k, "v": v})
    if scale == 0.0:
        assert (y == 0).all()


@SETTINGS
@given(dtype=DTYPES, scale=st.sampled_from([0.0, 1e-30, 1.0, 1e3, 1e15]), causal=st.booleans())
def test_linear_attention_extreme(dtype, scale, causal):
    q = _rand(2, 6, 4, dtype=dtype, scale=scale)
    k = _rand(2, 6, 4, dtype=dtype, scale=scale, seed=1)
    if scale >= 1e3:
        q, k = q.abs(), -k.abs()  # φ(k) → 0: the normaliser itself vanishes
    v = _rand(2, 6, 3, dtype=dtype, seed=2)
    _run(lambda q, k, v: ops.linear_attention(q, k, v, causal=causal, chunk_size=4), {"q": q, "k": k, "v": v})


# ------------------------------------------------------------------ NTM addressing


@SETTINGS
@given(dtype=DTYPES, scale=SCALES, beta=st.sampled_from([0.0, 1.0, 1e3, 1e15]))
def test_content_weights_extreme(dtype, scale, beta):
    memory = _rand(2, 6, 4, dtype=dtype, scale=scale)
    memory[:, 0] = 0.0  # an empty slot
    key = _rand(2, 4, dtype=dtype, scale=scale, seed=1)
    key[1] = 0.0  # a zero key
    strength = torch.full((2,), beta, dtype=dtype)
    (w,) = _run(ops.content_weights, {"memory": memory, "key": key, "strength": strength})
    assert torch.allclose(w.float().sum(-1), torch.ones(2), atol=2e-2)


@SETTINGS
@given(dtype=DTYPES, gamma=st.sampled_from([1.0, 2.5, 50.0, 1e3, 1e15]),
       zeros=st.sampled_from(["none", "some", "all"]))
def test_sharpen_extreme(dtype, gamma, zeros):
    w = torch.softmax(_rand(2, 6, dtype=torch.float64), -1)
    if zeros == "some":
        w[:, ::2] = 0.0
    elif zeros == "all":
        w[:] = 0.0
    w = w.to(dtype)
    g = torch.full((2,), gamma, dtype=dtype)
    (y,) = _run(ops.sharpen, {"w": w, "gamma": g})
    assert torch.allclose(y.float().sum(-1), torch.ones(2), atol=2e-2)


@SETTINGS
@given(dtype=DTYPES, peaked=st.booleans())
def test_shift_interpolate_read_write_extreme(dtype, peaked):
    N, W = 6, 4
    w = torch.zeros(2, N, dtype=dtype)
    w[:, 0] = 1.0
    if not peaked:
        w = torch.full((2, N), 1.0 / N, dtype=dtype)
    s = torch.tensor([[0.0, 0.0, 1.0], [1 / 3, 1 / 3, 1 / 3]], dtype=dtype)
    _run(ops.circular_shift, {"w": w, "s": s})
    _run(lambda a, b, g: ops.interpolate(a, b, g), {"a": w, "b": w.flip(-1), "g": torch.tensor([0.0, 1.0], dtype=dtype)})
    memory = torch.zeros(2, N, W, dtype=dtype)
    _run(lambda m, w: ops.weighted_read(m, w), {"m": memory, "w": w})
    erase = torch.ones(2, 1, W, dtype=dtype)
    add = _rand(2, 1, W, dtype=dtype, scale=1e15)
    _run(lambda m, w, e, a: ops.erase_add_write(m, w, e, a),
         {"m": memory, "w": w.unsqueeze(1), "e": erase, "a": add})


# ------------------------------------------------------------------ DNC


@SETTINGS
@given(dtype=DTYPES, kind=st.sampled_from(["zeros", "ones", "ties", "random", "tiny"]))
def test_dnc_allocation_extreme(dtype, kind):
    N = 6
    u = {"zeros": torch.zeros(2, N), "ones": torch.ones(2, N), "ties": torch.full((2, N), 0.5),
         "random": torch.rand(2, N, generator=torch.Generator().manual_seed(0)),
         "tiny": torch.full((2, N), 1e-30)}[kind].to(dtype)
    (a,) = _run(ops.dnc_allocation, {"usage": u})
    assert (a.float() >= 0).all() and (a.float().sum(-1) <= 1 + 1e-2).all()
    if kind == "ones":
        assert (a == 0).all()


@SETTINGS
@given(dtype=DTYPES, free=st.sampled_from([0.0, 1.0]), write=st.sampled_from(["zero", "onehot", "spread"]))
def test_dnc_memory_ops_extreme(dtype, free, write):
    N, R = 5, 2
    rw = torch.zeros(2, R, N, dtype=dtype)
    rw[..., 0] = 1.0
    fg = torch.full((2, R), free, dtype=dtype)
    ww = {"zero": torch.zeros(2, N), "onehot": torch.eye(N)[:2], "spread": torch.full((2, N), 1.0 / N)}[write].to(dtype)
    (psi,) = _run(ops.dnc_retention, {"free_gates": fg, "read_weights_prev": rw})
    _run(ops.dnc_usage, {"usage_prev": torch.ones(2, N, dtype=dtype), "write_weights_prev": ww, "retention": psi.detach()})
    _run(ops.dnc_precedence, {"precedence_prev": torch.zeros(2, N, dtype=dtype), "write_weights": ww})
    (link,) = _run(ops.dnc_link, {"link_prev": torch.zeros(2, N, N, dtype=dtype),
                                  "precedence_prev": torch.zeros(2, N, dtype=dtype), "write_weights": ww})
    assert (torch.diagonal(link, dim1=-2, dim2=-1) == 0).all()
    f, b = _run(ops.dnc_directional_weights, {"link": link.detach(), "read_weights_prev": rw})
    modes = torch.softmax(_rand(2, R, 3, dtype=torch.float64, scale=1e15), -1).to(dtype)
    _run(ops.dnc_read_weights, {"read_content": rw, "forward": f.detach(), "backward": b.detach(), "read_modes": modes})


# ------------------------------------------------------------------ NaN guard


def test_check_finite_passes_and_names_the_first_bad_tensor():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    loss = model(torch.randn(2, 3)).pow(2).mean()
    loss.backward()
    assert check_finite(loss, model, step=1)
    assert first_non_finite(loss, model.named_parameters()) is None

    with pytest.raises(NonFiniteError, match=r"non-finite loss `loss` at step 5: 1 NaN and 0 Inf"):
        check_finite(torch.tensor(float("nan")), model, step=5)
    with pytest.raises(NonFiniteError, match="at step 9"):
        check_finite(float("inf"), None, step=9)

    model[1].weight.grad[0, 2] = float("inf")
    with pytest.raises(NonFiniteError) as e:
        check_finite(loss, model, step=3)
    assert (e.value.step, e.value.name, e.value.kind, e.value.n_nan, e.value.n_inf) == (3, "1.weight.grad", "gradient", 0, 1)
    assert isinstance(e.value, FloatingPointError)

    with torch.no_grad():
        model[0].bias[0] = float("nan")  # a parameter is reported before any gradient
    with pytest.raises(NonFiniteError, match=r"non-finite parameter `0.bias` at step 4"):
        check_finite(loss, model, step=4)


def test_check_finite_skip_policy_and_bad_arguments():
    model = torch.nn.Linear(2, 2)
    assert check_finite(torch.tensor([1.0, 2.0]), model, policy="skip") is True
    assert check_finite(torch.tensor([1.0, float("-inf")]), model, policy="skip") is False
    assert check_finite(None, model, policy="skip") is True
    assert check_finite(torch.tensor(1.0, dtype=torch.bfloat16), None) is True
    with pytest.raises(ValueError, match="`policy` expected one of"):
        check_finite(1.0, model, policy="ignore")
    with pytest.raises(TypeError, match="`model` expected a torch.nn.Module"):
        check_finite(1.0, {"w": torch.zeros(1)})


def test_check_finite_skip_drops_the_update():
    """The intended use: a NaN batch leaves the weights untouched under policy="skip"."""
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.tensor([[float("nan"), 1.0]])
    loss = model(x).sum()
    loss.backward()
    if check_finite(loss, model, step=0, policy="skip"):
        opt.step()
    opt.zero_grad(set_to_none=True)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert math.isfinite(float(model.weight.detach().sum()))


# ------------------------------------------------------------------ memory modules

_MODULES = {
    "lsam": dict(input_size=3, hidden_size=4, num_heads=2),
    "nam_tm": dict(input_size=3, hidden_size=4, tape_length=6),
    "fast_weights": dict(input_size=3),
    "ntm": dict(input_size=3, output_size=3, memory_slots=6, word_size=4, controller_size=8),
    "dnc": dict(input_size=3, output_size=3, memory_slots=6, word_size=4, read_heads=2, controller_size=8),
}


@pytest.mark.parametrize("scale", [0.0, 1e-30, 1e15])
@pytest.mark.parametrize("name", sorted(_MODULES))
def test_memory_modules_extreme_inputs(name, scale):
    """All-zero, tiny and saturating inputs: finite outputs, input and parameter gradients."""
    from memnets.registry import build_model

    torch.manual_seed(0)
    model = build_model(name, **_MODULES[name])
    x = (torch.randn(2, 5, 3) * scale).requires_grad_()
    y = model(x)[0]
    _finite("output", y)
    (y * torch.randn(y.shape)).sum().backward()
    _finite("grad x", x.grad)
    assert check_finite(None, model, step=0)  # every parameter and gradient finite
