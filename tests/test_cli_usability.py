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


BAD = [("model.options.num_head=2", ["`model.options.num_head`", "did you mean", "num_tapes"]),
       ("threads=-1", ["`threads`", ">= 0", "-1"])]


@pytest.mark.parametrize("override, words", BAD)
def test_bad_option_or_range_is_one_line_exit_2_and_leaves_no_run_folder(tmp_path, monkeypatch, capsys,
                                                                          override, words):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "cpu/reduce-nam_tm", override]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    assert all(w in lines[0] for w in words), lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("override, words", BAD)
def test_bad_option_or_range_from_the_shell(tmp_path, override, words):
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


def test_a_tilde_removes_a_key_a_preset_set_in_a_free_form_table(capsys):
    from memnets.train import ConfigError, load_config

    assert load_config("cpu/reduce-nam_tm").model.options["num_tapes"] == 4
    cfg = load_config("cpu/reduce-nam_tm", ["~model.options.num_tapes"])
    assert "num_tapes" not in cfg.model.options and cfg.model.options["tape_length"] == 32  # the rest stays
    cfg = load_config("cpu/reduce-nam_tm", ["~model.options.num_tapes", "model.options.num_tapes=3"])
    assert cfg.model.options["num_tapes"] == 3  # in the order given
    with pytest.raises(ConfigError, match=r"`~seed`: only a key of a free-form table"):
        load_config("cpu/reduce-nam_tm", ["~seed"])
    with pytest.raises(ConfigError, match=r"no `model.options.zz` to remove \(its table holds: normalize_heads"):
        load_config("cpu/reduce-nam_tm", ["~model.options.zz"])
    with pytest.raises(ConfigError, match=r"unknown config key `modle.options.x`"):
        load_config("cpu/reduce-nam_tm", ["~modle.options.x"])
    # from the shell, in any order with the other overrides
    assert main(["configs", "show", "cpu/reduce-nam_tm", "seed=4", "~model.options.num_tapes"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert "num_tapes" not in shown["model"]["options"] and shown["seed"] == 4


# ----------------------------------------------------------------------------- resume, --device

SMALL = ["epochs=2", "task.train_size=32", "batch_size=16", "task.eval_size=8", "model.d_model=16",
         "task.train_digits=[1, 3]", "threads=1"]


def _results(run: Path) -> dict:
    r = json.loads((run / "results.json").read_text())
    return {"splits": r["splits"], "best_epoch": r["best_epoch"], "steps": r["steps"]}


def test_ctrl_c_prints_the_resume_command_and_resume_needs_no_overrides(tmp_path, capsys, monkeypatch):
    import shlex

    from memnets.train import loop

    ref = tmp_path / "ref"
    assert main(["train", "cpu/reduce-lstm", *SMALL, "--run-dir", str(ref), "--quiet"]) == 0
    run = tmp_path / "run"
    save = loop.Trainer.save

    def save_then_interrupt(self, ep, b):  # Ctrl-C right after the first epoch's checkpoint
        save(self, ep, b)
        raise KeyboardInterrupt

    monkeypatch.setattr(loop.Trainer, "save", save_then_interrupt)
    assert main(["train", "cpu/reduce-lstm", *SMALL, "--run-dir", str(run), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "step 2" in err
    cmd = shlex.split(err.strip().splitlines()[-1])
    assert cmd == ["memnets", "train", "cpu/reduce-lstm", "--resume", "--run-dir", str(run)]
    monkeypatch.setattr(loop.Trainer, "save", save)
    assert main(cmd[1:] + ["--quiet"]) == 0  # no overrides retyped: the run's config.json is used
    assert json.loads((run / "config.json").read_text())["epochs"] == 2
    assert _results(run) == _results(ref)


def test_a_run_stopped_by_a_nan_continues_with_the_printed_skip_command(tmp_path, capsys, monkeypatch):
    """A non-finite gradient stops a run (``optim.nan_policy = "raise"``) and prints the command
    that continues it dropping such steps; that command (``optim.nan_policy`` may change on
    resume) ends where a run started with ``optim.nan_policy=skip`` ends."""
    import shlex

    from memnets.train import loop

    real = loop.update

    def nan_at_step_3(cfg, model, opt, loss, step, *more):
        return real(cfg, model, opt, loss * float("nan") if step == 3 else loss, step, *more)

    monkeypatch.setattr(loop, "update", nan_at_step_3)
    ref = tmp_path / "ref"
    assert main(["train", "cpu/reduce-lstm", *SMALL, "optim.nan_policy=skip", "--run-dir", str(ref), "--quiet"]) == 0
    run = tmp_path / "run"
    assert main(["train", "cpu/reduce-lstm", *SMALL, "--run-dir", str(run), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "non-finite loss `loss` at step 3" in err and "step 2" in err and "optim.lr" in err
    cmd = shlex.split(err.strip().splitlines()[-1])
    assert cmd == ["memnets", "train", "cpu/reduce-lstm", "optim.nan_policy=skip", "--resume", "--run-dir", str(run)]
    assert main(cmd[1:] + ["--quiet"]) == 0
    assert json.loads((run / "config.json").read_text())["optim"]["nan_policy"] == "skip"
    assert _results(run) == _results(ref)
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("skipped_steps") == 1 for r in recs if r["kind"] == "train")


def test_resume_accepts_free_keys_and_the_original_overrides_but_not_a_change(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "cpu/reduce-lstm", *SMALL, "epochs=1", "--run-dir", str(run), "--quiet"]) == 0
    capsys.readouterr()
    # the command that started it, repeated with --resume, still works; so does a free key
    assert main(["train", "cpu/reduce-lstm", *SMALL, "epochs=1", "--run-dir", str(run), "--quiet", "--resume"]) == 0
    assert main(["train", "cpu/reduce-lstm", "threads=2", "--run-dir", str(run), "--quiet", "--resume"]) == 0
    capsys.readouterr()
    assert main(["train", "cpu/reduce-lstm", "optim.lr=0.5", "--run-dir", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "cannot change optim.lr" in err and "compile" in err


def test_the_command_that_removed_an_option_also_resumes_the_run(tmp_path, capsys):
    run = tmp_path / "run"
    cmd = ["train", "cpu/reduce-nam_tm", *SMALL, "epochs=1", "~model.options.normalize_heads", "--run-dir", str(run),
           "--quiet"]
    assert main(cmd) == 0
    assert "normalize_heads" not in json.loads((run / "config.json").read_text())["model"]["options"]
    assert main([*cmd, "--resume"]) == 0  # the saved config lacks the option already: nothing to remove
    capsys.readouterr()
    # a run started with the option cannot lose it on resume
    other = tmp_path / "other"
    assert main(["train", "cpu/reduce-nam_tm", *SMALL, "epochs=1", "--run-dir", str(other), "--quiet"]) == 0
    assert main(["train", "cpu/reduce-nam_tm", "~model.options.normalize_heads", "--run-dir", str(other),
                 "--resume"]) == 2
    assert "cannot change model.options" in capsys.readouterr().err


def _last_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    step = json.loads((run / "checkpoints" / "last.json").read_text())["step"]
    return load_file(str(run / "checkpoints" / f"step-{step:09d}.safetensors"))


def test_a_finished_run_resumed_with_a_longer_budget_is_the_longer_run(tmp_path, capsys):
    import torch

    ref = tmp_path / "ref"
    assert main(["train", "cpu/reduce-lstm", *SMALL, "epochs=4", "--run-dir", str(ref), "--quiet"]) == 0
    run = tmp_path / "run"
    assert main(["train", "cpu/reduce-lstm", *SMALL, "--run-dir", str(run), "--quiet"]) == 0  # epochs=2
    assert json.loads((run / "results.json").read_text())["steps"] == 4
    from memnets.train import loop

    save = loop.Trainer.save

    def save_then_interrupt(self, ep, b):  # Ctrl-C right after the third epoch's checkpoint
        save(self, ep, b)
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop.Trainer, "save", save_then_interrupt)
        assert main(["train", "cpu/reduce-lstm", "epochs=4", "--run-dir", str(run), "--quiet", "--resume"]) == 130
    assert not (run / "results.json").exists()  # the two-epoch results no longer describe the run
    assert main(["train", "cpu/reduce-lstm", "epochs=4", "--run-dir", str(run), "--quiet", "--resume"]) == 0
    assert json.loads((run / "config.json").read_text())["epochs"] == 4
    assert _results(run) == _results(ref)
    a, b = _last_weights(run), _last_weights(ref)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # max_steps likewise: lifted (0) on a run it stopped
    cut = tmp_path / "cut"
    assert main(["train", "cpu/reduce-lstm", *SMALL, "epochs=4", "max_steps=3", "--run-dir", str(cut),
                 "--quiet"]) == 0
    assert json.loads((cut / "results.json").read_text())["steps"] == 3
    assert main(["train", "cpu/reduce-lstm", "max_steps=0", "--run-dir", str(cut), "--quiet", "--resume"]) == 0
    assert json.loads((cut / "results.json").read_text())["steps"] == 8
    a = _last_weights(cut)
    assert all(torch.equal(a[k], b[k]) for k in a)
    capsys.readouterr()
    # a shorter budget is refused, and so is any change of it under the cosine schedule
    assert main(["train", "cpu/reduce-lstm", "epochs=3", "--run-dir", str(run), "--resume"]) == 2
    assert "`epochs` may only grow on resume" in capsys.readouterr().err
    cos = tmp_path / "cos"
    assert main(["train", "cpu/reduce-lstm", *SMALL, "schedule.kind=cosine", "--run-dir", str(cos), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["train", "cpu/reduce-lstm", "epochs=4", "--run-dir", str(cos), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "cannot change epochs" in err and "cosine schedule decays over the whole budget" in err


def test_device_option_with_overrides_after_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "cpu/reduce-lstm", "--device", "cpu", *SMALL, "max_steps=1", "--run-dir", str(run),
                 "--quiet"]) == 0
    assert json.loads((run / "config.json").read_text())["device"] == "cpu"
    assert json.loads((run / "config.json").read_text())["max_steps"] == 1
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["train", "cpu/reduce-lstm", "--gpu", "cpu", "max_steps=1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --gpu cpu\n" in err and "max_steps" not in err.splitlines()[-1]
    from memnets.cli.experiment import train_argv

    assert "device=cpu" in train_argv("ntm-copy", None, ["--device", "cpu"])


# ----------------------------------------------------------------------------- --version

def test_version_does_not_import_torch_and_is_fast():
    code = ("import sys, time; t = time.perf_counter(); from memnets.cli.main import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "print(time.perf_counter() - t, 'torch' in sys.modules, 'matplotlib' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    version, timing = p.stdout.strip().splitlines()
    assert version.startswith("memnets ")
    seconds, torch_loaded, mpl_loaded = timing.split()
    assert torch_loaded == "False" and mpl_loaded == "False"
    assert float(seconds) < 1.0


# ----------------------------------------------------------------------------- memnets report

def test_report_defaults_into_the_runs_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = _run_dir(tmp_path / "runs", "a", 0, 0.5)
    b = _run_dir(tmp_path / "runs", "b", 1, 0.7)
    assert main(["report", "runs/a", "runs/b"]) == 0
    assert (tmp_path / "runs" / "report.html").is_file() and not (tmp_path / "report.html").exists()
    assert str(tmp_path / "runs" / "report.html") in capsys.readouterr().out
    assert a.parent == b.parent
    assert "/report.html" in (REPO / ".gitignore").read_text().split()


# ----------------------------------------------------------------------------- names

def test_nam_step_takes_initial_state_like_nam_scan_and_state_with_a_warning():
    import torch

    from memnets.ops import nam_scan, nam_step, unit

    g = torch.Generator().manual_seed(0)
    q, k = unit(torch.randn(2, 3, 2, 4, generator=g)), unit(torch.randn(2, 3, 2, 4, generator=g))
    v, p = torch.randn(2, 3, 2, 4, generator=g), torch.rand(2, 3, 2, generator=g)
    s0 = torch.randn(2, 2, 4, 4, generator=g)
    out, s = nam_scan(q, k, v, p, p, initial_state=s0, impl="reference")
    y, s1 = nam_step(q[:, 0], k[:, 0], v[:, 0], p[:, 0], p[:, 0], initial_state=s0)
    torch.testing.assert_close(y, out[:, 0])
    with pytest.warns(DeprecationWarning, match="initial_state"):
        y_old, s_old = nam_step(q[:, 0], k[:, 0], v[:, 0], p[:, 0], p[:, 0], state=s0)
    torch.testing.assert_close(s_old, s1)
    with pytest.raises(TypeError, match="both"):
        nam_step(q[:, 0], k[:, 0], v[:, 0], p[:, 0], p[:, 0], state=s0, initial_state=s0)


def test_backbones_have_names_that_match_their_labels_and_old_names_still_work(tmp_path, capsys):
    from memnets.models.seq import BACKBONES, SequenceTaskModel
    from memnets.train import load_config

    assert BACKBONES["bilstm"][3] == "biLSTM" and BACKBONES["lsam_stack"][3] == "LSAM (stack)"
    assert "lstm" not in BACKBONES and "lsam" not in BACKBONES
    assert load_config("cpu/reduce-lstm").model.backbone == "bilstm"  # the presets use the new names
    with pytest.warns(FutureWarning, match="'lstm' is now named 'bilstm'"):
        cfg = load_config("cpu/reduce-transformer", ["model.backbone=lstm", "model.options={num_layers = 1}"])
    assert cfg.model.backbone == "bilstm"
    with pytest.warns(FutureWarning, match="'lsam_stack'"):
        assert SequenceTaskModel("lsam", d_model=16, num_heads=2).backbone_name == "lsam_stack"
    # a run recorded under a former name is still labelled by what it is
    d = _run_dir(tmp_path, "old", 0, 0.5)
    res = json.loads((d / "results.json").read_text())
    (d / "results.json").write_text(json.dumps({**res, "backbone": "lstm"}))
    assert main(["table", str(d)]) == 0
    assert "| biLSTM |" in capsys.readouterr().out


def test_renamed_preset_still_loads_with_a_warning():
    from memnets.train import load_config
    from memnets.train.config import list_presets

    assert not [p for p in list_presets() if p.endswith("-nam-nam") or p.endswith("-9000-nam")]
    with pytest.warns(FutureWarning, match="now named 'lra/listops-2000-nam-9000'"):
        old = load_config("lra/listops-2000-nam-9000-nam")
    assert old == load_config("lra/listops-2000-nam-9000")
    assert not [p for p in list_presets() if "(was " in load_config(p).description]


def test_time_limit_help_says_it_stops_inside_an_epoch(tmp_path, capsys):
    from memnets.train.config import describe_keys

    help_text = next(h for k, _, _, h in describe_keys() if k == "time_limit_min")
    assert "inside an epoch" in help_text
    run = tmp_path / "run"
    assert main(["train", "cpu/reduce-lstm", *SMALL, "time_limit_min=1e-9", "--run-dir", str(run), "--quiet"]) == 0
    res = json.loads((run / "results.json").read_text())
    assert res["steps"] == 1 and res["stopped_by_time_limit"] and res["best_epoch"] < 1


def test_a_run_stopped_inside_an_epoch_logs_its_steps_and_has_a_learning_curve(tmp_path, capsys):
    from memnets.viz.curves import read_metrics, train_curve

    run = tmp_path / "run"
    assert main(["train", "cpu/reduce-lstm", *SMALL, "max_steps=1", "log_every=20", "--run-dir", str(run),
                 "--quiet"]) == 0
    curve = train_curve(read_metrics(run))
    assert curve is not None and curve[1] == [1.0]  # the one step, logged although log_every is 20
