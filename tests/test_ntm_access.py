"""The NTM's memory access step in C (memnets.ops.ntm_access) against its tensor-op reference:
values and every gradient in float64 and float32, gradcheck, the NTM built on it against the
same NTM with MEMNETS_NATIVE=0, and the kernel's contract (argument checks, the caller's
tensors left alone, threads, layouts)."""
import shutil

import pytest
import torch

from memnets import NTM
from memnets.ops import _native
from memnets.ops.ntm_access import NTMAccessOut, ntm_access, ntm_access_reference

D64 = torch.float64
needs_kernels = pytest.mark.skipif(not (_native.enabled() and shutil.which("cc")),
                                   reason="no C compiler (or MEMNETS_NATIVE=0): the kernel cannot be built")


def _inputs(B, N, W, R, Hw, S, dtype=D64, seed=0, slots_last=False):
    g = torch.Generator().manual_seed(seed)
    hp = 2 * torch.randn(B, R + Hw, W + 3 + S, generator=g, dtype=dtype)
    erase = torch.rand(B, Hw, W, generator=g, dtype=dtype)
    add = torch.randn(B, Hw, W, generator=g, dtype=dtype)
    memory = torch.randn(B, N, W, generator=g, dtype=dtype)
    if slots_last:  # the layout the kernel keeps: [B, W, N] contiguous, seen as [B, N, W]
        memory = memory.transpose(1, 2).contiguous().transpose(1, 2)
    wr = torch.softmax(torch.randn(B, R, N, generator=g, dtype=dtype), -1)
    ww = torch.softmax(torch.randn(B, Hw, N, generator=g, dtype=dtype), -1)
    return [t.requires_grad_() for t in (hp, erase, add, memory, wr, ww)]


def _grads(outs, xs, seed=5):
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    grads = torch.autograd.grad(loss, xs, allow_unused=True)
    return [torch.zeros_like(x) if d is None else d for x, d in zip(xs, grads)]  # unused: zeros, either way


@needs_kernels
@pytest.mark.parametrize("B,N,W,R,Hw,S", [(3, 7, 4, 2, 1, 3), (2, 5, 3, 1, 3, 5), (1, 1, 2, 1, 1, 1),
                                          (2, 3, 5, 2, 2, 3), (4, 128, 20, 1, 1, 3), (2, 16, 8, 4, 1, 7)])
@pytest.mark.parametrize("dtype", [D64, torch.float32], ids=["f64", "f32"])
def test_kernel_matches_the_reference(B, N, W, R, Hw, S, dtype):
    xs = _inputs(B, N, W, R, Hw, S, dtype)
    got, want = ntm_access(*xs, native=True), ntm_access_reference(*xs)
    assert isinstance(got, NTMAccessOut)
    tol = 1e-12 if dtype == D64 else 2e-5
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    for a, b in zip(_grads(got, xs), _grads(want, xs)):
        torch.testing.assert_close(a, b, rtol=tol, atol=10 * tol)


@needs_kernels
@pytest.mark.parametrize("R,Hw,S", [(1, 1, 3), (2, 2, 1), (1, 3, 5)])
def test_gradcheck(R, Hw, S):
    xs = _inputs(2, 5, 3, R, Hw, S, slots_last=True)
    assert torch.autograd.gradcheck(lambda *a: tuple(ntm_access(*a, native=True)), xs)


@needs_kernels
def test_sharp_and_flat_focus():
    """Strengths and sharpenings far past softplus's threshold 20 (a one-hot focus, weights that
    underflow to 0) and near 0 (a flat one): the same values and gradients as the reference."""
    xs = _inputs(3, 9, 4, 2, 1, 3)
    with torch.no_grad():
        xs[0][0, :, 4:7] = 60.0  # β, g, γ of every head of row 0: far past the threshold
        xs[0][1, :, 4:7] = -30.0
    got, want = ntm_access(*xs, native=True), ntm_access_reference(*xs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(_grads(got, xs), _grads(want, xs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@needs_kernels
@pytest.mark.parametrize("used", range(4), ids=["memory", "read_weights", "write_weights", "reads"])
def test_one_output_alone_takes_its_gradient(used):
    xs = _inputs(2, 6, 3, 2, 2, 3)
    got = _grads([ntm_access(*xs, native=True)[used]], xs)
    want = _grads([ntm_access_reference(*xs)[used]], xs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


@needs_kernels
def test_the_callers_tensors_are_left_alone():
    """Neither pass writes into a tensor it was given: inputs (in either memory layout) and the
    incoming gradients keep their values."""
    for slots_last in (False, True):
        xs = _inputs(3, 6, 4, 2, 2, 3, slots_last=slots_last)
        before = [x.detach().clone() for x in xs]
        out = ntm_access(*xs, native=True)
        gs = [torch.randn_like(o) for o in out]
        g_before = [g.clone() for g in gs]
        torch.autograd.backward(list(out), gs)
        for x, b in zip(xs, before):
            assert torch.equal(x.detach(), b)
        for g, b in zip(gs, g_before):
            assert torch.equal(g, b)


@needs_kernels
def test_memory_comes_back_slots_last_and_non_contiguous_inputs_work():
    xs = _inputs(2, 6, 4, 1, 1, 3)
    out = ntm_access(*xs, native=True)
    assert out.memory.shape == (2, 6, 4) and out.memory.transpose(1, 2).is_contiguous()
    # the step after reads it without a copy, and strided views of every argument give the same numbers
    wide = [torch.cat([x.detach(), x.detach()], -1)[..., : x.shape[-1]].requires_grad_() for x in xs]
    assert not wide[0].is_contiguous()
    for a, b in zip(ntm_access(*wide, native=True), out):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@needs_kernels
def test_rows_split_over_threads_give_the_same_numbers(monkeypatch):
    from memnets.ops import ntm_access as mod

    xs = _inputs(8, 32, 16, 2, 1, 3, dtype=torch.float32)
    old = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            monkeypatch.setattr(mod, "MIN_WORK", 1)  # split however little the work
            assert len(_native.ranges(8, 10 ** 6, mod.MIN_WORK)) == threads
            out = ntm_access(*xs, native=True)
            runs.append(list(out) + list(_grads(out, xs)))
    finally:
        torch.set_num_threads(old)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_arguments_are_checked():
    xs = [x.detach() for x in _inputs(2, 5, 3, 1, 1, 3)]
    hp, erase, add, memory, wr, ww = xs
    with pytest.raises(ValueError, match="`erase`"):
        ntm_access(hp, erase[:, :, :2], add, memory, wr, ww)
    with pytest.raises(ValueError, match="`read_weights`"):
        ntm_access(hp, erase, add, memory, wr[:1], ww)
    with pytest.raises(ValueError, match="`hp`.*odd"):
        ntm_access(hp[..., :-1], erase, add, memory, wr, ww)  # S = 2 shifts
    with pytest.raises(ValueError, match="`hp`"):
        ntm_access(torch.cat([hp, hp], 1), erase, add, memory, wr, ww)  # 4 heads for R + Hw = 2
    with pytest.raises(ValueError, match="`memory`"):
        ntm_access(hp, erase, add, memory[0], wr, ww)
    with pytest.raises(TypeError, match="`add`"):
        ntm_access(hp, erase, add.tolist(), memory, wr, ww)


def test_without_the_kernel_the_reference_runs(monkeypatch):
    xs = _inputs(2, 5, 3, 1, 1, 3)
    monkeypatch.setenv("MEMNETS_NATIVE", "0")
    got, want = ntm_access(*xs), ntm_access_reference(*xs)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="native=True"):
        ntm_access(*xs, native=True)
    monkeypatch.delenv("MEMNETS_NATIVE")
    assert torch.equal(ntm_access(*xs, native=False).reads, want.reads)


@needs_kernels
def test_under_autocast_it_runs_in_float32():
    xs = [x.detach().float() for x in _inputs(2, 6, 4, 1, 1, 3)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ntm_access(*[x.bfloat16() if i < 3 else x for i, x in enumerate(xs)])
    assert all(o.dtype == torch.float32 for o in out)
    want = ntm_access_reference(*[x.bfloat16().float() if i < 3 else x for i, x in enumerate(xs)])
    torch.testing.assert_close(out.memory, want.memory, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("controller,R,Hw,packed", [("lstm", 1, 1, False), ("mlp", 2, 2, False),
                                                    ("lstm", 2, 1, True)])
def test_ntm_on_the_kernel_matches_the_ops(controller, R, Hw, packed, monkeypatch):
    """The whole NTM (float64): outputs, final state, the aux traces, and the gradients of every
    parameter, the input and the starting state, C kernel against MEMNETS_NATIVE=0."""
    from torch.nn.utils.rnn import pack_padded_sequence

    torch.manual_seed(0)
    ntm = NTM(5, 3, memory_slots=9, word_size=4, read_heads=R, write_heads=Hw, controller=controller,
              controller_size=8).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 6, 5, generator=g, dtype=D64, requires_grad=True)
    st = ntm(torch.randn(3, 2, 5, generator=g, dtype=D64))[1]
    st = type(st)(*(t.detach().requires_grad_() for t in st))

    def run():
        if packed:
            y, s = ntm(pack_padded_sequence(x, torch.tensor([6, 4, 1]), batch_first=True), st)
            outs, aux = [y.data, *s], []
        else:
            y, s, aux = ntm(x, st, return_aux=True)
            outs = [y, *s, *aux]
        return outs, _grads(outs, [x, *ntm.parameters(), *st], seed=7)

    got = run()
    monkeypatch.setenv("MEMNETS_NATIVE", "0")
    want = run()
    for a, b in zip(got[0] + list(got[1]), want[0] + list(want[1])):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@needs_kernels
def test_a_nan_stays_in_its_row_and_after_its_step():
    """A NaN in one sequence's input at step t: that sequence's outputs from t on are NaN (the
    kernel propagates it), every earlier output and every other sequence stay as without it."""
    torch.manual_seed(0)
    ntm = NTM(4, 2, memory_slots=10, word_size=5, controller_size=8)
    x = torch.randn(3, 7, 4)
    bad = x.clone()
    bad[1, 4, 2] = float("nan")
    y, s = ntm(x)
    yb, sb = ntm(bad)
    assert torch.isnan(yb[1, 4:]).all() and torch.isnan(sb.memory[1]).all()
    assert torch.equal(yb[1, :4], y[1, :4])
    assert torch.equal(yb[[0, 2]], y[[0, 2]]) and torch.equal(sb.memory[[0, 2]], s.memory[[0, 2]])


def test_impl_reference_runs_the_ops(monkeypatch):
    """``NTM(impl="reference")`` never calls the kernel and gives the same numbers as the default;
    an unknown ``impl`` is refused."""
    from memnets.ops import ntm_access as mod

    torch.manual_seed(0)
    fused = NTM(3, 2, memory_slots=6, word_size=4, controller_size=5).double()
    ref = NTM(3, 2, memory_slots=6, word_size=4, controller_size=5, impl="reference").double()
    ref.load_state_dict(fused.state_dict())
    assert (fused.impl, ref.impl) == ("fused", "reference")
    x = torch.randn(2, 5, 3, dtype=D64)
    calls = []
    real = mod.NTMAccess.apply
    monkeypatch.setattr(mod.NTMAccess, "apply", lambda *a: calls.append(1) or real(*a))
    y_ref = ref(x)[0]
    assert not calls
    y = fused(x)[0]
    assert len(calls) == (5 if mod._kernel(x) is not None else 0)  # one call a step where the kernel runs
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="`impl`"):
        NTM(3, 2, impl="fast")
