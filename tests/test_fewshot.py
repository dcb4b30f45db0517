"""NAM few-shot classifier (docs/maths.md §4, Algorithm 1): loop of nam_write == batched weights,
reduction to the cosine classifier, erase behaviour, training, bad input."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import memnets
from memnets.memories.fewshot import (CosineClassifier, NAMFewShotClassifier, cosine_fewshot_weights,
                                      fewshot_accuracies, nam_fewshot_weights)
from memnets.ops import nam_write, unit

DT = torch.float64


def algorithm1_loop(Wb, support, p_w, p_e):
    """Algorithm 1 written shot by shot with nam_write (each write from the same W)."""
    N, K, F = support.shape
    Bc = Wb.shape[0]
    W = torch.cat([Wb, torch.zeros(N, F, dtype=Wb.dtype)], 0)
    Wn = W.clone()
    for n in range(N):
        for k in range(K):
            e = torch.zeros(Bc + N, dtype=W.dtype)
            e[Bc + n] = 1.0
            Wn = Wn + (nam_write(W, unit(support[n, k]), e, p_w[n, k], p_e[n, k]) - W) / K
    return unit(Wn)


def test_batched_weights_match_nam_write_loop_values_and_grads():
    g = torch.Generator().manual_seed(0)
    Wb = torch.randn(4, 6, generator=g, dtype=DT, requires_grad=True)
    S = torch.randn(3, 2, 6, generator=g, dtype=DT, requires_grad=True)
    pw = torch.rand(3, 2, generator=g, dtype=DT, requires_grad=True)
    pe = torch.rand(3, 2, generator=g, dtype=DT, requires_grad=True)
    a, b = nam_fewshot_weights(Wb, S, pw, pe), algorithm1_loop(Wb, S, pw, pe)
    torch.testing.assert_close(a, b)
    c = torch.randn(a.shape, generator=g, dtype=DT)
    ga = torch.autograd.grad((a * c).sum(), [Wb, S, pw, pe])
    gb = torch.autograd.grad((b * c).sum(), [Wb, S, pw, pe])
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y)
    assert torch.autograd.gradcheck(nam_fewshot_weights, (Wb, S, pw, pe))


def test_pw1_pe0_is_exactly_the_cosine_classifier():
    torch.manual_seed(1)
    nam = NAMFewShotClassifier(6, 4, hidden=8).to(DT)
    cos = CosineClassifier(6, 4).to(DT)
    cos.weight_base.data.copy_(nam.weight_base.data)
    S = torch.randn(3, 5, 6, dtype=DT)
    ones, zeros = torch.ones(3, 5, dtype=DT), torch.zeros(3, 5, dtype=DT)
    Wn = nam.weights(S, p_w=ones, p_e=zeros)
    torch.testing.assert_close(Wn, cos.weights(S), rtol=1e-13, atol=1e-14)
    # rows are unit, novel rows are the mean of the unit support features, normalised
    torch.testing.assert_close(Wn.norm(dim=-1), torch.ones(7, dtype=DT))
    torch.testing.assert_close(Wn[4:], unit(unit(S).mean(1)))
    x = torch.randn(10, 6, dtype=DT)
    torch.testing.assert_close(unit(x) @ Wn.T, cos(x, S))


def test_one_shot_write_maps_support_to_its_class_and_erase_suppresses_base():
    """Cor 3.4 / Thm 3.1: with p_w = p_e = 1 and K = 1, W' x̂ = e_{Bc+n} before normalising
    when the supports are orthonormal; the erase removes the base rows' response to x̂."""
    g = torch.Generator().manual_seed(2)
    F, Bc, N = 8, 3, 2
    Q, _ = torch.linalg.qr(torch.randn(F, F, generator=g, dtype=DT))
    S = Q[:, :N].T.unsqueeze(1)  # orthonormal supports [N, 1, F]
    Wb = torch.randn(Bc, F, generator=g, dtype=DT)
    W = nam_fewshot_weights(Wb, S, torch.ones(N, 1, dtype=DT), torch.ones(N, 1, dtype=DT))
    resp = W @ S[:, 0].T  # [Bc+N, N]: column n = scores of support n
    torch.testing.assert_close(resp[:Bc], torch.zeros(Bc, N, dtype=DT), atol=1e-12, rtol=0)
    torch.testing.assert_close(resp[Bc:], torch.eye(N, dtype=DT))


def test_scores_shapes_and_base_only():
    torch.manual_seed(3)
    m = NAMFewShotClassifier(6, 4, hidden=8, scale=10.0)
    S = torch.randn(2, 3, 6)
    s = m(torch.randn(5, 6), S)
    assert s.shape == (5, 6) and s.abs().max() <= 10.0 + 1e-5
    assert m(torch.randn(2, 5, 6)).shape == (2, 5, 4)
    p_w, p_e = m.gates(S)
    assert p_w.shape == p_e.shape == (2, 3) and ((p_w > 0) & (p_w < 1)).all()
    Wb = torch.randn(7, 6)
    assert m(torch.randn(5, 6), S, base_weight=Wb).shape == (5, 9)


def test_zero_features_no_nan():
    m = NAMFewShotClassifier(6, 4, hidden=8).to(DT)
    S = torch.zeros(2, 3, 6, dtype=DT, requires_grad=True)
    x = torch.zeros(4, 6, dtype=DT, requires_grad=True)
    s = m(x, S)
    s.sum().backward()
    assert torch.isfinite(s).all() and torch.isfinite(S.grad).all() and torch.isfinite(x.grad).all()


def test_accuracies():
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.9], [0.1, 0.2, 0.7], [0.6, 0.1, 0.5]])
    labels = torch.tensor([0, 1, 2, 2])
    acc = fewshot_accuracies(scores, labels, num_base=2)
    assert acc == {"Both": 0.5, "Novel": 1.0, "Base": 1.0}


def test_bad_input_raises():
    m = NAMFewShotClassifier(6, 4, hidden=8)
    with pytest.raises(ValueError, match="`support`"):
        m(torch.randn(5, 6), torch.randn(3, 6))
    with pytest.raises(ValueError, match="`support`"):
        m(torch.randn(5, 6), torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="`x`"):
        m(torch.randn(5, 7), torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match="`base_weight`"):
        m(torch.randn(5, 6), torch.randn(2, 3, 6), base_weight=torch.randn(4, 5))
    with pytest.raises(ValueError, match="`support`"):
        cosine_fewshot_weights(torch.randn(4, 6), torch.randn(2, 0, 6))


def test_registry():
    assert isinstance(memnets.build_model("nam_fewshot", feature_dim=4, num_base_classes=2, hidden=8),
                      NAMFewShotClassifier)
    assert isinstance(memnets.build_model("cosine_classifier", feature_dim=4, num_base_classes=2), CosineClassifier)
    assert memnets.CosineClassifier is CosineClassifier


def test_trains_on_synthetic_episodes():
    """Base weights and gate MLPs learn from episodes (base + novel queries); loss drops."""
    torch.manual_seed(0)
    F, Bc, pool, N, K = 16, 4, 10, 2, 3
    protos = torch.randn(pool, F)
    m = NAMFewShotClassifier(F, Bc, hidden=16, scale=10.0)
    opt = torch.optim.Adam(m.parameters(), lr=5e-2)
    losses = []
    for _ in range(40):
        novel = Bc + torch.randperm(pool - Bc)[:N]
        support = protos[novel].unsqueeze(1) + 0.5 * torch.randn(N, K, F)
        cls = torch.cat([torch.arange(Bc), novel]).repeat(4)
        labels = torch.cat([torch.arange(Bc), Bc + torch.arange(N)]).repeat(4)
        x = protos[cls] + 0.5 * torch.randn(len(cls), F)
        loss = torch.nn.functional.cross_entropy(m(x, support), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


@settings(max_examples=10, deadline=None)
@given(Bc=st.integers(1, 5), N=st.integers(1, 4), K=st.integers(1, 4), F=st.integers(2, 7), seed=st.integers(0, 99))
def test_theorem_3_5_property(Bc, N, K, F, seed):
    """Thm 3.5 over random shapes: p_w = 1, p_e = 0 gives the feature-averaging cosine classifier;
    with p_e = 0 the base rows are never touched."""
    g = torch.Generator().manual_seed(seed)
    Wb = torch.randn(Bc, F, generator=g, dtype=DT)
    S = torch.randn(N, K, F, generator=g, dtype=DT)
    ones, zeros = torch.ones(N, K, dtype=DT), torch.zeros(N, K, dtype=DT)
    torch.testing.assert_close(nam_fewshot_weights(Wb, S, ones, zeros), cosine_fewshot_weights(Wb, S))
    W = nam_fewshot_weights(Wb, S, torch.rand(N, K, generator=g, dtype=DT), zeros)
    torch.testing.assert_close(W[:Bc], unit(Wb))
