"""Shared checks for the task families of the training engine: a tiny run, then load_run,
``memnets eval``, ``memnets table``, ``memnets report`` and ``memnets viz``; SIGKILL + ``--resume``; 2-process DDP."""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import multiprocessing
from pathlib import Path

import torch


# the overrides that make a preset of each family a run of seconds (a couple of steps)
TINY = {
    "nsp": ["epochs=1", "task.train_size=32", "batch_size=16", "task.eval_size=16", "log_every=1", "threads=1",
            "model.d_model=16", "model.options={num_layers = 1}"],
    "ntm": ["epochs=2", "task.train_size=8", "batch_size=4", "task.eval_size=4", "log_every=1", "threads=1",
            "model.options.memory_slots=16", "model.options.controller_size=16", "model.options.word_size=8"],
    "lra": ["epochs=1", "max_steps=3", "task.train_size=24", "task.eval_size=8", "batch_size=4", "log_every=1",
            "task.options.max_len=48", "model.d_model=16", "model.options.layers=1", "model.options.heads=2",
            "model.options.ffn=32", "time_limit_min=0", "threads=1"],
    "babi": ["epochs=3", "task.options.ls_max_epochs=1", "task.options.softmax_epochs=2", "task.options.anneal_every=1",
             "log_every=5"],
    "fewshot": ["epochs=2", "task.options.classes=40", "batch_size=16", "task.eval_size=10", "log_every=5",
                "time_limit_min=0"],
    "capacity": ["epochs=1", "task.train_size=64", "task.eval_size=32", "log_every=1", "model.d_model=16"],
}


def tiny_config(preset: str, *more: str):
    """``preset`` with the :data:`TINY` overrides of its family (the preset's folder; ``nsp`` for
    the algorithmic ones), then ``more``."""
    from memnets.train import load_config

    folder = preset.split("/")[0]
    return load_config(preset, [*TINY.get(folder, TINY["nsp"]), *more])


def records(run_dir: Path) -> list[dict]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in recs:
        r.pop("samples_per_s", None)
        r.pop("wall_s", None)
    return recs


def check_run_folder(run_dir: Path, capsys=None) -> dict:
    """The files of a finished run; load_run, eval, table, report and viz on it. Returns results.json."""
    import memnets
    from memnets.cli.main import main

    for f in ("config.json", "env.json", "metrics.jsonl", "results.json", "checkpoints/last.json",
              "checkpoints/best.safetensors"):
        assert (run_dir / f).is_file(), f
    res = json.loads((run_dir / "results.json").read_text())
    run = memnets.load_run(run_dir)
    assert isinstance(run.model, torch.nn.Module) and not run.model.training
    assert run.results == res and run.config.name == res["name"]
    again = run.evaluate()
    for split, m in res["splits"].items():  # the best weights score what was reported
        for k, v in m.items():
            if isinstance(v, float):
                assert abs(again[split][k] - v) <= 1e-4 * max(1.0, abs(v)), (split, k, again[split][k], v)
    memnets.load_run(run_dir, "last")
    assert main(["eval", str(run_dir), "--json"]) == 0
    assert main(["table", str(run_dir)]) == 0
    out = run_dir.parent / f"{run_dir.name}-report.html"
    assert main(["report", str(run_dir), "--out", str(out)]) == 0
    page = out.read_text()
    metric = res.get("metric", "seq_acc")
    assert res["name"] in page and f"{next(iter(res['splits']))} {metric}" in page
    # the model was rebuilt and run on its task's own sample
    assert "no figures" not in page, page[page.find("no figures"):][:300]
    figs = run_dir.parent / f"{run_dir.name}-figures"
    assert main(["viz", str(run_dir), "--out", str(figs), "--dpi", "30"]) == 0
    assert any(p.suffix == ".png" for p in figs.iterdir())
    if capsys is not None:
        capsys.readouterr()
    return res


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_on_a_free_port(worker, rest: tuple, run_dir: Path, nprocs: int = 2, tries: int = 3) -> None:
    """``mp.spawn(worker, args=(nprocs, port, *rest))`` on a free port. The port is free when
    chosen, but another process may take it before rank 0 binds it: a start that fails for that
    reason is made again on another port, ``run_dir`` (the workers' run folder) cleared first."""
    import shutil

    import torch.multiprocessing as mp

    for attempt in range(tries):
        try:
            mp.spawn(worker, args=(nprocs, free_port(), *rest), nprocs=nprocs, join=True)
            return
        except Exception as e:  # noqa: BLE001 - only a taken port is tried again
            taken = "eaddrinuse" in str(e).lower() or "address already in use" in str(e).lower()
            if not taken or attempt + 1 == tries:
                raise
            shutil.rmtree(run_dir, ignore_errors=True)


def _ddp_worker(rank: int, world: int, port: int, cfg_dict: dict, run_dir: str) -> None:
    from memnets.train import config_from_dict, train

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    res = train(config_from_dict(cfg_dict), run_dir, quiet=True)
    assert res["world_size"] == world


def ddp_matches_single(cfg, tmp_path: Path, rtol: float = 1e-4, atol: float = 1e-5) -> tuple[dict, dict]:
    """Train ``cfg`` with 2 gloo processes and with one; the logged losses agree."""
    import torch.multiprocessing as mp

    from memnets.train import config_to_dict, train

    spawn_on_a_free_port(_ddp_worker, (config_to_dict(cfg), str(tmp_path / "ddp")), tmp_path / "ddp")
    threads = torch.get_num_threads()
    try:
        single = train(cfg, tmp_path / "single", quiet=True)
    finally:
        torch.set_num_threads(threads)
    both = json.loads((tmp_path / "ddp/results.json").read_text())
    assert both["world_size"] == 2 and both["steps"] == single["steps"]
    a = [r["loss"] for r in records(tmp_path / "ddp") if r["kind"] == "train"]
    b = [r["loss"] for r in records(tmp_path / "single") if r["kind"] == "train"]
    assert len(a) == len(b) and len(a) >= 2
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=rtol, atol=atol)
    return both, single


def checkpoint_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "checkpoints" / "last.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def child_environ(env: dict) -> None:
    """Take the launching test's environment (``MEMNETS_DATA`` and the like): a forkserver child
    inherits the server's, as it was when the server started."""
    os.environ.clear()
    os.environ.update(env)


def _child(argv: list[str], env: dict) -> None:
    from memnets.cli.main import main

    child_environ(env)
    sys.stdout = open(os.devnull, "w")
    os._exit(main(argv))


_CONTEXT: list = []


def child_context():
    """A ``forkserver`` context whose server has imported torch and the CLI: each child is forked
    from that quiet process (no threads, no locks held), not from pytest's, whose OpenMP pool or
    locks held by other threads could hang a forked child; the imports are paid once."""
    if not _CONTEXT:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "memnets.cli.main", "memnets.train", "memnets.models.seq"])
        _CONTEXT.append(ctx)
    return _CONTEXT[0]


def launch_train(cfg_path: Path, run_dir: Path, resume: bool) -> multiprocessing.Process:
    argv = ["train", str(cfg_path), "--run-dir", str(run_dir), "--quiet"] + (["--resume"] if resume else [])
    proc = child_context().Process(target=_child, args=(argv, dict(os.environ)))
    proc.start()
    return proc


def kill_and_resume_matches(cfg, tmp_path: Path, kill_after: list[int]) -> dict:
    """Run ``cfg`` (checkpointing every step) in a forked ``memnets train``, SIGKILL it once its
    checkpoint reaches each step of ``kill_after``, ``--resume`` it to the end: the results
    and metrics equal those of an uninterrupted run."""
    from memnets.cli.main import build_parser
    from memnets.train import train
    from memnets.train.config import config_to_toml

    assert cfg.checkpoint_every == 1
    cfg_path = tmp_path / "cfg.toml"
    cfg_path.write_text(config_to_toml(cfg))
    build_parser()
    ref = train(cfg, tmp_path / "ref", quiet=True)
    run_dir = tmp_path / "killed"
    for i, target in enumerate(kill_after):
        proc = launch_train(cfg_path, run_dir, resume=i > 0)
        deadline = time.time() + 120
        while time.time() < deadline and proc.is_alive() and checkpoint_step(run_dir) < target:
            time.sleep(0.002)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL, f"run {i} was not killed (exit code {proc.exitcode})"
        assert not (run_dir / "results.json").exists()
    proc = launch_train(cfg_path, run_dir, resume=True)
    proc.join(timeout=300)
    assert proc.exitcode == 0
    res = json.loads((run_dir / "results.json").read_text())
    for k in ("splits", "final", "best_epoch", "steps", "epochs", "params"):
        assert res[k] == ref[k], (k, res[k], ref[k])
    assert records(run_dir) == records(tmp_path / "ref")
    return res
