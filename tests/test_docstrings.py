"""Every public symbol (each module's ``__all__``) carries a docstring of its own."""
from __future__ import annotations

import importlib
import inspect

import pytest

import memnets

MODULES = [
    "memnets", "memnets.ops", "memnets.attention", "memnets.registry", "memnets.state",
    "memnets.pretrained", "memnets.datadir",
    "memnets.memories.lsam", "memnets.memories.nam_tm", "memnets.memories.fewshot",
    "memnets.memories.ntm", "memnets.memories.dnc", "memnets.memories.memn2n",
    "memnets.memories.fast_weights",
    "memnets.models.transformer", "memnets.models.lstm_baseline", "memnets.models.lsam_seq2seq",
    "memnets.models.seq", "memnets.models.conv4",
    "memnets.tasks.nsp", "memnets.tasks.ntm_tasks", "memnets.tasks.babi", "memnets.tasks.omniglot",
    "memnets.tasks.retrieval", "memnets.tasks.listops", "memnets.tasks.imdb",
    "memnets.train", "memnets.viz", "memnets.capacity",
]


def _public(modname):
    mod = importlib.import_module(modname)
    for name in getattr(mod, "__all__", []):
        obj = getattr(mod, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            yield name, obj


@pytest.mark.parametrize("modname", MODULES)
def test_public_symbols_have_docstrings(modname):
    missing = []
    for name, obj in _public(modname):
        doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
        if not (doc and doc.strip()):
            missing.append(name)
    assert not missing, f"{modname}: no docstring on {missing}"


def test_every_lazy_name_resolves():
    for name in memnets.__all__:
        assert getattr(memnets, name) is not None, name
