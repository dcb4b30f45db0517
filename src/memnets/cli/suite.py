"""``memnets suite run|ls``: train a suite of presets × seeds, then print each task family's table.

A suite is a TOML file, shipped under ``configs/suites/<name>.toml`` (looked up by name like
presets) or given as a path::

    description = "Table 1 at CPU scale"
    presets = ["cpu/fib-transformer", "cpu/fib-nam_tm"]   # preset names or .toml paths
    seeds = [0, 1]                                        # every preset, unless seeds_for says
    overrides = ["threads=1"]                             # optional, applied to every run
    [seeds_for]                                           # optional, per-preset seeds
    "cpu/fib-transformer" = [0]
    [overrides_for]                                       # optional, per-preset overrides
    "cpu/fib-nam_tm" = ["time_limit_min=15"]              # (after `overrides`, so they win)

    [sweep]                                               # optional: a grid of overrides
    "optim.lr" = [3e-4, 1e-3, 3e-3]                       # every run once per value
    [sweep_for."cpu/fib-transformer"]                     # optional, per-preset grids
    "optim.lr" = [3e-4, 1e-3, 3e-3, 1e-2]                 # (replace `sweep` for that preset)

Each run goes to ``<runs-dir>/<preset with / as ->[-<key><value>...]-s<seed>`` (default runs
dir: ``runs/<suite name>``); a ``sweep`` adds one run per point of its grid, named by the last
part of each key and its value (``cpu-fib-dnc-lr0.001-s0``); ``sweep_for`` gives a preset its own
grid (e.g. a rate grid extended past the edge its choice fell on).

**A finished run stands for its preset only while the preset still gives its config.** A run
whose folder (results or run folder) holds a ``config.json`` that differs from what its preset
and overrides give now, in any key that changes what is computed (``config_diff``: not
``threads``, ``time_limit_min``, ...), is *stale*: it is left out of the tables, ``--dry-run``
names the keys that differ, and ``run`` refuses to go on until ``--rerun-stale`` says to train it
again (its run folder is then moved to ``<run name>.stale`` and its kept results removed). A run
whose preset now only trains longer (a larger ``epochs`` or ``max_steps``, not under the cosine
schedule) and whose run folder holds its checkpoint is not stale: ``run`` trains it on with
``--resume``, exactly as a run started with the larger budget goes (:func:`budget_grows`).

**Results that outlive the machine.** Each finished run's ``results.json``, ``config.json``,
``env.json``, ``metrics.jsonl`` and ``suite.log`` (not its checkpoints) are copied into
``<results-dir>/<run name>/`` (default ``results/<suite name>``; ``--results-dir ''`` turns
it off), a folder small enough to keep under version control. A run found finished there or
in its run folder is skipped, so a suite of many hours carries on from the committed results
on another machine, and the tables are built from them (``memnets table results/<suite>/*``
and ``memnets report`` read those folders too). Any other run is
started with ``memnets train ... --resume``, so one with a checkpoint continues where it
stopped and an empty one starts afresh. Runs are subprocesses (``--jobs`` at a time, each
``threads=1`` unless overridden) that die with the suite, so after Ctrl-C or a SIGKILL of the
suite the same command carries on. At the end the suite prints each run's parameter count,
wall time and figures, then one table per task family: Table 1 beside the paper's for the
algorithmic tasks (``memnets table --paper`` over the run folders), the family's own table
(``memnets table``: :meth:`memnets.train.task.Task.format_table`) for the others.
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["add_parser", "Suite", "SuiteRun", "load_suite", "list_suites", "suite_runs", "run_status", "run_name",
           "runs_table", "family_tables", "sweep_table", "archive_run", "finished_dir", "choose_point",
           "within_noise", "stale_keys", "budget_grows"]

SUITE_KEYS = ("description", "presets", "seeds", "overrides", "seeds_for", "overrides_for", "sweep", "sweep_for")
ARCHIVED = ("results.json", "config.json", "env.json", "metrics.jsonl", "suite.log")

EPILOG = """examples:
  memnets suite ls
  memnets suite run table1-cpu --dry-run
  memnets suite run table1-cpu --jobs 2 --runs-dir runs/table1-cpu
  memnets suite run table1-cpu --seeds 0 epochs=5 time_limit_min=3     # overrides go to every run
  memnets suite run my_suite.toml --out table1.md
Interrupted (Ctrl-C, SIGKILL)? Run the same command again: finished runs are skipped,
started ones resume from their last checkpoint."""


@dataclass
class Suite:
    """A parsed suite file."""

    name: str
    path: Path
    presets: list[str]
    seeds: list[int]
    description: str = ""
    overrides: list[str] = field(default_factory=list)
    seeds_for: dict[str, list[int]] = field(default_factory=dict)
    overrides_for: dict[str, list[str]] = field(default_factory=dict)
    sweep: dict[str, list] = field(default_factory=dict)
    sweep_for: dict[str, dict[str, list]] = field(default_factory=dict)

    def sweep_of(self, preset: str) -> dict[str, list]:
        """The grid of ``preset``: its ``sweep_for`` entry, else the suite's ``sweep``."""
        return self.sweep_for.get(preset, self.sweep)

    @property
    def has_sweep(self) -> bool:
        return bool(self.sweep or any(self.sweep_for.values()))


@dataclass
class SuiteRun:
    """One preset × seed of a suite."""

    preset: str
    seed: int
    name: str
    run_dir: Path
    overrides: list[str]
    results_dir: Path | None = None
    # the keys (``"key: old -> new"``) in which the config found in the run's folder differs from
    # what its preset gives now (:func:`stale_keys`); a stale run counts as not finished
    stale: list[str] = field(default_factory=list)
    # the budget keys (``"epochs: 60 -> 120"``) of a run that its preset now trains for longer and
    # whose checkpoint trains on to it (:func:`budget_grows`); such a run counts as not finished
    grows: list[str] = field(default_factory=list)

    def argv(self) -> list[str]:
        """The ``memnets train`` arguments of this run."""
        return ["train", self.preset, *self.overrides, "--run-dir", str(self.run_dir), "--quiet", "--resume"]


def _suite_root() -> Path:
    from importlib import resources

    return Path(str(resources.files("memnets") / "configs" / "suites"))


def list_suites() -> list[str]:
    """Names of the shipped suites (``configs/suites/<name>.toml``)."""
    root = _suite_root()
    return sorted(p.stem for p in root.glob("*.toml")) if root.is_dir() else []


def load_suite(source: str | Path) -> Suite:
    """A shipped suite by name, or a suite TOML file by path; ConfigError on a bad file."""
    from ..train.config import ConfigError, tomllib

    path = Path(source)
    if not (path.suffix == ".toml" and path.is_file()):
        path = _suite_root() / f"{source}.toml"
        if not path.is_file():
            close = difflib.get_close_matches(str(source), list_suites(), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"no suite or file named {str(source)!r}{hint} (see `memnets suite ls`)")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from e
    for k in data:
        if k not in SUITE_KEYS:
            close = difflib.get_close_matches(k, SUITE_KEYS, n=1)
            raise ConfigError(f"{path}: unknown suite key `{k}`" + (f"; did you mean `{close[0]}`?" if close else "")
                              + f" (keys: {', '.join(SUITE_KEYS)})")
    presets, seeds = data.get("presets"), data.get("seeds", [0])
    if not presets or not isinstance(presets, list) or not all(isinstance(p, str) for p in presets):
        raise ConfigError(f"{path}: `presets` expected a non-empty list of preset names, got {presets!r}")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(f"{path}: `seeds` expected a non-empty list of integers, got {seeds!r}")
    overrides = data.get("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"{path}: `overrides` expected a list of \"key=value\" strings, got {overrides!r}")
    seeds_for = data.get("seeds_for", {})
    for k, v in seeds_for.items():
        if k not in presets:
            raise ConfigError(f"{path}: `seeds_for` names {k!r}, which is not in `presets`")
        if not isinstance(v, list) or not v or not all(isinstance(s, int) for s in v):
            raise ConfigError(f"{path}: `seeds_for.{k}` expected a non-empty list of integers, got {v!r}")
    overrides_for = data.get("overrides_for", {})
    for k, v in overrides_for.items():
        if k not in presets:
            raise ConfigError(f"{path}: `overrides_for` names {k!r}, which is not in `presets`")
        if not isinstance(v, list) or not all(isinstance(o, str) for o in v):
            raise ConfigError(f"{path}: `overrides_for.{k}` expected a list of \"key=value\" strings, got {v!r}")
    sweep = _check_sweep(path, "sweep", data.get("sweep", {}))
    sweep_for = data.get("sweep_for", {})
    if not isinstance(sweep_for, dict):
        raise ConfigError(f"{path}: `sweep_for` expected a table of preset = {{key = [values]}}, got {sweep_for!r}")
    for k, v in sweep_for.items():
        if k not in presets:
            raise ConfigError(f"{path}: `sweep_for` names {k!r}, which is not in `presets`")
        _check_sweep(path, f"sweep_for.{k!r}", v)
    return Suite(name=path.stem, path=path, presets=list(presets), seeds=list(seeds),
                 description=str(data.get("description", "")), overrides=list(overrides), seeds_for=dict(seeds_for),
                 overrides_for={k: list(v) for k, v in overrides_for.items()},
                 sweep={k: list(v) for k, v in sweep.items()},
                 sweep_for={p: {k: list(v) for k, v in g.items()} for p, g in sweep_for.items()})


def _check_sweep(path: Path, where: str, sweep) -> dict:
    """``sweep`` (a grid ``key = [values]``) checked; ConfigError naming ``where`` otherwise."""
    from ..train.config import ConfigError

    if not isinstance(sweep, dict):
        raise ConfigError(f"{path}: `{where}` expected a table of key = [values], got {sweep!r}")
    for k, v in sweep.items():
        if not isinstance(v, list) or not v or not all(isinstance(x, (int, float, str, bool)) for x in v):
            raise ConfigError(f"{path}: `{where}.{k}` expected a non-empty list of values, got {v!r}")
        if len({_fmt_value(x) for x in v}) != len(v):
            raise ConfigError(f"{path}: `{where}.{k}` repeats a value: {v!r}")
    return sweep


def _fmt_value(v) -> str:
    """A sweep value as it appears in an override and a run name (``0.001``, ``3e-05``, ``true``)."""
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:g}" if isinstance(v, float) else str(v)


def _sweep_points(sweep: dict[str, list]) -> list[tuple[str, list[str]]]:
    """``(name suffix, overrides)`` for each point of the grid (one point, no suffix, when empty)."""
    import itertools

    keys = list(sweep)
    out = []
    for values in itertools.product(*(sweep[k] for k in keys)):
        suffix = "".join(f"-{k.rsplit('.', 1)[-1]}{_fmt_value(v)}" for k, v in zip(keys, values))
        out.append((suffix, [f"{k}={_fmt_value(v)}" for k, v in zip(keys, values)]))
    return out or [("", [])]


def run_name(preset: str, seed: int, variant: str = "") -> str:
    """The folder name of ``preset`` (a name or a .toml path) at ``seed``: ``cpu-fib-dnc-s0``;
    ``variant`` is a sweep point's suffix (``-lr0.001``)."""
    base = Path(preset).stem if preset.endswith(".toml") else preset.replace("/", "-")
    return f"{base}{variant}-s{seed}"


def suite_runs(suite: Suite, runs_dir: str | Path, *, seeds: list[int] | None = None,
               overrides: list[str] | None = None, threads: int | None = 1,
               results_dir: str | Path | None = None) -> list[SuiteRun]:
    """The runs of ``suite`` in order (preset-major, then sweep point, then seed). ``seeds``
    replaces every preset's seeds; a sweep point's overrides come after the suite's own and its
    per-preset ``overrides_for``, and ``overrides`` after them all (so they win); ``threads``
    (unless None) is set first, so an override ``threads=N`` wins over it. With ``results_dir``
    each run also has its archive folder ``<results_dir>/<run name>``."""
    out = []
    for p in suite.presets:
        for suffix, point in _sweep_points(suite.sweep_of(p)):
            for s in (seeds if seeds is not None else suite.seeds_for.get(p, suite.seeds)):
                ov = ([f"threads={threads}"] if threads is not None else []) + [f"seed={s}"] \
                    + suite.overrides + suite.overrides_for.get(p, []) + point + list(overrides or [])
                name = run_name(p, s, suffix)
                out.append(SuiteRun(p, s, name, Path(runs_dir) / name, ov,
                                    Path(results_dir) / name if results_dir else None))
    return out


def archive_run(run: SuiteRun) -> bool:
    """Copy a finished run's small files (:data:`ARCHIVED`, no checkpoints) into its results
    folder, atomically (a temporary folder renamed into place); False when there is nothing to
    copy (no results folder, or the run is not finished in its run folder)."""
    import shutil
    import tempfile

    if run.results_dir is None or not (run.run_dir / "results.json").is_file():
        return False
    run.results_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{run.name}.", dir=run.results_dir.parent))
    try:
        for f in ARCHIVED:
            if (run.run_dir / f).is_file():
                shutil.copyfile(run.run_dir / f, tmp / f)
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        if run.results_dir.exists():
            shutil.rmtree(run.results_dir)
        tmp.rename(run.results_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return True


def finished_dir(run: SuiteRun) -> Path | None:
    """Where the run's results are: its results folder if it holds them, else its run folder if
    that does, else None (also for a stale run, and for one whose budget grew)."""
    if run.stale or run.grows:
        return None
    for d in (run.results_dir, run.run_dir):
        if d is not None and (d / "results.json").is_file():
            return d
    return None


def _diff_keys(diff: dict) -> list[str]:
    """A :func:`~memnets.train.loop.config_diff` as ``"key: old -> new"`` lines."""
    return [f"{k}: {json.dumps(a)} -> {json.dumps(b)}" for k, (a, b) in diff.items()]


def stale_keys(run: SuiteRun, cfg) -> list[str]:
    """How the config kept with ``run`` (the ``config.json`` of its results folder when that holds
    its results, else of its run folder) differs from ``cfg``, what its preset gives now: one
    ``"key: old -> new"`` per key of :func:`~memnets.train.loop.config_diff`; empty when they agree
    or nothing was kept. A ``config.json`` that cannot be read counts as differing."""
    from ..train.config import config_from_dict
    from ..train.loop import config_diff

    folders = [d for d in (run.results_dir, run.run_dir) if d is not None]
    found = next((d for d in folders if (d / "results.json").is_file()), None) \
        or next((d for d in folders if (d / "config.json").is_file()), None)
    if found is None:
        return []
    try:
        old = config_from_dict(json.loads((found / "config.json").read_text()))
    except (OSError, ValueError, TypeError, AttributeError) as e:
        return [f"{found / 'config.json'} unreadable ({e})"]
    return _diff_keys(config_diff(old, cfg))


def budget_grows(run: SuiteRun, cfg) -> list[str]:
    """The keys of :func:`stale_keys` when they are only a larger budget (``epochs``,
    ``max_steps``; :func:`~memnets.train.loop.resume_diff`) and the run folder holds a
    checkpoint of the shorter run: ``memnets train --resume`` then trains that run on exactly as
    a run started with the larger budget goes, so the run is continued rather than stale. Empty
    otherwise (a lowered budget, another key, or kept results without a checkpoint)."""
    from ..train.config import ConfigError, config_from_dict
    from ..train.loop import config_diff, resume_diff

    if not (run.run_dir / "checkpoints" / "last.json").is_file():
        return []
    try:
        old = config_from_dict(json.loads((run.run_dir / "config.json").read_text()))
        if resume_diff(old, cfg):
            return []
    except (OSError, ValueError, TypeError, AttributeError, ConfigError):
        return []
    return _diff_keys(config_diff(old, cfg))


def run_status(run_dir: str | Path | SuiteRun) -> str:
    """``done`` (results.json, in the run folder or, for a :class:`SuiteRun`, in its results
    folder), ``stale`` (a :class:`SuiteRun` made with another config, :func:`stale_keys`),
    ``resume`` (a checkpoint, no results; or a :class:`SuiteRun` whose budget grew,
    :func:`budget_grows`) or ``new``."""
    if isinstance(run_dir, SuiteRun):
        if run_dir.stale:
            return "stale"
        if run_dir.grows:
            return "resume"
        if finished_dir(run_dir) is not None:
            return "done"
        run_dir = run_dir.run_dir
    d = Path(run_dir)
    if (d / "results.json").is_file():
        return "done"
    if (d / "checkpoints" / "last.json").is_file():
        return "resume"
    return "new"


def _set_aside(run: SuiteRun) -> None:
    """Make room to train a stale run again: its run folder moved to ``<run name>.stale``
    (replacing an older one), its kept results removed; the run is then new."""
    import shutil

    if run.run_dir.exists():
        old = run.run_dir.with_name(run.run_dir.name + ".stale")
        if old.exists():
            shutil.rmtree(old)
        run.run_dir.rename(old)
    if run.results_dir is not None and run.results_dir.exists():
        shutil.rmtree(run.results_dir)
    run.stale = []


def _checkpoint_step(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / "checkpoints" / "last.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def add_parser(sub) -> None:
    p = sub.add_parser("suite", help="train a suite of presets x seeds and print each family's table "
                       "(Table 1 beside the paper's)", description=__doc__, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ss = p.add_subparsers(dest="suite_cmd", metavar="ACTION")
    ls = ss.add_parser("ls", aliases=["list"], help="list the shipped suites")
    ls.set_defaults(func=_ls)
    r = ss.add_parser("run", help="run (or continue) a suite, then print its tables", epilog=EPILOG,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("suite", help="suite name (see `memnets suite ls`) or path to a suite .toml")
    r.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides passed to every run")
    r.add_argument("--jobs", "-j", type=int, default=1, help="runs at a time, as subprocesses (default 1)")
    r.add_argument("--runs-dir", default=None, help="folder of the run folders (default runs/<suite name>)")
    r.add_argument("--seeds", default=None, help="comma-separated seeds replacing the suite's, e.g. 0,1")
    r.add_argument("--threads", type=int, default=1,
                   help="torch threads per run (default 1; 0: torch's default; an override threads=N wins)")
    r.add_argument("--results-dir", default=None,
                   help="folder that keeps each finished run's results, config and metrics (no checkpoints), "
                        "e.g. under version control; a run found there is done (default results/<suite name>; "
                        "'' for none)")
    r.add_argument("--only", action="append", default=None, metavar="GLOB",
                   help="run only the runs whose name matches this shell pattern (repeatable), e.g. "
                        "'*-nam_tm-*'; the tables still show every run of the suite")
    r.add_argument("--dry-run", action="store_true", help="print each run's status and command; train nothing")
    r.add_argument("--rerun-stale", action="store_true",
                   help="train again the runs made with another config than their preset gives now (moving "
                        "their run folder to <run>.stale and removing their kept results); without it such "
                        "runs stop the suite. A run whose preset only trains longer now is trained on from its "
                        "checkpoint, not stale")
    r.add_argument("--metric", default=None, choices=("seq_acc", "tok_acc", "ans_acc"),
                   help="algorithmic tasks: the accuracy shown (default: sequence accuracy, the paper's); "
                        "the other families show their main metric")
    r.add_argument("--out", default=None, help="also write the final tables (Markdown) to this file")
    r.add_argument("--curves", default=None, metavar="PNG",
                   help="also plot the learning curves of the finished runs (those --only selects, else all) "
                        "into this image: training loss and each split's accuracy against the optimiser step")
    r.set_defaults(func=_run)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _ls(args) -> int:
    from ..train.config import ConfigError

    names = list_suites()
    width = max((len(n) for n in names), default=0)
    for n in names:
        try:
            s = load_suite(n)
            n_runs = sum(len(s.seeds_for.get(p, s.seeds)) for p in s.presets)
            print(f"{n.ljust(width)}  {n_runs} runs  {s.description}")
        except ConfigError as e:
            print(f"{n.ljust(width)}  (malformed: {e})")
    return 0


def _parse_seeds(text: str | None) -> list[int] | None:
    from .main import UsageError

    if text is None:
        return None
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--seeds expected comma-separated integers such as 0,1, got {text!r}") from None
    if not seeds:
        raise UsageError("--seeds expected at least one seed")
    return seeds


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child
    """Linux: the child gets SIGKILL when the suite dies, so no orphan keeps training (its run
    lock is then stale and the next suite takes it over)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start(run: SuiteRun) -> tuple[subprocess.Popen, object]:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run.run_dir / "suite.log", "a")
    log.write(f"$ memnets {' '.join(run.argv())}\n")
    log.flush()
    cmd = [sys.executable, "-m", "memnets.cli.main", *run.argv()]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=_set_pdeathsig if sys.platform.startswith("linux") else None)
    return proc, log


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [x for x in path.read_text().splitlines() if x.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _fmt_wall(s: float) -> str:
    return f"{s:.1f}s" if s < 10 else f"{s:.0f}s" if s < 120 else f"{s / 60:.1f}min"


_FRACTIONS = ("seq_acc", "tok_acc", "ans_acc", "accuracy", "acc")


def _metric_of(res: dict, metric: str | None) -> str:
    """The metric shown for a run: ``--metric`` for the algorithmic tasks (default ``seq_acc``),
    the run's own main metric (``results.json`` ``metric``) for the other families."""
    return str(res.get("metric") or metric or "seq_acc")


def _value(metric: str, v) -> str:
    if not isinstance(v, (int, float)):
        return "–"
    return f"{100 * v:.1f}" if metric in _FRACTIONS else f"{v:.4g}"


def _figures(res: dict, metric: str | None) -> str:
    """``split value ...`` of the run's metric at the reported evaluation (shares in %)."""
    m = _metric_of(res, metric)
    return " ".join(f"{k} {_value(m, (v or {}).get(m))}" for k, v in (res.get("splits") or {}).items())


def runs_table(runs: list[SuiteRun], metric: str | None = None) -> str:
    """Markdown: each run's status, parameter count, optimiser steps, wall time, reported epoch
    and figures.

    When every finished run is an algorithmic-task run the figures are the ID / OD-easy /
    OD-hard columns of ``metric`` (default ``seq_acc``, %); otherwise one column gives each
    run's main metric per split (``metric (split value ...)``)."""
    from ..train.task import family_of
    from .table import _params

    results = {r.name: json.loads((d / "results.json").read_text())
               for r in runs if (d := finished_dir(r)) is not None}
    nsp = all(family_of(res) in ("nsp", None) for res in results.values())
    if nsp:
        lines = ["| run | status | params | steps | wall | epoch | selected by | ID | OD-easy | OD-hard |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
    else:
        lines = ["| run | status | params | steps | wall | epoch | selected by | reported |",
                 "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        res = results.get(r.name)
        if res is None:
            lines.append(f"| {r.name} | {run_status(r)} | – | – | – | – | – | " + " | ".join(
                ["–"] * (3 if nsp else 1)) + " |")
            continue
        sp = res.get("splits") or {}
        if nsp:
            m = metric or "seq_acc"
            figs = [_value(m, sp[k].get(m)) if k in sp else "–" for k in ("id", "od_easy", "od_hard")]
        else:
            figs = [f"{_metric_of(res, metric)} ({_figures(res, metric)})"]
        status = "done (time limit)" if res.get("stopped_by_time_limit") else "done"
        steps = f"{res['steps']:,}" if isinstance(res.get("steps"), int) else "–"
        lines.append(f"| {r.name} | {status} | {_params(res['params'])} | {steps} | {_fmt_wall(res['wall_s'])} | "
                     f"{res.get('best_epoch')}/{res.get('epochs')} | {res.get('selection_decided_by', '–')} | "
                     + " | ".join(figs) + " |")
    return "\n".join(lines)


def _curves(args, runs: list[SuiteRun]) -> None:
    """``--curves PNG``: the learning curves of the finished runs that ``--only`` selects."""
    if not args.curves:
        return
    import fnmatch

    from ..viz.curves import plot_learning_curves, read_metrics

    chosen = [r for r in runs if not args.only or any(fnmatch.fnmatch(r.name, g) for g in args.only)]
    found = {r.name: read_metrics(d) for r in chosen if (d := finished_dir(r)) is not None}
    if not found:
        print(f"memnets suite: --curves: no finished run to plot; {args.curves} not written", file=sys.stderr)
        return
    fig = plot_learning_curves(found, metric=args.metric or "seq_acc")
    Path(args.curves).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.curves, dpi=110, bbox_inches="tight")
    print(f"curves of {len(found)} run(s): {args.curves}")


def _tables(suite: Suite, runs: list[SuiteRun], metric: str | None) -> str:
    """The runs table, then the sweep's choices (a suite with a sweep) or the family tables."""
    from .table import load_results

    text = "## Runs\n\n" + runs_table(runs, metric)
    if suite.has_sweep:
        text += "\n\n## Sweep: the point chosen by each run's selection split\n\n" + sweep_table(suite, runs, metric)
    results = load_results([d for r in runs if (d := finished_dir(r)) is not None], warn=False)
    if results and not suite.has_sweep:
        text += "\n\n" + family_tables(results, metric)
    return text


def sweep_table(suite: Suite, runs: list[SuiteRun], metric: str | None = None) -> str:
    """Markdown: for each preset and seed of a suite with a ``sweep``, each point's figure on the
    run's selection split (its ``select_split``, at the reported evaluation) and the point
    chosen (:func:`choose_point`): the highest on the selection split, a difference within the
    evaluation's sampling noise counting as a tie; ties broken by ID (likewise), then by the
    lower selection loss. The other splits (OD-hard) take no part. The columns are every point of
    every preset's grid (``sweep_for``); a point outside a preset's grid is left blank, one not
    yet finished is ``–``. A preset swept on several seeds gets one more row, ``pooled``: each
    point's figures averaged over the seeds and their evaluations pooled (:func:`pool_points`),
    and the choice among those, which is the preset's. Empty for a suite without a sweep."""
    if not suite.has_sweep:
        return ""
    groups: dict[tuple[str, int], dict[str, dict | None]] = {}
    labels: dict[str, list[str]] = {}  # label -> the point's overrides
    for r in runs:
        suffix, point = next((sfx, pt) for sfx, pt in _sweep_points(suite.sweep_of(r.preset))
                             if r.name == run_name(r.preset, r.seed, sfx))
        d = finished_dir(r)
        res = json.loads((d / "results.json").read_text()) if d is not None else None
        label = suffix.lstrip("-")
        groups.setdefault((r.preset, r.seed), {})[label] = res
        labels.setdefault(label, point)
    labels = _in_value_order(labels)
    lines = ["| preset | seed | " + " | ".join(labels) + " | chosen |", "|---|---|" + "---|" * (len(labels) + 1)]
    pooled: dict[str, dict[int, dict[str, dict | None]]] = {}  # preset -> seed -> label -> point
    for (preset, seed), cells in groups.items():
        figs, points = [], []
        mine = pooled.setdefault(preset, {}).setdefault(seed, {})
        for label in labels:
            if label not in cells:
                figs.append("")
                continue
            res = cells[label]
            mine[label] = None
            if res is None:
                figs.append("–")
                continue
            sel = res.get("select_split") or "od_easy"
            sp = res.get("splits") or {}
            m = _metric_of(res, metric)
            v = (sp.get(sel) or {}).get(m)
            figs.append(f"{_value(m, v)} ({sel})")
            s_sel, s_id = sp.get(sel) or {}, sp.get("id") or {}
            points.append({"label": label, "sel": (v if isinstance(v, (int, float)) else -1.0, s_sel.get("n")),
                           "id": (s_id.get(m) or 0.0, s_id.get("n")), "loss": s_sel.get("loss") or 0.0,
                           "metric": m, "split": sel})
            mine[label] = points[-1]
        done = all(res is not None for res in cells.values())
        lines.append(f"| {preset} | {seed} | " + " | ".join(figs) + f" | {_chosen(points, done)} |")
    for preset, seeds in pooled.items():  # several seeds: the choice over all of them
        if len(seeds) > 1:
            lines.append(_pooled_row(preset, seeds, labels))
    return "\n".join(lines)


def _chosen(points: list[dict], done: bool) -> str:
    """The "chosen" cell of a sweep row: :func:`choose_point` of ``points``, marked "so far"
    while some of the row's runs are not ``done``."""
    best = choose_point(points)
    if done:
        return best or "–"
    return f"({best} so far)" if best else "–"


def pool_points(points: list[dict]) -> dict:
    """One sweep point from the same point's runs on several seeds: the mean of their
    figures, over the sum of their evaluation sizes (a pooled sample, as :func:`within_noise`
    takes it), and the mean selection loss."""
    def mean_n(key):
        ns = [q[key][1] for q in points]
        return (sum(q[key][0] for q in points) / len(points), sum(ns) if all(ns) else None)

    return {"label": points[0]["label"], "sel": mean_n("sel"), "id": mean_n("id"),
            "loss": sum(q["loss"] for q in points) / len(points), "metric": points[0].get("metric"),
            "split": points[0].get("split")}


def _pooled_row(preset: str, seeds: dict[int, dict[str, dict | None]], labels: list[str]) -> str:
    """The sweep row of ``preset`` over all its seeds: each point pooled (:func:`pool_points`)
    once every seed has it, and the choice among the pooled points."""
    figs, points, done = [], [], True
    for label in labels:
        runs = [pts.get(label, False) for pts in seeds.values()]
        if all(r is False for r in runs):
            figs.append("")
            continue
        if any(r is None or r is False for r in runs):
            figs.append("–")
            done = False
            continue
        q = pool_points(runs)
        points.append(q)
        figs.append(f"{_value(q['metric'], q['sel'][0])} ({q['split']})")
    who = ", ".join(str(s) for s in sorted(seeds))
    return f"| {preset} | {who} pooled | " + " | ".join(figs) + f" | {_chosen(points, done)} |"


def _in_value_order(points: dict[str, list[str]]) -> list[str]:
    """The labels of ``points`` (label -> ``["key=value", ...]``) ordered by their values when
    every value is a number (``lr0.0001`` before ``lr0.01``), else as given."""
    def key(label):
        return [(o.split("=", 1)[0], float(o.split("=", 1)[1])) for o in points[label]]

    try:
        return sorted(points, key=key)
    except (ValueError, TypeError):
        return list(points)


def within_noise(a: float, na: int | None, b: float, nb: int | None, z: float = 2.0) -> bool:
    """Whether two accuracies (fractions over ``na`` and ``nb`` sequences) differ by no more than
    ``z`` standard errors of their difference (pooled binomial): a difference the evaluation's
    sampling cannot tell from none. Without counts, only equal values are within noise."""
    if not na or not nb or not (0.0 <= a <= 1.0 and 0.0 <= b <= 1.0):
        return a == b
    p = (a * na + b * nb) / (na + nb)
    return abs(a - b) <= z * math.sqrt(p * (1.0 - p) * (1.0 / na + 1.0 / nb))


def choose_point(points: list[dict]) -> str | None:
    """The sweep's choice among ``points`` (``{"label", "sel": (value, n), "id": (value, n),
    "loss"}``): the points whose selection-split figure is within sampling noise of the highest
    (:func:`within_noise`), of those the ones whose ID figure is within noise of their highest,
    of those the lowest selection-split loss. None without points."""
    if not points:
        return None
    top = max(points, key=lambda q: q["sel"][0])["sel"]
    tied = [q for q in points if within_noise(q["sel"][0], q["sel"][1], top[0], top[1])]
    top_id = max(tied, key=lambda q: q["id"][0])["id"]
    tied = [q for q in tied if within_noise(q["id"][0], q["id"][1], top_id[0], top_id[1])]
    return min(tied, key=lambda q: q["loss"])["label"]


def family_tables(results: list[dict], metric: str | None = None) -> str:
    """The tables of ``results`` (``results.json`` dicts), one per task family in order of first
    appearance, each under a heading: Table 1 of ``metric`` beside the paper's for the
    algorithmic tasks, the family's own table (main metric) for the others
    (:func:`memnets.cli.table.family_tables`, as ``memnets table --paper`` prints them)."""
    from .table import family_tables as tables

    return tables(results, metric, paper=True, headings=True)


def _run(args) -> int:
    from ..train.config import ConfigError, load_config
    from .main import UsageError
    from .table import load_results

    if args.jobs < 1:
        raise UsageError(f"--jobs expected a positive integer, got {args.jobs}")
    try:
        suite = load_suite(args.suite)
    except ConfigError as e:
        raise UsageError(str(e)) from e
    runs_dir = Path(args.runs_dir or Path("runs") / suite.name)
    results_dir = Path("results") / suite.name if args.results_dir is None else \
        (Path(args.results_dir) if args.results_dir else None)
    runs = suite_runs(suite, runs_dir, seeds=_parse_seeds(args.seeds), overrides=args.overrides,
                      threads=args.threads, results_dir=results_dir)
    for r in runs:  # every config must resolve before anything trains
        try:
            cfg = load_config(r.preset, r.overrides)
        except ConfigError as e:
            raise UsageError(f"{r.name}: {e}") from e
        r.stale = stale_keys(r, cfg)
        if r.stale and budget_grows(r, cfg) == r.stale:  # a longer budget: the run trains on
            r.grows, r.stale = r.stale, []
    if not args.dry_run:  # runs finished in their run folder but not yet kept in the results folder
        for r in runs:
            if r.results_dir is not None and not r.stale and not r.grows and \
                    not (r.results_dir / "results.json").is_file():
                archive_run(r)
    todo = [r for r in runs if run_status(r) != "done"]
    n_done = len(runs) - len(todo)
    if args.only:
        import fnmatch

        unmatched = [g for g in args.only if not any(fnmatch.fnmatch(r.name, g) for r in runs)]
        if unmatched:
            raise UsageError(f"--only {unmatched[0]!r} matches no run of suite {suite.name} "
                             f"(names like {runs[0].name}; see --dry-run)")
        todo = [r for r in todo if any(fnmatch.fnmatch(r.name, g) for g in args.only)]
    stale = [r for r in todo if r.stale]
    if stale and not args.dry_run and not args.rerun_stale:
        listed = "; ".join(f"{r.name} ({', '.join(r.stale)})" for r in stale[:5])
        more = f" and {len(stale) - 5} more" if len(stale) > 5 else ""
        raise UsageError(f"{len(stale)} run(s) of suite {suite.name} were made with another config than their "
                         f"preset gives now: {listed}{more}. Pass --rerun-stale to train them again (their run "
                         "folders are moved to <run>.stale, their kept results removed), or restore the presets")
    kept = f", results kept in {results_dir}" if results_dir is not None else ""
    only = f", {len(todo)} not done selected by --only" if args.only else ""
    print(f"suite {suite.name}: {len(runs)} runs in {runs_dir}{kept}{only} ({n_done} done, "
          f"{sum(run_status(r) == 'resume' for r in todo)} to resume, "
          f"{sum(run_status(r) == 'new' for r in todo)} to start"
          + (f", {len(stale)} stale to run again" if stale else "") + ")", flush=True)
    from ..train.checkpoint import lock_holder

    if args.dry_run:
        for r in runs:
            st = run_status(r)
            extra = f" from step {_checkpoint_step(r.run_dir)}" if st == "resume" else \
                f" (made with {', '.join(r.stale)})" if st == "stale" else ""
            if r.grows:
                extra += f" (the budget grew: {', '.join(r.grows)})"
            holder = lock_holder(r.run_dir) if st != "done" else None
            if holder is not None:
                extra += f" (running now, process {holder})"
            print(f"  {r.name:40s} {st}{extra}: memnets {' '.join(r.argv())}")
        text = _tables(suite, runs, args.metric)  # from what is finished: nothing trains
        print()
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        _curves(args, runs)
        return 0

    failed: list[str] = []
    active: dict[str, tuple[SuiteRun, subprocess.Popen, object, float]] = {}
    queue = list(todo)
    n_total, n_started = len(todo), 0
    try:
        while queue or active:
            while queue and len(active) < args.jobs:
                r = queue.pop(0)
                n_started += 1
                holder = lock_holder(r.run_dir)
                if r.stale and holder is None:
                    _set_aside(r)
                st = run_status(r)
                if st == "done" or holder is not None:  # another suite's process finished or holds it
                    why = "finished meanwhile elsewhere" if st == "done" else f"running in process {holder}"
                    print(f"[{n_started}/{n_total}] {r.name}: {why}; skipped here", flush=True)
                    continue
                how = f"resuming from step {_checkpoint_step(r.run_dir)}" if st == "resume" else "starting"
                if r.grows:
                    how += f" (the budget grew: {', '.join(r.grows)})"
                print(f"[{n_started}/{n_total}] {r.name}: {how}", flush=True)
                proc, log = _start(r)
                active[r.name] = (r, proc, log, time.perf_counter())
            time.sleep(0.05)
            for name in list(active):
                r, proc, log, t0 = active[name]
                rc = proc.poll()
                if rc is None:
                    continue
                log.close()
                del active[name]
                dt = time.perf_counter() - t0
                if rc == 0 and (r.run_dir / "results.json").is_file():
                    r.grows = []  # trained on to its preset's budget: finished
                    archive_run(r)
                    res = json.loads((r.run_dir / "results.json").read_text())
                    figs = f"{_metric_of(res, args.metric)} {_figures(res, args.metric)}"
                    print(f"  {name}: done in {_fmt_wall(dt)} (epoch {res.get('best_epoch')}: {figs})", flush=True)
                else:
                    failed.append(name)
                    print(f"  {name}: FAILED (exit {rc}) after {_fmt_wall(dt)}: {_tail(r.run_dir / 'suite.log')} "
                          f"(log: {r.run_dir / 'suite.log'})", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        for r, proc, log, _ in active.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.time() + 20
        for r, proc, log, _ in active.values():
            try:
                proc.wait(timeout=max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        print("memnets suite: interrupted; run the same command again to continue "
              "(finished runs are skipped, started ones resume)", file=sys.stderr, flush=True)
        return 130

    text = _tables(suite, runs, args.metric)
    print()
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    _curves(args, runs)
    if failed:
        print(f"memnets suite: {len(failed)} run(s) failed: {', '.join(failed)}; their logs are "
              f"<run>/suite.log; rerun to retry them", file=sys.stderr)
        return 1
    return 0
