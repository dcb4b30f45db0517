"""``memnets suite run|ls`` and ``memnets table --paper`` beside our runs (tiny sizes).

The suite runs each training run as a subprocess (``python -m memnets.cli.main train``), so
each costs an interpreter start; the runs here are a couple of seconds each.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memnets.cli.main import main
from memnets.cli.suite import list_suites, load_suite, run_name, run_status, suite_runs
from memnets.cli.table import MODEL_ORDER, PAPER_TABLE1, format_table1_vs_paper
from memnets.train import ConfigError, list_presets, load_config

REPO = Path(__file__).resolve().parents[1]
TINY = ["task.train_size=64", "task.eval_size=32", "model.d_model=16", "batch_size=16", "time_limit_min=0"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Every suite here runs in its own folder: the default results folder is ``results/<suite>``
    under the current one."""
    monkeypatch.chdir(tmp_path)


def _suite(tmp_path: Path, presets, seeds, overrides, extra: str = "") -> Path:
    f = tmp_path / "tiny-suite.toml"
    f.write_text(f'description = "tiny"\npresets = {json.dumps(presets)}\nseeds = {json.dumps(seeds)}\n'
                 f"overrides = {json.dumps(overrides)}\n{extra}")
    return f


def test_suite_runs_skips_finished_runs_and_resumes_unfinished_ones(tmp_path, capsys):
    suite = _suite(tmp_path, ["cpu/reduce-lstm_attention", "cpu/fib-transformer"], [0], ["epochs=1", *TINY])
    runs = tmp_path / "runs"
    argv = ["suite", "run", str(suite), "--runs-dir", str(runs), "--results-dir", ""]  # run folders alone
    assert main([*argv, "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    names = ["cpu-reduce-lstm_attention-s0", "cpu-fib-transformer-s0"]
    for n in names:
        assert (runs / n / "results.json").is_file() and (runs / n / "suite.log").is_file()
        cfg = json.loads((runs / n / "config.json").read_text())
        assert cfg["threads"] == 1 and cfg["epochs"] == 1 and cfg["model"]["d_model"] == 16
        assert f"| {n} | done |" in out  # the per-run table: status, params, wall time
    assert "2 to start" in out and "## Table 1: ours / the paper's" in out
    assert "/ 98.9 |" in out and "/ 28.7M" in out and "/ 71.5 |" in out  # the paper's figures beside ours
    mtimes = {n: (runs / n / "results.json").stat().st_mtime_ns for n in names}

    # a second invocation trains nothing
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(2 done, 0 to resume, 0 to start)" in out and "starting" not in out and "resuming" not in out
    assert all((runs / n / "results.json").stat().st_mtime_ns == mtimes[n] for n in names)

    # a run with a checkpoint but no results (interrupted) is resumed from its checkpoint
    (runs / names[1] / "results.json").unlink()
    assert run_status(runs / names[1]) == "resume" and run_status(runs / names[0]) == "done"
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "resume from step 4" in out and run_status(runs / names[1]) == "resume"
    # the dry run also prints the tables of what is finished: the resumable run shows as such
    assert "## Runs" in out and f"| {names[1]} | resume | – |" in out and f"| {names[0]} | done |" in out
    png = tmp_path / "curves" / "c.png"  # the learning curves of the finished run (the other resumes)
    assert main([*argv, "--dry-run", "--curves", str(png)]) == 0
    assert "curves of 1 run(s)" in capsys.readouterr().out and png.stat().st_size > 1000
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"{names[1]}: resuming from step 4" in out and "(1 done, 1 to resume, 0 to start)" in out
    assert json.loads((runs / names[1] / "env.json").read_text())["resumed_from_step"] == 4
    assert (runs / names[1] / "results.json").is_file()
    assert (runs / names[0] / "results.json").stat().st_mtime_ns == mtimes[names[0]]


def test_suite_of_another_family_prints_its_table(tmp_path, capsys):
    mqar = ["task.options.seq_len=32", "task.options.num_pairs=4", "task.options.vocab_size=32"]
    suite = _suite(tmp_path, ["capacity/retrieval-delta", "capacity/mqar-delta"], [0],
                   ["epochs=1", "task.train_size=64", "task.eval_size=16", "model.d_model=8"],
                   f'[overrides_for]\n"capacity/mqar-delta" = {json.dumps(mqar)}\n')
    runs = tmp_path / "runs"
    assert main(["suite", "run", str(suite), "--runs-dir", str(runs), "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    for n in ("capacity-retrieval-delta-s0", "capacity-mqar-delta-s0"):
        assert f"| {n} | done |" in out and (runs / n / "results.json").is_file()
    assert "| reported |" in out and "accuracy (heldout " in out  # each run's own metric
    assert "Table 1" not in out and "## capacity" in out
    assert "**retrieval**, held-out accuracy (%)" in out and "**mqar**, held-out accuracy (%)" in out
    assert out.count("| delta |") == 2  # the capacity family's table, as `memnets table` prints it


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.parametrize("how", ["sigkill", "ctrl-c"])
def test_suite_interrupted_continues_on_rerun(tmp_path, how):
    """SIGKILL of the suite alone (its training subprocess must die with it), or Ctrl-C (SIGINT
    to the whole process group, as a terminal sends it); the same command then resumes the run."""
    suite = _suite(tmp_path, ["cpu/reduce-lstm_attention"], [3],
                   ["epochs=150", "eval_every=50", *TINY[:1], "task.eval_size=16", "model.d_model=8"])
    runs = tmp_path / "runs"
    run = runs / "cpu-reduce-lstm_attention-s3"
    cmd = [sys.executable, "-m", "memnets.cli.main", "suite", "run", str(suite), "--runs-dir", str(runs)]
    # SIGINT back to its default in the suite: a test runner started as a background job
    # ignores SIGINT, and its children would inherit that (Python then installs no handler)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while not (run / "checkpoints" / "last.json").is_file():
            assert proc.poll() is None and time.time() < deadline, "the suite ended before a checkpoint"
            time.sleep(0.02)
        trainer = int((run / "lock").read_text())
        if how == "sigkill":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == (-signal.SIGKILL if how == "sigkill" else 130)
    assert not (run / "results.json").exists(), "the run finished before the interruption; make it longer"
    deadline = time.time() + 10
    while _alive(trainer) and time.time() < deadline:  # the training subprocess dies with the suite
        time.sleep(0.05)
    assert not _alive(trainer)
    step = json.loads((run / "checkpoints" / "last.json").read_text())["step"]
    assert run_status(run) == "resume"
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "resuming from step" in res.stdout
    assert json.loads((run / "env.json").read_text())["resumed_from_step"] >= step > 0
    assert json.loads((run / "results.json").read_text())["steps"] == 150  # batch_size 64 = train_size: one step an epoch


def test_table1_cpu_suite_covers_the_papers_seven_columns(capsys):
    assert "table1-cpu" in list_suites()
    assert not any(p.startswith("suites/") for p in list_presets())  # suites are not presets
    s = load_suite("table1-cpu")
    assert s.seeds == [1, 2] and len(s.presets) == 21
    from memnets.cli.table import TASK_LABEL, _label

    cells = set()
    for p in s.presets:
        cfg = load_config(p)
        assert p.startswith("cpu/")
        cells.add((TASK_LABEL[cfg.task.name], _label({"backbone": cfg.model.backbone})))
    assert cells == {(t, c) for t in ("Palin", "Fib", "Reduce") for c in MODEL_ORDER[:7]}
    runs = suite_runs(s, "runs/x")
    assert len(runs) == 48 and runs[0].name == "cpu-palindrome-transformer-s1"
    assert runs[1].overrides[:2] == ["threads=1", "seed=2"]
    assert main(["suite", "ls"]) == 0
    assert re.search(r"^table1-cpu +48 runs", capsys.readouterr().out, re.M)


def test_suite_options_and_bad_input(tmp_path, capsys):
    suite = _suite(tmp_path, ["cpu/fib-nam_tm", "demo/reduce-lstm"], [0, 1], ["epochs=1"],
                   '[seeds_for]\n"demo/reduce-lstm" = [7]\n')
    s = load_suite(str(suite))
    runs = suite_runs(s, tmp_path / "r", seeds=None, overrides=["threads=2"])
    assert [r.name for r in runs] == ["cpu-fib-nam_tm-s0", "cpu-fib-nam_tm-s1", "demo-reduce-lstm-s7"]
    assert load_config(runs[0].preset, runs[0].overrides).threads == 2  # an override wins over --threads
    assert [r.seed for r in suite_runs(s, tmp_path, seeds=[4])] == [4, 4]
    assert run_name(str(tmp_path / "mine.toml"), 2) == "mine-s2"
    assert main(["suite", "run", str(suite), "--runs-dir", str(tmp_path / "r"), "--seeds", "3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "cpu-fib-nam_tm-s3" in out and "demo-reduce-lstm-s3" in out and not (tmp_path / "r").exists()
    # bad input: exit 2 before anything trains
    assert main(["suite", "run", "no-such-suite"]) == 2
    assert "no suite" in capsys.readouterr().err
    assert main(["suite", "run", str(suite), "optim.lrr=1", "--runs-dir", str(tmp_path / "r")]) == 2
    assert "did you mean `optim.lr`" in capsys.readouterr().err and not (tmp_path / "r").exists()
    assert main(["suite", "run", str(suite), "--seeds", "a,b"]) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text('preset = ["cpu/fib-nam_tm"]\n')
    assert main(["suite", "run", str(bad)]) == 2
    assert "did you mean `presets`" in capsys.readouterr().err


def test_suite_overrides_for_one_preset(tmp_path):
    suite = _suite(tmp_path, ["cpu/fib-nam_tm", "demo/reduce-lstm"], [0], ["time_limit_min=4"],
                   '[overrides_for]\n"cpu/fib-nam_tm" = ["time_limit_min=0", "epochs=2"]\n')
    runs = suite_runs(load_suite(str(suite)), tmp_path / "r", overrides=["epochs=3"])
    fib, lstm = (load_config(r.preset, r.overrides) for r in runs)
    assert fib.time_limit_min == 0 and lstm.time_limit_min == 4  # per preset, after the suite's
    assert fib.epochs == 3  # the command line's overrides still win
    bad = tmp_path / "bad.toml"
    bad.write_text('presets = ["cpu/fib-nam_tm"]\n[overrides_for]\n"cpu/fib-dnc" = ["epochs=1"]\n')
    with pytest.raises(ConfigError, match="not in `presets`"):
        load_suite(str(bad))
    bad.write_text('presets = ["cpu/fib-nam_tm"]\n[overrides_for]\n"cpu/fib-nam_tm" = "epochs=1"\n')
    with pytest.raises(ConfigError, match="overrides_for.cpu/fib-nam_tm"):
        load_suite(str(bad))


def test_table1_suites_train_every_model_of_a_task_alike():
    """Equal terms: within a task every cell trains the same epochs of the same batch and
    samples, with no wall-time cap; the sweep holds the same runs at three rates on seed 0, the
    table reports other seeds."""
    table, sweep = load_suite("table1-cpu"), load_suite("table1-lr-sweep")
    budget = {}
    for r in suite_runs(table, "r") + suite_runs(sweep, "r"):
        cfg = load_config(r.preset, r.overrides)
        assert cfg.time_limit_min == 0, r.name
        budget.setdefault(cfg.task.name, set()).add((cfg.epochs, cfg.batch_size, cfg.task.train_size))
    assert budget == {"palindrome": {(40, 64, 6400)}, "reduce": {(40, 64, 6400)}, "fib": {(150, 64, 6400)}}
    assert sweep.seeds == [0] and 0 not in table.seeds and len(sweep.sweep["optim.lr"]) >= 3
    chose_fib = {0, 1}  # the seeds that chose the Fib NAM-TM preset (docs/fib.md section 5)
    for p in ("cpu/fib-nam_tm", "cpu/fib-nam_tm_nojmp"):
        assert len(table.seeds_for[p]) >= 5 and not chose_fib & set(table.seeds_for[p])
    assert sorted(sweep.presets) == sorted(p for p in table.presets if "nam_tm" not in p)
    runs = suite_runs(sweep, "r")
    base = sweep.sweep["optim.lr"]
    extended = {p: g["optim.lr"] for p, g in sweep.sweep_for.items()}
    ladder = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
    for p, grid in [("base", base), *extended.items()]:  # at least three neighbouring rates of the ladder
        i = ladder.index(min(grid))
        assert sorted(grid) == ladder[i:i + len(grid)] and len(grid) >= 3, p
    n_extra = sum(len(g) - len(base) for g in extended.values())
    assert len(runs) == 45 + n_extra and runs[0].name == "cpu-palindrome-transformer-lr0.0001-s0"


def test_kept_table1_sweep_chose_inside_every_grid():
    """From the kept sweep results: every preset's chosen rate lies inside its grid, or on an
    edge where the figure is already >= 99% or the step past it diverged (kept apart in
    results/table1-lr-sweep-diverged/): a choice on an edge extends the grid (docs/table1.md)."""
    from memnets.cli.suite import sweep_table

    sweep = load_suite("table1-lr-sweep")
    runs = suite_runs(sweep, REPO / "no-such-runs-folder", results_dir=REPO / "results" / "table1-lr-sweep")
    lines = sweep_table(sweep, runs).splitlines()
    labels = [c.strip() for c in lines[0].strip("|").split("|")][2:-1]
    diverged = {d.name for d in (REPO / "results" / "table1-lr-sweep-diverged").iterdir()}
    checked = 0
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        preset, figs, chosen = cells[0], dict(zip(labels, cells[2:-1])), cells[-1]
        grid = [lab for lab in labels if figs[lab]]
        assert chosen in grid, (preset, chosen)  # every run of the grid is kept and finished
        if chosen in (grid[0], grid[-1]):
            past = labels[labels.index(chosen) + (1 if chosen == grid[-1] else -1)]
            edge_ok = float(figs[chosen].split()[0]) >= 99.0
            assert edge_ok or f"{preset.replace('/', '-')}-{past}-s0" in diverged, (preset, chosen, grid)
        checked += 1
    assert checked == 15


def _fake_run(d: Path, backbone: str, task: str, seed: int, accs: tuple[float, float, float], params=1000):
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"seed": seed}))
    splits = {k: {"seq_acc": a, "tok_acc": a, "ans_acc": a} for k, a in zip(("id", "od_easy", "od_hard"), accs)}
    (d / "results.json").write_text(json.dumps({"name": d.name, "task": task, "backbone": backbone,
                                                "params": params, "splits": splits}))


def test_table_paper_prints_the_papers_figures_beside_ours(tmp_path, capsys):
    _fake_run(tmp_path / "b", "nam_tm", "fib", 1, (0.9, 0.5, 0.25), 230_000)
    _fake_run(tmp_path / "a", "nam_tm", "fib", 0, (1.0, 0.4, 0.125), 230_000)
    _fake_run(tmp_path / "c", "lstm", "fib", 0, (0.5, 0.0, 0.0))  # a column the paper's Table 1 lacks
    assert main(["table", "--paper", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    rows, task = {}, ""
    for line in out.splitlines():
        if line.startswith("|"):
            t, split = (c.strip() for c in line.strip("|").split("|")[:2])
            task = t or task
            rows[(task, split)] = line
    head = [c.strip() for c in rows[("Model", "")].strip("|").split("|")]
    assert head[2:] == MODEL_ORDER[:7] + ["biLSTM"]
    cell = lambda row, col: [c.strip() for c in row.strip("|").split("|")][2 + head[2:].index(col)]  # noqa: E731
    assert cell(rows[("Fib", "ID")], "NAM-TM") == "95.0 (100.0, 90.0) / 97.4"  # mean (seed 0, seed 1) / paper
    assert cell(rows[("Fib", "OD-hard")], "NAM-TM") == "18.8 (12.5, 25.0) / 71.5"
    assert cell(rows[("Reduce", "OD-hard")], "NAM-TM") == "– / 100.0"
    assert cell(rows[("Fib", "ID")], "TF") == "– / 98.9" and cell(rows[("Fib", "ID")], "biLSTM") == "50.0 / –"
    assert cell(rows[("Parameters", "")], "NAM-TM") == "230K / 23.3M"
    assert "71.5" in out and "mean over seeds" in out
    # without run directories --paper prints the paper's table alone
    assert main(["table", "--paper"]) == 0
    assert "89.7%" in capsys.readouterr().out


def test_paper_table1_matches_the_seed_text():
    seeds = sorted((REPO.parent / "shared" / "seeds").glob("000_*.txt"))
    if not seeds:
        pytest.skip("the paper's text (../shared/seeds/000_*.txt) is not beside the repository")
    text = seeds[0].read_text()
    block = text[text.index("Table 1: Sequence accuracy"):].splitlines()[1:12]
    assert block[0].split()[1:] == ["TF", "LSTM", "UT", "DNC", "LSAM", "NAM-TM", "No", "Jmp"]
    assert block[1].split()[1:] == PAPER_TABLE1["Parameters"]
    task = None
    for line in block[2:]:
        words = line.split()
        if words[0] in ("Palin", "Fib", "Reduce"):
            task, words = words[0], words[1:]
        vals = [float(v.rstrip("%")) for v in words[1:]]
        assert PAPER_TABLE1[(task, words[0])] == vals, (task, words[0])
    assert len(PAPER_TABLE1) == 10


def test_format_table1_vs_paper_pools_seeds_in_seed_order():
    mk = lambda seed, a: {"task": "reduce", "backbone": "dnc", "params": 5, "seed": seed,  # noqa: E731
                          "splits": {"id": {"seq_acc": a}}}
    text = format_table1_vs_paper([mk(1, 0.2), mk(0, 0.1)])
    assert re.search(r"\| Reduce \| ID \|.*\| 15\.0 \(10\.0, 20\.0\) / 100\.0 \|", text)


def test_suite_and_table_share_one_family_grouping():
    """`memnets suite` and `memnets table` print the tables of memnets.cli.table.family_tables."""
    from memnets.cli import suite, table

    mk = lambda task, bb, a: {"task": task, "backbone": bb, "params": 5, "seed": 0,  # noqa: E731
                              "splits": {"id": {"seq_acc": a}}}
    rs = [mk("reduce", "dnc", 0.5), mk("fib", "transformer", 0.25)]
    assert suite.family_tables(rs) == "## Table 1: ours / the paper's\n\n" + format_table1_vs_paper(rs)
    assert suite.family_tables(rs) == table.family_tables(rs, paper=True, headings=True)
    assert table.family_tables(rs) == table.format_table1(rs)  # one family: no heading
    assert table.family_tables(rs, headings=True).startswith("## nsp\n\n| Model |")


def test_gpu_paper_suite_runs_the_paper_scale_presets_in_bf16_on_cuda():
    s = load_suite("gpu-paper")
    runs = suite_runs(s, "runs/x")
    assert len(runs) == 10 and s.seeds == [0]
    tasks = set()
    for r in runs:
        cfg = load_config(r.preset, r.overrides)
        assert (cfg.device, cfg.amp, cfg.checkpoint_every) == ("cuda", "bf16", 500), r.name
        tasks.add((cfg.task.name, cfg.model.backbone))
        if r.preset.startswith("babi/"):
            assert cfg.time_limit_min == 0 and cfg.epochs == 100  # the GPU presets' 7-minute cap lifted
    assert {("fib", "nam_tm"), ("fib", "transformer")} <= tasks
    assert {t for t, _ in tasks} == {"fib", "listops", "text", "babi_seq"}, tasks


def test_suite_sweep_keeps_results_and_rebuilds_the_table_from_them_alone(tmp_path, capsys):
    """A sweep grid names one run per value; each finished run's small files are copied into the
    results folder (no checkpoints); with the run folders gone, the same command trains nothing
    and prints the same table from the results folder alone."""
    suite = _suite(tmp_path, ["cpu/reduce-transformer"], [0], ["epochs=1", *TINY],
                   '[sweep]\n"optim.lr" = [0.001, 0.003]\n')
    s = load_suite(str(suite))
    runs = suite_runs(s, tmp_path / "runs", results_dir=tmp_path / "kept")
    assert [r.name for r in runs] == ["cpu-reduce-transformer-lr0.001-s0", "cpu-reduce-transformer-lr0.003-s0"]
    assert [load_config(r.preset, r.overrides).optim.lr for r in runs] == [0.001, 0.003]
    argv = ["suite", "run", str(suite), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "kept")]
    assert main([*argv, "--jobs", "2"]) == 0
    first = capsys.readouterr().out
    for r in runs:
        kept = sorted(p.name for p in r.results_dir.iterdir())
        assert kept == ["config.json", "env.json", "metrics.jsonl", "results.json", "suite.log"]
        assert json.loads((r.results_dir / "config.json").read_text())["optim"]["lr"] in (0.001, 0.003)
    import shutil

    shutil.rmtree(tmp_path / "runs")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(2 done, 0 to resume, 0 to start)" in out and "starting" not in out
    assert not (tmp_path / "runs").exists()
    assert out.split("## Runs", 1)[1].replace("\n", "") != ""
    for r in runs:  # the same rows as the first time (wall time and figures from the kept files)
        row = next(x for x in first.splitlines() if x.startswith(f"| {r.name} |"))
        assert row in out
    assert main(["table", *map(str, (tmp_path / "kept").iterdir())]) == 0  # `memnets table` reads them
    sweep = out.split("## Sweep", 1)[1]
    row = next(x for x in sweep.splitlines() if x.startswith("| cpu/reduce-transformer | 0 |"))
    assert row.count("(od_easy)") == 2 and row.split("|")[-2].strip() in ("lr0.001", "lr0.003")
    # a run finished in its run folder but missing from the results folder is copied there
    shutil.rmtree(runs[0].results_dir)
    assert main([*argv, "--dry-run"]) == 0 and "1 to start" in capsys.readouterr().out


def test_suite_default_results_folder_and_bad_sweep(tmp_path, capsys):
    suite = _suite(tmp_path, ["cpu/reduce-transformer"], [0], ["epochs=1", *TINY])
    assert main(["suite", "run", str(suite), "--runs-dir", str(tmp_path / "runs")]) == 0
    assert (tmp_path / "results" / "tiny-suite" / "cpu-reduce-transformer-s0" / "results.json").is_file()
    assert not (tmp_path / "results" / "tiny-suite" / "cpu-reduce-transformer-s0" / "checkpoints").exists()
    assert main(["suite", "run", str(suite), "--runs-dir", str(tmp_path / "r2"), "--results-dir", ""]) == 0
    assert "starting" in capsys.readouterr().out  # no results folder: the run is trained again
    bad = tmp_path / "bad.toml"
    for text, msg in (('[sweep]\n"optim.lr" = []\n', "sweep.optim.lr"), ('sweep = 3\n', "`sweep` expected"),
                      ('[sweep]\n"optim.lr" = [0.1, 0.1]\n', "repeats")):
        bad.write_text('presets = ["cpu/fib-nam_tm"]\n' + text)
        with pytest.raises(ConfigError, match=msg):
            load_suite(str(bad))


def test_suite_only_runs_the_matching_runs(tmp_path, capsys):
    suite = _suite(tmp_path, ["cpu/reduce-transformer", "cpu/palindrome-transformer"], [0], ["epochs=1", *TINY])
    argv = ["suite", "run", str(suite), "--runs-dir", str(tmp_path / "runs")]
    assert main([*argv, "--only", "*-reduce-*"]) == 0
    assert "1 not done selected by --only (0 done, 0 to resume, 1 to start)" in capsys.readouterr().out
    assert (tmp_path / "runs" / "cpu-reduce-transformer-s0" / "results.json").is_file()
    assert not (tmp_path / "runs" / "cpu-palindrome-transformer-s0").exists()
    assert main([*argv, "--only", "*-reduce-*", "--dry-run"]) == 0
    assert "(1 done, 0 to resume, 0 to start)" in capsys.readouterr().out
    assert main([*argv, "--only", "nothing-*"]) == 2
    assert "matches no run" in capsys.readouterr().err


def test_sweep_choice_counts_differences_within_sampling_noise_as_ties():
    """One sequence of 512 (0.2 against 0.0%) decides nothing: the tie goes to ID, then to the
    selection loss; a clear difference still decides."""
    from memnets.cli.suite import choose_point, within_noise

    def pt(label, sel, idv, loss, n=512):
        return {"label": label, "sel": (sel, n), "id": (idv, n), "loss": loss}

    assert within_noise(0.002, 512, 0.0, 512) and within_noise(0.006, 512, 0.0, 512)
    assert not within_noise(0.992, 512, 0.926, 512) and not within_noise(1.0, 512, 0.979, 512)
    assert within_noise(0.5, None, 0.5, None) and not within_noise(0.5, None, 0.51, None)
    # Fib TF's sweep: OD-easy 0.0 / 0.2 / 0.0%, ID 1.4 / 1.4 / 80.9%: the rate that learned ID
    assert choose_point([pt("a", 0.0, 0.014, 0.9), pt("b", 0.002, 0.014, 1.1), pt("c", 0.0, 0.809, 2.4)]) == "c"
    # all tied on both: the lowest selection loss
    assert choose_point([pt("a", 0.0, 1.0, 2.0), pt("b", 0.0, 1.0, 2.2), pt("c", 0.006, 1.0, 2.7)]) == "a"
    # a clear winner on the selection split whatever its ID and loss
    assert choose_point([pt("a", 0.781, 1.0, 0.04), pt("b", 0.926, 1.0, 0.01), pt("c", 0.992, 0.9, 0.5)]) == "c"
    assert choose_point([]) is None


def test_a_sweep_on_several_seeds_chooses_over_them_pooled(tmp_path, capsys):
    """Several seeds in a sweep: each seed's row, and a pooled row whose points are the seeds'
    mean over their pooled evaluations, whose choice is the preset's. Fib DNC's figures (OD-easy
    at 3e-3 and 1e-2 on seeds 0, 3, 4): seed 0 alone chooses 1e-2, the three pooled 3e-3."""
    from memnets.cli.suite import choose_point, pool_points

    def pt(label, sel, idv, loss, n=512):
        return {"label": label, "sel": (sel, n), "id": (idv, n), "loss": loss}

    a = [pt("lr0.003", 0.045, 0.268, 0.9), pt("lr0.003", 0.832, 0.998, 0.3), pt("lr0.003", 0.834, 0.994, 0.3)]
    b = [pt("lr0.01", 0.289, 0.486, 0.6), pt("lr0.01", 0.260, 0.426, 0.6), pt("lr0.01", 0.238, 0.387, 0.6)]
    assert choose_point([a[0], b[0]]) == "lr0.01"
    pa, pb = pool_points(a), pool_points(b)
    assert pa["sel"] == (pytest.approx(0.5703, abs=1e-4), 1536) and pa["loss"] == pytest.approx(0.5)
    assert choose_point([pa, pb]) == "lr0.003"
    assert pool_points([pt("x", 0.5, 0.5, 1.0, n=None), pt("x", 0.7, 0.5, 1.0)])["sel"] == (pytest.approx(0.6), None)

    suite = _suite(tmp_path, ["cpu/reduce-transformer"], [0, 1], ["epochs=1", *TINY],
                   '[sweep]\n"optim.lr" = [0.001, 0.003]\n')
    argv = ["suite", "run", str(suite), "--runs-dir", str(tmp_path / "runs"), "--results-dir", ""]
    assert main([*argv, "--jobs", "2", "--only", "*-s0"]) == 0
    sweep = capsys.readouterr().out.split("## Sweep", 1)[1].splitlines()
    pooled = next(x for x in sweep if x.startswith("| cpu/reduce-transformer | 0, 1 pooled |"))
    assert [c.strip() for c in pooled.split("|")[3:5]] == ["–", "–"]  # seed 1 not yet run
    assert main([*argv, "--jobs", "2"]) == 0
    sweep = capsys.readouterr().out.split("## Sweep", 1)[1].splitlines()
    rows = [x for x in sweep if x.startswith("| cpu/reduce-transformer |")]
    assert [r.split("|")[2].strip() for r in rows] == ["0", "1", "0, 1 pooled"]
    figs = [[float(c.split()[0].rstrip("%")) for c in r.split("|")[3:5]] for r in rows]
    assert figs[2] == [pytest.approx((figs[0][k] + figs[1][k]) / 2, abs=0.11) for k in range(2)]
    assert rows[2].split("|")[-2].strip() in ("lr0.001", "lr0.003")


def test_suite_skips_a_run_another_process_holds_or_finished(tmp_path, capsys):
    """Two suites may share a runs folder (e.g. one per core, each with its own --only): a run
    that another live process holds, or that finished after this suite listed it, is skipped
    rather than started again (its lock would refuse the second owner)."""
    suite = _suite(tmp_path, ["cpu/reduce-lstm_attention", "cpu/reduce-transformer"], [0], ["epochs=1", *TINY])
    runs = tmp_path / "runs"
    held = runs / "cpu-reduce-lstm_attention-s0"
    held.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (held / "lock").write_text(str(sleeper.pid))
        assert main(["suite", "run", str(suite), "--runs-dir", str(runs), "--results-dir", "", "--dry-run"]) == 0
        assert f"(running now, process {sleeper.pid})" in capsys.readouterr().out
        assert main(["suite", "run", str(suite), "--runs-dir", str(runs), "--results-dir", ""]) == 0
    finally:
        sleeper.kill()
        sleeper.wait()
    out = capsys.readouterr().out
    assert f"cpu-reduce-lstm_attention-s0: running in process {sleeper.pid}; skipped here" in out
    assert not (held / "results.json").exists() and (runs / "cpu-reduce-transformer-s0" / "results.json").is_file()
    # the holder is gone: its lock is stale, and the next invocation trains the run
    assert main(["suite", "run", str(suite), "--runs-dir", str(runs), "--results-dir", ""]) == 0
    assert (held / "results.json").is_file()


def test_sweep_for_gives_a_preset_its_own_grid(tmp_path, capsys):
    """``sweep_for`` replaces the suite's grid for one preset (e.g. one step past the edge its
    choice fell on); the sweep table has a column per point of any grid, blank outside a grid."""
    suite = _suite(tmp_path, ["cpu/reduce-transformer", "cpu/palindrome-transformer"], [0], ["epochs=1", *TINY],
                   '[sweep]\n"optim.lr" = [0.001, 0.003]\n'
                   '[sweep_for."cpu/palindrome-transformer"]\n"optim.lr" = [0.0003, 0.001, 0.003, 0.01]\n')
    s = load_suite(str(suite))
    assert s.sweep_of("cpu/reduce-transformer") == {"optim.lr": [0.001, 0.003]}
    runs = suite_runs(s, tmp_path / "runs")
    assert [r.name for r in runs] == ["cpu-reduce-transformer-lr0.001-s0", "cpu-reduce-transformer-lr0.003-s0",
                                      "cpu-palindrome-transformer-lr0.0003-s0", "cpu-palindrome-transformer-lr0.001-s0",
                                      "cpu-palindrome-transformer-lr0.003-s0", "cpu-palindrome-transformer-lr0.01-s0"]
    assert load_config(runs[-1].preset, runs[-1].overrides).optim.lr == 0.01
    assert main(["suite", "run", str(suite), "--runs-dir", str(tmp_path / "runs"), "--jobs", "2",
                 "--only", "*-reduce-*", "--only", "*-lr0.01-*"]) == 0
    sweep = capsys.readouterr().out.split("## Sweep", 1)[1].splitlines()
    assert sweep[2] == "| preset | seed | lr0.0003 | lr0.001 | lr0.003 | lr0.01 | chosen |"  # in value order
    red = next(x for x in sweep if x.startswith("| cpu/reduce-transformer |")).split("|")[3:-1]
    pal = next(x for x in sweep if x.startswith("| cpu/palindrome-transformer |")).split("|")[3:-1]
    assert red[0].strip() == red[3].strip() == ""  # not in its grid
    assert "(od_easy)" in red[1] and "(od_easy)" in red[2] and red[4].strip() in ("lr0.001", "lr0.003")
    assert [c.strip() for c in pal[:3]] == ["–", "–", "–"] and "(od_easy)" in pal[3]  # not yet run
    assert pal[4].strip() == "(lr0.01 so far)"
    bad = tmp_path / "bad.toml"
    for text, msg in (('[sweep_for."cpu/fib-dnc"]\n"optim.lr" = [0.1]\n', "not in `presets`"),
                      ('[sweep_for."cpu/fib-nam_tm"]\n"optim.lr" = []\n', "sweep_for.'cpu/fib-nam_tm'.optim.lr"),
                      ('sweep_for = 3\n', "`sweep_for` expected")):
        bad.write_text('presets = ["cpu/fib-nam_tm"]\n' + text)
        with pytest.raises(ConfigError, match=re.escape(msg)):
            load_suite(str(bad))


def test_suite_finds_runs_made_with_another_config_stale(tmp_path, capsys):
    """A kept result stands for its preset only while the preset still gives its config: after
    the suite's overrides change, the run is stale, out of the tables, named with the key that
    differs; the suite refuses to go on until --rerun-stale, which trains it afresh."""
    from memnets.cli.suite import stale_keys

    runs = tmp_path / "runs"
    suite = _suite(tmp_path, ["cpu/reduce-transformer"], [0], ["epochs=1", *TINY])
    argv = ["suite", "run", str(suite), "--runs-dir", str(runs)]
    assert main(argv) == 0
    capsys.readouterr()
    (r,) = suite_runs(load_suite(str(suite)), runs, results_dir=tmp_path / "results" / "tiny-suite")
    assert stale_keys(r, load_config(r.preset, r.overrides)) == []
    assert stale_keys(r, load_config(r.preset, [*r.overrides, "threads=3", "time_limit_min=9"])) == []  # free keys
    suite = _suite(tmp_path, ["cpu/reduce-transformer"], [0], ["epochs=1", *TINY, "optim.lr=0.002"])
    assert stale_keys(r, load_config(r.preset, [*r.overrides, "optim.lr=0.002"])) == ["optim.lr: 0.001 -> 0.002"]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(0 done, 0 to resume, 0 to start, 1 stale to run again)" in out
    assert "stale (made with optim.lr: 0.001 -> 0.002)" in out
    assert "| cpu-reduce-transformer-s0 | stale |" in out and "## Table 1" not in out  # out of the tables
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "another config than their preset gives now" in err and "--rerun-stale" in err
    assert main([*argv, "--rerun-stale"]) == 0
    assert "cpu-reduce-transformer-s0: starting" in capsys.readouterr().out
    assert (runs / "cpu-reduce-transformer-s0.stale" / "results.json").is_file()  # set aside, not deleted
    kept = tmp_path / "results" / "tiny-suite" / "cpu-reduce-transformer-s0" / "config.json"
    assert json.loads(kept.read_text())["optim"]["lr"] == 0.002
    assert main([*argv, "--dry-run"]) == 0 and "(1 done, 0 to resume, 0 to start)" in capsys.readouterr().out


def test_a_run_whose_preset_trains_longer_is_trained_on_not_stale(tmp_path, capsys):
    """A preset that now only trains for more epochs leaves its finished runs to train on from
    their checkpoints (``--resume`` with the larger budget), not stale; the kept results are then
    the longer run's, equal to a run of the larger budget from the start. A lowered budget, or a
    longer one without the run folder's checkpoint, is stale."""
    from memnets.cli.suite import budget_grows, stale_keys

    runs, results = tmp_path / "runs", tmp_path / "results" / "tiny-suite"
    suite = _suite(tmp_path, ["cpu/reduce-transformer"], [0], ["epochs=1", *TINY])
    argv = ["suite", "run", str(suite), "--runs-dir", str(runs)]
    assert main(argv) == 0
    capsys.readouterr()
    suite = _suite(tmp_path, ["cpu/reduce-transformer"], [0], ["epochs=2", *TINY])
    (r,) = suite_runs(load_suite(str(suite)), runs, results_dir=results)
    cfg = load_config(r.preset, r.overrides)
    assert budget_grows(r, cfg) == stale_keys(r, cfg) == ["epochs: 1 -> 2"]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(0 done, 1 to resume, 0 to start)" in out and "stale" not in out
    assert "resume from step 4 (the budget grew: epochs: 1 -> 2)" in out
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "cpu-reduce-transformer-s0: resuming from step 4 (the budget grew: epochs: 1 -> 2)" in out
    assert "Table 1" in out  # the run trained on is in the tables
    kept = json.loads((results / "cpu-reduce-transformer-s0" / "results.json").read_text())
    assert json.loads((results / "cpu-reduce-transformer-s0" / "config.json").read_text())["epochs"] == 2
    assert main([*argv, "--dry-run"]) == 0 and "(1 done, 0 to resume, 0 to start)" in capsys.readouterr().out
    assert not (runs / "cpu-reduce-transformer-s0.stale").exists()
    # the same as two epochs from the start
    assert main(["train", r.preset, *r.overrides, "--run-dir", str(tmp_path / "fresh"), "--quiet"]) == 0
    capsys.readouterr()
    fresh = json.loads((tmp_path / "fresh" / "results.json").read_text())
    assert kept["splits"] == fresh["splits"] and kept["best_epoch"] == fresh["best_epoch"]
    # shorter: stale; longer but only the kept results (no checkpoint): stale
    (r,) = suite_runs(load_suite(str(_suite(tmp_path, ["cpu/reduce-transformer"], [0], ["epochs=1", *TINY]))),
                      runs, results_dir=results)
    assert budget_grows(r, load_config(r.preset, r.overrides)) == [] and stale_keys(r, load_config(
        r.preset, r.overrides)) == ["epochs: 2 -> 1"]
    (r,) = suite_runs(load_suite(str(_suite(tmp_path, ["cpu/reduce-transformer"], [0], ["epochs=3", *TINY]))),
                      tmp_path / "elsewhere", results_dir=results)
    assert budget_grows(r, load_config(r.preset, r.overrides)) == [] and stale_keys(r, load_config(
        r.preset, r.overrides)) == ["epochs: 2 -> 3"]


def test_kept_table1_results_match_the_shipped_presets():
    """Every run kept in results/ for the Table 1 suites was made with the config its preset
    gives now: a preset changed without its cells trained again fails here (and the suite would
    call those runs stale)."""
    from memnets.cli.suite import finished_dir, stale_keys

    for name in ("table1-cpu", "table1-lr-sweep"):
        suite = load_suite(name)
        kept = 0
        for r in suite_runs(suite, REPO / "runs" / name, results_dir=REPO / "results" / name):
            r.run_dir = REPO / "no-such-run-folder"  # the kept results alone, as on a fresh clone
            if finished_dir(r) is None:
                continue
            kept += 1
            assert stale_keys(r, load_config(r.preset, r.overrides)) == [], r.name
        assert kept >= (48 if name == "table1-cpu" else 45), name


def test_kept_table1_cells_have_their_held_out_scores():
    """Every kept cell of table1-cpu has its selected model's scores on independently drawn
    splits (`memnets eval --draw 1 --eval-size 2048 --save`), which `memnets table --eval`
    reads; each within a few points of the reported figure (a selection on 512 sequences)."""
    from memnets.cli.table import load_results, with_evaluation

    dirs = sorted((REPO / "results" / "table1-cpu").glob("cpu-*"))
    results = load_results(dirs)
    held = with_evaluation(results, "eval-heldout.json")
    assert len(held) == len(results) >= 48
    for r, h in zip(results, held):
        assert h["evaluated"] == {"checkpoint": "best", "draw": 1, "eval_size": 2048}, r["run_dir"]
        for split in ("id", "od_easy", "od_hard"):
            assert h["splits"][split]["n"] == 2048
            assert abs(h["splits"][split]["seq_acc"] - r["splits"][split]["seq_acc"]) < 0.08, (r["run_dir"], split)
        saved = json.loads((Path(r["run_dir"]) / "eval-heldout.json").read_text())
        assert Path(saved["run_dir"]).name == Path(r["run_dir"]).name
