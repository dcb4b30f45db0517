"""End-to-End Memory Networks (docs/maths.md §9): encodings, tying, attention, masking, LS, RN, learning."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import memnets
from memnets.memories.memn2n import (MemN2N, memory_attention, memory_mask, position_encoding,
                                     random_noise, sentence_encoding)

REPO = Path(__file__).resolve().parents[1]


def _stories(B=3, M=6, W=5, V=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(1, V, (B, M, W), generator=g)
    s[:, :, 3:] = 0  # sentences of 3 words
    s[0, 4:] = 0  # example 0 has 4 sentences
    q = torch.randint(1, V, (B, W), generator=g)
    q[:, 4:] = 0
    return s, q


def _model(**kw):
    torch.manual_seed(0)
    args = dict(vocab_size=12, embedding_dim=8, hops=3, memory_size=10, sentence_size=5)
    args.update(kw)
    return MemN2N(**args).double()


def test_position_encoding_hand_formula():
    J, d = 4, 5
    pe = position_encoding(J, d)
    for j in range(1, J + 1):
        for k in range(1, d + 1):
            assert pe[j - 1, k - 1].item() == pytest.approx((1 - j / J) - (k / d) * (1 - 2 * j / J))
    lengths = torch.tensor([[4, 2]])
    batched = position_encoding(lengths, d, max_words=6)
    assert batched.shape == (1, 2, 6, d)
    assert torch.allclose(batched[0, 0, :4], pe.to(batched.dtype))
    assert torch.allclose(batched[0, 1, :2], position_encoding(2, d).to(batched.dtype))


def test_sentence_encoding_pe_and_bow():
    emb = torch.nn.Embedding(7, 4, padding_idx=0)
    words = torch.tensor([[3, 5, 0, 0]])
    bow = sentence_encoding(words, emb, use_pe=False)
    assert torch.allclose(bow, emb.weight[3] + emb.weight[5])
    pe = position_encoding(2, 4)
    assert torch.allclose(sentence_encoding(words, emb, use_pe=True), pe[0] * emb.weight[3] + pe[1] * emb.weight[5])


def test_adjacent_tying_shares_right_tensors():
    m = _model(weight_tying="adjacent")
    K = m.config.hops
    assert len(m.embeddings) == K + 1
    for k in range(K - 1):
        assert m.embedding_A(k + 1).weight is m.embedding_C(k).weight  # A^{k+1} = C^k
    assert m.embedding_B().weight is m.embedding_A(0).weight  # B = A^1
    assert m.answer_weight() is m.embedding_C(K - 1).weight  # W^T = C^K
    assert m._temporal(1, "A") is m._temporal(0, "C")
    n_params = sum(p.numel() for p in m.parameters())
    assert n_params == (K + 1) * (12 * 8 + 10 * 8)
    with pytest.raises(ValueError, match="answer_size"):
        MemN2N(12, 8, sentence_size=5, answer_size=5)


def test_layerwise_tying_shares_A_C_and_uses_H():
    m = _model(weight_tying="layerwise", answer_size=6)
    for k in range(1, 3):
        assert m.embedding_A(k).weight is m.embedding_A(0).weight
        assert m.embedding_C(k).weight is m.embedding_C(0).weight
    assert m.embedding_B().weight is not m.embedding_A(0).weight
    s, q = _stories()
    logits, aux = m(s, q, return_aux=True)
    assert logits.shape == (3, 6)
    # u^{k+1} = H u^k + o^k: recompute by hand
    u = aux.controller
    c = sentence_encoding(s, m.embedding_C(0), True) + m._temporal(0, "C")[:6]
    o = torch.einsum("bm,bmd->bd", aux.attention[:, 1], c)
    assert torch.allclose(u[:, 2], m.H(u[:, 1]) + o)
    assert torch.allclose(logits, m.W(u[:, -1]))
    with torch.no_grad():
        m.H.weight.mul_(2.0)
    assert not torch.allclose(m(s, q), logits)


def test_forward_matches_hand_loop_adjacent():
    m = _model()
    s, q = _stories()
    logits, aux = m(s, q, return_aux=True)
    mask = memory_mask(s)
    u = sentence_encoding(q, m.embeddings[0], True)
    for k in range(3):
        a = sentence_encoding(s, m.embeddings[k], True) + m.temporal[k][:6]
        c = sentence_encoding(s, m.embeddings[k + 1], True) + m.temporal[k + 1][:6]
        for b in range(3):
            valid = mask[b]
            p = torch.softmax(a[b, valid] @ u[b], 0)
            assert torch.allclose(aux.attention[b, k, valid], p)
        p = aux.attention[:, k]
        u = u + (p.unsqueeze(-1) * c).sum(1)
    assert torch.allclose(logits, u @ m.embeddings[3].weight.t())


def test_attention_probs_sum_to_one_and_padding_ignored():
    m = _model()
    s, q = _stories()
    logits, aux = m(s, q, return_aux=True)
    assert aux.attention.shape == (3, 3, 6)
    assert torch.allclose(aux.attention.sum(-1), torch.ones(3, 3, dtype=torch.float64))
    assert bool((aux.attention[0, :, 4:] == 0).all())
    # extra padding sentences (up to memory_size) do not change the output
    padded = torch.cat([s, torch.zeros(3, 4, 5, dtype=torch.long)], 1)
    assert torch.allclose(m(padded, q), logits)
    # nor do padding words at the end of each sentence
    assert torch.allclose(m(s[:, :, :4], q[:, :4]), logits)


def test_linear_start_removes_softmax_toggle():
    m = _model(linear_start=True)
    s, q = _stories()
    _, aux = m(s, q, return_aux=True)
    u = sentence_encoding(q, m.embeddings[0], True)
    a = sentence_encoding(s, m.embeddings[0], True) + m.temporal[0][:6]
    assert torch.allclose(aux.attention[:, 0], torch.einsum("bd,bmd->bm", u, a) * memory_mask(s))
    m.linear_start = False
    _, aux2 = m(s, q, return_aux=True)
    assert torch.allclose(aux2.attention.sum(-1), torch.ones(3, 3, dtype=torch.float64))


def test_random_noise_grows_into_free_capacity_instead_of_dropping():
    """A batch trimmed to its longest story (here every slot is full) keeps all its
    sentences when the model has spare capacity; only a full memory drops the oldest."""
    s, _ = _stories(B=64, M=9)
    s[s == 0] = 1  # every slot holds a sentence
    mask = memory_mask(s)
    g = torch.Generator().manual_seed(0)
    out, new_mask = random_noise(s, mask, rate=0.3, generator=g, capacity=50)
    assert 9 < out.shape[1] <= 50 and new_mask.shape == out.shape[:2]
    for b in range(64):
        got = [tuple(r.tolist()) for r in out[b] if r.any()]
        assert got == [tuple(r.tolist()) for r in s[b]]  # nothing dropped, order kept
    assert torch.equal(new_mask, memory_mask(out))
    g = torch.Generator().manual_seed(0)
    tight, _ = random_noise(s, mask, rate=0.3, generator=g, capacity=9)  # a full memory
    assert tight.shape == s.shape and int(memory_mask(tight).sum()) < int(mask.sum())


def test_random_noise_inserts_empty_memories():
    s, _ = _stories(B=64, M=10)
    s[:, 6:] = 0
    mask = memory_mask(s)
    g = torch.Generator().manual_seed(0)
    out, new_mask = random_noise(s, mask, rate=0.3, generator=g, attend_empty=True)
    assert out.shape == s.shape and new_mask.shape == mask.shape
    g = torch.Generator().manual_seed(0)
    out2, mask2 = random_noise(s, mask, rate=0.3, generator=g)  # default: empties stay masked
    assert torch.equal(out2, out) and torch.equal(mask2, memory_mask(out))
    for b in range(64):
        real = [tuple(r.tolist()) for r, v in zip(s[b], mask[b]) if v]
        got = [tuple(r.tolist()) for r in out[b] if r.any()]
        assert got == real[: len(got)]  # order kept, only the oldest may fall off
        n_empty = int((new_mask[b] & ~memory_mask(out)[b]).sum())
        assert int(new_mask[b].sum()) == len(got) + n_empty
    assert int((new_mask & ~memory_mask(out)).sum()) > 0
    none, m2 = random_noise(s, mask, rate=0.0)
    assert torch.equal(none, s) and torch.equal(m2, mask)
    model = _model(random_noise=0.5)
    s2, q2 = _stories()
    model.eval()
    assert torch.equal(model(s2, q2), model(s2, q2))  # RN only in training mode
    model.train()
    torch.manual_seed(1)
    outs = [model(s2, q2) for _ in range(4)]
    assert any(not torch.allclose(outs[0], o) for o in outs[1:])


def test_gradients_finite_and_gradcheck():
    m = _model(hops=2, memory_size=6)
    s, q = _stories()
    params = [p for p in m.parameters()]
    logits = m(s, q)
    F.cross_entropy(logits, torch.tensor([1, 2, 3])).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    assert bool((m.embeddings[0].weight.grad[0] == 0).all())  # nil word never trained
    u = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    mem = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    assert torch.autograd.gradcheck(lambda a, b: memory_attention(a, b, mask), (u, mem))
    assert torch.autograd.gradcheck(lambda a, b: memory_attention(a, b, mask, linear=True), (u, mem))


def test_degenerate_inputs_no_nan():
    m = _model()
    s = torch.zeros(2, 4, 5, dtype=torch.long)  # no memories at all
    q = torch.zeros(2, 5, dtype=torch.long)  # empty query
    logits, aux = m(s, q, return_aux=True)
    assert torch.isfinite(logits).all() and bool((aux.attention == 0).all())
    F.cross_entropy(logits, torch.tensor([1, 2])).backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    u = torch.zeros(2, 8, dtype=torch.float64, requires_grad=True)
    p = memory_attention(u, torch.zeros(2, 4, 8, dtype=torch.float64), torch.ones(2, 4, dtype=torch.bool))
    assert torch.allclose(p, torch.full((2, 4), 0.25, dtype=torch.float64))


def test_bad_input_raises():
    m = _model()
    s, q = _stories()
    with pytest.raises(ValueError, match="`stories` expected"):
        m(s[0], q)
    with pytest.raises(ValueError, match="`query` expected"):
        m(s, q[:2])
    with pytest.raises(ValueError, match="memory_size=10"):
        m(torch.ones(3, 11, 5, dtype=torch.long), q)
    with pytest.raises(TypeError, match="integer word ids"):
        m(s.double(), q)
    with pytest.raises(TypeError, match="torch.Tensor"):
        m(s.tolist(), q)
    with pytest.raises(ValueError, match="weight_tying"):
        MemN2N(12, sentence_size=5, weight_tying="none")
    with pytest.raises(ValueError, match="hops"):
        MemN2N(12, hops=0, sentence_size=5)


def test_registered_and_exported():
    assert "memn2n" in memnets.available_models()
    m = memnets.build_model("memn2n", vocab_size=10, sentence_size=4)
    assert isinstance(m, memnets.MemN2N)


EPOCHS = 20


def _data_dir():
    for cand in (os.environ.get("MEMNETS_DATA"), REPO / ".." / "shared" / "data"):
        if cand and (Path(cand) / "babi" / "tasks_1-20_v1-2_en_en-10k.tar.gz").is_file():
            return Path(cand)
    return None


@pytest.mark.skipif(_data_dir() is None, reason="no bAbI archive under $MEMNETS_DATA or ../shared/data")
def test_learns_babi_task1_subset():
    from memnets.tasks import babi

    data = _data_dir()
    exs = babi.load_task(1, "train", data)
    vocab = babi.build_vocab(exs)
    train = babi.vectorize(exs[:200], vocab, memory_size=10)
    test = babi.vectorize(exs[800:1000], vocab, memory_size=10, sentence_size=train.stories.shape[-1])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        m = MemN2N(len(vocab), 20, 3, 10, sentence_size=train.stories.shape[-1])
        opt = torch.optim.Adam(m.parameters(), lr=0.02)
        for epoch in range(EPOCHS):
            m.train()
            for i in range(0, 200, 20):
                logits = m(train.stories[i:i + 20], train.queries[i:i + 20])
                loss = F.cross_entropy(logits, train.answers[i:i + 20])
                opt.zero_grad()
                loss.backward()
                opt.step()
        m.eval()
        with torch.no_grad():
            acc = (m(test.stories, test.queries).argmax(-1) == test.answers).float().mean().item()
    finally:
        torch.set_num_threads(threads)
    print(f"task 1 held-out accuracy after {EPOCHS} epochs on 200 examples: {acc:.3f}")
    assert acc > 0.6, acc


@pytest.mark.parametrize("pe,form", [(True, "paper"), (True, "code"), (False, "paper")])
@pytest.mark.parametrize("tying", ["adjacent", "layerwise"])
def test_bag_impl_equals_lookup_reference(pe, form, tying):
    kw = dict(position_encoding=pe, weight_tying=tying, answer_size=12, pe_form=form)
    fast, ref = _model(impl="fused", **kw), _model(impl="reference", **kw)
    ref.load_state_dict(fast.state_dict())
    s, q = _stories(B=4, M=7, W=5)
    s[1, :, 4] = 3  # a 5-word sentence and varied lengths
    s[2, 0, 1:] = 0
    y = torch.tensor([1, 5, 7, 2])
    grads = []
    for m in (fast, ref):
        logits, aux = m(s, q, return_aux=True)
        (F.cross_entropy(logits, y) + (aux.attention * torch.linspace(0, 1, 7, dtype=torch.float64)).sum()).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
        grads[-1]["_logits"] = logits.detach()
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-10), name


def test_out_of_vocab_ids_raise():
    m = _model()
    s, q = _stories()
    with pytest.raises(ValueError, match="vocab_size=12"):
        m(s, q + 20)


def test_fixed_pe_length_uses_sentence_size_for_every_sentence():
    """``pe_length="fixed"``: J = sentence_size, so a word's weights depend on its position
    only; bag and lookup implementations agree (values and gradients)."""
    from memnets.memories.memn2n import bag_weights, position_encoding
    words = torch.tensor([[4, 5, 0, 0, 0], [4, 5, 6, 7, 0]])
    b = bag_weights(words, True, torch.float64, length=5)
    assert torch.allclose(b.a[0, :2], b.a[1, :2]) and torch.allclose(b.b[0, :2], b.b[1, :2])
    assert torch.allclose(b.a[1, :4], (1 - torch.arange(1, 5, dtype=torch.float64) / 5))
    s_ = bag_weights(words, True, torch.float64)
    assert not torch.allclose(s_.a[0, :2], s_.a[1, :2])  # per-sentence J differs
    assert torch.allclose(position_encoding(5, 3), position_encoding(torch.tensor(5), 3, 5))
    kw = dict(answer_size=12, weight_tying="layerwise", pe_length="fixed")
    fast, ref = _model(impl="fused", **kw), _model(impl="reference", **kw)
    ref.load_state_dict(fast.state_dict())
    s, q = _stories(B=3, M=6, W=5)
    s[2, 0, 2:] = 0
    outs = []
    for m in (fast, ref):
        y = m(s, q)
        y.sum().backward()
        outs.append((y.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-10)
    for n in outs[0][1]:
        assert torch.allclose(outs[0][1][n], outs[1][1][n], atol=1e-10), n
    other = _model(impl="fused", answer_size=12, weight_tying="layerwise")
    other.load_state_dict(fast.state_dict())
    assert not torch.allclose(other(s, q), outs[0][0])
    with pytest.raises(ValueError, match="pe_length"):
        _model(pe_length="max")


def test_code_pe_form_hand_formula_and_scale():
    """``pe_form="code"``: ``1 + 4(k - (d+1)/2)(j - (J+1)/2)/(dJ)``, per-sentence or fixed J,
    in both implementations; about twice the paper form's weights (mean 1 vs 1/2)."""
    from memnets.memories.memn2n import bag_weights
    J, d = 5, 6
    pe = position_encoding(J, d, form="code")
    for j in range(1, J + 1):
        for k in range(1, d + 1):
            assert pe[j - 1, k - 1].item() == pytest.approx(1 + 4 * (k - (d + 1) / 2) * (j - (J + 1) / 2) / (d * J))
    assert pe.mean().item() == pytest.approx(1.0) and position_encoding(J, d).mean().item() == pytest.approx(0.5, abs=0.05)
    words = torch.tensor([[3, 5, 2, 0, 0], [4, 1, 6, 7, 2]])
    for length in (None, 5):
        bags = bag_weights(words, True, torch.float64, length, form="code", embedding_dim=d)
        k = torch.arange(1, d + 1, dtype=torch.float64) / d
        full = bags.a[..., None] + k * bags.b[..., None]  # [N, W, d]
        lengths = (words != 0).sum(-1) if length is None else torch.full((2,), length)
        ref = position_encoding(lengths, d, 5, form="code").to(torch.float64) * (words != 0)[..., None]
        assert torch.allclose(full, ref), length
    with pytest.raises(ValueError, match="embedding_dim"):
        bag_weights(words, True, torch.float64, form="code")
    with pytest.raises(ValueError, match="pe_form"):
        _model(pe_form="matlab")
    with pytest.raises(ValueError, match="pe_form"):
        position_encoding(3, 4, form="x")


@pytest.mark.skipif(_data_dir() is None, reason="no bAbI archive under $MEMNETS_DATA or ../shared/data")
def test_code_pe_form_learns_task16_basic_induction(tmp_path):
    """bAbI task 16 with the released code's recipe: PE code form, linear start for 20 full
    epochs (SGD lr 0.005, loss summed over the batch), then 3 epochs with the softmax. The
    validation accuracy must pass 85% (with the paper's PE form the same run stays near 50%)."""
    from memnets.train import load_config, train

    cfg = load_config("babi/memn2n-task1", ["task.options.tasks=[16]", "task.options.softmax_epochs=3",
                                            "epochs=23"])
    threads = torch.get_num_threads()
    old = os.environ.get("MEMNETS_DATA")
    os.environ["MEMNETS_DATA"] = str(_data_dir())
    try:
        res = train(cfg, tmp_path / "t16", quiet=True)
    finally:
        torch.set_num_threads(threads)
        if old is None:
            os.environ.pop("MEMNETS_DATA")
        else:
            os.environ["MEMNETS_DATA"] = old
    info = {"best_valid_acc": res["splits"]["valid"]["accuracy"]}
    print(f"task 16 validation accuracy after LS + 3 epochs: {info['best_valid_acc']:.3f}")
    assert info["best_valid_acc"] > 0.85, info["best_valid_acc"]


def test_impl_vocabulary():
    """auto (= fused) | reference | fused; the old names bag and lookup warn and map."""
    assert _model().impl == "fused" and _model(impl="reference").impl == "reference"
    with pytest.warns(FutureWarning, match="bag"):
        assert _model(impl="bag").impl == "fused"
    with pytest.warns(FutureWarning, match="lookup"):
        assert _model(impl="lookup").impl == "reference"
