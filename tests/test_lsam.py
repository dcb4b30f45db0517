"""LSAM (docs/maths.md §2, §12): the fast layer against a loop of reference cells, state carrying,
special cases, bad input, training, and the encoder–decoder."""
import pytest
import torch

import memnets
from memnets.memories.lsam import LSAM, LSAMCell, LSAMCellState, LSAMState
from memnets.ops.lsam import LSAMRecurrence
from memnets.models.lsam_seq2seq import LSAMEncDecState, LSAMEncoderDecoder
from memnets.ops import nam_read, nam_write, unit

DT = torch.float64


def cell_of(m: LSAM, layer: int, direction: int) -> LSAMCell:
    """An LSAMCell whose parameters ARE slices of the layer's (gradients flow to ``m``)."""
    w_ih, w_hh, b = m.layer_weights(layer)
    c = LSAMCell(w_ih.shape[-1], m.hidden_size // m.num_directions, m.num_heads // m.num_directions)
    del c.weight_ih, c.weight_hh, c.bias
    c.weight_ih, c.weight_hh, c.bias = w_ih[direction], w_hh[direction], b[direction]
    return c


def reference(m: LSAM, x: torch.Tensor, state: LSAMState):
    """Plain loop of cells, layer by layer, the backward direction on the reversed sequence."""
    dirs, inp, mems, hs = m.num_directions, x, [], []
    for l in range(m.num_layers):
        outs = []
        for j in range(dirs):
            s0 = LSAMCellState(state.memory[l * dirs + j], state.h[l * dirs + j])
            xi = inp if j == 0 else inp.flip(1)
            y, s = cell_of(m, l, j)(xi, s0)
            mems.append(s.memory)
            hs.append(s.h)
            outs.append(y if j == 0 else y.flip(1))
        inp = torch.cat(outs, -1)
    return inp, torch.stack(mems), torch.stack(hs)


def random_state(m, B, g):
    s = m.init_state(B, dtype=DT)
    return LSAMState(torch.randn(s.memory.shape, generator=g, dtype=DT).requires_grad_(),
                     torch.randn(s.h.shape, generator=g, dtype=DT).requires_grad_())


@pytest.mark.parametrize("bidirectional,T,layers", [(False, 7, 2), (True, 7, 2), (True, 70, 1)])
def test_layer_matches_cell_loop_values_and_grads(bidirectional, T, layers):
    """T = 70 crosses the exact-copy segments of the backward pass (reversal + resets)."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    m = LSAM(5, 12, 4, num_layers=layers, bidirectional=bidirectional).to(DT)
    x = torch.randn(3, T, 5, generator=g, dtype=DT, requires_grad=True)
    st = random_state(m, 3, g)
    y, s = m(x, st)
    yr, Mr, hr = reference(m, x, st)
    assert y.shape == (3, T, 12)
    torch.testing.assert_close(y, yr, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(s.memory, Mr, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(s.h, hr, rtol=1e-10, atol=1e-12)
    cy, cM, ch = (torch.randn(t.shape, generator=g, dtype=DT) for t in (yr, Mr, hr))
    names = ["x", "state.memory", "state.h"] + [n for n, _ in m.named_parameters()]
    ins = [x, st.memory, st.h] + list(m.parameters())
    g1 = torch.autograd.grad((y * cy).sum() + (s.memory * cM).sum() + (s.h * ch).sum(), ins)
    g2 = torch.autograd.grad((yr * cy).sum() + (Mr * cM).sum() + (hr * ch).sum(), ins)
    for n, a, b in zip(names, g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=n)


def test_cell_step_is_spec_formula():
    g = torch.Generator().manual_seed(1)
    c = LSAMCell(3, 8, 2).to(DT)
    x = torch.randn(4, 3, generator=g, dtype=DT)
    s0 = LSAMCellState(torch.randn(4, 2, 4, 4, generator=g, dtype=DT), torch.randn(4, 8, generator=g, dtype=DT))
    h, s = c.step(x, s0)
    z = torch.cat([x, s0.h], -1)
    W = torch.cat([c.weight_ih, c.weight_hh], 1)
    out = z @ W.T + c.bias
    q, k, v = (out[:, i * 8:(i + 1) * 8].reshape(4, 2, 4) for i in range(3))
    p_r, p_w = torch.sigmoid(out[:, 24:26]), torch.sigmoid(out[:, 26:28])
    M = s0.memory.clone()
    for b in range(4):
        for hd in range(2):
            kk = k[b, hd] / k[b, hd].norm()
            M[b, hd] = M[b, hd] + p_w[b, hd] * torch.outer(v[b, hd] - M[b, hd] @ kk, kk)
    r = torch.einsum("bhvk,bhk->bhv", M, unit(q)) * p_r[..., None]
    torch.testing.assert_close(s.memory, M)
    torch.testing.assert_close(h, r.reshape(4, 8))
    torch.testing.assert_close(s.memory, nam_write(s0.memory, unit(k), v, p_w, p_w))
    torch.testing.assert_close(h, nam_read(s.memory, unit(q), p_r).reshape(4, 8))


@pytest.mark.parametrize("B,Hp,compiled", [(1, 2, True), (3, 1, True), (1, 2, False), (3, 1, False)])
def test_recurrence_gradcheck(B, Hp, compiled):
    """The Function's hand-written backward, with the compiled and with the Python loops."""
    g = torch.Generator().manual_seed(2)
    T, dirs, d = 3, 2, 2
    G, Dp, N = Hp * (3 * d + 2), Hp * d, dirs * B * Hp
    gx = torch.randn(T, dirs, B, G, generator=g, dtype=DT, requires_grad=True)
    w = (0.5 * torch.randn(dirs, G, Dp, generator=g, dtype=DT)).requires_grad_()
    M0 = torch.randn(N, d, d, generator=g, dtype=DT, requires_grad=True)
    h0 = torch.randn(dirs, B, Dp, generator=g, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: LSAMRecurrence.apply(*a, compiled), (gx, w, M0, h0))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_compiled_and_python_loops_match(bidirectional):
    """The TorchScript-compiled loops and the same loops run as Python give the same values
    and gradients (T = 40 crosses an exact-copy segment), and the compiled ones are used."""
    from memnets.ops.lsam import lsam_scan, loops as lsam_loops

    assert lsam_loops.loops()[2], "TorchScript should compile the LSAM loops with this PyTorch"
    g = torch.Generator().manual_seed(4)
    m = LSAM(5, 12, 4, bidirectional=bidirectional).to(DT)
    x = torch.randn(40, 7, 5, generator=g, dtype=DT, requires_grad=True)  # [T, B, F]
    st = random_state(m, 7, g)
    w_ih, w_hh, b = m.layer_weights(0)
    ins = [x, st.memory, st.h, w_ih, w_hh, b]
    Hp = m.num_heads // m.num_directions
    outs, grads = [], []
    for compiled in (True, False):
        y, M, h = lsam_scan(x, w_ih, w_hh, b, st.memory, st.h, Hp, compiled=compiled)
        g2 = torch.Generator().manual_seed(9)
        loss = sum((t * torch.randn(t.shape, generator=g2, dtype=DT)).sum() for t in (y, M, h))
        outs.append((y, M, h))
        grads.append(torch.autograd.grad(loss, ins))
    for a, b_ in zip(outs[0], outs[1]):
        torch.testing.assert_close(a, b_, rtol=1e-12, atol=1e-13)
    for a, b_ in zip(grads[0], grads[1]):
        torch.testing.assert_close(a, b_, rtol=1e-11, atol=1e-12)


def test_float32_gradients_stay_close_over_long_sequences():
    """The backward pass recovers memories by reversing the writes in place; over T = 200
    float32 steps its gradients stay close to the float64 reference."""
    torch.manual_seed(5)
    m = LSAM(4, 8, 2)
    x = torch.randn(2, 200, 4)
    y, s = m(x)
    (y.sum() + s.memory.sum()).backward()
    g32 = [p.grad.clone() for p in m.parameters()]
    m.double().zero_grad()
    y, s = m(x.double())
    (y.sum() + s.memory.sum()).backward()
    for a, b in zip(g32, m.parameters()):
        torch.testing.assert_close(a.double(), b.grad, rtol=1e-3, atol=1e-4)


def test_whole_equals_halves_equals_tokens():
    torch.manual_seed(3)
    m = LSAM(4, 8, 2, num_layers=2).to(DT)
    x = torch.randn(2, 9, 4, dtype=DT)
    y, s = m(x)
    y1, s1 = m(x[:, :4])
    y2, s2 = m(x[:, 4:], s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y)
    torch.testing.assert_close(s2.memory, s.memory)
    st, ys = None, []
    for t in range(9):
        yt, st = m.step(x[:, t], st)
        ys.append(yt)
    torch.testing.assert_close(torch.stack(ys, 1), y)
    torch.testing.assert_close(st.h, s.h)


def test_time_major_and_bidirectional_shapes():
    torch.manual_seed(4)
    m = LSAM(3, 8, 4, num_layers=2, bidirectional=True)
    x = torch.randn(2, 5, 3)
    y, s = m(x)
    assert y.shape == (2, 5, 8) and s.memory.shape == (4, 2, 2, 2, 2) and s.h.shape == (4, 2, 4)
    m2 = LSAM(3, 8, 4, num_layers=2, bidirectional=True, batch_first=False)
    m2.load_state_dict(m.state_dict())
    y2, _ = m2(x.transpose(0, 1))
    torch.testing.assert_close(y2.transpose(0, 1), y)
    # one layer: the backward half at t=0 depends on the last input, the forward half does not
    m1 = LSAM(3, 8, 4, bidirectional=True)
    y, _ = m1(x)
    x2 = x.clone()
    x2[:, -1] += 1.0
    y3, _ = m1(x2)
    assert torch.equal(y3[:, 0, :4], y[:, 0, :4]) and not torch.allclose(y3[:, 0, 4:], y[:, 0, 4:])


def test_zero_input_and_weights_give_no_nan():
    m = LSAM(3, 8, 2, num_layers=2, bidirectional=True).to(DT)
    for p in m.parameters():
        torch.nn.init.zeros_(p)
    x = torch.zeros(2, 6, 3, dtype=DT, requires_grad=True)
    y, s = m(x)
    assert torch.equal(y, torch.zeros_like(y)) and torch.equal(s.memory, torch.zeros_like(s.memory))
    (y.sum() + s.memory.sum()).backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_bad_input_raises():
    m = LSAM(3, 8, 2)
    with pytest.raises(ValueError, match="`x`"):
        m(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match="`x`"):
        m(torch.randn(5, 4))  # unbatched [T, input_size] of the wrong width
    with pytest.raises(ValueError, match="`x`"):
        m(torch.randn(3))
    with pytest.raises(ValueError, match="state.memory"):
        m(torch.randn(2, 5, 3), LSAMState(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 8)))
    with pytest.raises(ValueError, match="num_heads"):
        LSAM(3, 8, 3)
    with pytest.raises(ValueError, match="num_heads"):
        LSAM(3, 8, 1, bidirectional=True)
    with pytest.raises(ValueError, match="bidirectional"):
        LSAM(3, 8, 2, bidirectional=True).step(torch.randn(2, 3))
    with pytest.raises(TypeError, match="`x`"):
        m([1, 2, 3])
    with pytest.raises(TypeError, match="`state`"):
        m(torch.randn(2, 5, 3), m.init_state(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="`x_t`"):
        LSAMCell(3, 8, 2).step(torch.randn(2, 4))


def test_registry_builds_models():
    assert isinstance(memnets.build_model("lsam", input_size=3, hidden_size=8, num_heads=2), LSAM)
    assert memnets.LSAMCell is LSAMCell


def test_lsam_trains_on_delayed_recall():
    """Predict the token seen two steps earlier: needs memory; loss must drop clearly."""
    torch.manual_seed(0)
    V, B, T = 4, 32, 10
    emb = torch.nn.Embedding(V, 16)
    m = LSAM(16, 16, 2)
    head = torch.nn.Linear(16, V)
    params = [*emb.parameters(), *m.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=2e-2)
    losses = []
    for _ in range(60):
        tok = torch.randint(0, V, (B, T))
        y, _ = m(emb(tok))
        loss = torch.nn.functional.cross_entropy(head(y[:, 2:]).reshape(-1, V), tok[:, :-2].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


def test_encoder_decoder_shapes_state_and_training():
    torch.manual_seed(0)
    m = LSAMEncoderDecoder(16, 4, 32, dropout=0.0)
    assert isinstance(memnets.build_model("lsam_encdec", d_model=16, num_heads=4), LSAMEncoderDecoder)
    x = torch.randn(3, 6, 16)
    y, s = m(x)
    assert y.shape == (3, 6, 16) and isinstance(s, LSAMEncDecState)
    assert s.decoder.memory.shape == (1, 3, 4, 4, 4)
    # the decoder starts from the encoder's final memories and h_0 = 0, and its reads go
    # through the output block Linear → ReLU → LayerNorm (dropout 0 here)
    e, enc = m.encode(x)
    mem0 = enc.memory.transpose(0, 1).flatten(1, 2).unsqueeze(0)
    u, _ = m.decoder(e, LSAMState(mem0, torch.zeros(1, 3, 16)))
    torch.testing.assert_close(y, m.dec_norm(torch.relu(m.dec_out(u))))
    u0, _ = m.decoder(e)  # from zero memories: another output
    assert not torch.allclose(m.dec_norm(torch.relu(m.dec_out(u0))), y)
    bare = LSAMEncoderDecoder(16, 4, 32, dropout=0.0, output_block=False)
    assert sum(p.numel() for p in m.parameters()) - sum(p.numel() for p in bare.parameters()) == 16 * 16 + 16 + 2 * 16
    bare.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("dec_")})
    torch.testing.assert_close(bare(x)[0], u)
    with pytest.raises(TypeError, match="output_block"):
        LSAMEncoderDecoder(16, 4, 32, output_block="yes")
    with pytest.raises(ValueError, match="`x`"):
        m(torch.randn(3, 6, 8))
    # echo the tokens: the output is a read of the decoder's memory, so it must learn to write
    # and read back (q ≈ k); the loss must drop clearly
    V = 4
    emb, head = torch.nn.Embedding(V, 16), torch.nn.Linear(16, V)
    params = [*emb.parameters(), *m.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=2e-2)
    losses = []
    for _ in range(40):
        tok = torch.randint(0, V, (16, 5))
        y, _ = m(emb(tok))
        loss = torch.nn.functional.cross_entropy(head(y).reshape(-1, V), tok.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.3 * sum(losses[:5]) / 5


def test_dropout_between_layers_only_in_training():
    torch.manual_seed(6)
    m = LSAM(3, 8, 2, num_layers=2, dropout=0.5)
    ref = LSAM(3, 8, 2, num_layers=2)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 5, 3)
    m.eval()
    torch.testing.assert_close(m(x)[0], ref(x)[0])
    m.train()
    assert not torch.allclose(m(x)[0], ref(x)[0])
    with pytest.raises(ValueError, match="dropout"):
        LSAM(3, 8, 2, dropout=1.0)


def test_reference_impl_matches_fused_and_is_twice_differentiable():
    torch.manual_seed(7)
    m = LSAM(3, 8, 4, num_layers=2, bidirectional=True).to(DT)
    r = LSAM(3, 8, 4, num_layers=2, bidirectional=True, impl="reference").to(DT)
    r.load_state_dict(m.state_dict())
    x = torch.randn(2, 6, 3, dtype=DT, requires_grad=True)
    (y1, s1), (y2, s2) = m(x), r(x)
    torch.testing.assert_close(y1, y2)
    torch.testing.assert_close(s1.memory, s2.memory)
    g1 = torch.autograd.grad(y1.pow(2).sum(), x)[0]
    g2 = torch.autograd.grad(y2.pow(2).sum(), x, create_graph=True)[0]
    torch.testing.assert_close(g1, g2)
    gg = torch.autograd.grad(g2.sum(), x)[0]
    assert torch.isfinite(gg).all() and gg.abs().sum() > 0
    with pytest.raises(ValueError, match="impl"):
        LSAM(3, 8, 2, impl="chunked")


def test_impl_vocabulary():
    """``auto`` (the default) resolves to ``fused``; ``model.impl`` holds the resolved value."""
    assert LSAM(3, 8, 2).impl == "fused" and LSAM(3, 8, 2, impl="auto").impl == "fused"
    assert LSAM(3, 8, 2, impl="reference").impl == "reference"
    assert LSAM(3, 8, 2, impl="fused").impl == "fused"


@pytest.mark.parametrize("heads", [2, 1], ids=["head-dim-1", "head-dim-2"])
@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_forward_leaves_the_callers_state_alone(heads, impl):
    """The memories given in ``state`` are never written (a head width of 1 once made the fused
    path update them in place); two backward passes through one graph give the same gradients."""
    torch.manual_seed(0)
    m = LSAM(3, 2, heads, bidirectional=heads == 2, impl=impl).double()
    x = torch.randn(2, 40, 3, dtype=torch.float64, requires_grad=True)
    s = m.init_state(2)
    s = LSAMState(torch.randn_like(s.memory), torch.randn_like(s.h))
    before = [t.clone() for t in s]
    y, s2 = m(x, s)
    assert all(torch.equal(a, b) for a, b in zip(before, s))
    loss = y.square().sum() + s2.memory.sum()
    g1 = torch.autograd.grad(loss, [x, *m.parameters()], retain_graph=True)
    g2 = torch.autograd.grad(loss, [x, *m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))
    assert all(torch.equal(a, b) for a, b in zip(before, s))
