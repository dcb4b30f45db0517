"""``memnets experiment``: every experiment and preset is an alias of `memnets train` presets;
arguments become overrides, errors name what was expected, and a run goes through end to end."""
from __future__ import annotations

import json

import pytest

from memnets.cli.experiment import ALIASES, EXPERIMENTS, RESUMING, train_argv
from memnets.cli.main import main
from memnets.train import list_presets, load_config


@pytest.mark.parametrize("key", sorted(ALIASES, key=str))
def test_every_alias_names_loadable_presets(key):
    for i, entry in enumerate(ALIASES[key]):
        argv = train_argv(*key, ["seed=3"], i)
        assert argv[0] in list_presets()
        overrides = [a.replace("{run0}", "runs/x") for a in argv[1:] if "=" in a]
        assert load_config(argv[0], overrides).seed == 3  # the caller's override comes last and wins


def test_arguments_become_train_arguments():
    assert train_argv("ntm-copy", "cpu", ["epochs=1", "--out", "d"]) == ["ntm/copy-cpu", "epochs=1", "--run-dir", "d"]
    assert train_argv("lra", "listops-200", ["epochs=1", "--out", "d", "--quiet", "x=2"], 1) == \
        ["lra/listops-200-linear", "epochs=1", "x=2", "--quiet", "--run-dir", "d/listops-200-linear"]
    assert train_argv("babi-memn2n", "joint-10-seeds", ["--out", "d"], 3) == \
        ["babi/memn2n-joint", "seed=3", "name=babi-memn2n-joint-s3", "--run-dir", "d/babi-memn2n-joint-s3"]
    with pytest.raises(ValueError, match="key=value"):
        train_argv("ntm-copy", None, ["--steps", "2"])
    assert {p for runs in ALIASES.values() for r in runs for p in r.split()[:1]} <= set(list_presets())
    assert set(EXPERIMENTS) == {e for e, _ in ALIASES} and RESUMING <= set(EXPERIMENTS)


def test_errors_name_the_expected_values(capsys):
    assert main(["experiment", "nope"]) == 2
    assert "expected one of" in capsys.readouterr().err
    assert main(["experiment", "lra/nope"]) == 2
    assert "preset of 'lra' expected one of" in capsys.readouterr().err
    assert main(["experiment", "ntm-copy", "--steps", "2"]) == 2
    assert "memnets train ntm/copy" in capsys.readouterr().err
    assert main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EXPERIMENTS) and "listops-2000" in out and "seed=0..9" in out
    assert "repeat-copy-seeds-10-13 = memnets train ntm/repeat_copy seed=10..13 (4 runs)" in out
    from memnets.cli.experiment import _short

    assert _short(tuple(f"p seed={s}" for s in (0, 1, 3, 4))) == [f"p seed={s}" for s in (0, 1, 3, 4)]


def test_runs_an_experiment_end_to_end(tmp_path, capsys):
    import torch

    threads = torch.get_num_threads()
    try:
        assert main(["experiment", "ntm-copy/cpu", "epochs=1", "task.train_size=16", "log_every=1",
                     "task.eval_size=2", "task.options.max_len=3", "task.splits={len4 = [4, 4]}",
                     "select_split=len4", "model.options.memory_slots=16", "--quiet", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert "memnets train ntm/copy-cpu" in capsys.readouterr().out
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["steps"] == 4 and res["sequences_seen"] == 16  # the override, batch 4
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["log_every"] == 1 and cfg["task"]["splits"] == {"len4": [4, 4]}
