"""``compile`` (``torch.compile`` of the training forward) in the engine and in ``memnets bench gpu``.

The default tests swap the compiler's backend for dynamo's ``eager`` one: the engine's plumbing
(what is compiled, that evaluation and checkpoints use the plain module, resume) is checked in
seconds and the numbers must equal the eager run's exactly. A ``slow`` test compiles with
inductor, the real backend.
"""
from __future__ import annotations

import json

import pytest
import torch

from engine_helpers import records, tiny_config
from helpers import backbone_names, tiny_backbone_model


@pytest.fixture
def eager_backend(monkeypatch):
    """torch.compile with dynamo's ``eager`` backend; the calls are recorded."""
    calls = []
    real = torch.compile

    def fake(model, *args, mode=None, **kw):
        calls.append({"model": model, "mode": mode})
        return real(model, backend="eager")

    monkeypatch.setattr(torch, "compile", fake)
    return calls


def _run(tmp_path, name, *more, resume=False):
    from memnets.train import train
    cfg = tiny_config("cpu/reduce-transformer", "max_steps=4", "model.options={num_layers = 1, num_heads = 2}", *more)
    return train(cfg, tmp_path / name, quiet=True, resume=resume)


def test_compile_runs_the_training_forward_compiled_and_equals_eager(tmp_path, eager_backend):
    torch._dynamo.reset()
    _run(tmp_path, "eager")
    assert eager_backend == []  # compile = "none" (the default) compiles nothing
    _run(tmp_path, "compiled", "compile=reduce-overhead")
    assert len(eager_backend) == 1 and eager_backend[0]["mode"] == "reduce-overhead"
    assert not isinstance(eager_backend[0]["model"], torch._dynamo.eval_frame.OptimizedModule)
    # the same losses, evaluations and selected epoch; compile is not written into config.json by default
    assert records(tmp_path / "eager") == records(tmp_path / "compiled")
    assert "compile" not in json.loads((tmp_path / "eager" / "config.json").read_text())
    assert json.loads((tmp_path / "compiled" / "config.json").read_text())["compile"] == "reduce-overhead"
    # weights are saved from the plain module: no "_orig_mod." prefixes
    from safetensors.torch import load_file
    keys = load_file(str(tmp_path / "compiled" / "checkpoints" / "best.safetensors")).keys()
    assert keys and not any(k.startswith("_orig_mod") for k in keys)


def test_compile_may_change_on_resume(tmp_path, eager_backend):
    _run(tmp_path, "r", "max_steps=2")
    out = _run(tmp_path, "r", "max_steps=2", "compile=default", resume=True)  # no config mismatch
    assert out is not None and eager_backend[-1]["mode"] is None  # "default" is torch.compile's mode=None


def test_compile_rejects_unknown_modes():
    from memnets.train.config import ConfigError
    with pytest.raises(ConfigError, match="`compile` expected one of"):
        tiny_config("cpu/reduce-transformer", "compile=fast")


def test_bench_gpu_times_compiled_models_beside_eager(eager_backend):
    from memnets.bench import gpu
    res = gpu.run(device="cpu", tiny=True, sections=("models",), verbose=False, compile_modes=("default",),
                  max_seconds=3600)
    rows = {r["name"]: r for r in res["rows"]}
    assert res["compile_modes"] == ["default"]
    for name in ("LSAM", "LSAM bi", "DNC", "NAM-TM"):
        eager, comp = rows[name], rows[f"{name} compile=default"]
        assert eager["ms"] and comp["ms"] and comp["compile"] == "default", comp
        assert comp["speedup_vs_eager"] == round(eager["ms"] / comp["ms"], 3)
        assert "than eager" in comp["note"]
    # the four models (a library imported on the way, e.g. fla, may compile functions of its own)
    assert len([c for c in eager_backend if isinstance(c["model"], torch.nn.Module)]) == 4
    with pytest.raises(ValueError, match="compile_modes"):
        gpu.run(device="cpu", tiny=True, sections=(), verbose=False, compile_modes=("fastest",))


def test_bench_compile_belongs_to_the_gpu_suite(capsys):
    from memnets.cli.main import main
    with pytest.raises(SystemExit, match="--compile belong to the gpu suite"):
        main(["bench", "ops", "--compile", "default"])


@pytest.mark.parametrize("backbone", backbone_names())
def test_every_sequence_backbone_traces_into_one_graph(backbone):
    """Under compile the memories take their reference paths and nn.GRU / nn.LSTM are traced:
    no graph break, so reduce-overhead can replay the whole forward as one CUDA graph."""
    model = tiny_backbone_model(backbone)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):  # as compile_module sets it
        ex = torch._dynamo.explain(model)(torch.randint(0, 16, (3, 12)))
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), [b.reason.splitlines()[0] for b in ex.break_reasons]


def _memories():
    from memnets.memories.dnc import DNC
    from memnets.memories.lsam import LSAM
    from memnets.memories.nam_tm import NAMTuringMachine
    return {
        "LSAM": (lambda: LSAM(12, 12, 4, bidirectional=True), 12),
        "DNC": (lambda: DNC(9, 8, memory_slots=8, word_size=6, read_heads=2, controller_size=16), 9),
        "NAM-TM": (lambda: NAMTuringMachine(10, 16, num_tapes=2, tape_length=8), 10),
        "NAM-TM unit keys": (lambda: NAMTuringMachine(10, 16, num_tapes=2, tape_length=8, normalize_heads="all"), 10),
    }


@pytest.mark.parametrize("name", list(_memories()))
def test_compiled_memory_equals_its_fused_eager_path(name):
    """float64: the compiled module (reference path, traced) and the eager one (fused path, C
    kernels where built) give the same outputs and gradients."""
    build, Fi = _memories()[name]
    torch.manual_seed(0)
    model = build().double()
    assert model.impl in ("auto", "fused")
    x = torch.randn(3, 7, Fi, dtype=torch.float64)
    w = None
    grads = []
    torch._dynamo.reset()
    for run in (model, torch.compile(model, backend="eager")):
        xi = x.clone().requires_grad_()
        y = run(xi)[0]
        w = torch.randn_like(y) if w is None else w
        model.zero_grad(set_to_none=True)
        (y * w).sum().backward()
        grads.append([y.detach(), xi.grad] + [p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["cpu/reduce-transformer", "cpu/reduce-nam_tm"])
def test_compile_with_inductor_trains_like_eager(tmp_path, preset):
    """The real backend (inductor, C++ on the CPU): the same losses to float32 rounding (the
    NAM-TM: its C kernels eagerly, its reference path compiled)."""
    from memnets.train import train
    more = ["model.options={num_layers = 1, num_heads = 2}"] if "transformer" in preset else []

    def run(name, *extra):
        train(tiny_config(preset, "max_steps=4", *more, *extra), tmp_path / name, quiet=True)

    torch._dynamo.reset()
    run("eager")
    run("inductor", "compile=default")
    a = [r for r in records(tmp_path / "eager") if r["kind"] == "train"]
    b = [r for r in records(tmp_path / "inductor") if r["kind"] == "train"]
    assert len(a) == len(b) > 0
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-4, abs=1e-5)


def test_memn2n_with_random_noise_trains_compiled():
    """MemN2N's random noise (data-dependent sizes) runs eagerly inside the compiled model."""
    from memnets.memories.memn2n import MemN2N
    torch.manual_seed(0)
    model = MemN2N(12, 8, 3, 10, sentence_size=5, random_noise=0.3).train()
    query = torch.randint(1, 12, (4, 5))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    for M in (6, 7, 9):  # batches of several story lengths: the second makes M a dynamic size
        stories = torch.randint(1, 12, (4, M, 5))
        stories[:, :, 3:] = 0
        torch.manual_seed(M)
        y = compiled(stories, query)
        torch.manual_seed(M)
        ref = model(stories, query)  # the same noise draws, eagerly
        torch.testing.assert_close(y, ref)
        model.zero_grad(set_to_none=True)
        y.sum().backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
