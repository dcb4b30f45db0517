"""Few-shot Omniglot as engine tasks (the NAM paper's Table 2; docs/maths.md §4, §11, docs/fewshot.md):
``omniglot_pretrain`` (Conv-4 on the base classes) then ``omniglot_fewshot`` (the NAM gates of
one N-way K-shot setting on the frozen features, and the generalised evaluation of cosine vs
NAM; :mod:`memnets.recipes.fewshot`). The images are read from ``--data-dir`` /
``$MEMNETS_DATA`` / ``../shared/data`` (:mod:`memnets.tasks.omniglot`).

``omniglot_pretrain``: Conv-4 (``model.backbone = "conv4"``) on the base classes = the 4112
classes (characters × 4 rotations) of the Vinyals *train* split, drawers 1–15 (drawers 16–20
are held out). ``task.options.mode``: ``episodic`` (default; a cosine classifier whose rows are
the class means of ``batch_size // 4``-way episodes of ``n_support`` support + ``4 − n_support``
query images, learned scale) or ``classifier`` (cosine head with learned scale over all base
classes, batches of ``batch_size`` images). An epoch is ``classes · 15 / batch_size`` steps;
``classes`` (0: all) limits the base classes (for small runs). Adam with a cosine learning-rate
decay over all steps (``schedule.kind = "cosine"``). Split ``base_heldout``: ``task.eval_size``
5-way 1-shot episodes on the held-out drawers of the base classes, scored by the cosine
prototype classifier (``accuracy``, ``ci95``, ``n``); the reported epoch has the highest
accuracy. ``results.json``: the common schema (``family`` = ``"fewshot"``) plus ``mode``.

``omniglot_fewshot``: ``task.options.backbone_run`` names the pre-training run (its reported
weights are loaded and frozen). ``base_classes`` (500) base classes (a fixed random subset of
the train split, ``split_seed``) and all novel classes (Vinyals *test*, 1692; ``novel_classes``
limits them) are encoded once; ``W_base`` holds the head rows of those classes (classifier
mode) or their imprinted rows ``μ(mean over drawers 1–15 of μ(f))`` (episodic mode). The
model is the NAM gates (``model.backbone = "nam_gates"``, ``model.options.hidden``: 512),
trained for ``task.train_size`` episodes (``batch_size`` = 1 episode per step) of ``way``
base classes playing the novel ones with ``shot`` support and ``gate_queries`` (5) queries
each. Split ``test``: ``task.eval_size`` generalised test episodes (``way``-way ``shot``-shot,
``queries`` per class, at most ``20 − shot``), the same for both methods; metrics
``{cosine,nam}_{both,novel,base}`` and their ``..._ci95`` (%, 95% confidence half-widths),
``n``; the main metric is ``nam_both``. There is no model selection (the last evaluation).
``results.json``: the common schema plus ``way``, ``shot``, ``queries_per_class``,
``episodes``, ``backbone_run`` and ``methods`` (``{method: {"both"|"novel"|"base": {"mean",
"ci95"}}}``). ``memnets table`` prints Both / Novel / Base (mean ± 95% CI) per setting and
method.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..data import derive_seed
from ..task import RunSummary, Task, common_results
from ._common import all_reduce_sum, check_options

__all__ = ["PretrainTask", "FewShotTask", "PretrainNet", "base_images", "features"]

PRETRAIN_OPTIONS = {"mode": "episodic", "n_support": 2, "classes": 0}
FEWSHOT_OPTIONS = {"backbone_run": "runs/fewshot-omniglot-pretrain", "way": 5, "shot": 1, "queries": 15,
                   "gate_queries": 5, "base_classes": 500, "novel_classes": 0, "split_seed": 0}


class PretrainNet(torch.nn.Module):
    """Conv-4 features + a cosine head over the base classes: ``forward(x [B, 1, 28, 28]) -> scores
    [B, C]``; ``forward(x, episodic=True) -> (features [B, F], the head's scale)``."""

    def __init__(self, num_classes: int):
        super().__init__()
        from ...models.conv4 import Conv4, CosineHead

        self.backbone, self.head = Conv4(), CosineHead(64, num_classes)

    def forward(self, x: torch.Tensor, episodic: bool = False):
        if episodic:
            return self.backbone(x), self.head.scale
        return self.head(self.backbone(x))


_IMAGES: dict[str, Any] = {}


def _splits():
    from ...tasks import omniglot as og

    if "splits" not in _IMAGES:
        images = og.load_images()
        _IMAGES["splits"] = (og.load_split("train", images=images).images,  # [4112, 20, 28, 28]
                             og.load_split("test", images=images).images)  # [1692, 20, 28, 28]
    return _IMAGES["splits"]


def base_images(classes: int = 0) -> torch.Tensor:
    """uint8 images ``[C, 20, 28, 28]`` of the base classes (the first ``classes``; 0: all)."""
    base = _splits()[0]
    return base[:classes] if classes else base


class PretrainTask(Task):
    """``omniglot_pretrain`` (see the module docstring)."""

    family = "fewshot"
    metric = "accuracy"

    def options(self, cfg) -> dict:
        return {**PRETRAIN_OPTIONS, **cfg.task.options}

    def validate(self, cfg) -> None:
        from ..config import ConfigError

        check_options(self.name, ("task.options", PRETRAIN_OPTIONS, cfg.task.options))
        o = self.options(cfg)
        if o["mode"] not in ("episodic", "classifier"):
            raise ConfigError(f"`task.options.mode` expected 'episodic' or 'classifier', got {o['mode']!r}")
        if cfg.model.backbone != "conv4" or cfg.model.options:
            raise ConfigError(f"`model.backbone` of the {self.name!r} task expected 'conv4' (no options), "
                              f"got {cfg.model.backbone!r} {dict(cfg.model.options)}")
        if set(cfg.task.splits) != {"base_heldout"} or cfg.select_split != "base_heldout":
            raise ConfigError(f"the {self.name!r} task evaluates on held-out drawers of the base classes: set "
                              "task.splits = { base_heldout = [1, 1] } and select_split = \"base_heldout\"")
        if o["mode"] == "episodic" and cfg.batch_size < 8:
            raise ConfigError(f"`batch_size` of episodic pre-training expected >= 8 (4 images per class), "
                              f"got {cfg.batch_size}")

    def images(self, cfg) -> torch.Tensor:
        return base_images(self.options(cfg)["classes"])

    def build_model(self, cfg) -> torch.nn.Module:
        return PretrainNet(self.images(cfg).shape[0])

    def probe_loss(self, model, cfg, device):
        x = torch.zeros(2, 1, 28, 28, device=device)
        if self.options(cfg)["mode"] == "episodic":
            f, scale = model(x, True)
            return f.float().sum() + scale
        return model(x).float().sum()

    def steps_per_epoch(self, cfg) -> int:
        return max(1, self.images(cfg).shape[0] * 15 // cfg.batch_size)

    def train_batch(self, cfg, data, epoch, b, rank=0, world=1):
        from ...recipes.fewshot import BASE_TRAIN_DRAWERS
        from ...tasks import omniglot as og

        o = self.options(cfg)
        images = self.images(cfg)
        g = torch.Generator().manual_seed(derive_seed(cfg.seed, "train", epoch, b))
        if o["mode"] == "episodic":
            ns = o["n_support"]
            ep = og.sample_episode(images.shape[0], images.shape[1], max(2, cfg.batch_size // 4), ns, 4 - ns, g,
                                   allowed_samples=BASE_TRAIN_DRAWERS)
            idx = torch.cat([ep.support, ep.query], dim=1)[rank::world]  # [N, 4]
            return "episodic", images[ep.classes[rank::world, None], idx], ns
        cls = torch.randint(images.shape[0], (cfg.batch_size,), generator=g)
        smp = BASE_TRAIN_DRAWERS[torch.randint(15, (cfg.batch_size,), generator=g)]
        return "classifier", images[cls[rank::world], smp[rank::world]], cls[rank::world]

    def train_step(self, net, batch, cfg, device, autocast=contextlib.nullcontext):
        from ...models.conv4 import l2_normalize
        from ...tasks import omniglot as og

        mode, images, extra = batch
        with autocast():
            if mode == "episodic":
                n, m = images.shape[:2]
                x = og.to_float(images.reshape(n * m, *images.shape[2:])).to(device)
                f, scale = net(x, True)
                f = f.float().reshape(n, m, -1)  # [N, S+Q, F]
                w = l2_normalize(l2_normalize(f[:, :extra]).mean(1))  # [N, F]
                q = l2_normalize(f[:, extra:]).reshape(-1, f.shape[-1])  # [N*Q, F]
                y = torch.arange(n, device=device).repeat_interleave(m - extra)
                logits = scale * q @ w.T
            else:
                logits = net(og.to_float(images).to(device)).float()
                y = extra.to(device)
        loss = F.cross_entropy(logits, y)
        return loss, lambda: {"acc": (logits.detach().argmax(-1) == y).float().mean()}

    def eval_splits(self, cfg) -> dict[str, Any]:
        from ...recipes.fewshot import BASE_TEST_DRAWERS
        from ...tasks import omniglot as og

        images = self.images(cfg)
        g = torch.Generator().manual_seed(derive_seed("eval", self.name))
        eps = [og.sample_episode(images.shape[0], images.shape[1], min(5, images.shape[0]), 1, 4, g,
                                 allowed_samples=BASE_TEST_DRAWERS) for _ in range(cfg.task.eval_size)]
        return {"base_heldout": eps}

    def sample(self, cfg, seed: int = 0, split: str | None = None):
        from ...tasks import omniglot as og

        return og.to_float(self.images(cfg)[seed % self.images(cfg).shape[0], 15:16])

    @torch.no_grad()
    def evaluate(self, model, data, cfg, *, device, info, autocast=contextlib.nullcontext):
        from ...models.conv4 import l2_normalize
        from ...recipes.fewshot import mean_ci
        from ...tasks import omniglot as og

        was = model.training
        model.eval()
        images = self.images(cfg)
        accs = torch.zeros(len(data), dtype=torch.float64)
        for i in range(info.rank, len(data), info.world):
            ep = data[i]
            idx = torch.cat([ep.support, ep.query], dim=1)  # [N, 1+Q]
            x = og.to_float(images[ep.classes[:, None], idx])  # [N, 1+Q, 1, 28, 28]
            n, m = x.shape[:2]
            with autocast():
                f = model.backbone(x.reshape(n * m, *x.shape[2:]).to(device)).float().reshape(n, m, -1)
            w = l2_normalize(f[:, 0])
            q = l2_normalize(f[:, 1:]).reshape(-1, f.shape[-1])
            y = torch.arange(n, device=device).repeat_interleave(m - 1)
            accs[i] = float(((q @ w.T).argmax(-1) == y).double().mean())
        accs = all_reduce_sum(accs, info, device)
        model.train(was)
        mean, half = mean_ci(accs)
        return {"accuracy": mean, "ci95": half, "n": len(data)}

    def results(self, cfg, s: RunSummary) -> dict[str, Any]:
        return {**common_results(self, cfg, s), "mode": self.options(cfg)["mode"]}

    @classmethod
    def format_table(cls, results: list[dict], metric: str | None = None) -> str:
        return fewshot_table(results)


# ----------------------------------------------------------------------------- few-shot stage

_FEATS: dict[tuple, dict] = {}


def features(backbone_run: str | Path, base_classes: int, novel_classes: int = 0, split_seed: int = 0) -> dict:
    """Frozen Conv-4 features of the pre-training run ``backbone_run`` (its reported weights):
    ``{"base" [Bs, 20, F], "base_ids", "base_split_rows", "novel" [Cn, 20, F], "w_base" [Bs, F],
    "scale"}`` (kept in memory for the next call with the same arguments)."""
    from ...models.conv4 import l2_normalize
    from ...recipes.fewshot import BASE_TRAIN_DRAWERS, extract_features
    from ..runs import load_run

    path = Path(backbone_run)
    best = path / "checkpoints" / "best.safetensors"
    key = (str(path.resolve()), best.stat().st_mtime_ns if best.is_file() else 0, base_classes, novel_classes,
           split_seed)
    if key in _FEATS:
        return _FEATS[key]
    run = load_run(path)
    if run.task.name != "omniglot_pretrain":
        from ..config import ConfigError

        raise ConfigError(f"`task.options.backbone_run` expected an omniglot_pretrain run, got a {run.task.name!r} "
                          f"run ({path})")
    mode = run.task.options(run.config)["mode"]
    base = run.task.images(run.config)
    novel = _splits()[1]
    novel = novel[:novel_classes] if novel_classes else novel
    g = torch.Generator().manual_seed(split_seed)
    subset = torch.randperm(base.shape[0], generator=g)[:base_classes].sort().values
    net = run.model
    fb = extract_features(net.backbone, base[subset])  # [Bs, 20, F]
    if mode == "episodic":  # imprinted rows: mean unit feature of the training drawers
        w_base = l2_normalize(l2_normalize(fb[:, BASE_TRAIN_DRAWERS]).mean(1))
    else:
        w_base = net.head.weight.detach()[subset].clone()
    feats = {"base": fb, "base_ids": torch.arange(subset.numel()), "base_split_rows": subset,
             "novel": extract_features(net.backbone, novel), "w_base": w_base, "scale": net.head.scale.detach().clone()}
    _FEATS.clear()
    _FEATS[key] = feats
    return feats


class FewShotTask(Task):
    """``omniglot_fewshot`` (see the module docstring)."""

    family = "fewshot"
    metric = "nam_both"

    def options(self, cfg) -> dict:
        return {**FEWSHOT_OPTIONS, **cfg.task.options}

    def validate(self, cfg) -> None:
        from ..config import ConfigError

        check_options(self.name, ("task.options", FEWSHOT_OPTIONS, cfg.task.options),
                      ("model.options", {"hidden": 512}, cfg.model.options))
        o = self.options(cfg)
        if cfg.model.backbone != "nam_gates":
            raise ConfigError(f"`model.backbone` of the {self.name!r} task expected 'nam_gates', got {cfg.model.backbone!r}")
        for k in ("way", "shot", "queries", "gate_queries", "base_classes"):
            if not isinstance(o[k], int) or o[k] < 1:
                raise ConfigError(f"`task.options.{k}` expected an integer >= 1, got {o[k]!r}")
        if o["way"] >= o["base_classes"]:
            raise ConfigError(f"`task.options.way` ({o['way']}) expected < base_classes ({o['base_classes']}): the "
                              "gate episodes draw base queries from the other base classes")
        if o["shot"] + o["gate_queries"] > 15:
            raise ConfigError("`task.options.shot + gate_queries` expected <= 15 (the training drawers)")
        if set(cfg.task.splits) != {"test"} or cfg.select_split != "test":
            raise ConfigError(f"the {self.name!r} task evaluates on generalised test episodes: set task.splits = "
                              "{ test = [1, 1] } and select_split = \"test\"")

    def feats(self, cfg) -> dict:
        o = self.options(cfg)
        return features(o["backbone_run"], o["base_classes"], o["novel_classes"], o["split_seed"])

    def build_model(self, cfg) -> torch.nn.Module:
        from ...recipes.fewshot import make_gates

        f = self.feats(cfg)
        return make_gates(f["base"].shape[-1], f["w_base"].shape[0], cfg.model.options.get("hidden", 512))

    def probe_loss(self, model, cfg, device):
        p_w, p_e = model.gates(torch.ones(1, 1, model.feature_dim, device=device))
        return (p_w + p_e).sum()

    def steps_per_epoch(self, cfg) -> int:
        return cfg.task.train_size // cfg.batch_size

    def train_batch(self, cfg, data, epoch, b, rank=0, world=1):
        from ...recipes.fewshot import gate_episode

        o = self.options(cfg)
        g = torch.Generator().manual_seed(derive_seed(cfg.seed, "train", epoch, b))
        return gate_episode(self.feats(cfg), o["way"], o["shot"], o["gate_queries"], g)

    def train_step(self, net, batch, cfg, device, autocast=contextlib.nullcontext):
        from ...recipes.fewshot import gate_loss

        o = self.options(cfg)
        loss, p_w, p_e = gate_loss(getattr(net, "module", net), self.feats(cfg), batch, o["way"], o["gate_queries"])
        return loss, lambda: {"p_w": p_w.detach().mean(), "p_e": p_e.detach().mean()}

    def eval_splits(self, cfg) -> dict[str, Any]:
        return {"test": None}

    def sample(self, cfg, seed: int = 0, split: str | None = None):
        f = self.feats(cfg)
        return f["novel"][seed % f["novel"].shape[0], : self.options(cfg)["shot"]][None]

    @torch.no_grad()
    def evaluate(self, model, data, cfg, *, device, info, autocast=contextlib.nullcontext):
        from ...memories.fewshot import cosine_fewshot_weights
        from ...recipes.fewshot import evaluate_setting
        from ...tasks import omniglot as og

        o = self.options(cfg)
        was = model.training
        model.eval()

        def nam(w_base: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
            return model.weights(support, base_weight=w_base)

        q = min(o["queries"], og.DRAWERS - o["shot"])
        r = evaluate_setting(self.feats(cfg), o["way"], o["shot"], q, cfg.task.eval_size,
                             {"cosine": cosine_fewshot_weights, "nam": nam}, seed=cfg.seed + 1000 * o["way"] + o["shot"])
        model.train(was)
        out: dict[str, Any] = {}
        for m, acc in r.items():
            for k, v in acc.items():
                out[f"{m}_{k}"] = v["mean"]
                out[f"{m}_{k}_ci95"] = v["ci95"]
        out["n"] = cfg.task.eval_size
        return out

    def selection_key(self, evals, cfg) -> tuple:
        return (0,)  # no selection on the test episodes: the last evaluation

    def selection_rule(self, cfg) -> str:
        return "none: the last evaluation (the test episodes are not used to choose a model)"

    def decided_by(self, evals, chosen, cfg):
        return "the last evaluation"

    def progress(self, evals) -> str:
        t = evals["test"]
        return f"Both: cosine {t['cosine_both']:.2f}% nam {t['nam_both']:.2f}% (± {t['nam_both_ci95']:.2f})"

    def results(self, cfg, s: RunSummary) -> dict[str, Any]:
        from ...tasks import omniglot as og

        o = self.options(cfg)
        t = (s.best.get("splits") or {}).get("test") or {}
        methods = {m: {k: {"mean": t[f"{m}_{k}"], "ci95": t[f"{m}_{k}_ci95"]} for k in ("both", "novel", "base")}
                   for m in ("cosine", "nam") if f"{m}_both" in t}
        return {**common_results(self, cfg, s), "way": o["way"], "shot": o["shot"],
                "queries_per_class": min(o["queries"], og.DRAWERS - o["shot"]), "episodes": cfg.task.eval_size,
                "backbone_run": str(o["backbone_run"]), "methods": methods}

    @classmethod
    def format_table(cls, results: list[dict], metric: str | None = None) -> str:
        return fewshot_table(results)


def fewshot_table(results: list[dict]) -> str:
    """The few-shot table (settings × methods, mean ± 95% CI) and, for pre-training runs, their
    held-out base accuracy."""
    from ...recipes.fewshot import format_fewshot_table

    shots = [r for r in results if r.get("task") == "omniglot_fewshot"]
    pre = [r for r in results if r.get("task") == "omniglot_pretrain"]
    parts = []
    if shots:
        parts.append("Generalised few-shot Omniglot, accuracy % (mean ± 95% CI over the test episodes)\n\n"
                     + format_fewshot_table(shots))
    if pre:
        lines = ["| pre-training run | mode | steps | held-out base 5-way 1-shot accuracy % |", "|---|---|---|---|"]
        for r in pre:
            m = ((r.get("splits") or {}).get("base_heldout") or {})
            acc = f"{100 * m['accuracy']:.2f} ± {100 * m['ci95']:.2f}" if "accuracy" in m else "–"
            lines.append(f"| {r.get('name')} | {r.get('mode')} | {r.get('steps')} | {acc} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
