"""SIGKILL a tiny `memnets train` run again and again; each `--resume` continues it, and the
final metrics equal those of an uninterrupted run.

Each run is a child process executing ``memnets.cli.main.main(argv)`` (the ``memnets train``
command), forked from a server that has imported torch once (``engine_helpers.child_context``); tests/test_resume.py covers
the same with a fresh interpreter.

The kill points are deterministic, not timed: the child kills itself with SIGKILL at a given
optimiser step, either right after that step's checkpoint is committed (``after``) or while it
is being written, once its weight and state files are on disk but before ``last.json`` names
them (``during``), so a load on the machine cannot move a kill.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

from engine_helpers import checkpoint_step, child_context, child_environ, launch_train

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
backbone = "bilstm"
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


def _records(run_dir: Path) -> list[dict]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in recs:
        r.pop("samples_per_s", None)
        r.pop("wall_s", None)
    return recs


# (step, when): "after" its checkpoint is committed, or "during" its writing (before last.json);
# steps 12 and 24 are epoch ends (12 steps per epoch), checkpointed after the evaluation
KILLS = [(3, "after"), (7, "during"), (12, "after"), (16, "during"), (24, "during"), (29, "after")]


def _child_killed_at(argv: list[str], step: int, when: str, hold: str | None, env: dict) -> None:
    """``memnets train argv`` that SIGKILLs itself at ``step`` (``when``: after / during its
    checkpoint). With ``hold``, it first waits there until the file ``hold + ".go"`` exists
    (having created ``hold + ".ready"``), so that the parent can act while it is alive."""
    from memnets.cli.main import main
    from memnets.train import checkpoint as ck

    child_environ(env)
    save, write = ck.save_checkpoint, ck.atomic_write_text

    def die() -> None:
        if hold:
            Path(hold + ".ready").touch()
            while not Path(hold + ".go").exists():
                time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)

    def write_text(path, text, *a, **k):
        if when == "during" and Path(path).name == "last.json" and json.loads(text)["step"] == step:
            die()  # the step files are written, the pointer to them is not
        return write(path, text, *a, **k)

    def save_checkpoint(ckpt_dir, s, *a, **k):
        save(ckpt_dir, s, *a, **k)
        if when == "after" and s == step:
            die()

    ck.save_checkpoint, ck.atomic_write_text = save_checkpoint, write_text
    sys.stdout = open(os.devnull, "w")
    os._exit(main(argv))


def _launch_killed_at(cfg_path: Path, run_dir: Path, resume: bool, step: int, when: str,
                      hold: str | None = None) -> multiprocessing.Process:
    argv = ["train", str(cfg_path), "--run-dir", str(run_dir), "--quiet"] + (["--resume"] if resume else [])
    proc = child_context().Process(target=_child_killed_at, args=(argv, step, when, hold, dict(os.environ)))
    proc.start()
    return proc


def test_repeated_sigkill_then_resume_matches_uninterrupted(tmp_path):
    cfg_path = tmp_path / "killme.toml"
    cfg_path.write_text(TOML)
    from memnets.cli.main import build_parser
    from memnets.models.seq import SequenceTaskModel  # noqa: F401  imported once, before forking

    build_parser()  # imports every subcommand module in this process
    ref_dir = tmp_path / "ref"  # the uninterrupted run (which also warms up this process)
    ref = train(load_config(cfg_path), ref_dir, quiet=True)
    run_dir = tmp_path / "killed"
    hold = str(tmp_path / "hold")
    killed_at = []
    for i, (step, when) in enumerate(KILLS):
        proc = _launch_killed_at(cfg_path, run_dir, i > 0, step, when, hold if i == 0 else None)
        if i == 0:  # a second writer while the first one is alive (held at its kill point): refused
            deadline = time.time() + 120
            while not Path(hold + ".ready").exists() and proc.is_alive() and time.time() < deadline:
                time.sleep(0.005)
            assert proc.is_alive() and Path(hold + ".ready").exists()
            other = launch_train(cfg_path, run_dir, resume=True)
            other.join(timeout=60)
            assert other.exitcode == 2 and proc.is_alive()
            Path(hold + ".go").touch()
        proc.join(timeout=120)
        assert proc.exitcode == -signal.SIGKILL, f"run {i} was not killed (exit code {proc.exitcode})"
        assert not (run_dir / "results.json").exists()
        killed_at.append(checkpoint_step(run_dir))
        if when == "during":  # the torn checkpoint's files are there, unnamed
            assert list((run_dir / "checkpoints").glob(f"step-{step:09d}.*")), sorted(os.listdir(run_dir / "checkpoints"))
    # the last committed checkpoint: the kill step itself, or the one before a kill during writing
    assert killed_at == [s if w == "after" else s - 1 for s, w in KILLS]

    proc = launch_train(cfg_path, run_dir, resume=True)
    proc.join(timeout=120)
    assert proc.exitcode == 0
    res = json.loads((run_dir / "results.json").read_text())
    for k in ("splits", "final", "best_epoch", "steps", "epochs", "params"):
        assert res[k] == ref[k], (k, res[k], ref[k])
    assert _records(run_dir) == _records(ref_dir)
    assert not (run_dir / "lock").exists()
