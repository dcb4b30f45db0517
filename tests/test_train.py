"""Run configs, presets, overrides and a tiny end-to-end training run (docs/maths.md §12)."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from memnets.train import (ConfigError, ModelConfig, OptimConfig, RunConfig, RunExistsError, TaskConfig,
                           apply_overrides, config_from_dict, config_to_dict, list_presets, load_config,
                           lr_factor, train)
from memnets.train.loop import selection_key, selection_rule, selects
from memnets.train import checkpoint as ck
from memnets.train.data import batch_indices, epoch_order, eval_splits, train_epoch_data


def tiny_config(**kw) -> RunConfig:
    base = dict(name="tiny", epochs=2, batch_size=16, log_every=2, threads=1,
                model=ModelConfig("bilstm", 16, {"num_layers": 1}),
                task=TaskConfig(name="reduce", train_digits=(1, 4), train_size=64, eval_size=32,
                                splits={"id": (2, 4), "od_easy": (5, 6), "od_hard": (7, 8)}),
                optim=OptimConfig(lr=3e-3))
    base.update(kw)
    return RunConfig(**base)


def test_defaults_are_the_papers():
    cfg = RunConfig()
    assert cfg.optim.lr == 1e-4 and cfg.optim.weight_decay == 5e-5 and cfg.optim.grad_clip == 0.5
    assert cfg.schedule.kind == "exp" and cfg.schedule.gamma == 0.98 and cfg.batch_size == 128
    assert cfg.task.train_size == 25600 and cfg.task.eval_size == 2048 and cfg.select_split == "od_easy"
    assert cfg.task.splits == {"id": (5, 10), "od_easy": (11, 13), "od_hard": (14, 16)}


def test_overrides_are_typed():
    cfg = apply_overrides(RunConfig(), ["optim.lr=3e-4", "epochs=7", "task.splits.id=[2, 3]",
                                        "model.options.num_heads=2", "model.backbone=bilstm", "tensorboard=true"])
    assert cfg.optim.lr == 3e-4 and cfg.epochs == 7 and cfg.task.splits["id"] == (2, 3)
    assert cfg.model.options == {"num_heads": 2} and cfg.model.backbone == "bilstm" and cfg.tensorboard is True
    assert isinstance(apply_overrides(RunConfig(), ["optim.lr=1"]).optim.lr, float)  # int accepted as float
    with pytest.raises(ConfigError, match="expected an integer"):
        apply_overrides(RunConfig(), ["epochs=2.5"])
    with pytest.raises(ConfigError, match="expected a number"):
        apply_overrides(RunConfig(), ["optim.lr=fast"])
    with pytest.raises(ConfigError, match="expected one of"):
        apply_overrides(RunConfig(), ["schedule.kind=linear"])
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(RunConfig(), ["epochs"])


@pytest.mark.parametrize("key,suggest", [("optim.lrr", "optim.lr"), ("epoch", "epochs"),
                                         ("task.trainsize", "task.train_size"), ("optimm.lr", "optim.lr")])
def test_unknown_key_suggests(key, suggest):
    with pytest.raises(ConfigError, match=f"did you mean `{suggest}`"):
        apply_overrides(RunConfig(), [f"{key}=1"])


def test_presets_load_and_roundtrip(tmp_path):
    names = list_presets()
    for required in ("cpu/reduce-nam_tm", "cpu/reduce-transformer", "paper/fib-nam_tm", "demo/reduce-nam_tm"):
        assert required in names
    for n in names:
        cfg = load_config(n)
        assert cfg.description and config_from_dict(config_to_dict(cfg)) == cfg
    nojmp = load_config("paper/palindrome-nam_tm_nojmp")
    assert nojmp.model.backbone == "nam_tm_nojmp" and nojmp.epochs == 200
    f = tmp_path / "mine.toml"
    f.write_text('epochs = 3\n[model]\nbackbone = "bilstm"\n')
    cfg = load_config(str(f), ["seed=5"])
    assert cfg.name == "mine" and cfg.epochs == 3 and cfg.seed == 5
    with pytest.raises(ConfigError, match="did you mean"):
        load_config("cpu/reduce-nam_tmm")
    f.write_text("epochz = 3\n")
    with pytest.raises(ConfigError, match="did you mean `epochs`"):
        load_config(str(f))


def test_lr_schedule():
    cfg = RunConfig()
    assert lr_factor(cfg, 0, 0, 100) == 1.0 and math.isclose(lr_factor(cfg, 3, 50, 100), 0.98 ** 3)
    cos = apply_overrides(cfg, ["schedule.kind=cosine", "schedule.warmup_steps=10"])
    assert math.isclose(lr_factor(cos, 0, 0, 100), 0.1) and lr_factor(cos, 0, 100, 100) < 1e-12


def test_data_streams_are_deterministic_and_sharded():
    cfg = tiny_config()
    assert torch.equal(train_epoch_data(cfg, 1).inputs, train_epoch_data(cfg, 1).inputs)
    assert not torch.equal(train_epoch_data(cfg, 0).inputs, train_epoch_data(cfg, 1).inputs)
    order = epoch_order(cfg, 0)
    assert sorted(order.tolist()) == list(range(64))
    shards = [batch_indices(order, 1, 16, r, 2) for r in range(2)]
    assert sorted(torch.cat(shards).tolist()) == sorted(order[16:32].tolist())
    a, b = eval_splits(cfg), eval_splits(tiny_config(seed=9))
    assert torch.equal(a["od_hard"].inputs, b["od_hard"].inputs)  # eval data independent of the seed


def test_tiny_run_writes_every_file(tmp_path):
    run = tmp_path / "run"
    res = train(tiny_config(checkpoint_every=3), run, quiet=True)
    for f in ("config.json", "env.json", "metrics.jsonl", "results.json", "checkpoints/last.json",
              "checkpoints/best.safetensors"):
        assert (run / f).is_file(), f
    assert not (run / "lock").exists()
    env = json.loads((run / "env.json").read_text())
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and "nam_scan_impl" in env
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in recs if r["kind"] == "eval"] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in recs if r["kind"] == "train")
    assert res["steps"] == 8 and set(res["splits"]) == {"id", "od_easy", "od_hard"}
    assert 0.0 <= res["splits"]["id"]["tok_acc"] <= 1.0 and res["params"] > 0
    assert config_from_dict(json.loads((run / "config.json").read_text())) == tiny_config(checkpoint_every=3)
    ptr = json.loads((run / "checkpoints/last.json").read_text())
    assert ptr["step"] == 8 and (run / "checkpoints" / ptr["weights"]).is_file()
    assert len(list((run / "checkpoints").glob("step-*"))) == 4  # the previous checkpoint stays, older pruned
    # a second run into the same directory is refused unless resuming
    with pytest.raises(RunExistsError):
        train(tiny_config(), run, quiet=True)
    with pytest.raises(ConfigError, match="config differs in batch_size"):
        train(tiny_config(checkpoint_every=3, batch_size=8), run, resume=True, quiet=True)
    with pytest.raises(ConfigError, match="`epochs` may only grow on resume"):  # a larger one continues it
        train(tiny_config(checkpoint_every=3, epochs=1), run, resume=True, quiet=True)


@pytest.mark.parametrize("ties,epoch", [("first", 1), ("last", 3)])
def test_select_ties_picks_the_first_or_last_equal_evaluation(tmp_path, ties, epoch):
    # lr 0: the weights never change, so every epoch scores the same on the selection split
    res = train(tiny_config(epochs=3, select_ties=ties, optim=OptimConfig(lr=0.0)), tmp_path / ties, quiet=True)
    assert res["best_epoch"] == epoch
    assert selects(0.5, 0.4) and not selects(0.5, 0.5) and selects(0.5, 0.5, "last") and not selects(0.4, 0.5, "last")
    with pytest.raises(ConfigError, match="select_ties"):
        tiny_config(select_ties="best")


def _ev(od, id_, loss):
    return {"od_easy": {"seq_acc": od, "loss": loss}, "id": {"seq_acc": id_, "loss": 0.0}}


def test_selection_breaks_ties_by_id_accuracy_then_loss():
    key = lambda od, id_, loss: selection_key(_ev(od, id_, loss), "od_easy")  # noqa: E731
    # OD-easy decides first, whatever ID and the loss say
    assert selects(key(0.1, 0.0, 9.0), key(0.0, 1.0, 0.1))
    # all-zero OD-easy: the epoch that learnt ID (2.9%) beats the untrained epoch 1, first or last ties
    for ties in ("first", "last"):
        assert selects(key(0.0, 0.029, 2.0), key(0.0, 0.0, 1.0), ties)
        assert not selects(key(0.0, 0.0, 1.0), key(0.0, 0.029, 2.0), ties)
    # OD-easy and ID tied: the lower loss wins
    assert selects(key(1.0, 1.0, 0.01), key(1.0, 1.0, 0.02)) and not selects(key(1.0, 1.0, 0.02), key(1.0, 1.0, 0.01), "last")
    # all three tied: select_ties decides
    assert not selects(key(0.5, 0.5, 0.3), key(0.5, 0.5, 0.3)) and selects(key(0.5, 0.5, 0.3), key(0.5, 0.5, 0.3), "last")
    # an evaluation without a loss (an old checkpoint's) ranks below one with a loss
    old = selection_key({"od_easy": {"seq_acc": 0.5}, "id": {"seq_acc": 0.5}}, "od_easy")
    assert selects(key(0.5, 0.5, 3.0), old)
    assert selection_rule("od_easy", "last") == "od_easy seq_acc, ties by id seq_acc then od_easy loss, then the last evaluation"


def test_untrained_epoch_is_not_reported_when_od_easy_is_all_zero(tmp_path, monkeypatch):
    """OD-easy 0 at every epoch: the epoch with the best ID accuracy is reported, not epoch 1."""
    import memnets.train.families.nsp as nsp

    script = [(0.0, 0.0, 2.0), (0.0, 0.029, 1.5), (0.0, 0.01, 1.2)]  # (od_easy, id, od_easy loss) per epoch
    calls = []

    def fake(model, batch, **kw):  # called once per split, in the order id, od_easy, od_hard
        k = len(calls)
        calls.append(k)
        od, id_, loss = script[(k // 3) % 3]
        acc = {0: id_, 1: od, 2: 0.0}[k % 3]
        return {"seq_acc": acc, "tok_acc": 0.5, "ans_acc": 0.0, "loss": loss if k % 3 == 1 else 1.0, "n": 32}

    monkeypatch.setattr(nsp, "evaluate", fake)
    for ties in ("first", "last"):
        calls.clear()
        res = train(tiny_config(epochs=3, select_ties=ties), tmp_path / ties, quiet=True)
        assert len(calls) == 9
        assert res["best_epoch"] == 2, ties
        assert res["splits"]["id"]["seq_acc"] == 0.029 and res["splits"]["od_easy"]["seq_acc"] == 0.0
        assert res["selected_by"] == selection_rule("od_easy", ties)
        assert res["selection_decided_by"] == "id seq_acc"


def test_evaluation_reports_a_loss(tmp_path):
    res = train(tiny_config(epochs=1), tmp_path / "r", quiet=True)
    for m in res["splits"].values():
        assert math.isfinite(m["loss"]) and m["loss"] > 0
    assert res["selection_decided_by"] == "od_easy seq_acc"


def test_loss_decreases(tmp_path):
    cfg = tiny_config(epochs=3, task=TaskConfig(name="palindrome", train_digits=(1, 3), train_size=128,
                                                eval_size=16, splits={"id": (1, 3), "od_easy": (4, 4)}),
                      optim=OptimConfig(lr=1e-2))
    train(cfg, tmp_path / "r", quiet=True)
    losses = [json.loads(x)["loss"] for x in (tmp_path / "r/metrics.jsonl").read_text().splitlines()
              if '"train"' in x]
    assert losses[-1] < 0.8 * losses[0]


def test_lock_refuses_a_second_live_owner(tmp_path):
    with ck.RunLock(tmp_path):
        with pytest.raises(ck.RunLockedError, match="in use"):
            ck.RunLock(tmp_path).acquire()  # this live process already owns it
    (tmp_path / "lock").write_text("999999999")  # a dead owner: taken over
    with ck.RunLock(tmp_path) as lock:
        assert lock.path.read_text() == str(__import__("os").getpid())
    assert not (tmp_path / "lock").exists()


def test_atomic_write_leaves_no_temp_files(tmp_path):
    ck.atomic_write_text(tmp_path / "a.json", "1")
    ck.atomic_write_text(tmp_path / "a.json", "2")
    assert (tmp_path / "a.json").read_text() == "2"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_time_limit_stops_mid_epoch_and_resumes(tmp_path):
    run = tmp_path / "r"
    res = train(tiny_config(time_limit_min=1e-9), run, quiet=True)
    assert res["steps"] == 1 and res["stopped_by_time_limit"] and res["best_epoch"] == 0.25
    ptr = json.loads((run / "checkpoints/last.json").read_text())
    assert ptr["step"] == 1
    done = train(tiny_config(), run, resume=True, quiet=True)  # the limit may change on resume
    assert done["steps"] == 8 and not done["stopped_by_time_limit"]


def _nan_at_call(monkeypatch, calls: set[int]):
    """Make the model's output NaN at the given (1-based) training forward calls."""
    from memnets.train import loop

    real = loop.build_model
    seen = {"n": 0}

    def build(cfg):
        model = real(cfg)

        def hook(mod, inp, out):
            if mod.training:
                seen["n"] += 1
                if seen["n"] in calls:
                    return out * float("nan")
            return out

        model.register_forward_hook(hook)
        return model

    monkeypatch.setattr(loop, "build_model", build)


def test_nan_loss_stops_the_run_naming_the_step(tmp_path, monkeypatch):
    from memnets.train.nan_guard import NonFiniteError

    _nan_at_call(monkeypatch, {7})
    run = tmp_path / "run"
    with pytest.raises(NonFiniteError, match="non-finite loss `loss` at step 7") as e:
        train(tiny_config(checkpoint_every=2), run, quiet=True)
    assert e.value.step == 7 and e.value.kind == "loss"
    ptr = json.loads((run / "checkpoints/last.json").read_text())
    assert ptr["step"] == 6 and not (run / "results.json").exists() and not (run / "lock").exists()
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in recs if r["kind"] == "train")


def test_nan_policy_skip_drops_the_update_and_goes_on(tmp_path, monkeypatch):
    _nan_at_call(monkeypatch, {3})
    run = tmp_path / "run"
    cfg = tiny_config(optim=OptimConfig(lr=3e-3, nan_policy="skip"))
    res = train(cfg, run, quiet=True)
    assert res["steps"] == 8
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_recs = [r for r in recs if r["kind"] == "train"]
    assert all(math.isfinite(r["loss"]) for r in train_recs)
    assert train_recs[0].get("skipped_steps") is None and train_recs[1]["skipped_steps"] == 1
    from memnets.train import build_model
    from memnets.train.checkpoint import load_weights

    model = build_model(cfg)
    load_weights(run / "checkpoints" / "best.safetensors", model)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_spike_guard_admits_a_warm_up_then_refuses_norms_far_above_the_median():
    from memnets.train.loop import SpikeGuard

    g = SpikeGuard(100.0)
    assert all(g.admits(n) for n in [1e9] + [1.0] * (SpikeGuard.WARMUP - 1))  # the warm-up admits anything
    assert g.admits(99.0) and not g.admits(150.0) and g.dropped == 1  # median 1: the bound is 100
    assert "norm 150 " in g.last and "median 1 " in g.last
    assert g.norms()[-2:] == [99.0, 150.0]  # a refused norm joins the window too
    # norms that stay ten thousand times larger are refused until they are the window's median
    taken = [g.admits(1e4) for _ in range(SpikeGuard.WINDOW)]
    n = taken.index(True)
    assert 10 < n < SpikeGuard.WINDOW // 2 and all(taken[n:]) and g.dropped == 1 + n
    assert g.norms() == [1e4] * SpikeGuard.WINDOW and g.admits(1e6) and not g.admits(1.01e6)
    h = SpikeGuard(100.0)
    h.load(g.norms())
    assert h.norms() == g.norms() and not h.admits(2e6) and h.admits(1e6)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="factor"):
            SpikeGuard(bad)


def _blow_up_step(monkeypatch, step: int, factor: float):
    """Multiply the loss of training step ``step`` (1-based) by ``factor`` (NaN, or 1e6: a spike)."""
    from memnets.train import loop

    real = loop.update

    def update(cfg, model, opt, loss, at, *more):
        return real(cfg, model, opt, loss * factor if at == step else loss, at, *more)

    monkeypatch.setattr(loop, "update", update)


def _summary(run) -> tuple:
    res = json.loads((run / "results.json").read_text())
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return res["splits"], res["steps"], [r["loss"] for r in recs if r["kind"] == "train"]


def test_spike_skip_drops_a_spike_as_nan_policy_skip_drops_a_nan(tmp_path, monkeypatch):
    """``optim.spike_skip``: a step whose gradient is a million times the others' is dropped, and
    the run ends where one that dropped a NaN step there ends; ordinary steps are all taken (the
    same run as without it); a run resumed after a checkpoint decides alike (the window of norms
    is in the checkpoint: without it the resumed run would admit the spike in its warm-up)."""
    kw = dict(epochs=8, log_every=4)  # 32 steps of 16
    plain = train(tiny_config(**kw), tmp_path / "plain", quiet=True)
    guarded = train(tiny_config(**kw, optim=OptimConfig(lr=3e-3, spike_skip=1000.0)), tmp_path / "guarded", quiet=True)
    assert _summary(tmp_path / "plain") == _summary(tmp_path / "guarded") and guarded["steps"] == plain["steps"] == 32
    _blow_up_step(monkeypatch, 26, float("nan"))
    train(tiny_config(**kw, optim=OptimConfig(lr=3e-3, nan_policy="skip")), tmp_path / "nan", quiet=True)
    monkeypatch.undo()
    _blow_up_step(monkeypatch, 26, 1e6)
    cfg = tiny_config(**kw, optim=OptimConfig(lr=3e-3, spike_skip=1000.0))
    train(cfg, tmp_path / "spike", quiet=True)
    assert _summary(tmp_path / "spike") == _summary(tmp_path / "nan") != _summary(tmp_path / "plain")
    recs = [json.loads(x) for x in (tmp_path / "spike" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("spikes_skipped") for r in recs if r["kind"] == "train"] == [None] * 6 + [1, 1]
    assert not any("skipped_steps" in r for r in recs)
    train(dataclasses.replace(cfg, max_steps=22, checkpoint_every=2), tmp_path / "resumed", quiet=True)
    train(dataclasses.replace(cfg, max_steps=0, checkpoint_every=2), tmp_path / "resumed", resume=True, quiet=True)
    assert _summary(tmp_path / "resumed")[:2] == _summary(tmp_path / "spike")[:2]


@pytest.mark.parametrize("deferred", [False, True])
def test_finite_gradients_whose_float32_squares_overflow_are_clipped_not_refused(deferred):
    """Gradients of 1e25 are finite in float32 but their float32 sum of squares is inf (an
    exploding recurrence gives such steps): the total norm is summed in float64, the update is
    taken and scaled to ``optim.grad_clip``; a real inf in a gradient still stops it."""
    from memnets.train.loop import NonFiniteError, update, update_unchecked

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = tiny_config(optim=OptimConfig(kind="sgd", lr=1.0, grad_clip=2.0))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    loss = model(torch.randn(5, 4)).pow(2).sum() * 1e25
    assert not torch.isfinite(torch.linalg.vector_norm(torch.autograd.grad(loss, model.weight, retain_graph=True)[0]))
    if deferred:
        norm = update_unchecked(cfg, model, opt, loss)
        assert norm.dtype == torch.float64 and 1e25 < float(norm) < 1e30
    else:
        assert 1e25 < update(cfg, model, opt, loss, 1) < 1e30  # the norm before clipping
    step = torch.linalg.vector_norm(torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())]))
    assert float(step) == pytest.approx(2.0, rel=1e-4)  # lr 1 times the clipped gradient
    loss = model(torch.randn(5, 4)).sum() * torch.tensor(float("inf"))
    with pytest.raises(NonFiniteError):
        update(cfg, model, opt, loss, 2)


def test_huge_learning_rate_gives_non_finite_error_from_the_cli(tmp_path, capsys):
    """lr = 1e30 blows the weights up after the first update; the CLI reports the step and exits 1."""
    from memnets.cli.main import main

    cfg = tmp_path / "tiny.toml"
    cfg.write_text('name = "big-lr"\nepochs = 1\nbatch_size = 16\nthreads = 1\n[model]\nbackbone = "bilstm"\n'
                   'd_model = 8\noptions = { num_layers = 1 }\n[task]\nname = "reduce"\ntrain_digits = [1, 3]\n'
                   "train_size = 64\neval_size = 8\nsplits = { id = [2, 3], od_easy = [4, 4], od_hard = [5, 5] }\n"
                   "[optim]\ngrad_clip = 0.0\n")
    rc = main(["train", str(cfg), "optim.lr=1e30", "--run-dir", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and "non-finite" in err and "at step " in err and "Traceback" not in err, err
    step = int(err.split("at step ")[1].split(":")[0])
    assert 2 <= step <= 4
