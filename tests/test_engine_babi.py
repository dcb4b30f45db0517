"""bAbI through `memnets train`: MemN2N (``babi``) with its linear-start recipe, presets of the
former `memnets experiment babi-memn2n` / `babi-seq`, a tiny run on the real data then
load_run / eval / table / report, SIGKILL + resume, 2-process DDP."""
from __future__ import annotations

import json

import pytest

from engine_helpers import TINY as ENGINE_TINY
from engine_helpers import check_run_folder, ddp_matches_single, kill_and_resume_matches
from memnets.cli.main import main
from memnets.train import ConfigError, load_config, train

TINY = ENGINE_TINY["babi"]


@pytest.fixture
def data_env(real_data_dir, monkeypatch):
    monkeypatch.setenv("MEMNETS_DATA", str(real_data_dir))
    return real_data_dir


def test_presets_reproduce_the_experiment_recipes():
    t1, joint, paper = (load_config(f"babi/memn2n-{p}") for p in ("task1", "joint", "joint-paper-text"))
    assert tuple(t1.task.options["tasks"]) == (1,) and t1.model.d_model == 20 and t1.epochs == 120
    assert (t1.task.options["ls_max_epochs"], t1.task.options["softmax_epochs"], t1.task.options["anneal_every"]) == \
        (20, 100, 25)
    assert tuple(joint.task.options["tasks"]) == tuple(range(1, 21)) and joint.model.d_model == 50 and joint.epochs == 90
    assert (joint.task.options["ls_max_epochs"], joint.task.options["softmax_epochs"]) == (30, 60)
    for c in (t1, joint, paper):
        assert c.optim.kind == "sgd" and c.optim.grad_clip == 40.0 and c.batch_size == 32
    assert t1.model.options["pe_form"] == "code" and t1.task.options["ls_patience"] == 0 and t1.optim.lr == 0.005
    assert paper.model.options["pe_form"] == "paper" and paper.task.options["ls_patience"] == 3 and paper.optim.lr == 0.01
    seq = load_config("babi/seq-joint-10k-dnc-gpu")
    assert seq.task.options["ten_k"] and seq.device == "cuda" and seq.batch_size == 128 and seq.time_limit_min == 7
    with pytest.raises(ConfigError, match="epochs"):
        load_config("babi/memn2n-task1", ["epochs=10"])
    with pytest.raises(ConfigError, match="eval_every"):
        load_config("babi/memn2n-task1", ["eval_every=2"])


def test_linear_start_then_softmax_with_the_lr_recipe(data_env, tmp_path):
    res = train(load_config("babi/memn2n-task1", TINY), tmp_path / "r", quiet=True)
    assert res["family"] == "babi" and res["softmax_from_epoch"] == 1 and res["steps"] == 3 * 29
    evals = [r for r in map(json.loads, (tmp_path / "r/metrics.jsonl").read_text().splitlines()) if r["kind"] == "eval"]
    assert [e["splits"]["valid"]["linear_start"] for e in evals] == [1.0, 0.0, 0.0]
    assert res["best_epoch"] in (2, 3)  # never the linear-start epoch
    lrs = sorted({(r["epoch"], r["lr"]) for r in map(json.loads, (tmp_path / "r/metrics.jsonl").read_text().splitlines())
                  if r["kind"] == "train"})
    assert [lr for _, lr in lrs] == pytest.approx([0.005, 0.005, 0.0025])  # LS, then halved every epoch
    assert res["test"]["test"]["n"] == 1000 and res["tasks"]["1"]["test_error"] == res["mean_error"]


def test_a_run_its_recipe_finished_resumes_to_the_same_results(data_env, tmp_path):
    cfg = load_config("babi/memn2n-task1", [*TINY, "epochs=5"])  # the recipe ends after 1 + 2 epochs
    first = train(cfg, tmp_path / "r", quiet=True)
    assert first["epochs"] == 3 and first["steps"] == 3 * 29
    metrics = (tmp_path / "r/metrics.jsonl").read_text()
    again = train(cfg, tmp_path / "r", resume=True, quiet=True)  # was: one more epoch trained
    assert again["steps"] == first["steps"] and again["splits"] == first["splits"]
    assert (tmp_path / "r/metrics.jsonl").read_text() == metrics and (tmp_path / "r/results.json").is_file()


def test_tiny_runs_then_load_eval_table_report(data_env, tmp_path, capsys):
    train(load_config("babi/memn2n-joint", [*TINY, "task.options.tasks=[1, 2]"]), tmp_path / "mem", quiet=True)
    train(load_config("babi/seq-joint-7min-lsam", ["epochs=1", "task.options.tasks=[1, 2]", "model.d_model=16",
                                                   "model.options.embedding_dim=8", "max_steps=4"]),
          tmp_path / "seq", quiet=True)
    for d in ("mem", "seq"):
        check_run_folder(tmp_path / d, capsys)
    assert main(["table", str(tmp_path / "mem"), str(tmp_path / "seq")]) == 0
    out = capsys.readouterr().out
    assert "| task | name | MemN2N | LSAM |" in out and "| 2 | two-supporting-facts |" in out


def test_best_of_seeds_alias_and_table(data_env, tmp_path, capsys):
    assert main(["experiment", "babi-memn2n/joint-10-seeds", *TINY, "task.options.tasks=[1]", "--quiet",
                 "--out", str(tmp_path)]) == 0
    runs = sorted(tmp_path.iterdir())
    assert [p.name for p in runs] == [f"babi-memn2n-joint-s{s}" for s in range(10)]
    res = [json.loads((p / "results.json").read_text()) for p in runs]
    assert [r["seed"] for r in res] == list(range(10))
    capsys.readouterr()
    assert main(["table", *map(str, runs)]) == 0
    best = min(res, key=lambda r: 1 - r["splits"]["valid"]["accuracy"])
    assert f"| 1 | single-supporting-fact | {best['tasks']['1']['test_error']:.1f} |" in capsys.readouterr().out


def test_sigkill_then_resume_matches_uninterrupted(data_env, tmp_path):
    cfg = load_config("babi/memn2n-task1", [*TINY, "checkpoint_every=1", "task.options.tasks=[1]"])
    kill_and_resume_matches(cfg, tmp_path, kill_after=[20, 45])  # in linear start, then after it


def test_ddp_two_processes_match_single(data_env, tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed gloo missing")
    cfg = load_config("babi/memn2n-task1", [*TINY, "model.options.random_noise=0.0", "epochs=3"])
    both, single = ddp_matches_single(cfg, tmp_path, rtol=1e-3, atol=1e-3)
    assert both["test"]["test"]["n"] == single["test"]["test"]["n"] == 1000
    assert abs(both["splits"]["valid"]["accuracy"] - single["splits"]["valid"]["accuracy"]) < 0.05
