"""The guards that drop a training step's update: ``optim.spike_skip`` and ``optim.nan_policy = "skip"``.

:class:`SpikeGuard` decides on the host, from the step's gradient norm read back (the eager
steps of :func:`memnets.train.loop.update`). :class:`DeviceGuard` decides the same on the
device, with nothing read back, for steps that are replayed from a CUDA graph or checked only at
the next record (:func:`memnets.train.loop.deferred_checks`): its window of norms is a tensor,
its median is taken by sorting it, and a dropped update is the fused optimiser's own skip, the
``found_inf`` flag through which :class:`torch.amp.GradScaler` drops a step (the parameters,
the moments and the step counter are left as they were). Both give the same decisions from the
same norms, and their window is checkpointed in one form, so a run may resume on the other path.

In a loop of one's own (the step may then be captured in a CUDA graph whole)::

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    guard = DeviceGuard(1000.0, "cuda")     # spike_skip = 1000; 0: drop non-finite steps only
    guard.attach(opt)
    ...
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    told = guard.decide(loss, norm)         # [verdict, median, n] on the GPU, read when convenient
    opt.step()                              # skipped on the GPU when the verdict is not 0
"""
from __future__ import annotations

import collections
import math
import statistics

import torch

__all__ = ["SpikeGuard", "DeviceGuard", "SPIKE", "NON_FINITE", "spike_message"]

SPIKE, NON_FINITE = 1, 2  # DeviceGuard.decide's verdict; 0: the update is taken


class SpikeGuard:
    """``optim.spike_skip``: refuses an update whose total gradient norm is more than ``factor``
    times the median norm of the last :attr:`WINDOW` steps, once :attr:`WARMUP` were seen
    (before that it admits every one). Every norm joins the window, the refused ones too: were
    only admitted norms kept, a window of small norms would refuse each ordinary step for good.

    A recurrence whose gradient explodes now and then (the NTM on the copy task, docs/ntm.md)
    gives single steps with norms 10⁵–10⁷ times the usual, and clipping them to
    ``optim.grad_clip`` still takes a step many times the size Adam expects; dropping them
    leaves the ordinary large steps (a run leaving a plateau: 10–200 times the median) alone.
    Its state, the window of norms, goes into each checkpoint, so a resumed run decides alike."""

    WINDOW = 100
    WARMUP = 20

    def __init__(self, factor: float) -> None:
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"`factor` expected a finite number > 0, got {factor!r}")
        self.factor = float(factor)
        self.history: collections.deque[float] = collections.deque(maxlen=self.WINDOW)
        self.dropped = 0  # updates refused by this guard
        self.last = ""  # why the last one was refused

    def admits(self, norm: float) -> bool:
        """Whether an update of total gradient norm ``norm`` may be taken (the norm joins the window)."""
        ok = True
        if len(self.history) >= self.WARMUP:
            median = statistics.median(self.history)
            if norm > self.factor * median:
                self.dropped += 1
                self.last = spike_message(norm, self.factor, median, len(self.history))
                ok = False
        self.history.append(float(norm))
        return ok

    def norms(self) -> list[float]:
        """The norms in the window, oldest first (the checkpointed state)."""
        return list(self.history)

    def load(self, norms: list[float]) -> None:
        self.history.clear()
        self.history.extend(float(x) for x in norms)


def spike_message(norm: float, factor: float, median: float, n: int) -> str:
    """Why a step of total gradient norm ``norm`` was dropped against the ``median`` of ``n`` norms."""
    return (f"gradient norm {norm:.3g} is more than optim.spike_skip = {factor:g} times the median {median:.3g} "
            f"of the last {n} steps")


class DeviceGuard:
    """:class:`SpikeGuard`'s decision, and the drop of a non-finite step, taken on the device.

    :meth:`decide` is called between the clipping and ``optimizer.step()`` with the step's loss
    and total gradient norm (0-d tensors, unread). It sets the optimiser's ``found_inf``
    (:meth:`attach`) to 1 where the update must be dropped: a non-finite loss or norm, or, with
    ``spike_factor`` > 0, a spike (the norm more than that many times the median of the window,
    once :attr:`SpikeGuard.WARMUP` norms are in it); and it pushes a finite norm into the window.
    Every operation is a fixed-shape tensor op: the call can be captured in a CUDA graph and
    costs no sync. It returns the verdict for the caller to read back with the step's loss
    (:class:`memnets.train.loop.StepTally`).

    The window holds the last :attr:`SpikeGuard.WINDOW` finite norms in float64 (NaN marks an
    empty slot; sorting puts NaN last), and the median of ``n`` norms is the mean of the sorted
    window's elements ``(n - 1) // 2`` and ``n // 2``, as :func:`statistics.median` takes it: the
    same norms give :class:`SpikeGuard`'s decisions.
    """

    def __init__(self, spike_factor: float, device: torch.device | str) -> None:
        if not (spike_factor >= 0 and math.isfinite(spike_factor)):
            raise ValueError(f"`spike_factor` expected a finite number >= 0 (0: no spike guard), got {spike_factor!r}")
        self.factor = float(spike_factor)
        self.device = torch.device(device)
        w = SpikeGuard.WINDOW
        self.window = torch.full((w,), math.nan, dtype=torch.float64, device=self.device)
        self.pos = torch.zeros((), dtype=torch.int64, device=self.device)  # the slot the next norm goes to
        self.seen = torch.zeros((), dtype=torch.int64, device=self.device)  # norms in the window
        self.found_inf = torch.zeros((), dtype=torch.float32, device=self.device)
        self.dropped = 0  # spikes dropped: counted by the caller as it reads the verdicts back
        self.last = ""  # why the last one read back was dropped
        self.told: torch.Tensor | None = None  # the last verdict of decide

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Let ``optimizer`` skip the updates this guard drops. A fused optimiser (``fused=True``:
        Adam, AdamW, SGD) reads ``found_inf`` in its step and, where it is non-zero, leaves the
        parameters, its moments and its step counter as they were. Any other optimiser is refused:
        it would apply the update regardless."""
        if not optimizer.param_groups or not all(g.get("fused") for g in optimizer.param_groups):
            raise ValueError(f"DeviceGuard needs a fused optimiser (fused=True), got {type(optimizer).__name__} "
                             "without it")
        optimizer.found_inf = self.found_inf
        optimizer.grad_scale = None

    def decide(self, loss: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        """Judge the step of ``loss`` and total gradient ``norm`` (before clipping); returns a
        float64 tensor ``[verdict, median, n]``: 0 (taken), :data:`SPIKE` or :data:`NON_FINITE`,
        the median compared with and the number of norms it was taken over."""
        norm = norm.detach().reshape(()).to(torch.float64)
        finite = torch.isfinite(norm) & torch.isfinite(loss.detach().reshape(()))
        verdict = (~finite).to(torch.float64) * NON_FINITE
        n = self.seen.clone()
        median = torch.zeros((), dtype=torch.float64, device=norm.device)
        if self.factor:
            ranked = torch.sort(self.window).values
            lo = torch.div(torch.clamp(n - 1, min=0), 2, rounding_mode="floor").reshape(1)
            hi = torch.div(n, 2, rounding_mode="floor").clamp(max=SpikeGuard.WINDOW - 1).reshape(1)
            median = (ranked.index_select(0, lo) + ranked.index_select(0, hi)).reshape(()) / 2
            spike = finite & (n >= SpikeGuard.WARMUP) & (norm > self.factor * median)
            verdict = verdict + spike.to(torch.float64) * SPIKE
            slot = self.pos.reshape(1)
            kept = torch.where(finite, norm, self.window.index_select(0, slot).reshape(()))
            self.window.index_copy_(0, slot, kept.reshape(1))
            taken = finite.to(torch.int64)
            self.pos.copy_(torch.remainder(self.pos + taken, SpikeGuard.WINDOW))
            self.seen.copy_(torch.clamp(n + taken, max=SpikeGuard.WINDOW))
        self.found_inf.copy_((verdict > 0).to(torch.float32))
        self.told = torch.stack([verdict, median, n.to(torch.float64)])
        return self.told

    def norms(self) -> list[float]:
        """The norms in the window, oldest first (read back: the checkpointed state, the form of
        :meth:`SpikeGuard.norms`)."""
        n, p = int(self.seen), int(self.pos)
        vals = self.window.cpu().tolist()
        return vals[:n] if n < SpikeGuard.WINDOW else vals[p:] + vals[:p]

    def load(self, norms: list[float]) -> None:
        """Restore the window from :meth:`norms` (its last :attr:`SpikeGuard.WINDOW` norms)."""
        vals = [float(x) for x in norms][-SpikeGuard.WINDOW:]
        self.window.fill_(math.nan)
        if vals:
            self.window[:len(vals)] = torch.tensor(vals, dtype=torch.float64)
        self.pos.fill_(len(vals) % SpikeGuard.WINDOW)
        self.seen.fill_(len(vals))
