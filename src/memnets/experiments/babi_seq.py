"""Train sequence memories (DNC, LSAM, NAM-Transformer; MemN2N beside them) on bAbI 1k (or
en-10k) and write a per-task test-error table.

    python -m memnets.experiments.babi_seq --models dnc,lsam,nam_transformer --tasks all \\
        --joint --max-minutes 8 --out runs/babi-seq
    python -m memnets.experiments.babi_seq --models lsam --tasks 1 --max-minutes 2 --out runs/babi-seq-t1
    python -m memnets.experiments.babi_seq --models dnc --tasks all --joint --ten-k --device cuda \
        --batch-size 128 --max-minutes 30 --out runs/babi-seq-10k

Input: each question becomes one word sequence, the story sentences oldest first (at most
``--max-sentences`` of the most recent ones, 50 by default as MemN2N's memory), each
followed by a ``.`` token, then the question words and a ``?`` token. The answer is
predicted from the output at that final ``?`` position, as one class among the answer
strings of the data (a task 8 / 19 list such as ``apple,milk`` is one class, as in
:mod:`memnets.tasks.babi`). Sequences are right-padded with id 0; a batch holds questions
of similar length and is cut to its longest sequence, and the output is read at each
sequence's own last position, so padding never reaches the prediction (the recurrent
memories run left to right; the NAM-Transformer masks padded keys).

Models (their public APIs only):

- ``dnc``: word embedding -> :class:`memnets.DNC` (LSTM controller) whose per-step output
  is the answer logits.
- ``lsam``: word embedding -> :class:`memnets.LSAM` -> Linear.
- ``nam_transformer``: word embedding -> :class:`memnets.TransformerEncoder` with NAM
  attention, learned positions, padding mask -> Linear.
- ``memn2n``: :func:`memnets.experiments.babi_memn2n.run` (3 hops, PE, LS, RN, its own SGD
  recipe) with the same time limit, so the table has its column from the same command.

Training (the sequence models): Adam, cross-entropy, gradient-norm clipping, batches of
similar length, 10% of train held out for validation (per task); each epoch is followed by a
validation pass and the state with the lowest validation error is kept. ``--max-minutes``
caps the training time of each model (per task with per-task training); the report says
how many epochs each model got. ``results.json`` and ``results.md`` go to ``--out``.

``--ten-k`` trains on en-10k (10,000 training questions per task; the test files are the same
1,000 per task). The en-10k task 3 train file is missing from the shared copy of the data,
so task 3 trains on its 1k file (a warning says so and the table marks it). ``--device``
(``auto``: CUDA when available) places the sequence models; MemN2N runs on the CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..memories.dnc import DNC
from ..memories.lsam import LSAM
from ..models.transformer import TransformerEncoder
from ..tasks import babi

__all__ = ["SEQ_MODELS", "MODELS", "SeqConfig", "SeqTensors", "SeqQA", "encode_sequences", "prepare",
           "train_model", "evaluate", "run", "markdown_table", "main"]

SEQ_MODELS = ("dnc", "lsam", "nam_transformer")
MODELS = SEQ_MODELS + ("memn2n",)
SENTENCE_END, QUESTION_END = ".", "?"
_TITLES = {"memn2n": "MemN2N", "dnc": "DNC", "lsam": "LSAM", "nam_transformer": "NAM-TF"}


@dataclass(frozen=True)
class SeqConfig:
    """Sizes and optimiser settings of one sequence-model run."""

    embedding_dim: int = 64
    hidden_size: int = 128          # LSAM width, DNC controller, Transformer d_model
    num_heads: int = 4              # LSAM and Transformer heads
    num_layers: int = 1             # LSAM layers (Transformer: 2 * num_layers)
    memory_slots: int = 32          # DNC
    word_size: int = 32             # DNC
    read_heads: int = 2             # DNC
    max_sentences: int = 50
    lr: float = 1e-3
    batch_size: int = 32
    epochs: int = 100
    max_minutes: float | None = None
    max_grad_norm: float = 10.0
    dropout: float = 0.0
    seed: int = 0


class SeqTensors(NamedTuple):
    """``tokens [N, L]`` (0 = padding, right-padded), ``lengths [N]``, ``answers [N]`` (class
    ids), ``tasks [N]`` (1-20)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    answers: torch.Tensor
    tasks: torch.Tensor


def encode_sequences(examples: Sequence[babi.BabiExample], vocab: babi.Vocabulary, answers: dict[str, int],
                     max_sentences: int = 50) -> SeqTensors:
    """Word sequences ``s_1 . s_2 . ... q ?`` of the ``max_sentences`` most recent sentences."""
    if max_sentences < 1:
        raise ValueError(f"`max_sentences` expected an integer >= 1, got {max_sentences!r}")
    if not examples:
        raise ValueError("`examples` expected at least one bAbI example, got none")
    seqs = []
    for ex in examples:
        words: list[str] = []
        for s in ex.story[-max_sentences:]:
            words.extend(s)
            words.append(SENTENCE_END)
        words.extend(ex.question)
        words.append(QUESTION_END)
        seqs.append(vocab.encode(words))
    L = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.tensor(s)
    try:
        ans = torch.tensor([answers[ex.answer] for ex in examples], dtype=torch.long)
    except KeyError as e:
        raise KeyError(f"answer {e.args[0]!r} is not among the {len(answers)} answer classes") from None
    return SeqTensors(tokens, torch.tensor([len(s) for s in seqs]), ans,
                      torch.tensor([ex.task for ex in examples], dtype=torch.long))


class SeqQA(nn.Module):
    """Word embedding + a sequence memory; ``forward(tokens [B, L], lengths [B]) -> logits
    [B, num_answers]`` read at position ``lengths - 1`` of each sequence."""

    def __init__(self, kind: str, vocab_size: int, num_answers: int, cfg: SeqConfig, max_len: int):
        super().__init__()
        if kind not in SEQ_MODELS:
            raise ValueError(f"`kind` expected one of {SEQ_MODELS}, got {kind!r}")
        self.kind = kind
        E, D = cfg.embedding_dim, cfg.hidden_size
        self.embed = nn.Embedding(vocab_size, E if kind != "nam_transformer" else D, padding_idx=0)
        if kind == "dnc":
            self.core = DNC(E, num_answers, memory_slots=cfg.memory_slots, word_size=cfg.word_size,
                            read_heads=cfg.read_heads, controller_size=D)
            self.head = None
        elif kind == "lsam":
            self.core = LSAM(E, D, num_heads=cfg.num_heads, num_layers=cfg.num_layers, dropout=cfg.dropout)
            self.head = nn.Linear(D, num_answers)
        else:
            self.core = TransformerEncoder(D, 2 * cfg.num_layers, cfg.num_heads, dropout=cfg.dropout,
                                           attention="nam", max_len=max_len)
            self.head = nn.Linear(D, num_answers)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"`tokens` expected int64 [B, L], got {tokens.dtype} {tuple(tokens.shape)}")
        x = self.embed(tokens)                                             # [B, L, E]
        if self.kind == "nam_transformer":
            y = self.core(x, tokens != 0)
        else:
            y = self.core(x)[0]                                            # [B, L, ·]
        last = y[torch.arange(tokens.shape[0]), lengths - 1]               # [B, ·]
        return last if self.head is None else self.head(last)


def _batches(data: SeqTensors, batch_size: int, gen: torch.Generator | None) -> list[torch.Tensor]:
    """Index batches of similar length (shuffled, batch order too, when ``gen`` is given)."""
    N = data.answers.shape[0]
    order = torch.randperm(N, generator=gen) if gen is not None else torch.arange(N)
    order = order[torch.sort(data.lengths[order], stable=True).indices]
    batches = list(torch.split(order, batch_size))
    if gen is not None:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=gen)]
    return batches


def _batch(data: SeqTensors, idx: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    lengths = data.lengths[idx]
    return data.tokens[idx, :int(lengths.max())].to(device), lengths.to(device)


def evaluate(model: nn.Module, data: SeqTensors, batch_size: int = 128) -> tuple[float, torch.Tensor]:
    """``(mean loss, correct [N] bool)`` of ``model`` on ``data`` (eval mode, no grad)."""
    model.eval()
    N = data.answers.shape[0]
    device = next(model.parameters()).device
    loss_sum, correct = 0.0, torch.zeros(N, dtype=torch.bool)
    with torch.no_grad():
        for idx in _batches(data, batch_size, None):
            logits = model(*_batch(data, idx, device))
            y = data.answers[idx].to(device)
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            correct[idx] = (logits.argmax(-1) == y).cpu()
    model.train()
    return loss_sum / max(N, 1), correct


def train_model(kind: str, train: SeqTensors, valid: SeqTensors, vocab_size: int, num_answers: int,
                cfg: SeqConfig, log=print, max_len: int | None = None,
                device: torch.device | str = "cpu") -> tuple[SeqQA, dict]:
    """Train one model with Adam until ``cfg.epochs`` or ``cfg.max_minutes``; returns the state
    with the lowest validation error and a history dict. ``max_len`` (the Transformer's
    position table; default: the longest train / valid sequence) must cover the test set too."""
    torch.manual_seed(cfg.seed)
    max_len = max_len or int(max(train.lengths.max(), valid.lengths.max()))
    model = SeqQA(kind, vocab_size, num_answers, cfg, max_len).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    deadline = time.time() + 60.0 * cfg.max_minutes if cfg.max_minutes else math.inf
    best = (math.inf, math.inf, None)  # (valid error, valid loss, state)
    history, steps, t0 = [], 0, time.time()
    for epoch in range(1, cfg.epochs + 1):
        total, n = 0.0, 0
        for idx in _batches(train, cfg.batch_size, gen):
            loss = F.cross_entropy(model(*_batch(train, idx, device)), train.answers[idx].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
            total, n, steps = total + float(loss.detach()) * idx.numel(), n + idx.numel(), steps + 1
            if time.time() >= deadline:
                break
        v_loss, v_ok = evaluate(model, valid)
        v_err = 1.0 - float(v_ok.float().mean())
        history.append({"epoch": epoch, "steps": steps, "train_loss": total / max(n, 1), "valid_loss": v_loss,
                        "valid_error": v_err, "seconds": round(time.time() - t0, 1), "complete": n == len(train.answers)})
        log(f"  {kind} epoch {epoch:3d} train loss {total / max(n, 1):.4f} valid loss {v_loss:.4f} "
            f"valid error {100 * v_err:5.1f}% ({time.time() - t0:.0f} s)")
        if (v_err, v_loss) < best[:2]:
            best = (v_err, v_loss, {k: v.clone() for k, v in model.state_dict().items()})
        if time.time() >= deadline:
            log(f"  {kind}: stopped by the time limit in epoch {epoch} after {steps} steps")
            break
    model.load_state_dict(best[2])
    return model, {"history": history, "steps": steps, "epochs": len(history), "best_valid_error": best[0],
                   "train_seconds": round(time.time() - t0, 1),
                   "parameters": sum(p.numel() for p in model.parameters())}


def prepare(tasks: Sequence[int], data_dir=None, max_sentences: int = 50, valid_fraction: float = 0.1,
            seed: int = 0, ten_k: bool = False):
    """``(vocab, answers, train, valid, test)`` for ``tasks`` of bAbI en (1k), or en-10k with
    ``ten_k`` (a missing en-10k file falls back to the 1k file, with a warning)."""
    train_ex = babi.load_joint("train", data_dir, tasks=tasks, ten_k=ten_k, fallback_1k=True)
    test_ex = babi.load_joint("test", data_dir, tasks=tasks, ten_k=ten_k, fallback_1k=True)
    base = babi.build_vocab(train_ex, test_ex)
    vocab = babi.Vocabulary(base.itos[1:] + [SENTENCE_END, QUESTION_END])
    answers = {a: i for i, a in enumerate(sorted({ex.answer for ex in train_ex + test_ex}))}
    tr, va = babi.split_validation(train_ex, valid_fraction, seed)
    enc = lambda exs: encode_sequences(exs, vocab, answers, max_sentences)  # noqa: E731
    return vocab, answers, enc(tr), enc(va), enc(test_ex)


def _run_seq(kind: str, groups: list[list[int]], cfg: SeqConfig, data_dir, log, ten_k: bool = False,
             device: torch.device | str = "cpu") -> dict:
    out: dict = {"tasks": {}, "runs": []}
    for group in groups:
        vocab, answers, tr, va, te = prepare(group, data_dir, cfg.max_sentences, seed=cfg.seed, ten_k=ten_k)
        log(f"{kind}, tasks {group}: {len(tr.answers)} train, {len(te.answers)} test, vocab {len(vocab)}, "
            f"{len(answers)} answers, longest sequence {int(tr.lengths.max())}")
        max_len = int(max(tr.lengths.max(), va.lengths.max(), te.lengths.max()))
        model, info = train_model(kind, tr, va, len(vocab), len(answers), cfg, log, max_len, device)
        _, ok = evaluate(model, te)
        out["runs"].append({"tasks": group, **{k: v for k, v in info.items() if k != "history"},
                            "history": info["history"]})
        for t in group:
            sel = te.tasks == t
            per_task_chance = 1.0 / len({int(a) for a in te.answers[sel]})
            err = 100.0 * (1.0 - float(ok[sel].float().mean()))
            out["tasks"][t] = {"name": babi.TASK_NAMES[t], "test_error": round(err, 2),
                               "epochs": info["epochs"], "steps": info["steps"],
                               "uniform_guess_error": round(100.0 * (1.0 - per_task_chance), 1)}
            log(f"{kind} task {t:2d} {babi.TASK_NAMES[t]:26s} test error {err:6.2f}%")
    return out


def run(models: Sequence[str], tasks: Sequence[int], joint: bool, cfg: SeqConfig, data_dir=None, log=print,
        on_model=None, ten_k: bool = False, device: torch.device | str = "cpu") -> dict:
    """Train every model of ``models`` (per task, or one model on all ``tasks`` with ``joint``);
    returns ``{"models": {name: {"tasks": {t: {"test_error", ...}}, "mean_error", ...}}}``.
    ``on_model(results)`` is called after each model (the CLI saves the results so far).
    ``ten_k`` trains on en-10k (task 3 from its 1k file); ``device`` places the sequence models."""
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        raise ValueError(f"`models` expected names from {MODELS}, got {list(models)!r}")
    bad = [t for t in tasks if t not in babi.TASK_NAMES]
    if bad or not tasks:
        raise ValueError(f"`tasks` expected bAbI task numbers in 1..20, got {list(tasks)!r}")
    groups = [list(tasks)] if joint else [[t] for t in tasks]
    results: dict = {"config": asdict(cfg), "joint": joint, "tasks": list(tasks), "models": {},
                     "data": "en-10k" if ten_k else "en", "device": str(device),
                     "task3_from_1k": bool(ten_k and 3 in tasks)}
    for m in models:
        t0 = time.time()
        if m == "memn2n":
            from . import babi_memn2n
            mcfg = babi_memn2n.TrainConfig(embedding_dim=50 if joint else 20, epochs=60 if joint else 100,
                                           anneal_every=15 if joint else 25, ls_max_epochs=30 if joint else 20,
                                           max_minutes=cfg.max_minutes, seed=cfg.seed)
            r = babi_memn2n.run(list(tasks), joint, mcfg, data_dir=data_dir, log=log, ten_k=ten_k, fallback_1k=True)
            res = {"tasks": {int(t): {k: v[k] for k in ("name", "test_error", "epochs")}
                             for t, v in r["tasks"].items()}, "config": r["config"]}
        else:
            res = _run_seq(m, groups, cfg, data_dir, log, ten_k, device)
        errs = [v["test_error"] for v in res["tasks"].values()]
        res["mean_error"] = round(sum(errs) / len(errs), 2)
        res["failed_tasks"] = sum(e > 5.0 for e in errs)
        res["wall_seconds"] = round(time.time() - t0, 1)
        results["models"][m] = res
        if on_model is not None:
            on_model(results)
    return results


def markdown_table(results: dict) -> str:
    """Per-task test error (%) with one column per model, plus mean and failed (> 5%) rows."""
    models = list(results["models"])
    mode = "joint" if results["joint"] else "per task"
    minutes = results["config"].get("max_minutes")
    data = "en-10k" if results.get("data") == "en-10k" else "en (1k)"
    note = " (task 3 trained on its 1k file: the en-10k one is missing)" if results.get("task3_from_1k") else ""
    lines = [f"bAbI {data}, {mode}, test error %{note} "
             f"({'at most ' + format(minutes, 'g') + ' min of training per model' if minutes else 'no time limit'})", "",
             "| task | name | " + " | ".join(_TITLES.get(m, m) for m in models) + " |",
             "|---:|---|" + "---:|" * len(models)]
    for t in results["tasks"]:
        cells = [results["models"][m]["tasks"].get(t, results["models"][m]["tasks"].get(str(t))) for m in models]
        lines.append(f"| {t} | {babi.TASK_NAMES[t]} | "
                     + " | ".join("" if c is None else f"{c['test_error']:.1f}" for c in cells) + " |")
    lines.append("| mean | | " + " | ".join(f"{results['models'][m]['mean_error']:.1f}" for m in models) + " |")
    lines.append("| failed (> 5%) | | " + " | ".join(str(results['models'][m]['failed_tasks']) for m in models) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m memnets.experiments.babi_seq", description=__doc__.split("\n")[0])
    p.add_argument("--models", default="dnc,lsam,nam_transformer", help=f"comma-separated, from {MODELS}")
    p.add_argument("--tasks", default="1", help="'all' or comma-separated task numbers (1-20)")
    p.add_argument("--joint", action="store_true", help="one model per kind trained on all the given tasks")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--max-minutes", type=float, default=None, help="training time limit per model (per task)")
    for f in SeqConfig.__dataclass_fields__.values():
        if f.name in ("max_minutes",):
            continue
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ten-k", action="store_true", help="train on en-10k (task 3 from its 1k file)")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    p.add_argument("--out", default=None, help="directory for results.json / results.md")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from ..train.env import resolve_device
    try:
        device = resolve_device(a.device)
    except ValueError as e:
        p.error(f"--device: {e}")
    try:
        tasks = list(range(1, 21)) if a.tasks == "all" else [int(t) for t in a.tasks.split(",")]
    except ValueError:
        p.error(f"--tasks expected 'all' or comma-separated integers, got {a.tasks!r}")
    cfg = SeqConfig(**{k: getattr(a, k) for k in SeqConfig.__dataclass_fields__})
    def save(results: dict) -> None:
        if a.out:
            out = Path(a.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "results.json").write_text(json.dumps(results, indent=2))
            (out / "results.md").write_text(markdown_table(results))

    results = run([m.strip() for m in a.models.split(",") if m.strip()], tasks, a.joint, cfg, a.data_dir,
                  log=lambda s: print(s, flush=True), on_model=save, ten_k=a.ten_k, device=device)
    print(markdown_table(results))
    return results


if __name__ == "__main__":
    main()
