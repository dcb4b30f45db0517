"""The NTM tasks (copy, repeat_copy, associative_recall, priority_sort) through `memnets train`:
presets, a tiny run of each, load_run / eval / table / report, SIGKILL + resume, 2-process DDP."""
from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from engine_helpers import TINY as ENGINE_TINY
from engine_helpers import check_run_folder, ddp_matches_single, kill_and_resume_matches, tiny_config
from memnets.cli.main import main
from memnets.train import ConfigError, apply_overrides, list_presets, load_config, train
from memnets.train.task import FAMILIES, get_task, task_names

NTM_PRESETS = ["ntm/copy", "ntm/copy-cpu", "ntm/repeat_copy", "ntm/associative_recall", "ntm/priority_sort"]
TINY = ENGINE_TINY["ntm"]
tiny = tiny_config


def test_registry_names_every_family_task():
    assert FAMILIES["ntm"] == ("copy", "repeat_copy", "associative_recall", "priority_sort")
    assert {"fib", "reduce", "copy"} <= set(task_names())
    assert get_task("copy").family == "ntm" and get_task("reduce").family == "nsp"
    with pytest.raises(ConfigError, match="expected one of"):
        get_task("nope")
    assert set(NTM_PRESETS) <= set(list_presets())


def test_train_package_exports_the_engine_lazily():
    import subprocess
    import sys

    import memnets.train as t
    from memnets.train.loop import Trainer
    from memnets.train.runs import load_run
    from memnets.train.task import Task, get_task, register_task

    assert (t.Trainer, t.Task, t.get_task, t.register_task, t.load_run) == \
        (Trainer, Task, get_task, register_task, load_run)
    assert {"Trainer", "Task", "get_task", "register_task", "load_run"} <= set(t.__all__)
    code = ("import sys, memnets.train.checkpoint; "
            "print(sorted(m for m in sys.modules if m.startswith('memnets.train')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['memnets.train', 'memnets.train.checkpoint']"  # no loop, tasks or models


def test_presets_reproduce_the_copy_experiment():
    cfg = load_config("ntm/copy")
    assert cfg.task.name == "copy" and cfg.model.backbone == "ntm" and cfg.batch_size == 4
    assert cfg.epochs * cfg.task.train_size == 24_000 and cfg.epochs * cfg.task.train_size // cfg.batch_size == 6000
    assert cfg.optim.kind == "adam" and cfg.optim.lr == 2e-3 and cfg.optim.grad_clip == 10.0
    assert cfg.optim.weight_decay == 0.0 and cfg.schedule.kind == "constant"
    assert cfg.model.options["memory_slots"] == 128 and cfg.model.options["controller_size"] == 100
    assert sorted(cfg.task.splits) == ["len120", "len20", "len40", "len80"] and cfg.task.eval_size == 64
    cpu = load_config("ntm/copy-cpu")
    assert cpu.log_every == 50 and sorted(cpu.task.splits) == ["len20", "len40", "len80"]
    assert (cpu.batch_size, cpu.optim.lr, cpu.epochs, cpu.task.train_size) == (4, 2e-3, 30, 800)
    assert cpu.optim.spike_skip == 1000.0 and cfg.optim.spike_skip == 0.0


def test_bad_settings_are_named():
    with pytest.raises(ConfigError, match="did you mean `task.options.max_len`"):
        apply_overrides(load_config("ntm/copy"), ["task.options.maxlen=3"])
    with pytest.raises(ConfigError, match="model.backbone"):
        apply_overrides(load_config("ntm/copy"), ["model.backbone=lstm"])
    with pytest.raises(ConfigError, match="select_split"):
        apply_overrides(load_config("ntm/copy"), ["select_split=od_easy"])
    with pytest.raises(ConfigError, match="task.options"):
        apply_overrides(load_config("cpu/reduce-lstm"), ["task.options.min_len=1"])


@pytest.mark.parametrize("preset", NTM_PRESETS[1:])
def test_tiny_run_then_load_eval_table_report(preset, tmp_path, capsys):
    res = train(tiny(preset), tmp_path / "run", quiet=True)
    assert res["family"] == "ntm" and res["metric"] == "bit_errors" and res["steps"] == 4
    assert res["sequences_seen"] == 16 and res["final_cost_bits"] > 0
    assert set(res["splits"]) == set(load_config(preset).task.splits)
    for m in res["splits"].values():
        assert set(m) == {"cost_bits", "bit_errors", "seq_acc", "n"} and m["n"] == 4
    check_run_folder(tmp_path / "run", capsys)
    assert main(["table", str(tmp_path / "run")]) == 0
    assert "bit_errors per sequence" in capsys.readouterr().out


def test_train_cli_and_experiment_alias(tmp_path, capsys):
    assert main(["train", "ntm/copy-cpu", *TINY, "--run-dir", str(tmp_path / "a"), "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["name"] == "ntm-copy-cpu" and "len20" in out["bit_errors"]
    assert main(["experiment", "ntm-copy/cpu", *TINY, "--quiet", "--out", str(tmp_path / "b")]) == 0
    assert "memnets train ntm/copy-cpu" in capsys.readouterr().out
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in "ab")
    assert a["splits"] == b["splits"]


def test_algorithmic_run_through_the_shared_checks(tmp_path, capsys):
    res = train(tiny_config("cpu/reduce-lstm"), tmp_path / "nsp", quiet=True)
    assert "family" not in res and res["steps"] == 2  # the algorithmic tasks' schema
    check_run_folder(tmp_path / "nsp", capsys)


def test_table_mixes_families(tmp_path, capsys):
    from test_train import tiny_config

    train(tiny_config(epochs=1), tmp_path / "nsp", quiet=True)
    train(tiny("ntm/associative_recall"), tmp_path / "ntm", quiet=True)
    assert main(["table", str(tmp_path / "nsp"), str(tmp_path / "ntm")]) == 0
    out = capsys.readouterr().out
    assert "## nsp" in out and "## ntm" in out and "| Reduce | ID |" in out and "**associative_recall**" in out


def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    cfg = tiny("ntm/copy-cpu", "checkpoint_every=1", "epochs=3", "task.splits={len4 = [4, 4]}", "select_split=len4")
    kill_and_resume_matches(cfg, tmp_path, kill_after=[2, 5])


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed gloo missing")
def test_ddp_two_processes_match_single(tmp_path):
    cfg = tiny("ntm/associative_recall", "task.options.same_length=false")
    both, single = ddp_matches_single(cfg, tmp_path)
    for split, m in single["final"].items():
        assert both["final"][split]["n"] == m["n"] == 4  # shards summed
        assert abs(both["final"][split]["cost_bits"] - m["cost_bits"]) < 1e-3 * m["cost_bits"]


def test_table_counts_dropped_updates_where_a_run_has_some():
    """The NTM table gains a column of dropped updates (spikes / non-finite) when a run of the
    task dropped any, and has none otherwise."""
    from memnets.train.families.ntm import NTMTask

    def run(seed, spikes, nan):
        return {"name": "copy", "task": "copy", "seed": seed, "params": 10, "steps": 6000,
                "splits": {"len20": {"bit_errors": 0.0}}, "final_cost_bits": 0.01,
                "sequences_to_cost_below_0.1": 4000, "updates_dropped": {"spikes": spikes, "non_finite": nan}}

    with_drops = NTMTask.format_table([run(0, 0, 0), run(1, 12, 1)])
    assert "updates dropped (spikes / non-finite)" in with_drops and "| 0 / 0 |" in with_drops
    assert "| 12 / 1 |" in with_drops
    without = NTMTask.format_table([run(0, 0, 0), {k: v for k, v in run(1, 0, 0).items() if k != "updates_dropped"}])
    assert "updates dropped" not in without
    for table in (with_drops, without):  # header, rule and rows: one cell count
        assert len({ln.count("|") for ln in table.splitlines()[2:]}) == 1
