import sys, torch
from memnets.memories import nam_tm as M

def wrap(name, fn):
    def w(*a, **k):
        out = fn(*a, **k)
        outs = out if isinstance(out, tuple) else (out,)
        bad = [i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.is_floating_point() and not torch.isfinite(o).all()]
        if bad:
            torch.save({"args": [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in a], "kwargs": k}, f"/tmp/nan_{name}.pt")
            fin = [bool(torch.isfinite(x).all()) if isinstance(x, torch.Tensor) and x.is_floating_point() else None for x in a]
            print("NONFINITE from", name, "outputs", bad, "inputs finite", fin, flush=True)
            raise RuntimeError("nan probe2")
        return out
    return w

M.nam_tm_heads = wrap("heads", M.nam_tm_heads)
M.nam_tape.nam_tape_scan = wrap("tape", M.nam_tape.nam_tape_scan)
M.nam_scan = wrap("scan", M.nam_scan)
from memnets.cli.main import main
sys.exit(main(sys.argv[1:]))
