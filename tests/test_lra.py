"""LRA classifier, and the ListOps / text tasks through `memnets train` and `memnets experiment lra`:
tiny runs on generated ListOps and on the IMDB reviews in the data directory."""
from __future__ import annotations

import json

import pytest
import torch

from engine_helpers import TINY as ENGINE_TINY
from engine_helpers import check_run_folder, ddp_matches_single, kill_and_resume_matches
from memnets.cli.main import main
from memnets.models.lra import LRAClassifier
from memnets.train import ConfigError, apply_overrides, load_config, train
from memnets.train.families.lra import LRATask, default_min_len, load_data

TINY = ENGINE_TINY["lra"]


@pytest.mark.parametrize("pool", ["mean", "cls"])
@pytest.mark.parametrize("attention", ["softmax", "linear", "nam"])
def test_classifier_shapes_and_padding_invariance(attention, pool):
    torch.manual_seed(0)
    m = LRAClassifier(16, 10, max_len=12, d_model=8, num_layers=1, num_heads=2, dim_feedforward=16,
                      attention=attention, pool=pool).double()
    x = torch.randint(1, 16, (3, 7))
    x[1, 5:] = 0
    y = m(x)
    assert y.shape == (3, 10) and torch.isfinite(y).all()
    # mean pooling ignores padding: a row alone equals the same row with extra pad columns
    # (learned positions are absolute, so this holds for right padding)
    padded = torch.cat([x[:1], torch.zeros(1, 5, dtype=torch.long)], dim=1)
    assert torch.allclose(m(padded), m(x[:1]), atol=1e-9)
    y.sum().backward()
    assert all(p.grad is not None for n, p in m.named_parameters() if "embed" not in n or pool == "mean")


def test_classifier_bad_input():
    m = LRAClassifier(16, 10, max_len=8, d_model=8, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match="tokens"):
        m(torch.randn(2, 5))
    with pytest.raises(ValueError, match="pool"):
        LRAClassifier(16, 10, max_len=8, pool="max")


def test_experiment_alias_runs_every_kind_then_the_table(tmp_path, capsys):
    assert main(["experiment", "lra/listops-200", *TINY, "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("memnets train lra/listops-200-") == 3
    runs = [tmp_path / f"listops-200-{k}" for k in ("softmax", "linear", "nam")]
    res = [json.loads((d / "results.json").read_text()) for d in runs]
    assert [r["model"] for r in res] == ["softmax", "linear", "nam"] and {r["family"] for r in res} == {"lra"}
    assert all(r["steps"] == 3 and r["stopped_by_max_steps"] and r["wall_s_per_step"] > 0 for r in res)
    assert all(0 < r["majority_test_accuracy"] <= 1 and r["splits"]["test"]["n"] == 8 for r in res)
    assert main(["table", *map(str, runs)]) == 0
    table = capsys.readouterr().out
    assert "**listops**, length 48" in table and table.index("| softmax |") < table.index("| nam |")
    assert "| softmax | 0 | 3 |" in table and "1.00 |" in table


def test_the_first_kinds_time_limit_sets_the_step_count_of_the_others(tmp_path, capsys):
    tiny = [a for a in TINY if not a.startswith("time_limit_min")]
    first = tmp_path / "cap"
    assert main(["experiment", "lra/listops-2000", *tiny, "time_limit_min=1e-9", "max_steps=50", "epochs=9",
                 "--quiet", "--out", str(first)]) == 0
    steps = [json.loads((first / f"listops-2000-{k}/results.json").read_text())["steps"]
             for k in ("softmax", "linear", "nam")]
    assert steps[0] < 50 and steps == [steps[0]] * 3
    assert "max_steps=" in capsys.readouterr().out


def test_presets_reproduce_the_experiment_presets():
    a = load_config("lra/text-paper-nam")
    assert (a.model.d_model, a.model.options["layers"], a.model.options["heads"], a.model.options["ffn"],
            a.task.options["max_len"], a.model.options["pool"]) == (512, 4, 8, 2048, 4000, "cls")
    b = load_config("lra/listops-paper-softmax")
    assert (b.model.options["ffn"], b.task.options["max_len"], b.max_steps, b.batch_size) == (1024, 2000, 5000, 32)
    c = load_config("lra/listops-nam-authors-gpu")
    assert (c.schedule.kind, c.schedule.warmup_steps, c.optim.weight_decay, c.optim.lr) == ("rsqrt", 16000, 0.01, 3.95e-4)
    assert c.device == "cuda" and c.max_steps == 80000 and c.model.options["dropout"] == 0.1
    d = load_config("lra/listops-2000-softmax")
    assert d.time_limit_min == 50 and load_config("lra/listops-2000-nam").time_limit_min == 0
    assert all(x.select_ties == "last" and x.optim.grad_clip == 1.0 for x in (a, b, c, d))
    with pytest.raises(ConfigError, match="task.options.maxlen"):
        apply_overrides(a, ["task.options.maxlen=3"])
    with pytest.raises(ConfigError, match="test split"):
        apply_overrides(a, ["task.splits={ id = [1, 1] }", "select_split=id"])


def test_min_len_and_default_min_len():
    assert default_min_len(2000) == 500 and default_min_len(40) == 10
    xtr, _, xte, _, _, _ = load_data("listops", 40, 8, 4, seed=0, min_len=20)
    assert ((xtr != 0).sum(1) > 20).all() and ((xte != 0).sum(1) > 20).all()
    with pytest.raises(ConfigError, match="min_len"):
        load_config("lra/listops-200-nam", ["task.options.max_len=40", "task.options.min_len=39"])


def test_lr_warmup_and_rsqrt_decay():
    from memnets.train.loop import lr_factor

    cfg = load_config("lra/listops-200-nam", ["schedule.kind=rsqrt", "schedule.warmup_steps=4"])
    f = [lr_factor(cfg, 0, t, 100) for t in range(16)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0] and f[15] == pytest.approx(0.5)  # sqrt(4 / 16)
    g = load_config("lra/listops-200-nam", ["schedule.warmup_steps=4"])
    assert lr_factor(g, 0, 3, 100) == lr_factor(g, 0, 100, 200) == 1.0


def test_norm_first_and_zero_init_out():
    """``norm_first`` builds pre-LN layers with a final LayerNorm; ``zero_init_out`` starts every
    attention output projection at zero."""
    m = LRAClassifier(16, 10, max_len=12, d_model=8, num_layers=2, num_heads=2, attention="nam", norm_first=True)
    assert m.encoder.norm is not None and all(layer.norm_first for layer in m.encoder.layers)
    assert LRAClassifier(16, 10, max_len=12, d_model=8, num_layers=1, num_heads=2).encoder.norm is None
    cfg = load_config("lra/listops-200-nam", [*TINY, "model.options.layers=2", "model.options.norm_first=true",
                                              "model.options.zero_init_out=true"])
    model = LRATask("listops").build_model(cfg)
    assert model.encoder.norm is not None
    for layer in model.encoder.layers:
        assert layer.attn.out.weight.abs().max() == 0 and layer.attn.out.bias.abs().max() == 0


def test_listops_run_then_load_eval_table_report(tmp_path, capsys):
    res = train(load_config("lra/listops-200-nam", TINY), tmp_path / "run", quiet=True)
    assert res["metric"] == "accuracy" and res["selected_by"].startswith("none")
    check_run_folder(tmp_path / "run", capsys)


@pytest.fixture
def imdb(real_data_dir, monkeypatch):
    if not (real_data_dir / "imdb").is_dir():
        pytest.skip("no imdb/ in the data directory")
    monkeypatch.setenv("MEMNETS_DATA", str(real_data_dir))
    return real_data_dir


def test_text_run_on_the_real_reviews_then_load_eval_table_report(imdb, tmp_path, capsys):
    res = train(load_config("lra/text-1000-linear", TINY), tmp_path / "run", quiet=True)
    assert res["task"] == "text" and res["splits"]["test"]["n"] == 8 and res["max_len"] == 48
    check_run_folder(tmp_path / "run", capsys)


def test_text_sigkill_then_resume_matches_uninterrupted(imdb, tmp_path):
    cfg = load_config("lra/text-1000-nam", [*TINY, "checkpoint_every=1", "max_steps=0", "epochs=2"])
    kill_and_resume_matches(cfg, tmp_path, kill_after=[2, 5])


def test_text_ddp_two_processes_match_single(imdb, tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed gloo missing")
    cfg = load_config("lra/text-1000-softmax", [*TINY, "max_steps=0", "epochs=2"])
    both, single = ddp_matches_single(cfg, tmp_path, rtol=1e-4, atol=1e-5)
    assert both["final"]["test"]["n"] == single["final"]["test"]["n"] == 8
    assert abs(both["final"]["test"]["loss"] - single["final"]["test"]["loss"]) < 1e-3


def test_lra_step_timer_reports_every_kind(tmp_path):
    import json

    from memnets.bench import lra_steps
    out = tmp_path / "t.json"
    res = lra_steps.main(["--scale", "cpu", "--length", "32", "--batch-size", "2", "--steps", "1", "--warmup", "0",
                          "--repeats", "1", "--device", "cpu", "--out", str(out)])
    assert [r["attention"] for r in res["rows"]] == ["softmax", "linear", "nam", "nam+ln"]
    assert all(r["s_per_step"] > 0 for r in res["rows"]) and res["rows"][0]["speedup_vs_softmax"] == 1.0
    assert json.loads(out.read_text())["length"] == 32
