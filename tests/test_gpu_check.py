"""`make gpu-check`'s driver (memnets.bench.gpu_check) in its CPU dry run at tiny sizes: the JSON
and the markdown table are written (also to $OUT), with every bench row present, the rows whose
kernels need CUDA marked so, the CUDA tests' counts, the time plan and the phases' seconds, and a
wheel that does not install reported without stopping the run. Also: the pytest output parser
(one process and pytest-xdist), the warm-up's calls on stand-ins for fla's kernels, and its child
processes on the CPU; a bench row that hangs, kills its process or loses its CUDA context costs
that row alone (the sections run in child processes that resume after it)."""
from __future__ import annotations

import json
import time

import pytest
import torch

from memnets.bench import gpu_check, isolated

ROWS = {
    "models": ["nn.LSTM (CPU)", "LSAM", "nn.LSTM (CPU) bi", "LSAM bi", "NAM-TM", "NAM-TM (MEMNETS_MODULE_GRAPHS=0)", "DNC",
               "DNC (MEMNETS_MODULE_GRAPHS=0)", "NTM",
               "nn.LSTM (CPU) (whole step graphed)", "LSAM (whole step graphed)", "NAM-TM (whole step graphed)",
               "DNC (whole step graphed)", "NTM (whole step graphed)", "DNC (MEMNETS_TIME_LOOP=steps)",
               "NTM (MEMNETS_TIME_LOOP=steps)", "DNC (MEMNETS_TIME_LOOP=steps) (whole step graphed)",
               "NTM (MEMNETS_TIME_LOOP=steps) (whole step graphed)"],
    "attention": ["sdpa (flash)", "fla chunk_linear_attn", "nam_attention", "nam_attention impl=torch",
                  "nam_attention impl=fla", "chunk prefix sums (torch.cumsum)", "chunk prefix sums (Triton)",
                  "nam_attention d=128 impl=torch", "nam_attention d=128 impl=fla", "nam_attention d=128 impl=triton",
                  "nam_attention (MEMNETS_ATTENTION_BACKWARD=split)"],
    "scan": ["fla chunk_delta_rule (p_e=p_w)", "nam_scan auto (p_e=p_w)",
             "fla chunk_dplr_delta_rule gk=0 (p_e!=p_w)", "nam_scan auto (p_e!=p_w)"],
}
NEEDS_CUDA = {"sdpa (flash)", "fla chunk_linear_attn", "nam_attention impl=fla", "fla chunk_delta_rule (p_e=p_w)",
              "fla chunk_dplr_delta_rule gk=0 (p_e!=p_w)", "chunk prefix sums (Triton)", "nam_attention d=128 impl=fla",
              "nam_attention d=128 impl=triton", "nam_attention (MEMNETS_ATTENTION_BACKWARD=split)"}


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
        from memnets.ops.gpu import triton_ok
        assert res["env"]["triton_kernels"] == triton_ok()
        assert ("memnets' Triton kernels did not run" in md) == (not triton_ok())
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
        assert "## Alternatives against the default" in md and "| DNC | " in md
        counts = {}
        for r in res["rows"]:
            counts[r["name"]] = counts.get(r["name"], 0) + 1
        assert counts["nam_scan auto (p_e=p_w)"] == 3 and counts["nam_attention"] == 2
        assert {r["name"] for r in res["rows"] if r.get("baseline")} >= {"LSAM", "LSAM bi", "NAM-TM", "DNC", "NTM"}
        lc = res["launches"]
        assert [r["model"] for r in lc["rows"]] == ["LSAM", "LSAM bi", "NAM-TM", "DNC", "NTM"]
        assert all(r["launches_step"] > 0 for r in lc["rows"]) and "Kernel launches" in md
        # the warm-up runs on CUDA only; the time plan and each phase's seconds are kept
        assert res["warmup"] == {"status": "not run: warm-up: CUDA only"}
        assert "warm-up: not run: warm-up: CUDA only" in res["notes"]
        assert not any(r.get("during_warmup") for r in res["rows"])
        plan = res["plan"]
        assert plan["limit_s"] == 480 and plan["tests_timeout_s"] == 300 and plan["warmup"] is None
        assert set(res["phases"]) >= {"wheels", "tests", "models", "attention", "scan", "launches", "total"}
        assert all(v >= 0 for v in res["phases"].values())
        assert "## Time" in md and "time plan: everything within 480 s" in md and "phases (s): " in md
    assert (tmp_path / "OUT" / "gpu-check-tests.log").is_file()
    out = capsys.readouterr().out
    assert "[gpu-check] written:" in out
    assert "[gpu-check] time plan: everything within 480 s" in out and "[gpu-check] phases (s): " in out
    assert out.index("[gpu-check] time plan") < out.index("[gpu-check] CUDA tests")


def test_parse_test_results_one_process_and_xdist():
    one = """tests/test_cuda.py::test_ntm_matches_cpu[cuda] PASSED                    [ 10%]
tests/test_cuda.py::test_dnc_matches_cpu[cuda-fused] FAILED               [ 20%]
tests/test_cuda.py::test_memn2n_matches_cpu[cuda] SKIPPED (no GPU)        [ 30%]
tests/test_cuda.py::test_lsam_layer_matches_cpu[cuda] PASSED              [ 40%]
tests/test_cuda.py::test_lsam_layer_matches_cpu[cuda] ERROR               [ 40%]
FAILED tests/test_cuda.py::test_dnc_matches_cpu[cuda-fused] - AssertionError: x
"""
    xdist = """[gw0] linux -- Python 3.11.9 /usr/bin/python
[gw1] [ 10%] PASSED tests/test_cuda.py::test_ntm_matches_cpu[cuda]
[gw0] [ 20%] FAILED tests/test_cuda.py::test_dnc_matches_cpu[cuda-fused]
[gw3] [ 30%] SKIPPED tests/test_cuda.py::test_memn2n_matches_cpu[cuda]
[gw2] [ 40%] PASSED tests/test_cuda.py::test_lsam_layer_matches_cpu[cuda]
[gw2] [ 40%] ERROR tests/test_cuda.py::test_lsam_layer_matches_cpu[cuda]
[gw11] [100%] XFAIL tests/test_triton_ntm.py::test_x
[gw4] PASSED tests/test_triton_ntm.py::test_y
FAILED tests/test_cuda.py::test_dnc_matches_cpu[cuda-fused] - AssertionError: x
"""
    expected = {"tests/test_cuda.py::test_ntm_matches_cpu[cuda]": "PASSED",
                "tests/test_cuda.py::test_dnc_matches_cpu[cuda-fused]": "FAILED",
                "tests/test_cuda.py::test_memn2n_matches_cpu[cuda]": "SKIPPED",
                "tests/test_cuda.py::test_lsam_layer_matches_cpu[cuda]": "ERROR"}
    assert gpu_check.parse_test_results(one) == expected
    assert gpu_check.parse_test_results(xdist) == {**expected, "tests/test_triton_ntm.py::test_x": "XFAIL",
                                                   "tests/test_triton_ntm.py::test_y": "PASSED"}
    assert gpu_check.parse_test_results("") == {}


def test_failure_messages_and_an_interrupted_pytest_still_says_why(tmp_path):
    """The short summary's messages are kept per test; a pytest cut short at its time limit gets
    SIGINT first, so that it prints that summary (the tracebacks) before it is killed, also when
    this process ignores SIGINT (run with nohup or in a shell's background)."""
    import signal
    import subprocess
    import sys
    import time

    assert gpu_check.failure_messages("FAILED tests/a.py::t[x] - AssertionError: 'torch' == 'triton'\n"
                                      "ERROR tests/b.py::u\nPASSED tests/a.py::v") == {
        "tests/a.py::t[x]": "AssertionError: 'torch' == 'triton'", "tests/b.py::u": ""}
    if sys.platform == "win32":
        return
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_cut.py").write_text(
        "import time\n\ndef test_a_fails():\n    assert 1 == 2, 'one is not two'\n\n"
        "def test_b_hangs():\n    open('started', 'w').close()\n    time.sleep(120)\n")
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup: the child would inherit it
    try:
        p = gpu_check._popen_group([sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
                                    "tests/test_cut.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
    finally:
        signal.signal(signal.SIGINT, old)
    deadline = time.monotonic() + 90  # a loaded machine may take a while to start pytest
    while not (tmp_path / "started").exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert p.poll() is None and (tmp_path / "started").exists(), "the hanging test did not start"
    gpu_check._interrupt_group(p)  # while the second test hangs: the first has failed
    out, _ = p.communicate(timeout=30)
    assert "one is not two" in gpu_check.failure_messages(out)["tests/test_cut.py::test_a_fails"], out


def test_xdist_workers(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec

    def with_xdist(present):
        return lambda name, *a: (object() if present else None) if name == "xdist" else find_spec(name, *a)
    monkeypatch.setattr(importlib.util, "find_spec", with_xdist(True))
    assert [gpu_check.xdist_workers(n) for n in (1, 2, 4, 6, 16, 64)] == [2, 2, 2, 3, 8, 8]
    assert gpu_check._tests_workers(None) >= 2 and gpu_check._tests_workers(3) == 3
    assert gpu_check._tests_workers(0) == 0
    monkeypatch.setattr(importlib.util, "find_spec", with_xdist(False))
    assert gpu_check.xdist_workers(16) == 0
    assert gpu_check._tests_workers(4) == 0  # asked for, but pytest-xdist is missing: one process


def _stand_ins(seen: list):
    """Pure-PyTorch stand-ins for fla's kernels, with their signatures; each records its call."""
    def linear_attn(q, k, v, scale=None, normalize=True):
        seen.append(("linear_attn", tuple(q.shape), q.dtype, {"scale": scale, "normalize": normalize}, q))
        return (q * k).sum(-1, keepdim=True) * v, None

    def delta_chunk(q, k, v, beta, scale=None, output_final_state=False):
        seen.append(("delta_chunk", tuple(q.shape), q.dtype, {"scale": scale, "final": output_final_state}, q))
        return q * v * beta[..., None], torch.einsum("bthk,bthv->bhkv", k, v)

    def general_chunk(q, k, v, a, b, gk, scale=None, output_final_state=False):
        seen.append(("general_chunk", tuple(q.shape), q.dtype, {"scale": scale, "final": output_final_state}, q))
        assert gk.abs().sum() == 0 and a.shape == b.shape == q.shape
        return q * v + a * b, torch.einsum("bthk,bthv->bhkv", k, v)

    return {"linear_attn": linear_attn, "delta_chunk": delta_chunk, "general_chunk": general_chunk}


def test_warmup_calls_match_the_rows(tmp_path):
    """The warm-up calls fla's kernels as the attention and scan rows do (here at the rows' tiny
    sizes, on stand-ins), forward and backward, then nam_scan(impl="auto") on the same inputs."""
    seen = []
    calls = gpu_check.warmup_calls("cpu", tiny=True, kernels=_stand_ins(seen))
    names = [n for n, _ in calls]
    rows = [f"{n} B=1 H=2 d=16 T={T}" for T in (32, 64, 128) for n in ROWS["scan"][:2]]
    rows += [f"{n} B=1 H=2 d=16 T={T}" for T in (32, 64, 128) for n in ROWS["scan"][2:]]
    assert names == ["fla chunk_linear_attn B=1 H=8 d=64 S=256", "fla chunk_linear_attn B=1 H=2 d=128 S=128"] + rows
    for _, call in calls:
        call()
    assert [(r, s, d, kw) for r, s, d, kw, _ in seen] == (
        [("linear_attn", (1, 256, 8, 64), torch.bfloat16, {"scale": 1.0, "normalize": False}),
         ("linear_attn", (1, 128, 2, 128), torch.bfloat16, {"scale": 1.0, "normalize": False})]
        + [("delta_chunk", (1, T, 2, 16), torch.bfloat16, {"scale": 1.0, "final": True}) for T in (32, 64, 128)]
        + [("general_chunk", (1, T, 2, 16), torch.bfloat16, {"scale": 1.0, "final": True}) for T in (32, 64, 128)])
    assert all(q.grad is not None for *_, q in seen)  # the backward ran
    # one group only; the child's entry point writes what it called and how long each took
    assert [n for n, _ in gpu_check.warmup_calls("cpu", tiny=True, kernels={}, groups=("scan-dplr",))] == rows[6:]
    with pytest.raises(ValueError, match="unknown warm-up group"):
        gpu_check.warmup_calls("cpu", groups=("models",))
    res = gpu_check.warm_up(("attention", "scan-delta"), cpu=True, json_path=tmp_path / "w.json",
                            kernels=_stand_ins([]), verbose=False)
    assert json.loads((tmp_path / "w.json").read_text()) == json.loads(json.dumps(res))
    assert res["status"] == "done" and res["tiny"] and len(res["calls"]) == 8
    assert all(c["ok"] and c["seconds"] >= 0 for c in res["calls"]), res["calls"]
    # a failing kernel is recorded, not raised
    bad = gpu_check.warm_up(("attention",), cpu=True, kernels={"linear_attn": None}, verbose=False)
    assert bad["status"] == "done" and not bad["calls"][0]["ok"] and "TypeError" in bad["calls"][0]["error"]


def test_warmup_child_processes_on_the_cpu(tmp_path):
    """The warm-up's child processes (python -m memnets.bench.gpu_check --warm-only) started,
    waited for and read back, on the CPU at the tiny sizes: fla's Triton kernels cannot run there
    (recorded as failed calls, not an error), nam_scan(impl="auto") can; a child still running at
    the limit is stopped and said so."""
    warm = gpu_check.WarmUp(tmp_path / "a", ("scan-delta",), cpu=True).start()
    w = warm.wait(240)
    assert w["status"] == "done", w
    g = w["groups"]["scan-delta"]
    assert g["exit_code"] == 0 and g["seconds"] > 0 and w["seconds"] == g["seconds"] and w["processes"] == 1
    assert [c["name"] for c in g["calls"]] == [f"{n} B=1 H=2 d=16 T={T}" for T in (32, 64, 128)
                                               for n in ROWS["scan"][:2]]
    assert all(c["ok"] for c in g["calls"] if c["name"].startswith("nam_scan auto")), g["calls"]
    assert not any(c["ok"] for c in g["calls"] if c["name"].startswith("fla "))  # no CUDA here
    assert w["failed_calls"] == 3 and gpu_check._warmup_line(w).startswith("warm-up: done; ")
    assert (tmp_path / "a" / "gpu-check-warmup-scan-delta.log").is_file()
    # cut short at its limit
    cut = gpu_check.WarmUp(tmp_path / "b", ("attention", "scan-dplr"), cpu=True).start()
    t0 = time.perf_counter()
    w = cut.wait(0.5)
    assert time.perf_counter() - t0 < 60 and not cut.running()
    assert w["status"] == "stopped at its limit (0 s after its start): attention, scan-dplr", w["status"]
    assert {g["status"] for g in w["groups"].values()} == {"stopped at its limit (0 s after its start)"}
    assert cut.wait(100) is w  # waited for once


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
    assert r["host_ms"] > 0 and r["top_host"] and all(t["self_ms"] >= 0 for t in r["top_host"])
    assert isinstance(r["waits"], list)
    if not torch.cuda.is_available():
        assert main([]) == 2  # nothing to profile without CUDA, said so


def test_make_gpu_paper_trains_each_preset_for_its_minutes_and_packs_the_records(tmp_path):
    """``make gpu-paper`` (the paper-scale runs of a GPU lease) on a small preset for a second:
    the run stops at its time limit, is scored, and its records, not its checkpoints, are packed
    into one file, copied to $OUT too; a second call resumes the finished run."""
    import os
    import shutil
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "OUT"
    out.mkdir()
    cmd = ["make", "-s", "gpu-paper", f"PYTHON={sys.executable}", "PAPER_MIN=0.01",
           "PAPER_PRESETS=cpu/reduce-lstm", f"PAPER_OUT={tmp_path / 'o'}"]
    env = dict(os.environ, OUT=str(out), OMP_NUM_THREADS="1")
    for _ in range(2):
        r = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "o" / "paper" / "reduce-lstm" / "results.json").read_text())
    assert res["stopped_by_time_limit"] and res["steps"] >= 1
    with tarfile.open(out / "paper-runs.tar.gz") as tar:
        names = sorted(tar.getnames())
    assert names == [f"paper/reduce-lstm/{f}" for f in ("config.json", "env.json", "metrics.jsonl", "results.json")]


def test_a_row_whose_graph_capture_failed_says_so():
    """A row that timed a path without one of its CUDA graphs (the capture failed and the call
    ran eagerly) carries the warning: count and message in its note, the messages in
    ``capture_failures`` (and the warning is still shown); a row without such a warning has neither."""
    import warnings

    from memnets.bench.gpu import _Bench

    bench = _Bench(torch.device("cpu"), max_seconds=10, verbose=False)

    def make_failing():
        warnings.warn("memnets: CUDA-graph capture of ('x.backward',) failed (AcceleratorError: boom); "
                      "running it without a graph", RuntimeWarning)
        return lambda: None

    with pytest.warns(RuntimeWarning, match="capture of"):  # still shown, as well as kept
        row = bench.measure("models", "broken", "B=1", torch.float32, make_failing, warmup=1, repeat=2)
    ok = bench.measure("models", "fine", "B=1", torch.float32, lambda: (lambda: None), warmup=1, repeat=2)
    assert row["ms"] is not None and "1 graph capture(s) failed" in row["note"]
    assert "AcceleratorError: boom" in row["capture_failures"][0]
    assert "capture_failures" not in ok and ok["note"] == ""


def test_alternatives_pair_each_comparison_with_the_default_it_varies():
    def row(name, ms, config="c", **kw):
        return {"section": "models", "name": name, "config": config, "ms": ms, **kw}
    rows = [row("DNC", 4.0), row("DNC (MEMNETS_TIME_LOOP=steps)", 5.0), row("DNC (whole step graphed)", 2.0),
            row("DNC (MEMNETS_DNC_WARPS=16) (whole step graphed)", 1.0), row("DNC (no graph replay)", 8.0),
            row("NTM (MEMNETS_NTM_WARPS=4)", 3.0),  # no NTM row of this config: left out
            row("DNC (MEMNETS_TIME_LOOP=steps)", 1.0, config="other"),  # nor one of another config
            row("NAM-TM (MEMNETS_MODULE_GRAPHS=0)", None),  # nor a row without a time
            row("impl=fla", 2.0, config="a"), row("impl=triton", 1.0, config="a", target="comparison",
                                                   baseline="impl=fla")]
    got = {(a["default"], a["alternative"]): a["ratio"] for a in gpu_check.alternatives(rows)}
    assert got == {("DNC", "DNC (MEMNETS_TIME_LOOP=steps)"): 1.25,
                   ("DNC (whole step graphed)", "DNC (MEMNETS_DNC_WARPS=16) (whole step graphed)"): 0.5,
                   ("DNC", "DNC (no graph replay)"): 2.0, ("impl=fla", "impl=triton"): 0.5}
    md = gpu_check.format_markdown({"env": {}, "gpu": "g", "started": "s", "rows": rows})
    assert "| c | DNC | 4 | DNC (MEMNETS_TIME_LOOP=steps) | 5 | 1.25 |" in md, md  # slower: plain
    assert "| a | impl=fla | 2 | impl=triton | 1 | **0.5** |" in md, md  # 10% faster or more: bold


ATTENTION_ROWS = 15  # the attention section's rows in the dry run (head dims 64 and 128, causal and not)


@pytest.mark.parametrize("fault,row,why", [
    ("hang_once", "nam_attention impl=torch", "no result within 4 s: its process was stopped"),
    ("crash", "sdpa (flash)", "its process died (exit code 70"),  # both rows of that name
    ("lost", "nam_attention d=128 impl=torch", f"error: {isolated.FAULT_ENV} made this row fail"),
])
def test_a_row_that_hangs_or_kills_its_process_costs_that_row_alone(tmp_path, monkeypatch, fault, row, why):
    """A section runs in a child process: a row that hangs, kills the process, or leaves its CUDA
    context unusable is recorded with the reason, and a new child measures every row after it,
    pairing them with the rows measured before; a fault at every row of a name costs those rows."""
    monkeypatch.setenv(isolated.FAULT_ENV, f"{fault}:{row}")
    seen = []
    rows, notes = isolated.run_section("attention", folder=tmp_path, cpu=True, bench_seconds=60, share=1.0,
                                       deadline=time.perf_counter() + 120, row_limit_s=4, verbose=False,
                                       on_rows=lambda rs: seen.append(len(rs)), say=lambda m: None)
    names = [r["name"] for r in rows]
    assert len(rows) == ATTENTION_ROWS and set(names) >= set(ROWS["attention"]), names
    bad = [r for r in rows if r["name"] == row]
    n_bad = 2 if fault == "crash" else 1
    assert len(bad) == n_bad and all(r["ms"] is None and why in r["note"] for r in bad), bad
    after = [r for r in rows[names.index(row) + 1:] if r["name"] != row]
    assert after and all(r["ms"] or "needs CUDA" in r["note"] for r in after), after
    assert all(r["ms"] for r in after if r["name"] in ("nam_attention", "chunk prefix sums (torch.cumsum)")), after
    assert len(notes) == n_bad and all(f"at row {row!r}" in n for n in notes), notes
    if fault == "lost":
        assert "its CUDA context was unusable" in notes[0] and "unusable after it" in bad[0]["note"]
    assert seen and seen[-1] == ATTENTION_ROWS and seen == sorted(seen)


def test_replayed_rows_must_come_back_in_the_order_they_were_measured():
    from memnets.bench.gpu import _Bench

    done = {"section": "models", "name": "LSAM", "config": "c", "dtype": "float32", "ms": 1.5, "note": ""}
    bench = _Bench(torch.device("cpu"), max_seconds=10, verbose=False, replay=[done])
    with pytest.raises(RuntimeError, match="out of order"):
        bench.measure("models", "NTM", "c", torch.float32, lambda: (lambda: None), 0, 1)
    bench = _Bench(torch.device("cpu"), max_seconds=10, verbose=False, replay=[dict(done)])
    started = []
    bench.on_start = started.append
    assert bench.measure("models", "LSAM", "c", torch.float32, lambda: 1 / 0, 0, 1)["ms"] == 1.5
    row = bench.measure("models", "NTM", "c", torch.float32, lambda: (lambda: None), 0, 1)
    assert row["ms"] is not None and [r["name"] for r in bench.rows] == ["LSAM", "NTM"]
    assert [r["name"] for r in started] == ["NTM"]  # a replayed row is not measured again


def test_a_worker_whose_cuda_context_a_test_broke_ends(monkeypatch):
    """On a GPU, a pytest-xdist worker ends after a test that left its CUDA context unusable (so
    that xdist runs the rest on a fresh one), and only then."""
    from conftest import end_worker_if_cuda_lost

    ended = []
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(isolated, "cuda_usable", lambda device=None: True)
    assert not end_worker_if_cuda_lost("t::a", exit=ended.append) and not ended
    monkeypatch.setattr(isolated, "cuda_usable", lambda device=None: False)
    assert end_worker_if_cuda_lost("t::a", exit=ended.append) and ended == [3]
    monkeypatch.delenv("PYTEST_XDIST_WORKER")  # one process: nothing would run the rest
    assert not end_worker_if_cuda_lost("t::a", exit=ended.append) and ended == [3]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # no CUDA used: nothing to lose
    assert not end_worker_if_cuda_lost("t::a", exit=ended.append) and ended == [3]
