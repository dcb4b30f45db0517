"""`memnets bench launches`: the ATen ops and Triton launches of one training step of each
recurrent memory down its CUDA code path, counted on CPU tensors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import triton_missing
from memnets.bench import launches
from memnets.cli.main import main

MISSING = triton_missing()  # what the interpreter counts need

MODELS = ["LSAM", "LSAM bi", "NAM-TM", "DNC", "NTM"]
GRAPHED = {"LSAM": ("lsam.forward", "lsam.backward"), "LSAM bi": ("lsam.forward", "lsam.backward"),
           "DNC": ("dnc.module.forward", "dnc.module.backward"), "NTM": ("ntm.forward", "ntm.backward"),
           "NAM-TM": ("nam_tm.module.forward", "nam_tm.module.backward")}


def test_counter_counts_kernels_not_views():
    x = torch.randn(4, 3, requires_grad=True)
    with launches.LaunchCounter() as c:
        c.phase = "fwd"
        y = (x.view(3, 4).t().unsqueeze(0).expand(2, 4, 3) * 2).sum()  # mul, sum; views are free
        c.phase = "bwd"
        y.backward()
    fwd = c.aten["fwd"]
    assert fwd["mul"] == 1 and fwd["sum"] == 1
    assert not {"view", "t", "unsqueeze", "expand", "detach"} & set(fwd)
    assert c.totals("fwd") == (2, 0) and c.totals("bwd")[0] >= 1 and c.totals()[1] == 0


def _toy_loop(a, b):
    acc = torch.zeros_like(a)
    for _ in range(3):
        acc.add_(a * b)
    return acc, a @ b.t()


def test_counter_counts_a_graphed_call_as_one_replay_and_its_copies(monkeypatch):
    """Each call of a graphed loop: what runs inside it is the loop's; with graph replay it counts
    one launch (the replay) and the copies around it instead: one multi-tensor copy for the two
    float32 inputs, one for the two outputs."""
    from memnets.ops.gpu import graphs

    monkeypatch.delenv("MEMNETS_CUDA_GRAPHS", raising=False)
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    with launches.LaunchCounter() as bare:
        _toy_loop(a, b)
    inside = sum(bare.totals())
    assert inside >= 7  # three mul and add_, the mm (and zeroing)
    with launches.LaunchCounter() as c:
        c.phase = "fwd"
        x = a + 1
        for _ in range(2):
            out = graphs.graphed(("toy", 3), _toy_loop, x, b)
        c.phase = "bwd"
        out[0].sum()
    assert c.replay and c.totals() == (1 + 2 * inside + 1, 0)
    assert c.graph_calls["fwd"] == {"toy": 2} and c.graph_copies["fwd"] == {"toy": 2 * (1 + 1)}
    assert sum(c.graph_aten["fwd"].values()) == 2 * inside and not c.graph_aten["bwd"]
    assert c.graphed_totals() == (1 + 2 * (1 + 2) + 1, 2, 4)
    assert c.graphed_totals("fwd") == (1 + 2 * (1 + 2), 2, 4) and c.graphed_totals("bwd") == (1, 0, 0)
    # graph replay switched off: nothing replays, the two counts agree
    monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "0")
    with launches.LaunchCounter() as off:
        graphs.graphed(("toy", 3), _toy_loop, a, b)
    assert not off.replay and off.graphed_totals() == (inside, 0, 0) == (sum(off.totals()), 0, 0)
    assert off.graph_calls["all"] == {"toy": 1}


def test_bench_launches_cli_counts_and_scaling(tmp_path, monkeypatch, capsys):
    """Every memory issues launches; the launches a further time step adds do not depend on T
    (T=16 against T=32), and the step's total grows with T. The PyTorch CUDA path
    (MEMNETS_TRITON=0): the Triton kernels through the interpreter are the `interpret` test below
    (make test-triton)."""
    monkeypatch.setenv("MEMNETS_TRITON", "0")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what the command would set; restored afterwards
    res = {}
    for T in (16, 32):  # past the lengths where the NAM-TM's value-tape chunking changes its step count
        out = tmp_path / f"l{T}.json"
        assert main(["bench", "launches", "--tiny", "--batch", "2", "--length", str(T), "--json", str(out)]) == 0
        res[T] = {r["model"]: r for r in json.loads(out.read_text())["rows"]}
    printed = capsys.readouterr().out
    assert "marginal_per_t" in printed and "Kernel launches" in printed and "graphed_per_t_bench" in printed
    for name in MODELS:
        a, b = res[16][name], res[32][name]
        # the PyTorch path has no graphed loop: with graph replay, the same count
        assert a["graph_replays"] == a["graph_copies"] == 0 and a["graphed_step"] == a["launches_step"], name
        assert a["graphed_per_t_bench"] == a["per_t_bench"] and a["T_bench"] == launches.TINY_BENCH_LENGTHS[name]
        # N(T) = fixed + marginal · T through T/2 and T
        assert a["fixed_step"] == 2 * (a["half"]["aten_step"] + a["half"]["triton_step"]) - a["launches_step"]
        assert a["per_t_bench"] == pytest.approx(a["fixed_step"] / a["T_bench"] + a["marginal_per_t"], abs=0.01)
        assert a["aten_fwd"] > 0 and a["aten_bwd"] > 0 and a["aten_opt"] > 0 and a["triton_step"] == 0
        assert a["launches_step"] == a["aten_step"] == a["aten_fwd"] + a["aten_bwd"] + a["aten_opt"]
        assert b["launches_step"] > a["launches_step"], name
        assert a["marginal_per_t"] > 0 and a["per_t"] == pytest.approx(a["launches_step"] / 16, abs=0.01)
        # the half-length run of T=32 is the T=16 run: the counts are deterministic
        assert b["half"]["aten_step"] == a["aten_step"], name
        # linear in T up to a per-sequence part (checkpoint segments, the optimizer): twice the
        # length, at most twice the launches and well over the per-sequence part
        assert 1.3 * a["launches_step"] < b["launches_step"] <= 2 * a["launches_step"], name
        assert b["marginal_per_t"] == pytest.approx(a["marginal_per_t"], rel=0.25, abs=1), name


def test_bench_lengths_are_the_gpu_bench_lengths():
    assert launches.BENCH_LENGTHS == {"LSAM": 100, "LSAM bi": 100, "NAM-TM": 50, "DNC": 41, "NTM": 41}
    assert set(launches.TINY_BENCH_LENGTHS) == set(MODELS) and launches.TARGET_PER_T == 5


def test_bench_launches_rejects_odd_length_and_unknown_models():
    with pytest.raises(ValueError, match="even"):
        launches.run(length=7)
    with pytest.raises(ValueError, match="unknown model"):
        launches.run(tiny=True, models=("LSTM",))
    with pytest.raises(SystemExit, match="even"):
        main(["bench", "launches", "--length", "5"])


def _launches_child(tmp_path, *args, graphs=True):
    """``memnets bench launches --tiny --batch 2 --length 4 ARGS`` in a child process (it sets
    TRITON_INTERPRET=1 itself: the interpreter is chosen when kernels are decorated); its result
    and what it printed."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "MEMNETS_TRITON", "MEMNETS_CUDA_GRAPHS")}
    if not graphs:
        env["MEMNETS_CUDA_GRAPHS"] = "0"
    out = tmp_path / f"l{len(list(tmp_path.iterdir()))}.json"
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "memnets", "bench", "launches", "--tiny", "--batch", "2",
                        "--length", "4", "--json", str(out), *args], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(out.read_text()), p.stdout


@pytest.mark.interpret
@pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)}")
def test_bench_launches_runs_triton_kernels_through_the_interpreter(tmp_path):
    """Every row's counts are positive and the table says Triton ran. With graph replay, each call
    of a graphed loop (LSAM's and the NTM's, forward and backward: once each a step) counts one
    replay and its copies instead of what ran inside it; the loops' per-time-step launches are
    gone. The NAM-TM's and the DNC's whole layers are graphed, forward and backward. The NAM-TM's,
    the DNC's and the NTM's kernels hold the time loop at these widths: no launch per time step
    either way; LSAM's loop launches 4 per time step eagerly."""
    res, printed = _launches_child(tmp_path)
    assert res["triton_interpret"] == "1" and res["triton_used"] is True and res["graph_replay"] is True
    assert [r["model"] for r in res["rows"]] == MODELS
    for r in res["rows"]:
        name, loops = r["model"], r["graphed_loops"]
        assert r["launches_step"] > 0 and r["per_t"] > 0
        assert set(loops) == set(GRAPHED[name]) and all(v["calls"] == 1 for v in loops.values()), name
        assert r["graph_replays"] == len(GRAPHED[name])
        inside = sum(v["launches_inside"] for v in loops.values())
        assert r["graph_copies"] == sum(v["copies"] for v in loops.values())
        if name in ("NAM-TM", "DNC"):
            # the layer graphed whole (the NAM-TM: controller, projections, both kernels, W_o; the
            # DNC: input projection, the recurrence, the readout), its backward recomputing the
            # forward: the eager count is the step's own path, counted apart; neither launches
            # anything per time step (their kernels hold the time loop)
            assert r["marginal_per_t"] == 0 and r["graphed_marginal_per_t"] == 0, name
            assert 2 * r["graphed_step"] < r["launches_step"] and inside > r["launches_step"], name
            continue
        assert r["graphed_step"] == r["launches_step"] - inside + r["graph_replays"] + r["graph_copies"], name
        # the loop's kernels replaced by one replay each: fewer launches, and none more for a
        # further time step (the copies around the replay are per call, not per step); LSAM's
        # loop launches 4 a time step eagerly, the NTM's is one kernel each way
        assert r["graphed_step"] - r["graph_copies"] < r["launches_step"], name
        assert r["marginal_per_t"] == (0 if name == "NTM" else 4) and r["graphed_marginal_per_t"] == 0, name
        assert inside >= (2 if name == "NTM" else 4 * 4), name
    assert "through the interpreter" in printed and "graphed_per_t" in printed


@pytest.mark.interpret
@pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)}")
def test_bench_launches_without_graph_replay_counts_the_same_twice(tmp_path):
    """MEMNETS_CUDA_GRAPHS=0: nothing replays on CUDA, so the graphed count is the eager one."""
    res, printed = _launches_child(tmp_path, "--models", "LSAM", "DNC", "NTM", graphs=False)
    assert res["triton_used"] is True and res["graph_replay"] is False
    for r in res["rows"]:
        assert r["graphed_loops"] and r["graph_replays"] == r["graph_copies"] == 0, r["model"]
        assert r["graphed_step"] == r["launches_step"] and r["graphed_per_t"] == r["per_t"], r["model"]
        assert r["graphed_per_t_bench"] == r["per_t_bench"], r["model"]
    assert "switched off" in printed
