"""Few-shot Omniglot: cosine classifier vs NAM few-shot (docs/maths.md §4, §11; the NAM paper's Table 2).

    python -m memnets.experiments.fewshot_omniglot [--data-dir D] [--epochs N] [--episodes 1000]
                                                   [--out DIR] [--seed S]

Stages (each saved under ``--out``; a rerun resumes after the last finished one):

1. **Pre-training** (``pretrain.pt``) of Conv-4 on the base classes = the 4112 classes
   (characters × 4 rotations) of the Vinyals *train* split, drawers 1–15 of each class
   (drawers 16–20 are held out as base test images). ``--pretrain-mode episodic`` (default):
   cosine classifier whose rows are the class means of 32-way episodes (2 support + 2 query
   images per class), learned scale — it learns from the first step, which suits a short CPU
   budget; ``classifier``: cosine head with learned scale over all 4112 classes (Gidaris &
   Komodakis 2018), which needs many epochs. Both stop at ``--max-minutes``.
2. **Features** (``features.pt``): frozen Conv-4 features ``[C, 20, 64]`` of ``--base-classes``
   base classes (a fixed random subset of the train split) and of all novel classes (Vinyals
   *test*, 1692). ``W_base`` ``[B, 64]``: the head rows of those classes (classifier mode) or
   their imprinted rows ``μ(mean over drawers 1–15 of μ(f))`` (episodic mode).
3. **Gates**: for each setting (N-way, K-shot) the NAM gates ``f_rw`` are trained episodically
   on the base classes (:func:`train_gates`): N base classes play the novel ones (their rows
   leave ``W_base``), their K support features are written with Algorithm 1, and the loss is
   cross-entropy of ``s · μ(W') μ(x)`` over all classes on queries of both the pseudo-novel and
   other base classes.
4. **Evaluation** on ``--episodes`` generalised test episodes per setting: N novel test classes
   with K support and ``min(--queries, 20 − K)`` queries each, plus as many base queries
   (drawers 16–20). Accuracies (Gidaris & Komodakis 2018): *Novel* = novel queries among the N
   novel classes (the plain N-way K-shot accuracy), *Base* = base queries among the base
   classes, *Both* = all queries among all base + novel classes; mean over episodes ± 95% CI
   (1.96 · std / √episodes). Written to ``results.json`` and ``results.md``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..memories.fewshot import NAMFewShotClassifier, cosine_fewshot_weights, nam_fewshot_weights
from ..models.conv4 import Conv4, CosineHead, l2_normalize
from ..tasks import omniglot as og

__all__ = [
    "BASE_TRAIN_DRAWERS", "BASE_TEST_DRAWERS", "pretrain_step", "episodic_step", "pretrain", "extract_features",
    "mean_ci", "make_gates", "episode_accuracies",
    "train_gates", "evaluate_setting", "run_settings", "results_markdown", "main",
]

BASE_TRAIN_DRAWERS = torch.arange(0, 15)
BASE_TEST_DRAWERS = torch.arange(15, 20)


def _log(path: Path | None, **row) -> None:
    print(json.dumps(row), flush=True)
    if path is not None:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _atomic_torch_save(obj: object, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def pretrain_step(backbone: Conv4, head: CosineHead, opt: torch.optim.Optimizer, x: torch.Tensor,
                  y: torch.Tensor) -> float:
    """One cross-entropy step on images ``x`` ``[B, 1, 28, 28]`` with labels ``y`` ``[B]``."""
    loss = F.cross_entropy(head(backbone(x)), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def episodic_step(backbone: Conv4, head: CosineHead, opt: torch.optim.Optimizer, x: torch.Tensor,
                  n_support: int) -> float:
    """One step of the episodic cosine classifier: images ``x`` ``[N, S + Q, 1, 28, 28]``.

    The classifier rows are the episode's class means ``μ(mean_s μ(f(x_ns)))`` ``[N, F]``; the
    queries ``x_n,S:`` are scored ``s · μ(W) μ(f(x))`` with the head's learned scale ``s`` and
    trained with cross-entropy (a cosine Prototypical-Networks loss).
    """
    n, m = x.shape[:2]
    f = backbone(x.reshape(n * m, *x.shape[2:])).reshape(n, m, -1)  # [N, S+Q, F]
    w = l2_normalize(l2_normalize(f[:, :n_support]).mean(1))  # [N, F]
    q = l2_normalize(f[:, n_support:]).reshape(-1, f.shape[-1])  # [N*Q, F]
    y = torch.arange(n).repeat_interleave(m - n_support)
    loss = F.cross_entropy(head.scale * q @ w.T, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def pretrain(backbone: Conv4, head: CosineHead, images: torch.Tensor, *, samples: torch.Tensor,
             epochs: float, batch_size: int = 64, lr: float = 2e-3, seed: int = 0,
             max_minutes: float | None = None, log: Path | None = None, mode: str = "classifier",
             n_support: int = 2, checkpoint: Path | None = None, checkpoint_seconds: float = 120.0) -> dict:
    """Pre-train on uint8 images ``[C, S, 28, 28]`` (drawers ``samples``), class = row index.

    ``mode="classifier"``: batches of ``batch_size`` images, cross-entropy of the cosine head
    over all C classes. ``mode="episodic"``: batches of ``batch_size // 4`` classes × 4 images
    (``n_support`` of them build the class means, see :func:`episodic_step`); the head's scale
    is learned, its rows are unused. An epoch is ``C · len(samples)`` images in both modes.

    Adam with a cosine learning-rate decay over the progress
    ``max(step / planned_steps, elapsed / max_minutes)``, so the decay completes when either
    ``epochs`` (may be fractional) are done or the wall-time cap is reached, whichever is first.
    With ``checkpoint`` the whole training state (weights, optimizer, sampler generator,
    step, elapsed time) is written there atomically every ``checkpoint_seconds`` and at the
    end; a call that finds the file resumes from it (the wall-time cap counts the time of the
    earlier calls), so an interrupted pre-training loses at most ``checkpoint_seconds``.
    Training runs in channels-last memory format (faster convolutions on CPU).
    Returns ``{"steps", "planned_steps", "seconds", "final_loss", "resumed_at_step"}``.
    """
    g = torch.Generator().manual_seed(seed)
    num_classes = images.shape[0]
    cls = torch.arange(num_classes).repeat_interleave(samples.numel())  # [C*S']
    smp = samples.repeat(num_classes)  # [C*S']
    n = cls.numel()
    total = max(1, int(math.ceil(epochs * n / batch_size)))
    opt = torch.optim.Adam(list(backbone.parameters()) + list(head.parameters()), lr=lr)
    backbone.to(memory_format=torch.channels_last)
    backbone.train()
    head.train()
    step, ema, pos, before = 0, None, 0, 0.0
    perm = torch.randperm(n, generator=g)
    if checkpoint is not None and Path(checkpoint).is_file():
        ck = torch.load(checkpoint, weights_only=True)
        if ck["total"] != total or ck["mode"] != mode or ck["num_classes"] != num_classes:
            raise ValueError(f"`checkpoint` {checkpoint} is from another pre-training (planned steps "
                             f"{ck['total']}, mode {ck['mode']!r}, {ck['num_classes']} classes; this one: "
                             f"{total}, {mode!r}, {num_classes}); delete it or use another --out")
        backbone.load_state_dict(ck["backbone"])
        head.load_state_dict(ck["head"])
        opt.load_state_dict(ck["opt"])
        g.set_state(ck["generator"])
        step, ema, pos, before, perm = ck["step"], ck["ema"], ck["pos"], ck["seconds"], ck["perm"]
        _log(log, stage="pretrain", resumed_at_step=step, seconds=round(before, 1))
    resumed_at, t0 = step, time.time()
    last_save = t0
    budget = None if max_minutes is None else 60.0 * max_minutes

    def save() -> None:
        if checkpoint is not None:
            _atomic_torch_save({"backbone": backbone.state_dict(), "head": head.state_dict(),
                                "opt": opt.state_dict(), "generator": g.get_state(), "step": step,
                                "ema": ema, "pos": pos, "perm": perm, "total": total, "mode": mode,
                                "num_classes": num_classes, "seconds": before + time.time() - t0},
                               Path(checkpoint))

    while True:
        elapsed = before + time.time() - t0
        progress = step / total if budget is None else max(step / total, elapsed / budget)
        if progress >= 1.0:
            break
        if checkpoint is not None and time.time() - last_save >= checkpoint_seconds:
            save()
            last_save = time.time()
        for group in opt.param_groups:
            group["lr"] = lr * 0.5 * (1.0 + math.cos(math.pi * progress))
        if mode == "episodic":
            ep = og.sample_episode(num_classes, images.shape[1], max(2, batch_size // 4), n_support,
                                   4 - n_support, g, allowed_samples=samples)
            idx = torch.cat([ep.support, ep.query], dim=1)  # [N, 4]
            x = og.to_float(images[ep.classes[:, None], idx])  # [N, 4, 1, 28, 28]
            loss = episodic_step(backbone, head, opt, x, n_support)
        elif mode == "classifier":
            if pos + batch_size > n:
                perm, pos = torch.randperm(n, generator=g), 0
            idx = perm[pos:pos + batch_size]
            pos += batch_size
            x = og.to_float(images[cls[idx], smp[idx]])  # [B, 1, 28, 28]
            loss = pretrain_step(backbone, head, opt, x, cls[idx])
        else:
            raise ValueError(f"`mode` expected 'classifier' or 'episodic', got {mode!r}")
        step += 1
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        if step % 50 == 0 or step == total:
            _log(log, stage="pretrain", step=step, of=total, loss=round(ema, 4), lr=opt.param_groups[0]["lr"],
                 scale=round(float(head.scale.detach()), 3), seconds=round(before + time.time() - t0, 1))
    save()
    backbone.to(memory_format=torch.contiguous_format)
    return {"steps": step, "planned_steps": total, "seconds": before + time.time() - t0, "final_loss": ema,
            "resumed_at_step": resumed_at}


@torch.no_grad()
def extract_features(backbone: Conv4, images: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """Frozen (eval-mode) features of uint8 images ``[C, S, 28, 28]`` → float ``[C, S, F]``."""
    backbone.eval()
    c, s = images.shape[:2]
    flat = images.reshape(c * s, *images.shape[2:])  # [C*S, 28, 28]
    out = [backbone(og.to_float(flat[i:i + batch_size])) for i in range(0, flat.shape[0], batch_size)]
    return torch.cat(out).reshape(c, s, -1)  # [C, S, F]


def mean_ci(values: torch.Tensor) -> tuple[float, float]:
    """Mean and 95% confidence half-width ``1.96 · std / √n`` of per-episode values ``[n]``."""
    v = values.double()
    n = v.numel()
    half = 1.96 * float(v.std(unbiased=True)) / math.sqrt(n) if n > 1 else float("nan")
    return float(v.mean()), half


def make_gates(feature_dim: int, num_base_classes: int, hidden: int = 512) -> NAMFewShotClassifier:
    """NAM few-shot gates ``f_rw`` (docs/maths.md §4, §12) as a :class:`NAMFewShotClassifier`.

    The output biases of its two MLPs start at ``+4`` (``p_w ≈ 0.98``) and ``−4``
    (``p_e ≈ 0.02``), i.e. close to the feature-averaging cosine classifier (``p_w = 1, p_e = 0``).
    """
    clf = NAMFewShotClassifier(feature_dim, num_base_classes, hidden=hidden)
    with torch.no_grad():
        clf.f_w[-1].bias.fill_(4.0)
        clf.f_e[-1].bias.fill_(-4.0)
    return clf


def episode_accuracies(weights: torch.Tensor, num_base: int, novel_q: torch.Tensor, novel_y: torch.Tensor,
                       base_q: torch.Tensor, base_y: torch.Tensor) -> dict[str, float]:
    """Table 2's accuracies for one generalised episode.

    ``weights`` ``[B + N, F]`` (base rows first), queries ``novel_q`` ``[Qn, F]`` with labels
    ``novel_y ∈ [0, N)`` and ``base_q`` ``[Qb, F]`` with labels ``base_y ∈ [0, B)``; scores are
    ``μ(W) μ(x)``. Novel: novel queries among the N novel rows; Base: base queries among the B
    base rows; Both: all queries among all rows (novel label ``B + n``), averaged over all queries.
    """
    sn = l2_normalize(novel_q) @ weights.T  # [Qn, B+N]
    sb = l2_normalize(base_q) @ weights.T  # [Qb, B+N]
    novel = (sn[:, num_base:].argmax(1) == novel_y).double()
    base = (sb[:, :num_base].argmax(1) == base_y).double()
    both = torch.cat([sn.argmax(1) == novel_y + num_base, sb.argmax(1) == base_y]).double()
    return {"novel": float(novel.mean()), "base": float(base.mean()), "both": float(both.mean())}


def train_gates(feats: dict, n_way: int, k_shot: int, *, steps: int, n_query: int = 5, lr: float = 1e-3,
                hidden: int = 512, seed: int = 0, log: Path | None = None) -> NAMFewShotClassifier:
    """Train the gates of a :class:`NAMFewShotClassifier` episodically on base classes
    (training drawers only; the base rows always come from ``feats["w_base"]``).

    Each step: ``n_way`` base classes of the feature subset play the novel classes (their rows
    leave ``W_base``), ``k_shot`` support + ``n_query`` query features each, plus
    ``n_way · n_query`` queries of other base classes; loss = cross-entropy of
    ``s · μ(W') μ(x)`` over all remaining base + pseudo-novel classes.
    """
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    pool, ids, w_base, scale = feats["base"], feats["base_ids"], feats["w_base"], float(feats["scale"])
    gates = make_gates(pool.shape[-1], w_base.shape[0], hidden)
    opt = torch.optim.Adam(gates.parameters(), lr=lr)
    total_base = w_base.shape[0]
    t0, ema = time.time(), None
    for step in range(1, steps + 1):
        ep = og.sample_episode(pool.shape[0], pool.shape[1], n_way, k_shot, n_query, g,
                               allowed_samples=BASE_TRAIN_DRAWERS)
        keep = torch.ones(total_base, dtype=torch.bool)
        keep[ids[ep.classes]] = False
        remap = torch.cumsum(keep, 0) - 1  # global base id -> row among kept rows
        others = torch.nonzero(keep[ids]).squeeze(1)  # subset rows still in W_base
        bsel = others[torch.randint(others.numel(), (n_way * n_query,), generator=g)]
        bsmp = BASE_TRAIN_DRAWERS[torch.randint(BASE_TRAIN_DRAWERS.numel(), (n_way * n_query,), generator=g)]
        support = og.gather(pool, ep.classes, ep.support)  # [N, K, F]
        p_w, p_e = gates.gates(support)  # [N, K] each
        w = nam_fewshot_weights(w_base[keep], support, p_w, p_e)  # [B-N+N, F]
        nb = int(keep.sum())
        q = torch.cat([og.gather(pool, ep.classes, ep.query).reshape(-1, pool.shape[-1]),  # [N*Q, F]
                       og.gather(pool, bsel, bsmp)])
        y = torch.cat([nb + torch.arange(n_way).repeat_interleave(n_query), remap[ids[bsel]]])
        loss = F.cross_entropy(scale * l2_normalize(q) @ w.T, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lv = float(loss.detach())
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        if step % 100 == 0 or step == steps:
            _log(log, stage="gates", way=n_way, shot=k_shot, step=step, loss=round(ema, 4),
                 p_w=round(float(p_w.detach().mean()), 3), p_e=round(float(p_e.detach().mean()), 3),
                 seconds=round(time.time() - t0, 1))
    return gates


@torch.no_grad()
def evaluate_setting(feats: dict, n_way: int, k_shot: int, n_query: int, episodes: int,
                     methods: dict, seed: int) -> dict:
    """Mean ± 95% CI of Novel / Base / Both over ``episodes`` generalised test episodes.

    ``methods`` maps a name to ``fn(w_base, support [N, K, F]) -> weights [B + N, F]``; every
    method sees the same episodes. Base queries (``n_way · n_query`` per episode) come from the
    held-out drawers 16–20 of the base feature subset.
    """
    g = torch.Generator().manual_seed(seed)
    novel_pool, base_pool, ids, w_base = feats["novel"], feats["base"], feats["base_ids"], feats["w_base"]
    acc = {m: {"novel": [], "base": [], "both": []} for m in methods}
    for _ in range(episodes):
        ge = og.sample_generalized_episode(novel_pool.shape[0], base_pool.shape[0], novel_pool.shape[1], n_way,
                                           k_shot, n_query, n_way * n_query, g, base_samples=BASE_TEST_DRAWERS)
        support = og.gather(novel_pool, ge.novel.classes, ge.novel.support)  # [N, K, F]
        nq = og.gather(novel_pool, ge.novel.classes, ge.novel.query).reshape(-1, novel_pool.shape[-1])  # [N*Q, F]
        ny = torch.arange(n_way).repeat_interleave(n_query)
        bq = og.gather(base_pool, ge.base_classes, ge.base_samples)  # [M, F]
        by = ids[ge.base_classes]
        for name, fn in methods.items():
            r = episode_accuracies(fn(w_base, support), w_base.shape[0], nq, ny, bq, by)
            for key, v in r.items():
                acc[name][key].append(v)
    out = {}
    for name, d in acc.items():
        out[name] = {}
        for key, vals in d.items():
            mean, half = mean_ci(torch.tensor(vals))
            out[name][key] = {"mean": 100 * mean, "ci95": 100 * half}
    return out


def _stage_pretrain(args: argparse.Namespace, out: Path, base: torch.Tensor) -> dict:
    path = out / "pretrain.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    torch.manual_seed(args.seed)
    backbone, head = Conv4(), CosineHead(64, base.shape[0])
    info = pretrain(backbone, head, base, samples=BASE_TRAIN_DRAWERS, epochs=args.epochs,
                    batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                    max_minutes=args.max_minutes, log=out / "metrics.jsonl", mode=args.pretrain_mode,
                    checkpoint=out / "pretrain_checkpoint.pt")
    blob = {"backbone": backbone.state_dict(), "head": head.state_dict(), "info": info}
    _atomic_torch_save(blob, path)
    (out / "pretrain_checkpoint.pt").unlink(missing_ok=True)
    return blob


def _stage_features(out: Path, blob: dict, base: torch.Tensor, novel: torch.Tensor, *,
                    base_classes: int, seed: int, mode: str) -> dict:
    path = out / "features.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    backbone = Conv4()
    backbone.load_state_dict(blob["backbone"])
    t0 = time.time()
    g = torch.Generator().manual_seed(seed)
    subset = torch.randperm(base.shape[0], generator=g)[:base_classes].sort().values
    fb = extract_features(backbone, base[subset])  # [Bs, 20, F]
    if mode == "episodic":  # imprinted rows: mean unit feature of the training drawers
        w_base = l2_normalize(l2_normalize(fb[:, BASE_TRAIN_DRAWERS]).mean(1))
    else:
        w_base = blob["head"]["weight"][subset].clone()
    feats = {"base": fb, "base_ids": torch.arange(subset.numel()), "base_split_rows": subset,
             "novel": extract_features(backbone, novel), "w_base": w_base,
             "scale": blob["head"]["scale"].clone()}
    _log(out / "metrics.jsonl", stage="features", seconds=round(time.time() - t0, 1))
    _atomic_torch_save(feats, path)
    return feats


def run_settings(args: argparse.Namespace, out: Path, feats: dict, pretrain_info: dict) -> dict:
    """Stages 3–4 for every (way, shot): train the gates, evaluate cosine vs NAM."""
    results: dict = {"pretrain": pretrain_info, "episodes": args.episodes, "settings": []}
    for k in args.shots:
        for n in args.ways:
            t0 = time.time()
            gates = train_gates(feats, n, k, steps=args.gate_episodes, seed=args.seed, log=out / "metrics.jsonl")
            gates.eval()

            def nam(w_base: torch.Tensor, support: torch.Tensor, gates: NAMFewShotClassifier = gates) -> torch.Tensor:
                return gates.weights(support, base_weight=w_base)

            q = min(args.queries, og.DRAWERS - k)
            r = evaluate_setting(feats, n, k, q, args.episodes, {"cosine": cosine_fewshot_weights, "nam": nam},
                                 seed=args.seed + 1000 * n + k)
            row = {"way": n, "shot": k, "queries_per_class": q, "seconds": time.time() - t0, **r}
            results["settings"].append(row)
            _log(out / "metrics.jsonl", stage="eval", way=n, shot=k,
                 **{f"{m}_{a}": round(r[m][a]["mean"], 2) for m in r for a in r[m]})
    return results


def _fmt(d: dict) -> str:
    return f"{d['mean']:.2f} ± {d['ci95']:.2f}"


def results_markdown(results: dict) -> str:
    """Markdown table of Both / Novel / Base (mean ± 95% CI, %) per setting and method."""
    lines = ["| setting | method | Both | Novel (plain N-way) | Base |", "|---|---|---|---|---|"]
    for row in results["settings"]:
        for m in ("cosine", "nam"):
            r = row[m]
            lines.append(f"| {row['way']}-way {row['shot']}-shot | {m} | {_fmt(r['both'])} | {_fmt(r['novel'])} | {_fmt(r['base'])} |")
    return "\n".join(lines) + "\n"


def _write_results(out: Path, results: dict) -> None:
    for name, text in (("results.json", json.dumps(results, indent=2)), ("results.md", results_markdown(results))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, out / name)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m memnets.experiments.fewshot_omniglot", description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--out", default="runs/fewshot_omniglot")
    p.add_argument("--epochs", type=float, default=8.0, help="pre-training epochs (fractional allowed)")
    p.add_argument("--max-minutes", type=float, default=40.0, help="wall-time cap on pre-training (resumable)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--pretrain-mode", choices=["classifier", "episodic"], default="episodic",
                   help="cosine head over all base classes, or episodic cosine classifier (class means)")
    p.add_argument("--base-classes", type=int, default=500,
                   help="base classes (a fixed random subset of the train split) in the generalised setting")
    p.add_argument("--episodes", type=int, default=1000, help="test episodes per setting")
    p.add_argument("--gate-episodes", type=int, default=600, help="episodic gate-training steps per setting")
    p.add_argument("--queries", type=int, default=15, help="query images per novel class (≤ 20 − K)")
    p.add_argument("--ways", type=int, nargs="+", default=[5, 20])
    p.add_argument("--shots", type=int, nargs="+", default=[1, 5])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave the default)")
    p.add_argument("--stop-after", choices=["pretrain", "features", "all"], default="all")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    images = og.load_images(args.data_dir, cache_dir=args.cache_dir)
    base = og.load_split("train", args.data_dir, images=images).images  # [4112, 20, 28, 28]
    novel = og.load_split("test", args.data_dir, images=images).images  # [1692, 20, 28, 28]
    blob = _stage_pretrain(args, out, base)
    if args.stop_after == "pretrain":
        return {}
    feats = _stage_features(out, blob, base, novel, base_classes=args.base_classes, seed=args.seed,
                            mode=args.pretrain_mode)
    if args.stop_after == "features":
        return {}
    results = run_settings(args, out, feats, blob["info"])
    results["total_seconds"] = time.time() - t0
    _write_results(out, results)
    return results


if __name__ == "__main__":
    main()
