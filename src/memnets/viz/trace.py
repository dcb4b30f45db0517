"""Record what a memory does on one input: weightings, usage, links, tape heads, gates.

:func:`memory_trace` runs a memory module (NTM, DNC, NAM Turing Machine, LSAM) on an input
``x [B, T, F]`` without gradients and returns its output with the per-step internals as a plain
``dict`` of tensors, batch first. NTM / DNC / NAM-TM traces come from their own
``forward(..., return_aux=True)``; the LSAM fast path keeps no per-step gates, so
:func:`lsam_gates` replays it step by step from its parameters (docs/maths.md §2) and returns the
gates together with the replayed output (which must equal ``LSAM.forward``).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..ops import merge_heads, nam_read, nam_write, split_heads, unit

__all__ = ["memory_kind", "memory_trace", "lsam_gates", "collect_lsam_gates", "record_module_inputs", "aux_to_dict"]


def aux_to_dict(aux: Any) -> dict[str, torch.Tensor]:
    """A NamedTuple / dict / object of tensors as ``{name: tensor}`` (non-tensors dropped)."""
    if hasattr(aux, "_asdict"):
        items = aux._asdict().items()
    elif isinstance(aux, dict):
        items = aux.items()
    else:
        items = vars(aux).items()
    return {k: v for k, v in items if isinstance(v, torch.Tensor)}


def memory_kind(module: torch.nn.Module) -> str | None:
    """``"ntm" | "dnc" | "nam_tm" | "lsam"`` for the memory classes of memnets, else ``None``."""
    names = {"NTM": "ntm", "DNC": "dnc", "NAMTuringMachine": "nam_tm", "LSAM": "lsam"}
    for cls in type(module).__mro__:
        if cls.__name__ in names and cls.__module__.startswith("memnets."):
            return names[cls.__name__]
    return None


@torch.no_grad()
def lsam_gates(lsam: torch.nn.Module, x: torch.Tensor, state=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Replay an :class:`~memnets.memories.lsam.LSAM` on ``x`` (``[B, T, input_size]``, or
    ``[T, B, ·]`` when the module is not batch first) step by step and return
    ``(output [B, T, D], gates)``.

    ``gates`` maps ``"layer l <dir> p_r"`` / ``"... p_w"`` (``dir`` = ``fwd`` or ``bwd``) to
    ``[B, T, H']`` values in [0, 1], indexed by input time for both directions (docs/maths.md §2:
    ``(p_r, p_w) = σ(W_rw [x_t : h_{t-1}] + b_rw)``). ``state``: the module's initial
    ``LSAMState`` (default zeros). Dropout is not applied (evaluation mode).
    """
    if not lsam.batch_first:
        x = x.transpose(0, 1)  # [B, T, F]
    B, T, _ = x.shape
    dirs, H = lsam.num_directions, lsam.num_heads // lsam.num_directions
    D = lsam.hidden_size // dirs
    d = D // H
    gates: dict[str, torch.Tensor] = {}
    inp = x
    for layer in range(lsam.num_layers):
        w_ih, w_hh, bias = lsam.layer_weights(layer)
        outs = []
        for j in range(dirs):
            w = torch.cat([w_ih[j], w_hh[j]], dim=1)  # [G, in + D]
            if state is None:
                M, h = x.new_zeros(B, H, d, d), x.new_zeros(B, D)
            else:
                M, h = state.memory[layer * dirs + j], state.h[layer * dirs + j]  # [B, H, d, d], [B, D]
            hs, prs, pws = [None] * T, [None] * T, [None] * T
            for t in (range(T) if j == 0 else range(T - 1, -1, -1)):
                g = F.linear(torch.cat([inp[:, t], h], dim=-1), w, bias[j])  # [B, G]
                q, k, v, a_r, a_w = g.split([D, D, D, H, H], dim=-1)
                p_r, p_w = torch.sigmoid(a_r), torch.sigmoid(a_w)  # [B, H]
                M = nam_write(M, unit(split_heads(k, H)), split_heads(v, H), p_w, p_w)
                h = merge_heads(nam_read(M, unit(split_heads(q, H)), p_r))  # [B, D]
                hs[t], prs[t], pws[t] = h, p_r, p_w
            name = f"layer {layer} {'fwd' if j == 0 else 'bwd'}"
            gates[f"{name} p_r"] = torch.stack(prs, 1)  # [B, T, H]
            gates[f"{name} p_w"] = torch.stack(pws, 1)  # [B, T, H]
            outs.append(torch.stack(hs, 1))  # [B, T, D]
        inp = torch.cat(outs, dim=-1)  # [B, T, dirs*D]
    return inp, gates


@torch.no_grad()
def memory_trace(memory: torch.nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Run ``memory`` on ``x [B, T, F]`` and return ``{"kind", "output", <per-step traces>}``.

    Traces (all batch first, ``[B, T, ...]``):

    * NTM (docs/maths.md §7): ``read_weights [B,T,R,N]``, ``write_weights [B,T,Hw,N]``, ``erase``, ``add``;
    * DNC (docs/maths.md §8): ``read_weights [B,T,R,N]``, ``write_weights [B,T,N]``, ``usage [B,T,N]``,
      ``link [B,T,N,N]``, ``read_modes [B,T,R,3]``;
    * NAM-TM (docs/maths.md §3): the fields of its aux record (head positions ``[B,T,tapes,L]``,
      action probabilities, gates);
    * LSAM (docs/maths.md §2): ``gates`` — see :func:`lsam_gates`.

    Raises ValueError for a module that is none of these.
    """
    kind = memory_kind(memory)
    if kind is None:
        raise ValueError(f"`memory` expected an NTM, DNC, NAMTuringMachine or LSAM, got {type(memory).__name__}")
    was = memory.training
    memory.eval()
    try:
        if kind == "lsam":
            y, gates = lsam_gates(memory, x)
            return {"kind": kind, "output": y, "gates": gates}
        out = memory(x, return_aux=True)
        y, aux = out[0], out[-1]
        return {"kind": kind, "output": y, **aux_to_dict(aux)}
    finally:
        memory.train(was)


def record_module_inputs(model: torch.nn.Module, select, *inputs, **kwargs) -> list[tuple]:
    """Run ``model(*inputs, **kwargs)`` in eval mode and return ``(name, module, args, kwargs)``
    of every call of a submodule with ``select(module)`` true (forward pre-hooks, removed after)."""
    calls: list[tuple] = []
    hooks = [mod.register_forward_pre_hook(lambda m, a, kw, name=name: calls.append((name, m, a, kw)),
                                           with_kwargs=True)
             for name, mod in model.named_modules() if select(mod)]
    was = model.training
    model.eval()
    try:
        model(*inputs, **kwargs)
    finally:
        model.train(was)
        for h in hooks:
            h.remove()
    return calls


@torch.no_grad()
def collect_lsam_gates(model: torch.nn.Module, *inputs, **kwargs) -> dict[str, torch.Tensor]:
    """Run ``model(*inputs, **kwargs)`` and return the gates of every LSAM inside it, replayed
    from the exact input and initial state each one received (forward pre-hooks):
    ``{"<module name> <gate name>": [B, T, H']}`` (gate names as in :func:`lsam_gates`)."""
    out = {}
    for name, mod, args, kw in record_module_inputs(model, lambda m: memory_kind(m) == "lsam", *inputs, **kwargs):
        state = args[1] if len(args) > 1 else kw.get("state")
        for key, g in lsam_gates(mod, args[0], state)[1].items():
            out[f"{name} {key}".strip()] = g
    return out
