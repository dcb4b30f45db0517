"""`memnets bench ops --quick` runs end to end and reports ratios; the packed and C-kernel rows
of `memnets bench models` run."""
from __future__ import annotations

import json

import pytest
import torch

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


def test_bench_gpu_device_is_resolved_like_a_runs(capsys):
    """`--device` goes through memnets.train.env.resolve_device: auto picks CUDA when there is one,
    and a device this machine lacks is refused with a plain message (exit 2)."""
    from memnets.bench import gpu

    res = gpu.run(device=None, sections=(), verbose=False)
    assert res["gpu"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (cpu)")
    assert gpu.run(device="cpu", sections=(), verbose=False)["gpu"] == "cpu (cpu)"
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the refusal of a missing CUDA cannot be shown here")
    assert main(["bench", "gpu", "--device", "cuda", "--tiny"]) == 2
    assert "CUDA is not available on this machine" in capsys.readouterr().err


def test_packed_bench_rows_quick():
    """`memnets bench models`' packed rows run (quick sizes): LSAM against nn.LSTM and itself
    padded, the NAM-TM and the DNC against themselves padded; and the DNC's and the NTM's C
    access steps against their PyTorch paths."""
    import math

    from memnets.bench.models_classic import _dnc_native_cases, _dnc_packed_case, _ntm_case
    from memnets.bench.models_nam import _packed_cases

    rows = [*_packed_cases(True, 1), _dnc_packed_case(True), *_dnc_native_cases(True), *_ntm_case(True)]
    assert [r["model"] for r in rows] == ["LSAM (bi) packed", "LSAM (bi) packed", "NAM-TM packed", "dnc packed",
                                          "dnc access in C", "dnc access in C", "ntm", "ntm access in C",
                                          "ntm access in C"]
    assert all(math.isfinite(r["ratio"]) and r["ratio"] > 0 for r in rows)
    assert "distinct lengths" in rows[2]["config"] and "one call" in rows[3]["note"]
    assert [r["config"].rsplit("; ", 1)[-1] for r in rows[-2:]] == ["training step", "forward only (no_grad)"]
    assert all(r["baseline"] == "the same NTM, MEMNETS_NATIVE=0" for r in rows[-2:])
