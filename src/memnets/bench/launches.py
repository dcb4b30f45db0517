"""``memnets bench launches``: the kernel launches of one training step, counted without a GPU.

On CUDA a small recurrent model's training step is bound by the number of kernels it launches
(each some 10 µs), not by its arithmetic. This suite runs one training step (forward, backward
of a mean-square loss, ``torch.optim.Adam`` with ``fused=True``, as memnets trains on CUDA) of each recurrent
memory (LSAM uni- and bidirectional, the NAM-TM, the DNC and the NTM) down its CUDA code path on
CPU tensors (inside :func:`memnets.ops.gpu.cuda_path`, ``MEMNETS_NATIVE=0`` so no C kernel runs;
Triton kernels through Triton's interpreter when triton is installed and ``TRITON_INTERPRET=1``,
which the command sets before anything imports triton) and counts:

* **ATen ops**: every op that reaches the dispatcher below autograd (a
  ``TorchDispatchMode``: what the CUDA path would dispatch to a device), less the ops that launch
  no kernel: views and metadata ops (every op whose schema marks its output as an alias of an
  input — ``view``, ``reshape``'s ``_unsafe_view``/``_reshape_alias``, ``as_strided``, ``t``,
  ``transpose``, ``expand``, ``unsqueeze``, ``squeeze``, ``permute``, ``slice``, ``select``,
  ``split``, ``unbind``, ``detach``, ``alias`` …), allocations (``empty``, ``empty_like``,
  ``empty_strided``, ``new_empty``), ``lift_fresh``, ``set_``/``resize_`` and size queries.
  Ops run inside a Triton launch (the interpreter's own tensor handling) are not counted.
* **Triton launches**: each launch of a ``triton.jit`` kernel (``JITFunction.run`` and, under
  the interpreter, ``InterpretedFunction.run``, with ``warmup=False``).

Each count is taken on the second training step (the first one warms up: autotuning, caches,
TorchScript's profiling runs), at ``T`` and at ``T/2``. ``per_t`` is the step's total over
``T``; ``marginal_per_t`` is ``(N(T) - N(T/2)) / (T/2)``, the launches that each further time
step adds (the per-sequence work, e.g. the optimizer's, cancels).

**With graph replay.** On CUDA the per-step loops of LSAM, the DNC and the NTM run through
:func:`memnets.ops.gpu.graphs.graphed`: the first call of a shape runs eagerly, the second
captures the loop into a CUDA graph, and every later call replays it. The counter listens to
those calls (:func:`memnets.ops.gpu.graphs.listening`) and also counts the step as it is issued
from the third call of a shape on: each graphed call is one graph replay plus the copies around
it (the inputs copied into the graph's buffers and the outputs out of them, one multi-tensor copy
per dtype, :func:`memnets.ops.gpu.graphs.copy_groups`) instead of the ATen ops and Triton
launches inside the loop (``graphed_*`` columns). With
``MEMNETS_CUDA_GRAPHS=0`` nothing replays and the two counts are the same.

**At the GPU bench's lengths.** ``per_t_bench`` is the launches per time step at the length the
GPU bench (``make gpu-check``) trains each model at (:data:`BENCH_LENGTHS`). The count is affine
in ``T``, ``N(T) = fixed + marginal_per_t · T``, so ``per_t_bench = fixed / T_bench +
marginal_per_t`` with ``fixed = 2·N(T/2) - N(T)``: the interpreter is slow (on 2 CPU cores,
LSAM's step at T=100 takes some 2 minutes, all five models at their bench lengths about 15), and
``bench_counted=True`` (``--count-bench-lengths``), which counts at ``T_bench`` instead, gave the
same numbers for all five at B=4, T=16.
"""
from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
from typing import Any, Callable

import torch

__all__ = ["run", "count_step", "LaunchCounter", "COLUMNS", "NON_KERNEL_OPS", "BENCH_LENGTHS", "TARGET_PER_T"]

COLUMNS = ["model", "config", "aten_fwd", "aten_bwd", "aten_opt", "aten_step", "triton_step", "launches_step",
           "per_t", "marginal_per_t", "graph_replays", "graph_copies", "graphed_step", "graphed_per_t",
           "graphed_marginal_per_t", "T_bench", "per_t_bench", "graphed_per_t_bench"]

# the sequence length the GPU bench trains each model at (memnets.bench.gpu_check, its models
# section): full widths, and tiny widths (--tiny / --quick)
BENCH_LENGTHS = {"LSAM": 100, "LSAM bi": 100, "NAM-TM": 50, "DNC": 41, "NTM": 41}
TINY_BENCH_LENGTHS = {"LSAM": 6, "LSAM bi": 6, "NAM-TM": 5, "DNC": 6, "NTM": 6}
TARGET_PER_T = 5  # the launches per time step aimed at

# ops that launch no kernel even though their schema does not mark them as views
NON_KERNEL_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
    "lift_fresh", "set_", "resize_", "resize_as_", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "is_same_size", "is_nonzero_", "_has_compatible_shallow_copy_type",
    "detach", "detach_", "alias", "_reshape_alias", "_unsafe_view", "view", "reshape", "as_strided",
    "t", "transpose", "expand", "unsqueeze", "squeeze", "permute", "slice", "select", "unfold",
    "split", "split_with_sizes", "unbind", "chunk", "narrow", "diagonal", "view_as", "expand_as",
    "_conj", "_neg_view", "conj", "resolve_conj", "resolve_neg", "contiguous", "record_stream",
    "_record_function_enter_new", "_record_function_exit",
})


def _is_view(func) -> bool:
    """The op's output aliases an input without writing it (a view; ``OpOverload.is_view``)."""
    try:
        return bool(func.is_view)
    except AttributeError:
        return False


def _op_name(func) -> str:
    name = getattr(func, "__name__", str(func))  # "add.Tensor"
    packet = getattr(func, "_overloadpacket", None)
    return getattr(packet, "__name__", name.split(".")[0]) if packet is not None else name.split(".")[0]


class LaunchCounter:
    """Counts kernel-launching ATen ops and Triton launches while active (a context manager).

    ``phase`` names the bucket the counts go to (``"fwd"``, ``"bwd"``, ``"opt"``); ``aten`` and
    ``triton`` map a phase to a :class:`collections.Counter` of op / kernel names.

    Calls of graphed loops (:func:`memnets.ops.gpu.graphs.graphed`) are counted too, by loop name
    (the key's first item): ``graph_calls`` (calls), ``graph_copies`` (their inputs and outputs:
    the copies a replay makes around the graph), ``graph_aten`` / ``graph_triton`` (what ran
    inside them, also counted in ``aten`` / ``triton``). ``replay``: whether such a call counts
    as a replay in :meth:`graphed_totals` (default: graph replay not switched off,
    :func:`memnets.ops.gpu.graphs.switched_on`).
    """

    def __init__(self, replay: bool | None = None) -> None:
        from ..ops.gpu import graphs

        self.phase = "all"
        self.replay = graphs.switched_on() if replay is None else bool(replay)
        self.aten: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.triton: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.graph_calls: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.graph_copies: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.graph_aten: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.graph_triton: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self._in_triton = 0
        self._loop: str | None = None  # the graphed loop running now
        self._quiet = 0
        self._stack = contextlib.ExitStack()
        self.eager: LaunchCounter | None = None  # count_step(): the step's eager count, where it differs

    # ---- Triton
    def _wrap_run(self, cls, attr: str = "run") -> None:
        real = getattr(cls, attr, None)
        if real is None:
            return
        counter = self

        def run(fn_self, *args, **kwargs):
            if kwargs.get("warmup", False):
                return real(fn_self, *args, **kwargs)
            name = getattr(getattr(fn_self, "fn", None), "__name__", None) or getattr(fn_self, "__name__", "kernel")
            counter.triton[counter.phase][name] += 1
            if counter._loop is not None:
                counter.graph_triton[counter.phase][counter._loop] += 1
            counter._in_triton += 1
            try:
                return real(fn_self, *args, **kwargs)
            finally:
                counter._in_triton -= 1

        setattr(cls, attr, run)
        self._stack.callback(setattr, cls, attr, real)

    def _patch_triton(self) -> None:
        if "triton" not in __import__("sys").modules and importlib.util.find_spec("triton") is None:
            return
        try:
            from triton.runtime.jit import JITFunction
        except Exception:  # noqa: BLE001 - a broken triton: nothing of it can launch
            return
        self._wrap_run(JITFunction)
        try:
            from triton.runtime.interpreter import GridExecutor, InterpretedFunction
        except Exception:  # noqa: BLE001
            return
        if "run" in vars(InterpretedFunction):
            self._wrap_run(InterpretedFunction)
        else:  # triton <= 3.5: kernel[grid] is the executor itself, which a launch calls
            self._wrap_run(GridExecutor, "__call__")

    # ---- ATen
    def _record(self, func) -> None:
        if self._in_triton:
            return
        name = _op_name(func)
        if name in NON_KERNEL_OPS or _is_view(func):
            return
        self.aten[self.phase][name] += 1
        if self._loop is not None:
            self.graph_aten[self.phase][self._loop] += 1

    # ---- graphed loops
    def _graphed_call(self, key, inputs: tuple, call: Callable[[], tuple]) -> tuple:
        """The :func:`memnets.ops.gpu.graphs.listening` listener: what ``call()`` issues is the loop's."""
        if self._loop is not None or self._quiet or not inputs:  # inside another graphed loop, not
            return call()  # counted, or a call that runs eagerly everywhere
        name = str(key[0] if isinstance(key, tuple) and key else key)
        self._loop = name
        try:
            out = call()
        finally:
            self._loop = None
        self.graph_calls[self.phase][name] += 1
        # the copies into the graph's buffers and out of them: one multi-tensor copy per group
        from ..ops.gpu import graphs
        self.graph_copies[self.phase][name] += graphs.copy_groups(inputs) + graphs.copy_groups(out)
        return out

    # ---- cuDNN's RNNs
    def _patch_rnns(self) -> None:
        """On CPU tensors ``nn.GRU`` / ``nn.LSTM`` decompose into a few ops per time step; on
        CUDA each is one cuDNN call forward (``_cudnn_rnn``) and one backward. While counting CPU
        tensors, each call runs as one counted op each way (its inner ops not counted)."""
        counter = self
        for cls in (torch.nn.GRU, torch.nn.LSTM):
            real = cls.forward

            def forward(mod, input, hx=None, _real=real):
                if input.is_cuda:
                    return _real(mod, input, hx)
                return _as_one_kernel(counter, mod, _real, input, hx)

            cls.forward = forward
            self._stack.callback(setattr, cls, "forward", real)

    def __enter__(self) -> "LaunchCounter":
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not counter._quiet:
                    counter._record(func)
                return func(*args, **(kwargs or {}))

        from ..ops.gpu import graphs

        self._quiet = 0
        self._patch_triton()
        self._patch_rnns()
        self._stack.enter_context(graphs.listening(self._graphed_call))
        self._stack.enter_context(_Mode())
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def eager_totals(self, phase: str | None = None) -> tuple[int, int]:
        """:meth:`totals` of the step without graph replay: this count's, or, where a module
        graphed whole changed the step's path (:func:`count_step`), that of the step counted
        without it."""
        return (self.eager or self).totals(phase)

    def totals(self, phase: str | None = None) -> tuple[int, int]:
        """``(aten ops, triton launches)`` in ``phase`` (all phases for ``None``)."""
        phases = [phase] if phase is not None else set(self.aten) | set(self.triton)
        return (sum(sum(self.aten[p].values()) for p in phases), sum(sum(self.triton[p].values()) for p in phases))

    def graphed_totals(self, phase: str | None = None) -> tuple[int, int, int]:
        """``(launches, replays, copies)`` in ``phase`` (all phases for ``None``) as issued with graph
        replay: each call of a graphed loop is one replay and ``copies`` copies (its inputs into the
        graph's buffers, its outputs out of them) instead of the launches inside it. Without
        ``replay``, the launches of :meth:`totals` and no replay."""
        a, t = self.totals(phase)
        if not self.replay:
            return a + t, 0, 0
        phases = [phase] if phase is not None else (set(self.aten) | set(self.triton) | set(self.graph_calls))

        def total(d):
            return sum(sum(d[p].values()) for p in phases)

        replays, copies = total(self.graph_calls), total(self.graph_copies)
        return a + t - total(self.graph_aten) - total(self.graph_triton) + replays + copies, replays, copies


class _OneKernel(torch.autograd.Function):
    """Runs an RNN module's forward with the counter quiet and counts it as one op; its backward
    likewise (the inner graph differentiated with the counter quiet)."""

    @staticmethod
    def forward(ctx, counter, mod, real, hx, input, *params):
        names = [n for n, _ in mod.named_parameters()]
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in (input, *params)]
        counter._quiet += 1
        try:
            from torch.nn.utils.stateless import _reparametrize_module

            with torch.enable_grad(), _reparametrize_module(mod, dict(zip(names, leaves[1:]))):
                out, h = real(mod, leaves[0], hx)  # the module's own forward, not the patched one
        finally:
            counter._quiet -= 1
        counter.aten[counter.phase]["_cudnn_rnn (stand-in)"] += 1
        ctx.counter, ctx.leaves, ctx.outs = counter, leaves, (out, *(h if isinstance(h, tuple) else (h,)))
        ctx.lstm = isinstance(h, tuple)
        return (out.detach(), *(t.detach() for t in ctx.outs[1:]))

    @staticmethod
    def backward(ctx, *grads):
        need = [t for t in ctx.leaves if t.requires_grad]
        pairs = [(o, g) for o, g in zip(ctx.outs, grads) if g is not None and o.requires_grad]
        ctx.counter._quiet += 1
        try:
            got = iter(torch.autograd.grad([o for o, _ in pairs], need, [g for _, g in pairs], allow_unused=True)
                       if pairs else [None] * len(need))
        finally:
            ctx.counter._quiet -= 1
        ctx.counter.aten[ctx.counter.phase]["_cudnn_rnn_backward (stand-in)"] += 1
        return (None, None, None, None, *[next(got) if t.requires_grad else None for t in ctx.leaves])


def _as_one_kernel(counter: "LaunchCounter", mod, real, input, hx):
    outs = _OneKernel.apply(counter, mod, real, hx, input, *mod.parameters())
    return outs[0], (tuple(outs[1:]) if len(outs) == 3 else outs[1])


def _cuda_code_path(device: torch.device):
    """CPU tensors down the CUDA path: ``cuda_path()`` with the C kernels off; nothing on CUDA."""
    from ..ops.gpu import cuda_code_path

    return cuda_code_path(device)


def count_step(model: torch.nn.Module, x: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor],
               device: torch.device | str = "cpu", replay: bool | None = None) -> LaunchCounter:
    """Count the second of two training steps of ``model`` on ``x`` (``run(x)`` gives the output):
    forward, backward of ``output.pow(2).mean()``, Adam (``fused=True``), on the CUDA code path.
    ``replay``: :class:`LaunchCounter`'s (graphed loops counted as replays in ``graphed_totals``)."""
    device = torch.device(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)  # as make_optimizer on CUDA
    counter = LaunchCounter(replay)

    def step(c: LaunchCounter | None) -> None:
        opt.zero_grad(set_to_none=True)
        if c is not None:
            c.phase = "fwd"
        loss = run(x).float().pow(2).mean()
        if c is not None:
            c.phase = "bwd"
        loss.backward()
        if c is not None:
            c.phase = "opt"
        opt.step()

    from ..ops.gpu import env_var, graphs

    def count(c: LaunchCounter, whole: bool) -> None:
        # whole: a module graphed whole on CUDA (graphs.whole_module) takes that path here too
        with _cuda_code_path(device), graphs.counting() if whole else contextlib.nullcontext():
            step(None)  # warm-up: autotuning, caches, TorchScript's profiling runs, Adam's state
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            with c:
                step(c)

    modules = graphs.stats().get("modules", 0)
    count(counter, counter.replay)
    if counter.replay and graphs.stats().get("modules", 0) > modules:
        # the model has a module graphed whole, whose backward recomputes its forward inside the
        # graph: its eager launches are those of the step without that (the module's own path)
        counter.eager = LaunchCounter(replay=False)
        with env_var("MEMNETS_MODULE_GRAPHS", "0"):
            count(counter.eager, False)
    return counter


def _models(tiny: bool) -> list[tuple[str, str, Callable[[], torch.nn.Module], int]]:
    """``(name, config, build, input size)`` of each recurrent memory, at the CPU benchmark's
    widths (``tiny``: small widths; the counts hardly depend on the width)."""
    from ..memories.dnc import DNC
    from ..memories.lsam import LSAM
    from ..memories.nam_tm import NAMTuringMachine
    from ..memories.ntm import NTM

    if tiny:
        D, H, Fi, Dt, Tn, L, Hc, N, W, R = 16, 2, 8, 16, 2, 8, 16, 8, 8, 2
    else:
        D, H, Fi, Dt, Tn, L, Hc, N, W, R = 256, 8, 64, 128, 4, 32, 64, 16, 20, 4
    return [
        ("LSAM", f"hidden={D} heads={H}", lambda: LSAM(D, D, H), D),
        ("LSAM bi", f"hidden={D} heads={H} bi", lambda: LSAM(D, D, H, bidirectional=True), D),
        ("NAM-TM", f"in={Fi} hidden={Dt} tapes={Tn} L={L}",
         lambda: NAMTuringMachine(Fi, Dt, num_tapes=Tn, tape_length=L), Fi),
        ("DNC", f"LSTM {Hc}, memory {N}x{W}, {R} reads",
         lambda: DNC(9, 8, memory_slots=N, word_size=W, read_heads=R, controller_size=Hc), 9),
        ("NTM", f"LSTM {Hc}, memory {N}x{W}, 1 read 1 write",
         lambda: NTM(9, 8, memory_slots=N, word_size=W, read_heads=1, write_heads=1, controller_size=Hc), 9),
    ]


def _count(build, Fi: int, B: int, T: int, device: torch.device, replay: bool) -> LaunchCounter:
    torch.manual_seed(0)
    model = build().to(device)
    x = torch.randn(B, T, Fi, device=device)
    if device.type != "cuda":
        return count_step(model, x, lambda x: model(x)[0], device, replay)
    from ..ops.gpu import env_var

    with env_var("MEMNETS_CUDA_GRAPHS", "0"):  # every launch issued from Python, so every one is seen
        return count_step(model, x, lambda x: model(x)[0], device, replay)


def _verdict(row: dict) -> str:
    if row["per_t_bench"] <= TARGET_PER_T:
        return "meets"
    return "meets with graph replay" if row["graphed_per_t_bench"] <= TARGET_PER_T else "misses"


def run(quick: bool = False, *, batch: int = 4, length: int = 16, models: tuple[str, ...] | None = None,
        device: str | torch.device = "cpu", tiny: bool = False, verbose: bool = False,
        bench_counted: bool = False) -> dict[str, Any]:
    """Count the launches of one training step of each recurrent memory (a bench result dict).

    ``batch`` and ``length`` are B and T (T even: the marginal count also runs T/2); ``models``
    picks rows by name (default: all); ``device``: ``cpu`` (CPU tensors down the CUDA code path)
    or ``cuda`` (the real thing, for comparison on a GPU: the loops are launched one by one,
    ``MEMNETS_CUDA_GRAPHS=0``, so that every launch is seen); ``quick``/``tiny``: small widths.
    ``bench_counted``: count each model once more at its GPU bench length (:data:`BENCH_LENGTHS`)
    for ``per_t_bench`` instead of computing it from the counts at T and T/2 (module docstring).
    Graphed loops count as replays in the ``graphed_*`` columns unless ``MEMNETS_CUDA_GRAPHS=0``.
    """
    from ..ops.gpu import graphs, interpreting, triton_ok

    if length < 2 or length % 2:
        raise ValueError(f"`length` must be an even number >= 2 (the marginal count runs length/2), got {length}")
    if batch < 1:
        raise ValueError(f"`batch` must be >= 1, got {batch}")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("CUDA is not available on this machine (count the CUDA code path with device='cpu')")
    table = _models(tiny or quick)
    if models is not None:
        known = [m[0] for m in table]
        bad = [m for m in models if m not in known]
        if bad:
            raise ValueError(f"unknown model(s) {bad}; expected among {known}")
        table = [m for m in table if m[0] in models]
    replay = graphs.switched_on()
    lengths = TINY_BENCH_LENGTHS if (tiny or quick) else BENCH_LENGTHS
    half_t = length // 2

    def per(n: float, t: int) -> float:
        return round(n / t, 2)

    rows = []
    for name, cfg, build, Fi in table:
        full = _count(build, Fi, batch, length, device, replay)
        half = _count(build, Fi, batch, half_t, device, replay)
        a_step, t_step = full.eager_totals()
        a_half, t_half = half.eager_totals()
        n_full, n_half = a_step + t_step, a_half + t_half
        g_full, replays, copies = full.graphed_totals()
        g_half = half.graphed_totals()[0]
        # N(T) = fixed + marginal · T through T/2 and T: fixed = 2 N(T/2) - N(T)
        fixed, g_fixed = 2 * n_half - n_full, 2 * g_half - g_full
        marginal, g_marginal = (n_full - n_half) / half_t, (g_full - g_half) / half_t
        tb = lengths[name]
        bench = {"T": tb, "from": "fixed/T + marginal", "launches_step": round(fixed + marginal * tb, 2),
                 "graphed_step": round(g_fixed + g_marginal * tb, 2)}
        if bench_counted:
            at = _count(build, Fi, batch, tb, device, replay)
            bench.update({"from": "counted", "launches_from_fixed": bench["launches_step"],
                          "graphed_from_fixed": bench["graphed_step"], "launches_step": sum(at.eager_totals()),
                          "graphed_step": at.graphed_totals()[0]})
        row = {"model": name, "config": f"B={batch} T={length} {cfg}",
               "aten_fwd": full.eager_totals("fwd")[0], "aten_bwd": full.eager_totals("bwd")[0],
               "aten_opt": full.eager_totals("opt")[0], "aten_step": a_step, "triton_step": t_step,
               "launches_step": n_full,
               "per_t": per(n_full, length),
               "marginal_per_t": round(marginal, 2),
               "graph_replays": replays, "graph_copies": copies, "graphed_step": g_full,
               "graphed_per_t": per(g_full, length), "graphed_marginal_per_t": round(g_marginal, 2),
               "T_bench": tb, "per_t_bench": per(bench["launches_step"], tb),
               "graphed_per_t_bench": per(bench["graphed_step"], tb),
               "fixed_step": fixed, "graphed_fixed_step": g_fixed, "bench": bench,
               "aten_per_t": round(a_step / length, 2),
               "aten_marginal_per_t": round((a_step - a_half) / half_t, 2),
               "triton_per_t": round(t_step / length, 2),
               "triton_marginal_per_t": round((t_step - t_half) / half_t, 2),
               "half": {"T": half_t, "aten_step": a_half, "triton_step": t_half, "graphed_step": g_half},
               "graphed_loops": {k: {"calls": v, "copies": sum(c[k] for c in full.graph_copies.values()),
                                     "launches_inside": sum(c[k] for c in full.graph_aten.values())
                                     + sum(c[k] for c in full.graph_triton.values())}
                                 for k, v in sum(full.graph_calls.values(), collections.Counter()).items()},
               "top_aten_ops": dict(sum(full.aten.values(), collections.Counter()).most_common(12)),
               "triton_kernels": dict(sum(full.triton.values(), collections.Counter()))}
        rows.append(row)
        if verbose:
            print(f"[launches] {name:8s} {row['launches_step']:6d} per step, {row['per_t']:7.2f} per time step; "
                  f"with graph replay {row['graphed_step']:6d}, {row['graphed_per_t']:7.2f}; at T={tb}: "
                  f"{row['per_t_bench']:.2f} and {row['graphed_per_t_bench']:.2f} per time step", flush=True)
    tri = triton_ok() and interpreting() if device.type == "cpu" else triton_ok()
    bench_how = ("counted at T_bench" if bench_counted else
                 "fixed / T_bench + marginal_per_t, fixed = 2·N(T/2) - N(T) (the count is affine in T)")
    notes = [
        f"one training step (forward, backward, Adam fused) at B={batch}, T={length}, "
        + ("CPU tensors down the CUDA code path (cuda_path, MEMNETS_NATIVE=0)" if device.type == "cpu"
           else f"on {device}, the loops launched one by one (MEMNETS_CUDA_GRAPHS=0)"),
        "aten_*: ATen ops that launch a kernel (views, metadata ops and allocations excluded); "
        "triton_step: Triton kernel launches; launches_step = aten_step + triton_step"
        + ("; nn.GRU / nn.LSTM (the NAM-TM's controller) count one op each way, as cuDNN's call on CUDA"
           if device.type == "cpu" else ""),
        "per_t = launches_step / T; marginal_per_t = (launches at T - launches at T/2) / (T/2)",
        ("graphed_*: the step as CUDA issues it with graph replay, from the third call of a shape on (the "
         "first call runs eagerly, the second captures): each call of a graphed function (LSAM's, the DNC's "
         "and the NTM's time loops, the NAM-TM layer's tape machinery; forward and backward) is 1 replay "
         "(graph_replays) and its copies in and out, "
         "one multi-tensor copy per dtype each way (graph_copies), instead of the ATen ops and Triton "
         "launches inside it"
         if replay else "graphed_*: the same as the eager columns: graph replay is switched off "
                        "(MEMNETS_CUDA_GRAPHS=0)"),
        f"T_bench: the length the GPU bench (make gpu-check) trains each model at; per_t_bench and "
        f"graphed_per_t_bench: launches per time step at T_bench, {bench_how}",
        f"target: at most {TARGET_PER_T} launches per time step at T_bench: "
        + "; ".join(f"{r['model']} (T={r['T_bench']}) {r['per_t_bench']:.2f} eager, {r['graphed_per_t_bench']:.2f} "
                    f"with graph replay ({_verdict(r)})" for r in rows),
        "Triton kernels: " + ("run (through the interpreter)" if tri and device.type == "cpu" else
                              "run" if tri else "not run (triton missing, MEMNETS_TRITON=0 or TRITON_INTERPRET unset)"),
    ]
    return {"suite": "launches", "title": "Kernel launches of one training step (CUDA code path)",
            "columns": COLUMNS, "rows": rows, "notes": notes, "batch": batch, "length": length,
            "device": str(device), "triton_interpret": os.environ.get("TRITON_INTERPRET"),
            "memnets_triton": os.environ.get("MEMNETS_TRITON"), "triton_used": bool(tri),
            "graph_replay": replay, "bench_lengths": {r["model"]: r["T_bench"] for r in rows}}
