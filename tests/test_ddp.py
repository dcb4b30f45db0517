"""DistributedDataParallel with 2 CPU processes (gloo) matches one process on the same global batch."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
from engine_helpers import spawn_on_a_free_port

from memnets.train import ModelConfig, OptimConfig, RunConfig, TaskConfig, train


def _cfg() -> RunConfig:
    return RunConfig(name="ddp", seed=1, epochs=2, batch_size=16, log_every=2, threads=1,
                     model=ModelConfig("bilstm", 16, {"num_layers": 1}),
                     task=TaskConfig(name="reduce", train_digits=(1, 4), train_size=96, eval_size=32,
                                     splits={"id": (2, 4), "od_easy": (5, 6)}),
                     optim=OptimConfig(lr=3e-3))


def _worker(rank: int, world: int, port: int, run_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    res = train(_cfg(), run_dir, quiet=True)
    assert res["world_size"] == world


def _losses(run_dir):
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in x]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed gloo missing")
def test_ddp_two_processes_match_single(tmp_path):
    spawn_on_a_free_port(_worker, (str(tmp_path / "ddp"),), tmp_path / "ddp")
    threads = torch.get_num_threads()
    try:
        single = train(_cfg(), tmp_path / "single", quiet=True)
    finally:
        torch.set_num_threads(threads)
    both = json.loads((tmp_path / "ddp/results.json").read_text())
    assert both["world_size"] == 2 and both["steps"] == single["steps"] == 12
    env = json.loads((tmp_path / "ddp/env.json").read_text())
    assert env["world_size"] == 2
    a, b = _losses(tmp_path / "ddp"), _losses(tmp_path / "single")
    assert len(a) == len(b) and a[0] != a[-1]
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-5)
    for split in ("id", "od_easy"):
        assert abs(both["final"][split]["tok_acc"] - single["final"][split]["tok_acc"]) < 0.02
        assert both["final"][split]["n"] == single["final"][split]["n"] == 32  # shards summed
