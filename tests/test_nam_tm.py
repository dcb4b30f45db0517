"""NAM Turing Machine (docs/maths.md §3, §12): hand-set head moves, write/read, jump, the fused step
against the nam_write/nam_read step, tape-length independence, training, bad input."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import memnets
from memnets.memories.nam_tm import (ACTIONS, NAMTMAux, NAMTMState, NAMTuringMachine, _fused_step,
                                     move_head, nam_tm_step)
from memnets.ops import unit

DT = torch.float64


def onehot(i, n, *lead):
    e = torch.zeros(*lead, n, dtype=DT)
    e[..., i] = 1.0
    return e


def act(name, actions=ACTIONS):
    return onehot(actions.index(name), len(actions), 1)


def blank_step(L=8, C=4, g=None):
    """Inputs for one tape, batch 1, with an empty tape and both heads at e_1."""
    g = g or torch.Generator().manual_seed(0)
    return dict(tape=torch.zeros(1, C, L, dtype=DT), key_tape=torch.zeros(1, C, L, dtype=DT),
                h_r=onehot(0, L, 1), h_w=onehot(0, L, 1),
                v=torch.randn(1, C, generator=g, dtype=DT), k=unit(torch.randn(1, C, generator=g, dtype=DT)),
                q_jump=unit(torch.randn(1, C, generator=g, dtype=DT)),
                p_r=torch.ones(1, dtype=DT), p_w=torch.zeros(1, dtype=DT), p_e=torch.zeros(1, dtype=DT),
                act_r=act("NOOP"), act_w=act("NOOP"))


def test_right_moves_e1_to_e2_and_left_wraps():
    s = blank_step()
    s.update(act_r=act("RIGHT"), act_w=act("LEFT"))
    _, _, _, h_r, h_w = nam_tm_step(**s)
    assert torch.equal(h_r, onehot(1, 8, 1))
    assert torch.equal(h_w, onehot(7, 8, 1))  # circular tape
    no_jump = ("LEFT", "NOOP", "RIGHT")
    assert torch.equal(move_head(onehot(7, 8, 1), act("RIGHT", no_jump), None, no_jump), onehot(0, 8, 1))
    with pytest.raises(ValueError, match="jump"):
        move_head(onehot(7, 8, 1), act("RIGHT"), None)


def test_write_then_read_same_head_returns_value():
    g = torch.Generator().manual_seed(1)
    s = blank_step(g=g)
    s.update(tape=torch.randn(1, 4, 8, generator=g, dtype=DT), h_r=onehot(3, 8, 1), h_w=onehot(3, 8, 1),
             p_w=torch.ones(1, dtype=DT), p_e=torch.ones(1, dtype=DT))
    r, tape, _, _, _ = nam_tm_step(**s)
    torch.testing.assert_close(r, s["v"])  # Thm 3.1 with a one-hot key
    torch.testing.assert_close(tape[..., 2], s["tape"][..., 2])  # other cells untouched


def test_jump_to_stored_key():
    g = torch.Generator().manual_seed(2)
    C, L, j = 8, 6, 4
    keys, _ = torch.linalg.qr(torch.randn(C, L, generator=g, dtype=DT))  # orthonormal columns
    s = blank_step(L=L, C=C, g=g)
    s.update(key_tape=keys.unsqueeze(0), q_jump=keys[:, j].unsqueeze(0), act_r=act("JUMP"), act_w=act("JUMP"))
    _, _, _, h_r, h_w = nam_tm_step(**s)
    torch.testing.assert_close(h_r, onehot(j, L, 1))
    torch.testing.assert_close(h_w, onehot(j, L, 1))


def test_transposed_key_tape_jumps_back_to_written_cell():
    """Kᵀ' = WR(Kᵀ, k, H_w, 1, 1) ⇒ K'ᵀ k = H_w for any previous key tape (Thm 3.1)."""
    g = torch.Generator().manual_seed(5)
    s = blank_step(L=6, C=4, g=g)
    s.update(key_tape=torch.randn(1, 4, 6, generator=g, dtype=DT), h_w=onehot(2, 6, 1), q_jump=s["k"],
             p_w=torch.ones(1, dtype=DT), p_e=torch.ones(1, dtype=DT), act_r=act("JUMP"))
    _, _, _, h_r, _ = nam_tm_step(**s, key_tape_mode="transposed")
    torch.testing.assert_close(h_r, onehot(2, 6, 1))


@pytest.mark.parametrize("normalize_heads,actions,mode", [(False, ACTIONS, "position"),
                                                          (True, ("RIGHT", "LEFT", "NOOP"), "position"),
                                                          (True, ACTIONS, "transposed")])
def test_fused_step_matches_reference_step(normalize_heads, actions, mode):
    g = torch.Generator().manual_seed(3)
    B, Tn, C, L, A = 2, 3, 4, 5, len(actions)
    tape, key_tape = (torch.randn(B, Tn, C, L, generator=g, dtype=DT, requires_grad=True) for _ in range(2))
    heads = torch.softmax(torch.randn(B, Tn, 2, L, generator=g, dtype=DT), -1).requires_grad_()
    v = torch.randn(B, Tn, C, generator=g, dtype=DT, requires_grad=True)
    k = unit(torch.randn(B, Tn, C, generator=g, dtype=DT)).requires_grad_()
    q = unit(torch.randn(B, Tn, C, generator=g, dtype=DT)).requires_grad_()
    p = torch.rand(B, Tn, 3, generator=g, dtype=DT, requires_grad=True)
    a = torch.softmax(torch.randn(B, Tn, 2, A, generator=g, dtype=DT), -1).requires_grad_()
    order = [ACTIONS.index(x) for x in actions]
    r1, T1, K1, h1 = _fused_step(tape, key_tape, heads, v, k, q, p, a, order, normalize_heads, mode == "transposed")
    r2, T2, K2, hr2, hw2 = nam_tm_step(tape, key_tape, heads[:, :, 0], heads[:, :, 1], v, k, q, p[..., 0],
                                       p[..., 1], p[..., 2], a[:, :, 0], a[:, :, 1], actions, normalize_heads, mode)
    outs1 = [r1, T1, K1, h1[:, :, 0], h1[:, :, 1]]
    outs2 = [r2, T2, K2, hr2, hw2]
    for o1, o2 in zip(outs1, outs2):
        torch.testing.assert_close(o1, o2)
    cots = [torch.randn(o.shape, generator=g, dtype=DT) for o in outs2]
    ins = [tape, key_tape, heads, v, k, q, p, a]
    g1 = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs1, cots)), ins, allow_unused=True)
    g2 = torch.autograd.grad(sum((o * c).sum() for o, c in zip(outs2, cots)), ins, allow_unused=True)
    for x, x1, x2 in zip(ins, g1, g2):
        assert (x1 is None) == (x2 is None)
        if x1 is not None:
            torch.testing.assert_close(x1, x2)
    assert (g1[5] is None) == ("JUMP" not in actions)  # the jump query is used only with JUMP


def test_step_gradcheck():
    g = torch.Generator().manual_seed(4)
    s = blank_step(L=4, C=3, g=g)
    s.update(tape=torch.randn(1, 3, 4, generator=g, dtype=DT), p_w=torch.full((1,), 0.7, dtype=DT),
             p_e=torch.full((1,), 0.4, dtype=DT), act_r=torch.softmax(torch.randn(1, 4, generator=g, dtype=DT), -1))
    names = ["tape", "v", "q_jump", "act_r"]

    def f(*xs):
        return nam_tm_step(**{**s, **dict(zip(names, xs))})

    assert torch.autograd.gradcheck(f, tuple(s[n].clone().requires_grad_() for n in names))


def test_tape_length_is_per_call_and_trained_model_runs_at_4L():
    torch.manual_seed(0)
    m = NAMTuringMachine(3, 8, num_tapes=2, tape_length=8)
    x = torch.randn(2, 5, 3)
    y16, s16 = m(x, tape_length=16)
    y64, s64 = m(x, tape_length=64)
    assert y16.shape == y64.shape == (2, 5, 8)
    assert s16.tape.shape == (1, 2, 2, 4, 16) and s64.tape.shape == (1, 2, 2, 4, 64)
    # train at L = 8 to output the previous input (a read of what was written one step ago),
    # then run the same weights at 4L = 32: what was learned carries over
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(16, 6, 3, generator=g)
    target = torch.cat([torch.zeros(16, 1, 3), xs[:, :-1]], 1)

    def loss_at(L):
        return (m(xs, tape_length=L)[0][..., :3] - target).pow(2).mean()

    with torch.no_grad():
        before8, before32 = loss_at(8).item(), loss_at(32).item()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(60):
        loss = loss_at(8)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after8, after32 = loss_at(8).item(), loss_at(32).item()
    assert after8 < 0.5 * before8, (before8, after8)
    assert after32 < 0.5 * before32, (before32, after32)  # the 4L tape runs the learned program
    y, s = m(x, tape_length=32)
    assert s.h_r.shape[-1] == 32 and torch.isfinite(y).all()
    # carrying state continues on the state's tape
    y2, s2 = m(x, s)
    assert s2.tape.shape[-1] == 32


def test_heads_stay_distributions_without_jump_and_aux_shapes():
    torch.manual_seed(1)
    acts = ("LEFT", "NOOP", "RIGHT")
    m = NAMTuringMachine(3, 8, num_tapes=2, actions=acts, controller="lstm", num_layers=2,
                         normalize_heads=True, separate_erase=True, key_tape_mode="transposed")
    y, s, aux = m(torch.randn(2, 6, 3), tape_length=10, return_aux=True)
    assert isinstance(aux, NAMTMAux) and aux.read_pos.shape == (2, 6, 2, 10)
    (y.sum() + s.tape.sum()).backward()  # "No Jmp": every parameter gets a gradient
    assert all(p.grad is not None for p in m.parameters())
    assert aux.write_actions.shape == (2, 6, 2, 3)
    for h in (s.h_r, s.h_w, aux.read_pos):
        assert (h >= 0).all()
        torch.testing.assert_close(h.sum(-1), torch.ones_like(h.sum(-1)))
    torch.testing.assert_close(aux.read_actions.sum(-1), torch.ones(2, 6, 2))
    assert s.tape.shape == (2, 2, 2, 4, 10)


def test_zero_input_no_nan():
    m = NAMTuringMachine(3, 8, num_tapes=2).to(DT)
    for p in m.parameters():
        torch.nn.init.zeros_(p)
    x = torch.zeros(2, 4, 3, dtype=DT, requires_grad=True)
    y, s = m(x)
    (y.sum() + s.tape.sum() + s.h_r.sum()).backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_bad_input_raises():
    m = NAMTuringMachine(3, 8, num_tapes=2)
    with pytest.raises(ValueError, match="`x`"):
        m(torch.randn(2, 5, 4))
    s = m.init_state(2, tape_length=16)
    with pytest.raises(ValueError, match="tape_length"):
        m(torch.randn(2, 5, 3), s, tape_length=8)
    with pytest.raises(ValueError, match="state.tape"):
        m(torch.randn(3, 5, 3), s)
    with pytest.raises(ValueError, match="num_tapes"):
        NAMTuringMachine(3, 9, num_tapes=2)
    with pytest.raises(ValueError, match="actions"):
        NAMTuringMachine(3, 8, actions=("UP",))
    with pytest.raises(ValueError, match="key_tape_mode"):
        NAMTuringMachine(3, 8, key_tape_mode="content")
    with pytest.raises(ValueError, match="controller"):
        NAMTuringMachine(3, 8, controller="rnn")
    with pytest.raises(ValueError, match="tape_length"):
        m(torch.randn(2, 5, 3), tape_length=0)


def test_registry_and_step():
    m = memnets.build_model("nam_tm", input_size=3, hidden_size=8, num_tapes=2)
    assert isinstance(m, NAMTuringMachine)
    y, s = m.step(torch.randn(2, 3))
    assert y.shape == (2, 8) and isinstance(s, NAMTMState)


def test_trains_on_delayed_recall():
    """Output comes only from tape reads: predicting the previous token must
    use the tape; the loss must drop clearly."""
    torch.manual_seed(0)
    V, B, T = 4, 16, 8
    emb = torch.nn.Embedding(V, 8)
    m = NAMTuringMachine(8, 16, num_tapes=2, tape_length=8)
    head = torch.nn.Linear(16, V)
    params = [*emb.parameters(), *m.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=3e-2)
    losses = []
    for _ in range(50):
        tok = torch.randint(0, V, (B, T))
        y, _ = m(emb(tok))
        loss = torch.nn.functional.cross_entropy(head(y[:, 1:]).reshape(-1, V), tok[:, :-1].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


@settings(max_examples=15, deadline=None)
@given(L=st.integers(2, 12), seed=st.integers(0, 999))
def test_moves_without_jump_keep_a_distribution(L, seed):
    """LEFT / NO-OP / RIGHT mix shifted copies of H: a probability vector stays one, and a
    head at cell 1 lands on cell 2 with probability p_right (plus p_left when L = 2)."""
    g = torch.Generator().manual_seed(seed)
    acts = ("LEFT", "NOOP", "RIGHT")
    h = torch.softmax(torch.randn(3, L, generator=g, dtype=DT), -1)
    a = torch.softmax(torch.randn(3, 3, generator=g, dtype=DT), -1)
    h2 = move_head(h, a, None, acts)
    assert (h2 >= 0).all()
    torch.testing.assert_close(h2.sum(-1), torch.ones(3, dtype=DT))
    e = move_head(onehot(0, L, 3), a, None, acts)
    torch.testing.assert_close(e[:, 1], a[:, 2] + (a[:, 0] if L == 2 else 0))


def test_stacked_state_tape_of_every_layer_is_used():
    torch.manual_seed(0)
    m = NAMTuringMachine(3, 8, num_tapes=2, num_layers=2).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    # a fresh start hands layer 0's final value tape to layer 1 (the authors' stacking)
    y0, s0 = m(x)
    st = m.init_state(2, dtype=torch.float64)
    l0 = m.layers[0](x, st.tape[0], st.key_tape[0], st.h_r[0], st.h_w[0])[1]
    st_handed = st._replace(tape=torch.stack([st.tape[0], l0[0]]))
    y1, _ = m(x, st_handed)
    torch.testing.assert_close(y1, y0, rtol=1e-12, atol=1e-12)
    # a given state: layer 1 starts from state.tape[1], not ignored
    y2, _ = m(x, st_handed._replace(tape=st_handed.tape + torch.stack([torch.zeros_like(st.tape[0]),
                                                                        0.5 * torch.ones_like(st.tape[1])])))
    assert (y2 - y0).abs().max() > 1e-3
    # and running in pieces continues every layer from its own tape
    ya, sa = m(x[:, :3], st_handed)
    yb, sb = m(x[:, 3:], sa)
    assert torch.isfinite(yb).all() and sb.tape.shape == s0.tape.shape
