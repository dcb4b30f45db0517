"""Every paper-scale preset (Table 1 cell) trains one tiny epoch at reduced width with the
paper's recipe (Adam + L2 weight decay, lr 1e-4 × 0.98 per epoch, clip 0.5, fp32), and its run
folder holds what `memnets table` needs."""
from __future__ import annotations

import json
import math

import pytest

from memnets.train import build_model, load_config, train

SHRINK = {  # preset options that only make sense at paper width, scaled down
    "dnc": ["model.options.word_size=8", "model.options.read_heads=2", "model.options.controller_size=16",
            "model.options.memory_slots=8"],
    "ntm": ["model.options.word_size=8", "model.options.memory_slots=8"],
    "universal_transformer": ["model.options.num_heads=4"],  # paper: 24 heads of 64
}
BACKBONES = ["transformer", "lstm_attention", "universal_transformer", "dnc", "lsam_encdec",
             "nam_tm", "nam_tm_nojmp"]
TASKS = ["palindrome", "fib", "reduce"]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("backbone", BACKBONES)
def test_paper_preset_runs_one_epoch_at_reduced_size(backbone, task, tmp_path):
    cfg = load_config(f"paper/{task}-{backbone}", [
        "model.d_model=32", "epochs=1", "batch_size=8", "task.train_size=16", "task.eval_size=8",
        "device=cpu", "threads=1", *SHRINK.get(backbone, []),
    ])
    assert cfg.task.name == task and cfg.model.backbone == backbone
    assert cfg.optim.kind == "adam" and cfg.optim.lr == pytest.approx(1e-4)
    assert cfg.optim.weight_decay == pytest.approx(5e-5) and cfg.optim.grad_clip == pytest.approx(0.5)
    assert cfg.schedule.gamma == pytest.approx(0.98) and cfg.amp == "none"
    run = tmp_path / "run"
    res = train(cfg, run, quiet=True)
    assert res["task"] == task and res["backbone"] == backbone and res["steps"] == 2
    assert res["params"] == sum(p.numel() for p in build_model(cfg).parameters())
    assert set(res["splits"]) == {"id", "od_easy", "od_hard"}
    for split in res["splits"].values():
        assert all(0.0 <= split[m] <= 1.0 for m in ("seq_acc", "tok_acc", "ans_acc")) and split["n"] == 8
    losses = [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if r["kind"] == "train"]
    assert losses and all(math.isfinite(x) for x in losses)
    assert json.loads((run / "env.json").read_text())["autocast"] is None  # fp32, as the authors trained
    assert json.loads((run / "results.json").read_text()) == json.loads(json.dumps(res))
