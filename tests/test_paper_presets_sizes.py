"""The paper/* presets: Table 1's parameter counts (within 10%), Adam with L2 decay, fp32."""
from __future__ import annotations

import pytest
import torch

from memnets.cli.table import PAPER_TABLE1
from memnets.models.seq import BACKBONES, SIZES
from memnets.paper import PAPER_PARAMS
from memnets.train.config import OptimConfig, apply_overrides, list_presets, load_config
from memnets.train.loop import build_model
from memnets.train.optim import make_optimizer

TASKS = ("palindrome", "fib", "reduce")
COLUMNS = ("transformer", "lstm_attention", "universal_transformer", "dnc", "lsam_encdec", "nam_tm",
           "nam_tm_nojmp")
PAPER_PRESETS = [p for p in list_presets() if p.startswith("paper/")]


def _count(cfg) -> int:
    with torch.device("meta"):
        model = build_model(cfg)
    return sum(p.numel() for p in model.parameters())


def test_paper_params_is_table1():
    assert list(PAPER_PARAMS) == list(COLUMNS)
    assert [BACKBONES[b][3] for b in COLUMNS] == ["TF", "LSTM", "UT", "DNC", "LSAM", "NAM-TM", "No Jmp"]
    assert [f"{n / 1e6:.1f}M" for n in PAPER_PARAMS.values()] == PAPER_TABLE1["Parameters"]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("backbone", COLUMNS)
def test_paper_preset_matches_table1_size(task, backbone):
    n = _count(load_config(f"paper/{task}-{backbone}"))
    paper = PAPER_PARAMS[backbone]
    assert abs(n - paper) <= 0.10 * paper, f"paper/{task}-{backbone}: {n / 1e6:.2f}M vs paper {paper / 1e6:.1f}M"


@pytest.mark.parametrize("task", TASKS)
def test_no_jmp_matches_nam_tm_size(task):
    nam = _count(load_config(f"paper/{task}-nam_tm"))
    nojmp = _count(load_config(f"paper/{task}-nam_tm_nojmp"))
    assert abs(nojmp - nam) <= 0.10 * nam


@pytest.mark.parametrize("backbone", COLUMNS)
def test_seq_paper_sizes_match_presets(backbone):
    cfg = load_config(f"paper/reduce-{backbone}")
    assert {"d_model": cfg.model.d_model, **cfg.model.options} == SIZES["paper"][backbone]


def test_paper_presets_train_with_adam_in_fp32():
    assert len(PAPER_PRESETS) == 30
    for name in PAPER_PRESETS:
        cfg = load_config(name)
        assert cfg.optim.kind == "adam", name
        assert cfg.amp == "none", name
        assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.grad_clip) == (1e-4, 5e-5, 0.5), name


def test_optim_kind_default_and_validation():
    assert OptimConfig().kind == "adamw"
    assert load_config("paper/fib-nam_tm", ["amp=bf16", "optim.kind=adamw"]).optim.kind == "adamw"
    with pytest.raises(ValueError, match="optim.kind"):
        apply_overrides(load_config("paper/fib-nam_tm"), ["optim.kind=rmsprop"])


def test_make_optimizer_adam_l2_differs_from_adamw():
    """One step from θ = 1 with gradient 0 (lr 0.1, weight decay 0.5, Adam's first step moves
    every coordinate with a non-zero gradient by lr·sign(g)):
    Adam (L2): g = 0 + 0.5·1 > 0, θ = 1 − 0.1 = 0.9; AdamW (decoupled): θ = 1·(1 − 0.1·0.5) = 0.95,
    then no Adam step (g = 0). A coordinate with gradient 2: Adam θ = 0.9; AdamW θ = 0.95 − 0.1."""
    out = {}
    for kind in ("adam", "adamw"):
        p = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
        opt = make_optimizer(OptimConfig(kind=kind, lr=0.1, weight_decay=0.5), [p])
        assert type(opt) is {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
        p.grad = torch.tensor([0.0, 2.0], dtype=torch.float64)
        opt.step()
        out[kind] = p.detach()
    torch.testing.assert_close(out["adam"], torch.tensor([0.9, 0.9], dtype=torch.float64), rtol=0, atol=1e-7)
    torch.testing.assert_close(out["adamw"], torch.tensor([0.95, 0.85], dtype=torch.float64), rtol=0, atol=1e-7)


def test_make_optimizer_rejects_unknown_kind():
    class Cfg:
        kind, lr, betas, weight_decay = "rmsprop", 0.1, (0.9, 0.999), 0.0

    with pytest.raises(ValueError, match="optim.kind"):
        make_optimizer(Cfg(), [torch.nn.Parameter(torch.ones(1))])


@pytest.mark.parametrize("backbone", ["nam_tm", "nam_tm_nojmp"])
def test_paper_fib_nam_tm_is_the_cpu_presets_model(backbone):
    """Fib's NAM-TM at paper scale keeps what its CPU preset found Fib to need: the tapes at the
    unit head (without it the paper preset met a NaN loss at step 222, the heads at 1e22) and the
    authors' output block."""
    paper, cpu = load_config(f"paper/fib-{backbone}"), load_config(f"cpu/fib-{backbone}")
    for key in ("normalize_heads", "head"):
        assert paper.model.options[key] == cpu.model.options[key], key
    assert paper.model.options["normalize_heads"] == "all" and paper.model.options["head"] == "mlp"
