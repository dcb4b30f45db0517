"""Pure functions, no parameters, explicit state: the math of every memory in memnets."""
from .nam import unit, nam_read, nam_write, split_heads, merge_heads
from .delta import nam_scan, nam_step
from .delta import supports as nam_scan_supports, resolve_impl as nam_scan_resolve_impl
from .attention import nam_attention, nam_attention_quadratic, linear_attention, elu_feature_map
from .addressing import *  # noqa: F401,F403  NTM addressing (docs/maths.md §7)
from .addressing import __all__ as _addressing_all
from .dnc.equations import *  # noqa: F401,F403  DNC memory access (docs/maths.md §8)
from .dnc.equations import __all__ as _dnc_all

__all__ = [
    "unit", "nam_read", "nam_write", "split_heads", "merge_heads",
    "nam_scan", "nam_step", "nam_scan_supports", "nam_scan_resolve_impl",
    "nam_attention", "nam_attention_quadratic", "linear_attention", "elu_feature_map",
    *_addressing_all, *_dnc_all,
]
