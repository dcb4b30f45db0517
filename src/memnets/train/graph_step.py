"""A whole training step — forward, loss, backward, optimiser step — replayed as one CUDA graph.

A small recurrent model's training step on a GPU is bound by launches: each of its kernels
costs some microseconds of Python and driver time, and the GPU waits. :class:`CUDAGraphStep`
captures the step once into a ``torch.cuda.CUDAGraph`` and from then on replays it: the batch is
copied into the graph's input buffers and every kernel of the step (the model's, autograd's and
the optimiser's) is launched by one call. This is PyTorch's whole-network capture
(``torch.cuda.graph``; docs "CUDA Graphs"), packaged::

    step = CUDAGraphStep(lambda x, y: F.cross_entropy(model(x), y), optimizer)
    for x, y in loader:
        loss = step(x, y)          # a tensor the next call overwrites: .item() or clone() it

``loss_fn`` may also return a tuple ``(loss, *extra)``: the call then returns the tuple, whose
extra items (tensors, or closures over the step's tensors, read after the call) come from the
captured step and so hold the latest replay's values. ``step(*inputs, key=k)`` adds a hashable
``k`` to the signature, for what the inputs' tensors do not say (Python numbers ``loss_fn``
reads from elsewhere): each ``k`` has graphs of its own.

Rules, as for any CUDA graph:

* the inputs of every call have the shapes and dtypes the graph was captured with; a new
  signature (shapes, dtypes, device, autocast state) warms up and captures a graph of its own
  (at most :data:`MAX_GRAPHS` are kept, the least recently used going first; once
  :data:`MAX_CAPTURES` captures were made, a signature not held runs eagerly: shapes that keep
  changing would otherwise capture at every few steps);
* the step reads nothing back to the CPU (no ``.item()``, no data-dependent Python branch);
  random numbers from torch's default CUDA generator (dropout) are new at every replay, as
  ``torch.cuda.graph`` registers that generator with the graph;
* a learning rate given as a Python float is baked into the graph at the capture: a schedule
  that changes it later needs the rate as a tensor (``Adam(..., lr=torch.tensor(1e-3,
  device="cuda"), fused=True)``, then ``group["lr"].fill_(new)``);
* the optimiser is made ``capturable`` (Adam, AdamW and others that have the option; its
  ``step`` counters move to the GPU) when this object is built, before its first step.

The graphs of one :class:`CUDAGraphStep` share one memory pool (``torch.cuda.graph``'s
``pool``). Each graph would otherwise keep its own pool, reserved at its peak (the activations
its backward saves) for as long as it is held, so a run whose batches come in many shapes held
that peak once per graph; shared, the pool is about the largest peak. Sharing is safe here
because the graphs replay one at a time on one stream and what a replay leaves (the loss, the
extras, the gradients) is read before the next call, the rule above.

The first :attr:`warmup` calls of a signature are ordinary eager steps, on a side stream as
capture requires; the next one captures and replays. A capture that fails (a step that syncs, an
op that cannot be captured) warns once and leaves that signature eager, so the step is always
taken. On the CPU, or with ``MEMNETS_CUDA_GRAPHS=0``, every call is an eager step. The
recurrent kernels' own loop graphs (:mod:`memnets.ops.gpu.graphs`) run inside the outer capture
as plain launches.

:func:`stand_in` replaces the CUDA graph by an eager stand-in with the same contract (static
input buffers, the step run on them at every replay) so the bookkeeping is tested on the CPU;
the capture itself needs a GPU (``make gpu-check`` runs it).
"""
from __future__ import annotations

import collections
import warnings
from typing import Callable, Hashable

import torch

from ..ops.gpu import graphs as _graphs

__all__ = ["CUDAGraphStep", "stand_in", "MAX_GRAPHS", "MAX_CAPTURES"]

MAX_GRAPHS = 8
MAX_CAPTURES = 4 * MAX_GRAPHS

# one switch for every CUDA-graph stand-in: inside it CPU tensors take the capture/replay
# bookkeeping (the recurrent loops' graphs and this whole-step graph) with eager stand-ins
stand_in = _graphs.stand_in


class _EagerGraph:
    """A CUDA graph's contract without CUDA: ``capture(fn)`` keeps ``fn``, ``replay()`` runs it.

    ``reset`` runs before each replay: a captured backward writes its gradients into the
    buffers it allocated at the capture (the grads were None then) rather than adding to them,
    which an eager rerun does only after ``zero_grad(set_to_none=True)``."""

    def __init__(self, reset: Callable[[], None]) -> None:
        self.fn: Callable[[], None] | None = None
        self.reset = reset

    def capture(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        with _graphs.modules_off():  # inside a capture no module makes graphs of its own
            fn()  # a capture records the launches; the stand-in runs them once, like the warm-ups

    def replay(self) -> None:
        assert self.fn is not None
        self.reset()
        with _graphs.modules_off():
            self.fn()


class _Entry:
    __slots__ = ("graph", "inputs", "out")

    def __init__(self, graph, inputs: list[torch.Tensor], out: list) -> None:
        self.graph, self.inputs, self.out = graph, inputs, out  # out[0]: the step's output


class CUDAGraphStep:
    """``step(*inputs) -> loss``: ``loss_fn(*inputs).backward()`` and ``optimizer.step()``,
    replayed from a CUDA graph per input signature (module docstring).

    Args:
        loss_fn: the forward pass and loss, ``loss_fn(*inputs) -> scalar tensor``.
        optimizer: steps the parameters ``loss_fn`` uses; made capturable here (on CUDA).
        warmup: eager steps of a signature before it is captured (at least 1; PyTorch's
            guidance is a few, so that lazily built state — optimiser moments, cuBLAS
            workspaces, Triton's compiled kernels — exists before the capture).
        enabled: ``None`` (default): replay on CUDA unless ``MEMNETS_CUDA_GRAPHS=0``;
            ``False``: always eager.
        before_step: called between the backward and the optimiser step, e.g.
            ``lambda: torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)`` (captured too:
            it must not read values back either).
    """

    def __init__(self, loss_fn: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer, *,
                 warmup: int = 3, enabled: bool | None = None,
                 before_step: Callable[[], object] | None = None) -> None:
        if not callable(loss_fn):
            raise TypeError(f"`loss_fn` expected a callable, got {type(loss_fn).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"`optimizer` expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"`warmup` expected an int >= 1, got {warmup!r}")
        self.loss_fn, self.optimizer, self.warmup, self.enabled = loss_fn, optimizer, warmup, enabled
        self.before_step = before_step
        self._graphs: "collections.OrderedDict[Hashable, _Entry]" = collections.OrderedDict()
        self._seen: "collections.Counter[Hashable]" = collections.Counter()
        self._failed: set = set()
        # eager, captured, replayed, failed, uncaptured (eager: past MAX_CAPTURES)
        self.stats: "collections.Counter[str]" = collections.Counter()
        self._pool = None  # the graphs' one memory pool (module docstring), made at the first capture
        if any(p.is_cuda for g in optimizer.param_groups for p in g["params"]):
            _make_capturable(optimizer)

    # ------------------------------------------------------------------------------- steps
    def _step(self, inputs):
        """Loss, backward, ``before_step``, optimiser step: the body of every step, eager or
        captured. Returns the detached loss, or ``(loss, *extra)`` when ``loss_fn`` returns a tuple."""
        out = self.loss_fn(*inputs)
        loss = out[0] if isinstance(out, tuple) and out else out
        _check_loss(loss)
        loss.backward()
        if self.before_step is not None:
            self.before_step()
        self.optimizer.step()
        return (loss.detach(), *out[1:]) if isinstance(out, tuple) else loss.detach()

    def _eager(self, inputs) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._step(inputs)
        self.stats["eager"] += 1
        return loss

    def _replays(self, inputs) -> bool:
        if self.enabled is False or not _graphs.switched_on():
            return False
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        if len(tensors) != len(inputs) or not tensors:
            return False
        if _graphs.standing_in():
            return not tensors[0].is_cuda
        return all(t.is_cuda for t in tensors) and torch.cuda.is_available()

    def __call__(self, *inputs: torch.Tensor, key: Hashable = None):
        if not self._replays(inputs):
            return self._eager(inputs)
        dev = inputs[0].device.type
        key = (tuple((tuple(t.shape), t.dtype, t.device, t.requires_grad) for t in inputs),
               torch.is_autocast_enabled(dev), str(torch.get_autocast_dtype(dev)), key)
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
            for buf, t in zip(entry.inputs, inputs):
                buf.copy_(t)
            entry.graph.replay()
            self.stats["replayed"] += 1
            return entry.out[0]
        if self.stats["captured"] >= MAX_CAPTURES:
            if not self.stats["uncaptured"]:
                warnings.warn(f"CUDAGraphStep: {MAX_CAPTURES} captures made and the input shapes keep changing; "
                              "steps of a signature not held run eagerly from here on (pad or bucket the "
                              "shapes to replay them)", RuntimeWarning, stacklevel=2)
            self.stats["uncaptured"] += 1
            return self._eager(inputs)
        if key in self._failed or self._seen[key] < self.warmup:
            self._seen[key] += 1
            with _graphs.modules_off():  # as the capture will run it: no module graphs of their own
                return self._side_stream(lambda: self._eager(inputs), inputs[0])
        return self._capture(key, inputs)

    def _side_stream(self, fn, like: torch.Tensor):
        if not like.is_cuda:
            return fn()
        s = _graphs.side_stream(like.device)  # one stream: its cached blocks serve the next warm-up
        s.wait_stream(torch.cuda.current_stream(like.device))
        with torch.cuda.stream(s):
            out = fn()
        torch.cuda.current_stream(like.device).wait_stream(s)
        return out

    def _record(self, body: Callable[[], None], device: "torch.device | None" = None):
        """``body`` captured into a CUDA graph in this step's one memory pool, then replayed once
        (the capture ran nothing: that replay is this call's step)."""
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # a capture that fails must not leave the device's generator in capture mode
        with _graphs.rng_restored_on_failure(device), torch.cuda.graph(graph, pool=self._pool):
            body()
        graph.replay()
        return graph

    def _capture(self, key, inputs) -> torch.Tensor:
        static = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
        self.optimizer.zero_grad(set_to_none=True)  # the graph's backward allocates the grads
        # the output: the graph's own tensors, rewritten at every replay (the stand-in runs the
        # body again at each replay: its loss is copied into the first one, its extras replace)
        box: list = []

        def body() -> None:
            out = self._step(static)
            if not box:
                box.append(out)
            elif isinstance(out, tuple):
                box[0][0].copy_(out[0])
                box[0] = (box[0][0], *out[1:])
            else:
                box[0].copy_(out)

        try:
            if static[0].is_cuda:
                graph = self._record(body, static[0].device)
            else:
                graph = _EagerGraph(lambda: self.optimizer.zero_grad(set_to_none=True))
                graph.capture(body)
        except Exception as e:  # noqa: BLE001 - the step is taken eagerly instead
            self._failed.add(key)
            self.stats["failed"] += 1
            warnings.warn(f"CUDAGraphStep: capturing the training step failed ({type(e).__name__}: "
                          f"{str(e)[:200]}); this input signature runs eagerly", RuntimeWarning, stacklevel=3)
            if static[0].is_cuda:
                torch.cuda.synchronize(static[0].device)
            return self._side_stream(lambda: self._eager(inputs), inputs[0])
        self.stats["captured"] += 1
        self._graphs[key] = _Entry(graph, static, box)
        while len(self._graphs) > MAX_GRAPHS:
            self._graphs.popitem(last=False)
        return box[0]


def _check_loss(loss) -> None:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"CUDAGraphStep: `loss_fn` must return a scalar tensor, got {shape}")


def _make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Turn on ``capturable`` where the optimiser has it, moving existing ``step`` counters to
    their parameters' device (a capturable step keeps them there)."""
    for group in optimizer.param_groups:
        if "capturable" not in group:
            continue
        group["capturable"] = True
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            step = st.get("step")
            if isinstance(step, torch.Tensor) and step.device != p.device:
                st["step"] = step.to(device=p.device, dtype=torch.float32)
