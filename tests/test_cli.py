"""``memnets train / eval / table / configs / demo`` (in-process, tiny sizes)."""
from __future__ import annotations

import json

import pytest
import torch

from memnets.cli.main import main

TINY = """
seed = 0
epochs = 1
batch_size = 16
threads = 1

[model]
backbone = "bilstm"
d_model = 16
options = { num_layers = 1 }

[task]
name = "reduce"
train_digits = [1, 3]
train_size = 32
eval_size = 16
splits = { id = [2, 3], od_easy = [4, 5], od_hard = [6, 7] }
"""


@pytest.mark.parametrize("cmd", [["train"], ["eval"], ["table"], ["configs"], ["configs", "ls"],
                                 ["configs", "show"], ["demo"], ["suite"], ["suite", "run"],
                                 ["suite", "ls"]])
def test_help_everywhere(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([*cmd, "--help"])
    assert e.value.code == 0
    assert "usage: memnets " + cmd[0] in capsys.readouterr().out


def test_configs_ls_and_show(capsys):
    assert main(["configs", "ls", "cpu/"]) == 0
    out = capsys.readouterr().out
    assert "cpu/reduce-nam_tm" in out and "paper/" not in out
    assert main(["configs", "show", "paper/reduce-transformer", "optim.lr=0.5"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["optim"]["lr"] == 0.5 and shown["model"]["options"]["num_layers"] == 8
    assert main(["configs", "show", "paper/reduce-transformer", "optim.lrr=0.5"]) == 2
    assert "did you mean `optim.lr`" in capsys.readouterr().err


def test_train_eval_table(tmp_path, capsys):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    run = tmp_path / "run"
    assert main(["train", str(cfg), "seed=2", "--run-dir", str(run), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["name"] == "tiny" and set(summary["seq_acc"]) == {"id", "od_easy", "od_hard"}
    assert json.loads((run / "config.json").read_text())["seed"] == 2
    # the same directory again without --resume is refused with exit status 2
    assert main(["train", str(cfg), "seed=2", "--run-dir", str(run), "--quiet"]) == 2
    assert "--resume" in capsys.readouterr().err
    # a finished run resumes to the same results without training further
    assert main(["train", str(cfg), "seed=2", "--run-dir", str(run), "--quiet", "--resume"]) == 0
    capsys.readouterr()

    assert main(["eval", str(run), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    res = json.loads((run / "results.json").read_text())
    assert ev["od_hard"]["n"] == 16
    assert ev["od_easy"]["seq_acc"] == res["splits"]["od_easy"]["seq_acc"]  # best weights = selected epoch
    # --by-digits adds one row per digit count; the rows add up to their split
    assert main(["eval", str(run), "--json", "--by-digits"]) == 0
    evd = json.loads(capsys.readouterr().out)
    rows = [k for k in evd if k.startswith("od_hard/")]
    assert sorted(rows) == ["od_hard/6", "od_hard/7"]  # the TINY split od_hard = [6, 7]
    assert sum(evd[k]["n"] for k in rows) == 16
    assert sum(evd[k]["seq_acc"] * evd[k]["n"] for k in rows) == pytest.approx(16 * ev["od_hard"]["seq_acc"])
    # --by-slot: one accuracy per answer slot; weighted by their counts they give ans_acc
    assert main(["eval", str(run), "--json", "--by-slot"]) == 0
    evs = json.loads(capsys.readouterr().out)
    sl = evs["od_hard/slots"]
    assert len(sl["slot_acc"]) == len(sl["slot_n"]) >= 6 and sl["slot_n"][0] == 16
    assert sum(sl["slot_n"][k] >= sl["slot_n"][k + 1] for k in range(len(sl["slot_n"]) - 1)) == len(sl["slot_n"]) - 1
    assert sum(a * n for a, n in zip(sl["slot_acc"], sl["slot_n"])) / sum(sl["slot_n"]) == \
        pytest.approx(ev["od_hard"]["ans_acc"])
    assert main(["eval", str(run), "--by-slot"]) == 0
    assert "Answer-slot accuracy" in capsys.readouterr().out
    # --draw N: splits of the same digit ranges drawn independently of the run's own
    from memnets.train.families.nsp import eval_splits
    from memnets.train.runs import load_run

    cfg_run = load_run(run, "best").config
    own, other, again = eval_splits(cfg_run), eval_splits(cfg_run, 1), eval_splits(cfg_run, 1)
    assert torch.equal(other["od_hard"].inputs, again["od_hard"].inputs)
    assert not torch.equal(own["od_hard"].inputs, other["od_hard"].inputs)
    assert torch.equal(own["od_hard"].digits.sort().values, other["od_hard"].digits.sort().values)
    assert main(["eval", str(run), "--json", "--draw", "0"]) == 0
    assert json.loads(capsys.readouterr().out) == ev
    assert main(["eval", str(run), "--json", "--draw", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["od_hard"]["n"] == 16
    assert main(["eval", str(run), "--draw", "-1"]) == 2
    assert "--draw" in capsys.readouterr().err
    # --save keeps the scores; `table --eval` shows them instead of results.json's
    assert main(["eval", str(run), "--json", "--draw", "3", "--eval-size", "24", "--save",
                 str(run / "eval-heldout.json")]) == 0
    shown = json.loads(capsys.readouterr().out)
    saved = json.loads((run / "eval-heldout.json").read_text())
    assert saved["splits"] == shown and saved["draw"] == 3 and saved["eval_size"] == 24
    assert saved["checkpoint"] == "best" and shown["id"]["n"] == 24
    from memnets.cli.table import load_results, with_evaluation

    [r] = with_evaluation(load_results([run]), "eval-heldout.json")
    assert r["splits"] == shown and r["evaluated"] == {"checkpoint": "best", "draw": 3, "eval_size": 24}
    assert main(["table", str(run), "--eval", "eval-heldout.json", "--metric", "tok_acc"]) == 0
    tab = capsys.readouterr().out
    assert f"{100 * shown['od_hard']['tok_acc']:.1f}" in tab, tab
    assert main(["table", str(run), "--eval", "nothing.json"]) == 2
    assert "none of the runs has nothing.json" in capsys.readouterr().err
    (run / "bad.json").write_text("[1]")
    assert main(["table", str(run), "--eval", "bad.json"]) == 2
    assert "not a saved evaluation" in capsys.readouterr().err

    # --at last: each run at its last evaluation (results.json's "final"), not the selected one
    final = json.loads((run / "results.json").read_text())["final"]
    assert main(["table", str(run), "--at", "last", "--metric", "tok_acc"]) == 0
    tab = capsys.readouterr().out
    assert f"{100 * final['od_hard']['tok_acc']:.1f}" in tab and "last evaluation" in tab, tab
    assert main(["table", str(run), "--at", "last", "--eval", "eval-heldout.json"]) == 2
    assert "give one" in capsys.readouterr().err
    broken = tmp_path / "nofinal"
    broken.mkdir()
    (broken / "results.json").write_text(json.dumps({k: v for k, v in res.items() if k != "final"}))
    assert main(["table", str(broken), "--at", "last"]) == 2
    assert "no last evaluation" in capsys.readouterr().err

    out_md = tmp_path / "t.md"
    assert main(["table", str(run), str(tmp_path / "missing"), "--out", str(out_md)]) == 0
    cap = capsys.readouterr()
    assert "| Reduce | ID |" in cap.out and "biLSTM" in cap.out and "Parameters" in cap.out
    assert "skipping" in cap.err and out_md.read_text().startswith("| Model |")
    assert main(["table", "--paper"]) == 0
    assert "71.5%" in capsys.readouterr().out


def test_bad_input_exit_2(tmp_path, capsys):
    assert main(["train", "no-such-preset"]) == 2
    assert "no preset" in capsys.readouterr().err
    assert main(["eval", str(tmp_path)]) == 2
    assert main(["table"]) == 2


def test_demo_tiny(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = main(["demo", "--skip-bench", "--quiet", "--out", str(out), "epochs=1", "task.train_size=32",
               "task.eval_size=8", "batch_size=16"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| Reduce | ID |" in text and "OD-hard" in text
    png = out / "learning_curves.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "table.md").is_file()
