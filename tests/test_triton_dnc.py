"""The DNC's Triton kernels (memnets.ops.gpu.dnc) against ``DNC(impl="reference")``, values,
final state and every gradient, float32 and float64: on a GPU when there is one, else on CPU
tensors through Triton's interpreter (``TRITON_INTERPRET=1``, the ``triton_interpreter`` fixture of
conftest.py). Skipped, with the reason, only where triton or numpy is not installed
(``pip install 'memnets[gpu]' numpy``)."""
from __future__ import annotations

import pytest
import torch
from helpers import counting_kernels, triton_marks

CUDA = torch.cuda.is_available()
pytestmark = triton_marks()

from memnets.memories.dnc import DNC, DNCAccessState, DNCControllerState, DNCState  # noqa: E402
from memnets.ops import gpu  # noqa: E402
from memnets.ops.dnc import DNCRecurrence, interface_layout  # noqa: E402
from memnets.ops.gpu import dnc as tl_dnc  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
N, W, R = 5, 3, 2  # N not a power of 2


def _random_state(B, C, dtype, seed):
    """A state with every part non-zero: usages, weightings and precedence in (0, 1) (no ties)."""
    g = torch.Generator().manual_seed(seed)

    def r(*s, scale=0.5):
        return (scale * torch.randn(*s, generator=g, dtype=torch.float64)).to(DEV, dtype)

    def u(*s, scale=1.0):
        return (scale * torch.rand(*s, generator=g, dtype=torch.float64)).to(DEV, dtype)

    link = u(B, N, N, scale=0.2) * (1 - torch.eye(N, dtype=dtype, device=DEV))
    return DNCState(DNCControllerState(r(B, 1, C), r(B, 1, C)),
                    DNCAccessState(r(B, N, W), u(B, N), link, u(B, N, scale=0.5), u(B, R, N, scale=0.4),
                                   u(B, N, scale=0.5)),
                    r(B, R, W))


def _leaves(state):
    return [t.detach().clone().requires_grad_() for t in (*state.controller, *state.access, state.reads)]


def _pack(ts):
    return DNCState(DNCControllerState(*ts[:2]), DNCAccessState(*ts[2:8]), ts[8])


def _run(model, x, leaves):
    y, st = model(x, _pack(leaves) if leaves else None)
    outs = [y, *st.controller, *st.access, st.reads]
    g = torch.Generator().manual_seed(1)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=torch.float64).to(t)).sum() for t in outs)
    inputs = [x, *model.parameters(), *leaves]
    return outs, torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("loop", ["kernel", "steps"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-4)])
@pytest.mark.parametrize("T,state", [(4, "zero"), (6, "random")])
def test_triton_dnc_matches_the_reference(T, state, dtype, tol, loop, monkeypatch):
    """DNC.forward on the CUDA path (Triton kernels) against the per-equation reference: outputs,
    final state, the gradients of every parameter, the input and the initial state; the time loop
    in one kernel each way and one launch per step (``MEMNETS_TIME_LOOP``)."""
    monkeypatch.setenv("MEMNETS_TIME_LOOP", loop)
    torch.manual_seed(0)
    B, F, C = 2, 3, 4
    ref = DNC(F, 2, memory_slots=N, word_size=W, read_heads=R, controller_size=C, impl="reference")
    ref = ref.to(DEV, dtype)
    fused = DNC(F, 2, memory_slots=N, word_size=W, read_heads=R, controller_size=C).to(DEV, dtype)
    fused.load_state_dict(ref.state_dict())
    x = (torch.randn(B, T, F, dtype=torch.float64)).to(DEV, dtype).requires_grad_()
    leaves = _leaves(_random_state(B, C, dtype, seed=2)) if state == "random" else []
    calls = []
    real = tl_dnc.DNCRecurrenceTriton.apply
    monkeypatch.setattr(tl_dnc.DNCRecurrenceTriton, "apply", lambda *a: calls.append(1) or real(*a))
    with gpu.cuda_path():
        assert gpu.use_triton(x)
        got, ggot = _run(fused, x, leaves)
    assert calls == [1]
    want, gwant = _run(ref, x, [t.detach().clone().requires_grad_() for t in leaves])
    assert len(ggot) == len(gwant) == 1 + len(list(ref.parameters())) + len(leaves)
    for a, b in zip(got + list(ggot), want + list(gwant)):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def _fn_inputs(B, T, F, C, n, w, r, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    I = interface_layout(r, w)["size"]

    def rn(*s, scale=0.5):
        return (scale * torch.randn(*s, generator=g, dtype=torch.float64)).to(DEV, dtype)

    def u(*s, scale=1.0):
        return (scale * torch.rand(*s, generator=g, dtype=torch.float64)).to(DEV, dtype)

    return [rn(B, T, F), rn(4 * C, F), rn(4 * C), rn(I, C), rn(I), rn(B, 1, C), rn(B, 1, C), rn(B, n, w),
            u(B, n), u(B, n, n, scale=0.2), u(B, n, scale=0.5), u(B, r, n, scale=0.4), u(B, n, scale=0.5),
            rn(B, r, w), rn(4 * C, r * w + C)]


@pytest.mark.parametrize("loop", ["kernel", "steps"])
@pytest.mark.parametrize("alloc3d", [True, False])
def test_triton_dnc_recurrence_matches_the_cpu_recurrence_float64(alloc3d, loop, monkeypatch):
    """The autograd Function against the CPU fused recurrence (same signature), values and
    gradients, float64; 3 read heads and a controller of 3 (blocks of 4: masked lanes), the
    allocation's backward as one [N, N, N] product and slot by slot; the time loop in one kernel
    and one launch per step."""
    monkeypatch.setattr(tl_dnc, "ALLOC3D_MAX", 1 << 20 if alloc3d else 0)
    monkeypatch.setenv("MEMNETS_TIME_LOOP", loop)
    args = [t.requires_grad_() for t in _fn_inputs(2, 3, 2, 3, N, W, 3, seed=5)]
    cargs = [a.detach().cpu().requires_grad_() for a in args]
    got = tl_dnc.DNCRecurrenceTriton.apply((3, W), *args)
    want = DNCRecurrence.apply((3, W), *cargs)
    g = torch.Generator().manual_seed(6)
    co = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in want]
    ggot = torch.autograd.grad(sum((a * c.to(a)).sum() for a, c in zip(got, co)), args)
    gwant = torch.autograd.grad(sum((a * c).sum() for a, c in zip(want, co)), cargs)
    tol = 1e-10 if CUDA else 1e-12  # a GPU's fused multiply-adds: some 1.5e-12 apart
    for a, b in zip(list(got) + list(ggot), list(want) + list(gwant)):
        torch.testing.assert_close(a.cpu(), b, atol=tol, rtol=tol)


def test_triton_dnc_recurrence_gradcheck():
    """torch.autograd.gradcheck of the autograd Function, float64, a very small case."""
    args = [t.requires_grad_() for t in _fn_inputs(1, 2, 1, 1, 3, 2, 1, seed=7)]
    assert torch.autograd.gradcheck(lambda *a: tl_dnc.DNCRecurrenceTriton.apply((1, 2), *a), args,
                                    eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)
    # the interface rows in storage order, gathered inside (what the DNC module passes on CUDA):
    # the same as gathering them outside by the permutation
    from memnets.ops.dnc.layout import interface_permutation
    perm = interface_permutation(1, 2, device=args[0].device)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    stored = [a.detach().clone().requires_grad_() for a in args]
    stored[3], stored[4] = (args[i].detach()[inv].clone().requires_grad_() for i in (3, 4))
    got = tl_dnc.DNCRecurrenceTriton.apply((1, 2, True), *stored)
    want = tl_dnc.DNCRecurrenceTriton.apply((1, 2), *args)
    g = torch.Generator().manual_seed(1)
    co = [torch.randn(w.shape, generator=g, dtype=w.dtype).to(w.device) for w in want]
    ggot = torch.autograd.grad(sum((a * c).sum() for a, c in zip(got, co)), stored)
    gwant = torch.autograd.grad(sum((a * c).sum() for a, c in zip(want, co)), args)
    for a, b in zip(list(got), list(want)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    for i, (a, b) in enumerate(zip(ggot, gwant)):
        torch.testing.assert_close(a, b[inv] if i in (3, 4) else b, atol=1e-12, rtol=1e-12)
    assert torch.autograd.gradcheck(lambda *a: tl_dnc.DNCRecurrenceTriton.apply((1, 2, True), *a), stored,
                                    eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)
    with pytest.raises(ValueError, match="dims"):
        tl_dnc.DNCRecurrenceTriton.apply((1, 2, False), *args)


def test_triton_dnc_checks_its_arguments_and_leaves_inputs_alone():
    args = _fn_inputs(2, 2, 2, 2, N, W, R, seed=8, dtype=torch.float32)
    before = [t.clone() for t in args]
    tl_dnc.DNCRecurrenceTriton.apply((R, W), *args)
    assert all(torch.equal(a, b) for a, b in zip(args, before))
    bad = list(args)
    bad[7] = args[7][:, :-1]  # mem0 with N − 1 slots
    with pytest.raises(ValueError, match="inconsistent shapes"):
        tl_dnc.DNCRecurrenceTriton.apply((R, W), *bad)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        tl_dnc.DNCRecurrenceTriton.apply((R + 1, W), *args)
    wrong = list(args)
    wrong[3] = args[3].double()
    with pytest.raises(TypeError, match="float32 or float64"):
        tl_dnc.DNCRecurrenceTriton.apply((R, W), *wrong)
    with pytest.raises(ValueError, match="one controller layer"):
        tl_dnc.DNCRecurrenceTriton.apply((R, W), *args, args[-1], args[2])


def test_triton_dnc_applies_to_one_controller_layer_only():
    """Two controller layers keep the PyTorch recurrence on the CUDA path (same values)."""
    torch.manual_seed(0)
    m = DNC(3, 2, memory_slots=N, word_size=W, read_heads=R, controller_size=4, controller_layers=2).double()
    x = torch.randn(2, 3, 3, dtype=torch.float64)
    s = m.init_state(2)
    assert not tl_dnc.applies(s.controller.h, s.access.memory, [p for p in m.ctrl_rec[1].parameters()])
    assert tl_dnc.applies(s.controller.h[:, :1], s.access.memory)
    y_ref, _ = m(x)
    with gpu.cuda_path():
        y, _ = m.to(DEV)(x.to(DEV))
    torch.testing.assert_close(y.cpu(), y_ref, atol=1e-12, rtol=1e-12)
    assert tl_dnc.launches_per_step() == {"forward": 2, "backward": 2}


@pytest.mark.parametrize("loop", ["auto", "kernel", "steps"])
def test_triton_dnc_time_loop_in_one_kernel_or_one_launch_per_step(loop, monkeypatch):
    """The whole time loop is one launch forward and one backward (whatever T) where the recurrent
    weight is small or ``MEMNETS_TIME_LOOP=kernel``; ``=steps`` launches the step kernels T times
    each way. The choice: by W_0's size (the gpu-check DNCs: LSTM 64 in one kernel, LSTM 256 per
    step), and a value it does not know is refused by name."""
    monkeypatch.setenv("MEMNETS_TIME_LOOP", loop)
    monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "0")  # on CUDA: every launch issued, none captured
    for T in (2, 5):
        counts = counting_kernels(tl_dnc, monkeypatch)
        args = [t.requires_grad_() for t in _fn_inputs(2, T, 2, 3, N, W, R, seed=3, dtype=torch.float32)]
        out = tl_dnc.DNCRecurrenceTriton.apply((R, W), *args)
        sum(o.sum() for o in out).backward()
        if loop == "steps":
            assert dict(counts) == {"forward_step": T, "backward_step": T}
        else:
            assert dict(counts) == {"forward_seq": 1, "backward_seq": 1}
        monkeypatch.undo()
        monkeypatch.setenv("MEMNETS_TIME_LOOP", loop)
        monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "0")
    want = {"auto": (True, False), "kernel": (True, True), "steps": (False, False)}[loop]
    assert (tl_dnc.time_loop_in_kernel(64, 4, 20), tl_dnc.time_loop_in_kernel(256, 4, 64)) == want
    assert tl_dnc.launches_per_step(64, 4, 20) == ({"forward": 0, "backward": 0} if want[0] else
                                                   {"forward": 2, "backward": 2})
    monkeypatch.setenv("MEMNETS_TIME_LOOP", "fused")
    with pytest.raises(ValueError, match="MEMNETS_TIME_LOOP expected one of auto, kernel, steps"):
        tl_dnc.time_loop_in_kernel(64, 4, 20)


def test_triton_dnc_warps_follow_the_tiles_or_the_environment(monkeypatch):
    """Warps per program by the largest tile (4 forward and 8 backward for gpu-check's DNC at
    LSTM 64), or ``MEMNETS_DNC_WARPS`` for both ways; the setting is part of the kernels' form
    (every graph key of the DNC) and reaches the launches; a count Triton cannot take is refused."""
    monkeypatch.delenv(tl_dnc.WARPS_ENV, raising=False)
    monkeypatch.setenv("MEMNETS_CUDA_GRAPHS", "0")
    blk = tl_dnc._blocks(64, 16, 20, 4, 0)
    assert [tl_dnc._warps(blk["BN"], blk["BW"], blk["BR"], bwd) for bwd in (False, True)] == [4, 8]
    assert tl_dnc._warps(8, 8, 2, True) == 2
    auto = tl_dnc.kernel_form(64, 4, 20)
    assert auto[1] is None
    monkeypatch.setenv(tl_dnc.WARPS_ENV, "16")
    assert [tl_dnc._warps(blk["BN"], blk["BW"], blk["BR"], bwd) for bwd in (False, True)] == [16, 16]
    assert tl_dnc.kernel_form(64, 4, 20) == (auto[0], 16)
    monkeypatch.setenv(tl_dnc.WARPS_ENV, "2")
    counts = counting_kernels(tl_dnc, monkeypatch)
    args = [t.requires_grad_() for t in _fn_inputs(2, 3, 2, 3, N, W, R, seed=3, dtype=torch.float64)]
    out = tl_dnc.DNCRecurrenceTriton.apply((R, W), *args)
    sum(o.sum() for o in out).backward()
    assert sum(counts.values()) >= 2 and all(w == {2} for w in counts.warps.values())
    monkeypatch.setenv(tl_dnc.WARPS_ENV, "3")
    with pytest.raises(ValueError, match="MEMNETS_DNC_WARPS expected one of 1, 2, 4, 8, 16, 32"):
        tl_dnc.kernel_form(64, 4, 20)


@pytest.mark.parametrize("used", [(0,), (0, 3, 7)], ids=["outputs-only", "some-finals"])
def test_triton_dnc_recurrence_with_outputs_left_out_of_the_loss(used):
    """Outputs that take no part in the loss reach backward as None (no zero gradient made per
    output by autograd) and count as zeros: the gradients equal the CPU recurrence's, float64."""
    args = [t.requires_grad_() for t in _fn_inputs(2, 3, 2, 3, N, W, R, seed=9)]
    cargs = [a.detach().cpu().requires_grad_() for a in args]
    got = tl_dnc.DNCRecurrenceTriton.apply((R, W), *args)
    want = DNCRecurrence.apply((R, W), *cargs)
    ggot = torch.autograd.grad(sum(got[i].sum() for i in used), args, allow_unused=True)
    gwant = torch.autograd.grad(sum(want[i].sum() for i in used), cargs, allow_unused=True)
    for a, b in zip(ggot, gwant):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a.cpu(), b, atol=1e-12, rtol=1e-12)


def test_triton_dnc_returns_tensors_of_its_own_and_a_zero_state_in_one_fill():
    """The outputs are no views (so a caller may change a state in place, and a kept final state
    holds none of the per-step buffers) and share no memory; ``init_state`` is zeros of their own."""
    args = _fn_inputs(2, 3, 2, 3, N, W, R, seed=10)
    outs = tl_dnc.DNCRecurrenceTriton.apply((R, W), *args)
    assert all(o._base is None and o.is_contiguous() for o in outs)
    assert len({o.untyped_storage().data_ptr() for o in outs}) == len(outs)
    before = [o.clone() for o in outs]
    outs[3].zero_()  # the final memory
    assert all(torch.equal(a, b) for i, (a, b) in enumerate(zip(outs, before)) if i != 3)
    m = DNC(3, 2, memory_slots=N, word_size=W, read_heads=R, controller_size=4)
    s = m.init_state(3)
    parts = [*s.controller, *s.access, s.reads]
    assert all(t._base is None and not t.any() for t in parts)
    assert [tuple(t.shape) for t in parts] == [(3, 1, 4), (3, 1, 4), (3, N, W), (3, N), (3, N, N), (3, N), (3, R, N),
                                               (3, N), (3, R, W)]
    assert "_interface_perm" not in m.state_dict() and m._interface_perm.dtype == torch.long


def test_triton_dnc_step_launches_few_ops_around_its_loops():
    """Around its two graphed loops a training step of the DNC issues a few ops, not one per state
    tensor: its zero state is one fill, its final states one multi-tensor copy (and the
    controller's h, a strided slice, one copy), the unused outputs' gradients one fill, and the
    interface rows are gathered, and the weights' gradients made, inside the graphed functions
    (counted as ``memnets bench launches`` does)."""
    from memnets.bench.launches import count_step

    torch.manual_seed(0)
    m = DNC(3, 2, memory_slots=N, word_size=W, read_heads=R, controller_size=4).to(DEV)
    # on CUDA: every op issued from Python; the layer's own path (not graphed whole, as it is by default)
    with gpu.env_var("MEMNETS_CUDA_GRAPHS", "0" if CUDA else "1"), gpu.env_var("MEMNETS_MODULE_GRAPHS", "0"):
        c = count_step(m, torch.randn(2, 4, 3, device=DEV), lambda x: m(x)[0], DEV, replay=True)
    # the ops inside the loops are counted by loop (graph_aten), not by name: take them out
    fwd = sum(c.aten["fwd"].values()) - sum(c.graph_aten["fwd"].values())
    bwd = sum(c.aten["bwd"].values()) - sum(c.graph_aten["bwd"].values())
    assert c.graph_calls["fwd"] == {"dnc.forward": 1} and c.graph_calls["bwd"] == {"dnc.backward": 1}
    # 7 and 12 now: the weights' gradients and the interface rows' gathering are inside the graphs
    assert fwd <= 8 and bwd <= 14, (fwd, bwd, dict(c.aten["fwd"]), dict(c.aten["bwd"]))
