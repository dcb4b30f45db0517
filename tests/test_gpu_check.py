"""`make gpu-check`'s driver (memnets.bench.gpu_check) in its CPU dry run at tiny sizes: the JSON
and the markdown table are written (also to $OUT), with every bench row present, the rows whose
kernels need CUDA marked so, the CUDA tests' counts, and a wheel that does not install reported
without stopping the run."""
from __future__ import annotations

import json

from memnets.bench import gpu_check

ROWS = {
    "models": ["nn.LSTM (CPU)", "LSAM", "nn.LSTM (CPU) bi", "LSAM bi", "NAM-TM", "DNC", "NTM"],
    "attention": ["sdpa (flash)", "fla chunk_linear_attn", "nam_attention"],
    "scan": ["fla chunk_delta_rule (p_e=p_w)", "nam_scan auto (p_e=p_w)",
             "fla chunk_dplr_delta_rule gk=0 (p_e!=p_w)", "nam_scan auto (p_e!=p_w)"],
}
NEEDS_CUDA = {"sdpa (flash)", "fla chunk_linear_attn", "fla chunk_delta_rule (p_e=p_w)",
              "fla chunk_dplr_delta_rule gk=0 (p_e!=p_w)"}


def test_gpu_check_dry_run_writes_every_row(tmp_path, monkeypatch, capsys):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-0.0-py3-none-any.whl").write_bytes(b"not a zip")
    monkeypatch.setenv("OUT", str(tmp_path / "OUT"))
    code = gpu_check.main(["--cpu", "--out", str(tmp_path / "gc"), "--wheels", str(wheels),
                           "--tests-k", "test_ntm_matches_cpu and cuda_path", "--tests-timeout", "300"])
    assert code == 0
    for folder in (tmp_path / "gc", tmp_path / "OUT"):
        res = json.loads((folder / "gpu-check.json").read_text())
        md = (folder / "gpu-check.md").read_text()
        assert res["gpu"] == "none (CPU dry run)" and md.startswith("# GPU check: none (CPU dry run)")
        assert res["wheels"] == [{"wheel": "broken-0.0-py3-none-any.whl", "ok": False, "error": res["wheels"][0]["error"]}]
        t = res["tests"]
        assert (t["status"], t["passed"], t["failed"], t["errors"]) == ("ok", 1, 0, 0), t
        assert "1 passed, 0 failed" in md
        names = {(r["section"], r["name"]) for r in res["rows"]}
        for section, rows in ROWS.items():
            for name in rows:
                assert (section, name) in names, (section, name)
        for r in res["rows"]:
            assert f"| {r['section']} | {r['name']} | {r['config']} |" in md
            if r["name"] in NEEDS_CUDA:
                assert r["needs_cuda"] is True and r["ms"] is None and "needs CUDA" in r["note"], r
            else:
                assert r["needs_cuda"] is False and r["ms"] > 0 and r["first_ms"] > 0, r
            assert r["meets"] is None  # a dry run meets or misses no target
        counts = {}
        for r in res["rows"]:
            counts[r["name"]] = counts.get(r["name"], 0) + 1
        assert counts["nam_scan auto (p_e=p_w)"] == 3 and counts["nam_attention"] == 2
        assert {r["name"] for r in res["rows"] if r.get("baseline")} >= {"LSAM", "LSAM bi", "NAM-TM", "DNC", "NTM"}
        lc = res["launches"]
        assert [r["model"] for r in lc["rows"]] == ["LSAM", "LSAM bi", "NAM-TM", "DNC", "NTM"]
        assert all(r["launches_step"] > 0 for r in lc["rows"]) and "Kernel launches" in md
    assert (tmp_path / "OUT" / "gpu-check-tests.log").is_file()
    assert "[gpu-check] written:" in capsys.readouterr().out


def test_gpu_profile_step_on_the_cpu():
    """memnets.bench.gpu_profile's measurement, run on the CPU (its rows need CUDA)."""
    import torch

    from memnets.bench.gpu import _train_step
    from memnets.bench.gpu_profile import main, profile_step

    model = torch.nn.LSTM(4, 8, batch_first=True)
    x = torch.randn(2, 5, 4)
    r = profile_step(_train_step(model, x, lambda x: model(x)[0]), repeat=2, device="cpu")
    assert r["wall_ms"] > 0 and r["launches"] > 0 and r["top"]
    assert all(t["kernel"].startswith("aten::") for t in r["top"])
    if not torch.cuda.is_available():
        assert main([]) == 2  # nothing to profile without CUDA, said so
