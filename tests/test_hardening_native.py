"""The C kernels and their cache under hostile inputs: they write only into buffers they own,
check their arguments before a kernel reads them, take large and zero sizes, compute exp as
documented; the cache loads only libraries this user built into folders only this user can
write, and anything else falls back to the PyTorch paths with one warning."""
import ctypes
import errno
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from memnets.ops import _native
from memnets.ops.nam_tape import available, nam_tape_scan
from memnets.ops.nam_tm_heads import nam_tm_heads

D64 = torch.float64
HAVE_CC = _native.enabled() and shutil.which("cc") is not None
needs_kernels = pytest.mark.skipif(not HAVE_CC, reason="no C compiler (or MEMNETS_NATIVE=0)")
NATIVE = Path(_native.__file__).resolve().parent


def _tape_inputs(B, T, H, K, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(B, T, H, K, generator=g, dtype=D64), -1)
    k = torch.softmax(torch.randn(B, T, H, K, generator=g, dtype=D64), -1)
    v = torch.randn(B, T, H, V, generator=g, dtype=D64)
    pw, pe, pr = (torch.rand(B, T, H, generator=g, dtype=D64) for _ in range(3))
    S0 = 0.3 * torch.randn(B, H, V, K, generator=g, dtype=D64)
    return [q, k, v, pw, pe, pr, S0]


def _heads_inputs(T, N, L, C, A, seed=0, dtype=D64):
    g = torch.Generator().manual_seed(seed)
    act = torch.softmax(torch.randn(T, N, 2, A, generator=g, dtype=dtype), -1)
    q = F.normalize(torch.randn(T, N, C, generator=g, dtype=dtype), dim=-1)
    k = F.normalize(torch.randn(T, N, C, generator=g, dtype=dtype), dim=-1)
    pw, pe = torch.rand(T, N, generator=g, dtype=dtype), torch.rand(T, N, generator=g, dtype=dtype)
    h0 = torch.softmax(torch.randn(N, 2, L, generator=g, dtype=dtype), -1)
    K0 = 0.1 * torch.randn(N, C, L, generator=g, dtype=dtype)
    return [act, q, k, pw, pe, h0, K0]


# --- the caller's tensors are never written -------------------------------------------------

@needs_kernels
@pytest.mark.parametrize("K,V", [(1, 4), (4, 1), (1, 1)])
def test_tape_forward_leaves_the_callers_state_alone(K, V):
    xs = _tape_inputs(2, 5, 2, K, V)
    before = [x.clone() for x in xs]
    o, S = nam_tape_scan(*xs)
    for x, b in zip(xs, before):
        assert torch.equal(x, b)
    assert not torch.equal(S, xs[-1])  # the final state is a new tensor, and it moved


@needs_kernels
def test_tape_backward_leaves_the_incoming_gradient_alone():
    xs = [x.requires_grad_() for x in _tape_inputs(2, 5, 2, 4, 4)]
    o, S = nam_tape_scan(*xs)
    G = torch.randn(2, 2, 4, 4, dtype=D64)  # [B, H, K, V]: its transpose is S's natural layout
    gS, go = G.transpose(-1, -2), torch.randn_like(o)
    G0, go0 = G.clone(), go.clone()
    grads = torch.autograd.grad((o, S), xs, (go, gS))
    assert torch.equal(G, G0) and torch.equal(go, go0)
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@needs_kernels
@pytest.mark.parametrize("transposed", [False, True])
def test_heads_backward_leaves_the_incoming_gradient_alone(transposed):
    xs = [x.requires_grad_() for x in _heads_inputs(6, 3, 5, 4, 4)]
    before = [x.detach().clone() for x in xs]
    Hs, K = nam_tm_heads(*xs, [0, 1, 2, 3], transposed)
    G = torch.randn(3, 5, 4, dtype=D64)  # [N, L, C]: its transpose has K's shape [N, C, L]
    gK, gH = G.transpose(1, 2), torch.randn_like(Hs)
    G0, gH0 = G.clone(), gH.clone()
    torch.autograd.grad((Hs, K), xs, (gH, gK))
    assert torch.equal(G, G0) and torch.equal(gH, gH0)
    assert all(torch.equal(x, b) for x, b in zip(xs, before))


@needs_kernels
def test_heads_forward_leaves_the_callers_tapes_alone():
    xs = _heads_inputs(4, 2, 1, 1, 4)  # tape length 1, width 1
    before = [x.clone() for x in xs]
    nam_tm_heads(*xs, [0, 1, 2, 3])
    assert all(torch.equal(x, b) for x, b in zip(xs, before))


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("L,C", [(1, 3), (4, 1), (1, 1)])
def test_heads_return_a_key_tape_of_their_own(compiled, L, C):
    """The returned key tape is not a view of a pooled workspace that a later call reuses."""
    if compiled and not HAVE_CC:
        pytest.skip("no C compiler")
    xs = [x.requires_grad_() for x in _heads_inputs(5, 2, L, C, 4, seed=0)]
    Hs, K = nam_tm_heads(*xs, [0, 1, 2, 3], compiled=compiled)
    kept = K.detach().clone()
    (Hs.sum() + K.sum()).backward()  # gives the workspace back
    nam_tm_heads(*_heads_inputs(5, 2, L, C, 4, seed=1), [0, 1, 2, 3], compiled=compiled)
    assert torch.equal(K.detach(), kept)


# --- arguments are checked before a kernel reads them ---------------------------------------

@needs_kernels
def test_heads_check_widths_dtypes_and_order():
    act, q, k, pw, pe, h0, K0 = _heads_inputs(5, 3, 6, 4, 4)
    order = [0, 1, 2, 3]
    with pytest.raises(ValueError, match="`q`"):
        nam_tm_heads(act, q[..., :2], k, pw, pe, h0, K0, order)
    with pytest.raises(ValueError, match="`k`"):
        nam_tm_heads(act, q, torch.cat([k, k], -1), pw, pe, h0, K0, order)
    with pytest.raises(ValueError, match="`q`"):
        nam_tm_heads(act, q.float(), k, pw, pe, h0, K0, order)
    with pytest.raises(ValueError, match="`h0`"):
        nam_tm_heads(act, q, k, pw, pe, h0[:2], K0, order)
    with pytest.raises(ValueError, match="`key_tape`"):
        nam_tm_heads(act, q, k, pw, pe, h0, K0[..., :3], order)
    with pytest.raises(ValueError, match="`p_w`"):
        nam_tm_heads(act, q, k, pw[:2], pe, h0, K0, order)
    with pytest.raises(ValueError, match="`order`"):
        nam_tm_heads(act, q, k, pw, pe, h0, K0, [0, 1, 2])
    with pytest.raises(ValueError, match="`order`"):
        nam_tm_heads(act, q, k, pw, pe, h0, K0, [0, 1, 2, 7])
    with pytest.raises(ValueError, match="`act`"):
        nam_tm_heads(act[0], q, k, pw, pe, h0, K0, order)
    bm = act.view(1, 5, 3, 2, 4)
    with pytest.raises(ValueError, match="`q`"):
        nam_tm_heads(bm, q, k, pw.view(1, 5, 3), pe.view(1, 5, 3), h0, K0, order, batch_major=True)  # time-major q


@needs_kernels
def test_tape_checks_its_ranks():
    q, k, v, pw, pe, pr, S0 = _tape_inputs(1, 3, 1, 2, 2)
    with pytest.raises(ValueError):
        nam_tape_scan(q[0], k, v, pw, pe, pr, S0)
    with pytest.raises(ValueError):
        nam_tape_scan(q, k, v.float(), pw, pe, pr, S0)


# --- large and zero sizes -------------------------------------------------------------------

_LARGE = textwrap.dedent("""
    import torch
    from memnets.ops.nam_tape import nam_tape_scan
    from memnets.ops.nam_tm_heads import nam_tm_heads
    V = 400_000
    xs = [torch.rand(1, 2, 1, 1, dtype=torch.float64), torch.rand(1, 2, 1, 1, dtype=torch.float64),
          torch.randn(1, 2, 1, V, dtype=torch.float64)] + [torch.rand(1, 2, 1, dtype=torch.float64) for _ in range(3)]
    xs.append(torch.zeros(1, 1, V, 1, dtype=torch.float64))
    xs = [x.requires_grad_() for x in xs]
    o, S = nam_tape_scan(*xs)
    (o.sum() + S.sum()).backward()
    assert all(torch.isfinite(x.grad).all() for x in xs)
    L = 300_000
    act = torch.softmax(torch.randn(2, 1, 2, 4, dtype=torch.float64), -1).requires_grad_()
    q, k = torch.ones(2, 1, 1, dtype=torch.float64), torch.ones(2, 1, 1, dtype=torch.float64)
    pw, pe = torch.rand(2, 1, dtype=torch.float64), torch.rand(2, 1, dtype=torch.float64)
    h0 = torch.softmax(torch.randn(1, 2, L, dtype=torch.float64), -1).requires_grad_()
    K0 = torch.zeros(1, 1, L, dtype=torch.float64)
    Hs, K = nam_tm_heads(act, q, k, pw, pe, h0, K0, [0, 1, 2, 3], unit_keys=True)
    (Hs.sum() + K.sum()).backward()
    assert torch.isfinite(h0.grad).all()
    print("ok")
""")


@needs_kernels
def test_large_sizes_use_heap_scratch():
    """Scratch rows of hundreds of thousands of numbers (a few MB: more than a thread's stack)."""
    res = subprocess.run([sys.executable, "-c", _LARGE], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, (res.returncode, res.stderr[-2000:])


@needs_kernels
@pytest.mark.parametrize("B,T,H,K,V", [(1, 3, 1, 2, 0), (1, 3, 1, 0, 2), (1, 0, 1, 2, 2), (0, 3, 1, 2, 2)])
def test_tape_zero_sizes(B, T, H, K, V):
    xs = [x.requires_grad_() for x in _tape_inputs(B, T, H, K, V)]
    o, S = nam_tape_scan(*xs)
    assert o.shape == (B, T, H, V) and S.shape == (B, H, V, K)
    assert torch.count_nonzero(o) == 0 and torch.equal(S, xs[-1])
    (o.sum() + S.sum()).backward()


@needs_kernels
@pytest.mark.parametrize("T,N", [(0, 3), (4, 0)])
def test_heads_zero_steps_or_sequences(T, N):
    act, q, k, pw, pe, h0, K0 = _heads_inputs(T, N, 5, 3, 4)
    Hs, K = nam_tm_heads(act, q, k, pw, pe, h0, K0, [0, 1, 2, 3])
    assert Hs.shape == (T + 1, N, 2, 5) and torch.equal(Hs[0], h0) and torch.equal(K, K0)
    Hb, Kb = nam_tm_heads(act.unsqueeze(0), q.unsqueeze(0), k.unsqueeze(0), pw.unsqueeze(0), pe.unsqueeze(0),
                          h0, K0, [0, 1, 2, 3], batch_major=True)
    assert Hb.shape == (1, T + 1, N, 2, 5)


@needs_kernels
def test_heads_refuse_sizes_the_kernel_cannot_take():
    act, q, k, pw, pe, h0, K0 = _heads_inputs(3, 2, 5, 3, 4)
    with pytest.raises(ValueError, match="`h0`"):
        nam_tm_heads(act, q, k, pw, pe, h0[..., :0], K0[..., :0], [0, 1, 2, 3])  # tape length 0
    with pytest.raises(ValueError, match="`key_tape`"):
        nam_tm_heads(act, q[..., :0], k[..., :0], pw, pe, h0, K0[:, :0], [0, 1, 2, 3])  # key width 0
    with pytest.raises(ValueError, match="`order`"):
        nam_tm_heads(act[..., :0], q, k, pw, pe, h0, K0, [])  # no action


# --- fast_expf --------------------------------------------------------------------------------

def _harness(tmp_path: Path, flags) -> ctypes.CDLL:
    src = tmp_path / "harness.c"
    src.write_text('#include "gru.c"\n'
                   "void expf_array(const float *x, float *y, long n) { for (long i = 0; i < n; ++i) "
                   "y[i] = fast_expf(x[i]); }\n"
                   "void tanhf_array(const float *x, float *y, long n) { for (long i = 0; i < n; ++i) "
                   "y[i] = fast_tanhf(x[i]); }\n"
                   "void logf_array(const float *x, float *y, long n) { for (long i = 0; i < n; ++i) "
                   "y[i] = fast_logf(x[i]); }\n")
    out = tmp_path / "harness.so"
    extra = os.environ.get("MEMNETS_NATIVE_CFLAGS", "").split()
    res = subprocess.run([os.environ.get("CC") or "cc", *flags, *extra, f"-I{NATIVE}", "-o", str(out), str(src), "-lm"],
                         capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"these flags do not compile here: {res.stderr[-300:]}")
    return ctypes.CDLL(str(out))


def _call(lib, fn, x):
    y = torch.empty_like(x)
    getattr(lib, fn)(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_long(x.numel()))
    return y


@needs_kernels
@pytest.mark.parametrize("flags", _native._FLAGS, ids=["native", "generic"])
def test_fast_expf_is_as_accurate_as_documented(tmp_path, flags):
    lib = _harness(tmp_path, flags)  # the kernels' own flags, -fassociative-math included
    x = torch.linspace(-87.0, 88.72, 400_001)
    y = _call(lib, "expf_array", x)
    ref = torch.exp(x.double())
    assert ((y.double() - ref) / ref).abs().max() < 2e-7
    edge = torch.tensor([float("nan"), 88.8, 100.0, float("inf"), -87.5, -100.0, -float("inf")])
    got = _call(lib, "expf_array", edge)
    assert torch.isnan(got[0])
    assert torch.isinf(got[1:4]).all() and (got[1:4] > 0).all()
    assert (got[4:] == 0).all()
    t = _call(lib, "tanhf_array", torch.tensor([float("nan"), 30.0, -30.0, 0.0]))
    assert torch.isnan(t[0]) and t[1] == 1 and t[2] == -1 and t[3] == 0


@needs_kernels
@pytest.mark.parametrize("flags", _native._FLAGS, ids=["native", "generic"])
def test_fast_logf_is_as_accurate_as_documented(tmp_path, flags):
    """fastexp.h's fast_logf (the NTM's sharpening): relative error below 3e-7 over the positive
    normal floats, absolute below 1e-7 near 1 (where log crosses 0), and its edge cases."""
    lib = _harness(tmp_path, flags)
    x = torch.logspace(-37.9, 38.5, 1_000_001, dtype=torch.float64).float()
    y, ref = _call(lib, "logf_array", x).double(), torch.log(x.double())
    assert ((y - ref) / ref.abs().clamp_min(1e-30)).abs().max() < 3e-7
    near = torch.linspace(0.5, 2.0, 400_001)
    assert (_call(lib, "logf_array", near).double() - torch.log(near.double())).abs().max() < 1e-7
    edge = _call(lib, "logf_array", torch.tensor([float("nan"), float("inf"), 0.0, -1.0, 1e-40, 1.0, 2.0]))
    assert torch.isnan(edge[0]) and edge[1] == float("inf") and edge[2] == -float("inf") and torch.isnan(edge[3])
    assert edge[4] == -float("inf") and edge[5] == 0 and abs(edge[6].item() - 0.6931472) < 1e-7


# --- the loader's small ones -----------------------------------------------------------------

@needs_kernels
def test_no_hard_links_still_publishes(monkeypatch, tmp_path):
    def no_link(*a, **k):
        raise OSError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "link", no_link)
    monkeypatch.setattr(_native, "_LIBS", {})
    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path / "cache"))
    assert _native.load("gru") is not None


def test_a_grown_pool_shuts_the_old_one_down(monkeypatch):
    monkeypatch.setattr(_native, "_POOL", None)
    _native.parallel(lambda i, a, b: None, [(0, 1), (1, 2)])
    old = _native._POOL
    _native.parallel(lambda i, a, b: None, [(0, 1), (1, 2), (2, 3), (3, 4)])
    assert _native._POOL is not old and old._shutdown
    _native._POOL.shutdown(wait=True)


_ARM = """processor\t: {i}
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x{var}
CPU part\t: 0x{part}
CPU revision\t: 1

"""


def test_cpu_id_on_arm_names_the_processor(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("".join(_ARM.format(i=i, var=3, part="d0c") for i in range(4)))
    b.write_text("".join(_ARM.format(i=i, var=1, part="d40") for i in range(4)))
    ia, ib = _native._cpu_id(str(a)), _native._cpu_id(str(b))
    assert ia and ib and ia != ib
    assert "d0c" in ia and "asimd" in ia
    c = tmp_path / "c"  # more cores of the same processor: the same key
    c.write_text("".join(_ARM.format(i=i, var=3, part="d0c") for i in range(8)))
    assert _native._cpu_id(str(c)) == ia


# --- the cache folder and its libraries ---------------------------------------------------------

_PLANT = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void)
{
    const char *p = getenv("MEMNETS_TEST_MARKER");
    if (p) { FILE *f = fopen(p, "w"); if (f) { fputs("ran", f); fclose(f); } }
}
void gru_fwd_step_f32(void) {}
"""


def _planted_library(tmp_path: Path) -> Path:
    src, out = tmp_path / "plant.c", tmp_path / "plant.so"
    src.write_text(_PLANT)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True)
    return out


def _names(name: str):
    """The file names the loader uses for kernel ``name`` here, one per flag set."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    extra = os.environ.get("MEMNETS_NATIVE_CFLAGS", "").split()
    text = (NATIVE / f"{name}.c").read_bytes() + b"".join(h.read_bytes() for h in sorted(NATIVE.glob("*.h")))
    return [f"{name}-{_native._tag(text, compiler, [*flags, *extra])}.so" for flags in _native._FLAGS]


def _fresh(monkeypatch, tmp_path: Path, cache: Path):
    monkeypatch.setattr(_native, "_LIBS", {})
    monkeypatch.setattr(_native, "_WARNED", set())
    monkeypatch.setenv("MEMNETS_CACHE", str(cache))
    monkeypatch.setattr(_native.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    marker = tmp_path / "marker"
    monkeypatch.setenv("MEMNETS_TEST_MARKER", str(marker))
    return marker


@needs_kernels
@pytest.mark.parametrize("how", ["world-writable", "group-writable", "another owner"])
def test_a_shared_fallback_folder_is_refused(monkeypatch, tmp_path, how):
    blocker = tmp_path / "file"
    blocker.write_text("")
    marker = _fresh(monkeypatch, tmp_path, blocker / "cache")  # the cache folder cannot be made
    folder = tmp_path / "tmp" / f"memnets-native-{os.getuid()}"
    folder.mkdir(parents=True)
    plant = _planted_library(tmp_path)
    for n in _names("gru"):
        shutil.copy(plant, folder / n)
        (folder / (n + ".sha256")).write_text(_native._digest(folder / n))
    if how == "world-writable":
        os.chmod(folder, 0o777)
    elif how == "group-writable":
        os.chmod(folder, 0o770)
    else:
        if os.getuid() != 0:
            pytest.skip("only root can give a folder to another user")
        os.chmod(folder, 0o700)
        os.chown(folder, 12345, 12345)
    with pytest.warns(RuntimeWarning, match="not private"):
        assert _native.load("gru") is None
    assert not marker.exists()
    import memnets.ops.gru as gru  # the PyTorch path runs, with the same numbers
    x = torch.randn(2, 3, 4)
    m = torch.nn.GRU(4, 5, batch_first=True)
    torch.testing.assert_close(gru.gru_module_forward(m, x), m(x)[0])


@needs_kernels
def test_a_private_fallback_folder_is_used(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    _fresh(monkeypatch, tmp_path, blocker / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _native.load("gru") is not None
    folder = tmp_path / "tmp" / f"memnets-native-{os.getuid()}"
    assert (os.stat(folder).st_mode & 0o077) == 0


_LOAD = textwrap.dedent("""
    import sys
    import torch
    from memnets.ops import _native
    from pathlib import Path
    def load():
        _native._LIBS.clear()
        f = _native.functions("gru", torch.zeros(1, dtype=torch.float64), {"gru_fwd_step": [], "gru_bwd_step": []})
        return "loaded" if f is not None else "none"
    lib = Path(sys.argv[1])
    print(load())  # replaced by the parent: rebuilt, never loaded
    print(lib.stat().st_size)
    lib.unlink()
    lib.write_bytes(lib.with_name("good").read_bytes()[: 5000])  # truncated
    print(load())
    print(lib.stat().st_size)
""")


@needs_kernels
@pytest.mark.slow  # three builds and a new process: about 10 s
def test_a_replaced_or_truncated_library_is_rebuilt_not_run(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    marker = _fresh(monkeypatch, tmp_path, cache)
    assert _native.load("gru") is not None
    libs = sorted((cache / "native").glob("gru-*.so"))
    assert libs
    lib = libs[0]
    good = lib.read_bytes()
    (lib.parent / "good").write_bytes(good)
    plant = _planted_library(tmp_path)
    lib.unlink()  # a new file (this process has the old one mapped: writing into it would fault)
    shutil.copy(plant, lib)  # replaced behind the cache's back
    # in a new process (in this one, dlopen hands back the library it has by that name)
    env = dict(os.environ, MEMNETS_CACHE=str(cache), MEMNETS_TEST_MARKER=str(marker))
    res = subprocess.run([sys.executable, "-c", _LOAD, str(lib)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout.split()
    assert out == ["loaded", str(len(good)), "loaded", str(len(good))]  # rebuilt in place, both times
    assert not marker.exists()


@needs_kernels
def test_a_library_without_the_functions_falls_back_with_one_warning(monkeypatch):
    monkeypatch.setattr(_native, "_WARNED", set())
    monkeypatch.setattr(_native, "_LIBS", {"nam_tape": ctypes.CDLL(None), "nam_tm_heads": ctypes.CDLL(None)})
    with pytest.warns(RuntimeWarning, match="no function") as record:
        assert not available(torch.zeros(1, dtype=D64))
        assert not available(torch.zeros(1, dtype=D64))
        xs = _heads_inputs(5, 2, 4, 3, 4)
        Hs, K = nam_tm_heads(*xs, [0, 1, 2, 3])  # the TorchScript loops
    assert len([w for w in record if "nam_tape" in str(w.message)]) == 1
    ref = nam_tm_heads(*xs, [0, 1, 2, 3], compiled=False)
    torch.testing.assert_close(Hs, ref[0])


@needs_kernels
def test_a_library_that_does_not_load_falls_back_with_one_warning(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    _fresh(monkeypatch, tmp_path, tmp_path / "cache")
    folder = tmp_path / "cache" / "native"
    folder.mkdir(parents=True, mode=0o700)
    for n in _names("gru"):
        (folder / n).write_bytes(b"\x7fELF not really")
        (folder / (n + ".sha256")).write_text(_native._digest(folder / n))
    monkeypatch.setattr(_native.tempfile, "gettempdir", lambda: str(blocker))  # no fallback folder either
    with pytest.warns(RuntimeWarning, match="does not load") as record:
        assert _native.load("gru") is None
    assert len(record) == 1


def test_gru_checks_its_arguments():
    from memnets.ops.gru import gru_scan
    T, D, B, h = 3, 1, 2, 4
    gx, w, b, h0 = torch.randn(T, D, B, 3 * h), torch.randn(D, 3 * h, h), torch.randn(D, 3 * h), torch.zeros(D, B, h)
    assert gru_scan(gx, w, b, h0).shape == (T, D, B, h)
    with pytest.raises(ValueError, match="3h"):
        gru_scan(gx[..., :-1], w, b, h0)
    with pytest.raises(ValueError, match="w_hh"):
        gru_scan(gx, w[:, :, :3], b, h0)
    with pytest.raises(ValueError, match="h0"):
        gru_scan(gx, w, b, h0[:, :1])
    with pytest.raises(ValueError, match="w_hh"):
        gru_scan(gx, w.double(), b, h0)


@needs_kernels
def test_tape_refuses_missing_probabilities():
    q, k, v, pw, pe, pr, S0 = _tape_inputs(1, 3, 1, 2, 2)
    for i in (3, 4):  # p_w, p_e: the kernel reads them at every step
        args = [q, k, v, pw, pe, pr, S0]
        args[i] = None
        with pytest.raises(ValueError, match="p_w|p_e"):
            nam_tape_scan(*args)
    o, S = nam_tape_scan(q, k, v, pw, pe, pr, None)  # no initial state: zeros
    o0, S0_ = nam_tape_scan(q, k, v, pw, pe, pr, torch.zeros_like(S0))
    assert torch.equal(o, o0) and torch.equal(S, S0_)


@needs_kernels
@pytest.mark.slow  # four processes build at once: about 15 s
def test_concurrent_builds_into_an_empty_cache(tmp_path):
    code = "from memnets.ops import _native; import sys; sys.exit(0 if _native.load('gru') is not None else 3)"
    env = dict(os.environ, MEMNETS_CACHE=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0, 0]
    libs = list((tmp_path / "cache" / "native").glob("gru-*.so"))
    assert libs and all(_native._verified(p) for p in libs)
    assert not list((tmp_path / "cache" / "native").glob("tmp*"))  # no temporary left behind
