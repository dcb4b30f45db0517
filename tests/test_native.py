"""The C kernels of memnets.ops._native (NAM-TM heads and key tape, the value tape, the GRU
step, LSAM's step) against the PyTorch paths they replace, in float64: values, every gradient, gradcheck;
and the fallbacks when no kernel can be built."""
import shutil

import pytest
import torch
import torch.nn.functional as F

from memnets.ops import _native, nam_scan
from memnets.ops.gru import gru_module_forward
from memnets.ops.nam_tape import available, nam_tape_scan
from memnets.ops.nam_tm_heads import nam_tm_heads

D64 = torch.float64
HAVE_CC = _native.enabled() and shutil.which("cc") is not None

needs_kernels = pytest.mark.skipif(not HAVE_CC, reason="no C compiler (or MEMNETS_NATIVE=0): the kernels cannot be built")


def _grads(out, inputs, seed=0, unused_as_zeros=False):
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in out)
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    if unused_as_zeros:  # an input the loss does not depend on: zeros, however a path says it
        grads = [torch.zeros_like(x) if d is None else d for x, d in zip(inputs, grads)]
    return grads


def _close(a, b, tol=1e-10):
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            torch.testing.assert_close(x, y, rtol=tol, atol=tol)


@needs_kernels
def test_kernels_build_here():
    for name in ("nam_tm_heads", "nam_tape", "gru", "lsam", "dnc", "ntm"):
        assert _native.load(name) is not None, f"{name}.c did not compile"


def _gcc_version(cc: str) -> str:
    import subprocess

    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out if "Free Software Foundation" in out else ""  # GCC, not clang behind the name cc


@needs_kernels
@pytest.mark.parametrize("name", ["gru", "nam_tape", "dnc", "ntm"])
def test_the_hot_loops_vectorise(name, tmp_path):
    """Every loop marked IVDEP (common.h) is vectorised at the kernels' own flags. Without the
    mark GCC took the GRU step's loops for possibly overlapping rows, gave up on them, and the
    step's elementwise part ran scalar (docs/bench.md, NAM-TM)."""
    import re
    import subprocess

    cc = shutil.which("gcc") or shutil.which("cc")
    if not _gcc_version(cc):
        pytest.skip(f"{cc} is not GCC: its vectoriser report differs")
    src = _native._HERE / f"{name}.c"
    marked = {(h.name, i + 1) for h in _native._HERE.glob("*.h")
              for i, line in enumerate(h.read_text().splitlines()) if re.match(r"\s*IVDEP for", line)}
    used = {h for h, _ in marked if f'#include "{h}"' in src.read_text()}
    marked = {m for m in marked if m[0] in used}
    assert marked, f"no IVDEP loop in the headers of {src.name}"
    res = subprocess.run([cc, *_native._FLAGS[0], "-fopt-info-vec-optimized", "-o", str(tmp_path / "k.so"), str(src),
                          "-lm"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    done = {(m.group(1), int(m.group(2))) for m in re.finditer(r"([\w.]+\.h):(\d+):\d+: optimized: loop vectorized",
                                                                  res.stderr)}
    assert marked <= done, f"not vectorised: {sorted(marked - done)}"


def _tape_inputs(B, T, H, K, V, with_pr=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(B, T, H, K, generator=g, dtype=D64), -1)
    k = torch.softmax(torch.randn(B, T, H, K, generator=g, dtype=D64), -1)
    v = torch.randn(B, T, H, V, generator=g, dtype=D64)
    pw, pe, pr = (torch.rand(B, T, H, generator=g, dtype=D64) for _ in range(3))
    S0 = 0.3 * torch.randn(B, H, V, K, generator=g, dtype=D64)
    xs = [q, k, v, pw, pe, pr if with_pr else None, S0]
    return [x.requires_grad_() if x is not None else None for x in xs]


@needs_kernels
@pytest.mark.parametrize("B,T,H,K,V,with_pr", [(2, 37, 3, 5, 4, True), (1, 1, 1, 3, 2, False),
                                               (3, 16, 2, 8, 6, True), (2, 33, 1, 7, 3, False)])
def test_nam_tape_scan_matches_reference(B, T, H, K, V, with_pr):
    xs = _tape_inputs(B, T, H, K, V, with_pr)
    live = [x for x in xs if x is not None]
    ours = nam_tape_scan(*xs)
    ref = nam_scan(*xs[:6], initial_state=xs[6], impl="reference")
    _close(ours, ref)
    _close(_grads(ours, live), _grads(ref, live))


@needs_kernels
def test_nam_tape_scan_gradcheck_and_strided_heads():
    B, T, H, K, V = 2, 19, 2, 4, 3
    g = torch.Generator().manual_seed(1)
    heads = torch.softmax(torch.randn(B, T + 1, H, 2, K, generator=g, dtype=D64), -1).requires_grad_()
    v = torch.randn(B, T, H, V, generator=g, dtype=D64, requires_grad=True)
    pw, pe, pr = (torch.rand(B, T, H, generator=g, dtype=D64, requires_grad=True) for _ in range(3))
    S0 = torch.randn(B, H, V, K, generator=g, dtype=D64, requires_grad=True)

    def run(fn, heads, *rest):
        q, k = heads[:, :T].unbind(-2)  # views with one set of strides: read in place
        return fn(q, k, *rest)

    def ref(q, k, v, pw, pe, pr, S0):
        return nam_scan(q, k, v, pw, pe, pr, initial_state=S0, impl="reference")
    args = (heads, v, pw, pe, pr, S0)
    _close(run(nam_tape_scan, *args), run(ref, *args))
    _close(_grads(run(nam_tape_scan, *args), args), _grads(run(ref, *args), args))
    assert torch.autograd.gradcheck(lambda *a: run(nam_tape_scan, *a), args)


def test_nam_tape_scan_checks_its_arguments():
    xs = _tape_inputs(2, 5, 3, 4, 4)
    if available(xs[0]):
        with pytest.raises(ValueError, match="`v` expected shape"):
            nam_tape_scan(xs[0], xs[1], xs[2][:, :, :2], *xs[3:])
    with pytest.raises(RuntimeError, match="nam_scan"):
        nam_tape_scan(*(x.half() if x is not None else None for x in xs))


def _heads_inputs(T, N, L, C, A, seed=0):
    g = torch.Generator().manual_seed(seed)
    act = torch.softmax(torch.randn(T, N, 2, A, generator=g, dtype=D64), -1)
    q = F.normalize(torch.randn(T, N, C, generator=g, dtype=D64), dim=-1)
    k = F.normalize(torch.randn(T, N, C, generator=g, dtype=D64), dim=-1)
    pw, pe = torch.rand(T, N, generator=g, dtype=D64), torch.rand(T, N, generator=g, dtype=D64)
    h0 = torch.softmax(torch.randn(N, 2, L, generator=g, dtype=D64), -1)
    K0 = 0.1 * torch.randn(N, C, L, generator=g, dtype=D64)
    return [x.requires_grad_() for x in (act, q, k, pw, pe, h0, K0)]


@needs_kernels
@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 0, 2], [0, 1, 2], [1, 3]])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("T", [1, 37])
def test_heads_kernel_matches_the_loops(order, transposed, T):
    N, L, C = 6, 7, 5  # L, C not multiples of the kernels' row groups
    xs = _heads_inputs(T, N, L, C, len(order))
    ours = nam_tm_heads(*xs, order, transposed, compiled=True)  # the C kernel
    ref = nam_tm_heads(*xs, order, transposed, compiled=False)  # the Python loops
    _close(ours, ref)
    _close(_grads(ours, xs), _grads(ref, xs))


@needs_kernels
@pytest.mark.parametrize("transposed", [False, True])
def test_heads_kernel_batch_major(transposed):
    B, Tn, T, L, C, order = 2, 3, 21, 6, 4, [0, 1, 2, 3]
    xs = _heads_inputs(T, B * Tn, L, C, 4, seed=2)

    def bm(z):  # [T, N, ...] -> [B, T, Tn, ...]
        return z.view((T, B, Tn) + z.shape[2:]).transpose(0, 1)

    def run(act, q, k, pw, pe, h0, K0):
        Hs, K = nam_tm_heads(bm(act), bm(q), bm(k), bm(pw), bm(pe), h0, K0, order, transposed, batch_major=True)
        return Hs.transpose(0, 1).reshape(T + 1, B * Tn, 2, L), K
    ref = nam_tm_heads(*xs, order, transposed, compiled=False)
    _close(run(*xs), ref)
    _close(_grads(run(*xs), xs), _grads(ref, xs))
    small = [x.detach()[:5].clone().requires_grad_() if i < 5 else x for i, x in enumerate(xs)]
    T = 5
    assert torch.autograd.gradcheck(lambda *a: run(*a), small)


@needs_kernels
@pytest.mark.parametrize("used", [0, 1], ids=["outputs-only", "final-state-only"])
def test_an_unused_output_takes_no_gradient(used):
    """A loss of one output alone (the other's gradient reaches the backward as ``None``, not
    materialized): the same gradients as the reference, for the value tape and the heads."""
    xs = _tape_inputs(2, 21, 2, 5, 3)
    live = [x for x in xs if x is not None]
    ours = nam_tape_scan(*xs)[used]
    ref = nam_scan(*xs[:6], initial_state=xs[6], impl="reference")[used]
    _close(_grads([ours], live, unused_as_zeros=True), _grads([ref], live, unused_as_zeros=True))
    for order in ([0, 1, 2, 3], [0, 1, 2]):
        hs = _heads_inputs(19, 4, 6, 5, len(order), seed=3)
        ours = nam_tm_heads(*hs, order, False, compiled=True)[used]
        ref = nam_tm_heads(*hs, order, False, compiled=False)[used]
        _close(_grads([ours], hs, unused_as_zeros=True), _grads([ref], hs, unused_as_zeros=True))


@needs_kernels
@pytest.mark.parametrize("bidirectional", [True, False])
def test_gru_step_kernel_matches_nn_gru(bidirectional):
    torch.manual_seed(0)
    gru = torch.nn.GRU(5, 4, batch_first=True, bidirectional=bidirectional).double()
    x = torch.randn(3, 9, 5, dtype=D64, requires_grad=True)
    ps = [x, *gru.parameters()]
    ours, ref = gru_module_forward(gru, x), gru(x)[0]
    _close([ours], [ref])
    _close(_grads([ours], ps), _grads([ref], ps))


def _lsam_scan_run(x, w_ih, w_hh, b, M0, h0, heads, compiled):
    from memnets.ops.lsam import lsam_scan

    out, M, h = lsam_scan(x, w_ih, w_hh, b, M0, h0, heads, compiled=compiled)
    return [out, M, h]


def _lsam_inputs(T, B, F, dirs, Hp, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    Dp, G = Hp * d, 3 * Hp * d + 2 * Hp
    r = lambda *s, scale=0.5: (scale * torch.randn(*s, generator=g, dtype=D64)).requires_grad_()
    return [r(T, B, F), r(dirs, G, F), r(dirs, G, Dp), r(dirs, G), r(dirs, B, Hp, d, d, scale=0.2), r(dirs, B, Dp)]


@needs_kernels
@pytest.mark.parametrize("T,B,dirs,Hp,d", [(70, 3, 1, 2, 4), (70, 2, 2, 2, 5), (1, 2, 2, 1, 3), (33, 1, 1, 3, 8),
                                           (32, 4, 2, 1, 16)])
def test_lsam_step_kernel_matches_the_loops(T, B, dirs, Hp, d):
    """LSAM's recurrence with its step in C (memnets.ops.lsam.native) against the TorchScript
    loops (``compiled=False`` leaves the kernel out): outputs, final memory and state, every
    gradient (input, weights, initial memory and state), float64; T past the exact copies kept
    every 32 steps, odd head widths, T = 1."""
    from memnets.ops.lsam.native import kernel

    xs = _lsam_inputs(T, B, 3, dirs, Hp, d)
    assert kernel(xs[0]) is not None
    ours = _lsam_scan_run(*xs, Hp, compiled=True)
    ref = _lsam_scan_run(*xs, Hp, compiled=False)
    _close(ours, ref, tol=1e-11)
    _close(_grads(ours, xs), _grads(ref, xs), tol=1e-10)


@needs_kernels
def test_lsam_step_kernel_gradcheck():
    from memnets.ops.lsam import lsam_scan

    xs = _lsam_inputs(5, 2, 3, 2, 2, 3, seed=1)
    assert torch.autograd.gradcheck(lambda *a: lsam_scan(*a, 2)[0], xs)


@needs_kernels
def test_lsam_step_kernel_checks_its_buffers():
    from memnets.ops.lsam import native

    step = native.kernel(torch.zeros(1))[0]
    T, N, d = 2, 3, 4
    f = lambda *s: torch.zeros(*s)
    args = [f(T, 1, N, 3 * d + 2), f(1, 3 * d + 2, d), f(N, d, d), f(1, N, d), f(T, 1, N, d), f(T, N, 2, d),
            f(T, N, 2, 1), f(T, N, 2), f(T, N), f(T, N, d), f(T, N, d), f(T, N, d), f(0, N, d, d)]
    native.forward_steps(step, *args, 32, 1e-6)  # fits
    bad = list(args)
    bad[6] = f(T, N, 3, 1)  # NRM of another shape
    with pytest.raises(ValueError, match="`NRM` expected shape"):
        native.forward_steps(step, *bad, 32, 1e-6)
    bad = list(args)
    bad[2] = f(N, d, d).double()  # the memory in another dtype
    with pytest.raises(ValueError, match="`X` expected a contiguous torch.float32"):
        native.forward_steps(step, *bad, 32, 1e-6)
    bad = list(args)
    bad[2] = f(N, d, d).transpose(1, 2)  # not contiguous
    with pytest.raises(ValueError, match="`X` expected a contiguous"):
        native.forward_steps(step, *bad, 32, 1e-6)


def test_no_compiler_means_the_pytorch_paths(monkeypatch, tmp_path):
    """A failed build gives None (then the TorchScript / chunked paths run, same values)."""
    monkeypatch.setattr(_native, "_LIBS", {})
    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    monkeypatch.setattr(_native.tempfile, "gettempdir", lambda: str(tmp_path))
    assert _native.load("nam_tape") is None
    assert not available(torch.zeros(1, dtype=D64))
    monkeypatch.setattr(_native, "_LIBS", {})
    monkeypatch.setenv("MEMNETS_NATIVE", "0")
    assert _native.load("gru") is None
    xs = _heads_inputs(9, 4, 5, 3, 4)
    Hs, K = nam_tm_heads(*xs, [0, 1, 2, 3])  # the TorchScript loops
    Hr, Kr = nam_tm_heads(*xs, [0, 1, 2, 3], compiled=False)
    _close([Hs, K], [Hr, Kr])


@needs_kernels
@pytest.mark.parametrize("N,W,R,T,layers", [(5, 4, 2, 7, 1), (1, 3, 1, 1, 1), (6, 5, 3, 4, 2), (16, 20, 4, 3, 1)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_dnc_access_step_fills_the_buffers_the_ops_fill(N, W, R, T, layers, dtype, monkeypatch):
    """The DNC's C access step (memnets.ops.dnc.native) writes every forward buffer the
    backward reads as the PyTorch ops of run_forward write it: the same recurrence from a
    random state (ties in usage included, a stable sort), each buffer compared."""
    from memnets import DNC
    from memnets.ops.dnc import workspace as ws
    from memnets.ops.dnc.native import _NAMES

    torch.manual_seed(0)
    dnc = DNC(3, 2, memory_slots=N, word_size=W, read_heads=R, controller_size=6, controller_layers=layers).to(dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, T, 3, generator=g, dtype=dtype)
    st = dnc.init_state(2)
    a = st.access
    usage = torch.rand(2, N, generator=g, dtype=dtype)
    ww = torch.softmax(torch.randn(2, N, generator=g, dtype=dtype), -1)
    usage[:, : (N + 1) // 2] = 0  # unused, unwritten slots: equal usages, which the sort keeps in slot order
    ww[:, : (N + 1) // 2] = 0
    state = type(st)(st.controller, type(a)(torch.randn(2, N, W, generator=g, dtype=dtype), usage,
                                            torch.rand(2, N, N, generator=g, dtype=dtype) * 0.1,
                                            torch.rand(2, N, generator=g, dtype=dtype) * 0.2,
                                            torch.softmax(torch.randn(2, R, N, generator=g, dtype=dtype), -1), ww),
                     torch.randn(2, R, W, generator=g, dtype=dtype))
    spaces = {}
    real_lease = ws.POOL.lease

    def keep(key, make):  # the forward's workspace of each run, kept to compare
        lease = real_lease(key, make)
        spaces[len(spaces)] = lease.space
        return lease

    ws.clear_workspaces()
    monkeypatch.setattr(ws.POOL, "lease", keep)
    y_c, s_c = dnc(x, state)
    ws.clear_workspaces()
    monkeypatch.setenv("MEMNETS_NATIVE", "0")
    y_ops, s_ops = dnc(x, state)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    f_c, f_ops = spaces[0], spaces[1]
    assert f_c is not f_ops
    for name in _NAMES + ("alloc",):
        got, want = getattr(f_c, name), getattr(f_ops, name)
        if name == "LL":  # step 0's transposed half is never written or read
            got, want = got[1:], want[1:]
        if name == "PHI":
            assert torch.equal(got, want), name
        else:
            torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")
    torch.testing.assert_close(f_c.X[0], f_ops.X[0], rtol=tol, atol=tol)
    torch.testing.assert_close(y_c, y_ops, rtol=tol, atol=tol)


@needs_kernels
@pytest.mark.parametrize("N,W,R,layers,lengths", [(6, 4, 3, 1, None), (6, 4, 3, 2, None), (1, 3, 1, 1, None),
                                                   (5, 4, 2, 1, [7, 3, 1])])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_dnc_backward_step_gives_the_ops_gradients(N, W, R, layers, lengths, dtype, monkeypatch):
    """The DNC's C backward step (memnets.ops.dnc.native) against the reverse loop's PyTorch
    ops: every gradient (input, parameters, initial state) of a loss on the outputs and every
    part of the final state; with ``lengths`` (a packed batch's final states taken early)."""
    from torch.nn.utils.rnn import pack_padded_sequence

    from memnets import DNC

    torch.manual_seed(0)
    dnc = DNC(5, 3, memory_slots=N, word_size=W, read_heads=R, controller_size=8, controller_layers=layers)
    dnc = dnc.to(dtype)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 7, 5, generator=g, dtype=dtype, requires_grad=True)
    st = dnc(torch.randn(3, 2, 5, generator=g, dtype=dtype))[1]  # a state worth differentiating
    st = type(st)(*(type(p)(*(t.detach().requires_grad_() for t in p)) if isinstance(p, tuple)
                    else p.detach().requires_grad_() for p in st))
    leaves = [t for p in st for t in (p if isinstance(p, tuple) else (p,))]

    def grads():
        inp = x if lengths is None else pack_padded_sequence(x, torch.tensor(lengths), batch_first=True)
        y, s = dnc(inp, st)
        y = y if lengths is None else y.data
        parts = [t for p in s for t in (p if isinstance(p, tuple) else (p,))]
        w = torch.Generator().manual_seed(3)
        loss = (y * torch.randn(y.shape, generator=w, dtype=dtype)).sum() + sum(
            (t * torch.randn(t.shape, generator=w, dtype=dtype)).sum() for t in parts)
        return torch.autograd.grad(loss, [x, *dnc.parameters(), *leaves], allow_unused=True)

    got = grads()
    monkeypatch.setenv("MEMNETS_NATIVE", "0")
    want = grads()
    tol = 1e-11 if dtype == torch.float64 else 2e-4
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@needs_kernels
def test_ranges_split_the_work_over_threads():
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert _native.ranges(10, 10 ** 9) == [(0, 3), (3, 6), (6, 10)]
        assert _native.ranges(10, 10) == [(0, 10)]  # too little work for more than one
        seen = []
        _native.parallel(lambda i, a, b: seen.append((i, a, b)), [(0, 3), (3, 6), (6, 10)])
        assert sorted(seen) == [(0, 0, 3), (1, 3, 6), (2, 6, 10)]
    finally:
        torch.set_num_threads(old)


@needs_kernels
def test_kernels_split_over_threads_give_the_same_numbers():
    """Sequences are independent: split over two threads, every value and gradient is the same."""
    xs = _heads_inputs(20, 64, 16, 16, 4, seed=3)
    tape = _tape_inputs(8, 20, 8, 16, 16, seed=4)
    old = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert len(_native.ranges(64, 20 * 64 * 16 * (3 * 16 + 8))) == threads
            out = nam_tm_heads(*xs, [0, 1, 2, 3]) + nam_tape_scan(*tape)
            runs.append(list(out) + list(_grads(out, xs + [t for t in tape if t is not None])))
    finally:
        torch.set_num_threads(old)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@needs_kernels
def test_lsam_step_kernel_split_over_threads(monkeypatch):
    """LSAM's memories split over two threads: the same values and gradients as one thread (up to
    the rounding of PyTorch's own matrix products, which then use two threads as well)."""
    from memnets.ops.lsam import native

    monkeypatch.setattr(native, "MIN_WORK", 1)  # split even this small a step
    xs = _lsam_inputs(5, 32, 8, 2, 4, 8, seed=5)  # N = 256 memories of 8 x 8
    old = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert len(_native.ranges(256, 256 * 8 * 8 * 3, native.MIN_WORK)) == threads
            out = _lsam_scan_run(*xs, 4, compiled=True)
            runs.append(out + list(_grads(out, xs)))
    finally:
        torch.set_num_threads(old)
    _close(runs[0], runs[1], tol=1e-12)
