"""`memnets bench launches`: the ATen ops and Triton launches of one training step of each
recurrent memory down its CUDA code path, counted on CPU tensors."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memnets.bench import launches
from memnets.cli.main import main

MODELS = ["LSAM", "LSAM bi", "NAM-TM", "DNC", "NTM"]


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
    assert "marginal_per_t" in printed and "Kernel launches" in printed
    for name in MODELS:
        a, b = res[16][name], res[32][name]
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


def test_bench_launches_rejects_odd_length_and_unknown_models():
    with pytest.raises(ValueError, match="even"):
        launches.run(length=7)
    with pytest.raises(ValueError, match="unknown model"):
        launches.run(tiny=True, models=("LSTM",))
    with pytest.raises(SystemExit, match="even"):
        main(["bench", "launches", "--length", "5"])


@pytest.mark.interpret
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("triton", "numpy")),
                    reason="triton (and numpy, for its interpreter) not installed")
def test_bench_launches_runs_triton_kernels_through_the_interpreter(tmp_path):
    """The command sets TRITON_INTERPRET=1 itself (a child process: the interpreter is chosen when
    kernels are decorated); every row's counts are positive and the table says Triton ran."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MEMNETS_TRITON")}
    out = tmp_path / "l.json"
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "memnets", "bench", "launches", "--tiny", "--batch", "2",
                        "--length", "4", "--json", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["triton_interpret"] == "1" and res["triton_used"] is True
    assert [r["model"] for r in res["rows"]] == MODELS
    for r in res["rows"]:
        assert r["launches_step"] > 0 and r["per_t"] > 0
    assert "through the interpreter" in p.stdout
