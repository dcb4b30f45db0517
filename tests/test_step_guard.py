"""Dropped updates decided on the device (memnets.train.step_guard.DeviceGuard).

``optim.nan_policy = "skip"`` and ``optim.spike_skip`` drop a training step's update. Eager
steps decide it on the host (SpikeGuard, from the norm read back); graphed steps, and CUDA's
eager steps whose checks wait for the next record, decide it on the device with nothing read
back, and the fused optimiser skips the update. The device's decisions are held to the host's:
the guard alone on random norms, and whole runs with a NaN and a spike injected, graphed
(through the CPU stand-in of the capture) and deferred, against the eager run."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random

import pytest
import torch

from memnets.train import ModelConfig, OptimConfig, RunConfig, TaskConfig, graph_step, train
from memnets.train.step_guard import NON_FINITE, SPIKE, DeviceGuard, SpikeGuard, spike_message


def test_device_guard_decides_as_the_spike_guard():
    """The same norms (log-normal, one in twenty 10⁴ times larger, one in fifty NaN) give the
    same verdicts and the same window on the device as on the host, over and past a full window;
    the window round-trips through the checkpointed form, and the warm-up admits anything."""
    rng = random.Random(0)
    for factor in (3.0, 10.0, 1000.0):
        host, dev = SpikeGuard(factor), DeviceGuard(factor, "cpu")
        verdicts = []
        for _ in range(3 * SpikeGuard.WINDOW):
            x = math.exp(rng.gauss(0, 2)) * (1e4 if rng.random() < 0.05 else 1.0)
            nan = rng.random() < 0.02
            told = dev.decide(torch.tensor(1.0), torch.tensor(math.nan if nan else x, dtype=torch.float64))
            want = NON_FINITE if nan else (0 if host.admits(x) else SPIKE)
            verdicts.append(want)
            assert int(told[0]) == want and float(dev.found_inf) == float(want > 0)
            if want == SPIKE:  # the median it was judged against, and over how many norms: the same message
                assert spike_message(x, factor, float(told[1]), int(told[2])) == host.last
        assert dev.norms() == host.norms() and len(dev.norms()) == SpikeGuard.WINDOW
        assert SPIKE in verdicts and NON_FINITE in verdicts
        again = DeviceGuard(factor, "cpu")
        again.load(host.norms())
        assert again.norms() == host.norms()
        assert int(again.decide(torch.tensor(1.0), torch.tensor(1e12))[0]) == SPIKE
    fresh = DeviceGuard(10.0, "cpu")
    assert int(fresh.decide(torch.tensor(1.0), torch.tensor(2.0**100))[0]) == 0  # the warm-up
    nan_loss = fresh.decide(torch.tensor(math.nan), torch.tensor(1.0))
    assert int(nan_loss[0]) == NON_FINITE and fresh.norms() == [2.0**100]  # a non-finite step joins nothing
    only_nan = DeviceGuard(0.0, "cpu")  # nan_policy = "skip" alone
    assert int(only_nan.decide(torch.tensor(1.0), torch.tensor(1e30))[0]) == 0
    assert int(only_nan.decide(torch.tensor(1.0), torch.tensor(math.inf))[0]) == NON_FINITE
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="spike_factor"):
            DeviceGuard(bad, "cpu")


def test_a_dropped_update_leaves_the_fused_optimiser_as_it_was():
    """A dropped step leaves the weights, Adam's moments and its step counter untouched (the
    fused kernel's skip); the next taken step is the one a run without the dropped step takes.
    An optimiser that is not fused is refused: it would apply the update regardless."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.AdamW([w], lr=0.1, fused=True)
    guard = DeviceGuard(0.0, "cpu")
    guard.attach(opt)
    ref = torch.nn.Parameter(w.detach().clone())
    ref_opt = torch.optim.AdamW([ref], lr=0.1)
    for step, g in enumerate([torch.ones(5), torch.full((5,), math.nan), torch.arange(5.0)]):
        w.grad = g.clone()
        before = (w.detach().clone(), {k: v.clone() for k, v in opt.state[w].items()} if opt.state[w] else {})
        guard.decide(torch.tensor(0.5), torch.linalg.vector_norm(g))
        opt.step()
        if step == 1:
            assert torch.equal(w.detach(), before[0])
            assert all(torch.equal(opt.state[w][k], v) for k, v in before[1].items())
            continue
        ref.grad = g.clone()
        ref_opt.step()
        torch.testing.assert_close(w.detach(), ref.detach(), rtol=1e-6, atol=1e-7)
    assert float(opt.state[w]["step"]) == 2.0
    with pytest.raises(ValueError, match="fused optimiser"):
        guard.attach(torch.optim.Adam([torch.nn.Parameter(torch.ones(2))]))


def _cfg(**kw) -> RunConfig:
    base = dict(name="guarded", epochs=8, batch_size=16, log_every=4, threads=1, device="cpu", amp="none",
                model=ModelConfig("lsam_encdec", 16, {"num_heads": 2}),
                task=TaskConfig(name="reduce", train_digits=(1, 4), train_size=64, eval_size=32,
                                splits={"id": (2, 4), "od_easy": (5, 6), "od_hard": (7, 8)}),
                optim=OptimConfig(kind="adam", lr=3e-3, grad_clip=0.5, nan_policy="skip", spike_skip=1000.0))
    base.update(kw)
    return RunConfig(**base)


def _inject(monkeypatch, blow: dict[int, float]) -> None:
    """Multiply the loss of the ``n``-th training step (1-based) by ``blow[n]`` (NaN; 1e6: a spike).

    The factor is a tensor the loss is multiplied by at every step (by 1 elsewhere, which changes
    nothing), set before each step as its batch is drawn: a step replayed from a CUDA graph reads
    it there too, where a Python branch in the loss would have been captured once."""
    from memnets.train.task import get_task

    task = type(get_task("reduce"))
    real_step, real_batch = task.train_step, task.train_batch
    at = {"n": 0, "scale": None}

    def train_batch(self, *a, **k):
        at["n"] += 1
        if at["scale"] is not None:
            at["scale"].fill_(blow.get(at["n"], 1.0))
        return real_batch(self, *a, **k)

    def train_step(self, *a, **k):
        loss, stats = real_step(self, *a, **k)
        if at["scale"] is None:  # made at the first step, an eager one
            at["scale"] = torch.full((), blow.get(at["n"], 1.0), device=loss.device)
        return loss * at["scale"], stats

    monkeypatch.setattr(task, "train_batch", train_batch)
    monkeypatch.setattr(task, "train_step", train_step)


def _records(run) -> list[dict]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "train"]


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="the capture needs CUDA; the cpu cases run the "
                           "same training through the stand-in graph (graphed) and with deferred checks")


@pytest.mark.parametrize("how,device", [("graphed", "cpu"), ("deferred", "cpu"),
                                        pytest.param("graphed", "cuda", marks=_CUDA),
                                        pytest.param("deferred", "cuda", marks=_CUDA)])
def test_updates_dropped_on_the_device_equal_the_eager_run(tmp_path, monkeypatch, how, device):
    """A NaN at step 18 and a spike (loss × 10⁶) at step 26 of 32: graphed steps (on the CPU the
    stand-in of the CUDA capture) and eager steps checked only at each record (as on CUDA) drop
    the same two updates as the eager loop on the same device, count them alike in the records,
    and end with the same losses and evaluations; the run without the guard does not."""
    from memnets.train import loop

    _inject(monkeypatch, {18: math.nan, 26: 1e6})
    monkeypatch.setattr(loop, "deferred_checks", lambda *a: False)  # on CUDA too: each step checked at once
    eager = train(_cfg(cuda_graph="off", device=device), tmp_path / "eager", quiet=True)
    monkeypatch.undo()
    made = []
    real_guard = loop.DeviceGuard

    def spy(*a, **k):
        made.append(real_guard(*a, **k))
        return made[-1]

    monkeypatch.setattr(loop, "DeviceGuard", spy)
    _inject(monkeypatch, {18: math.nan, 26: 1e6})
    if how == "deferred":
        monkeypatch.setattr(loop, "deferred_checks", lambda *a: True)
    with graph_step.stand_in() if device == "cpu" else contextlib.nullcontext():
        dev = train(_cfg(cuda_graph="on" if how == "graphed" else "off", device=device), tmp_path / how, quiet=True)
    assert len(made) == 1 and made[0].dropped == 1  # the device guard ran this run
    a, b = _records(tmp_path / "eager"), _records(tmp_path / how)
    assert [(r["step"], r.get("skipped_steps"), r.get("spikes_skipped")) for r in a] == \
        [(r["step"], r.get("skipped_steps"), r.get("spikes_skipped")) for r in b]
    assert [r.get("skipped_steps") for r in a] == [None] * 4 + [1] * 4
    assert [r.get("spikes_skipped") for r in a] == [None] * 6 + [1] * 2
    tol = 1e-5 if device == "cpu" else 2e-3  # CUDA: its own rounding, atomics in the backward
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=tol)
        assert rb["grad_norm_max"] == pytest.approx(ra["grad_norm_max"], rel=10 * tol)
    for split, m in eager["splits"].items():
        assert dev["splits"][split]["loss"] == pytest.approx(m["loss"], rel=10 * tol)
    monkeypatch.undo()
    _inject(monkeypatch, {26: 1e6})
    plain = train(_cfg(optim=OptimConfig(kind="adam", lr=3e-3, grad_clip=0.5, nan_policy="skip"), device=device),
                  tmp_path / "unguarded", quiet=True)
    assert plain["splits"]["id"]["loss"] != pytest.approx(eager["splits"]["id"]["loss"], rel=1e-3)


def test_a_graphed_run_resumes_with_its_window_and_counts_on_either_path(tmp_path, monkeypatch):
    """A graphed run with a NaN at step 10 and a spike at step 26, stopped at step 22 and resumed
    (graphed, or with eager steps: the window is checkpointed in one form), ends as the
    uninterrupted run: the same drops, and the counts of both go on over the resumption into the
    records and results.json's ``updates_dropped``."""
    _inject(monkeypatch, {10: math.nan, 26: 1e6})
    with graph_step.stand_in():
        whole = train(_cfg(cuda_graph="on"), tmp_path / "whole", quiet=True)
    assert whole["updates_dropped"] == {"non_finite": 1, "spikes": 1}
    counts = lambda run: [(r["step"], r.get("skipped_steps"), r.get("spikes_skipped")) for r in _records(run)
                          if r["step"] > 22]  # noqa: E731
    assert counts(tmp_path / "whole") == [(24, 1, None), (28, 1, 1), (32, 1, 1)]
    for resumed_as in ("on", "off"):
        monkeypatch.undo()
        _inject(monkeypatch, {10: math.nan, 26: 1e6})
        run = tmp_path / f"resumed-{resumed_as}"
        with graph_step.stand_in():
            train(_cfg(cuda_graph="on", max_steps=22, checkpoint_every=2), run, quiet=True)
        monkeypatch.undo()
        _inject(monkeypatch, {4: 1e6})  # the resumed run's 4th step is step 26
        with graph_step.stand_in():
            done = train(dataclasses.replace(_cfg(cuda_graph=resumed_as), checkpoint_every=2), run, resume=True,
                         quiet=True)
        assert done["steps"] == whole["steps"] == 32
        assert counts(run) == counts(tmp_path / "whole") and done["updates_dropped"] == whole["updates_dropped"]
        assert done["splits"]["id"]["loss"] == pytest.approx(whole["splits"]["id"]["loss"], rel=1e-4)
