"""DNC ops (docs/maths.md §8; Graves et al. 2016).

- :mod:`~memnets.ops.dnc.equations`: the memory access, one function per equation (the
  reference; ``DNC(impl="reference")``).
- :mod:`~memnets.ops.dnc.step`: one access step regrouped into fewer ops, the write / link /
  precedence / directional updates in one autograd node (``DNC(impl="fused")``, per step).
- :mod:`~memnets.ops.dnc.recurrence`: :class:`DNCRecurrence`, the whole recurrence over a
  sequence as one autograd Function with a hand-derived backward (``DNC(impl="fused")``,
  ``forward``), with :mod:`~memnets.ops.dnc.forward`, :mod:`~memnets.ops.dnc.backward`, its
  buffers in :mod:`~memnets.ops.dnc.workspace` and the interface row layout in
  :mod:`~memnets.ops.dnc.layout`.
"""
from .equations import *  # noqa: F401,F403
from .equations import __all__ as _equations_all
from .layout import interface_layout, interface_permutation
from .recurrence import DNCRecurrence
from .step import WriteLink, dnc_access_fused, interface_sizes
from .workspace import clear_workspaces

__all__ = [*_equations_all, "DNCRecurrence", "WriteLink", "dnc_access_fused", "interface_sizes",
           "interface_layout", "interface_permutation", "clear_workspaces"]
