"""LRA classifier and the softmax / linear / NAM comparison script (tiny run)."""
from __future__ import annotations

import json

import pytest
import torch

from memnets.experiments.lra import LRAClassifier, format_table, main, parse_args


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


def test_tiny_listops_run_writes_json(tmp_path):
    res = main(["--task", "listops", "--attention", "softmax,linear,nam", "--max-len", "48", "--n-train", "24",
                "--n-test", "8", "--steps", "3", "--d-model", "16", "--layers", "1", "--heads", "2", "--ffn", "32",
                "--batch-size", "4", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [r["attention"] for r in saved["rows"]] == ["softmax", "linear", "nam"]
    assert all(r["steps"] == 3 and 0.0 <= r["test_accuracy"] <= 1.0 and r["wall_s_per_step"] > 0
               for r in saved["rows"])
    assert 0 < saved["majority_test_accuracy"] <= 1 and saved["config"]["max_len"] == 48 and res["table"].count("\n") == 4
    assert (tmp_path / "table.md").read_text().startswith("| attention |")


def test_max_minutes_sets_the_step_count_for_all(tmp_path):
    res = main(["--attention", "nam,linear", "--max-len", "40", "--n-train", "8", "--n-test", "4", "--steps", "50",
                "--max-minutes", "0.00001", "--d-model", "8", "--layers", "1", "--heads", "2", "--out", str(tmp_path)])
    assert [r["steps"] for r in res["rows"]] == [1, 1]


def test_presets_and_table():
    a = parse_args(["--task", "text", "--preset", "paper"])
    assert (a.d_model, a.layers, a.heads, a.ffn, a.max_len, a.pool) == (512, 4, 8, 2048, 4000, "cls")
    b = parse_args(["--preset", "paper", "--layers", "2"])
    assert (b.ffn, b.max_len, b.layers) == (1024, 2000, 2)
    rows = [{"attention": "softmax", "steps": 2, "test_accuracy": 0.2, "wall_s_per_step": 2.0, "cpu_s_per_step": 1.0},
            {"attention": "nam", "steps": 2, "test_accuracy": 0.3, "wall_s_per_step": 0.5, "cpu_s_per_step": 0.25}]
    t = format_table(rows)
    assert "| nam | 2 | 30.0 | 0.500 | 4.00 | 0.250 | 4.00 |" in t


def test_min_len_and_loss_curve(tmp_path, capsys):
    res = main(["--attention", "nam", "--max-len", "40", "--min-len", "20", "--n-train", "8", "--n-test", "4",
                "--steps", "4", "--log-every", "2", "--d-model", "8", "--layers", "1", "--heads", "2",
                "--batch-size", "2", "--out", str(tmp_path)])
    assert [p["step"] for p in res["rows"][0]["loss_curve"]] == [2, 4]
    assert "nam step 4: mean training loss" in capsys.readouterr().out
    from memnets.experiments.lra import load_task
    xtr, _, xte, _, _, _ = load_task("listops", 40, 8, 4, seed=0, min_len=20)
    assert ((xtr != 0).sum(1) > 20).all() and ((xte != 0).sum(1) > 20).all()
    with pytest.raises(SystemExit):
        parse_args(["--max-len", "40", "--min-len", "39"])


def test_lra_step_timer_reports_every_kind(tmp_path):
    import json

    from memnets.bench import lra_steps
    out = tmp_path / "t.json"
    res = lra_steps.main(["--scale", "cpu", "--length", "32", "--batch-size", "2", "--steps", "1", "--warmup", "0",
                          "--repeats", "1", "--device", "cpu", "--out", str(out)])
    assert [r["attention"] for r in res["rows"]] == ["softmax", "linear", "nam", "nam+ln"]
    assert all(r["s_per_step"] > 0 for r in res["rows"]) and res["rows"][0]["speedup_vs_softmax"] == 1.0
    assert json.loads(out.read_text())["length"] == 32


def test_norm_first_and_zero_init_out(tmp_path, monkeypatch):
    """``--norm-first`` builds pre-LN layers with a final LayerNorm; ``--zero-init-out`` starts
    every attention output projection at zero, so the first forward pass ignores attention."""
    import memnets.experiments.lra as lra

    m = LRAClassifier(16, 10, max_len=12, d_model=8, num_layers=2, num_heads=2, attention="nam", norm_first=True)
    assert m.encoder.norm is not None and all(layer.norm_first for layer in m.encoder.layers)
    assert LRAClassifier(16, 10, max_len=12, d_model=8, num_layers=1, num_heads=2).encoder.norm is None
    seen = []
    real = lra.LRAClassifier

    def spy(*a, **kw):
        model = real(*a, **kw)
        seen.append(model)
        return model

    monkeypatch.setattr(lra, "LRAClassifier", spy)
    common = ["--attention", "nam", "--max-len", "40", "--n-train", "8", "--n-test", "4", "--d-model", "8",
              "--layers", "2", "--heads", "2", "--ffn", "16", "--batch-size", "4", "--norm-first", "--zero-init-out"]
    res = main(common + ["--steps", "1", "--lr", "0", "--out", str(tmp_path)])
    assert res["config"]["norm_first"] and res["config"]["zero_init_out"]
    model = seen[-1]
    assert model.encoder.norm is not None
    for layer in model.encoder.layers:   # lr 0: the projections are still the zeros they started from
        assert layer.attn.out.weight.abs().max() == 0 and layer.attn.out.bias.abs().max() == 0


def test_lr_factor_warmup_and_rsqrt_decay():
    from memnets.experiments.lra import lr_factor
    f = lr_factor(4, "rsqrt")
    assert [f(t) for t in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(15) == pytest.approx(0.5)                 # sqrt(4 / 16)
    g = lr_factor(4)
    assert g(3) == g(100) == 1.0 and lr_factor(0)(0) == 1.0
    with pytest.raises(ValueError, match="warmup"):
        lr_factor(-1)
    with pytest.raises(ValueError, match="decay"):
        lr_factor(2, "cosine")


def test_warmup_and_eval_every_in_a_run(tmp_path, capsys, monkeypatch):
    """``--warmup`` drives the optimiser's learning rate; ``--eval-every`` records test accuracy."""
    import memnets.experiments.lra as lra

    lrs = []
    real_step = torch.optim.AdamW.step

    def spy_step(self, *a, **kw):
        lrs.append(self.param_groups[0]["lr"])
        return real_step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy_step)
    res = lra.main(["--attention", "nam", "--max-len", "40", "--n-train", "8", "--n-test", "4", "--d-model", "8",
                    "--layers", "1", "--heads", "2", "--batch-size", "2", "--steps", "6", "--warmup", "4",
                    "--decay", "rsqrt", "--lr", "0.01", "--eval-every", "2", "--out", str(tmp_path)])
    assert lrs == pytest.approx([0.0025, 0.005, 0.0075, 0.01, 0.01 * (4 / 5) ** 0.5, 0.01 * (4 / 6) ** 0.5])
    curve = res["rows"][0]["eval_curve"]
    assert [e["step"] for e in curve] == [2, 4, 6] and curve[-1]["test_accuracy"] == res["rows"][0]["test_accuracy"]
    assert "nam step 4: test accuracy" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parse_args(["--warmup", "-1"])
