"""The recurrent memories' Triton loops replayed from CUDA graphs (memnets.ops.gpu.graphs) give
what the same loops give launched one by one: outputs and every gradient, over several calls
with new inputs (the first call runs eagerly, the second captures, the rest replay). On a GPU
the real capture; elsewhere Triton's interpreter with the graphs' eager stand-in."""
from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import triton_marks

CUDA = torch.cuda.is_available()
pytestmark = triton_marks()

from memnets.memories.dnc import DNC  # noqa: E402
from memnets.memories.lsam import LSAM  # noqa: E402
from memnets.memories.ntm import NTM  # noqa: E402
from memnets.memories.nam_tm import NAMTuringMachine  # noqa: E402
from memnets.ops.gpu import cuda_code_path, env_var, graphs, use_triton  # noqa: E402

DEV = torch.device("cuda" if CUDA else "cpu")
BUILD = {
    "lsam": (lambda: LSAM(8, 8, 2), 8),
    "lsam-bi": (lambda: LSAM(8, 8, 2, bidirectional=True), 8),
    "dnc": (lambda: DNC(5, 4, memory_slots=6, word_size=4, read_heads=2, controller_size=8), 5),
    "ntm": (lambda: NTM(5, 4, memory_slots=6, word_size=4, read_heads=1, write_heads=1, controller_size=8), 5),
}


def _runs(model, xs, graphs_on: bool):
    """Forward and backward of ``model`` on each input: outputs and every gradient."""
    results = []
    stand_in = graphs.stand_in() if not CUDA else contextlib.nullcontext()
    with cuda_code_path(DEV), stand_in, env_var("MEMNETS_CUDA_GRAPHS", "1" if graphs_on else "0"):
        for x in xs:
            assert use_triton(x)
            x = x.clone().requires_grad_()
            model.zero_grad(set_to_none=True)
            y = model(x)[0]
            (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype, device=y.device).view_as(y)).sum().backward()
            results.append([y.detach().clone(), x.grad.clone()]
                           + [p.grad.clone() for p in model.parameters() if p.grad is not None])
    return results


@pytest.mark.parametrize("name", list(BUILD))
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_graph_replay_matches_launch_by_launch(name, dtype, tol):
    build, fi = BUILD[name]
    torch.manual_seed(0)
    model = build().to(DEV, dtype)
    xs = [torch.randn(2, 5, fi, device=DEV, dtype=dtype) for _ in range(4)]
    graphs.clear()
    eager = _runs(model, xs, graphs_on=False)
    before = graphs.stats().get("replays", 0)
    replayed = _runs(model, xs, graphs_on=True)
    # forward and backward: each captured on its second call and replayed on the third and fourth
    assert graphs.stats().get("replays", 0) - before >= 2 * 3
    for i, (a, b) in enumerate(zip(replayed, eager)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            torch.testing.assert_close(u, v, atol=tol, rtol=tol, msg=lambda m: f"call {i}: {m}")
    graphs.clear()


@pytest.mark.parametrize("name", list(BUILD))
def test_triton_loops_under_bf16_autocast(name):
    """Under bf16 autocast the loops run (in float32 inside) and replay as they launch: finite
    gradients, and the replayed calls equal the launched ones."""
    build, fi = BUILD[name]
    torch.manual_seed(0)
    model = build().to(DEV)
    xs = [torch.randn(2, 5, fi, device=DEV) for _ in range(3)]
    kind = "cuda" if CUDA else "cpu"
    with torch.autocast(kind, dtype=torch.bfloat16):
        graphs.clear()
        eager = _runs(model, xs, graphs_on=False)
        replayed = _runs(model, xs, graphs_on=True)
    graphs.clear()
    for a, b in zip(replayed, eager):
        for u, v in zip(a, b):
            assert torch.isfinite(u).all()
            torch.testing.assert_close(u, v)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_dnc_graphed_whole_matches_launch_by_launch(dtype, tol):
    """The DNC graphed whole (``MEMNETS_MODULE_GRAPHS=1``: input projection, the recurrence and
    the readout as one graph, the backward recomputing it as another; off by default), from a
    given state that takes gradients too: outputs, final state and every gradient equal to the
    loops launched one by one, call after call."""
    build, fi = BUILD["dnc"]
    torch.manual_seed(0)
    model = build().to(DEV, dtype)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 5, fi, generator=g, dtype=dtype).to(DEV) for _ in range(4)]

    def runs(graphs_on):
        out = []
        stand_in = graphs.stand_in() if not CUDA else contextlib.nullcontext()
        with cuda_code_path(DEV), stand_in, env_var("MEMNETS_CUDA_GRAPHS", "1" if graphs_on else "0"), \
                env_var("MEMNETS_MODULE_GRAPHS", "1"):
            for i, x in enumerate(xs):
                start = model.init_state(2, DEV, dtype)
                leaves, spec = torch.utils._pytree.tree_flatten(start)
                leaves = [(t + 0.1 * (i + 1) * t.abs().mean()).detach().requires_grad_() for t in leaves]
                x = x.clone().requires_grad_()
                model.zero_grad(set_to_none=True)
                y, st = model(x, torch.utils._pytree.tree_unflatten(leaves, spec))
                fin = torch.utils._pytree.tree_flatten(st)[0]
                loss = (y * torch.linspace(-1, 1, y.numel(), dtype=dtype, device=DEV).view_as(y)).sum() \
                    + sum(t.sin().sum() for t in fin)
                grads = torch.autograd.grad(loss, [x, *leaves, *model.parameters()])
                out.append([y.detach(), *(t.detach() for t in fin), *grads])
        return out

    graphs.clear()
    eager = runs(False)
    before = graphs.stats()
    whole = runs(True)
    after = graphs.stats()
    assert after["modules"] - before.get("modules", 0) == len(xs)
    assert not any(str(k[0][0]).startswith("dnc.forward") for k in graphs._CACHE)  # only the whole module's
    for i, (a, b) in enumerate(zip(whole, eager)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            torch.testing.assert_close(u, v, atol=tol, rtol=tol, msg=lambda m: f"call {i}: {m}")
    graphs.clear()


@pytest.mark.parametrize("name", ["nam_tm", "dnc"])
def test_modules_graphed_whole_under_bf16_autocast(name):
    """Under bf16 autocast a module graphed whole (the NAM-TM and the DNC, by default and with
    ``MEMNETS_MODULE_GRAPHS=1``; the backward recomputes in the forward's autocast state) gives,
    call after call, the gradients of its own path, finite."""
    from memnets.memories.nam_tm import NAMTuringMachine
    torch.manual_seed(0)
    if name == "nam_tm":
        model, fi = NAMTuringMachine(8, 16, num_tapes=2, tape_length=8, normalize_heads=True).to(DEV), 8
    else:
        build, fi = BUILD["dnc"]
        model = build().to(DEV)
    xs = [torch.randn(4, 6, fi, device=DEV) for _ in range(3)]
    kind = "cuda" if CUDA else "cpu"
    grads = {}
    for flag in ("0", "1"):
        graphs.clear()
        stand_in = graphs.stand_in() if not CUDA else contextlib.nullcontext()
        with env_var("MEMNETS_MODULE_GRAPHS", flag), cuda_code_path(DEV), stand_in:
            before = graphs.stats().get("modules", 0)
            grads[flag] = []
            for x in xs:
                with torch.autocast(kind, dtype=torch.bfloat16):
                    y = model(x)[0]
                grads[flag].append(torch.autograd.grad(y.float().square().mean(), list(model.parameters())))
            assert (graphs.stats().get("modules", 0) > before) == (flag == "1")
    graphs.clear()
    for a, b in zip(grads["1"], grads["0"]):
        for u, v in zip(a, b):
            assert torch.isfinite(u).all()
            torch.testing.assert_close(u, v)


PACKED = {**BUILD, "nam-tm": (lambda: NAMTuringMachine(5, 8, num_tapes=2, tape_length=5), 5)}


@pytest.mark.parametrize("name", list(PACKED))
def test_packed_batches_down_the_cuda_path(name):
    """A ``PackedSequence`` through the Triton loops (graph replay and whole-module graphs on)
    equals each sequence run alone down the same path: outputs, final states and the input's
    gradient; no module is graphed whole for the stretches of a packed batch."""
    from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence
    build, fi = PACKED[name]
    torch.manual_seed(0)
    model = build().to(DEV, torch.float64)
    lengths = [4, 2, 5, 2]
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randn(L, fi, generator=g, dtype=torch.float64).to(DEV).requires_grad_() for L in lengths]
    graphs.clear()
    stand_in = graphs.stand_in() if not CUDA else contextlib.nullcontext()
    with cuda_code_path(DEV), stand_in, env_var("MEMNETS_MODULE_GRAPHS", "1"):
        before = graphs.stats().get("modules", 0)
        y, state = model(pack_sequence(seqs, enforce_sorted=False))
        assert graphs.stats().get("modules", 0) == before
        out, _ = pad_packed_sequence(y, batch_first=True)
        grads = torch.autograd.grad(out.square().sum(), seqs)
        dim = 1 if name.startswith(("lsam", "nam-tm")) else 0
        for b, (x, L) in enumerate(zip(seqs, lengths)):
            y_b, s_b = model(x[None])
            torch.testing.assert_close(out[b, :L], y_b[0], atol=1e-10, rtol=1e-10)
            for u, v in zip(torch.utils._pytree.tree_flatten(state)[0], torch.utils._pytree.tree_flatten(s_b)[0]):
                torch.testing.assert_close(u.narrow(dim, b, 1), v, atol=1e-10, rtol=1e-10)
            g_b, = torch.autograd.grad(y_b.square().sum(), x)
            torch.testing.assert_close(grads[b], g_b, atol=1e-10, rtol=1e-10)
    graphs.clear()
