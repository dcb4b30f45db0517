"""`memnets bench ops --quick` runs end to end and reports ratios."""
from __future__ import annotations

import json

from memnets.bench.registry import format_table
from memnets.cli.main import main


def test_bench_ops_quick_json(tmp_path, capsys):
    out = tmp_path / "ops.json"
    assert main(["bench", "ops", "--quick", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["env"]["threads"] >= 1
    ops = {r["op"] for r in result["rows"]}
    assert ops == {"nam_scan fwd+bwd", "attention fwd+bwd"}
    for row in result["rows"]:
        assert row["speedup"] > 0 and row["ours_ms"] > 0
    assert "speedup" in printed and format_table(result).splitlines()[0].startswith("## ")


def test_unknown_suite_is_usage_error(capsys):
    try:
        main(["bench", "nope"])
    except SystemExit as e:
        assert e.code == 2
    assert "invalid choice" in capsys.readouterr().err
