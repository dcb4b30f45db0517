"""Edges of the command line: --version, closed pipes, folders that hold no run, config-key
suggestions, argument-less commands, ``configs keys`` / docs/config.md, ``configs show --toml``
and TensorBoard logging. Every failing command exits 2 with one line on stderr, no traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memnets.cli.main import main
from memnets.train.config import (RunConfig, config_from_dict, config_to_toml, describe_keys, flatten_keys,
                                  keys_markdown, list_presets, load_config, suggest_key)

REPO = Path(__file__).resolve().parents[1]


def _fails(argv, capsys, *excerpts) -> str:
    """Run ``memnets argv``: exit status 2, one line on stderr holding every excerpt, no traceback."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("memnets ") and ": error: " in lines[0], err
    assert "Traceback" not in err
    for x in excerpts:
        assert x in lines[0], (x, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- --version, pipes

def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("memnets ") and out.split()[1][0].isdigit(), out


def test_version_python_m(capsys, monkeypatch):
    import runpy

    monkeypatch.setattr(sys, "argv", ["python -m memnets", "--version"])
    with pytest.raises(SystemExit) as e:  # memnets/__main__.py, as `python -m memnets --version` runs it
        runpy.run_module("memnets", run_name="__main__", alter_sys=False)
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("memnets ")


def test_closed_pipe_ends_quietly():
    # like `memnets configs ls | head -1`: read one line, then close the pipe while the command
    # still prints (unbuffered, so each line is a write of its own)
    p = subprocess.Popen([sys.executable, "-m", "memnets", "configs", "ls"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=120) in (0, 141), err  # 0 only if it finished before the pipe closed
    assert first.strip()
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err


def test_broken_pipe_is_handled_once_in_main(tmp_path, monkeypatch, capsys):
    import memnets.cli.configs as configs

    def write_to_closed_pipe(args):
        print("a line")
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(configs, "_ls", write_to_closed_pipe)
    with open(tmp_path / "stdout", "w") as f:
        monkeypatch.setattr(sys, "stdout", f)  # a real file descriptor, pointed at devnull by main
        assert main(["configs", "ls"]) == 141
        print("more output after the pipe closed")
        f.flush()  # goes to devnull now, no error
    assert "Traceback" not in capsys.readouterr().err


# ----------------------------------------------------------------------------- table / report on non-runs

def _task_results(d: Path, **kw) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    res = {"name": d.name, "task": "reduce", "backbone": "lstm", "params": 1234,
           "splits": {"id": {"seq_acc": 0.5, "tok_acc": 0.9, "ans_acc": 0.6}}, **kw}
    (d / "results.json").write_text(json.dumps(res))
    return d


def test_table_refuses_folders_that_are_not_task_runs(tmp_path, capsys):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "results.json").write_text(json.dumps({"model": "lsam", "accuracy": 0.9}))  # an experiment's output
    _fails(["table", str(exp)], capsys, str(exp), "not an algorithmic-task run", '"task"', "reduce")
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(["table", str(empty)], capsys, str(empty), "no results.json", "memnets train")
    copy = _task_results(tmp_path / "copy", task="copy")
    _fails(["table", str(copy)], capsys, str(copy), "'copy'")
    notdict = tmp_path / "list"
    notdict.mkdir()
    (notdict / "results.json").write_text("[1, 2]")
    _fails(["table", str(notdict)], capsys, "results.json", "JSON object")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "results.json").write_text("{not json")
    _fails(["table", str(broken)], capsys, "cannot read", "results.json")
    good = _task_results(tmp_path / "good")
    _fails(["table", "--metric", "ans_acc", str(good), str(exp)], capsys, str(exp))
    _fails(["table", str(_task_results(tmp_path / "nometric", splits={"id": {"seq_acc": 1.0}})),
            "--metric", "tok_acc"], capsys, "'tok_acc'", "'id'")
    # a finished run beside an unfinished one: the table, and a note on the one skipped
    assert main(["table", str(good), str(empty)]) == 0
    cap = capsys.readouterr()
    assert "| Reduce | ID | 50.0% |" in cap.out and f"skipping {empty}" in cap.err


def test_report_refuses_folders_that_are_not_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "results.json").write_text(json.dumps({"model": "lsam", "accuracy": 0.9}))
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(["report", str(exp)], capsys, str(exp), "not a run directory", "config.json")
    _fails(["report", "exp"], capsys, "exp", '"task"')
    assert not (tmp_path / "report.html").exists()  # nothing written
    (tmp_path / "report.html").write_text("an earlier report")
    _fails(["report", str(empty)], capsys, str(empty), "not a run directory")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "results.json").write_text("{not json")
    _fails(["report", str(broken), "--out", "r2.html"], capsys, "cannot read")
    assert (tmp_path / "report.html").read_text() == "an earlier report" and not (tmp_path / "r2.html").exists()


# ----------------------------------------------------------------------------- config-key suggestions

@pytest.mark.parametrize("key, want", [
    ("optim.learning_rate", "optim.lr"), ("learning_rate", "optim.lr"), ("lr", "optim.lr"),
    ("optim.lrr", "optim.lr"), ("optim.wd", "optim.weight_decay"), ("schedule.warmup", "schedule.warmup_steps"),
    ("gamma", "schedule.gamma"), ("batchsize", "batch_size"), ("num_epochs", "epochs"),
    ("optim.optimizer", "optim.kind"), ("tensorbord", "tensorboard"), ("task.fresh", "task.fresh_each_epoch"),
    ("model.num_heads", "model.options.num_heads"), ("model.backbon", "model.backbone"),
])
def test_suggest_key(key, want):
    assert suggest_key(key, flatten_keys(RunConfig)) == want


def test_unknown_key_suggests_the_alias(capsys, tmp_path):
    _fails(["train", "cpu/reduce-nam_tm", "optim.learning_rate=0.1", "--run-dir", str(tmp_path / "r")], capsys,
           "unknown config key `optim.learning_rate`; did you mean `optim.lr`?")
    assert not (tmp_path / "r").exists()
    _fails(["configs", "show", "cpu/reduce-nam_tm", "learning_rate=0.1"], capsys, "did you mean `optim.lr`?")
    toml = tmp_path / "c.toml"
    toml.write_text("[optim]\nlearning_rate = 0.1\n")
    _fails(["configs", "show", str(toml)], capsys, "did you mean `optim.lr`?")


# ----------------------------------------------------------------------------- argument-less commands

def test_viz_without_arguments_says_what_it_needs(capsys):
    line = _fails(["viz"], capsys, "run directory", "--model NAME")
    assert "not both" not in line
    _fails(["viz", "some/run", "--model", "ntm"], capsys, "not both")


def test_configs_show_without_arguments_asks_for_a_preset(capsys):
    line = _fails(["configs", "show"], capsys, "preset name", "memnets configs ls")
    assert "key=value" not in line



@pytest.mark.parametrize("argv", [["configs", "{}", "cpu/"], ["suite", "{}"]])
def test_list_is_another_name_for_ls(argv, capsys):
    outs = []
    for name in ("ls", "list"):
        assert main([a.format(name) for a in argv]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0].count("\n") >= 3


# ----------------------------------------------------------------------------- configs keys, docs/config.md

EXPLAINED = ["time_limit_min", "select_ties", "task.fresh_each_epoch", "checkpoint_every", "tensorboard", "amp",
             "optim.nan_policy", "threads", "optim.kind"]


def test_configs_keys_lists_every_key(capsys):
    from memnets.models.seq import BACKBONES
    from memnets.train.config import _CHOICES

    rows = {k: (t, d, h) for k, t, d, h in describe_keys()}
    leaves = [k for k in flatten_keys(RunConfig) if k not in ("model", "task", "optim", "schedule")]
    assert sorted(rows) == sorted(leaves)
    assert all(len(h) > 10 for _, _, h in rows.values()), rows
    assert rows["optim.lr"] == ("float", "0.0001", rows["optim.lr"][2])
    assert rows["task.train_digits"][:2] == ("[integer, integer]", "[1, 10]")
    for path, choices in _CHOICES.items():  # every choice of a key is named in its meaning
        assert all(c in rows[".".join(path)][2] for c in choices), path
    assert all(name in rows["model.backbone"][2] for name in BACKBONES)
    assert "RUN_DIR/tb" in rows["tensorboard"][2] and "0: no limit" in rows["time_limit_min"][2]
    assert main(["configs", "keys"]) == 0
    out = capsys.readouterr().out
    for key in EXPLAINED + ["optim.lr", "model.options", "task.splits"]:
        line = next(ln for ln in out.splitlines() if ln.split()[0] == key)
        assert rows[key][2] in line


def test_docs_config_md_is_up_to_date(capsys):
    assert main(["configs", "keys", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out == keys_markdown() + "\n"
    doc = (REPO / "docs" / "config.md").read_text()
    start, end = "<!-- config-keys:start -->\n", "\n<!-- config-keys:end -->"
    table = doc[doc.index(start) + len(start):doc.index(end)]
    assert table == out.rstrip("\n"), "docs/config.md is stale: paste `memnets configs keys --markdown` in it"


# ----------------------------------------------------------------------------- configs show --toml

def test_every_preset_round_trips_through_toml(tmp_path):
    for i, name in enumerate(list_presets()):
        cfg = load_config(name)
        path = tmp_path / f"p{i}.toml"
        path.write_text(config_to_toml(cfg))
        assert load_config(path) == cfg, name


def test_toml_of_awkward_values_round_trips(tmp_path):
    cfg = config_from_dict({
        "name": 'q"uote\\back\nline\tτ\x7f', "description": "",
        "model": {"backbone": "ntm", "d_model": 8,
                  "options": {"memory_slots": 4, "ratio": 1e-30, "big": 1e300, "on": False, "neg": -3,
                              "names": ["a b", "c=d"], "nested": {"x y": 1, "deep": {"z": [1.5, 2]}},
                              "rows": [{"a": 1}, {"b": "two"}], "empty": {}}},
        "task": {"splits": {"id": [2, 3], "weird key": [4, 5]}, "train_size": 128}, "select_split": "id",
        "optim": {"lr": 3e-4, "betas": [0.5, 0.75]},
    })
    path = tmp_path / "awkward.toml"
    path.write_text(config_to_toml(cfg))
    assert load_config(path) == cfg


def test_configs_show_toml_is_accepted_by_train(tmp_path, capsys):
    assert main(["configs", "show", "cpu/reduce-nam_tm", "optim.lr=0.002", "--toml"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "run.toml"
    path.write_text(text)
    want = load_config("cpu/reduce-nam_tm", ["optim.lr=0.002"])
    assert load_config(path) == want and load_config(path).optim.lr == 0.002
    assert main(["configs", "show", str(path)]) == 0  # the same file as `memnets train` reads it
    assert json.loads(capsys.readouterr().out)["optim"]["lr"] == 0.002


# ----------------------------------------------------------------------------- TensorBoard

def test_tensorboard_flag(tmp_path, capsys):
    """``tensorboard = true`` writes event files to RUN_DIR/tb, or trains on with a note when the
    tensorboard package is missing (what the README says)."""
    from memnets.train import train

    cfg = config_from_dict({
        "name": "tb", "epochs": 1, "batch_size": 4, "log_every": 1, "threads": 1, "tensorboard": True,
        "model": {"backbone": "bilstm", "d_model": 8, "options": {"num_layers": 1}},
        "task": {"train_digits": [1, 2], "train_size": 8, "eval_size": 4, "splits": {"id": [1, 2]}},
        "select_split": "id"})
    train(cfg, tmp_path / "tb-run", quiet=True)
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        assert "tensorboard is not installed" in capsys.readouterr().err
        assert not (tmp_path / "tb-run" / "tb").exists()
    else:
        assert any((tmp_path / "tb-run" / "tb").glob("events.out.tfevents.*"))
    assert (tmp_path / "tb-run" / "results.json").is_file()
