"""The capacity lab's retrieval and MQAR tasks through `memnets train`: presets, tiny runs, then
load_run / eval / table / report."""
from __future__ import annotations

import pytest

from engine_helpers import TINY as ENGINE_TINY
from engine_helpers import check_run_folder
from memnets.cli.main import main
from memnets.train import ConfigError, load_config, train

TINY = ENGINE_TINY["capacity"]


def test_presets_match_the_harness_defaults():
    from memnets.capacity import MQARConfig, RetrievalConfig

    r, m = load_config("capacity/retrieval-delta"), load_config("capacity/mqar-delta")
    rc, mc = RetrievalConfig(), MQARConfig()
    assert r.epochs * r.task.train_size // r.batch_size == rc.steps and r.optim.lr == rc.lr
    assert r.task.options["num_pairs"] == rc.num_pairs and r.model.d_model == rc.d_key
    assert m.epochs * m.task.train_size // m.batch_size == mc.steps and m.optim.lr == mc.lr
    assert (m.task.options["seq_len"], m.task.options["num_pairs"], m.task.options["vocab_size"]) == \
        (mc.seq_len, mc.num_pairs, mc.vocab_size)
    with pytest.raises(ConfigError, match="model.backbone"):
        load_config("capacity/retrieval-delta", ["model.backbone=nope"])
    with pytest.raises(ConfigError, match="value_kind"):
        load_config("capacity/retrieval-delta", ["task.options.value_kind=binary"])


@pytest.mark.parametrize("preset,more", [("capacity/retrieval-delta", ["task.options.edits=true"]),
                                         ("capacity/mqar-delta", ["task.options.seq_len=64", "task.options.num_pairs=8",
                                                                  "task.options.vocab_size=64"])])
def test_tiny_run_then_load_eval_table_report(preset, more, tmp_path, capsys):
    res = train(load_config(preset, [*TINY, *more]), tmp_path / "run", quiet=True)
    assert res["family"] == "capacity" and res["memory"] == "delta" and res["steps"] == 2
    assert 0.0 <= res["splits"]["heldout"]["accuracy"] <= 1.0 and res["splits"]["heldout"]["n"] == 32
    check_run_folder(tmp_path / "run", capsys)
    assert main(["table", str(tmp_path / "run")]) == 0
    assert "| delta |" in capsys.readouterr().out
