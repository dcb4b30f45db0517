"""`memnets report`: one self-contained HTML page (table + embedded PNG figures, no external
resources), readable in headless Chromium (screenshot test, skipped without Chromium)."""
from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from memnets.cli.main import main
from memnets.viz import build_report, results_row

CHROMIUM = Path("/usr/bin/chromium")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _engine_run(root: Path, backbone: str, options: dict) -> Path:
    from memnets.train import config_from_dict
    from memnets.train.loop import train

    cfg = config_from_dict({
        "name": f"rep-{backbone}", "epochs": 1, "batch_size": 2, "log_every": 1, "threads": 1,
        "model": {"backbone": backbone, "d_model": 16, "options": options},
        "task": {"name": "reduce", "train_digits": [1, 3], "train_size": 4, "eval_size": 2,
                 "splits": {"id": [2, 3], "od_easy": [4, 4]}},
        "select_split": "od_easy", "optim": {"lr": 1e-3}})
    train(cfg, root / cfg.name, quiet=True)
    return root / cfg.name


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, list[Path]]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("report")
    runs = [_engine_run(root, "ntm", {"memory_slots": 8, "word_size": 8, "controller_size": 16}),
            _engine_run(root, "bilstm", {"num_layers": 1})]
    out = root / "out" / "report.html"
    assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    return out, runs


def test_report_is_self_contained(report):
    out, runs = report
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "<table" in page and "</table>" in page
    for run in runs:
        assert json.loads((run / "results.json").read_text())["name"] in page
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    # ntm: learning curve + weightings; bilstm: learning curve only (no memory to show); combined curves
    assert len(images) == 4, len(images)
    for b64 in images:
        assert base64.b64decode(b64)[:8] == PNG_SIGNATURE
    assert "<script" not in page.lower()
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "the page references an external resource"
    assert "<style>" in page


def test_report_table_rows(report):
    _, runs = report
    row = results_row(runs[0])
    assert row["run"] == "rep-ntm" and row["model"] == "ntm" and row["task"] == "reduce"
    assert row["od_easy seq_acc"].endswith("%") and row["id seq_acc"].endswith("%")
    assert int(row["params"]) > 0


def test_report_keeps_a_broken_run(tmp_path, report):
    _, runs = report
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "results.json").write_text(json.dumps({"name": "broken-run", "task": "reduce"}))
    out = build_report([runs[1], broken], tmp_path / "r.html")
    page = out.read_text()
    assert "broken-run" in page and "no figures" in page
    assert page.count('<img src="data:image/png;base64,') == 1  # lstm curve only: one curve, no combined


def test_report_rejects_bad_input(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "r.html")]) == 2
    assert "not a directory" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least one run"):
        build_report([], tmp_path / "r.html")


def test_report_renders_in_headless_chromium(report, tmp_path):
    if not CHROMIUM.exists():
        msg = f"{CHROMIUM} is missing: install Debian's chromium to run the screenshot test"
        print(msg)
        pytest.skip(msg)
    from PIL import Image

    out, _ = report
    shot = tmp_path / "shot.png"
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,900",
           f"file://{out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), f"no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
    assert shot.read_bytes()[:8] == PNG_SIGNATURE
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 900)
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is None or len(colours) > 50, "the screenshot is (nearly) a single colour"
    # the page is not blank: a good part of it is not background white
    small = np.asarray(img.resize((120, 90)), dtype=np.int64)  # [90, 120, 3]
    dark = int((small.sum(-1) < 600).sum())
    assert dark > 100, dark
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)
