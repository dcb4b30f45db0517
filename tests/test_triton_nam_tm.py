"""The NAM-TM's Triton kernels (memnets.ops.gpu.nam_tm) on CPU tensors through Triton's interpreter.

The value-tape scan and the heads/key-tape/jump scan are held to per-step references (plain
autograd, one step at a time) in float64 and float32, values and every input gradient, for
every option (p_r given or not, position or transposed key tape, μ(H_w) on the key tape, with
and without JUMP, other action orders, time- or batch-major), with states saved every few
steps so that the backward's walk back from saved states is exercised; gradcheck in float64;
and the whole NAMTuringMachine down the CUDA code path (:func:`memnets.ops.gpu.cuda_path`: the
Triton kernels, cuDNN's ``nn.GRU`` in place of the per-step GRU, no per-step loop) equal to its
CPU fused path.

Triton reads ``TRITON_INTERPRET`` when a function is decorated, Triton's own library included,
so one process runs Triton either interpreted or compiled, whichever it imported Triton as.
These tests therefore run in a child process started with ``TRITON_INTERPRET=1`` (one for all
the tests selected here), each test of this process reporting its own outcome there
(:func:`interpreted`); this process never imports Triton, so the file runs the same whatever
other tests imported before or after it. :func:`test_kernels_compile_for_cuda` compiles the
kernels for sm_90 in a child without the interpreter. Skipped (reason printed) without triton
or numpy (the interpreter's).
"""
from __future__ import annotations

import collections
import contextlib
import importlib.util
import inspect
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

MISSING = [m for m in ("triton", "numpy") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.interpret,
              pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} "
                                 "(Triton's interpreter runs the kernels on the CPU)")]

from memnets.memories import nam_tm as nam_tm_module  # noqa: E402
from memnets.memories.nam_tm import NAMTMState, NAMTuringMachine  # noqa: E402
from memnets.ops import unit  # noqa: E402
from memnets.ops.delta.reference import nam_scan_reference  # noqa: E402
from memnets.ops.gpu import cuda_path, use_triton  # noqa: E402

LEFT, NOOP, RIGHT, JUMP = 0, 1, 2, 3
TOL = {torch.float64: dict(rtol=1e-9, atol=1e-11), torch.float32: dict(rtol=2e-4, atol=2e-5)}
ROOT = Path(__file__).resolve().parents[1]
CHILD_ENV = "MEMNETS_TEST_TRITON_CHILD"
CHILD = os.environ.get(CHILD_ENV) == "1"  # this process is the interpreter's child


def _child_env(interpret: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MEMNETS_TRITON")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                               if p])
    if interpret:
        env.update(TRITON_INTERPRET="1", **{CHILD_ENV: "1"})
    return env


@pytest.fixture(scope="module")
def interpreter_results(request):
    """Runs the selected :func:`interpreted` tests of this file in one child process under
    ``TRITON_INTERPRET=1``; ``{test name: (outcome, report)}`` and the child's output."""
    mine = [item for item in request.session.items
            if item.module is request.module and getattr(getattr(item, "function", None), "interpreted", False)]
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "report.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
               *[f"{Path(__file__).resolve()}::{item.name}" for item in mine]]
        proc = subprocess.run(cmd, cwd=ROOT, env=_child_env(True), capture_output=True, text=True, timeout=900)
        results = {}
        if xml.exists():
            for case in ET.parse(xml).getroot().iter("testcase"):
                outcome, text = "passed", ""
                for tag in ("failure", "error", "skipped"):
                    node = case.find(tag)
                    if node is not None:
                        outcome = "skipped" if tag == "skipped" else "failed"
                        text = (node.get("message") or "") + "\n" + (node.text or "")
                        break
                results[case.get("name")] = (outcome, text)
    print(f"interpreter child: {proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ''}")
    return results, proc.stdout[-6000:] + proc.stderr[-6000:]


def interpreted(fn):
    """Mark a test to run in the interpreter's child process: there it runs as written; here it
    reports the child's outcome of the same test (same name and parameters)."""
    fn.interpreted = True
    if CHILD:
        return fn

    def proxy(**kwargs):
        request = kwargs["request"]
        results, output = kwargs["interpreter_results"]
        if request.node.name not in results:
            pytest.fail(f"the interpreter's child did not run {request.node.name}:\n{output}", pytrace=False)
        outcome, text = results[request.node.name]
        if outcome == "skipped":
            pytest.skip(text.strip())
        if outcome == "failed":
            pytest.fail(f"in the interpreter's child: {text}", pytrace=False)

    params = {"request", "interpreter_results"}
    sig = inspect.signature(fn)
    proxy.__signature__ = sig.replace(parameters=[
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in ("request", "interpreter_results")] + [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for n, p in sig.parameters.items() if n not in params])
    proxy.__name__, proxy.__qualname__, proxy.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    # on a GPU the kernels run compiled, held to the CPU by tests/test_cuda_nam_tm.py, test_cuda.py
    # and test_graph_step.py; there each xdist worker would start a child for the whole file
    proxy.pytestmark = list(getattr(fn, "pytestmark", [])) + [pytest.mark.skipif(
        torch.cuda.is_available(), reason="CUDA is here: the compiled kernels' tests (tests/test_cuda_nam_tm.py) "
        "run instead; this interpreter copy is for machines without a GPU")]
    proxy.interpreted = True
    return proxy


@pytest.fixture
def short_segment(monkeypatch):
    """States saved every 4 steps (instead of 16): T = 5..9 then walks back across saved states."""
    from memnets.ops.gpu import nam_tm
    monkeypatch.setattr(nam_tm, "SEGMENT", 4)


def _grads(outs, ins, seed=1):
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    ins = [x for x in ins if x is not None]
    grads = torch.autograd.grad(loss, ins, allow_unused=True)  # unused: a zero gradient
    return [torch.zeros_like(x) if d is None else d for x, d in zip(ins, grads)]


def _close(got, want, dtype, names):
    assert len(got) == len(want)
    for name, a, b in zip(names, got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        torch.testing.assert_close(a, b, **TOL[dtype], msg=lambda s, n=name: f"{n}: {s}")


# ---------------------------------------------------------------------------------------------
# the value tape


def _tape_inputs(dtype, B=2, T=9, H=2, K=6, V=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    heads = torch.randn(B, T, H, 2, K, generator=g, dtype=dtype)  # q, k: views of one tensor, as in the layer
    return dict(q=heads[..., 0, :], k=heads[..., 1, :], v=torch.randn(B, T, H, V, generator=g, dtype=dtype),
                p_w=torch.rand(B, T, H, generator=g, dtype=dtype), p_e=torch.rand(B, T, H, generator=g, dtype=dtype),
                p_r=torch.rand(B, T, H, generator=g, dtype=dtype),
                initial_state=torch.randn(B, H, V, K, generator=g, dtype=dtype))


def _run_tape(fn, inputs, with_pr):
    ins = {n: x.clone().requires_grad_() for n, x in inputs.items()}
    if not with_pr:
        ins["p_r"] = None
    o, S = fn(**ins)
    return [o, S, *_grads([o, S], ins.values())]


@interpreted
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("with_pr", [True, False], ids=["p_r", "no_p_r"])
def test_tape_scan_matches_reference(dtype, with_pr, short_segment):
    from memnets.ops.gpu.nam_tm import nam_tape_scan_triton
    inputs = _tape_inputs(dtype)
    want = _run_tape(nam_scan_reference, inputs, with_pr)
    got = _run_tape(nam_tape_scan_triton, inputs, with_pr)
    names = ["o", "final_state", "dq", "dk", "dv", "dp_w", "dp_e"] + (["dp_r"] if with_pr else []) + ["dS0"]
    _close(got, want, dtype, names)


@interpreted
def test_tape_scan_dispatch_and_dtypes():
    """nam_tape_scan runs the Triton kernel on the CUDA path; T < SEGMENT (no saved state but the
    last) and T = 1; bfloat16 runs in float32 and comes back in bfloat16; no initial state is
    zeros; shapes are checked."""
    from memnets.ops.gpu import nam_tm
    from memnets.ops.nam_tape import nam_tape_scan
    for T in (5, 1):
        inputs = _tape_inputs(torch.float64, T=T, H=1)
        want = _run_tape(nam_scan_reference, inputs, True)
        calls = []
        apply = nam_tm.TapeScan.apply
        with cuda_path(), pytest.MonkeyPatch.context() as mp:
            mp.setattr(nam_tm.TapeScan, "apply", lambda *a: calls.append(1) or apply(*a))
            assert use_triton(inputs["q"])
            got = _run_tape(nam_tape_scan, inputs, True)
        assert calls == [1]
        _close(got, want, torch.float64, ["o", "S", "dq", "dk", "dv", "dp_w", "dp_e", "dp_r", "dS0"])
    inputs = _tape_inputs(torch.float32, T=3, H=1)
    o32, S32 = nam_tm.nam_tape_scan_triton(**inputs)
    o16, S16 = nam_tm.nam_tape_scan_triton(**{n: x.bfloat16() for n, x in inputs.items()})
    assert o16.dtype == S16.dtype == torch.bfloat16
    torch.testing.assert_close(o16.float(), o32, rtol=0.05, atol=0.05)
    o0, S0 = nam_tm.nam_tape_scan_triton(**dict(inputs, initial_state=None))  # None: zeros
    o1, S1 = nam_tm.nam_tape_scan_triton(**dict(inputs, initial_state=torch.zeros_like(inputs["initial_state"])))
    assert torch.equal(o0, o1) and torch.equal(S0, S1)
    bad = dict(inputs, p_w=inputs["p_w"][:, :2])
    with pytest.raises(ValueError, match="p_w"):
        nam_tm.nam_tape_scan_triton(**bad)
    with pytest.raises(ValueError, match="initial_state"):
        nam_tm.nam_tape_scan_triton(**dict(inputs, initial_state=inputs["initial_state"].double()))


# ---------------------------------------------------------------------------------------------
# the heads, key tape and jump


def heads_reference(act, q, k, p_w, p_e, h0, key_tape, order, transposed=False, unit_keys=False):
    """The recurrence of :func:`memnets.ops.nam_tm_heads.nam_tm_heads` one step at a time
    (time-major: act ``[T, N, 2, A]``, q, k ``[T, N, C]``, p_w, p_e ``[T, N]``)."""
    H, K, Hs = h0, key_tape, [h0]
    for t in range(act.shape[0]):
        j = None
        if JUMP in order:
            hk = unit(H[:, 1]) if unit_keys else H[:, 1]  # [N, L]
            pw, pe = p_w[t, :, None], p_e[t, :, None]
            if transposed:  # Kᵀ ← WR(Kᵀ, k, h, p_w, p_e)
                w = pw * hk - pe * torch.einsum("ncl,nc->nl", K, k[t])
                K = K + k[t][:, :, None] * w[:, None, :]
            else:  # K ← WR(K, h, k, p_w, p_e)
                u = pw * k[t] - pe * torch.einsum("ncl,nl->nc", K, hk)
                K = K + u[:, :, None] * hk[:, None, :]
            j = torch.einsum("ncl,nc->nl", K, q[t])[:, None, :].expand_as(H)
        moves = {LEFT: torch.roll(H, -1, -1), NOOP: H, RIGHT: torch.roll(H, 1, -1), JUMP: j}
        H = sum(act[t, :, :, i:i + 1] * moves[a] for i, a in enumerate(order))
        Hs.append(H)
    return torch.stack(Hs, 0), K


def _heads_inputs(dtype, order, bm, T=7, B=2, Tn=2, C=4, L=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    lead = (B, T, Tn) if bm else (T, B * Tn)
    N, A = B * Tn, len(order)
    return dict(act=torch.softmax(torch.randn(*lead, 2, A, generator=g, dtype=dtype), -1),
                q=unit(torch.randn(*lead, C, generator=g, dtype=dtype)),
                k=unit(torch.randn(*lead, C, generator=g, dtype=dtype)),
                p_w=torch.rand(*lead, generator=g, dtype=dtype), p_e=torch.rand(*lead, generator=g, dtype=dtype),
                h0=0.4 * torch.randn(N, 2, L, generator=g, dtype=dtype),  # norms near 1 (not 1: μ is no identity)
                key_tape=0.5 * torch.randn(N, C, L, generator=g, dtype=dtype))


def _reference_any_layout(bm, order, transposed, unit_keys, **x):
    if not bm:
        return heads_reference(order=order, transposed=transposed, unit_keys=unit_keys, **x)
    B, T, Tn = x["act"].shape[:3]

    def tm(z):
        return None if z is None else z.transpose(0, 1).reshape((T, B * Tn) + z.shape[3:])
    Hs, K = heads_reference(tm(x["act"]), tm(x["q"]), tm(x["k"]), tm(x["p_w"]), tm(x["p_e"]), x["h0"], x["key_tape"],
                            order, transposed, unit_keys)
    return Hs.view((T + 1, B, Tn) + Hs.shape[2:]).transpose(0, 1), K


def _run_heads(fn, inputs, order):
    ins = {n: x.clone().requires_grad_() for n, x in inputs.items()}
    if JUMP not in order:
        ins["q"] = ins["k"] = None
    Hs, K = fn(**ins)
    return [Hs, K, *_grads([Hs, K], ins.values())]


HEAD_CASES = [  # order, transposed, unit_keys, batch_major
    ([LEFT, NOOP, RIGHT, JUMP], False, False, False),
    ([JUMP, LEFT, NOOP, RIGHT], True, False, True),
    ([LEFT, NOOP, RIGHT, JUMP], False, True, True),  # normalize_heads="all"
    ([JUMP, NOOP, LEFT, RIGHT], True, True, False),
    ([RIGHT, LEFT, NOOP], False, False, True),  # No Jmp: the key tape is neither read nor written
    ([JUMP, NOOP], True, False, True),
]


@interpreted
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", HEAD_CASES, ids=["pos", "transposed-bm", "unitkeys-bm", "unitkeys-transposed",
                                                  "nojmp-bm", "jump-noop-bm"])
def test_heads_match_reference(case, dtype, short_segment):
    from memnets.ops.gpu.nam_tm import nam_tm_heads_triton
    order, transposed, unit_keys, bm = case
    inputs = _heads_inputs(dtype, order, bm)
    want = _run_heads(lambda **x: _reference_any_layout(bm, order, transposed, unit_keys, **x), inputs, order)
    got = _run_heads(lambda **x: nam_tm_heads_triton(order=order, transposed=transposed, batch_major=bm,
                                                     unit_keys=unit_keys, **x), inputs, order)
    names = ["heads", "key_tape", "dact"] + (["dq", "dk"] if JUMP in order else []) + ["dp_w", "dp_e", "dh0",
                                                                                      "dkey_tape"]
    _close(got, want, dtype, names)


@interpreted
@pytest.mark.parametrize("used", [0, 1], ids=["first-output-only", "second-output-only"])
def test_an_unused_output_takes_no_gradient(used, short_segment):
    """A loss of one output alone (the other's gradient reaches the backward as ``None`` and the
    backward makes its zeros): the reference's gradients, for the value tape and the heads, with
    and without JUMP."""
    from memnets.ops.gpu.nam_tm import nam_tape_scan_triton, nam_tm_heads_triton
    inputs = _tape_inputs(torch.float64)

    def tape(fn):
        ins = {n: x.clone().requires_grad_() for n, x in inputs.items()}
        return _grads([fn(**ins)[used]], ins.values())
    _close(tape(nam_tape_scan_triton), tape(nam_scan_reference), torch.float64,
           ["dq", "dk", "dv", "dp_w", "dp_e", "dp_r", "dS0"])
    for order in ([LEFT, NOOP, RIGHT, JUMP], [RIGHT, LEFT, NOOP]):
        x = _heads_inputs(torch.float64, order, False)

        def heads(fn):
            ins = {n: v.clone().requires_grad_() for n, v in x.items()}
            if JUMP not in order:
                ins["q"] = ins["k"] = None
            return _grads([fn(**ins)[used]], ins.values())
        want = heads(lambda **a: _reference_any_layout(False, order, False, False, **a))
        got = heads(lambda **a: nam_tm_heads_triton(order=order, **a))
        _close(got, want, torch.float64, [f"d{n}" for n in x if JUMP in order or n not in ("q", "k")])


@interpreted
def test_heads_dispatch():
    """nam_tm_heads runs the Triton kernel on the CUDA path (also for unit_keys, which the
    TorchScript loops do not run) and gives what the reference gives."""
    from memnets.ops.gpu import nam_tm
    from memnets.ops.nam_tm_heads import nam_tm_heads
    order = [LEFT, NOOP, RIGHT, JUMP]
    inputs = _heads_inputs(torch.float64, order, True, T=5)
    want = _run_heads(lambda **x: _reference_any_layout(True, order, False, True, **x), inputs, order)
    calls = []
    apply = nam_tm.HeadScan.apply
    with cuda_path(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(nam_tm.HeadScan, "apply", lambda *a: calls.append(1) or apply(*a))
        got = _run_heads(lambda **x: nam_tm_heads(order=order, batch_major=True, unit_keys=True, **x), inputs, order)
    assert calls == [1]
    _close(got, want, torch.float64, ["heads", "key_tape", "dact", "dq", "dk", "dp_w", "dp_e", "dh0", "dkey_tape"])
    with pytest.raises(ValueError, match="key_tape"):
        nam_tm.nam_tm_heads_triton(**dict(inputs, key_tape=inputs["key_tape"][:, :, :3]), order=order,
                                   batch_major=True)


@interpreted
def test_gradcheck(monkeypatch):
    from memnets.ops.gpu import nam_tm
    from memnets.ops.gpu.nam_tm import nam_tape_scan_triton, nam_tm_heads_triton
    monkeypatch.setattr(nam_tm, "SEGMENT", 2)  # T = 3: a walk back from a saved state
    order = [JUMP, LEFT, NOOP, RIGHT]
    x = _heads_inputs(torch.float64, order, False, T=3, B=1, Tn=2, C=3, L=4)
    names = list(x)
    leaves = [x[n].clone().requires_grad_() for n in names]

    def heads(*a):
        return nam_tm_heads_triton(**dict(zip(names, a)), order=order, transposed=True, unit_keys=True)
    assert torch.autograd.gradcheck(heads, leaves, fast_mode=True)
    y = _tape_inputs(torch.float64, B=1, T=3, H=2, K=3, V=2)
    names_t = list(y)
    leaves = [y[n].clone().requires_grad_() for n in names_t]
    assert torch.autograd.gradcheck(lambda *a: nam_tape_scan_triton(**dict(zip(names_t, a))), leaves, fast_mode=True)


# ---------------------------------------------------------------------------------------------
# the whole layer


MODELS = [
    dict(),
    dict(normalize_heads="all", key_tape_mode="transposed", separate_erase=True),
    dict(actions=("RIGHT", "LEFT", "NOOP"), normalize_heads=True, num_layers=2),
]


@interpreted
@pytest.mark.parametrize("kw", MODELS, ids=["default", "all-transposed", "nojmp-2layers"])
def test_nam_tm_on_the_cuda_path_matches_cpu(kw, monkeypatch):
    """NAMTuringMachine forward and backward down the CUDA path equal the CPU fused path (C
    kernels, per-step GRU): outputs, final state, aux and every gradient; there, one launch of
    each scan and of the gates' kernels per layer, the controller is the nn.GRU module itself, and
    no step runs in Python."""
    from memnets.ops.gpu import nam_tm
    from memnets.ops import gru
    DT = torch.float64
    torch.manual_seed(0)
    m = NAMTuringMachine(6, 8, num_tapes=2, tape_length=6, **kw).double()
    x = torch.randn(2, 5, 6, dtype=DT)
    st = NAMTMState(*(s + 0.3 * torch.randn_like(s) for s in m.init_state(2, dtype=DT)))

    def run(path):
        xx, ss = x.clone().requires_grad_(), [s.clone().requires_grad_() for s in st]
        with path:
            y, s2, aux = m(xx, NAMTMState(*ss), return_aux=True)
            grads = _grads([y, *s2], [xx, *ss, *m.parameters()])
        return [y, *s2, *aux, *grads]

    want = run(contextlib.nullcontext())
    launches = collections.Counter()

    def counted(name, fn):
        return lambda *a, **k: launches.update([name]) or fn(*a, **k)
    kernels = ("_tape_forward", "_tape_backward", "_heads_forward", "_heads_backward", "_gates_forward",
               "_gates_backward")
    for name in kernels:
        monkeypatch.setattr(nam_tm, name, counted(name, getattr(nam_tm, name)))

    def no_call(*a, **k):
        raise AssertionError("not on the CUDA path")
    monkeypatch.setattr(nam_tm_module, "gru_module_forward", no_call)  # the per-step GRU
    monkeypatch.setattr(nam_tm_module, "_fused_step", no_call)  # the per-step tape loop
    monkeypatch.setattr(gru, "gru_module_forward", no_call)
    got = run(cuda_path())
    n = m.num_layers  # one launch of each kernel per layer, forward and backward
    assert launches == {name: n for name in kernels}
    names = ["y", "tape", "key_tape", "h_r", "h_w", "read_pos", "write_pos", "read_act", "write_act", "dx",
             "dtape", "dkey_tape", "dh_r", "dh_w"] + [f"d{n}" for n, _ in m.named_parameters()]
    _close(got, want, DT, names)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("kw", MODELS, ids=["default", "all-transposed", "nojmp-2layers"])
def test_layer_scan_replayed_from_its_graphs_matches_cpu(kw, dtype, short_segment):
    """The layer's tape machinery with its forward and backward replayed from their graphs
    (:func:`memnets.ops.gpu.graphs.stand_in`: static buffers, outputs rewritten in place at each
    replay), batch after batch of one shape, equals the CPU fused path; the second call of a
    shape captures, later ones replay; outputs left out of the loss get no gradient. (The layer
    graphed whole, ``MEMNETS_MODULE_GRAPHS=0`` here, is the next test's.)"""
    from memnets.ops.gpu import env_var, graphs
    with env_var("MEMNETS_MODULE_GRAPHS", "0"):
        _layer_scan_replayed(kw, dtype)


def _replayed_against_cpu(kw, dtype, calls, seed):
    """``calls`` batches of one shape through the CUDA code path with the graphs' stand-in, each
    against the CPU fused path (every output in the loss, or y alone, in turn); the model and the
    graphs' statistics before and after."""
    from memnets.ops.gpu import graphs
    torch.manual_seed(0)
    m = NAMTuringMachine(6, 8, num_tapes=2, tape_length=6, **kw).to(dtype)
    graphs.clear()
    before = graphs.stats()
    for i in range(calls):
        g = torch.Generator().manual_seed(seed + i)
        x = torch.randn(2, 7, 6, generator=g, dtype=dtype)
        st = NAMTMState(*(s + 0.3 * torch.randn(s.shape, generator=g, dtype=dtype) for s in m.init_state(2, dtype=dtype)))

        def run(path, used):
            xx, ss = x.clone().requires_grad_(), [s.clone().requires_grad_() for s in st]
            with path:
                y, s2, aux = m(xx, NAMTMState(*ss), return_aux=True)
                outs = [y, *s2, *aux]
                grads = _grads([outs[j] for j in used], [xx, *ss, *m.parameters()], seed=i)
            return [*outs, *grads]
        used = [0, 1, 2, 3, 4, 5, 6, 7, 8] if i % 2 == 0 else [0]  # every output, or y alone
        want = run(contextlib.nullcontext(), used)
        with graphs.stand_in():
            got = run(cuda_path(), used)
        _close(got, want, dtype, [f"call {i}, item {j}" for j in range(len(got))])
    return m, before, graphs.stats()


def _layer_scan_replayed(kw, dtype):
    from memnets.ops.gpu import graphs
    m, before, after = _replayed_against_cpu(kw, dtype, 4, 10)
    # one graph for the forward and one for the backward (layers alike share them), captured at
    # the second call; the third and fourth calls replay both for every layer
    assert after["captures"] - before.get("captures", 0) == 2
    assert after["replays"] - before.get("replays", 0) >= 2 * 2 * m.num_layers
    graphs.clear()


@interpreted
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("kw", MODELS, ids=["default", "all-transposed", "nojmp-2layers"])
def test_layer_graphed_whole_matches_cpu(kw, dtype, short_segment):
    """Each layer graphed whole (:func:`memnets.ops.gpu.graphs.graphed_autograd`: the controller,
    the projections, both tape kernels and W_o replayed as one graph forward, the layer
    recomputed and differentiated as one graph backward), batch after batch of one shape, with
    the stand-in's static buffers: outputs and every gradient equal to the CPU fused path, with
    every output in the loss or y alone; inside, the layer function runs plainly (no graph of
    its own)."""
    from memnets.ops.gpu import graphs
    m, before, after = _replayed_against_cpu(kw, dtype, 5, 20)
    assert after["modules"] - before.get("modules", 0) == 5 * m.num_layers
    assert not any(str(k[0][0]).startswith("nam_tm.layer") for k in graphs._CACHE)  # only the whole layers' graphs
    # per layer: the forward captured at the second call; the backward per outputs used
    assert after["captures"] - before.get("captures", 0) >= 2 * m.num_layers
    graphs.clear()


@interpreted
def test_layer_scan_gradcheck_and_refusals(monkeypatch):
    """gradcheck of :func:`nam_tm_layer_scan_triton` in float64 (a walk back across saved
    states), with and without JUMP, and arguments of the wrong shape refused with their name."""
    from memnets.ops.gpu import nam_tm
    from memnets.ops.gpu.nam_tm import nam_tm_layer_scan_triton
    monkeypatch.setattr(nam_tm, "SEGMENT", 2)
    g = torch.Generator().manual_seed(3)
    B, T, Tn, C, L, H, F = 1, 3, 2, 3, 4, 5, 2

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    cases = [((JUMP, LEFT, NOOP, RIGHT), 2, False, False, False), ((RIGHT, JUMP, LEFT), 3, True, True, True),
             ((LEFT, RIGHT), 3, True, False, False)]
    for order, n_p, unit_values, unit_keys, transposed in cases:
        jump = JUMP in order
        n = 2 * len(order) + n_p + (C if jump else 0)
        ins = [r(B, T, H), r(B, T, F), r(Tn * n, H), r(Tn * n), r(Tn * C, F), r(Tn * C)]
        ins += [r(Tn * C, F), r(Tn * C)] if jump else []
        ins += [r(B, Tn, C, L), r(B, Tn, C, L), torch.rand(B, Tn, 2, L, generator=g, dtype=torch.float64)]
        leaves = [t.requires_grad_() for t in ins]

        def f(hc, x, wc, bc, wv, bv, *rest):
            key, rest = ((rest[0], rest[1]), rest[2:]) if jump else (None, rest)
            return nam_tm_layer_scan_triton(hc, x, (wc, bc), (wv, bv), key, *rest, order, n_p, unit_values=unit_values,
                                            unit_keys=unit_keys, transposed=transposed)
        assert torch.autograd.gradcheck(f, leaves, fast_mode=True), order
    good = [t.detach() for t in ins]  # the last case: no JUMP

    def call(hc, x, wc, bc, wv, bv, tape, key_tape, heads, order=(LEFT, RIGHT), n_p=3, key=None):
        return nam_tm_layer_scan_triton(hc, x, (wc, bc), (wv, bv), key, tape, key_tape, heads, order, n_p)
    names = ["hc", "x", "control weight", "control bias", "value weight", "value bias", "tape", "key_tape", "heads"]
    for i, name in enumerate(names):
        bad = list(good)
        bad[i] = bad[i].unsqueeze(0) if i in (0, 1, 6) else bad[i][..., :-1]  # hc, x and tape set the sizes: a wrong rank
        with pytest.raises(ValueError, match=f"`{name}`"):
            call(*bad)
    assert call(*good)[0].shape == (B, T, Tn, C)
    with pytest.raises(ValueError, match="`key`"):
        call(*good, order=(JUMP, LEFT))
    with pytest.raises(ValueError, match="`order`"):
        call(*good, order=(LEFT, LEFT))
    with pytest.raises(ValueError, match="`n_p`"):
        call(*good, n_p=4)


# ---------------------------------------------------------------------------------------------
# the compiled kernels


COMPILE = r"""
import sys
import triton
from triton.backends import backends
if "nvidia" not in backends:
    print("SKIP this triton has no NVIDIA backend")
    sys.exit(0)
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from memnets.ops.gpu.nam_tm import kernels

ns = kernels()  # compiled mode: this process did not ask for the interpreter
cases = [("tape_fwd", dict(HAS_PR=True, SEG=16, BK=32, BV=32)),
         ("tape_bwd", dict(HAS_PR=True, SEG=16, BK=32, BV=32)),
         ("heads_fwd", dict(A=4, PL=1, PN=2, PR=3, PJ=0, TRANSPOSED=True, UNIT_KEYS=True, SEG=16, BL=32, BC=64)),
         ("heads_bwd", dict(A=4, PL=0, PN=1, PR=2, PJ=3, TRANSPOSED=False, UNIT_KEYS=True, SEG=16, BL=32, BC=64)),
         ("heads_bwd", dict(A=3, PL=2, PN=0, PR=1, PJ=-1, TRANSPOSED=False, UNIT_KEYS=False, SEG=16, BL=16, BC=16))]
for name, consts in cases:
    fn = getattr(ns, name)
    names = list(fn.arg_names)
    first_int = names.index("T")  # the pointers come first, then the sizes and strides
    for ptr, warps in (("*fp32", 1), ("*fp64", 4)):
        sig = {a: "constexpr" if a in consts else ptr if i < first_int else "i32" for i, a in enumerate(names)}
        compiled = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": warps})
        assert "cubin" in compiled.asm, name
print("OK")
"""


@pytest.mark.skipif(CHILD, reason="runs in its own process, without the interpreter")
def test_kernels_compile_for_cuda():
    """The kernels as a GPU runs them (not interpreted) compile to cubins for sm_90, float32 and
    float64, no GPU needed: the interpreter accepts some code that the compiler does not."""
    proc = subprocess.run([sys.executable, "-c", COMPILE], cwd=ROOT, env=_child_env(False), capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout.strip()
    if out.startswith("SKIP"):
        pytest.skip(out[5:])
    assert proc.returncode == 0 and out.endswith("OK"), proc.stdout[-4000:] + proc.stderr[-4000:]


@interpreted
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("jump,n_p", [(True, 2), (True, 3), (False, 3), (False, 2)],
                         ids=["jump-pe=pw", "jump", "nojump", "nojump-pe=pw"])
def test_gates_kernels_match_the_ops_they_replace(dtype, jump, n_p):
    """The layer's gates kernels (the actions' softmaxes, the gates' sigmoids, μ of the jump
    queries and keys, and their backward in one kernel each way) against those ops in PyTorch
    and their autograd: 42 rows (three blocks, the last partial), a query and a key whose norm
    is clamped, p_e = p_w (n_p = 2) and not."""
    from memnets.ops.gpu import nam_tm as nt

    g = torch.Generator().manual_seed(5)
    B, T, Tn, A, C = 3, 7, 2, (4 if jump else 3), 5
    Cq = C if jump else 0

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=dtype) * scale
    ctrl = r(B, T, Tn, 2 * A + n_p + Cq, scale=3.0)
    kraw = r(B, T, Tn, C) if jump else None
    if jump:
        ctrl[0, 0, 0, 2 * A + n_p:] *= 1e-8
        kraw[1, 2, 1] *= 1e-8
    got = nt._gates_forward(ctrl, kraw, A, n_p, Cq, 1e-6)
    leaf = ctrl.clone().requires_grad_()
    kleaf = kraw.clone().requires_grad_() if jump else None
    act = torch.softmax(leaf[..., :2 * A].unflatten(-1, (2, A)), -1)
    p = torch.sigmoid(leaf[..., 2 * A:2 * A + n_p].movedim(-1, 0))
    want = [act, p]
    if jump:
        q, nq, fq = nt.unit_forward(leaf[..., 2 * A + n_p:], 1e-6)
        k, nk, fk = nt.unit_forward(kleaf, 1e-6)
        want += [q, nq, fq.to(dtype), k, nk, fk.to(dtype)]
        assert fq[0, 0, 0].item() is False and fk[1, 2, 1].item() is False  # clamped
    _close(got[:len(want)], want, dtype, ["act", "p", "q", "nq", "fq", "k", "nk", "fk"])
    assert all(o is None for o in got[len(want):])
    # the backward: the gradients of every output, the gates' from the tape and (JUMP) the heads
    dact_h, dact_o = r(*act.shape), r(*act.shape)
    dpr, dpw, dpe = r(B, T, Tn), r(B, T, Tn), r(B, T, Tn)
    dpw_h, dpe_h, dq, dk = (r(B, T, Tn), r(B, T, Tn), r(B, T, Tn, C), r(B, T, Tn, C)) if jump else (None,) * 4
    p_e = p[2] if n_p == 3 else p[1]
    loss = (act * (dact_h + dact_o)).sum() + (p[0] * dpr).sum() + (p[1] * dpw).sum() + (p_e * dpe).sum()
    if jump:
        loss = loss + (p[1] * dpw_h).sum() + (p_e * dpe_h).sum() + (q * dq).sum() + (k * dk).sum()
    want = torch.autograd.grad(loss, [leaf] + ([kleaf] if jump else []))
    act_k, p_k, q_k, nq_k, fq_k, k_k, nk_k, fk_k = got
    dc, dk2 = nt._gates_backward(dact_h, dact_o, act_k, p_k, dpr, dpw, dpe, dpw_h, dpe_h, q_k, nq_k, fq_k, dq,
                                 k_k, nk_k, fk_k, dk, Cq)
    _close([dc] + ([dk2] if jump else []), list(want), dtype, ["dctrl", "dkeys"])
    assert dk2 is None or dk2.shape == kraw.shape
    with pytest.raises(ValueError, match="contiguous"):
        nt._gates_backward(dact_h.transpose(0, 1), dact_o, act_k, p_k, dpr, dpw, dpe, dpw_h, dpe_h, q_k, nq_k,
                           fq_k, dq, k_k, nk_k, fk_k, dk, Cq)
    with pytest.raises(ValueError, match="ctrl"):
        nt._gates_forward(ctrl[..., :-1], kraw, A, n_p, Cq, 1e-6)
    if jump:
        with pytest.raises(ValueError, match="of its dtype"):
            nt._gates_forward(ctrl, kraw.half(), A, n_p, Cq, 1e-6)
