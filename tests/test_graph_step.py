"""memnets.train.graph_step.CUDAGraphStep: a whole training step replayed from a CUDA graph.

On the CPU the bookkeeping (warm-ups, capture, static input buffers, the loss rewritten at each
replay, one graph per input signature, failures) runs with the eager stand-in graph
(``graph_step.stand_in()``) and is held to a plain training loop, step for step. On a GPU
(``make gpu-check``) the real capture is held to the same loop, on a model with the recurrent
kernels' own loop graphs inside."""
from __future__ import annotations

import contextlib
import dataclasses
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


def test_shapes_that_keep_changing_stop_capturing(monkeypatch):
    """Past MAX_CAPTURES captures a signature not held runs eagerly (with one warning) instead
    of capturing again and again; the held graphs still replay."""
    monkeypatch.setattr(graph_step, "MAX_CAPTURES", 3)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    step = CUDAGraphStep(lambda x, y: torch.nn.functional.mse_loss(model(x), y), opt, warmup=1)
    with graph_step.stand_in():
        for B in (2, 3, 4):
            for _ in range(2):
                step(*_batches(1, B=B)[0])
        assert dict(step.stats) == {"eager": 3, "captured": 3}
        with pytest.warns(RuntimeWarning, match="keep changing"):
            for _ in range(3):
                step(*_batches(1, B=5)[0])
        step(*_batches(1, B=3)[0])
    assert dict(step.stats) == {"eager": 6, "captured": 3, "uncaptured": 3, "replayed": 1}


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


# ----------------------------------------------------------------------------- memnets train
def _train_cfg(**kw):
    from memnets.train import ModelConfig, OptimConfig, RunConfig, TaskConfig

    base = dict(name="graphed", epochs=2, batch_size=16, log_every=2, threads=1,
                model=ModelConfig("lsam_encdec", 16, {"num_heads": 2}),
                task=TaskConfig(name="reduce", train_digits=(1, 4), train_size=72, eval_size=32,
                                splits={"id": (2, 4), "od_easy": (5, 6), "od_hard": (7, 8)}),
                optim=OptimConfig(kind="adam", lr=3e-3, grad_clip=0.5))
    base.update(kw)
    return RunConfig(**base)


def _train_records(run_dir):
    import json

    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the capture needs CUDA; the cpu case runs the same training "
    "through the stand-in graph"))])
def test_train_with_graphed_steps_equals_the_eager_run(tmp_path, monkeypatch, device):
    """``memnets train`` through CUDAGraphStep (on the CPU the stand-in of the capture): the same
    losses and evaluations as the eager loop: three eager warm-up steps, one capture, then
    replays, which the exponential schedule (halving the rate each epoch) reaches through the
    optimiser (on CUDA a tensor rate on the GPU)."""
    from memnets.train import loop, train
    from memnets.train.loop import graph_steps

    made = []
    orig = loop.Trainer._make_graph_step

    def spy(self):
        made.append(orig(self))
        return made[-1]

    monkeypatch.setattr(loop.Trainer, "_make_graph_step", spy)
    cfg = _train_cfg(epochs=3, schedule=dataclasses_replace_gamma(), device=device)
    eager = train(dataclasses.replace(cfg, cuda_graph="off"), tmp_path / "eager", quiet=True)
    assert not made
    with (graph_step.stand_in() if device == "cpu" else contextlib.nullcontext()):
        assert graph_steps(cfg, torch.device(device))
        graphed = train(cfg, tmp_path / "graphed", quiet=True)
    tol = 1e-5 if device == "cpu" else 2e-3  # CUDA: fused Adam's rounding, atomics in the backward
    assert len(made) == 1
    st = made[0].stats
    assert dict(st) == {"eager": 3, "captured": 1, "replayed": 8}, dict(st)
    a, b = _train_records(tmp_path / "eager"), _train_records(tmp_path / "graphed")
    assert [r["kind"] for r in a] == [r["kind"] for r in b]
    for ra, rb in zip(a, b):
        if ra["kind"] == "train":
            assert rb["loss"] == pytest.approx(ra["loss"], rel=tol) and rb["lr"] == ra["lr"]
            assert rb["tok_acc"] == pytest.approx(ra["tok_acc"], abs=1e-6 if device == "cpu" else 2e-2)
    if device == "cpu":
        assert graphed["splits"]["id"]["seq_acc"] == pytest.approx(eager["splits"]["id"]["seq_acc"], abs=1e-9)


def dataclasses_replace_gamma():
    from memnets.train import ScheduleConfig

    return ScheduleConfig(kind="exp", gamma=0.5)


def test_graphed_training_resumes_and_checkpoints_float_rates(tmp_path):
    """A run stopped after its first step resumes with graphed steps to the end; the
    checkpoint's optimiser state holds plain float learning rates (on CUDA the graphed steps'
    rate is a tensor on the GPU, which would tie the checkpoint to it)."""
    from memnets.train import train
    from memnets.train.loop import _float_lr

    first = train(_train_cfg(time_limit_min=1e-9, cuda_graph="off"), tmp_path / "r", quiet=True)
    assert first["steps"] == 1
    with graph_step.stand_in():
        done = train(_train_cfg(cuda_graph="on"), tmp_path / "r", resume=True, quiet=True)
    assert done["steps"] == 8 and not done["stopped_by_time_limit"]
    state = torch.load(tmp_path / "r" / "checkpoints" / "step-000000008.state.pt", weights_only=False)
    assert all(type(g["lr"]) is float for g in state["optimizer"]["param_groups"])
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.Adam([p], lr=torch.tensor(0.25), foreach=False)
    sd = _float_lr(opt.state_dict())
    assert sd["param_groups"][0]["lr"] == 0.25 and type(sd["param_groups"][0]["lr"]) is float
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)  # the optimiser's own state is left alone


def _nan_gradient_at(monkeypatch, at: int) -> dict:
    """Models built by the training loop whose first parameter's gradient turns NaN at its
    ``at``-th backward (the loss stays finite); returns ``{"n": backwards so far, "name": the
    parameter's name}``."""
    from memnets.train import loop

    real = loop.build_model
    calls = {"n": 0}

    def build(cfg):
        model = real(cfg)
        name, p = next(iter(model.named_parameters()))
        calls["name"] = name

        def hook(g):
            calls["n"] += 1
            return g * float("nan") if calls["n"] == at else g

        p.register_hook(hook)
        return model

    monkeypatch.setattr(loop, "build_model", build)
    return calls


@pytest.mark.parametrize("at", [2, 6])  # an eager warm-up step, a replayed one
def test_graphed_steps_name_the_non_finite_loss_or_gradient(tmp_path, monkeypatch, at):
    from memnets.train import loop, train
    from memnets.train.nan_guard import NonFiniteError

    real = loop.build_model
    calls = _nan_gradient_at(monkeypatch, at)
    with graph_step.stand_in(), pytest.raises(NonFiniteError, match=f"at step {at}") as e:
        train(_train_cfg(cuda_graph="on", epochs=3), tmp_path / "g", quiet=True)
    assert e.value.kind == "gradient" and e.value.name == calls["name"] + ".grad" and e.value.n_nan > 0

    def poisoned(self, x):
        out = orig(self, x)
        return out * float("inf") if self.training else out

    from memnets.models.seq import SequenceTaskModel

    orig = SequenceTaskModel.forward
    monkeypatch.setattr(loop, "build_model", real)
    monkeypatch.setattr(SequenceTaskModel, "forward", poisoned)
    with graph_step.stand_in(), pytest.raises(NonFiniteError, match="non-finite loss `loss` at step 1"):
        train(_train_cfg(cuda_graph="on", epochs=1), tmp_path / "l", quiet=True)


def test_graphed_steps_read_nothing_back_between_records(tmp_path, monkeypatch):
    """With graphed steps the training loop reads the loss, the gradient norm and the
    statistics back once per record (``log_every`` steps), not at every step: no ``item()`` /
    ``float()`` of a tensor is taken by the loop or the task's statistics outside a record.
    The eager loop takes several per step, unless its checks are deferred too (as on CUDA with
    ``nan_policy = "raise"``; the same records either way). (On the CPU Adam reads its step counter and the data
    are made on the host; neither happens on CUDA, where Adam is capturable, and neither is
    counted here.)"""
    import traceback

    from torch.utils._python_dispatch import TorchDispatchMode

    from memnets.train import loop, train

    class Reads(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                stack = traceback.extract_stack()[:-1]
                ours = [f for f in stack if "/memnets/" in f.filename.replace("\\", "/")]
                adam = any("/torch/optim/" in f.filename.replace("\\", "/") for f in stack)
                if ours and not adam and (ours[-1].filename.endswith(("loop.py", "step_guard.py"))
                                          or ours[-1].name == "<lambda>") \
                        and not any(f.name in ("log_train", "evaluate_and_select", "save") for f in ours):
                    Reads.n += 1
            return func(*args, **(kwargs or {}))

    counts = {}
    real = loop.deferred_checks
    from memnets.train import OptimConfig

    # eager steps checked at once; graphed; eager, deferred as on CUDA; graphed, with updates that
    # nan_policy = "skip" and spike_skip would drop decided inside the step (DeviceGuard; none is here)
    for how in ("off", "on", "deferred", "guarded"):
        Reads.n = 0
        monkeypatch.setattr(loop, "deferred_checks", (lambda *a: True) if how == "deferred" else real)
        guard = dict(optim=OptimConfig(kind="adam", lr=3e-3, grad_clip=0.5, nan_policy="skip", spike_skip=1000.0)) \
            if how == "guarded" else {}
        with graph_step.stand_in(), Reads():
            # on the CPU: on CUDA the eager loop defers its checks too (the "deferred" case)
            cfg = _train_cfg(cuda_graph="off" if how in ("off", "deferred") else "on", epochs=2, log_every=4,
                             device="cpu", **guard)
            res = train(cfg, tmp_path / how, quiet=True)
        counts[how] = Reads.n / res["steps"]
    assert counts["off"] >= 2, counts  # the eager loop: the loss, the gradient norm, the statistic
    assert counts["on"] == 0 and counts["deferred"] == 0 and counts["guarded"] == 0, counts
    a = _train_records(tmp_path / "off")
    for other in ("on", "deferred", "guarded"):
        b = _train_records(tmp_path / other)
        assert [r["step"] for r in a if r["kind"] == "train"] == [r["step"] for r in b if r["kind"] == "train"]
        for ra, rb in zip(a, b):
            if ra["kind"] == "train":
                assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5)
                assert rb["tok_acc"] == pytest.approx(ra["tok_acc"], abs=1e-6)
                # the total gradient norm before clipping: its mean and largest over the record's steps
                assert 0 < ra["grad_norm"] <= ra["grad_norm_max"]
                assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4)
                assert rb["grad_norm_max"] == pytest.approx(ra["grad_norm_max"], rel=1e-4)
    assert loop.deferred_checks(_train_cfg(), torch.device("cuda"), False)
    assert not real(_train_cfg(), torch.device("cpu"), False) and real(_train_cfg(), torch.device("cpu"), True)
    # a drop is decided on the device by fused Adam/AdamW (DeviceGuard); SGD's steps are checked at once
    assert real(_train_cfg(optim=OptimConfig(nan_policy="skip")), torch.device("cuda"), False)
    assert real(_train_cfg(optim=OptimConfig(spike_skip=10.0)), torch.device("cuda"), False)
    assert not real(_train_cfg(optim=OptimConfig(kind="sgd", nan_policy="skip")), torch.device("cuda"), False)
    assert real(_train_cfg(optim=OptimConfig(kind="sgd")), torch.device("cuda"), False)


@pytest.mark.parametrize("graphed", [True, False])
@pytest.mark.parametrize("checkpoint_every", [0, 1])
def test_a_non_finite_graphed_step_is_named_when_read_back_and_never_checkpointed(tmp_path, monkeypatch,
                                                                                  checkpoint_every, graphed):
    """A NaN gradient at step 2 of a run that records every 4 steps, graphed or eager with the
    checks deferred (as on CUDA). With a checkpoint due
    after every step the read-back before it finds the step at once and names the gradient;
    without, the record at step 4 finds it and names the total gradient norm of step 2 (its
    gradients are gone by then). Either way no checkpoint or record follows the bad step."""
    import json

    from memnets.train import loop, train
    from memnets.train.nan_guard import NonFiniteError

    calls = _nan_gradient_at(monkeypatch, 2)
    monkeypatch.setattr(loop, "deferred_checks", lambda *a: True)  # the eager steps too, as on CUDA
    run = tmp_path / "r"
    cfg = _train_cfg(cuda_graph="on" if graphed else "off", epochs=2, log_every=4,
                     checkpoint_every=checkpoint_every)
    with graph_step.stand_in(), pytest.raises(NonFiniteError, match="at step 2:") as e:
        train(cfg, run, quiet=True)
    assert e.value.step == 2 and e.value.kind == "gradient" and e.value.n_nan > 0
    if checkpoint_every:
        assert e.value.name == calls["name"] + ".grad" and calls["n"] == 2
        assert json.loads((run / "checkpoints" / "last.json").read_text())["step"] == 1
    else:
        assert e.value.name == "total gradient norm" and calls["n"] == 4
        assert not (run / "checkpoints" / "last.json").exists()
    assert not [r for r in _train_records(run) if r["kind"] == "train"]  # no record past the bad step


def test_step_tally_sums_and_finds_the_first_bad_step():
    from memnets.train.loop import StepTally

    t = StepTally()
    assert t.check() is None and t.take() == (0.0, {}, 0)
    t.add(1, torch.tensor(0.5), {"acc": torch.tensor(0.25)}, torch.tensor(1.0))
    t.add(2, torch.tensor(1.5), {"acc": 0.75}, None)
    assert t.check() is None
    t.add(3, torch.tensor(2.0), {"acc": torch.tensor(1.0)}, torch.tensor(3.0))
    assert t.check() is None
    # the gradient norms: their sum (a step without one counts 0) and the largest
    assert t.take() == (4.0, {"acc": 2.0, "grad_norm": 4.0, "grad_norm_max": 3.0}, 3) and t.take() == (0.0, {}, 0)
    t.add(4, torch.tensor(1.0), {}, torch.tensor(2.0))
    t.add(5, torch.tensor(1.0), {}, torch.tensor(float("inf")))
    t.add(6, torch.tensor(float("nan")), {}, torch.tensor(1.0))
    assert t.check() == (5, "gradient", 0, 1)
    t.add(7, torch.tensor(float("nan")), {}, torch.tensor(float("nan")))
    assert t.check() == (7, "loss", 1, 0) and t.take_dropped() == []
    # steps a DeviceGuard dropped: listed, not summed; non-finite ones only with skip_non_finite
    from memnets.train.step_guard import NON_FINITE, SPIKE

    s = StepTally(skip_non_finite=True)
    s.add(1, torch.tensor(1.0), {}, torch.tensor(2.0), torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64))
    s.add(2, torch.tensor(3.0), {}, torch.tensor(5e4), torch.tensor([SPIKE, 2.5, 30.0], dtype=torch.float64))
    s.add(3, torch.tensor(float("nan")), {}, torch.tensor(1.0), torch.tensor([NON_FINITE, 0, 31.0]))
    s.add(4, torch.tensor(2.0), {}, torch.tensor(4.0))
    assert s.check() is None and s.take() == (3.0, {"grad_norm": 6.0, "grad_norm_max": 4.0}, 2)
    assert s.take_dropped() == [(2, "spike", 5e4, 2.5, 30), (3, "non-finite", 1.0, 0.0, 31)] and not s.take_dropped()
    t.add(8, torch.tensor(2.0), {}, torch.tensor(5e4), torch.tensor([SPIKE, 2.5, 30.0], dtype=torch.float64))
    assert t.check() is None and t.take_dropped() == [(8, "spike", 5e4, 2.5, 30)]


def test_cuda_graph_settings_it_cannot_take_are_refused():
    from memnets.train import ConfigError, OptimConfig
    from memnets.train.loop import graph_steps

    with pytest.raises(ConfigError, match="cuda_graph.*sgd"):
        _train_cfg(cuda_graph="on", optim=OptimConfig(kind="sgd"))
    # dropped updates are the fused optimiser's skip inside the replayed step (DeviceGuard)
    assert graph_steps(_train_cfg(cuda_graph="on", optim=OptimConfig(nan_policy="skip", spike_skip=10.0)),
                       torch.device("cuda"))
    with pytest.raises(ConfigError, match="cuda_graph.*compile"):
        _train_cfg(cuda_graph="on", compile="default")
    with pytest.raises(ConfigError, match="`cuda_graph` expected one of"):
        _train_cfg(cuda_graph="yes")
    with pytest.raises(ConfigError, match="one process"):
        graph_steps(_train_cfg(cuda_graph="on"), torch.device("cuda"), world=2)
    auto = _train_cfg()
    assert not graph_steps(auto, torch.device("cpu"))          # auto: CUDA only
    assert graph_steps(auto, torch.device("cuda"))
    assert not graph_steps(auto, torch.device("cuda"), world=2)
    assert not graph_steps(_train_cfg(optim=OptimConfig(kind="sgd")), torch.device("cuda"))
    assert not graph_steps(_train_cfg(cuda_graph="off"), torch.device("cuda"))


def test_a_checkpoint_from_a_gpu_optimiser_resumes_with_this_runs_flags():
    """A checkpoint written by fused, capturable Adam on a GPU (flags in its param groups) loads
    into the CPU run's optimiser with the CPU run's flags, its step counters on the CPU."""
    from memnets.train.loop import load_optimizer_state

    p = torch.nn.Parameter(torch.ones(3))
    gpu_like = torch.optim.Adam([p], lr=1e-3, foreach=False)
    p.grad = torch.ones(3)
    gpu_like.step()
    sd = gpu_like.state_dict()
    sd["param_groups"][0].update(fused=True, capturable=True, foreach=None)
    q = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([q], lr=1e-3)
    load_optimizer_state(opt, sd)
    g = opt.param_groups[0]
    assert g["fused"] is None and g["capturable"] is False and g["foreach"] is None
    assert opt.state[q]["step"].device.type == "cpu" and float(opt.state[q]["step"]) == 1.0
    q.grad = torch.ones(3)
    opt.step()  # the loaded state steps on the CPU
    assert float(opt.state[q]["step"]) == 2.0


def test_a_task_setting_the_step_reads_is_part_of_the_graph_key(tmp_path, monkeypatch, real_data_dir):
    """MemN2N's linear start (no softmax in the memory) ends after an evaluation: a graph captured
    during it must not replay after it, so the task's step signature (``linear_start``) is part
    of every graphed step's key, and the run equals the eager one."""
    import json

    from memnets.train import load_config, train

    monkeypatch.setenv("MEMNETS_DATA", str(real_data_dir))
    keys = []
    real_call = CUDAGraphStep.__call__

    def spy(self, *inputs, key=None):
        keys.append(key)
        return real_call(self, *inputs, key=key)

    monkeypatch.setattr(CUDAGraphStep, "__call__", spy)
    over = ["epochs=3", "task.options.ls_max_epochs=1", "task.options.softmax_epochs=2", "task.options.anneal_every=1",
            "log_every=5", "task.options.tasks=[1]", "optim.kind=adam", "optim.lr=0.005", "threads=1"]
    eager = train(load_config("babi/memn2n-task1", [*over, "cuda_graph=off"]), tmp_path / "e", quiet=True)
    assert not keys
    with graph_step.stand_in():
        graphed = train(load_config("babi/memn2n-task1", [*over, "cuda_graph=on"]), tmp_path / "g", quiet=True)
    assert {k[-1] for k in keys} == {True, False}  # linear start, then softmax: other graphs
    assert [k[-1] for k in keys] == sorted((k[-1] for k in keys), reverse=True)
    losses = [[json.loads(x)["loss"] for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()
               if json.loads(x)["kind"] == "train"] for d in ("e", "g")]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert graphed["epochs"] == eager["epochs"] == 3


def test_every_capture_goes_into_the_steps_one_pool(monkeypatch):
    """The CUDA capture's bookkeeping, on the CPU with PyTorch's graph calls stood in for: one
    pool handle made at the first capture, every capture of the step made into it, the body run
    inside the capture and the graph replayed once after it. (The memory itself: next test.)"""
    made, used, events = [], [], []

    class FakeGraph:
        def replay(self):
            events.append("replay")

    @contextlib.contextmanager
    def fake_graph(graph, pool=None):
        used.append(pool)
        events.append("capture")
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: made.append(object()) or made[-1])
    w = torch.nn.Parameter(torch.ones(3))
    step = graph_step.CUDAGraphStep(lambda x: (w * x).sum(), torch.optim.SGD([w], lr=0.1))
    for _ in range(3):
        step._record(lambda: events.append("body"))
    assert len(made) == 1 and used == [made[0]] * 3
    assert events == ["capture", "body", "replay"] * 3


def test_warm_ups_run_on_one_side_stream_per_device(monkeypatch):
    """Every warm-up before a capture (the whole step's and the loops') runs on one side stream
    per device, made once: the caching allocator keeps freed blocks per stream, so a new stream
    per warm-up left each one's memory reserved (the CUDA calls faked: this runs on the CPU)."""
    from memnets.ops.gpu import graphs

    made, waits = [], []

    class FakeStream:
        def __init__(self, device=None):
            made.append(device)

        def wait_stream(self, other):
            waits.append((self, other))

    class Like:  # what _side_stream reads of its tensor
        is_cuda = True
        device = torch.device("cuda", 0)

    monkeypatch.setattr(graphs, "_SIDE", {})
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    main = FakeStream.__new__(FakeStream)  # the current stream: not one made by side_stream
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    a, b, c = graphs.side_stream("cuda:0"), graphs.side_stream(torch.device("cuda", 0)), graphs.side_stream()
    assert a is b is c and made == [torch.device("cuda", 0)]
    assert graphs.side_stream("cuda:1") is not a and len(made) == 2
    w = torch.nn.Parameter(torch.ones(3))
    step = CUDAGraphStep(lambda x: (w * x).sum(), torch.optim.SGD([w], lr=0.1))
    outs = [step._side_stream(lambda i=i: i, Like()) for i in range(3)]
    assert outs == [0, 1, 2] and len(made) == 2  # the same stream for every warm-up
    assert waits == [(a, main), (main, a)] * 3  # side waits for main, then main for side


@pytest.mark.skipif(not torch.cuda.is_available(), reason="graph memory pools are CUDA's; make gpu-check runs this")
def test_graphs_of_many_shapes_share_one_memory_pool():
    """Six input shapes of one size, six graphs: with one pool for all, the graphs after the
    first reserve next to nothing more (each would reserve its own peak, the activations its
    backward saves, with a pool of its own); and each graph still replays its own step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(2048, 2048), torch.nn.Tanh())]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    step = graph_step.CUDAGraphStep(lambda x: model(x).square().mean(), opt, warmup=1)
    xs = [torch.randn(2 ** i, 1024 // 2 ** i, 2048, device="cuda") for i in range(6)]  # same numel
    step(xs[0])  # eager: Adam's moments, the eager step's own cached blocks
    torch.cuda.synchronize()
    r0 = torch.cuda.memory_reserved()
    step(xs[0])  # the first capture: its pool
    torch.cuda.synchronize()
    r1 = torch.cuda.memory_reserved()
    for x in xs[1:]:
        for _ in range(3):  # eager, capture, replay
            step(x)
    torch.cuda.synchronize()
    r6 = torch.cuda.memory_reserved()
    assert step.stats["captured"] == 6 and step.stats["replayed"] >= 5, step.stats
    # each later graph keeps its own copy of its input (a static buffer, outside the pool); beyond
    # those the pool grows by next to nothing (own pools: about 5 * (r1 - r0) more; a new side
    # stream per warm-up, with its cuBLAS workspaces: 388 MB more on an H200)
    inputs = sum(x.numel() * x.element_size() for x in xs[1:])
    assert r1 > r0 and r6 - r1 - inputs < 0.5 * (r1 - r0), (r0, r1, r6, inputs)
    before = [p.detach().clone() for p in model.parameters()]
    out = step(xs[3])
    torch.cuda.synchronize()
    assert torch.isfinite(out) and any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
