"""Few-shot Omniglot through `memnets train` on the real images: the pre-training stage
(``omniglot_pretrain``) and a few-shot setting on its frozen features (``omniglot_fewshot``),
then load_run / eval / table / report; the `memnets experiment fewshot-omniglot` alias;
SIGKILL + resume and 2-process DDP of the pre-training."""
from __future__ import annotations

import json

import pytest

from engine_helpers import TINY as ENGINE_TINY
from engine_helpers import check_run_folder, ddp_matches_single, kill_and_resume_matches
from memnets.cli.main import main
from memnets.train import ConfigError, load_config, train

PRE = ENGINE_TINY["fewshot"]


def shot(backbone_run, *more):
    return ["task.train_size=4", "task.eval_size=10", f"task.options.backbone_run={backbone_run}",
            "task.options.base_classes=30", "task.options.novel_classes=30", "log_every=2", *more]


@pytest.fixture
def data_env(real_data_dir, monkeypatch):
    if not (real_data_dir / "omniglot").is_dir():
        pytest.skip("no omniglot/ in the data directory")
    monkeypatch.setenv("MEMNETS_DATA", str(real_data_dir))
    return real_data_dir


def test_presets_reproduce_the_experiment():
    pre = load_config("fewshot/omniglot-pretrain")
    assert pre.epochs == 8 and pre.time_limit_min == 40 and pre.batch_size == 128 and pre.optim.lr == 0.002
    assert pre.task.options["mode"] == "episodic" and pre.schedule.kind == "cosine" and pre.threads == 1
    for w in (5, 20):
        for k in (1, 5):
            c = load_config(f"fewshot/omniglot-{w}way-{k}shot")
            o = c.task.options
            assert (o["way"], o["shot"], o["queries"], o["base_classes"]) == (w, k, 15, 500)
            assert c.task.train_size == 600 and c.task.eval_size == 1000 and c.batch_size == 1
    with pytest.raises(ConfigError, match="mode"):
        load_config("fewshot/omniglot-pretrain", ["task.options.mode=proto"])
    with pytest.raises(ConfigError, match="shot"):
        load_config("fewshot/omniglot-5way-1shot", ["task.options.shot=14"])


def test_both_stages_then_load_eval_table_report(data_env, tmp_path, capsys):
    pre = train(load_config("fewshot/omniglot-pretrain", PRE), tmp_path / "pre", quiet=True)
    assert pre["family"] == "fewshot" and pre["steps"] == 2 * (40 * 15 // 16)
    assert 0.2 < pre["splits"]["base_heldout"]["accuracy"] <= 1.0
    res = train(load_config("fewshot/omniglot-5way-1shot", shot(tmp_path / "pre")), tmp_path / "s", quiet=True)
    assert res["way"] == 5 and res["shot"] == 1 and res["queries_per_class"] == 15 and res["episodes"] == 10
    for m in ("cosine", "nam"):
        for k in ("both", "novel", "base"):
            assert 0 <= res["methods"][m][k]["mean"] <= 100 and res["methods"][m][k]["ci95"] >= 0
    for d in ("pre", "s"):
        check_run_folder(tmp_path / d, capsys)
    assert main(["table", str(tmp_path / "pre"), str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "| 5-way 1-shot | nam |" in out and "±" in out and "| fewshot-omniglot-pretrain | episodic |" in out


def test_the_classifier_mode(data_env, tmp_path):
    pre = train(load_config("fewshot/omniglot-pretrain", [*PRE, "task.options.mode=classifier", "epochs=1"]),
                tmp_path / "pre", quiet=True)
    assert pre["mode"] == "classifier"
    res = train(load_config("fewshot/omniglot-20way-5shot", shot(tmp_path / "pre")), tmp_path / "s", quiet=True)
    assert res["methods"]["nam"]["both"]["mean"] >= 0


def test_experiment_alias_runs_both_stages(data_env, tmp_path, capsys):
    args = ["experiment", "fewshot-omniglot/cpu", "@pretrain:epochs=1", "@pretrain:task.options.classes=40",
            "@pretrain:batch_size=16", "task.eval_size=4", "time_limit_min=0", "@way:task.train_size=2",
            "@way:task.options.base_classes=30", "@way:task.options.novel_classes=30", "--quiet", "--out", str(tmp_path)]
    assert main(args) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["omniglot-pretrain", "omniglot-5way-1shot", "omniglot-20way-1shot", "omniglot-5way-5shot",
                            "omniglot-20way-5shot"])
    r = json.loads((tmp_path / "omniglot-20way-5shot/results.json").read_text())
    assert r["backbone_run"] == str(tmp_path / "omniglot-pretrain")
    assert main(args) == 0  # a rerun resumes every finished run instead of refusing
    capsys.readouterr()


def test_pretraining_sigkill_then_resume_matches_uninterrupted(data_env, tmp_path):
    cfg = load_config("fewshot/omniglot-pretrain", [*PRE, "checkpoint_every=1", "task.options.classes=16",
                                                    "batch_size=8"])
    kill_and_resume_matches(cfg, tmp_path, kill_after=[10, 35])


def test_pretraining_ddp_two_processes_match_single(data_env, tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed gloo missing")
    cfg = load_config("fewshot/omniglot-pretrain", [*PRE, "task.options.mode=classifier", "task.options.classes=16",
                                                    "epochs=1"])
    # Conv-4's batch norm sees each process's half of the batch, so the losses agree only roughly
    both, single = ddp_matches_single(cfg, tmp_path, rtol=0.15, atol=0.05)
    assert both["final"]["base_heldout"]["n"] == single["final"]["base_heldout"]["n"] == 10
