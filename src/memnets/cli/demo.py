"""``memnets demo``: a few minutes that show the whole library working (``make demo``).

0. a check of this machine: a few training steps of each model, compared with what the demo
   needs to finish its epochs within its time cap (a plain warning names the cause and the
   command to rerun when the CPU is too busy);
1. the NAM ops benchmark (``memnets bench ops --quick``, with the demo's torch threads);
2. a small NAM Turing Machine and a small Transformer trained on Reduce at tiny scale
   (presets ``demo/reduce-nam_tm`` and ``demo/reduce-transformer``, one torch thread each
   unless ``threads=N`` is given; a model whose module is not installed is replaced by the
   biLSTM baseline, with the reason printed);
3. their ID / OD-easy / OD-hard sequence accuracy as a Table-1-shaped Markdown table, the
   epoch each column reports and why, and whether the length-generalisation gap showed;
4. a learning-curve PNG (``<out>/learning_curves.png``).

Overrides apply to both runs, e.g. ``memnets demo threads=1 time_limit_min=6`` (the time cap
of each run, in minutes). The figures are tiny-scale smoke results, not the paper's
measurements (see docs/results.md).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

__all__ = ["add_parser", "plot_learning_curves", "demo_configs", "calibrate", "machine_load",
           "throughput_warning", "selection_line", "generalisation_verdict", "run_bench", "EXPECTED"]

DEMO_MODELS = ("nam_tm", "transformer")

# What the demo reaches when it completes its 30 epochs (2-core CPU with two other jobs running,
# one torch thread per run: NAM-TM 98.8 / 96.1 / 77.0 % ID / OD-easy / OD-hard at epoch 29,
# TF 34.8 / 0 / 0 %). NAM-TM generalises late: OD-hard passes 40% only after ~22 epochs.
EXPECTED = ("NAM-TM about 95%+ ID, 90%+ OD-easy and 70%+ OD-hard sequence accuracy; the Transformer (TF) "
            "fits only part of the training lengths (ID) at this tiny scale and stays near 0% on OD-easy "
            "and OD-hard, the longer sequences it never saw in training")
EXPECTED_OD_HARD = 0.70  # NAM-TM's OD-hard sequence accuracy after a full demo run, or more
SPLIT_WORDS = {"id": "ID", "od_easy": "OD-easy", "od_hard": "OD-hard"}


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="benchmark + two tiny training runs + table + plot (< 10 min on 2 cores)",
                       description=__doc__)
    p.add_argument("--out", default=None, help="output directory (default: runs/demo-<timestamp>)")
    p.add_argument("--skip-bench", action="store_true", help="skip the ops benchmark")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dotted overrides applied to both demo presets, e.g. threads=1 (torch threads per "
                        "run, the default), time_limit_min=6 (time cap per run), epochs=2")
    from .main import add_device_option

    add_device_option(p)
    p.set_defaults(func=_run)


# --------------------------------------------------------------------------- pure helpers

def demo_configs(overrides: Sequence[str] = ()) -> list:
    """The :class:`~memnets.train.config.RunConfig` of each demo run, ``overrides`` applied.

    A backbone whose module is not installed is replaced by the biLSTM baseline (the reason is
    kept in the config's ``description``). The presets set ``threads = 1``: one torch thread per
    run, which keeps these tiny models fast when other processes share the cores.
    """
    from ..models.seq import backbone_available
    from ..train import load_config

    cfgs = []
    for bb in DEMO_MODELS:
        ok, why = backbone_available(bb)
        if not ok:
            cfg = load_config("demo/reduce-lstm", list(overrides))
            cfgs.append(_replace(cfg, description=f"{bb} is not available here ({why}); biLSTM baseline instead"))
        else:
            cfgs.append(load_config(f"demo/reduce-{bb}", list(overrides)))
    return cfgs


def _replace(cfg, **kw):
    import dataclasses

    return dataclasses.replace(cfg, **kw)


def _label(backbone: str) -> str:
    from ..models.seq import BACKBONES

    return BACKBONES.get(backbone, (None, None, None, backbone))[3]


def machine_load() -> tuple[float | None, int]:
    """(1-minute load average or None where unknown, CPU cores this process may use)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return load, cpus


def _busy(load: float | None, cpus: int | None) -> bool:
    return load is not None and bool(cpus) and load >= 0.75 * cpus


def _minutes(x: float) -> str:
    return f"{x:g}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def throughput_warning(model: str, measured_sps: float, needed_sps: float, *, epochs: int, time_limit_min: float,
                       threads: int, load: float | None = None, cpus: int | None = None, own_load: float = 0.0,
                       command: str = "memnets demo", extra: Sequence[str] = ()) -> str | None:
    """A plain-words warning when ``model`` trains too slowly to finish ``epochs`` in its time cap.

    ``measured_sps``: samples per second measured here, evaluation included; ``needed_sps``:
    what finishing ``epochs`` within ``time_limit_min`` takes. Returns None when it is fast
    enough (or there is no time cap); otherwise the warning, with the likely cause (a busy CPU,
    from the 1-minute ``load`` average over ``cpus`` cores, less ``own_load``, the demo's own
    share of it; more torch ``threads`` than help) and the exact command to rerun (``command``
    followed by the user's ``extra`` overrides).
    """
    if time_limit_min <= 0 or measured_sps >= needed_sps:
        return None
    reach = max(int(epochs * measured_sps / max(needed_sps, 1e-9)), 0)
    load_txt = f"load average {load:.1f} on {cpus} cores" if load is not None else f"{cpus or '?'} cores"
    if _busy(None if load is None else load - own_load, cpus):
        cause = f"the CPU is busy ({load_txt}: other processes are using the cores)"
        if threads != 1:
            cause += f", and the {threads or 'default'} torch threads of each run compete with them"
    elif threads != 1:
        cause = f"{threads or 'torch default'} torch threads per run do not pay off for these tiny models ({load_txt})"
    else:
        cause = f"this CPU is slower than the demo assumes ({load_txt})"
    factor = needed_sps / max(measured_sps, 1e-9)
    longer = max(math.ceil(time_limit_min * factor * 1.2), math.ceil(time_limit_min) + 1)
    base = " ".join([command, *extra])
    if threads != 1:
        rerun = (f"rerun with one thread per run: `{base} threads=1`; if it still warns, also give each run "
                 f"a longer time cap: `{base} threads=1 time_limit_min={longer}`")
    else:
        rerun = (f"rerun when the machine is idle, or give each run a longer time cap: "
                 f"`{base} time_limit_min={longer}` (the demo then takes up to ~{2 * longer} min)")
    return (f"WARNING: the demo cannot train {model} properly here. {cause[0].upper()}{cause[1:]}: "
            f"{model} trains at {measured_sps:.0f} samples/s; the demo needs ~{needed_sps:.0f} to finish its "
            f"{epochs} epochs in the {_minutes(time_limit_min)}-min time cap (time_limit_min), so it will stop "
            f"after about {reach} epochs and its results will be under-trained. To fix: {rerun}.")


def _epoch_text(ep) -> str:
    if ep is None:
        return "none"
    return str(int(ep)) if float(ep).is_integer() else f"{float(ep):.2f} (mid-epoch, at the time cap)"


def selection_line(res: dict, planned_epochs: int | None = None) -> str:
    """One line naming the epoch a run's ``results.json`` (``res``) reports and why it was chosen.

    The rule (``memnets.train.loop.selection_key``): the best ``select_split`` (OD-easy)
    sequence accuracy; ties broken by the ID sequence accuracy, then by the lower
    ``select_split`` validation loss; ``selection_decided_by`` says which of them decided.
    """
    sel = res.get("select_split", "od_easy")
    sw = SPLIT_WORDS.get(sel, sel)
    name = _label(res.get("backbone", "?"))
    done = res.get("epochs")
    planned = planned_epochs if planned_epochs is not None else done
    head = f"{name}: epoch {_epoch_text(res.get('best_epoch'))} of {planned}"
    splits = res.get("splits") or {}
    if not splits:
        return f"{head}: no evaluation was recorded"
    acc = splits.get(sel, {}).get("seq_acc", 0.0)
    id_acc = splits.get("id", {}).get("seq_acc", 0.0)
    decided = res.get("selection_decided_by")
    ties = "last" if "the last evaluation" in res.get("selected_by", "") else "first"
    if decided == f"{sel} seq_acc" or decided is None:
        why = (f"the best {sw} accuracy ({100 * acc:.1f}%); ties would be broken by ID accuracy, "
               f"then {sw} validation loss")
    else:
        tie = (f"{sw} accuracy was 0% at every evaluation" if acc == 0 else
               f"several epochs tied at the best {sw} accuracy ({100 * acc:.1f}%)")
        if decided == "id seq_acc":
            why = f"{tie}, so the best ID accuracy ({100 * id_acc:.1f}%) decided"
        elif decided == f"{sel} loss":
            why = f"{tie} and ID accuracy tied too ({100 * id_acc:.1f}%), so the lowest {sw} validation loss decided"
        else:
            why = f"{tie}, and ID accuracy and {sw} validation loss tied too, so the {ties} such evaluation is reported"
    line = f"{head}: {why}"
    if res.get("stopped_by_time_limit"):
        line += f" [stopped by the time cap after {done} of {planned} epochs]"
    return line


def _rerun_command(nam: dict | None, planned_epochs: int, time_limit_min: float, threads: int,
                   command: str, extra: Sequence[str]) -> str:
    """The command that should give a full run here: one thread per run first, else a time cap
    long enough for the epochs that the NAM-TM run managed (with a 20% margin)."""
    base = " ".join([command, *extra])
    if threads != 1:
        return f"{base} threads=1"
    done = max(float((nam or {}).get("best_epoch") or 0), float((nam or {}).get("epochs") or 0), 0.5)
    longer = max(math.ceil(time_limit_min * planned_epochs / done * 1.2), math.ceil(time_limit_min) + 1)
    return f"{base} time_limit_min={longer}"


def generalisation_verdict(results: Sequence[dict], planned_epochs: int, time_limit_min: float, *,
                           threads: int = 1, command: str = "memnets demo", extra: Sequence[str] = ()) -> str:
    """Whether the demo's table shows the length-generalisation gap, in plain words.

    ``results``: the runs' ``results.json`` dicts. Shown when NAM-TM reaches the expected
    OD-hard accuracy (:data:`EXPECTED_OD_HARD`) well above the Transformer's; otherwise says why
    not: the run was stopped by its time cap (under-trained, with the command to rerun:
    ``command``, the user's ``extra`` overrides, then ``threads=1`` or a longer
    ``time_limit_min``) or it finished but fell short.
    """
    by = {r.get("backbone"): r for r in results}
    nam, tf = by.get("nam_tm"), by.get("transformer")
    if nam is None or not nam.get("splits"):
        return "The NAM-TM run did not take place here, so this demo cannot show the length-generalisation gap."

    def odh(r):
        return (r.get("splits") or {}).get("od_hard", {}).get("seq_acc", 0.0) if r else 0.0

    n_acc, t_acc = odh(nam), odh(tf)
    vs = f" vs the Transformer's {100 * t_acc:.1f}%" if tf else ""
    tf_note = ""
    if tf and tf.get("stopped_by_time_limit"):
        tf_note = (f" (the Transformer run was stopped by the time cap after {tf.get('epochs')} of "
                   f"{planned_epochs} epochs)")
    if n_acc >= EXPECTED_OD_HARD and n_acc - t_acc >= 0.3:
        return (f"Length generalisation shown: NAM-TM {100 * n_acc:.1f}% OD-hard{vs}, on sequences longer than "
                f"any seen in training{tf_note}.")
    if nam.get("stopped_by_time_limit") or (nam.get("epochs") or 0) < planned_epochs:
        rerun = _rerun_command(nam, planned_epochs, time_limit_min, threads, command, extra)
        return (f"UNDER-TRAINED: the NAM-TM run was stopped by its {_minutes(time_limit_min)}-min time cap "
                f"(time_limit_min) after {nam.get('epochs')} of {planned_epochs} epochs, so its "
                f"{100 * n_acc:.1f}% OD-hard{vs} does not show the length-generalisation gap (a full run reaches "
                f"about {100 * EXPECTED_OD_HARD:.0f}%+). Rerun: `{rerun}`.")
    more = 2 * planned_epochs
    longer = max(math.ceil(time_limit_min * 2.4), math.ceil(time_limit_min) + 1) if time_limit_min else 0
    kept = [o for o in extra if o.split("=", 1)[0].strip() != "epochs"]
    rerun = " ".join([command, *kept, f"epochs={more}", *([f"time_limit_min={longer}"] if longer else [])])
    gap = "smaller than usual" if n_acc - t_acc >= 0.1 else "not shown"
    return (f"NAM-TM finished its {planned_epochs} epochs but reached {100 * n_acc:.1f}% OD-hard{vs}, below the "
            f"usual {100 * EXPECTED_OD_HARD:.0f}%+: the length-generalisation gap is {gap} in this run (tiny "
            f"scale, one seed; more epochs usually help: `{rerun}`).")


# --------------------------------------------------------------------------- measurements

def calibrate(cfg, *, min_seconds: float = 1.0, max_steps: int = 16) -> dict[str, float]:
    """Time a few training steps and a slice of the evaluation of ``cfg``'s model, here and now.

    Returns ``{"epoch_s", "samples_per_s", "train_samples_per_s"}``: the estimated wall time
    of one epoch (training + evaluation of every split) and the samples per second it implies
    (``task.train_size / epoch_s``), and the training steps' own rate. A step is the engine's:
    the task's batch and ``train_step`` (autocast as in training), then
    :func:`memnets.train.loop.update` with ``optim.kind``'s optimiser. Uses ``cfg.threads``
    and ``cfg.device``; the global RNG state is left as it was.
    """
    import torch

    from ..train.env import DistInfo, resolve_device
    from ..train.loop import _autocast, update
    from ..train.optim import make_optimizer
    from ..train.task import get_task

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    task = get_task(cfg.task.name)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def autocast():
        return _autocast(cfg, device)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = task.build_model(cfg).to(device)
        model.train()
        opt = make_optimizer(cfg.optim, model.parameters())
        data = task.train_data(cfg, 0)
        nb = max(task.steps_per_epoch(cfg), 1)

        def step(i: int) -> None:
            loss, _ = task.train_step(model, task.train_batch(cfg, data, 0, i % nb), cfg, device, autocast)
            update(cfg, model, opt, loss, i + 1)

        step(0)  # warm-up
        sync()
        n, t0 = 0, time.perf_counter()
        while n < max_steps and (n < 2 or time.perf_counter() - t0 < min_seconds):
            n += 1
            step(n)
        sync()
        train_sps = n * cfg.batch_size / (time.perf_counter() - t0)
        k = max(min(32, cfg.task.eval_size), 1)
        splits = task.eval_splits(cfg)
        t1 = time.perf_counter()
        for s in splits.values():
            task.evaluate(model, type(s)(*(t[:k] for t in s)), cfg, device=device, info=DistInfo(),
                          autocast=autocast)
        sync()
        eval_s = (time.perf_counter() - t1) * cfg.task.eval_size / k
    epoch_s = cfg.task.train_size / train_sps + eval_s
    return {"epoch_s": epoch_s, "samples_per_s": cfg.task.train_size / epoch_s, "train_samples_per_s": train_sps}


def _command() -> str:
    """How to call this command again: ``memnets`` when that is on PATH, else the script's path."""
    exe = sys.argv[0] if sys.argv else ""
    if os.path.basename(exe) == "memnets":
        found = shutil.which("memnets")
        try:
            same = bool(found) and os.path.samefile(found, exe)
        except OSError:
            same = False
        if not same:
            rel = os.path.relpath(exe)
            return f"{rel if not rel.startswith('..') else exe} demo"
    return "memnets demo"


def _user_extra(overrides: Sequence[str]) -> list[str]:
    """The user's overrides other than the ones a rerun command sets itself."""
    return [o for o in overrides if o.split("=", 1)[0].strip() not in ("threads", "time_limit_min")]


def plot_learning_curves(run_dirs: list[Path], path: Path) -> Path:
    """Per-run training loss and per-split sequence accuracy vs epoch, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for d in run_dirs:
        recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
        name = json.loads((d / "config.json").read_text())["model"]["backbone"]
        tr = [r for r in recs if r["kind"] == "train"]
        # one record (a short run) is drawn as a marker: a line through one point is invisible
        ax_loss.plot([r["step"] for r in tr], [r["loss"] for r in tr], label=name, marker="o" if len(tr) == 1 else None)
        ev = [r for r in recs if r["kind"] == "eval"]
        for split, style in zip(ev[0]["splits"] if ev else [], ("-", "--", ":")):
            ax_acc.plot([r["epoch"] for r in ev], [r["splits"][split]["seq_acc"] for r in ev], style,
                        label=f"{name} {split}", marker="o" if len(ev) == 1 else None)
    ax_loss.set(xlabel="step", ylabel="train loss (cross-entropy)", yscale="log", title="training loss")
    ax_acc.set(xlabel="epoch", ylabel="sequence accuracy", ylim=(-0.02, 1.02), title="Reduce: accuracy by split")
    ax_loss.legend()
    ax_acc.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_bench(threads: int) -> str:
    """The quick ops benchmark with ``threads`` torch threads (0: torch's default), as a table."""
    import torch

    from ..bench.registry import format_table, run_suite

    if threads:
        torch.set_num_threads(threads)
    return format_table(run_suite("ops", quick=True))


# --------------------------------------------------------------------------- the command

def _run(args) -> int:
    import torch

    from ..train import train
    from .table import format_table1

    t0 = time.perf_counter()
    out = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    overrides = list(args.overrides)
    cfgs = demo_configs(overrides)  # bad overrides fail here, before any work
    threads = cfgs[0].threads
    cap = cfgs[0].time_limit_min
    epochs = cfgs[0].epochs
    cmd, extra = _command(), _user_extra(overrides)
    load, cpus = machine_load()
    load_txt = f"load average {load:.1f} on {cpus} cores" if load is not None else f"{cpus} cores"
    print(f"memnets demo: {threads or 'default'} torch thread(s) per run (override: threads=N), "
          f"{epochs} epochs per run, time cap {_minutes(cap)} min per run (override: time_limit_min=M); "
          f"{load_txt}{' (busy)' if _busy(load, cpus) else ''}", flush=True)

    print("\n== 0. Checking this machine's speed ==", flush=True)
    warned: set[str] = set()
    needed = epochs * cfgs[0].task.train_size / (60 * cap) if cap else 0.0
    est_total = 0.0
    for cfg in cfgs:
        name = _label(cfg.model.backbone)
        c = calibrate(cfg)
        est = cfg.epochs * c["epoch_s"]
        est_total += min(est, 60 * cfg.time_limit_min) if cfg.time_limit_min else est
        print(f"  {name}: {c['samples_per_s']:.0f} samples/s (training + evaluation); {cfg.epochs} epochs "
              f"would take ~{_duration(est)}" +
              (f"; needs ~{needed:.0f} samples/s to fit the {_minutes(cap)}-min cap" if cap else ""), flush=True)
        msg = throughput_warning(name, c["samples_per_s"], needed, epochs=cfg.epochs, time_limit_min=cfg.time_limit_min,
                                 threads=threads, load=load, cpus=cpus, command=cmd, extra=extra)
        if msg and warned:  # the cause and the fix are already printed above
            reach = int(cfg.epochs * c["samples_per_s"] / needed)
            print(f"  -> {name} is too slow as well: it would stop after about {reach} of {cfg.epochs} epochs",
                  flush=True)
        elif msg:
            print("\n" + msg + "\n", flush=True)
        if msg:
            warned.add(cfg.name)
    print(f"  training should take ~{_duration(est_total)} in all", flush=True)

    if not args.skip_bench and warned:
        print(f"\n== 1. NAM ops benchmark: skipped, this machine is too busy or slow right now for meaningful "
              f"timings (see above); run it alone later: {cmd[:-len(' demo')]} bench ops --quick --threads 1 ==",
              flush=True)
    elif not args.skip_bench:
        t_b = time.perf_counter()
        print(f"\n== 1. NAM ops benchmark (memnets bench ops --quick --threads {threads}) ==\n", flush=True)
        if _busy(load, cpus):
            print(f"({load_txt}: other processes share the CPU, so the timings below are noisy; each is the "
                  "fastest of its repeats)\n", flush=True)
        print(run_bench(threads), flush=True)
        print(f"\n(benchmark took {time.perf_counter() - t_b:.0f}s)", flush=True)

    print("\n== 2. Training on Reduce at tiny scale ==", flush=True)
    print(f"Expected after a full run: {EXPECTED}.", flush=True)
    results, dirs = [], []
    for cfg in cfgs:
        name = _label(cfg.model.backbone)
        if cfg.model.backbone == "bilstm":
            print(f"  {cfg.description}", flush=True)
        d = out / cfg.name
        t1 = time.perf_counter()

        def on_epoch(rec, cfg=cfg, name=name):
            # the first evaluation: does the real speed still fit the time cap (the load may have risen)?
            if cfg.name in warned or not cfg.time_limit_min or rec["epoch"] <= 0 or rec["wall_s"] <= 0:
                return
            warned.add(cfg.name)
            sps = cfg.task.train_size * rec["epoch"] / rec["wall_s"]
            if sps < 0.9 * needed:  # 10% slack: the first epoch carries some warm-up
                msg = throughput_warning(name, sps, needed, epochs=cfg.epochs, time_limit_min=cfg.time_limit_min,
                                         threads=threads, load=machine_load()[0], cpus=cpus, own_load=1.0,
                                         command=cmd, extra=extra)
                print(f"\n[after epoch {rec['epoch']:g}] {msg}\n", flush=True)

        res = train(cfg, d, quiet=args.quiet, on_epoch=on_epoch)
        stop = " (stopped by the time cap)" if res.get("stopped_by_time_limit") else ""
        print(f"  {cfg.name}: {res['params']} parameters, {res['epochs']} of {cfg.epochs} epochs in "
              f"{time.perf_counter() - t1:.0f}s{stop}", flush=True)
        results.append(res)
        dirs.append(d)

    print("\n== 3. Sequence accuracy (epoch chosen by OD-easy, as the paper) ==\n")
    table = format_table1(results)
    lines = [f"- {selection_line(r, c.epochs)}" for r, c in zip(results, cfgs)]
    verdict = generalisation_verdict(results, epochs, cap, threads=threads, command=cmd, extra=extra)
    report = "\n".join([table, "", "Reported epoch:", *lines, "", verdict])
    print(report)
    (out / "table.md").write_text(report + "\n")
    png = plot_learning_curves(dirs, out / "learning_curves.png")
    print(f"\n== 4. Learning curves: {png} ==")
    print(f"\ndemo finished in {time.perf_counter() - t0:.0f}s "
          f"(torch {torch.__version__}, {torch.get_num_threads()} threads)", file=sys.stderr)
    return 0
