"""The NAM → fla mapping of ``nam_scan_fla`` (docs/maths.md §1), checked on the CPU against fla's own
step-by-step reference recurrences (``fla/ops/delta_rule/naive.py``,
``fla/ops/generalized_delta_rule/{iplr,dplr}/naive.py``), loaded from their files so that fla's
Triton kernels are never imported. Skipped when flash-linear-attention is not installed; the
GPU kernels themselves are checked in ``tests/test_cuda.py``."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from memnets.ops import nam_scan, unit
from memnets.ops.delta.fla_backend import nam_scan_fla


def _load(rel: str):
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention (fla) is not installed")
    pytest.importorskip("einops")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, rel)
        if os.path.exists(path):
            mod_spec = importlib.util.spec_from_file_location("_fla_naive_" + rel.replace("/", "_")[:-3], path)
            mod = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(mod)
            return mod
    pytest.skip(f"fla has no {rel}")


def _naive_kernels() -> dict:
    """fla's reference recurrences behind fla's kernel signatures ([B, T, H, D], ``scale``)."""
    delta = _load("ops/delta_rule/naive.py").delta_rule_recurrence
    iplr = _load("ops/generalized_delta_rule/iplr/naive.py").iplr_recurrence
    dplr = _load("ops/generalized_delta_rule/dplr/naive.py").dplr_recurrence
    hf = lambda x: x.transpose(1, 2)  # noqa: E731  [B, T, H, ...] <-> [B, H, T, ...]

    def unscale(q, scale):  # the naive recurrences always multiply q by dk^-0.5
        return q * (scale * q.shape[-1] ** 0.5)

    def delta_k(q, k, v, beta, scale, initial_state, output_final_state, **kw):
        o, S = delta(hf(unscale(q, scale)), hf(k), hf(v), hf(beta), initial_state=initial_state)
        return hf(o), S

    def iplr_k(q, k, v, a, b, scale, initial_state, output_final_state, **kw):
        o, S = iplr(hf(unscale(q, scale)), hf(k), hf(v), hf(a).float(), hf(b), initial_state=initial_state)
        return hf(o), S

    def dplr_k(q, k, v, a, b, gk, scale, initial_state, output_final_state, **kw):
        o, S = dplr(hf(unscale(q, scale)), hf(k), hf(v), hf(a).float(), hf(b), hf(gk), initial_state=initial_state)
        return hf(o), S

    return {"delta_chunk": delta_k, "delta_recurrent": delta_k, "general_chunk": dplr_k,
            "general_recurrent": iplr_k}


def _inputs(seed=0, B=2, T=13, H=3, dk=8, dv=6):
    g = torch.Generator().manual_seed(seed)
    f = torch.float32
    return dict(q=unit(torch.randn(B, T, H, dk, generator=g, dtype=f)),
                k=unit(torch.randn(B, T, H, dk, generator=g, dtype=f)),
                v=torch.randn(B, T, H, dv, generator=g, dtype=f),
                p_w=torch.rand(B, T, H, generator=g, dtype=f), p_e=torch.rand(B, T, H, generator=g, dtype=f),
                p_r=torch.rand(B, T, H, generator=g, dtype=f),
                state=torch.randn(B, H, dv, dk, generator=g, dtype=f))


def _run(fn, inp, same: bool):
    leaves = {n: t.clone().requires_grad_() for n, t in inp.items()}
    pe = leaves["p_w"] if same else leaves["p_e"]
    o, s = fn(leaves, pe)
    g = torch.Generator().manual_seed(1)
    ((o * torch.randn(o.shape, generator=g)).sum() + (s * torch.randn(s.shape, generator=g)).sum()).backward()
    names = ["q", "k", "v", "p_w", "p_r", "state"] + ([] if same else ["p_e"])
    return o.detach(), s.detach(), {n: leaves[n].grad for n in names if n in leaves}


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("same", [True, False], ids=["pe=pw", "pe!=pw"])
@pytest.mark.parametrize("with_state", [True, False])
def test_fla_mapping_matches_reference(mode, same, with_state):
    kernels = _naive_kernels()
    inp = _inputs()
    if not with_state:
        inp.pop("state")

    def ours(L, pe):
        return nam_scan(L["q"], L["k"], L["v"], L["p_w"], pe, L["p_r"], initial_state=L.get("state"),
                        impl="reference")

    def fla(L, pe):
        return nam_scan_fla(L["q"], L["k"], L["v"], L["p_w"], pe, L["p_r"], L.get("state"),
                            delta=same, mode=mode, kernels=kernels)

    o1, s1, g1 = _run(ours, inp, same)
    o2, s2, g2 = _run(fla, inp, same)
    torch.testing.assert_close(o2, o1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s2, s1, rtol=1e-4, atol=1e-5)
    for n in g1:
        if n == "state" and not with_state:
            continue
        torch.testing.assert_close(g2[n], g1[n], rtol=1e-4, atol=1e-4, msg=lambda m: f"gradient of {n}: {m}")


def test_fla_delta_flag_guards_unequal_probabilities():
    inp = _inputs()
    with pytest.raises(ValueError, match="p_e = p_w"):
        nam_scan_fla(inp["q"], inp["k"], inp["v"], inp["p_w"], inp["p_e"], delta=True, kernels={})


def test_fla_impl_reasons_on_cpu():
    from memnets.ops import nam_scan_resolve_impl, nam_scan_supports
    q = torch.randn(1, 8, 1, 4)
    assert nam_scan_supports("fla", q)  # CPU tensors: never fla
    assert nam_scan_resolve_impl("auto", q) == "chunked"
    assert nam_scan_resolve_impl("auto", q.bfloat16()) == "chunked"
    with pytest.raises(ValueError, match="impl='fla' cannot run"):
        nam_scan(q, q, q, 1.0, 1.0, impl="fla")
