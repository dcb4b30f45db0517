"""bAbI question answering as engine tasks (docs/maths.md §9, §11, docs/babi.md): ``babi``, End-to-End
Memory Networks on the stories as sentence memories, and ``babi_seq``, sequence memories (DNC,
LSAM, NAM-Transformer) reading each question as one word sequence (:mod:`memnets.tasks.babi`;
the data are read from ``--data-dir`` / ``$MEMNETS_DATA`` / ``../shared/data``).

``babi_seq``: the story sentences, oldest first (at most ``task.options.max_sentences``, 50,
of the most recent ones), each followed by ``.``, then the question and ``?``; the answer (one
class among the answer strings) is read at the final ``?``. ``model.backbone``: ``dnc`` (word
embedding -> DNC with an LSTM controller of ``d_model`` whose output is the logits), ``lsam``
(embedding -> LSAM of width ``d_model`` -> Linear) or ``nam_transformer`` (embedding ->
Transformer encoder of width ``d_model`` with NAM attention, ``2 num_layers`` layers, padding
mask -> Linear); ``model.options``: ``embedding_dim`` (64), ``num_heads`` (4), ``num_layers``
(1), ``memory_slots`` (32), ``word_size`` (32), ``read_heads`` (2), ``dropout`` (0). Adam,
mean cross-entropy, gradient-norm clip 10, batches of similar length; the reported epoch has
the lowest validation error (ties: the lower loss); ``task.options``: ``tasks``, ``ten_k`` (a
missing en-10k file falls back to the 1k file), ``valid_fraction``, ``split_seed``,
``max_sentences``.

One run trains one model on ``task.options.tasks`` (one task: per-task training; several: a
joint model). The recipe of Sukhbaatar et al. 2015 (§4.2) as the authors' released code ran
it: ``model.backbone = "memn2n"``, ``model.d_model`` the embedding (20 per task, 50 joint),
``model.options``: ``hops`` (3), ``memory_size`` (50), ``random_noise`` (0.1: empty memories
inserted during training), ``pe_length`` (``sentence`` or ``fixed``), ``pe_form`` (``code``:
the released code's position-encoding weights, or ``paper``), ``init_std`` (0.1). Linear
start (LS): the run starts without the attention softmax at lr ``task.options.ls_lr``; LS ends
after ``ls_max_epochs`` epochs, or earlier when the validation loss has not fallen for
``ls_patience`` epochs (0: never earlier); then ``softmax_epochs`` epochs at ``optim.lr``,
halved every ``anneal_every``. ``epochs`` must be at least ``ls_max_epochs + softmax_epochs``
(the run ends when the recipe is complete). SGD (``optim.kind = "sgd"``) on the loss summed
over the batch, gradient-norm clip 40, batch 32 of examples of similar story length
(``bucket``), padding trimmed. ``optim.kind = "adam"`` uses the mean loss.

Task settings (``task.options``): ``tasks`` (list of 1-20), ``ten_k`` (en-10k training files;
task 3 is skipped unless ``fallback_1k``), ``valid_fraction`` (0.1 of each task's training
examples held out), ``split_seed`` (0: the held-out examples, the same for every seed), the LS
settings above and ``bucket`` (true).

Splits: ``valid`` (the held-out examples; evaluated every epoch; it picks the reported model:
the highest accuracy after LS ended, ties by the lower loss) and the ``test`` set, scored once
with the reported model. Metrics per split: ``accuracy``, ``error`` (%), ``loss``, ``n``,
``linear_start`` (1 during LS) and ``task_error`` (``{task: error %}``).

``results.json``: the common schema (:func:`memnets.train.task.common_results`; ``family`` =
``"babi"``, ``metric`` = ``"accuracy"``) plus ``test`` (``{"test": metrics}`` of the reported
model), ``tasks`` (``{task: {"name", "test_error", "valid_error"}}``), ``mean_error``,
``failed_tasks`` (test error above 5%), ``published_mean_error`` (12.4 for the 20-task joint 1k
model, else null), ``ten_k`` and ``softmax_from_epoch`` (the epoch at which LS ended).
``babi_seq`` runs write the same keys (no ``softmax_from_epoch``). ``memnets table`` prints the
per-task test error of every model kind (columns) for each training mode and data size,
keeping per task (or per joint model) the seed with the lowest validation error.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ..data import derive_seed
from ..task import RunSummary, Task, common_results
from ._common import all_reduce_sum, check_options, decided_by_part

__all__ = ["MemN2NTask", "SeqTask", "SeqQA", "PUBLISHED_MEAN_ERROR", "prepare", "prepare_seq", "trim", "batches",
           "encode_sequences"]

# Mean test error (%) of MemN2N PE LS RN, 3 hops, joint training on bAbI 1k (Sukhbaatar et
# al. 2015, Table 1); the per-task values of that table are not given in the sources.
PUBLISHED_MEAN_ERROR = {"joint": 12.4}

TASK_OPTIONS = {"tasks": list(range(1, 21)), "ten_k": False, "fallback_1k": False, "valid_fraction": 0.1,
                "split_seed": 0, "ls_max_epochs": 20, "ls_patience": 0, "ls_lr": 0.005, "softmax_epochs": 100,
                "anneal_every": 25, "bucket": True}
MODEL_OPTIONS = {"hops": 3, "memory_size": 50, "random_noise": 0.1, "pe_length": "sentence", "pe_form": "code",
                 "init_std": 0.1}


def trim(stories: torch.Tensor, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop trailing padding slots / words shared by the whole batch (the output is unchanged:
    padding is masked; random noise grows the memory back into the model's free slots)."""
    n_mem = int((stories != 0).any(-1).sum(-1).max())
    n_words = max(int((stories != 0).sum(-1).max()), int((queries != 0).sum(-1).max()), 1)
    return stories[:, :max(n_mem, 1), :n_words], queries[:, :n_words]


def batches(data, batch_size: int, gen: torch.Generator | None, bucket: bool = True) -> list[torch.Tensor]:
    """Index batches (shuffled when ``gen`` is given). With ``bucket``, batches hold examples
    of similar story length, so trimming the padding saves most of the work on mixed-length
    (joint) data; without, batches are plain random draws."""
    N = data.answers.shape[0]
    order = torch.randperm(N, generator=gen) if gen is not None else torch.arange(N)
    if not bucket:
        return list(torch.split(order, batch_size))
    lengths = (data.stories != 0).any(-1).sum(-1)
    order = order[torch.sort(lengths[order], stable=True).indices]
    out = list(torch.split(order, batch_size))
    if gen is not None:
        out = [out[i] for i in torch.randperm(len(out), generator=gen)]
    return out


def _evaluate_qa(model, data, index_batches, forward, tasks: list[int], *, device, info,
                 autocast=contextlib.nullcontext, extra: dict | None = None) -> dict[str, Any]:
    """The metrics of one bAbI split (``data``: ``answers`` and ``tasks`` per example) for both
    task kinds: ``forward(idx)`` gives the logits of the examples ``idx`` (this process's share
    of each of ``index_batches``). ``{"accuracy", "error" (%), "loss", "n", **extra,
    "task_error": {task: error %}}``, counted over every DDP process."""
    was = model.training
    model.eval()
    col = {t: i for i, t in enumerate(tasks)}
    tot = torch.zeros(3 + 2 * len(tasks), dtype=torch.float64)  # correct, loss sum, n, per task (correct, n)
    for idx in index_batches:
        idx = idx[info.rank::info.world]
        if idx.numel() == 0:
            continue
        y = data.answers[idx].to(device)
        with autocast():
            logits = forward(idx).float()
        ok = (logits.argmax(-1) == y).cpu()
        tot[0] += float(ok.sum())
        tot[1] += float(F.cross_entropy(logits, y, reduction="sum"))
        tot[2] += idx.numel()
        for t in data.tasks[idx].unique().tolist():
            m = data.tasks[idx] == t
            tot[3 + 2 * col[t]] += float(ok[m].sum())
            tot[4 + 2 * col[t]] += float(m.sum())
    tot = all_reduce_sum(tot, info, device)
    model.train(was)
    c = tot.tolist()
    n = max(c[2], 1)
    return {"accuracy": c[0] / n, "error": round(100.0 * (1 - c[0] / n), 2), "loss": c[1] / n, "n": int(c[2]),
            **(extra or {}),
            "task_error": {str(t): round(100.0 * (1 - c[3 + 2 * i] / max(c[4 + 2 * i], 1)), 2)
                           for i, t in enumerate(tasks)}}


_DATA: dict[tuple, tuple] = {}


def prepare(tasks, memory_size: int, valid_fraction: float, seed: int, ten_k: bool = False,
            fallback_1k: bool = False, data_dir=None) -> tuple:
    """``(vocab, train, valid, test, M, W)``: the vocabulary, the vectorised splits, the memory
    slots and the sentence width (kept in memory for the next call with the same arguments)."""
    from ...tasks import babi

    key = (tuple(tasks), memory_size, valid_fraction, seed, ten_k, fallback_1k, str(data_dir))
    if key in _DATA:
        return _DATA[key]
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
    out = (vocab, babi.vectorize(tr, vocab, M, W), babi.vectorize(va, vocab, M, W), babi.vectorize(test_ex, vocab, M, W),
           M, W)
    _DATA.clear()
    _DATA[key] = out
    return out


class MemN2NTask(Task):
    """``babi``: MemN2N on bAbI (see the module docstring)."""

    family = "babi"
    metric = "accuracy"

    def options(self, cfg) -> tuple[dict, dict]:
        return {**MODEL_OPTIONS, **cfg.model.options}, {**TASK_OPTIONS, **cfg.task.options}

    def tasks(self, cfg) -> list[int]:
        to = self.options(cfg)[1]
        tasks = [int(t) for t in to["tasks"]]
        if to["ten_k"] and 3 in tasks and not to["fallback_1k"]:
            tasks = [t for t in tasks if t != 3]  # the en-10k task 3 train file is missing from the data
        return tasks

    def validate(self, cfg) -> None:
        from ..config import ConfigError

        check_options(self.name, ("model.options", MODEL_OPTIONS, cfg.model.options),
                      ("task.options", TASK_OPTIONS, cfg.task.options))
        if cfg.model.backbone != "memn2n":
            raise ConfigError(f"`model.backbone` of the {self.name!r} task expected 'memn2n', got {cfg.model.backbone!r}")
        mo, to = self.options(cfg)
        tasks = to["tasks"]
        if not isinstance(tasks, (list, tuple)) or not tasks or not all(isinstance(t, int) and 1 <= t <= 20
                                                                       for t in tasks):
            raise ConfigError(f"`task.options.tasks` expected a list of bAbI task numbers 1-20, got {tasks!r}")
        if not self.tasks(cfg):
            raise ConfigError("`task.options.tasks`: no task left to train on (en-10k has no task 3 file)")
        if set(cfg.task.splits) != {"valid"} or cfg.select_split != "valid":
            raise ConfigError(f"the {self.name!r} task selects on its validation split: set task.splits = "
                              "{ valid = [1, 1] } and select_split = \"valid\"")
        if cfg.eval_every != 1:
            raise ConfigError(f"the {self.name!r} task needs eval_every = 1 (linear start and the model choice "
                              f"follow the validation loss of every epoch), got {cfg.eval_every}")
        if cfg.optim.kind not in ("sgd", "adam"):
            raise ConfigError(f"`optim.kind` of the {self.name!r} task expected 'sgd' or 'adam', got {cfg.optim.kind!r}")
        for k in ("ls_max_epochs", "softmax_epochs", "anneal_every"):
            if not isinstance(to[k], int) or to[k] < 1:
                raise ConfigError(f"`task.options.{k}` expected an integer >= 1, got {to[k]!r}")
        if not isinstance(to["ls_patience"], int) or to["ls_patience"] < 0:
            raise ConfigError(f"`task.options.ls_patience` expected an integer >= 0, got {to['ls_patience']!r}")
        if cfg.epochs < to["ls_max_epochs"] + to["softmax_epochs"]:
            raise ConfigError(f"`epochs` ({cfg.epochs}) must be >= task.options.ls_max_epochs + softmax_epochs "
                              f"({to['ls_max_epochs'] + to['softmax_epochs']})")

    def data(self, cfg) -> tuple:
        mo, to = self.options(cfg)
        return prepare(self.tasks(cfg), mo["memory_size"], to["valid_fraction"], to["split_seed"], to["ten_k"],
                       to["fallback_1k"])

    def build_model(self, cfg) -> torch.nn.Module:
        from ...memories.memn2n import MemN2N

        mo, _ = self.options(cfg)
        vocab, _, _, _, _, W = self.data(cfg)
        return MemN2N(len(vocab), cfg.model.d_model, mo["hops"], mo["memory_size"], sentence_size=W,
                      linear_start=True, random_noise=mo["random_noise"], init_std=mo["init_std"],
                      pe_length=mo["pe_length"], pe_form=mo["pe_form"])

    def probe_loss(self, model, cfg, device):
        _, tr, *_ = self.data(cfg)
        return model(*trim(tr.stories[:2].to(device), tr.queries[:2].to(device))).float().sum()

    # ---------------------------------------------------------------- data
    def steps_per_epoch(self, cfg) -> int:
        return math.ceil(self.data(cfg)[1].answers.shape[0] / cfg.batch_size)

    def train_data(self, cfg, epoch: int):
        _, tr, *_ = self.data(cfg)
        g = torch.Generator().manual_seed(derive_seed(cfg.seed, "train", epoch))
        return tr, batches(tr, cfg.batch_size, g, self.options(cfg)[1]["bucket"])

    def train_batch(self, cfg, data, epoch, b, rank=0, world=1):
        tr, bs = data
        idx = bs[b][rank::world]
        stories, queries = trim(tr.stories[idx], tr.queries[idx])
        return stories, queries, tr.answers[idx], world

    def train_step(self, net, batch, cfg, device, autocast=contextlib.nullcontext):
        stories, queries, answers, world = batch
        stories, queries, answers = stories.to(device), queries.to(device), answers.to(device)
        with autocast():
            logits = net(stories, queries)
        logits = logits.float()
        if cfg.optim.kind == "sgd":  # summed over the batch (under DDP: the global batch's sum)
            loss = F.cross_entropy(logits, answers, reduction="sum") * world
        else:
            loss = F.cross_entropy(logits, answers)
        return loss, lambda: {"acc": (logits.detach().argmax(-1) == answers).float().mean()}

    def eval_splits(self, cfg) -> dict[str, Any]:
        return {"valid": self.data(cfg)[2]}

    def test_splits(self, cfg) -> dict[str, Any]:
        return {"test": self.data(cfg)[3]}

    def sample(self, cfg, seed: int = 0, split: str | None = None):
        te = self.data(cfg)[3]
        i = seed % te.answers.shape[0]
        return te.stories[i:i + 1], te.queries[i:i + 1]

    @torch.no_grad()
    def evaluate(self, model, data, cfg, *, device, info, autocast=contextlib.nullcontext):
        def forward(idx):
            s, q = trim(data.stories[idx], data.queries[idx])
            return model(s.to(device), q.to(device))

        return _evaluate_qa(model, data, batches(data, 256, None), forward, self.tasks(cfg), device=device, info=info,
                            autocast=autocast,
                            extra={"linear_start": float(bool(getattr(model, "linear_start", False)))})

    # ---------------------------------------------------------------- the recipe
    def selection_key(self, evals, cfg) -> tuple:
        v = evals[cfg.select_split]
        loss = v.get("loss")
        return (1.0 - v.get("linear_start", 0.0), v["accuracy"],
                -loss if loss is not None and math.isfinite(loss) else -math.inf)

    def selection_rule(self, cfg) -> str:
        return (f"highest {cfg.select_split} accuracy after linear start, ties by the lower {cfg.select_split} "
                f"loss, then the {cfg.select_ties} evaluation")

    def decided_by(self, evals, chosen, cfg):
        return decided_by_part([self.selection_key(e, cfg) for e in evals], chosen,
                               ("linear start", f"{cfg.select_split} accuracy", f"{cfg.select_split} loss"))

    def init_state(self, cfg) -> dict:
        _, to = self.options(cfg)
        return {"linear_start": True, "ls_epochs": 0, "best_ls_loss": None, "ls_bad": 0, "softmax_from": None,
                "ls_patience": to["ls_patience"], "ls_max_epochs": to["ls_max_epochs"],
                "softmax_epochs": to["softmax_epochs"]}

    def restore(self, model, state) -> None:
        model.linear_start = bool(state["linear_start"])

    def step_signature(self, model, state):
        return bool(getattr(model, "linear_start", False))  # linear start drops the softmax

    def lr_factor(self, cfg, epoch, step, state) -> float:
        _, to = self.options(cfg)
        if state["linear_start"]:
            return 1.0 if cfg.optim.kind == "adam" else to["ls_lr"] / cfg.optim.lr
        return 0.5 ** ((epoch - state["softmax_from"]) // to["anneal_every"])

    def after_evaluation(self, model, evals, state, epoch) -> None:
        if not state["linear_start"]:
            return
        loss = evals["valid"]["loss"]
        state["ls_epochs"] += 1
        if state["best_ls_loss"] is None or loss < state["best_ls_loss"]:
            state["best_ls_loss"], state["ls_bad"] = loss, 0
        else:
            state["ls_bad"] += 1
        patience, max_epochs = state["ls_patience"], state["ls_max_epochs"]
        if (patience > 0 and state["ls_bad"] >= patience) or state["ls_epochs"] >= max_epochs:
            state["linear_start"] = False  # re-insert the softmax
            state["softmax_from"] = int(math.ceil(epoch))
            model.linear_start = False

    def should_stop(self, state, epoch) -> bool:
        return not state["linear_start"] and epoch - state["softmax_from"] >= state["softmax_epochs"]

    def before_test(self, model) -> None:
        model.linear_start = False

    def progress(self, evals) -> str:
        v = evals["valid"]
        return f"valid accuracy {v['accuracy']:.3f} loss {v['loss']:.4f}" + (" (linear start)" if v["linear_start"] else "")

    # ---------------------------------------------------------------- results and table
    def results(self, cfg, s: RunSummary) -> dict[str, Any]:
        from ...tasks import babi

        _, to = self.options(cfg)
        tasks = self.tasks(cfg)
        test = (s.test or {}).get("test") or {}
        valid = (s.best.get("splits") or {}).get("valid") or {}
        per = {str(t): {"name": babi.TASK_NAMES[t], "test_error": test.get("task_error", {}).get(str(t)),
                        "valid_error": valid.get("task_error", {}).get(str(t))} for t in tasks}
        errs = [v["test_error"] for v in per.values() if v["test_error"] is not None]
        mean = round(sum(errs) / len(errs), 2) if errs else None
        joint = len(tasks) > 1
        return {**common_results(self, cfg, s), "test": s.test, "tasks": per, "joint": joint, "mean_error": mean,
                "failed_tasks": sum(e > 5.0 for e in errs),
                "published_mean_error": PUBLISHED_MEAN_ERROR["joint"] if joint and len(tasks) == 20
                and not to["ten_k"] else None, "ten_k": bool(to["ten_k"]),
                "softmax_from_epoch": (s.task_state or {}).get("softmax_from"),
                "task3_from_1k": bool(to["ten_k"] and to.get("fallback_1k") and 3 in tasks)}

    @classmethod
    def format_table(cls, results: list[dict], metric: str | None = None) -> str:
        return babi_table(results)


TITLES = {"memn2n": "MemN2N", "dnc": "DNC", "lsam": "LSAM", "nam_transformer": "NAM-TF"}


def babi_table(results: list[dict]) -> str:
    """Per-task test error (%) of bAbI runs: one table per training mode (per task / joint)
    and data size (1k / 10k), one column per model kind; per task (or per joint model) the
    run with the lowest validation error is kept, the paper's choice among seeds."""
    from ...tasks import babi

    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((bool(r.get("joint")), bool(r.get("ten_k"))), []).append(r)
    out = []
    for (joint, ten_k), rs in sorted(groups.items()):
        models: list[str] = []
        best: dict[tuple, tuple[float, dict]] = {}
        for r in rs:  # one model per (kind, task set): keep the lowest validation error
            m = str(r.get("model"))
            models += [m] if m not in models else []
            key = (m, tuple(sorted(r.get("tasks") or {}, key=int)))
            v = 1.0 - float(((r.get("splits") or {}).get("valid") or {}).get("accuracy", 0.0))
            if key not in best or v < best[key][0]:
                best[key] = (v, r)
        order = list(TITLES)
        models.sort(key=lambda m: order.index(m) if m in order else len(order))
        cells: dict[tuple[int, str], float | None] = {}
        seeds: dict[str, set] = {}
        for (m, _), (_, r) in best.items():
            for t, v in (r.get("tasks") or {}).items():
                cells[(int(t), m)] = v.get("test_error")
        for r in rs:
            seeds.setdefault(str(r.get("model")), set()).add(r.get("seed", 0))
        tasks = sorted({t for t, _ in cells})
        pub = next((r.get("published_mean_error") for _, r in best.values() if r.get("published_mean_error")), None)
        head = ", ".join(f"{TITLES.get(m, m)} seeds {', '.join(map(str, sorted(seeds[m])))}" for m in models)
        lines = [f"bAbI {'en-10k' if ten_k else 'en (1k)'}, {'joint' if joint else 'per task'}, test error % "
                 f"({head}; per {'model' if joint else 'task'} the seed with the lowest validation error)", "",
                 "| task | name | " + " | ".join(TITLES.get(m, m) for m in models) + " |",
                 "|---:|---|" + "---:|" * len(models)]
        for t in tasks:
            row = [cells.get((t, m)) for m in models]
            lines.append(f"| {t} | {babi.TASK_NAMES.get(t, '')} | "
                         + " | ".join("–" if e is None else f"{e:.1f}" for e in row) + " |")
        means, failed = [], []
        for m in models:
            errs = [cells[(t, m)] for t in tasks if cells.get((t, m)) is not None]
            means.append(f"{sum(errs) / len(errs):.1f}" if errs else "–")
            failed.append(str(sum(e > 5.0 for e in errs)) if errs else "–")
        lines.append("| mean | | " + " | ".join(means) + " |")
        lines.append("| failed (> 5%) | | " + " | ".join(failed) + " |")
        if pub is not None:
            lines += ["", f"Published mean test error of MemN2N (joint, 1k): {pub:.1f}%."]
        if any(r.get("task3_from_1k") for r in rs):
            lines += ["", "Task 3 trained on its 1k file (the en-10k one is missing from the data)."]
        out.append("\n".join(lines))
    return "\n\n".join(out)


# ----------------------------------------------------------------------------- babi_seq

SENTENCE_END, QUESTION_END = ".", "?"
SEQ_MODELS = ("dnc", "lsam", "nam_transformer")
SEQ_MODEL_OPTIONS = {"embedding_dim": 64, "num_heads": 4, "num_layers": 1, "memory_slots": 32, "word_size": 32,
                     "read_heads": 2, "dropout": 0.0}
SEQ_TASK_OPTIONS = {"tasks": list(range(1, 21)), "ten_k": False, "valid_fraction": 0.1, "split_seed": 0,
                    "max_sentences": 50}


class SeqTensors(NamedTuple):
    """``tokens [N, L]`` (0 = padding, right-padded), ``lengths [N]``, ``answers [N]`` (class
    ids), ``tasks [N]`` (1-20)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    answers: torch.Tensor
    tasks: torch.Tensor


def encode_sequences(examples, vocab, answers: dict[str, int], max_sentences: int = 50) -> SeqTensors:
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


class SeqQA(torch.nn.Module):
    """Word embedding + a sequence memory; ``forward(tokens [B, L], lengths [B]) -> logits
    [B, num_answers]`` read at position ``lengths - 1`` of each sequence."""

    def __init__(self, kind: str, vocab_size: int, num_answers: int, d_model: int, max_len: int,
                 embedding_dim: int = 64, num_heads: int = 4, num_layers: int = 1, memory_slots: int = 32,
                 word_size: int = 32, read_heads: int = 2, dropout: float = 0.0):
        super().__init__()
        from torch import nn

        if kind not in SEQ_MODELS:
            raise ValueError(f"`kind` expected one of {SEQ_MODELS}, got {kind!r}")
        self.kind = kind
        E, D = embedding_dim, d_model
        self.embed = nn.Embedding(vocab_size, E if kind != "nam_transformer" else D, padding_idx=0)
        if kind == "dnc":
            from ...memories.dnc import DNC

            self.core = DNC(E, num_answers, memory_slots=memory_slots, word_size=word_size, read_heads=read_heads,
                            controller_size=D)
            self.head = None
        elif kind == "lsam":
            from ...memories.lsam import LSAM

            self.core = LSAM(E, D, num_heads=num_heads, num_layers=num_layers, dropout=dropout)
            self.head = nn.Linear(D, num_answers)
        else:
            from ...models.transformer import TransformerEncoder

            self.core = TransformerEncoder(D, 2 * num_layers, num_heads, dropout=dropout, attention="nam",
                                           max_len=max_len)
            self.head = nn.Linear(D, num_answers)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"`tokens` expected int64 [B, L], got {tokens.dtype} {tuple(tokens.shape)}")
        x = self.embed(tokens)                                             # [B, L, E]
        if self.kind == "nam_transformer":
            y = self.core(x, tokens != 0)
        else:
            y = self.core(x)[0]                                            # [B, L, ·]
        last = y[torch.arange(tokens.shape[0], device=tokens.device), lengths - 1]  # [B, ·]
        return last if self.head is None else self.head(last)


def _seq_batches(data: SeqTensors, batch_size: int, gen: torch.Generator | None) -> list[torch.Tensor]:
    """Index batches of similar length (shuffled, batch order too, when ``gen`` is given)."""
    N = data.answers.shape[0]
    order = torch.randperm(N, generator=gen) if gen is not None else torch.arange(N)
    order = order[torch.sort(data.lengths[order], stable=True).indices]
    out = list(torch.split(order, batch_size))
    if gen is not None:
        out = [out[i] for i in torch.randperm(len(out), generator=gen)]
    return out


_SEQ: dict[tuple, tuple] = {}


def prepare_seq(tasks, max_sentences: int = 50, valid_fraction: float = 0.1, seed: int = 0, ten_k: bool = False,
                data_dir=None) -> tuple:
    """``(vocab, answers, train, valid, test)`` for ``tasks`` of bAbI en (1k), or en-10k with
    ``ten_k`` (a missing en-10k file falls back to the 1k file, with a warning)."""
    from ...tasks import babi

    key = (tuple(tasks), max_sentences, valid_fraction, seed, ten_k, str(data_dir))
    if key in _SEQ:
        return _SEQ[key]
    train_ex = babi.load_joint("train", data_dir, tasks=tasks, ten_k=ten_k, fallback_1k=True)
    test_ex = babi.load_joint("test", data_dir, tasks=tasks, ten_k=ten_k, fallback_1k=True)
    base = babi.build_vocab(train_ex, test_ex)
    vocab = babi.Vocabulary(base.itos[1:] + [SENTENCE_END, QUESTION_END])
    answers = {a: i for i, a in enumerate(sorted({ex.answer for ex in train_ex + test_ex}))}
    tr, va = babi.split_validation(train_ex, valid_fraction, seed)
    enc = lambda exs: encode_sequences(exs, vocab, answers, max_sentences)  # noqa: E731
    out = (vocab, answers, enc(tr), enc(va), enc(test_ex))
    _SEQ.clear()
    _SEQ[key] = out
    return out


class SeqTask(MemN2NTask):
    """``babi_seq``: sequence memories on bAbI questions as word sequences (see the module docstring)."""

    def options(self, cfg) -> tuple[dict, dict]:
        return {**SEQ_MODEL_OPTIONS, **cfg.model.options}, {**SEQ_TASK_OPTIONS, **cfg.task.options}

    def tasks(self, cfg) -> list[int]:
        return [int(t) for t in self.options(cfg)[1]["tasks"]]

    def validate(self, cfg) -> None:
        from ..config import ConfigError

        check_options(self.name, ("model.options", SEQ_MODEL_OPTIONS, cfg.model.options),
                      ("task.options", SEQ_TASK_OPTIONS, cfg.task.options))
        if cfg.model.backbone not in SEQ_MODELS:
            raise ConfigError(f"`model.backbone` of the {self.name!r} task expected one of {list(SEQ_MODELS)}, "
                              f"got {cfg.model.backbone!r}")
        tasks = self.options(cfg)[1]["tasks"]
        if not isinstance(tasks, (list, tuple)) or not tasks or not all(isinstance(t, int) and 1 <= t <= 20
                                                                       for t in tasks):
            raise ConfigError(f"`task.options.tasks` expected a list of bAbI task numbers 1-20, got {tasks!r}")
        if set(cfg.task.splits) != {"valid"} or cfg.select_split != "valid":
            raise ConfigError(f"the {self.name!r} task selects on its validation split: set task.splits = "
                              "{ valid = [1, 1] } and select_split = \"valid\"")

    def data(self, cfg) -> tuple:
        _, to = self.options(cfg)
        return prepare_seq(self.tasks(cfg), to["max_sentences"], to["valid_fraction"], to["split_seed"], to["ten_k"])

    def build_model(self, cfg) -> torch.nn.Module:
        mo, _ = self.options(cfg)
        vocab, answers, tr, va, te = self.data(cfg)
        max_len = int(max(tr.lengths.max(), va.lengths.max(), te.lengths.max()))
        return SeqQA(cfg.model.backbone, len(vocab), len(answers), cfg.model.d_model, max_len, **mo)

    def probe_loss(self, model, cfg, device):
        tr = self.data(cfg)[2]
        lengths = tr.lengths[:2]
        return model(tr.tokens[:2, :int(lengths.max())].to(device), lengths.to(device)).float().sum()

    def steps_per_epoch(self, cfg) -> int:
        return math.ceil(self.data(cfg)[2].answers.shape[0] / cfg.batch_size)

    def train_data(self, cfg, epoch: int):
        tr = self.data(cfg)[2]
        g = torch.Generator().manual_seed(derive_seed(cfg.seed, "train", epoch))
        return tr, _seq_batches(tr, cfg.batch_size, g)

    def train_batch(self, cfg, data, epoch, b, rank=0, world=1):
        tr, bs = data
        idx = bs[b][rank::world]
        lengths = tr.lengths[idx]
        return tr.tokens[idx, :int(lengths.max())], lengths, tr.answers[idx]

    def train_step(self, net, batch, cfg, device, autocast=contextlib.nullcontext):
        tokens, lengths, answers = (t.to(device) for t in batch)
        with autocast():
            logits = net(tokens, lengths)
        logits = logits.float()
        loss = F.cross_entropy(logits, answers)
        return loss, lambda: {"acc": (logits.detach().argmax(-1) == answers).float().mean()}

    def eval_splits(self, cfg) -> dict[str, Any]:
        return {"valid": self.data(cfg)[3]}

    def test_splits(self, cfg) -> dict[str, Any]:
        return {"test": self.data(cfg)[4]}

    def sample(self, cfg, seed: int = 0, split: str | None = None):
        te = self.data(cfg)[4]
        i = seed % te.answers.shape[0]
        return te.tokens[i:i + 1, :int(te.lengths[i])], te.lengths[i:i + 1]

    @torch.no_grad()
    def evaluate(self, model, data, cfg, *, device, info, autocast=contextlib.nullcontext):
        def forward(idx):
            lengths = data.lengths[idx]
            return model(data.tokens[idx, :int(lengths.max())].to(device), lengths.to(device))

        return _evaluate_qa(model, data, _seq_batches(data, 128, None), forward, self.tasks(cfg), device=device,
                            info=info, autocast=autocast)

    def selection_key(self, evals, cfg) -> tuple:
        v = evals[cfg.select_split]
        loss = v.get("loss")
        return (v["accuracy"], -loss if loss is not None and math.isfinite(loss) else -math.inf)

    def selection_rule(self, cfg) -> str:
        return (f"highest {cfg.select_split} accuracy, ties by the lower {cfg.select_split} loss, "
                f"then the {cfg.select_ties} evaluation")

    def decided_by(self, evals, chosen, cfg):
        return decided_by_part([self.selection_key(e, cfg) for e in evals], chosen,
                               (f"{cfg.select_split} accuracy", f"{cfg.select_split} loss"))

    def init_state(self, cfg):
        return None

    def before_test(self, model) -> None:
        pass

    def progress(self, evals) -> str:
        v = evals["valid"]
        return f"valid accuracy {v['accuracy']:.3f} loss {v['loss']:.4f}"

    def results(self, cfg, s: RunSummary) -> dict[str, Any]:
        res = super().results(cfg, s)
        res.pop("softmax_from_epoch", None)
        res["published_mean_error"] = None
        res["task3_from_1k"] = bool(self.options(cfg)[1]["ten_k"] and 3 in self.tasks(cfg))
        return res
