"""save_pretrained / from_pretrained: one-line round trip through JSON + safetensors."""
from __future__ import annotations

import json

import pytest
import torch

import memnets
from memnets.pretrained import load_pretrained
from memnets.registry import register_model


@register_model("_test_tiny_mlp")
class TinyMLP(torch.nn.Module):
    def __init__(self, d_in: int, d_hidden: int = 8, *, act: str = "relu", dims=(1, 2)):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(d_in, d_hidden), torch.nn.ReLU() if act == "relu" else torch.nn.Tanh())
        self.dims = tuple(dims)

    def forward(self, x):
        return self.net(x)


def test_round_trip_restores_config_and_weights(tmp_path):
    model = TinyMLP(3, act="tanh", dims=(4, 5))
    x = torch.randn(2, 3)
    model.save_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model"] == "_test_tiny_mlp"
    assert cfg["kwargs"] == {"d_in": 3, "d_hidden": 8, "act": "tanh", "dims": [4, 5]}
    loaded = TinyMLP.from_pretrained(tmp_path / "m")
    assert isinstance(loaded, TinyMLP) and loaded.dims == (4, 5)
    torch.testing.assert_close(loaded(x), model(x))
    torch.testing.assert_close(load_pretrained(tmp_path / "m")(x), model(x))


def test_real_models_round_trip(tmp_path):
    names = [n for n in memnets.available_models() if not n.startswith("_test")]
    assert names, "no model registered"
    fw = memnets.build_model("fast_weights", **_fast_weights_kwargs()) if "fast_weights" in names else None
    if fw is None:
        pytest.skip("fast_weights model not available")
    fw.save_pretrained(tmp_path / "fw")
    again = type(fw).from_pretrained(tmp_path / "fw")
    for (n1, p1), (n2, p2) in zip(fw.state_dict().items(), again.state_dict().items()):
        assert n1 == n2
        torch.testing.assert_close(p1, p2)


def _fast_weights_kwargs():
    import inspect

    cls = memnets.registry.get_model_class("fast_weights")
    params = inspect.signature(cls.__init__).parameters
    kw = {}
    for name, p in params.items():
        if name == "self" or p.default is not inspect.Parameter.empty or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        kw[name] = 8  # required sizes
    if "num_heads" in params and params["num_heads"].default is inspect.Parameter.empty:
        kw["num_heads"] = 2
    return kw


def test_corrupt_weights_and_wrong_class_give_clear_errors(tmp_path):
    model = TinyMLP(3)
    d = model.save_pretrained(tmp_path / "m")
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[:20])
    with pytest.raises(ValueError, match="model.safetensors"):
        TinyMLP.from_pretrained(d)
    with pytest.raises(FileNotFoundError, match="config.json"):
        TinyMLP.from_pretrained(tmp_path / "missing")


def test_unregistered_model_cannot_save(tmp_path):
    with pytest.raises(TypeError, match="register_model"):
        memnets.pretrained.save_pretrained(torch.nn.Linear(2, 2), tmp_path)
