"""``memnets demo``: thread defaults, the throughput warning, the report lines (no full demo run)."""
from __future__ import annotations

import pytest
import torch

from memnets.cli import demo
from memnets.cli.main import main

TINY = ["epochs=1", "task.train_size=32", "task.eval_size=8", "batch_size=16"]


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_one_thread_per_run_unless_overridden():
    assert [c.threads for c in demo.demo_configs()] == [1, 1]
    assert [c.threads for c in demo.demo_configs(["threads=3"])] == [3, 3]
    assert all(c.time_limit_min > 0 for c in demo.demo_configs())
    assert [c.time_limit_min for c in demo.demo_configs(["time_limit_min=6"])] == [6, 6]


def test_no_warning_when_fast_enough_or_uncapped():
    kw = dict(epochs=30, time_limit_min=2.5, threads=1, load=0.1, cpus=2)
    assert demo.throughput_warning("NAM-TM", 640, 205, **kw) is None
    assert demo.throughput_warning("NAM-TM", 205, 205, **kw) is None
    assert demo.throughput_warning("NAM-TM", 9, 205, **{**kw, "time_limit_min": 0}) is None


def test_warning_names_the_busy_cpu_and_the_thread_rerun():
    msg = demo.throughput_warning("NAM-TM", 9, 205, epochs=30, time_limit_min=2.5, threads=2, load=3.9, cpus=2,
                                  command="memnets demo", extra=["seed=1"])
    assert msg is not None
    assert "CPU is busy" in msg and "load average 3.9 on 2 cores" in msg and "2 torch threads" in msg
    assert "9 samples/s" in msg and "~205" in msg and "30 epochs" in msg and "2.5-min" in msg
    assert "about 1 epochs" in msg and "under-trained" in msg
    assert "`memnets demo seed=1 threads=1`" in msg and "time_limit_min=" in msg


def test_warning_with_one_thread_suggests_a_longer_time_cap():
    msg = demo.throughput_warning("TF", 100, 205, epochs=30, time_limit_min=2.5, threads=1, load=0.2, cpus=2)
    assert msg is not None and "threads=1" not in msg
    assert "slower than the demo assumes" in msg
    # 2.5 min x 2.05 x 1.2 margin -> 7 min per run
    assert "`memnets demo time_limit_min=7`" in msg


def _res(backbone="nam_tm", best=12, epochs=30, decided="od_easy seq_acc", od_easy=0.9, od_hard=0.8, idacc=0.99,
         stopped=False):
    return {"backbone": backbone, "task": "reduce", "params": 1000, "select_split": "od_easy",
            "selected_by": "od_easy seq_acc, ties by id seq_acc then od_easy loss, then the first evaluation",
            "selection_decided_by": decided, "best_epoch": best, "epochs": epochs,
            "stopped_by_time_limit": stopped,
            "splits": {"id": {"seq_acc": idacc}, "od_easy": {"seq_acc": od_easy}, "od_hard": {"seq_acc": od_hard}}}


def test_selection_line_names_the_epoch_and_the_reason():
    line = demo.selection_line(_res(), 30)
    assert line.startswith("NAM-TM: epoch 12 of 30: the best OD-easy accuracy (90.0%)")
    assert "ties would be broken by ID accuracy, then OD-easy validation loss" in line
    tf = demo.selection_line(_res("transformer", best=30, decided="id seq_acc", od_easy=0.0, idacc=0.348), 30)
    assert tf == "TF: epoch 30 of 30: OD-easy accuracy was 0% at every evaluation, so the best ID accuracy (34.8%) decided"
    cut = demo.selection_line(_res(best=2.5, epochs=2, decided="od_easy loss", od_easy=0.0, stopped=True), 30)
    assert "epoch 2.50 (mid-epoch, at the time cap) of 30" in cut and "lowest OD-easy validation loss" in cut
    assert "stopped by the time cap after 2 of 30 epochs" in cut


def test_verdict_shown_under_trained_or_short():
    tf = _res("transformer", od_easy=0.0, od_hard=0.0)
    assert demo.generalisation_verdict([_res(od_hard=0.77), tf], 30, 2.5).startswith("Length generalisation shown")
    under = demo.generalisation_verdict([_res(od_hard=0.01, epochs=3, best=3, stopped=True), tf], 30, 2.5,
                                        threads=2, command="memnets demo")
    assert under.startswith("UNDER-TRAINED") and "after 3 of 30 epochs" in under
    assert "`memnets demo threads=1`" in under
    under1 = demo.generalisation_verdict([_res(od_hard=0.01, epochs=15, best=15, stopped=True), tf], 30, 2.5)
    assert "`memnets demo time_limit_min=6`" in under1  # 2.5 x 30/15 x 1.2
    short = demo.generalisation_verdict([_res(od_hard=0.3), tf], 30, 2.5, extra=["epochs=30"])
    assert "below the usual 70%+" in short and "`memnets demo epochs=60 time_limit_min=6`" in short


def test_demo_passes_the_thread_override_to_the_benchmark(tmp_path, monkeypatch, capsys, keep_threads):
    seen = []

    def fake_suite(name, quick=False):
        seen.append((name, quick, torch.get_num_threads()))
        return {"suite": name, "columns": ["op"], "rows": [{"op": "x"}], "env": {}}

    monkeypatch.setattr("memnets.bench.registry.run_suite", fake_suite)
    torch.set_num_threads(2)
    rc = main(["demo", "--quiet", "--out", str(tmp_path / "d"), "threads=1", *TINY])
    assert rc == 0 and seen == [("ops", True, 1)]
    text = capsys.readouterr().out
    assert "memnets bench ops --quick --threads 1" in text
    assert "Expected after a full run: NAM-TM about 95%+ ID" in text
    assert "samples/s" in text and "Reported epoch:" in text and "epoch 1 of 1" in text
    assert "Reported epoch:" in (tmp_path / "d" / "table.md").read_text()


def test_run_bench_uses_the_given_threads(monkeypatch, keep_threads):
    seen = []
    monkeypatch.setattr("memnets.bench.registry.run_suite",
                        lambda name, quick=False: seen.append(torch.get_num_threads()) or
                        {"suite": name, "columns": ["op"], "rows": [], "env": {}})
    torch.set_num_threads(1)
    demo.run_bench(2)
    assert seen == [2]


def test_slow_run_warns_early_and_says_under_trained(tmp_path, monkeypatch, capsys, keep_threads):
    # calibration fooled into "fast enough"; the first evaluation then shows the run is too slow
    monkeypatch.setattr(demo, "calibrate", lambda cfg: {"epoch_s": 1e-3, "samples_per_s": 1e6,
                                                        "train_samples_per_s": 1e6})
    rc = main(["demo", "--quiet", "--skip-bench", "--out", str(tmp_path / "d"), *TINY, "epochs=3",
               "time_limit_min=0.00001"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "[after epoch" in text and "WARNING: the demo cannot train NAM-TM properly here" in text
    assert "UNDER-TRAINED: the NAM-TM run was stopped by its 1e-05-min time cap" in text
    assert "time_limit_min=" in text.split("UNDER-TRAINED")[1]


def test_calibrate_times_the_engines_training_step(monkeypatch, keep_threads):
    """The speed check runs the task's train_step, optim.kind's optimiser and the engine's update."""
    import memnets.train.loop as loop
    import memnets.train.optim as optim
    from memnets.train.task import get_task

    cfg = demo.demo_configs([*TINY, "optim.kind=sgd"])[0]
    task = get_task(cfg.task.name)
    seen = {"steps": 0, "updates": 0, "opt": None}
    real_step, real_update, real_make = task.train_step, loop.update, optim.make_optimizer

    def train_step(*a, **kw):
        seen["steps"] += 1
        return real_step(*a, **kw)

    def update(cfg_, model, opt, loss, step, *more):
        seen["updates"] += 1
        return real_update(cfg_, model, opt, loss, step, *more)

    def make_optimizer(optim_cfg, params):
        seen["opt"] = opt = real_make(optim_cfg, params)
        return opt

    monkeypatch.setattr(task, "train_step", train_step)
    monkeypatch.setattr(loop, "update", update)
    monkeypatch.setattr(optim, "make_optimizer", make_optimizer)
    rng = torch.get_rng_state()
    c = demo.calibrate(cfg, min_seconds=0.0, max_steps=2)
    assert torch.equal(torch.get_rng_state(), rng)
    assert seen["steps"] == seen["updates"] == 3  # a warm-up step and two timed ones
    assert isinstance(seen["opt"], torch.optim.SGD)
    assert c["train_samples_per_s"] > 0 and c["epoch_s"] > 0
    assert c["samples_per_s"] == pytest.approx(cfg.task.train_size / c["epoch_s"])
