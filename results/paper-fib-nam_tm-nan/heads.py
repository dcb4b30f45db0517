"""Reads the heads' inputs that probe.py saved at the first non-finite step and runs them again:
where the heads first go non-finite, their growth before, and the same inputs with the key tape
written at the unit head (normalize_heads = "all")."""
import torch

from memnets.ops.nam_tm_heads import nam_tm_heads

d = torch.load("/tmp/nan_heads.pt", weights_only=False)
a, k = d["args"], d["kwargs"]
Hs, _ = nam_tm_heads(*a, **k)
b, t, tn = (int(i) for i in (~torch.isfinite(Hs)).nonzero()[0, :3])
print(f"first non-finite head: sequence {b}, step {t}, tape {tn}")
print("largest |head| (read, write) at each step before:",
      [(f"{float(x[0]):.3g}", f"{float(x[1]):.3g}") for x in Hs[b, :t + 1, tn].abs().amax(-1)])
Hs2, K2 = nam_tm_heads(*a, **{**k, "unit_keys": True})
print(f"unit_keys=True: finite {bool(torch.isfinite(Hs2).all())}, largest |head| {float(Hs2.abs().max()):.3g}, "
      f"largest |key tape| {float(K2.abs().max()):.3g}")
