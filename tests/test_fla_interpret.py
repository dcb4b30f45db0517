"""``nam_scan_fla`` on fla's real Triton kernels, run on the CPU by Triton's interpreter.

``tests/test_nam_scan_fla.py`` checks the NAM → fla mapping against fla's Python reference
recurrences; ``tests/test_cuda.py`` checks fla's compiled kernels on a GPU. This file runs the
step-by-step kernels (``fused_recurrent_delta_rule`` for ``p_e = p_w``,
``fused_recurrent_iplr_delta_rule`` otherwise) themselves, through the keyword names, layouts,
dtypes and autograd Functions a GPU run goes through, in ``TRITON_INTERPRET=1`` mode on CPU
tensors. fla's chunked kernels use constructs the interpreter does not run, so they are left to
``tests/test_cuda.py``.

The kernels run in a child process: ``TRITON_INTERPRET`` is read when fla's kernels are
decorated, i.e. when fla is first imported. Skipped when fla, triton or numpy (the interpreter's)
is not installed (``pip install 'memnets[gpu]' numpy``).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MISSING = [m for m in ("fla", "triton", "numpy", "einops") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} "
                                "(pip install 'memnets[gpu]' numpy)")

CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
import triton.runtime.autotuner as autotuner

# The interpreter has no benchmarker for the autotuner to time configurations with. Every
# configuration computes the same function, so the first one is taken.
if not hasattr(autotuner.Autotuner, "_bench"):
    print(json.dumps({"skip": "this triton's Autotuner has no _bench to bypass"}))
    sys.exit(0)
autotuner.Autotuner._bench = lambda self, *args, config=None, **kw: [0.0, 0.0, 0.0]

from memnets.ops import nam_scan, unit
from memnets.ops.delta.fla_backend import fla_kernels, nam_scan_fla

fla_kernels()  # the real kernels, or an ImportError naming why not
torch.manual_seed(0)
B, T, H, dk, dv = 2, 21, 2, 16, 8
base = dict(q=unit(torch.randn(B, T, H, dk)), k=unit(torch.randn(B, T, H, dk)), v=torch.randn(B, T, H, dv),
            p_w=torch.rand(B, T, H), p_e=torch.rand(B, T, H), p_r=torch.rand(B, T, H),
            state=0.5 * torch.randn(B, H, dv, dk))
co, cs = torch.randn(B, T, H, dv), torch.randn(B, H, dv, dk)


def run(fn, case):
    L = {n: t.clone().requires_grad_() for n, t in base.items() if n in case["tensors"]}
    p_w = L.get("p_w", case.get("p_w_float"))
    p_e = p_w if case["same"] else L["p_e"]
    o, s = fn(L, p_w, p_e)
    ((o * co).sum() + (s * cs).sum()).backward()
    return o.detach(), s.detach(), {n: t.grad for n, t in L.items()}


def ours(L, p_w, p_e):
    return nam_scan(L["q"], L["k"], L["v"], p_w, p_e, L.get("p_r"), initial_state=L.get("state"),
                    impl="reference")


def theirs(same):
    def fn(L, p_w, p_e):
        return nam_scan_fla(L["q"], L["k"], L["v"], p_w, None if same else p_e, L.get("p_r"), L.get("state"),
                            mode="recurrent")
    return fn


cases = {}
for same in (True, False):
    for with_state in (True, False):
        names = ["q", "k", "v", "p_w", "p_r"] + (["state"] if with_state else []) + ([] if same else ["p_e"])
        cases[f"{'pe=pw' if same else 'pe!=pw'}, {'state' if with_state else 'no state'}"] = dict(
            tensors=names, same=same)
cases["p_w=0.3 float, no p_r, state"] = dict(tensors=["q", "k", "v", "state"], same=True, p_w_float=0.3)

report = {}
for name, case in cases.items():
    o1, s1, g1 = run(ours, case)
    try:
        o2, s2, g2 = run(theirs(case["same"]), case)
    except Exception as e:  # reported per case, so one failing path does not hide the others
        report[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
        continue
    err = {"out": (o2 - o1).abs().max().item(), "state": (s2 - s1).abs().max().item(),
           "dtype": str(o2.dtype) + "/" + str(s2.dtype), "shape": list(s2.shape)}
    for n, g in g1.items():
        err["d" + n] = None if g2.get(n) is None else (g2[n] - g).abs().max().item()
    report[name] = err
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def report():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(root / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    return out


CASES = ["pe=pw, state", "pe=pw, no state", "pe!=pw, state", "pe!=pw, no state", "p_w=0.3 float, no p_r, state"]


@pytest.mark.parametrize("case", CASES)
def test_fla_recurrent_kernels_match_reference(report, case):
    """Values, final state and every gradient (the initial state's included) within float32 rounding."""
    err = report[case]
    assert "error" not in err, err["error"]
    assert err.pop("dtype") == "torch.float32/torch.float32"
    assert err.pop("shape") == [2, 2, 8, 16]  # [B, H, dv, dk], transposed back from fla's [B, H, dk, dv]
    missing = [n for n, e in err.items() if e is None]
    assert not missing, f"no gradient reached {missing} through fla's kernels"
    assert max(err.values()) < 2e-5, err
