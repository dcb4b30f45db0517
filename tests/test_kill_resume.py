"""SIGKILL a tiny `memnets train` run again and again; each `--resume` continues it, and the
final metrics equal those of an uninterrupted run.

Each run is a forked child process executing ``memnets.cli.main.main(argv)`` (the
``memnets train`` command), so the import of torch is paid once; tests/test_resume.py covers
the same with a fresh interpreter.

The kill points are seeded: a step count drawn at random (the run checkpoints every step)
plus a random delay of up to 30 ms after that checkpoint appears, so some kills land while
the next checkpoint is being written.
"""
from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

from engine_helpers import checkpoint_step, launch_train

from memnets.train import load_config, train

TOML = """
name = "killme"
seed = 5
epochs = 3
batch_size = 8
log_every = 1
checkpoint_every = 1
eval_every = 1
threads = 1
[model]
backbone = "lstm"
d_model = 8
options = { num_layers = 1 }
[task]
name = "palindrome"
train_digits = [1, 3]
train_size = 96
eval_size = 16
splits = { id = [2, 3], od_easy = [4, 4], od_hard = [5, 5] }
[optim]
lr = 0.003
"""
STEPS = 3 * 96 // 8  # 36 optimiser steps
KILLS = 6


def _records(run_dir: Path) -> list[dict]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in recs:
        r.pop("samples_per_s", None)
        r.pop("wall_s", None)
    return recs


def test_repeated_sigkill_then_resume_matches_uninterrupted(tmp_path):
    cfg_path = tmp_path / "killme.toml"
    cfg_path.write_text(TOML)
    from memnets.cli.main import build_parser
    from memnets.models.seq import SequenceTaskModel  # noqa: F401  imported once, before forking

    build_parser()  # imports every subcommand module in this process
    ref_dir = tmp_path / "ref"  # the uninterrupted run (which also warms up this process)
    ref = train(load_config(cfg_path), ref_dir, quiet=True)
    rng = random.Random(1234)
    targets = sorted(rng.sample(range(1, STEPS - 8), KILLS))
    run_dir = tmp_path / "killed"
    killed_at = []
    for i, target in enumerate(targets):
        proc = launch_train(cfg_path, run_dir, resume=i > 0)
        deadline = time.time() + 60
        while time.time() < deadline and proc.is_alive() and checkpoint_step(run_dir) < target:
            time.sleep(0.002)
        if i == 0 and proc.is_alive():  # a second writer while the first one is alive: refused
            other = launch_train(cfg_path, run_dir, resume=True)
            other.join(timeout=60)
            assert other.exitcode == 2 and proc.is_alive()
        time.sleep(rng.uniform(0.0, 0.03))
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL, f"run {i} was not killed (exit code {proc.exitcode})"
        assert not (run_dir / "results.json").exists()
        killed_at.append(checkpoint_step(run_dir))
    assert len(killed_at) == KILLS and killed_at[-1] < STEPS
    assert len(set(killed_at)) >= 3, killed_at  # the kills are spread over the run

    proc = launch_train(cfg_path, run_dir, resume=True)
    proc.join(timeout=120)
    assert proc.exitcode == 0
    res = json.loads((run_dir / "results.json").read_text())
    for k in ("splits", "final", "best_epoch", "steps", "epochs", "params"):
        assert res[k] == ref[k], (k, res[k], ref[k])
    assert _records(run_dir) == _records(ref_dir)
    assert not (run_dir / "lock").exists()
