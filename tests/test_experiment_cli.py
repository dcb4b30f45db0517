"""``memnets experiment``: presets parse with their experiment's own parser, flags after the
preset override it, errors name what was expected, and a run goes through end to end."""
from __future__ import annotations

import argparse
import importlib
import json

import pytest

from memnets.cli.experiment import EXPERIMENTS, PRESETS, experiment_argv
from memnets.cli.main import main


class _Parsed(Exception):
    def __init__(self, ns):
        super().__init__("parsed")
        self.ns = ns


@pytest.mark.parametrize("key", sorted(PRESETS))
def test_every_preset_parses_with_its_experiment(key, monkeypatch):
    name, preset = key
    real = argparse.ArgumentParser.parse_args

    def stop_after_parsing(self, args=None, namespace=None):
        raise _Parsed(real(self, args, namespace))  # an unknown flag exits here instead

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after_parsing)
    module = importlib.import_module(f"memnets.experiments.{EXPERIMENTS[name][0]}")
    with pytest.raises(_Parsed) as got:
        module.main(experiment_argv(name, preset, ["--seed", "3"]))
    assert got.value.ns.seed == 3


def test_later_flags_override_the_preset():
    argv = experiment_argv("lra", "listops-200", ["--steps", "7"])
    assert argv[:2] == ["--task", "listops"] and argv[-2:] == ["--steps", "7"]
    from memnets.experiments.lra import parse_args

    assert parse_args(argv).steps == 7 and parse_args(argv).max_len == 200
    assert experiment_argv("ntm-copy", None, ["--steps", "2"]) == ["--steps", "2"]


def test_errors_name_the_expected_values(capsys):
    with pytest.raises(ValueError, match="expected one of"):
        experiment_argv("nope", None, [])
    with pytest.raises(ValueError, match="listops-200"):
        experiment_argv("lra", "nope", [])
    assert main(["experiment", "lra/nope"]) == 2
    assert "preset of 'lra' expected one of" in capsys.readouterr().err
    assert main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EXPERIMENTS) and "listops-2000" in out


def test_runs_an_experiment_end_to_end(tmp_path):
    import torch

    threads = torch.get_num_threads()
    try:
        assert main(["experiment", "ntm-copy/cpu", "--steps", "2", "--log-every", "1", "--eval-lengths", "4",
                     "--max-len", "3", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["steps"] == 2 and res["sequences_seen"] == 16  # the override, batch 8
    assert res["args"]["log_every"] == 1 and res["args"]["eval_lengths"] == [4]
