"""memnets.train.graph_step.CUDAGraphStep: a whole training step replayed from a CUDA graph.

On the CPU the bookkeeping (warm-ups, capture, static input buffers, the loss rewritten at each
replay, one graph per input signature, failures) runs with the eager stand-in graph
(``graph_step.stand_in()``) and is held to a plain training loop, step for step. On a GPU
(``make gpu-check``) the real capture is held to the same loop, on a model with the recurrent
kernels' own loop graphs inside."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from memnets.train import graph_step
from memnets.train.graph_step import CUDAGraphStep


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batches(n, B=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, 6, generator=g), torch.randn(B, 3, generator=g)) for _ in range(n)]


def _plain(model, batches, lr=1e-2):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_replayed_steps_equal_a_plain_loop():
    batches = _batches(7)
    ref_model = _model()
    ref_losses = _plain(ref_model, batches)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = CUDAGraphStep(lambda x, y: torch.nn.functional.mse_loss(model(x), y), opt, warmup=2)
    with graph_step.stand_in():
        losses = [step(x, y).item() for x, y in batches]
    assert dict(step.stats) == {"eager": 2, "captured": 1, "replayed": 4}
    assert losses == pytest.approx(ref_losses, rel=1e-6, abs=1e-7)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_each_input_signature_has_its_own_graph_and_old_ones_go():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    step = CUDAGraphStep(lambda x, y: torch.nn.functional.mse_loss(model(x), y), opt, warmup=1)
    with graph_step.stand_in():
        for B in (2, 3, 2, 3, 2):
            x, y = _batches(1, B=B)[0]
            step(x, y)
        assert dict(step.stats) == {"eager": 2, "captured": 2, "replayed": 1}
        for B in range(4, 4 + graph_step.MAX_GRAPHS + 1):  # more signatures than graphs kept
            for _ in range(2):
                step(*_batches(1, B=B)[0])
    assert len(step._graphs) == graph_step.MAX_GRAPHS


def test_a_failed_capture_warns_and_the_step_is_still_taken():
    batches = _batches(4)
    ref_model = _model()
    _plain(ref_model, batches)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    calls = [0]

    def loss_fn(x, y):
        calls[0] += 1
        if calls[0] == 2:  # the capture (warmup=1): e.g. an op that cannot be captured
            raise RuntimeError("operation not permitted when stream is capturing")
        return torch.nn.functional.mse_loss(model(x), y)

    step = CUDAGraphStep(loss_fn, opt, warmup=1)
    with graph_step.stand_in(), pytest.warns(RuntimeWarning, match="capturing the training step failed"):
        for x, y in batches:
            step(x, y)
    assert step.stats["failed"] == 1 and step.stats["replayed"] == 0 and step.stats["eager"] == 4
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_off_switches_and_the_cpu_run_eagerly(monkeypatch):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = lambda x, y: torch.nn.functional.mse_loss(model(x), y)  # noqa: E731
    plain = CUDAGraphStep(loss_fn, opt, warmup=1)
    for x, y in _batches(3):  # CPU tensors, no stand-in: eager
        plain(x, y)
    assert dict(plain.stats) == {"eager": 3}
    off = CUDAGraphStep(loss_fn, opt, warmup=1, enabled=False)
    monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "1")
    with graph_step.stand_in():
        for x, y in _batches(3):
            off(x, y)
    assert dict(off.stats) == {"eager": 3}
    env = CUDAGraphStep(loss_fn, opt, warmup=1)
    monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "0")
    with graph_step.stand_in():
        for x, y in _batches(3):
            env(x, y)
    assert dict(env.stats) == {"eager": 3}


def test_before_step_runs_between_backward_and_step():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    seen = []

    def clip():
        seen.append(all(p.grad is not None for p in model.parameters()))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3, foreach=True)

    step = CUDAGraphStep(lambda x, y: torch.nn.functional.mse_loss(model(x), y), opt, warmup=1, before_step=clip)
    before = [p.detach().clone() for p in model.parameters()]
    with graph_step.stand_in():
        for x, y in _batches(3):
            step(x, y)
    assert seen == [True, True, True]
    moved = torch.sqrt(sum(((p - b) ** 2).sum() for p, b in zip(model.parameters(), before)))
    assert moved <= 3 * 1e-3 + 1e-6  # three steps of lr 1 on gradients clipped to norm 1e-3


def test_bad_arguments_are_refused():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with pytest.raises(TypeError, match="`loss_fn` expected a callable"):
        CUDAGraphStep(None, opt)
    with pytest.raises(TypeError, match="`optimizer` expected a torch.optim.Optimizer"):
        CUDAGraphStep(lambda: None, model)
    with pytest.raises(ValueError, match="`warmup` expected an int >= 1"):
        CUDAGraphStep(lambda: None, opt, warmup=0)
    step = CUDAGraphStep(lambda x: model(x), opt)  # not a scalar
    with pytest.raises(ValueError, match="must return a scalar tensor"):
        step(torch.randn(2, 6))


def _memory(which):
    from memnets.memories.dnc import DNC
    from memnets.memories.lsam import LSAM
    from memnets.memories.nam_tm import NAMTuringMachine

    return {"LSAM": lambda: LSAM(16, 16, 2), "NAM-TM": lambda: NAMTuringMachine(16, 32, num_tapes=2, tape_length=8),
            "DNC": lambda: DNC(16, 8, memory_slots=8, word_size=8, read_heads=2, controller_size=16)}[which]()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the capture needs CUDA; on the CPU the same models go through the "
    "stand-in graph (the cpu case)"))])
@pytest.mark.parametrize("which", ["LSAM", "NAM-TM", "DNC"])
def test_whole_step_of_a_memory_equals_eager_steps(which, device):
    """On CUDA the real capture, with the recurrent kernels' own loop graphs inside it; on the CPU
    the same models and steps through the stand-in graph."""
    torch.manual_seed(0)
    ref = _memory(which).to(device)
    model = copy.deepcopy(ref)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(4, 7, 16, generator=g).to(device) for _ in range(6)]

    def loss(m, x):
        return m(x)[0].float().pow(2).mean()

    opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-3)
    ref_losses = []
    for x in xs:
        opt_ref.zero_grad(set_to_none=True)
        lo = loss(ref, x)
        lo.backward()
        opt_ref.step()
        ref_losses.append(lo.item())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = CUDAGraphStep(lambda x: loss(model, x), opt, warmup=2)
    with (graph_step.stand_in() if device == "cpu" else contextlib.nullcontext()):
        losses = [step(x).item() for x in xs]
    assert step.stats["captured"] == 1 and step.stats["replayed"] == 3, dict(step.stats)
    assert losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
