"""SIGKILL a training process mid-run, ``--resume`` it, and get the uninterrupted run's numbers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import torch

from memnets.train import load_config, train

TOML = """
name = "resume"
seed = 3
epochs = 4
batch_size = 16
log_every = 1
checkpoint_every = 3
threads = 1

[model]
backbone = "bilstm"
d_model = 16
options = { num_layers = 1 }

[task]
name = "palindrome"
train_digits = [1, 4]
train_size = 256
eval_size = 32
splits = { id = [2, 4], od_easy = [5, 6], od_hard = [7, 8] }

[optim]
lr = 0.003
"""


def _records(run_dir):
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in recs:
        r.pop("samples_per_s", None)
        r.pop("wall_s", None)
    return recs


def _cmd(cfg_path, run_dir, *extra):
    return [sys.executable, "-m", "memnets.cli.main", "train", str(cfg_path), "--run-dir", str(run_dir),
            "--quiet", *extra]


def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    cfg_path = tmp_path / "resume.toml"
    cfg_path.write_text(TOML)
    killed = tmp_path / "killed"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(_cmd(cfg_path, killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    last = killed / "checkpoints" / "last.json"
    deadline = time.time() + 120
    step = 0
    while time.time() < deadline and proc.poll() is None:
        if last.exists():
            try:
                step = json.loads(last.read_text())["step"]
            except (ValueError, OSError):
                step = 0
            if step >= 12:  # past the first epoch, mid-way through the second
                break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert step >= 12 and not (killed / "results.json").exists()
    assert (killed / "lock").exists()  # left behind by the killed process: must be taken over

    r = subprocess.run(_cmd(cfg_path, killed, "--resume"), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]

    threads = torch.get_num_threads()
    try:
        ref = train(load_config(str(cfg_path)), tmp_path / "ref", quiet=True)
    finally:
        torch.set_num_threads(threads)
    got = json.loads((killed / "results.json").read_text())
    assert got["splits"] == ref["splits"] and got["best_epoch"] == ref["best_epoch"]
    assert got["steps"] == ref["steps"] == 64
    assert _records(killed) == _records(tmp_path / "ref")  # every loss, every eval, same order
    env_json = json.loads((killed / "env.json").read_text())
    assert env_json["resumed_from_step"] >= 12
