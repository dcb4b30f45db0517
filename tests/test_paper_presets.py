"""Every paper-scale preset (Table 1 column) trains one tiny epoch at reduced width."""
from __future__ import annotations

import json

import pytest

from memnets.train import load_config, train

SHRINK = {  # preset options that only make sense at paper width, scaled down
    "dnc": ["model.options.word_size=8", "model.options.read_heads=2", "model.options.controller_size=16",
            "model.options.memory_slots=8"],
    "ntm": ["model.options.word_size=8", "model.options.memory_slots=8"],
    "universal_transformer": ["model.options.num_heads=4"],  # paper: 24 heads of 64
}
BACKBONES = ["transformer", "lstm_attention", "universal_transformer", "dnc", "lsam_encdec",
             "nam_tm", "nam_tm_nojmp"]


@pytest.mark.parametrize("backbone", BACKBONES)
def test_paper_preset_runs_one_epoch_at_reduced_size(backbone, tmp_path):
    cfg = load_config(f"paper/reduce-{backbone}", [
        "model.d_model=32", "epochs=1", "batch_size=8", "task.train_size=16", "task.eval_size=8",
        "device=cpu", *SHRINK.get(backbone, []),
    ])
    assert cfg.optim.lr == pytest.approx(1e-4) and cfg.schedule.gamma == pytest.approx(0.98)
    train(cfg, tmp_path / "run", quiet=True)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results, "no results written"
