"""``memnets report`` on damaged run folders: an unreadable config.json or results.json is named
in the one-line error (and nothing is written); unreadable lines of metrics.jsonl are skipped
with one warning that counts them."""
import json

import pytest

from memnets.cli.main import main

_RESULTS = {"name": "r", "task": "reduce", "backbone": "lstm", "params": 10, "select_split": "id", "best_epoch": 1,
            "splits": {"id": {"seq_acc": 0.5, "tok_acc": 0.5, "loss": 1.0, "n": 4}}}
_LINES = [{"kind": "train", "epoch": 0, "step": 1, "loss": 2.0, "tok_acc": 0.0, "lr": 0.003},
          {"kind": "train", "epoch": 0, "step": 2, "loss": 1.5, "tok_acc": 0.1, "lr": 0.003}]


def _run_dir(tmp_path, name="run"):
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(_RESULTS))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _LINES))
    return d


@pytest.mark.parametrize("name,content", [("results.json", "garbage"), ("results.json", "[1, 2]"),
                                          ("config.json", '{"task": '), ("config.json", "\xff\xfe"),
                                          ("config.json", "[1]")])
def test_a_bad_file_is_named(tmp_path, capsys, name, content):
    d = _run_dir(tmp_path)
    if name == "results.json":  # a run of `memnets train` (a results.json alone is checked for its "task")
        (d / "config.json").write_text("{}")
    (d / name).write_bytes(content.encode("latin-1"))
    out = tmp_path / "report.html"
    assert main(["report", str(d), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(d / name) in err, err
    assert not out.exists()


def test_unreadable_metrics_lines_warn_once_with_the_count(tmp_path, capsys):
    good = _run_dir(tmp_path, "good")
    bad = _run_dir(tmp_path, "bad")
    with open(bad / "metrics.jsonl", "a") as f:
        f.write("garbage\n[1, 2]\n\n{\"kind\": \"tra")  # two bad lines, an empty one, a torn last line
    out = tmp_path / "report.html"
    assert main(["report", str(good), str(bad), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    warnings = [x for x in err.splitlines() if "unreadable" in x]
    assert len(warnings) == 1, err
    assert str(bad / "metrics.jsonl") in warnings[0] and "skipped 3 unreadable lines" in warnings[0]
    assert out.is_file()
