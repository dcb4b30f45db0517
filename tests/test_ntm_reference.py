"""NTM (docs/maths.md §7) against an independent reference step (tests/ntm_reference.py), float64:
``step`` and ``forward`` over T steps equal the reference step applied T times — outputs, every
state field and the gradients with respect to the inputs, the given state and every parameter."""
import pytest
import torch

import ntm_reference as ref
from memnets.memories.ntm import NTM, NTMState

D = torch.float64
TOL = dict(rtol=0.0, atol=1e-10)

# read_heads, write_heads, shift_range, memory_slots, word_size, controller, memory_init
CONFIGS = [
    (1, 1, 1, 5, 3, "lstm", 1e-6),
    (2, 1, 2, 6, 4, "lstm", 0.3),
    (1, 2, 1, 4, 3, "mlp", 1e-6),
    (2, 2, 2, 5, 2, "lstm", 0.3),
    (2, 2, 1, 6, 3, "mlp", 0.3),
]
IDS = [f"R{c[0]}-Hw{c[1]}-n{c[2]}-N{c[3]}-W{c[4]}-{c[5]}" for c in CONFIGS]


def _model(cfg, seed: int) -> NTM:
    """A small NTM with every parameter redrawn at scale 0.7, so that keys, strengths, gates,
    shifts and sharpenings all vary across heads and slots (no focused initial weightings)."""
    R, Hw, n, N, W, controller, memory_init = cfg
    torch.manual_seed(seed)
    m = NTM(3, 2, memory_slots=N, word_size=W, read_heads=R, write_heads=Hw, controller=controller,
            controller_size=5, shift_range=n, memory_init=memory_init).to(D)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.7 * torch.randn(p.shape, generator=g, dtype=D))
    return m


def _given_state(m: NTM, B: int, g: torch.Generator) -> NTMState:
    """A random state (memory, weightings on the simplex, reads, controller) requiring grad."""
    cfg = m.config
    N, W, R, Hw, C = cfg.memory_slots, cfg.word_size, cfg.read_heads, cfg.write_heads, cfg.controller_size
    c_size = C if cfg.controller == "lstm" else 0
    raw = [torch.randn(B, N, W, generator=g, dtype=D), torch.randn(B, R, N, generator=g, dtype=D).softmax(-1),
           torch.randn(B, Hw, N, generator=g, dtype=D).softmax(-1), torch.randn(B, R, W, generator=g, dtype=D),
           torch.randn(B, C, generator=g, dtype=D), torch.randn(B, c_size, generator=g, dtype=D)]
    return NTMState(*(t.requires_grad_() for t in raw))


def _runs(m: NTM, x: torch.Tensor, state: NTMState | None):
    """(y [B, T, O], final state as a dict) from forward, from T calls of step, and from the reference."""
    y_f, s_f = m(x, state)
    s_s, ys = state, []
    for t in range(x.shape[1]):
        y_t, s_s = m.step(x[:, t], s_s)
        ys.append(y_t)
    y_r, s_r = ref.run(m, x, None if state is None else state._asdict())
    return {"forward": (y_f, s_f._asdict()), "step": (torch.stack(ys, 1), s_s._asdict()), "reference": (y_r, s_r)}


def _loss(y: torch.Tensor, state: dict, seed: int) -> torch.Tensor:
    """A fixed random linear function of the output and of every state field."""
    g = torch.Generator().manual_seed(seed)
    outs = [y] + [state[f] for f in NTMState._fields]
    return sum((t * torch.randn(t.shape, generator=g, dtype=D)).sum() for t in outs)


@pytest.mark.parametrize("start", ["initial", "given"])
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_step_and_forward_match_reference(cfg, T, start):
    m = _model(cfg, seed=T + 10 * CONFIGS.index(cfg))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, T, 3, generator=g, dtype=D, requires_grad=True)
    state = _given_state(m, 2, g) if start == "given" else None
    runs = _runs(m, x, state)
    y_r, s_r = runs["reference"]
    for name in ("forward", "step"):
        y, s = runs[name]
        torch.testing.assert_close(y, y_r, **TOL, msg=lambda e: f"{name} output: {e}")
        for f in NTMState._fields:
            torch.testing.assert_close(s[f], s_r[f], **TOL, msg=lambda e: f"{name} state.{f}: {e}")
    # gradients w.r.t. the input, the given state and every parameter
    wrt = [x, *(state if state is not None else ()), *m.parameters()]
    names = ["x", *(f"state.{f}" for f in (NTMState._fields if state is not None else ()))]
    names += [n for n, _ in m.named_parameters()]
    grads = {}
    for name, (y, s) in runs.items():
        gs = torch.autograd.grad(_loss(y, s, seed=3), wrt, allow_unused=True)
        grads[name] = [torch.zeros_like(w) if gr is None else gr for gr, w in zip(gs, wrt)]
    for name in ("forward", "step"):
        for n, a, b in zip(names, grads[name], grads["reference"]):
            torch.testing.assert_close(a, b, **TOL, msg=lambda e: f"{name} d/d{n}: {e}")
    assert any(gr.abs().sum() > 0 for gr in grads["reference"][1:])


def test_reference_shift_is_the_worked_example():
    """docs/maths.md §7: w = (1, 0, 0, 0) with P(−1) = 0.2, P(0) = 0.1, P(+1) = 0.7 gives
    (0.1, 0.7, 0, 0.2); pins the reference's shift direction independently of the model."""
    w = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=D)
    s = torch.tensor([[0.2, 0.1, 0.7]], dtype=D)
    torch.testing.assert_close(ref.shift(w, s), torch.tensor([[0.1, 0.7, 0.0, 0.2]], dtype=D))


def test_reference_write_then_read_by_hand():
    """One slot fully addressed: erase e then add a leaves M[i] ∘ (1 − e) + a; the read returns it."""
    M = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]], dtype=D)
    w = torch.tensor([[0.0, 1.0, 0.0]], dtype=D)
    e, a = torch.tensor([[0.5, 1.0]], dtype=D), torch.tensor([[10.0, 20.0]], dtype=D)
    M2 = ref.write(M, [w], [e], [a])
    torch.testing.assert_close(M2, torch.tensor([[[1.0, 2.0], [11.5, 20.0], [5.0, 6.0]]], dtype=D))
    torch.testing.assert_close(ref.read(M2, w), torch.tensor([[11.5, 20.0]], dtype=D))
