"""Conv-4, NAM few-shot weights (Algorithm 1) and the Table 2 evaluation (memnets.recipes.fewshot);
the pre-training and few-shot stages through `memnets train` are in tests/test_engine_fewshot.py."""
from __future__ import annotations

import math

import pytest
import torch

import memnets.recipes.fewshot as fs
from memnets.memories.fewshot import cosine_fewshot_weights, nam_fewshot_weights
from memnets.models.conv4 import Conv4, CosineHead, l2_normalize


def test_conv4_shape_and_bad_input():
    m = Conv4()
    y = m(torch.rand(3, 1, 28, 28))
    assert y.shape == (3, 64) and bool((y >= 0).all())
    assert sum(p.numel() for p in m.parameters()) == 111936  # 4 × (conv 3×3 + BN), 64 channels
    with pytest.raises(ValueError, match=r"`x` expected \[B, C_in, H, W\]"):
        m(torch.rand(3, 28, 28))
    with pytest.raises(ValueError, match="C_in"):
        m(torch.rand(3, 3, 28, 28))


def test_cosine_head_bounded_by_scale():
    h = CosineHead(8, 5, scale=7.0)
    z = h(torch.randn(4, 8))
    assert z.shape == (4, 5) and float(z.detach().abs().max()) <= 7.0 + 1e-5
    x = h.weight[2:3].detach() * 3.0  # a feature along class 2's row scores exactly s
    assert torch.allclose(h(x)[0, 2], torch.tensor(7.0), atol=1e-5)


def _reference_nam(w_base, support, p_w, p_e):
    """Algorithm 1 written as the double loop of docs/maths.md §4: W' = W + Σ_nk ΔW_nk / K, ΔW from the initial W."""
    n, k, f = support.shape
    b = w_base.shape[0]
    w = torch.cat([w_base, w_base.new_zeros(n, f)])
    acc = w.clone()
    for i in range(n):
        for j in range(k):
            xh = support[i, j] / support[i, j].norm().clamp_min(1e-12)
            e = w_base.new_zeros(b + n)
            e[b + i] = 1.0
            acc = acc + (p_w[i, j] * torch.outer(e, xh) - p_e[i, j] * torch.outer(w @ xh, xh)) / k
    return acc / acc.norm(dim=1, keepdim=True).clamp_min(1e-12)


def test_nam_weights_match_reference_values_and_grads():
    g = torch.Generator().manual_seed(0)
    wb = torch.randn(7, 6, generator=g, dtype=torch.float64, requires_grad=True)
    s = torch.randn(3, 2, 6, generator=g, dtype=torch.float64, requires_grad=True)
    pw = torch.rand(3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    pe = torch.rand(3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    fast, ref = nam_fewshot_weights(wb, s, pw, pe), _reference_nam(wb, s, pw, pe)
    assert fast.shape == (10, 6)
    torch.testing.assert_close(fast, ref)
    cot = torch.randn(10, 6, generator=g, dtype=torch.float64)
    gf = torch.autograd.grad((fast * cot).sum(), (wb, s, pw, pe))
    gr = torch.autograd.grad((ref * cot).sum(), (wb, s, pw, pe))
    for a, b in zip(gf, gr):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(nam_fewshot_weights, (wb, s, pw, pe))


def test_cosine_special_case_and_erase():
    g = torch.Generator().manual_seed(1)
    wb, s = torch.randn(5, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    w = cosine_fewshot_weights(wb, s)
    torch.testing.assert_close(w[:5], l2_normalize(wb))  # base rows untouched (Thm 3.5 baseline)
    torch.testing.assert_close(w[5:], l2_normalize(l2_normalize(s).mean(1)))  # mean of unit features
    # p_e = 1 with one shot of a unit axis: base rows lose exactly that component
    e0 = torch.zeros(1, 1, 4)
    e0[0, 0, 0] = 2.0
    we = nam_fewshot_weights(wb, e0, torch.ones(1, 1), torch.ones(1, 1))
    assert torch.allclose(we[:5, 0], torch.zeros(5), atol=1e-6)
    torch.testing.assert_close(we[5], torch.tensor([1.0, 0, 0, 0]))


def test_degenerate_inputs_no_nan():
    wb = torch.zeros(3, 4, requires_grad=True)
    s = torch.zeros(2, 1, 4, requires_grad=True)
    gates = fs.make_gates(4, 3, hidden=8)
    w = gates.weights(s, base_weight=wb)
    w.sum().backward()
    assert torch.isfinite(w).all() and torch.isfinite(wb.grad).all() and torch.isfinite(s.grad).all()


def test_gates_start_near_cosine():
    pw, pe = fs.make_gates(6, 4, hidden=16).gates(torch.randn(3, 2, 6))
    assert pw.shape == pe.shape == (3, 2)
    assert bool((pw > 0.9).all()) and bool((pe < 0.1).all())


def test_episode_accuracies_hand_case():
    # 2 base rows (axes 0, 1), 2 novel rows (axes 2, 3)
    w = torch.eye(4)
    novel_q = torch.tensor([[0, 0, 1.0, 0], [0, 0, 0, 1.0], [0, 0, 1.0, 0], [1.0, 0, 0, 0.5]])
    novel_y = torch.tensor([0, 1, 1, 1])  # 3rd is wrong among novel; 4th right among novel, wrong in Both
    base_q = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0.9, 0]])
    base_y = torch.tensor([0, 1])  # both right among base; 2nd right in Both too (1.0 > 0.9)
    r = fs.episode_accuracies(w, 2, novel_q, novel_y, base_q, base_y)
    assert r["novel"] == pytest.approx(3 / 4)
    assert r["base"] == pytest.approx(1.0)
    assert r["both"] == pytest.approx(4 / 6)


def test_mean_ci():
    m, h = fs.mean_ci(torch.tensor([0.5, 1.0, 1.0, 0.5]))
    assert m == pytest.approx(0.75)
    assert h == pytest.approx(1.96 * math.sqrt(1 / 12) / 2)


def _synthetic_feats(noise: float):
    """Base classes = axes 0..9 of R^16, novel classes = axes 10..15; features = axis + noise."""
    g = torch.Generator().manual_seed(0)
    eye = torch.eye(16)
    base = eye[:10, None, :] + noise * torch.randn(10, 20, 16, generator=g)
    novel = eye[10:, None, :] + noise * torch.randn(6, 20, 16, generator=g)
    return {"base": base, "base_ids": torch.arange(10), "novel": novel, "w_base": eye[:10].clone(),
            "scale": torch.tensor(10.0)}


def test_evaluate_setting_separable_and_confusable():
    feats = _synthetic_feats(0.0)
    r = fs.evaluate_setting(feats, 3, 1, 2, 20, {"cosine": cosine_fewshot_weights}, seed=0)
    for key in ("novel", "base", "both"):
        assert r["cosine"][key] == {"mean": 100.0, "ci95": 0.0}
    # novel class n looks exactly like base class n: novel queries tie with a base row and lose in
    # Both (argmax returns the first maximum, a base row); base queries keep winning
    feats = _synthetic_feats(0.0)
    feats["novel"][:, :, :] = torch.eye(16)[:6, None, :]  # novel class n looks exactly like base class n
    r = fs.evaluate_setting(feats, 3, 1, 2, 30, {"cosine": cosine_fewshot_weights}, seed=0)
    assert r["cosine"]["novel"]["mean"] == 100.0 and r["cosine"]["base"]["mean"] == 100.0
    assert r["cosine"]["both"] == {"mean": 50.0, "ci95": 0.0}


def test_gate_steps_and_table():
    feats = _synthetic_feats(0.3)
    torch.manual_seed(0)
    gates = fs.make_gates(16, 10, hidden=8)
    opt = torch.optim.Adam(gates.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        loss, p_w, p_e = fs.gate_loss(gates, feats, fs.gate_episode(feats, 2, 2, 2, g), 2, 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    pw, pe = gates.gates(feats["novel"][:2, :2])
    assert bool(((pw > 0) & (pw < 1) & (pe > 0) & (pe < 1)).all())
    r = fs.evaluate_setting(feats, 2, 2, 3, 5, {"cosine": cosine_fewshot_weights,
                                               "nam": lambda w, s: gates.weights(s, base_weight=w)}, seed=1)
    md = fs.format_fewshot_table([{"way": 2, "shot": 2, "episodes": 5, "methods": r}])
    assert "| 2-way 2-shot | nam |" in md and "±" in md


def test_extract_features_is_frozen():
    m = Conv4()
    images = (torch.rand(2, 3, 28, 28) < 0.1).to(torch.uint8) * 255
    f = fs.extract_features(m, images)
    assert f.shape == (2, 3, 64) and not m.training
