"""The command line as a new user meets it: tables of repeated runs, one-line errors, resuming
without retyping, the version, where the report goes."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memnets.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def _run_dir(root: Path, name: str, seed: int, acc: float, params: int = 11_000) -> Path:
    d = root / name
    d.mkdir(parents=True)
    splits = {s: {"seq_acc": acc, "tok_acc": acc, "ans_acc": acc} for s in ("id", "od_easy", "od_hard")}
    (d / "results.json").write_text(json.dumps({"name": name, "task": "reduce", "backbone": "nam_tm",
                                                "params": params, "splits": splits}))
    (d / "config.json").write_text(json.dumps({"seed": seed}))
    return d


# ----------------------------------------------------------------------------- memnets table

def test_table_pools_two_runs_of_one_cell_in_either_order(tmp_path, capsys):
    a = _run_dir(tmp_path, "a", 0, 0.559)
    b = _run_dir(tmp_path, "b", 1, 0.988, params=40_000)
    outs = []
    for order in ([a, b], [b, a]):
        assert main(["table", *map(str, order)]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    row = next(line for line in outs[0].splitlines() if "| OD-hard |" in line)
    assert "77.4% (55.9, 98.8)" in row  # the mean, then each run
    assert "pool several runs" in outs[0]


def test_table_one_run_per_cell_is_unchanged(tmp_path, capsys):
    a = _run_dir(tmp_path, "a", 0, 0.559)
    assert main(["table", str(a)]) == 0
    out = capsys.readouterr().out
    assert "| 55.9% |" in out and "pool" not in out
