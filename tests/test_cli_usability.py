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


# ----------------------------------------------------------------------------- one-line errors

def _memnets(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memnets", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("override, words", [
    ("model.options.num_head=2", ["`model.options.num_head`", "did you mean", "num_tapes"]),
    ("threads=-1", ["`threads`", ">= 0", "-1"]),
])
def test_bad_option_or_range_is_one_line_exit_2_and_leaves_no_run_folder(tmp_path, override, words):
    p = _memnets("train", "cpu/reduce-nam_tm", override, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "runs").exists()


def test_backbone_options_are_checked_for_every_backbone(tmp_path, capsys):
    run = tmp_path / "sub" / "run"
    assert main(["train", "cpu/reduce-transformer", "model.options.num_head=2", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "did you mean `model.options.num_heads`?" in err
    assert not (tmp_path / "sub").exists()
    # a value the model cannot take is one line too
    assert main(["train", "cpu/reduce-nam_tm", "model.options.num_tapes=0", "--run-dir", str(run)]) == 2
    assert "num_tapes" in capsys.readouterr().err and not (tmp_path / "sub").exists()


@pytest.mark.parametrize("override", ["seed=-1", "optim.lr=-1e-3", "optim.betas=[0.9, 1.5]", "task.eval_size=0",
                                      "time_limit_min=-2", "checkpoint_every=-1", "schedule.gamma=0"])
def test_numeric_keys_are_checked_against_their_range(override):
    from memnets.train import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"expected .*got"):
        load_config("cpu/reduce-nam_tm", [override])
