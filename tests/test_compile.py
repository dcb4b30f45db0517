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
    assert len(eager_backend) == 4
    with pytest.raises(ValueError, match="compile_modes"):
        gpu.run(device="cpu", tiny=True, sections=(), verbose=False, compile_modes=("fastest",))


def test_bench_compile_belongs_to_the_gpu_suite(capsys):
    from memnets.cli.main import main
    with pytest.raises(SystemExit, match="--compile belong to the gpu suite"):
        main(["bench", "ops", "--compile", "default"])


@pytest.mark.slow
def test_compile_with_inductor_trains_like_eager(tmp_path):
    """The real backend (inductor, C++ on the CPU): the same losses to float32 rounding."""
    torch._dynamo.reset()
    _run(tmp_path, "eager")
    _run(tmp_path, "inductor", "compile=default")
    a = [r for r in records(tmp_path / "eager") if r["kind"] == "train"]
    b = [r for r in records(tmp_path / "inductor") if r["kind"] == "train"]
    assert len(a) == len(b) > 0
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-4, abs=1e-5)
