"""Evaluating under ``torch.inference_mode()`` and then training: every registered model, in a
process of its own (the fast paths keep tensors for the process, pooled workspaces and index
tables, and one made first inside inference mode would be an inference tensor that training
can neither write into nor save for its backward). The evaluation gives the ``no_grad`` values;
training runs forward and backward after it, and again after a second evaluation."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = r'''
import sys
import torch
sys.path.insert(0, sys.argv[1])
from test_autocast import CASES
import memnets

bad = []
for name, (kw, inputs, out) in CASES.items():
    try:
        torch.manual_seed(0)
        model = memnets.build_model(name, **kw)
        xs = inputs(torch.Generator().manual_seed(0))
        model.eval()
        with torch.inference_mode():
            y_inf = out(model(*xs))
        with torch.no_grad():
            y_ref = out(model(*xs))
        assert torch.allclose(y_inf.float(), y_ref.float(), atol=1e-6), "inference_mode and no_grad values differ"
        model.train()
        for _ in range(2):
            out(model(*xs)).float().square().mean().backward()
            model.eval()
            with torch.inference_mode():
                out(model(*xs))
            model.train()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads), "no gradient, or one not finite"
    except Exception as e:  # noqa: BLE001 - reported below, with the model's name
        bad.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
print("\n".join(bad) if bad else "OK")
'''


def test_training_after_an_evaluation_in_inference_mode():
    here = Path(__file__).resolve().parent
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(here)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "OK", res.stdout
