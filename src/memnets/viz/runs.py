"""From a model (or a run directory) and one task sample to the figures that fit the model.

A run directory is one written by ``memnets train`` (:mod:`memnets.train.loop`), of any task
family: ``config.json``, ``metrics.jsonl``, ``results.json`` and ``checkpoints/``
(``best.safetensors`` or the ``last.json`` pointer). The model is rebuilt from the config by the
run's task (:mod:`memnets.train.task`), and the sample is the task's own
(:meth:`~memnets.train.task.Task.sample`): one masked-completion window for the algorithmic
tasks (:mod:`memnets.tasks.nsp`), one sequence of its split for the NTM tasks, one test
example for LRA and bAbI, one image or support set for few-shot Omniglot, one sequence for the
capacity tasks.

Figures by memory: NTM — inputs/outputs/write/read weightings; DNC — the same plus usage,
temporal links and read modes; NAM-TM — head positions and action probabilities per tape
(and its gates); LSAM — read/write gates per head; attention models — the implied attention
maps; capacity models — the recall map (each query's read-out against every stored value);
every run — its learning curve (training loss and the task's metric per split).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure

from .attention_maps import attention_map, collect_attention_maps
from .curves import plot_learning_curves, read_metrics, train_curve
from .plotting import (plot_attention_maps, plot_dnc_memory, plot_gates, plot_read_write, plot_recall, plot_tape_heads,
                       save_figure)
from .trace import collect_lsam_gates, memory_kind, memory_trace, record_module_inputs

__all__ = ["RunDirError", "LoadedRun", "load_run", "run_sample", "model_figures", "run_figures",
           "write_figures", "QUICK_MODELS", "quick_model", "quick_figures", "mqar_layout"]

QUICK_MODELS = ("ntm", "dnc", "nam_tm", "lsam", "softmax", "nam", "linear", "delta")


class RunDirError(ValueError):
    """The directory is not a run this module can read (the message says why)."""


@dataclass
class LoadedRun:
    """A model rebuilt from a run directory: ``config`` is ``config.json`` as a dict,
    ``run_config`` the :class:`~memnets.train.config.RunConfig`, ``task`` the run's
    :class:`~memnets.train.task.Task`."""

    run_dir: Path
    name: str
    model: torch.nn.Module
    config: dict
    results: dict | None
    run_config: Any = None
    task: Any = None

    @property
    def metric(self) -> str:
        """The main metric of the run's evaluations (``seq_acc`` for the algorithmic tasks)."""
        return str((self.results or {}).get("metric") or getattr(self.task, "metric", None) or "seq_acc")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RunDirError(f"cannot read {path}: {e}") from e


def load_run(run_dir: str | Path, checkpoint: str = "best") -> LoadedRun:
    """Rebuild the trained model of ``run_dir`` (a ``memnets train`` run of any task family) in
    evaluation mode, in its reported form (:meth:`~memnets.train.task.Task.before_test`).

    ``checkpoint``: ``"best"`` (falls back to the last checkpoint when there is no best) or
    ``"last"``. Raises :class:`RunDirError` for a missing directory, a directory without
    ``config.json``, a model that cannot be rebuilt or missing weights.
    """
    from ..train.checkpoint import CorruptCheckpointError, load_weights
    from ..train.runs import RunError, read_config, weights_path
    from ..train.task import get_task

    d = Path(run_dir)
    if not d.is_dir():
        raise RunDirError(f"{d} is not a directory")
    if not (d / "config.json").is_file():
        raise RunDirError(f"{d} is not a run directory: expected config.json + checkpoints/ (memnets train)")
    try:
        cfg = read_config(d)
    except RunError as e:
        raise RunDirError(str(e)) from e
    raw = _read_json(d / "config.json")
    results = _read_json(d / "results.json") if (d / "results.json").is_file() else None
    path = None
    for which in ("last",) if checkpoint == "last" else ("best", "last"):
        try:
            path = weights_path(d, which)
            break
        except RunError:
            continue
    if path is None:
        raise RunDirError(f"{d} has no saved weights (looked for checkpoints/best.safetensors and "
                          f"checkpoints/last.json)")
    task = get_task(cfg.task.name)
    torch.manual_seed(cfg.seed)
    from safetensors import SafetensorError

    try:
        model = task.build_model(cfg)
    except (ImportError, RuntimeError, OSError) as e:  # backbone or data missing here
        raise RunDirError(f"cannot rebuild the model of {d}: {e}") from e
    try:
        load_weights(path, model)
    except (CorruptCheckpointError, SafetensorError, OSError) as e:  # truncated or tampered file
        raise RunDirError(f"{path} is corrupt or truncated: {e}") from e
    except RuntimeError as e:  # weights of another shape
        raise RunDirError(f"cannot rebuild the model of {d}: {e}") from e
    task.before_test(model)
    return LoadedRun(d, cfg.name, model.eval(), raw, results, cfg, task)


def run_sample(run: LoadedRun, seed: int = 0, split: str | None = None) -> Any:
    """One input for ``run``'s model (a batch of 1), drawn by the run's task with ``seed`` from
    ``split`` (:meth:`~memnets.train.task.Task.sample`; default: ``"id"`` for the algorithmic
    tasks when the run has it, else the training digits; the first split for the NTM tasks):
    token ids ``[1, W]`` for the algorithmic tasks, a tensor or a tuple of tensors (the model's
    arguments) for the others."""
    cfg = run.run_config
    splits = cfg.task.splits
    if split is not None and split not in splits:
        raise RunDirError(f"`split` expected one of {sorted(splits)}, got {split!r}")
    try:
        return run.task.sample(cfg, seed, split)
    except (OSError, ValueError) as e:  # the task's data missing here
        raise RunDirError(f"cannot draw a sample of {run.run_dir}: {e}") from e


def _copy_sample(bits: int, length: int, seed: int) -> torch.Tensor:
    from ..tasks.ntm_tasks import CopyTask

    task = CopyTask(min_len=length, max_len=length, bits=bits, seed=seed)
    return task.make_batch(1).inputs  # [1, 2L+1, bits+1]


def _attention_figure(maps: dict[str, torch.Tensor], tokens=None, max_maps: int = 8, title: str | None = None) -> Figure:
    flat = {}
    for name, A in maps.items():
        for h in range(A.shape[1]):
            flat[f"{name or 'attention'} head {h}"] = A[0, h]
    flat = dict(list(flat.items())[:max_maps])
    return plot_attention_maps(flat, tokens=tokens, title=title)


def _memory_figures(trace: dict, memory, inputs, outputs, in_labels, out_labels, out_label: str,
                    tokens: list[str] | None = None) -> dict[str, Figure]:
    kind = trace["kind"]
    figs: dict[str, Figure] = {}
    if kind in ("ntm", "dnc"):
        name = kind.upper()
        figs["weightings"] = plot_read_write(inputs, outputs, trace["write_weights"][0], trace["read_weights"][0],
                                             model_name=name, input_labels=in_labels, output_labels=out_labels,
                                             output_label=out_label)
    if kind == "dnc":
        figs["dnc_memory"] = plot_dnc_memory(trace["usage"][0], trace["link"][0], read_modes=trace["read_modes"][0])
    if kind == "lsam":
        figs["gates"] = plot_gates({k: v[0] for k, v in trace["gates"].items()}, model_name="LSAM")
    if kind == "nam_tm":
        figs.update(_nam_tm_figures(trace, memory, tokens))
    return figs


def _nam_tm_figures(trace: dict, memory, tokens: list[str] | None = None) -> dict[str, Figure]:
    """Classify the NAM-TM aux fields by shape and name: positions, actions and gates."""
    cfg = getattr(memory, "config", None)
    names = getattr(memory, "actions", None) or getattr(cfg, "actions", None)
    positions, actions, gates = {}, {}, {}
    for key, t in trace.items():
        if not isinstance(t, torch.Tensor) or key == "output" or t.dim() < 3:
            continue
        label = key.replace("_pos", " head").replace("_actions", " action").replace("_", " ")
        if "action" in key or "move" in key:
            if t.dim() == 5:  # [B, T, tapes, heads, A]
                for h in range(t.shape[3]):
                    actions[f"{label} {('read', 'write')[h] if t.shape[3] == 2 else h}"] = t[0, :, :, h]
            elif t.dim() == 4:
                actions[label] = t[0]
        elif t.dim() == 4:
            positions[label] = t[0]
        elif t.dim() == 3:
            gates[label] = t[0]
    figs = {}
    if positions:
        figs["tape_heads"] = plot_tape_heads(positions, actions, action_names=names, time_labels=tokens)
    if gates:
        figs["gates"] = plot_gates(gates, model_name="NAM-TM")
    return figs


@torch.no_grad()
def model_figures(model: torch.nn.Module, x: Any) -> dict[str, Figure]:
    """The figures that fit ``model`` on the single sample ``x`` (batch of 1).

    ``model``: a :class:`~memnets.models.seq.SequenceTaskModel` (``x``: token ids ``[1, W]``),
    a bare NTM / DNC / NAM-TM / LSAM memory (``x``: ``[1, T, F]``; outputs shown through σ),
    an attention layer (``x``: ``[1, S, d_model]``), or any other model with its input ``x``
    (a tuple: the model's arguments), for which the NTM / DNC / NAM-TM memories, LSAMs and
    attention layers inside it are shown on the inputs they receive. Returns ``{name:
    Figure}``; empty when nothing fits (e.g. a plain LSTM).
    """
    from ..attention import MultiHeadBase

    recall = _recall_figure(model, x)
    if recall is not None:  # a capacity model: its recall map, and what its memory shows inside it
        figs = _inner_figures(model, x if isinstance(x, tuple) else (x,))
        figs.update(_adapter_figures(model, x))
        figs["recall"] = recall
        return figs
    if isinstance(model, MultiHeadBase):
        figs = {"attention": _attention_figure({type(model).__name__: attention_map(model.eval(), x)})}
        beta = getattr(model, "beta", None)
        if isinstance(beta, torch.nn.Module):  # delta rule: write strength β = σ(W_β x) per head (docs/maths.md §6)
            figs["gates"] = plot_gates({"write strength β": torch.sigmoid(beta(x))[0]}, model_name="delta rule")
        return figs
    seq = hasattr(model, "backbone") and hasattr(model, "embed") and hasattr(model, "head")
    if seq:
        from ..tasks.nsp import TOKEN_CHARS

        memory = model.backbone
        tokens = [TOKEN_CHARS[int(i)] for i in x[0]]
        if memory_kind(memory) is None:
            return _inner_figures(model, (x,), tokens, memories=False)
        model.eval()
        trace = memory_trace(memory, model.embed(x))
        probs = torch.softmax(model.head(trace["output"]), -1)[0]  # [W, V]
        onehot = torch.nn.functional.one_hot(x[0], model.vocab_size).double()  # [W, V]
        labels = list(TOKEN_CHARS[: model.vocab_size])
        return _memory_figures(trace, memory, onehot, probs, labels, labels, "token", tokens=tokens)
    if memory_kind(model) is None:
        return _inner_figures(model, x if isinstance(x, tuple) else (x,))
    trace = memory_trace(model, x)
    return _memory_figures(trace, model, x[0], torch.sigmoid(trace["output"][0]), None, None, "output")


def mqar_layout(tokens: torch.Tensor, vocab_size: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Where the queries of one MQAR sequence are and what they ask for
    (:func:`memnets.tasks.retrieval.mqar_batch`'s layout: ``k₁ v₁ … k_P v_P`` with keys below
    ``V/2`` and values from ``V/2``, then each key once more among filler zeros).

    ``tokens [T]`` → ``(query positions, the stored values [P], each query's pair [Q])``."""
    values_from = vocab_size // 2
    ends = [i for i in range(0, len(tokens) - 1, 2) if int(tokens[i + 1]) < values_from]
    P = (ends[0] if ends else 0) // 2
    keys, vals = tokens[0:2 * P:2], tokens[1:2 * P:2]
    where = {int(k): j for j, k in enumerate(keys)}
    q_pos = [t for t in range(2 * P, len(tokens)) if int(tokens[t]) in where]
    return q_pos, vals, torch.tensor([where[int(tokens[t])] for t in q_pos], dtype=torch.long)


@torch.no_grad()
def _recall_figure(model: torch.nn.Module, x: Any) -> Figure | None:
    """The recall map (:func:`~memnets.viz.plotting.plot_recall`) of a capacity model on its
    sample, None for any other model. Key-value retrieval (``x``: keys ``[1, T]``, values
    ``[1, T, dv]``, queries ``[1, Q]``): the cosine of each read-out with each written value,
    a query's pair the last written under its key. MQAR (``x``: tokens ``[1, T]``, pairs
    ``k₁ v₁ … k_P v_P`` then the queries): the probability the model gives each stored value
    token at each query."""
    from ..capacity.adapters import MEMORIES
    from ..capacity.harness import RetrievalModel, TokenModel

    if not isinstance(model, (RetrievalModel, TokenModel)):
        return None
    label = MEMORIES[model.memory][0] if model.memory in MEMORIES else model.memory
    if isinstance(model, RetrievalModel):
        keys, values, queries = (t[:1] for t in x)
        pred = model.eval()(keys, values, queries)[0]  # [Q, dv]
        scores = torch.nn.functional.cosine_similarity(pred[:, None, :], values[0][None, :, :], dim=-1)  # [Q, T]
        targets = _retrieval_targets(keys[0], queries[0])
        return plot_recall(scores, targets, value_label="cosine(read-out, value)",
                           title=f"{label}: key-value recall, {keys.shape[1]} pairs written")
    # MQAR
    tok = x[0] if x.dim() == 2 else x
    q_pos, vals, targets = mqar_layout(tok, model.embed.num_embeddings)
    if not q_pos:
        return None
    probs = torch.softmax(model.eval()(tok[None]).float()[0], -1)  # [T, V]
    scores = probs[q_pos][:, vals]  # [Q, P]
    right = int((probs[q_pos].argmax(-1) == vals[targets]).sum())
    return plot_recall(scores, targets, value_label="p(value token)",
                       title=f"{label}: multi-query associative recall, {len(vals)} pairs",
                       recalled=right, note="A query is recalled when its value token is the most probable "
                       "of the whole vocabulary; two pairs may hold the same value token")


def _retrieval_targets(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Each query's pair: the last written under its key (``keys [T]``, ``queries [Q]``), -1 if none."""
    match = queries[:, None] == keys[None, :]  # [Q, T]
    last = (match * torch.arange(1, keys.shape[0] + 1, device=keys.device)).argmax(1)
    return torch.where(match.any(1), last, -1)


@torch.no_grad()
def _adapter_figures(model: torch.nn.Module, x: Any) -> dict[str, Figure]:
    """A capacity model's attention or fast-weight memory (:mod:`memnets.capacity.adapters`):
    ``attention``, the implied map of its reads (MQAR: each step's causal read, query step on y,
    written step on x; key-value retrieval: each query's read of the written pairs, its own pair
    ringed), and ``gates``, its write gates over time. Nothing for the recurrent memories."""
    from ..capacity.adapters import MEMORIES
    from ..capacity.harness import RetrievalModel

    adapter = getattr(model, "mem", None)
    if not hasattr(adapter, "implied_attention"):
        return {}
    label = MEMORIES[model.memory][0] if model.memory in MEMORIES else model.memory
    model.eval()
    if isinstance(model, RetrievalModel):
        keys, values, queries = (t[:1] for t in x)
        inp, xq = model.memory_inputs(keys, values, queries)
        A = adapter.implied_read(inp, xq)[0, 0]  # [Q, T] (one head)
        figs = {"attention": plot_recall(A, _retrieval_targets(keys[0], queries[0]), value_label="read weight",
                                         title=f"{label}: which written pair each query reads",
                                         panel="each query's read weight on each written pair: {hit} of {total} "
                                               "weigh their own pair most")}
    else:
        tok = x[0] if x.dim() == 2 else x
        inp = model.memory_input(tok[None])  # [1, T, 2d]
        figs = {"attention": _attention_figure({label: adapter.implied_attention(inp)},  # [1, H, T, T]
                                               title=f"{label}: what each step reads")}
    gates = adapter.write_gates(inp)
    if gates:
        figs["gates"] = plot_gates({k: v[0] for k, v in gates.items()}, model_name=label)
    return figs


def _inner_figures(model: torch.nn.Module, inputs: tuple, tokens=None, memories: bool = True) -> dict[str, Figure]:
    """The figures of the memories inside ``model`` run on ``inputs``: the first NTM / DNC /
    NAM-TM called with a batch-first ``[1, T, F]`` input (its input and σ of its output; with
    ``memories``), the gates of every LSAM and the attention maps of every attention layer."""
    figs: dict[str, Figure] = {}
    calls = record_module_inputs(model, lambda m: memory_kind(m) in ("ntm", "dnc", "nam_tm"), *inputs) \
        if memories else []
    for _, memory, args, _ in calls[:1]:
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() == 3 and getattr(memory, "batch_first", True):
            trace = memory_trace(memory, args[0][:1])
            figs.update(_memory_figures(trace, memory, args[0][0], torch.sigmoid(trace["output"][0]), None, None,
                                        "output"))
    gates = collect_lsam_gates(model, *inputs)
    if gates:
        figs["gates"] = plot_gates({k.removeprefix("backbone.").replace("backbone ", ""): v[0]
                                    for k, v in gates.items()}, model_name="LSAM")
    maps = collect_attention_maps(model, *inputs)
    if maps:
        figs["attention"] = _attention_figure(maps, tokens=tokens)
    return figs


def run_figures(run_dir: str | Path, seed: int = 0, checkpoint: str = "best",
                split: str | None = None) -> dict[str, Figure]:
    """:func:`model_figures` of the run's model on one sample (``seed``, ``split``: see
    :func:`run_sample`) plus its ``learning_curve`` (when ``metrics.jsonl`` holds training
    records; its evaluation panel shows the task's metric)."""
    run = load_run(run_dir, checkpoint)
    figs = model_figures(run.model, run_sample(run, seed, split))
    try:
        records = read_metrics(run.run_dir)
    except FileNotFoundError:
        records = []
    if train_curve(records):
        figs["learning_curve"] = plot_learning_curves({run.name: records}, title=f"{run.name}: learning curve",
                                                      metric=run.metric)
    return figs


def write_figures(figs: dict[str, Figure], out_dir: str | Path, prefix: str = "", dpi: int = 100) -> dict[str, Path]:
    """Save every figure as ``<out_dir>/<prefix><name>.png``; returns ``{name: path}``."""
    return {name: save_figure(fig, Path(out_dir) / f"{prefix}{name}.png", dpi=dpi) for name, fig in figs.items()}


def quick_model(name: str, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    """An untrained small model ``name`` (one of :data:`QUICK_MODELS`) and one input for it:
    memories get a copy-task sequence of 8-bit vectors (length 8), attention layers a random
    ``[1, 12, 16]`` input. Raises ValueError for an unknown name, ImportError when the model's
    module is not available."""
    if name not in QUICK_MODELS:
        raise ValueError(f"`model` expected one of {list(QUICK_MODELS)}, got {name!r}")
    torch.manual_seed(seed)
    if name in ("softmax", "nam", "linear", "delta"):
        from ..attention import build_attention

        return build_attention(name, 16, 2, causal=name == "delta"), torch.randn(1, 12, 16)
    x = _copy_sample(8, 8, seed)
    if name == "ntm":
        from ..memories.ntm import NTM

        return NTM(9, 8, memory_slots=24, word_size=12, controller_size=32), x
    if name == "dnc":
        from ..memories.dnc import DNC

        return DNC(9, 8, memory_slots=16, word_size=12, read_heads=2, controller_size=32), x
    if name == "lsam":
        from ..memories.lsam import LSAM

        return LSAM(9, 16, num_heads=4), x
    from ..memories.nam_tm import NAMTuringMachine

    return NAMTuringMachine(input_size=9, hidden_size=16, num_tapes=2, tape_length=16), x


def quick_figures(name: str, seed: int = 0) -> dict[str, Figure]:
    """:func:`model_figures` of :func:`quick_model` ``(name, seed)``."""
    model, x = quick_model(name, seed)
    return model_figures(model, x)
