"""Capacity lab: adapters, training harness (delta learns, sum rule fails on edits), sweep, CLI."""
from __future__ import annotations

import json

import pytest
import torch

from memnets.capacity import DEFAULT_MEMORIES, MEMORIES, build_adapter, train_mqar, train_retrieval
from memnets.capacity.adapters import NAMAdapter, unavailable_reason
from memnets.capacity.harness import RetrievalModel, retrieval_metrics
from memnets.capacity.sweep import markdown_table, mqar_table, run_sweep
from memnets.tasks.retrieval import retrieval_batch


@pytest.mark.parametrize("name", list(MEMORIES))
def test_adapters_shapes_and_finite_grads(name):
    if unavailable_reason(name):
        pytest.skip(unavailable_reason(name))
    torch.manual_seed(0)
    a = build_adapter(name, 7, d_key=4, d_value=3)
    x, xq = torch.randn(2, 5, 7), torch.randn(2, 3, 7)
    y = a.write_read(x, xq)
    yc = a.causal(x)
    assert y.shape == (2, 3, 3) and yc.shape == (2, 5, 3)
    (y.sum() + yc.sum()).backward()
    grads = [p.grad for p in a.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_zero_inputs_give_no_nan():
    torch.manual_seed(0)
    for name in ("nam", "nam_erase", "delta", "dpfp1", "linear", "softmax"):
        a = build_adapter(name, 6, d_key=4, d_value=3).double()
        x = torch.zeros(1, 4, 6, dtype=torch.float64, requires_grad=True)
        y = a.write_read(x, torch.zeros(1, 2, 6, dtype=torch.float64))
        y.sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(x.grad).all(), name


def test_nam_adapter_matches_step_by_step_reference():
    """Fast path (chunked scan + read) == a plain loop of WR / RD with unit keys (docs/maths.md §1)."""
    torch.manual_seed(0)
    a = NAMAdapter(6, 4, 3, separate_erase=True).double()
    x, xq = torch.randn(2, 9, 6, dtype=torch.float64), torch.randn(2, 2, 6, dtype=torch.float64)
    unit = torch.nn.functional.normalize
    M = torch.zeros(2, 3, 4, dtype=torch.float64)
    for t in range(9):
        k, v = unit(a.k(x[:, t]), dim=-1), a.v(x[:, t])
        pw, pe = torch.sigmoid(a.p_w(x[:, t]))[:, :, None], torch.sigmoid(a.p_e(x[:, t]))[:, :, None]
        M = M + pw * v[:, :, None] * k[:, None, :] - pe * (M @ k[:, :, None]) * k[:, None, :]
    ref = a.o(torch.einsum("bvk,bqk->bqv", M, unit(a.q(xq), dim=-1)))
    torch.testing.assert_close(a.write_read(x, xq), ref)


def test_metrics_hand_case():
    b = retrieval_batch(1, 3, 4, generator=torch.Generator().manual_seed(0))
    loss, acc = retrieval_metrics(b.targets.clone(), b)
    assert float(loss) == 0.0 and float(acc) == 1.0
    loss0, _ = retrieval_metrics(torch.zeros_like(b.targets), b)
    assert float(loss0) == pytest.approx(float(b.targets.pow(2).sum(-1).mean()))


def test_delta_rule_learns_four_pairs():
    r = train_retrieval(memory="delta", num_pairs=4, d_key=16, value_dim=8, steps=150, batch_size=16,
                        lr=1e-2, eval_batch=64, seed=0)
    assert r["accuracy"] >= 0.95 and r["loss"] < 0.1, r


def test_sum_rule_worse_than_delta_with_edits():
    kw = dict(num_pairs=4, num_writes=12, edits=True, d_key=16, value_dim=8, steps=150, batch_size=16,
              lr=1e-2, eval_batch=64, seed=0)
    delta, summ = train_retrieval(memory="delta", **kw), train_retrieval(memory="linear", **kw)
    assert delta["accuracy"] >= summ["accuracy"] + 0.2, (delta, summ)
    assert delta["loss"] < summ["loss"]


def test_onehot_values_use_cross_entropy():
    b = retrieval_batch(2, 3, 5, value_kind="onehot", generator=torch.Generator().manual_seed(0))
    logits = 20.0 * b.targets  # confident and right
    loss, acc = retrieval_metrics(logits, b, "onehot")
    assert float(acc) == 1.0 and float(loss) < 1e-6
    r = train_retrieval(memory="softmax", num_pairs=3, d_key=8, value_dim=5, value_kind="onehot", steps=2,
                        batch_size=2, eval_batch=4)
    assert r["loss"] > 0 and 0.0 <= r["accuracy"] <= 1.0


def test_training_is_deterministic_and_mqar_runs():
    kw = dict(memory="nam", num_pairs=3, d_key=8, value_dim=4, steps=3, batch_size=4, eval_batch=8)
    assert train_retrieval(**kw)["loss"] == train_retrieval(**kw)["loss"]
    r = train_mqar(memory="delta", seq_len=32, num_pairs=4, vocab_size=32, d_model=8, steps=2, batch_size=2,
                   eval_batch=2)
    assert 0.0 <= r["accuracy"] <= 1.0 and r["loss"] > 0


def test_lab_runs_are_engine_runs(tmp_path):
    import memnets

    r = train_retrieval(memory="delta", num_pairs=3, d_key=8, value_dim=4, steps=3, batch_size=4, eval_batch=8,
                        run_dir=tmp_path / "cell")
    res = json.loads((tmp_path / "cell" / "results.json").read_text())
    assert res["family"] == "capacity" and res["steps"] == 3 and res["setting"]["num_pairs"] == 3
    assert (r["loss"], r["accuracy"], r["params"]) == (res["splits"]["heldout"]["loss"],
                                                        res["splits"]["heldout"]["accuracy"], res["params"])
    run = memnets.load_run(tmp_path / "cell")
    assert run.config.optim.kind == "adam" and run.config.optim.grad_clip == 1.0 and run.config.model.d_model == 8
    with pytest.raises(ValueError, match="steps"):
        train_retrieval(steps=0)


def test_sweep_table_and_bad_input():
    s = run_sweep(["linear", "nam"], [2, 3], d_key=4, value_dim=4, steps=1, batch_size=2, eval_batch=4)
    assert [(r["memory"], r["num_pairs"]) for r in s["results"]] == [("linear", 2), ("linear", 3), ("nam", 2), ("nam", 3)]
    table = markdown_table(s)
    assert table.count("\n") == 3 and "| nam |" in table and "S=3" in table
    assert "accuracy" in mqar_table({"config": {"seq_len": 8, "num_pairs": 2, "vocab_size": 8}, "results": []})
    with pytest.raises(ValueError, match="memories"):
        run_sweep(["nope"], [2])
    with pytest.raises(ValueError, match="sizes"):
        run_sweep(["nam"], [0])
    with pytest.raises(ValueError, match="memory"):
        RetrievalModel("nope", 3)
    assert set(DEFAULT_MEMORIES) <= set(MEMORIES)


def test_cli_quick_writes_json_and_png(tmp_path, capsys):
    from memnets.cli.main import main

    rc = main(["capacity", "--quick", "--memories", "linear,nam", "--sizes", "2,3", "--steps", "2",
               "--edits", "--edit-sizes", "2", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "capacity.json").read_text())
    assert data["memories"] == ["linear", "nam"] and len(data["results"]) == 4
    assert json.loads((tmp_path / "edits.json").read_text())["setting"] == "edits"
    for png in ("capacity.png", "edits.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "| memory (capacity) | S=2 | S=3 |" in out and "wall time" in out
    assert main(["capacity", "--quick", "--sizes", "0", "--out", str(tmp_path)]) == 2
