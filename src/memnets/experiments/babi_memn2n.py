"""Train End-to-End Memory Networks on bAbI 1k (docs/maths.md §9, §11) and write a test-error table.

    python -m memnets.experiments.babi_memn2n --tasks 1 --out runs/memn2n_t1
    python -m memnets.experiments.babi_memn2n --tasks all --joint --out runs/memn2n_joint
    python -m memnets.experiments.babi_memn2n --tasks all --joint --recipe paper   # the paper's text

Recipe of Sukhbaatar et al. 2015 (§4.2): 3 hops, adjacent tying, PE, TE, RN (empty
memories inserted at rate 0.1, shifting the time index), linear start (LS), SGD with learning
rate 0.005 during LS (20 epochs per task, 30 joint), then the softmax phase (per task 100
epochs, lr halved every 25; joint 60 epochs, halved every 15), gradient-norm clipping 40,
batch 32, embedding 20 (per task) / 50 (joint), weights from N(0, 0.1), 10% of train held out
for validation. ``--recipe`` picks how three details are read; each has its own flag, which
overrides the recipe:

============================  ==========================  ===============================
detail                        ``code`` (default)          ``paper``
============================  ==========================  ===============================
PE formula (``--pe-form``)    released code: weights ≈ 1  paper §4.1: weights in [0, 1]
LS end (``--ls-patience``)    0: all 20 / 30 epochs       3: when the validation loss stalls
softmax-phase lr (``--lr``)   0.005                       0.01
============================  ==========================  ===============================

``code`` is the authors' released code, which produced the published tables. It is the
default because with the ``paper`` reading task 16 (basic induction) stays near 50% error;
the code's PE weights (about twice the paper's) and its full-length LS are both needed to
solve it (docs/results.md). The loss is summed over the batch (not averaged), the reading under which the
paper's learning rate trains at batch size 32. Batches group examples of similar story
length (``--random-batches`` for plain random batches), so padding can be trimmed. ``--optimizer adam`` swaps in Adam (mean loss, lr 0.01) as an option. Several
``--runs`` (alias ``--seeds``) keep, per task (or for the joint model), the run with the lowest
validation error (the paper: best of 10); every run's validation and mean test error is logged
and saved under ``run_summary`` (the test figures are reported only, never used to choose).

Writes ``results.json`` and ``results.md`` to ``--out`` (per-task test error beside the
published figure; a published per-task value not given in the sources is left blank).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from memnets.memories.memn2n import MemN2N
from memnets.tasks import babi

__all__ = ["RECIPES", "TrainConfig", "train_memn2n", "evaluate", "run", "merge", "main", "PUBLISHED_MEAN_ERROR"]

# Mean test error (%) of MemN2N PE LS RN, 3 hops, joint training on bAbI 1k (Sukhbaatar et
# al. 2015, Table 1). The per-task values of that table are not reproduced in the seed texts,
# so the per-task "published" column stays blank.
PUBLISHED_MEAN_ERROR = {"joint": 12.4}

# Two readings of the recipe (see the module docstring): the authors' released code and the paper's text.
RECIPES = {
    "code": {"pe_form": "code", "ls_patience": 0, "lr": 0.005},
    "paper": {"pe_form": "paper", "ls_patience": 3, "lr": 0.01},
}


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one MemN2N training run (defaults: the per-task ``code`` recipe,
    :data:`RECIPES`)."""

    embedding_dim: int = 20
    hops: int = 3
    memory_size: int = 50
    epochs: int = 100
    anneal_every: int = 25
    lr: float = 0.005
    ls_lr: float = 0.005
    linear_start: bool = True
    ls_max_epochs: int = 20
    ls_patience: int = 0
    max_minutes: float | None = None
    bucket: bool = True
    random_noise: float = 0.1
    max_grad_norm: float = 40.0
    batch_size: int = 32
    optimizer: str = "sgd"
    seed: int = 0
    pe_length: str = "sentence"
    pe_form: str = "code"


def _trim(stories: torch.Tensor, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop trailing padding slots / words shared by the whole batch (the output is unchanged:
    padding is masked; random noise grows the memory back into the model's free slots)."""
    n_mem = int((stories != 0).any(-1).sum(-1).max())
    n_words = max(int((stories != 0).sum(-1).max()), int((queries != 0).sum(-1).max()), 1)
    return stories[:, :max(n_mem, 1), :n_words], queries[:, :n_words]


def _batches(data: babi.BabiTensors, batch_size: int, gen: torch.Generator | None,
             bucket: bool = True) -> list[torch.Tensor]:
    """Index batches (shuffled when ``gen`` is given). With ``bucket``, batches hold examples
    of similar story length, so trimming the padding saves most of the work on mixed-length
    (joint) data; without, batches are plain random draws."""
    N = data.answers.shape[0]
    order = torch.randperm(N, generator=gen) if gen is not None else torch.arange(N)
    if not bucket:
        return list(torch.split(order, batch_size))
    lengths = (data.stories != 0).any(-1).sum(-1)
    order = order[torch.sort(lengths[order], stable=True).indices]
    batches = list(torch.split(order, batch_size))
    if gen is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=gen)]
    return batches


def evaluate(model: MemN2N, data: babi.BabiTensors, batch_size: int = 256) -> tuple[float, torch.Tensor]:
    """``(mean loss, correct [N] bool)`` of ``model`` on ``data`` (eval mode, no grad)."""
    model.eval()
    N = data.answers.shape[0]
    loss_sum, correct = 0.0, torch.zeros(N, dtype=torch.bool)
    with torch.no_grad():
        for idx in _batches(data, batch_size, None):
            logits = model(*_trim(data.stories[idx], data.queries[idx]))
            y = data.answers[idx]
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            correct[idx] = logits.argmax(-1) == y
    return loss_sum / max(N, 1), correct


def train_memn2n(train: babi.BabiTensors, valid: babi.BabiTensors, vocab_size: int, sentence_size: int,
                 cfg: TrainConfig, log=print) -> tuple[MemN2N, dict]:
    """Train one model: an LS phase (softmax removed, lr ``ls_lr``) that ends when the
    validation loss has not fallen for ``ls_patience`` epochs (0: never, the LS phase then lasts
    exactly ``ls_max_epochs``, as in the authors' released code) or after ``ls_max_epochs``, then
    ``epochs`` epochs with the softmax, lr halved every ``anneal_every``. Returns the state with
    the best validation accuracy after LS ended, and a history dict."""
    torch.manual_seed(cfg.seed)
    model = MemN2N(vocab_size, cfg.embedding_dim, cfg.hops, cfg.memory_size, sentence_size=sentence_size,
                   linear_start=cfg.linear_start, random_noise=cfg.random_noise, pe_length=cfg.pe_length,
                   pe_form=cfg.pe_form)
    adam = cfg.optimizer == "adam"
    opt = (torch.optim.Adam(model.parameters(), lr=cfg.lr) if adam
           else torch.optim.SGD(model.parameters(), lr=cfg.ls_lr if cfg.linear_start else cfg.lr))
    reduction = "mean" if adam else "sum"
    gen = torch.Generator().manual_seed(cfg.seed)
    N = train.answers.shape[0]
    best = (-1.0, math.inf, None)  # (valid acc, valid loss, state)
    best_ls_loss, ls_bad, ls_epochs, since_softmax = math.inf, 0, 0, 0
    history = []
    deadline = time.time() + 60.0 * cfg.max_minutes if cfg.max_minutes else math.inf
    epoch = 0
    while since_softmax < cfg.epochs and time.time() < deadline:
        epoch += 1
        if not model.linear_start:
            since_softmax += 1
        base = cfg.lr if not model.linear_start or adam else cfg.ls_lr
        lr = base * 0.5 ** ((since_softmax - 1) // cfg.anneal_every) if since_softmax else base
        for g in opt.param_groups:
            g["lr"] = lr
        model.train()
        total = 0.0
        for idx in _batches(train, cfg.batch_size, gen, cfg.bucket):
            logits = model(*_trim(train.stories[idx], train.queries[idx]))
            loss = F.cross_entropy(logits, train.answers[idx], reduction=reduction)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
            total += loss.item() * (idx.numel() if adam else 1)
        v_loss, v_correct = evaluate(model, valid)
        v_acc = float(v_correct.float().mean())
        history.append({"epoch": epoch, "lr": lr, "train_loss": total / N, "valid_loss": v_loss,
                        "valid_acc": v_acc, "linear_start": model.linear_start})
        if model.linear_start:
            ls_epochs += 1
            best_ls_loss, ls_bad = (v_loss, 0) if v_loss < best_ls_loss else (best_ls_loss, ls_bad + 1)
            if (cfg.ls_patience > 0 and ls_bad >= cfg.ls_patience) or ls_epochs >= cfg.ls_max_epochs:
                model.linear_start = False  # validation loss stopped falling: re-insert the softmax
                log(f"  epoch {epoch}: softmax re-inserted (linear start ended), valid acc {v_acc:.3f}")
        elif (v_acc, -v_loss) > (best[0], -best[1]):
            best = (v_acc, v_loss, {k: v.clone() for k, v in model.state_dict().items()})
        if epoch % 10 == 0:
            log(f"  epoch {epoch:3d} lr {lr:.5f} train {total / N:.4f} valid loss {v_loss:.4f} "
                f"acc {v_acc:.3f}")
    if time.time() >= deadline:
        log(f"  stopped by the time limit after epoch {epoch} ({since_softmax} with softmax)")
    if best[2] is not None:
        model.load_state_dict(best[2])
    model.linear_start = False
    return model, {"history": history, "best_valid_acc": best[0], "best_valid_loss": best[1]}


def _prepare(tasks: Sequence[int], data_dir, memory_size: int, valid_fraction: float, seed: int,
             ten_k: bool = False, fallback_1k: bool = False):
    train_ex = babi.load_joint("train", data_dir, ten_k=ten_k, fallback_1k=fallback_1k, tasks=tasks)
    if not train_ex:
        raise FileNotFoundError(f"no training data for tasks {list(tasks)} (ten_k={ten_k})")
    tasks = sorted({ex.task for ex in train_ex})
    test_ex = babi.load_joint("test", data_dir, tasks=tasks)
    vocab = babi.build_vocab(train_ex, test_ex)
    tr, va = babi.split_validation(train_ex, valid_fraction, seed)
    longest_story = max(len(ex.story) for ex in train_ex + test_ex)
    M = min(memory_size, longest_story)
    W = max([len(s) for ex in train_ex + test_ex for s in ex.story] + [len(ex.question) for ex in train_ex + test_ex])
    vec = lambda exs: babi.vectorize(exs, vocab, M, W)  # noqa: E731
    return vocab, vec(tr), vec(va), vec(test_ex), M, W


def run(tasks: Sequence[int], joint: bool, cfg: TrainConfig, runs: int = 1, data_dir=None,
        valid_fraction: float = 0.1, ten_k: bool = False, fallback_1k: bool = False, log=print,
        first_run: int = 0) -> dict:
    """Train per task (or jointly) and return ``{"tasks": {t: {...}}, "mean_error": ...}``.

    Run ``r`` (``first_run <= r < first_run + runs``) is seeded with ``cfg.seed + r``; the
    validation split always comes from ``cfg.seed``, so runs started in separate processes
    with different ``first_run`` share one split and can be merged with :func:`merge`.
    With ``ten_k`` the en-10k training files are used (task 3 is skipped, or read from the 1k
    file with ``fallback_1k``, since its 10k file is missing from the data)."""
    if ten_k and 3 in tasks and not fallback_1k:
        log("en-10k task 3 train file is missing from the data: skipping task 3")
        tasks = [t for t in tasks if t != 3]
    if not tasks:
        raise ValueError("`tasks` expected at least one bAbI task to train on, got none")
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"`runs` expected an integer >= 1 (runs per task / joint model), got {runs!r}")
    if isinstance(first_run, bool) or not isinstance(first_run, int) or first_run < 0:
        raise ValueError(f"`first_run` expected an integer >= 0, got {first_run!r}")
    groups = [list(tasks)] if joint else [[t] for t in tasks]
    results: dict = {"config": asdict(cfg), "joint": joint, "runs": runs, "first_run": first_run,
                     "ten_k": ten_k, "tasks": {}, "run_summary": {}}
    t0 = time.time()
    for group in groups:
        vocab, tr, va, te, M, W = _prepare(group, data_dir, cfg.memory_size, valid_fraction, cfg.seed,
                                           ten_k, fallback_1k)
        # The model keeps its full capacity (cfg.memory_size) even when every story here is
        # shorter (M slots): random noise shifts sentences into the slots beyond the longest
        # story instead of dropping the oldest ones.
        best = None
        key = "joint" if joint else str(group[0])
        results["run_summary"][key] = []
        for r in range(first_run, first_run + runs):
            log(f"tasks {group if joint else group[0]}: run {r + 1}/{first_run + runs}, {tr.answers.shape[0]} train, "
                f"vocab {len(vocab)}, memory {M}, sentence {W}")
            model, info = train_memn2n(tr, va, len(vocab), W, TrainConfig(**{**asdict(cfg), "seed": cfg.seed + r}), log)
            # the validation error (joint: over all tasks' held-out examples) decides the run
            _, v_ok = evaluate(model, va)
            v_err = 1.0 - float(v_ok.float().mean())
            _, t_ok = evaluate(model, te)  # reported only, never used for the choice
            t_mean = sum(1.0 - float(t_ok[te.tasks == t].float().mean()) for t in group) / len(group)
            summary = {"seed": cfg.seed + r, "valid_error": round(100.0 * v_err, 2),
                       "test_mean_error": round(100.0 * t_mean, 2), "epochs": len(info["history"]),
                       "test_error": {t: round(100.0 * (1.0 - float(t_ok[te.tasks == t].float().mean())), 2)
                                      for t in group}}
            results["run_summary"][key].append(summary)
            log(f"run {r + 1}/{first_run + runs}: " + json.dumps(summary))
            if best is None or v_err < best[0]:
                best = (v_err, model, v_ok, len(info["history"]))
        _, ok = evaluate(best[1], te)
        for t in group:
            sel, v_sel = te.tasks == t, va.tasks == t
            err = 100.0 * (1.0 - float(ok[sel].float().mean()))
            v_err = 100.0 * (1.0 - float(best[2][v_sel].float().mean()))
            results["tasks"][t] = {"name": babi.TASK_NAMES[t], "test_error": round(err, 2),
                                   "valid_error": round(v_err, 2), "epochs": best[3],
                                   "published_error": None}
            log(f"task {t:2d} {babi.TASK_NAMES[t]:26s} test error {err:6.2f}%")
    errs = [v["test_error"] for v in results["tasks"].values()]
    results["mean_error"] = round(sum(errs) / len(errs), 2)
    results["failed_tasks"] = sum(e > 5.0 for e in errs)
    results["published_mean_error"] = (PUBLISHED_MEAN_ERROR["joint"]
                                       if joint and len(errs) == 20 and not ten_k else None)
    results["wall_seconds"] = round(time.time() - t0, 1)
    return results


def merge(parts: Sequence[dict]) -> dict:
    """Combine the ``results.json`` of several invocations (e.g. seeds run in parallel with
    ``--first-run``) into one result that keeps, per model, the run with the lowest
    validation error, exactly as one invocation with all the runs would have.

    The parts must share the configuration apart from ``first_run``/``runs`` (same
    validation split seed, same tasks, same recipe); a mismatch raises ``ValueError``."""
    if not parts:
        raise ValueError("`parts` expected at least one results dict to merge, got none")
    base = dict(parts[0]["config"])
    for i, p in enumerate(parts[1:], 1):
        if p["config"] != base or p["joint"] != parts[0]["joint"] or p.get("ten_k") != parts[0].get("ten_k"):
            raise ValueError(f"`parts[{i}]` has a different configuration from `parts[0]`; "
                             "only runs of one recipe (same --seed, tasks and flags) can be merged")
    out: dict = {"config": base, "joint": parts[0]["joint"], "ten_k": parts[0].get("ten_k", False),
                 "tasks": {}, "run_summary": {}, "merged_from": len(parts)}
    for p in parts:
        for key, rows in p["run_summary"].items():
            out["run_summary"].setdefault(key, []).extend(rows)
    seeds = [r["seed"] for rows in out["run_summary"].values() for r in rows]
    runs_per_model = {key: len(rows) for key, rows in out["run_summary"].items()}
    out["runs"] = min(runs_per_model.values())
    names = {t: v["name"] for p in parts for t, v in p["tasks"].items()}
    for key, rows in out["run_summary"].items():
        if len({r["seed"] for r in rows}) != len(rows):
            raise ValueError(f"model {key!r} has the same seed twice in the parts (seeds {seeds}); "
                             "give each invocation its own --first-run")
        best = min(rows, key=lambda r: r["valid_error"])
        for t, err in best["test_error"].items():
            out["tasks"][str(t)] = {"name": names.get(str(t), babi.TASK_NAMES.get(int(t), "")),
                                    "test_error": err, "valid_error": None, "seed": best["seed"],
                                    "published_error": None}
    errs = [v["test_error"] for v in out["tasks"].values()]
    out["mean_error"] = round(sum(errs) / len(errs), 2)
    out["failed_tasks"] = sum(e > 5.0 for e in errs)
    out["published_mean_error"] = (PUBLISHED_MEAN_ERROR["joint"]
                                   if out["joint"] and len(errs) == 20 and not out["ten_k"] else None)
    out["wall_seconds"] = round(sum(p.get("wall_seconds", 0.0) for p in parts), 1)
    return out


def markdown_table(results: dict) -> str:
    """Per-task Markdown table of measured vs published test error (%)."""
    fmt = lambda v: "" if v is None else f"{v:.1f}"  # noqa: E731
    mode = "joint" if results["joint"] else "per task"
    size = "10k" if results.get("ten_k") else "1k"
    lines = [f"MemN2N PE LS RN, {results['config']['hops']} hops, bAbI {size}, {mode} "
             f"({results['config']['optimizer']}, best of {results['runs']} run(s))", "",
             "| task | name | test error % | published % |", "|---:|---|---:|---:|"]
    for t, v in sorted(results["tasks"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {t} | {v['name']} | {v['test_error']:.1f} | {fmt(v['published_error'])} |")
    lines.append(f"| mean | | {results['mean_error']:.1f} | {fmt(results['published_mean_error'])} |")
    lines.append(f"| failed (> 5%) | | {results['failed_tasks']} | |")
    summary = results.get("run_summary", {})
    if any(len(v) > 1 for v in summary.values()):
        lines += ["", "| model | seed | valid error % | mean test error % | epochs |", "|---|---:|---:|---:|---:|"]
        for key, rows in summary.items():
            lines += [f"| {key} | {r['seed']} | {r['valid_error']:.1f} | {r['test_mean_error']:.1f} | {r['epochs']} |"
                      for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m memnets.experiments.babi_memn2n", description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default="1", help="'all' or comma-separated task numbers (1-20)")
    p.add_argument("--joint", action="store_true", help="one model trained on all the given tasks")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--epochs", type=int, default=None, help="epochs after LS; default 100 per task, 60 joint")
    p.add_argument("--ls-max-epochs", type=int, default=None, help="longest LS phase; default 20 per task, 30 joint")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="code",
                   help="code (default): the authors' released code; paper: the paper's text. Sets "
                        "--pe-form, --ls-patience and --lr unless they are given")
    p.add_argument("--ls-patience", type=int, default=None,
                   help="end LS after this many epochs without a lower validation loss (0 = run all "
                        "--ls-max-epochs); recipe code: 0, paper: 3")
    p.add_argument("--lr", type=float, default=None,
                   help="SGD learning rate once the softmax is in; recipe code: 0.005, paper: 0.01")
    p.add_argument("--ls-lr", type=float, default=0.005, help="SGD learning rate during linear start")
    p.add_argument("--max-minutes", type=float, default=None, help="stop training a model after this long")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--random-batches", action="store_true",
                   help="plain random batches instead of batches of similar story length")
    p.add_argument("--anneal-every", type=int, default=None, help="default 25 per task, 15 joint")
    p.add_argument("--embedding-dim", type=int, default=None, help="default 20 per task, 50 joint")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--runs", "--seeds", dest="runs", type=int, default=1,
                   help="runs (seeds --seed, --seed+1, ...) per task or per joint model; the run with the "
                        "lowest validation error is kept (the paper: best of 10)")
    p.add_argument("--ten-k", action="store_true", help="train on en-10k (task 3 skipped: file missing)")
    p.add_argument("--fallback-1k", action="store_true", help="with --ten-k, use the 1k file for task 3")
    p.add_argument("--first-run", type=int, default=0,
                   help="index of the first run: runs --first-run .. --first-run + --runs - 1 use seeds "
                        "--seed + index, the validation split stays that of --seed (run the seeds of one "
                        "recipe in parallel processes, then --merge their outputs)")
    p.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                   help="combine the results.json of these output directories (best run on validation) "
                        "and write the merged table to --out; trains nothing")
    p.add_argument("--pe-length", choices=("sentence", "fixed"), default="sentence",
                   help="J of the position encoding: each sentence's length (paper text) or the longest "
                        "sentence for all (authors' code)")
    p.add_argument("--pe-form", choices=("code", "paper"), default=None,
                   help="PE formula: the authors' released code (weights around 1) or the paper's text "
                        "(weights in [0, 1], about half as large); default from --recipe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="directory for results.json / results.md")
    a = p.parse_args(argv)
    for k, v in RECIPES[a.recipe].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.merge:
        parts = []
        for d in a.merge:
            f = Path(d) / "results.json"
            if not f.is_file():
                p.error(f"--merge expected {f} (the results.json of a finished run), but it does not exist")
            parts.append(json.loads(f.read_text()))
        results = merge(parts)
        return _report(results, a.out)
    if a.first_run < 0:
        p.error(f"--first-run expected a value >= 0, got {a.first_run}")
    for name, ok, want in (("--ls-patience", a.ls_patience >= 0, ">= 0"), ("--lr", a.lr > 0, "> 0"),
                           ("--ls-lr", a.ls_lr > 0, "> 0"), ("--runs/--seeds", a.runs >= 1, ">= 1")):
        if not ok:
            p.error(f"{name} expected a value {want}, got {getattr(a, name[2:].split('/')[0].replace('-', '_'))}")
    torch.set_num_threads(a.threads)
    tasks = list(range(1, 21)) if a.tasks == "all" else [int(t) for t in a.tasks.split(",")]
    cfg = TrainConfig(
        embedding_dim=a.embedding_dim or (50 if a.joint else 20),
        epochs=a.epochs or (60 if a.joint else 100),
        anneal_every=a.anneal_every or (15 if a.joint else 25),
        ls_max_epochs=a.ls_max_epochs or (30 if a.joint else 20), max_minutes=a.max_minutes,
        batch_size=a.batch_size, bucket=not a.random_batches, optimizer=a.optimizer, seed=a.seed,
        ls_patience=a.ls_patience, lr=a.lr, ls_lr=a.ls_lr, pe_length=a.pe_length,
        pe_form=a.pe_form)
    results = run(tasks, a.joint, cfg, a.runs, a.data_dir, ten_k=a.ten_k, fallback_1k=a.fallback_1k,
                  log=lambda s: print(s, flush=True), first_run=a.first_run)
    return _report(results, a.out)


def _report(results: dict, out_dir: str | None) -> dict:
    """Print the table and write ``results.json`` / ``results.md`` to ``out_dir`` (if given)."""
    table = markdown_table(results)
    print(table)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2))
        (out / "results.md").write_text(table)
    return results


if __name__ == "__main__":
    main()
