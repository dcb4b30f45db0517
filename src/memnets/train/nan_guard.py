"""Catch a non-finite loss, parameter or gradient at the step it first appears.

:func:`check_finite` looks at the loss, then every parameter, then every gradient of a
model (in ``named_parameters`` order) and reports the first tensor holding a NaN or an
infinity. With ``policy="raise"`` it raises :class:`NonFiniteError` naming the step and
the tensor; with ``policy="skip"`` it returns ``False`` so the caller can drop the update
(e.g. skip ``optimizer.step()`` and zero the gradients). Each check costs one reduction
per tensor and one host sync, so call it every step only when debugging or every few
steps otherwise.

Example::

    loss.backward()
    if check_finite(loss, model, step, policy="skip"):
        opt.step()
    opt.zero_grad(set_to_none=True)
"""
from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["NonFiniteError", "check_finite", "first_non_finite"]

_POLICIES = ("raise", "skip")


class NonFiniteError(FloatingPointError):
    """A NaN or infinity in the loss, a parameter or a gradient.

    Attributes: ``step`` (int or None), ``name`` (``"loss"``, ``"<param>"`` or
    ``"<param>.grad"``), ``kind`` (``"loss"``, ``"parameter"`` or ``"gradient"``),
    ``n_nan`` and ``n_inf`` (element counts in that tensor).
    """

    def __init__(self, step: int | None, name: str, kind: str, n_nan: int, n_inf: int) -> None:
        self.step, self.name, self.kind, self.n_nan, self.n_inf = step, name, kind, n_nan, n_inf
        at = f"step {step}" if step is not None else "an unnamed step"
        super().__init__(f"non-finite {kind} `{name}` at {at}: {n_nan} NaN and {n_inf} Inf values")


def _bad(t: torch.Tensor) -> tuple[int, int] | None:
    """(NaN count, Inf count) of ``t`` if it has any non-finite value, else None."""
    if not (t.is_floating_point() or t.is_complex()):
        return None
    t = t.detach()
    if bool(torch.isfinite(t).all()):
        return None
    return int(torch.isnan(t).sum()), int(torch.isinf(t).sum())


def first_non_finite(
    loss: torch.Tensor | float | None,
    named_parameters: Iterable[tuple[str, torch.Tensor]] = (),
) -> tuple[str, str, int, int] | None:
    """The first non-finite tensor as ``(name, kind, n_nan, n_inf)``, or None if all are finite.

    Order: ``loss``; all parameters; then all gradients (``<name>.grad``). ``loss`` may be a
    tensor of any shape, a Python number or None (skipped).
    """
    if loss is not None:
        lt = loss if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        bad = _bad(lt)
        if bad:
            return ("loss", "loss", *bad)
    params = list(named_parameters)
    for name, p in params:
        bad = _bad(p)
        if bad:
            return (name, "parameter", *bad)
    for name, p in params:
        if p.grad is not None:
            bad = _bad(p.grad)
            if bad:
                return (f"{name}.grad", "gradient", *bad)
    return None


def check_finite(
    loss: torch.Tensor | float | None,
    model: torch.nn.Module | None = None,
    step: int | None = None,
    *,
    policy: str = "raise",
) -> bool:
    """True when ``loss`` and ``model``'s parameters and gradients are all finite.

    Otherwise: ``policy="raise"`` raises :class:`NonFiniteError` naming ``step`` and the first
    non-finite tensor (loss first, then parameters, then gradients, each by name);
    ``policy="skip"`` returns False. ``model=None`` checks the loss only.
    """
    if policy not in _POLICIES:
        raise ValueError(f"`policy` expected one of {list(_POLICIES)}, got {policy!r}")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"`model` expected a torch.nn.Module or None, got {type(model).__name__}")
    found = first_non_finite(loss, model.named_parameters() if model is not None else ())
    if found is None:
        return True
    if policy == "raise":
        name, kind, n_nan, n_inf = found
        raise NonFiniteError(step, name, kind, n_nan, n_inf)
    return False
