"""CUDA-graph replay of the recurrent kernels' time loops.

A time loop on the GPU launches a few kernels per step (a cuBLAS matmul and a Triton program),
and each launch from Python costs some microseconds of CPU time: at the bench's sizes the GPU
waits on Python. :func:`graphed` runs such a loop once eagerly and, the second time it meets the
same shapes, captures it into a ``torch.cuda.CUDAGraph``; from then on a call copies its inputs
into the graph's own buffers, replays every launch of the loop with one call, and returns
copies of the graph's outputs (so nothing a caller holds is overwritten by the next replay).
The copies in and out go as one ``torch._foreach_copy_`` per group of like tensors (dtype,
device, layout; :func:`copy_all`): a few launches per call, not one per tensor.

The loop is a function of its tensor arguments only (``fn(*inputs) -> tuple of tensors``): it
allocates its outputs, launches kernels and never reads a value back to the CPU. Its Python
constants (sizes, block shapes) are part of the cache key the caller passes. A graph replays on
the current stream, on the inputs' device; the key also holds the autocast state. At most
:data:`MAX_GRAPHS` graphs are kept (least recently used first out); a key pushed out runs
eagerly from then on, so shapes that keep changing cost one capture each, not one per return;
``MEMNETS_CUDA_GRAPHS=0`` turns replay off. A capture that fails warns once and leaves that key
eager. Inside the capture of a larger graph (a whole training step,
:class:`memnets.train.graph_step.CUDAGraphStep`) a loop launches its kernels plainly, into that graph.

On the CPU (tests) :func:`stand_in` swaps the CUDA graph for an eager stand-in with the same
contract — static input buffers, outputs written into the same static buffers on every replay —
so the buffer handling is tested without a GPU; the capture itself needs one.

:func:`listening` registers a listener that every :func:`graphed` call goes through (whether the
loop then runs eagerly, is captured or replays): ``memnets bench launches`` uses it to tell the
launches of a graphed loop from the rest, and counts such a loop as the one replay it is on CUDA.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
import warnings
import weakref
from typing import Callable, Hashable, Sequence

import torch
from torch.autograd.function import once_differentiable

__all__ = ["graphed", "graphed_autograd", "whole_module", "enabled", "switched_on", "stand_in", "standing_in", "listening", "clear", "MAX_GRAPHS", "stats",
           "copy_all", "copy_groups", "counting", "modules_off", "fresh_copies", "fresh_zeros", "zeros_for_none", "side_stream",
           "rng_restored_on_failure"]

MAX_GRAPHS = 16
_CACHE: "collections.OrderedDict[Hashable, _Entry]" = collections.OrderedDict()
_SEEN: "collections.Counter[Hashable]" = collections.Counter()
_FAILED: set = set()
_EVICTED: set = set()  # keys pushed out of the cache: eager from then on (no capture churn)
_STAND_IN = [0]
_STATS = collections.Counter()
_LISTENERS: list = []  # listening(): called around every graphed() call
_LOCK = threading.Lock()  # the cache's bookkeeping (replicas of nn.DataParallel call from threads)
# graphed functions running now (their first eager call, a warm-up, a capture or a stand-in's
# replay), in any thread: a graphed call inside one runs plainly, as part of the outer function.
# Process-wide, not per thread: autograd runs a CUDA backward on a worker thread of its own.
_BODIES = [0]
_COUNTING = [0]  # counting(): whole_module() as on CUDA
_MODULES_OFF = [0]  # modules_off()
_MODULES_LOST: set = set()  # keys of modules graphed whole whose graph failed or was evicted
_UNUSED: dict = {}  # graphed_autograd: per backward key, the gradients that are None (zeros in the graph)


def switched_on() -> bool:
    """Graph replay is not switched off: ``MEMNETS_CUDA_GRAPHS`` is not ``0`` and ``torch.compile``
    is not tracing (loops on CUDA tensors then replay, :func:`enabled`)."""
    return os.environ.get("MEMNETS_CUDA_GRAPHS", "1") != "0" and not torch.compiler.is_compiling()


def enabled(x: torch.Tensor) -> bool:
    """Whether loops on tensors like ``x`` replay from graphs: CUDA tensors (or CPU ones inside
    :func:`stand_in`), ``MEMNETS_CUDA_GRAPHS`` not ``0``, and not while ``torch.compile`` traces."""
    if not switched_on():
        return False
    return (x.is_cuda and torch.cuda.is_available()) or (_STAND_IN[0] > 0 and not x.is_cuda)


@contextlib.contextmanager
def listening(listener: Callable[[Hashable, tuple, Callable[[], tuple]], tuple]):
    """While active, every :func:`graphed` call goes through ``listener(key, inputs, call)``:
    ``call()`` runs the loop as :func:`graphed` would (eagerly, captured or replayed) and returns
    its outputs, which the listener returns. So what a loop issues is known to be the loop's
    (``memnets bench launches``). Without a listener :func:`graphed` costs one list check more."""
    with _LOCK:
        _LISTENERS.append(listener)
    try:
        yield listener
    finally:
        with _LOCK:
            _LISTENERS.remove(listener)


def standing_in() -> bool:
    """Inside :func:`stand_in`."""
    return _STAND_IN[0] > 0


@contextlib.contextmanager
def stand_in():
    """CPU tensors take the graph path with an eager stand-in for the capture (tests); also
    the whole-step graphs of :class:`memnets.train.graph_step.CUDAGraphStep`."""
    _STAND_IN[0] += 1
    try:
        yield
    finally:
        _STAND_IN[0] -= 1


_SIDE: dict = {}  # side_stream(): one per device


def side_stream(device: torch.device | int | str | None = None) -> "torch.cuda.Stream":
    """The one side stream of ``device`` (default: the current CUDA device) on which warm-ups
    before a capture run, made at the first call and kept.

    A new ``torch.cuda.Stream()`` per warm-up (PyTorch hands out up to 32 streams per device in
    turn) left memory behind on each stream it came to: PyTorch gives every stream a matmul
    runs on a cuBLAS (and cuBLASLt) workspace of its own, kept for the process, and the caching
    allocator keeps freed blocks for the stream they were allocated on. On an H200 six input
    shapes of one size reserved 388 MB more than the first one (tests/test_graph_step.py, the
    shared-pool test), about what two workspaces per new stream take on that card."""
    index = torch.device("cuda" if device is None else device).index
    index = torch.cuda.current_device() if index is None else index
    with _LOCK:
        if index not in _SIDE:
            _SIDE[index] = torch.cuda.Stream(torch.device("cuda", index))
        return _SIDE[index]


def clear() -> None:
    """Drop every kept graph and what was seen (frees their buffers)."""
    _CACHE.clear()
    _SEEN.clear()
    _FAILED.clear()
    _EVICTED.clear()
    _MODULES_LOST.clear()
    _UNUSED.clear()


def stats() -> dict:
    """Counts since the start: ``captures``, ``replays``, ``eager`` calls, ``evictions``, ``failures``,
    ``inside_capture`` (calls inside another graph's capture), ``modules`` (calls of
    :func:`graphed_autograd`)."""
    return dict(_STATS)


def _groups(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> list[tuple[list, list]]:
    """``(dsts, srcs)`` pairs grouped so that each group can be one multi-tensor copy: same
    dtypes, device, shape and strides on both sides within a pair (PyTorch's fast path for
    ``_foreach_copy_``), one group per dtype and device; a pair that is not like that is a
    group of its own (an ordinary ``copy_``)."""
    groups: dict = {}
    alone = []
    for d, s in zip(dsts, srcs):
        if d.dtype == s.dtype and d.device == s.device and d.shape == s.shape and d.stride() == s.stride() \
                and d.is_contiguous() and d.numel() > 0:
            key = (d.dtype, d.device)
            if key not in groups:  # not setdefault: torch 2.4's compile breaks the graph on it
                groups[key] = ([], [])
            groups[key][0].append(d)
            groups[key][1].append(s)
        else:
            alone.append(([d], [s]))
    return list(groups.values()) + alone


def _index_groups(tensors: Sequence[torch.Tensor]) -> list[list[int]]:
    """The indices of ``tensors`` grouped as :func:`copy_all` groups them against contiguous
    buffers of their shapes: one group per dtype and device of the contiguous non-empty ones,
    one for each other tensor. It depends only on what a graph's key holds (shapes, dtypes,
    devices, contiguity), so a graph works it out once."""
    groups: dict = {}
    alone = []
    for i, t in enumerate(tensors):
        if t.is_contiguous() and t.numel() > 0:
            key = (t.dtype, t.device)
            if key not in groups:  # not setdefault: torch 2.4's compile breaks the graph on it
                groups[key] = []
            groups[key].append(i)
        else:
            alone.append([i])
    return list(groups.values()) + alone


def copy_groups(tensors: Sequence[torch.Tensor]) -> int:
    """How many copy calls :func:`copy_all` makes to copy ``tensors`` into contiguous buffers of
    their shapes, or such buffers into fresh tensors like them, as a replay does (the launches it
    costs on CUDA, where one multi-tensor copy of up to some tens of tensors is one kernel): one
    per dtype and device of the contiguous ones, one for each other tensor. Reads no data."""
    return len(_index_groups(tensors))  # a buffer has its tensor's shape, and is contiguous


def copy_all(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
    """``d.copy_(s)`` for every pair, as one ``torch._foreach_copy_`` per group of like tensors
    (buffers of the graph's own: no autograd record)."""
    with torch.no_grad():
        for d, s in _groups(dsts, srcs):
            _copy_group(d, s)


def _copy_group(dsts: Sequence[torch.Tensor], srcs: Sequence[torch.Tensor]) -> None:
    """One group's copy: ``copy_`` for a single pair, else one ``torch._foreach_copy_``."""
    if len(dsts) == 1:
        dsts[0].copy_(srcs[0])
    else:
        torch._foreach_copy_(dsts, srcs)


def fresh_copies(srcs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous copies of ``srcs`` in fresh tensors of their own (no views), filled by
    :func:`copy_all`: one multi-tensor copy per dtype and device for the contiguous sources
    instead of one ``clone`` (one launch) each."""
    dsts = [torch.empty(s.shape, dtype=s.dtype, device=s.device) for s in srcs]
    copy_all(dsts, srcs)
    return dsts


def fresh_zeros(likes: Sequence[torch.Tensor | tuple]) -> list[torch.Tensor]:
    """Zero tensors shaped like ``likes`` (each a tensor, whose dtype and device it takes, or a
    ``(shape, dtype, device)`` triple), tensors of their own (no views), zeroed by one
    ``torch._foreach_zero_`` per dtype and device instead of one fill each."""
    out = [torch.empty(t.shape, dtype=t.dtype, device=t.device) if isinstance(t, torch.Tensor)
           else torch.empty(t[0], dtype=t[1], device=t[2]) for t in likes]
    groups: dict = {}
    for t in out:
        if t.numel():
            key = (t.dtype, t.device)
            if key not in groups:  # not setdefault: torch 2.4's compile breaks the graph on it
                groups[key] = []
            groups[key].append(t)
    with torch.no_grad():
        for ts in groups.values():
            if len(ts) == 1:
                ts[0].zero_()
            else:
                torch._foreach_zero_(ts)
    return out


def zeros_for_none(grads: Sequence[torch.Tensor | None], likes: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The gradients a backward received, made contiguous, with each ``None`` (an output that
    took no part in the loss, under ``ctx.set_materialize_grads(False)``) replaced by zeros like
    its ``likes`` entry, all of them made by one :func:`fresh_zeros` fill."""
    zeros = iter(fresh_zeros([like for g, like in zip(grads, likes) if g is None]))
    return [next(zeros) if g is None else g.contiguous() for g in grads]


def _default_generator(device) -> "torch.Generator | None":
    """The default CUDA generator of ``device`` (an index, a device or None: the current one)."""
    if not torch.cuda.is_available():
        return None
    index = torch.device(device).index if device is not None and not isinstance(device, int) else device
    if index is None:
        index = torch.cuda.current_device()
    gens = torch.cuda.default_generators
    return gens[index] if index < len(gens) else None


@contextlib.contextmanager
def rng_restored_on_failure(device=None, generator: "torch.Generator | None" = None):
    """Around a CUDA-graph capture: if it fails, the device's default generator gets back the
    state it had before the capture began.

    ``torch.cuda.graph`` registers the default generator with the graph when the capture begins
    and takes it out of capture mode only when the capture ends well; a capture that is
    invalidated (an operation CUDA cannot capture) raises before that, and the generator stays in
    capture mode: from then on every random number drawn on that device outside a capture
    (dropout, ``torch.randn``) raises "Offset increment outside graph capture encountered
    unexpectedly". What the capture drew was counted apart from the generator's offset (as the
    graph's own), so the state cloned before it is exactly the state to go on from.
    ``generator``: that generator instead of the default one (tests)."""
    gen = generator if generator is not None else _default_generator(device)
    saved = gen.clone_state() if gen is not None and hasattr(gen, "clone_state") else None
    try:
        yield
    except BaseException:
        if saved is not None:
            gen.graphsafe_set_state(saved)
        raise


class _EagerGraph:
    """The stand-in: ``replay`` reruns the function on the static inputs and writes its results
    into the static outputs, as a CUDA graph's replay does."""

    def __init__(self, fn, static_in):
        self.fn, self.static_in = fn, static_in
        self.static_out = tuple(fn(*static_in))

    def replay(self) -> None:
        copy_all(self.static_out, tuple(self.fn(*self.static_in)))


class _CudaGraph:
    def __init__(self, fn, static_in):
        self.device = static_in[0].device
        with torch.cuda.device(self.device):
            self._capture(fn, static_in)

    def _capture(self, fn, static_in):
        side = side_stream(self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: Triton's JIT and module loads, cuBLAS's workspace
            fn(*static_in)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (nn.DataParallel's replicas) do not break it
        with rng_restored_on_failure(self.device), \
                torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.static_out = tuple(fn(*static_in))

    def replay(self) -> None:
        with torch.cuda.device(self.device):
            self.graph.replay()


class _Entry:
    def __init__(self, fn, inputs, cuda: bool):
        self.static_in = tuple(torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t) for t in inputs)
        self.graph = (_CudaGraph if cuda else _EagerGraph)(fn, self.static_in)
        # the copies in and out, worked out once: (buffers, indices) per multi-tensor copy
        self.copy_in = [([self.static_in[i] for i in g], g) for g in _index_groups(inputs)]
        self.copy_out = [([self.graph.static_out[i] for i in g], g) for g in _index_groups(self.graph.static_out)]

    def load(self, inputs: Sequence[torch.Tensor]) -> None:
        """Copy ``inputs`` (of this graph's key) into its buffers."""
        with torch.no_grad():
            for bufs, idx in self.copy_in:
                _copy_group(bufs, [inputs[i] for i in idx])

    def outputs(self) -> tuple[torch.Tensor, ...]:
        """Fresh copies of the graph's outputs."""
        out = [torch.empty_like(o) for o in self.graph.static_out]
        with torch.no_grad():
            for bufs, idx in self.copy_out:
                _copy_group([out[i] for i in idx], bufs)
        return tuple(out)


def _autocast_state(device: torch.device) -> tuple:
    """Autocast on or off, and its dtype, for ``device``'s type: a loop captured under one
    autocast state must not replay under another."""
    kind = device.type
    try:
        on = torch.is_autocast_enabled(kind)
        return (on, torch.get_autocast_dtype(kind) if on else None)
    except (TypeError, AttributeError, RuntimeError):  # an older torch: the CUDA switch only
        return (torch.is_autocast_enabled(),)


def _signature(inputs: Sequence[torch.Tensor]) -> tuple:
    # inference mode too: a graph's buffers made inside torch.inference_mode() are inference
    # tensors, which nothing outside it may write into
    return (tuple((tuple(t.shape), t.dtype, t.device, t.is_contiguous()) for t in inputs)
            + _autocast_state(inputs[0].device) + (torch.is_inference_mode_enabled(),))


def graphed(key: Hashable, fn: Callable[..., Sequence[torch.Tensor]], *inputs: torch.Tensor
            ) -> tuple[torch.Tensor, ...]:
    """``fn(*inputs)``, replayed from a CUDA graph once this ``key`` and these input shapes have
    been seen before (module docstring). ``key`` names the loop and every Python value ``fn``
    depends on; the inputs' shapes, dtypes and device are added to it. Returns tensors of the
    caller's own (copies of the graph's outputs). Called while another graphed function runs (its
    body calls this one), it runs ``fn`` plainly: the outer graph holds its launches."""
    if _BODIES[0]:
        return tuple(fn(*inputs))
    if _LISTENERS:
        call = functools.partial(_graphed, key, fn, inputs)
        for listener in reversed(tuple(_LISTENERS)):  # the first registered is the outermost
            call = functools.partial(listener, key, inputs, call)
        return tuple(call())
    return _graphed(key, fn, inputs)


class _ModuleKey(tuple):
    """The key a caller gave :func:`graphed_autograd`, marked as such inside its graphs' keys."""


def _module_lost(key) -> None:
    """A graph of a module graphed whole failed to capture or was pushed out of the cache: that
    module runs its own path from now on (:func:`whole_module`), not its forward twice without
    graphs. Called with the lock held."""
    if isinstance(key, tuple):
        for part in key:
            if isinstance(part, _ModuleKey):
                _MODULES_LOST.add(part[0])


def _body(fn: Callable[..., Sequence[torch.Tensor]]) -> Callable[..., tuple]:
    """``fn`` marked as a graphed function's body while it runs (:data:`_BODIES`), its outputs
    made contiguous (inside the graph, so that a replay copies them all out in one multi-tensor
    copy instead of one copy per strided view)."""
    def body(*inputs):
        with _LOCK:
            _BODIES[0] += 1
        try:
            return tuple(t.contiguous() for t in fn(*inputs))
        finally:
            with _LOCK:
                _BODIES[0] -= 1
    return body


def whole_module(x: torch.Tensor, default: bool = True, key: Hashable = None,
                 module: "torch.nn.Module | None" = None) -> bool:
    """Whether a module's whole forward on tensors like ``x`` should go through
    :func:`graphed_autograd`: replay on for ``x`` (:func:`enabled`), the module's choice
    (``default``) unless ``MEMNETS_MODULE_GRAPHS`` says ``0`` (none) or ``1`` (every module
    that can), and not already inside a graphed function or another graph's capture (a whole
    training step's, where the module's launches belong to that graph). ``key``: the key the
    module gives :func:`graphed_autograd`; once a graph of it failed to capture or was pushed out
    of the cache, the module runs its own path. ``module``: whose parameters the graphs would
    read; a replica made for one call (``nn.DataParallel``'s, whose parameters are not leaves and
    are new at every call) runs its own path."""
    choice = os.environ.get("MEMNETS_MODULE_GRAPHS", "")
    if _BODIES[0] or _MODULES_OFF[0] or choice == "0" or (choice != "1" and not default):
        return False
    if key is not None and key in _MODULES_LOST:
        return False
    if module is not None and not all(p.is_leaf for p in module.parameters()):
        return False
    if _COUNTING[0] and not x.is_cuda:  # a launch count on CPU tensors: as on CUDA
        return switched_on()
    return enabled(x) and not _inside_capture(x)


@contextlib.contextmanager
def modules_off():
    """No module graphed whole (:func:`whole_module` says no) while active: the warm-up steps
    of :class:`memnets.train.graph_step.CUDAGraphStep`, whose capture runs the modules' own
    paths (graphs of their own would only hold memory)."""
    _MODULES_OFF[0] += 1
    try:
        yield
    finally:
        _MODULES_OFF[0] -= 1


@contextlib.contextmanager
def counting():
    """CPU tensors take :func:`whole_module`'s path as CUDA tensors would (without graphs: the
    launch count of ``memnets bench launches`` counts each graphed call as its replay)."""
    _COUNTING[0] += 1
    try:
        yield
    finally:
        _COUNTING[0] -= 1


def _inside_capture(x: torch.Tensor) -> bool:
    """The current stream is being captured (a whole training step, e.g. by
    :class:`memnets.train.graph_step.CUDAGraphStep`): the loop's launches belong to that graph."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _graphed(key: Hashable, fn: Callable[..., Sequence[torch.Tensor]], inputs: tuple) -> tuple[torch.Tensor, ...]:
    if not inputs or not enabled(inputs[0]):
        return tuple(fn(*inputs))
    if _inside_capture(inputs[0]):  # no graph of our own inside another's capture: plain launches
        _STATS["inside_capture"] += 1
        return tuple(fn(*inputs))
    fn = _body(fn)
    full = (key, _signature(inputs))
    with _LOCK:
        failed = full in _FAILED or full in _EVICTED
        entry = None if failed else _CACHE.get(full)
        if entry is None and not failed:
            _SEEN[full] += 1
            first = _SEEN[full] < 2
        if entry is not None:
            _CACHE.move_to_end(full)
    if failed or (entry is None and first):  # a shape met once is not worth a capture
        _STATS["eager"] += 1
        return tuple(fn(*inputs))
    if entry is None:
        try:
            entry = _Entry(fn, inputs, inputs[0].is_cuda)
        except Exception as e:  # noqa: BLE001 - the loop still runs, without a graph
            with _LOCK:
                _FAILED.add(full)
                _module_lost(key)
            _STATS["failures"] += 1
            warnings.warn(f"memnets: CUDA-graph capture of {key!r} failed ({type(e).__name__}: {e}); "
                          "running it without a graph", RuntimeWarning, stacklevel=3)
            return tuple(fn(*inputs))
        _STATS["captures"] += 1
        with _LOCK:
            _CACHE[full] = entry
            while len(_CACHE) > MAX_GRAPHS:
                lost = _CACHE.popitem(last=False)[0]
                _EVICTED.add(lost)
                _module_lost(lost[0])
                _STATS["evictions"] += 1
    else:
        entry.load(inputs)
    entry.graph.replay()
    _STATS["replays"] += 1
    return entry.outputs()


def _autocast_context(state: tuple, device: torch.device):
    """Re-enter the autocast state :func:`_autocast_state` recorded (for a recomputation)."""
    if len(state) == 2:
        on, dtype = state
        return torch.autocast(device.type, dtype=dtype, enabled=True) if on else \
            torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, enabled=bool(state[0]))


def _named(key: tuple, part: str) -> tuple:
    """The key of a :func:`graphed_autograd` graph: ``(<name>.<part>, ...the rest of key)``."""
    return (f"{key[0]}.{part}",) + key[1:]


def _without_grad(fn: Callable[..., Sequence[torch.Tensor]]) -> Callable[..., tuple]:
    """``fn`` run under ``torch.no_grad()`` (a forward graph records no autograd graph)."""
    def forward(*xs):
        with torch.no_grad():
            return tuple(fn(*xs))
    return forward


class _Recomputed(torch.autograd.Function):
    """:func:`graphed_autograd`'s function: forward and backward each one :func:`graphed` call."""

    @staticmethod
    def forward(ctx, key, fn, module, n_in, *tensors):
        inputs, params = tensors[:n_in], tensors[n_in:]
        state = _autocast_state(inputs[0].device)
        ctx.key, ctx.fn, ctx.module, ctx.n_in, ctx.autocast = key, fn, module, n_in, state
        ctx.versions = tuple(p._version for p in params)
        ctx.set_materialize_grads(False)
        outs = graphed(_named(key, "forward"), _without_grad(fn), *inputs)
        ctx.save_for_backward(*inputs)
        ctx.params = params  # read by the recomputation as they are now (their versions checked)
        ctx.out_meta = tuple((o.shape, o.dtype, o.device, o.is_floating_point()) for o in outs)
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        inputs, params, n_in = ctx.saved_tensors, ctx.params, ctx.n_in
        for p, v in zip(params, ctx.versions):
            if p._version != v:
                raise RuntimeError("graphed_autograd: a parameter was modified in place between the forward and "
                                   "the backward (e.g. an optimizer step before backward()); its gradient "
                                   "would be of the new values")
        need = ctx.needs_input_grad[4:]
        want_in = [i for i in range(n_in) if need[i]]
        want_p = [j for j in range(len(params)) if need[n_in + j]]
        diff_out = [k for k, m in enumerate(ctx.out_meta) if m[3] and grads[k] is not None]
        if not diff_out or not (want_in or want_p):
            return (None,) * 4 + (None,) * (n_in + len(params))
        fn, module, state, device = ctx.fn, ctx.module, ctx.autocast, inputs[0].device
        grads_in = zeros_for_none([grads[k] for k in diff_out],
                                  [(ctx.out_meta[k][0], ctx.out_meta[k][1], ctx.out_meta[k][2]) for k in diff_out])

        def backward_fn(*xs):
            ins, gs = xs[:n_in], xs[n_in:]
            # the module reads its parameters through fresh leaves that share their storage
            # (_reading_aliases): differentiated directly, a parameter's gradient would go to the
            # accumulator node the caller's graph holds, made on the caller's stream, and its
            # stream sync with the capture's stream invalidates the capture
            wanted = set(want_p)
            aliases = [p.detach().requires_grad_(j in wanted) for j, p in enumerate(params)] if module is not None \
                else list(params)
            with torch.enable_grad(), _autocast_context(state, device), _reading_aliases(module, params, aliases):
                leaves = [t.detach().requires_grad_(i in want_in) for i, t in enumerate(ins)]
                outs = tuple(fn(*leaves))
            wrt = [leaves[i] for i in want_in] + [aliases[j] for j in want_p]
            pairs = [(outs[k], g) for k, g in zip(diff_out, gs) if outs[k].requires_grad]
            got = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True) \
                if pairs else [None] * len(wrt)
            # a tensor the outputs do not depend on gets no gradient (None, as from autograd);
            # the graph returns zeros in its place, and which they are is known by the key
            _UNUSED[key] = frozenset(i for i, g in enumerate(got) if g is None)
            zeros = iter(fresh_zeros([w for w, g in zip(wrt, got) if g is None]))
            return tuple(next(zeros) if g is None else g for g in got)

        key = _named(ctx.key, "backward") + (tuple(want_in), tuple(want_p), tuple(diff_out))
        if module is None and want_p and inputs[0].is_cuda:  # see backward_fn: not capturable
            got = tuple(backward_fn(*inputs, *grads_in))
        else:
            got = graphed(key, backward_fn, *inputs, *grads_in)
        unused = _UNUSED.get(key, frozenset())
        out = [None] * (n_in + len(params))
        for i, (slot, g) in enumerate(zip(want_in + [n_in + j for j in want_p], got)):
            out[slot] = None if i in unused else g
        return (None,) * 4 + tuple(out)


@contextlib.contextmanager
def _reading_aliases(module: "torch.nn.Module | None", params: Sequence[torch.Tensor],
                     aliases: Sequence[torch.Tensor]):
    """While active, ``module`` (and its submodules) hold ``aliases[j]`` where they held
    ``params[j]`` (tied parameters in every place); the parameters are put back after.

    An RNN module (``nn.LSTM``, ``nn.GRU``: ``_flat_weights``) keeps a list of its weights for
    cuDNN, and when its forward finds other weight objects there it flattens them into a new
    buffer, moving them (``set_``) to new storage. Its list is therefore set to the aliases here,
    and put back after, as it was: the aliases keep the parameters' storage and layout, so cuDNN
    reads them in place, and the parameters themselves never move (their addresses are in the
    graphs' keys and in a captured optimiser step)."""
    if module is None:
        yield
        return
    by_id = {id(p): a for p, a in zip(params, aliases)}
    swapped, lists = [], []
    try:
        for sub in module.modules():
            for name, p in list(sub._parameters.items()):
                if p is not None and id(p) in by_id:
                    swapped.append((sub, name, p))
                    sub._parameters[name] = by_id[id(p)]
        for sub in module.modules():
            names = getattr(sub, "_flat_weights_names", None)
            if names is not None and hasattr(sub, "_flat_weights"):
                lists.append((sub, sub.__dict__.get("_flat_weights"), sub.__dict__.get("_flat_weight_refs")))
                flat = [getattr(sub, n) if hasattr(sub, n) else None for n in names]
                sub.__dict__["_flat_weights"] = flat
                sub.__dict__["_flat_weight_refs"] = [weakref.ref(w) if w is not None else None for w in flat]
        yield
    finally:
        for sub, flat, refs in reversed(lists):
            sub.__dict__["_flat_weights"], sub.__dict__["_flat_weight_refs"] = flat, refs
        for sub, name, p in reversed(swapped):
            sub._parameters[name] = p


def graphed_autograd(key: Hashable, fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                     params: "Sequence[torch.Tensor] | None" = None, module: "torch.nn.Module | None" = None
                     ) -> tuple[torch.Tensor, ...]:
    """``fn(*inputs)``, differentiable in ``inputs`` and ``params``, its forward one
    :func:`graphed` call and its backward another: a module's whole forward (a cuDNN RNN, the
    projections, the kernels' loops) replays as one CUDA graph and its backward as one more.

    ``fn(*inputs) -> tuple of tensors`` reads ``params`` itself (a module's parameters: the
    graphs read them where they are, so an optimizer's in-place step is seen and nothing is
    copied; their addresses are part of the key, so a parameter moved elsewhere is captured
    anew). It must compute the same function every time it is called (no dropout, no
    other randomness): the backward **recomputes** the forward under autograd (in the autocast
    state of the forward) and differentiates it, as ``torch.utils.checkpoint`` does, inside its
    graph. So calls of one function may overlap (several forwards before their backwards), and
    what the forward keeps for the backward is its inputs. The graphs are named
    ``<key[0]>.forward`` and ``<key[0]>.backward`` (``key[0]`` a string; else ``module``). A parameter changed in place between
    the forward and its backward is refused. Double backward is not supported. Where replay is
    off (CPU tensors outside :func:`stand_in`, ``MEMNETS_CUDA_GRAPHS=0``) the same holds, without
    graphs; without gradients to compute it is one :func:`graphed` call.

    ``module``: the module whose parameters ``params`` are (``fn`` reads them from it; ``params``
    left out: all of them). The
    recomputation in the backward then reads them through fresh leaves that share their storage,
    and the gradients are taken with respect to those: taken with respect to a parameter itself,
    its gradient would pass through the accumulator node of the caller's autograd graph, which
    belongs to the caller's stream, and that cross-stream wait invalidates the capture. Without
    ``module`` the parameters are differentiated directly, and on CUDA the backward then runs
    without a graph of its own."""
    inputs = tuple(inputs)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ValueError("graphed_autograd: `inputs` expected one tensor or more")
    if module is not None and not isinstance(module, torch.nn.Module):
        raise TypeError(f"graphed_autograd: `module` expected an nn.Module, got {type(module).__name__}")
    if params is None:  # the module's own parameters (none without a module)
        params = tuple(module.parameters()) if module is not None else ()
    else:
        params = tuple(params)
        if module is not None:
            own = {id(p) for p in module.parameters()}
            if any(id(p) not in own for p in params):
                raise ValueError("graphed_autograd: every tensor of `params` must be a parameter of `module`")
    # where the parameters are is part of the key: the graphs read them there
    name = key[0] if isinstance(key, tuple) and key and isinstance(key[0], str) else "module"
    key = (name, _ModuleKey((key,)), tuple(p.data_ptr() for p in params))
    params = tuple(p for p in params if p.requires_grad)
    _STATS["modules"] += 1
    fn = _body(fn)  # inside it, whole_module() says no (the module's own forward runs)
    if not torch.is_grad_enabled() or not (params or any(t.requires_grad for t in inputs)):
        return graphed(_named(key, "forward"), _without_grad(fn), *inputs)
    return _Recomputed.apply(key, fn, module, len(inputs), *inputs, *params)
