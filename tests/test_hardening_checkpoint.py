"""A checkpoint that cannot be written (here a file-size limit, as on a full disk) ends in one
line saying that the last good checkpoint is kept, leaves nothing of itself behind, and the
kept checkpoint still loads."""
import json
import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent("""
    import json, resource, sys
    import torch
    from memnets.train import checkpoint as ck
    d = sys.argv[1]
    torch.manual_seed(0)
    small = torch.nn.Linear(4, 4)
    out = {}
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # bytes per file, as `ulimit -f`
    ck.save_checkpoint(d, 1, small, {"step": 1})
    try:
        ck.save_checkpoint(d, 2, small, {"step": 2, "blob": torch.zeros(100_000)})  # 400 kB of state
    except ck.CheckpointWriteError as e:
        out["state"] = [str(e), e.last_step, isinstance(e, OSError)]
    big = torch.nn.Linear(300, 300)  # 360 kB of weights
    try:
        ck.save_checkpoint(d, 3, big, {"step": 3})
    except ck.CheckpointWriteError as e:
        out["weights"] = [str(e), e.last_step]
    try:
        ck.save_weights(d + "/best.safetensors", big)
    except ck.CheckpointWriteError as e:
        out["best"] = [str(e), e.last_step]
    import os
    out["files"] = sorted(os.listdir(d))
    out["loaded"] = ck.load_checkpoint(d, small)["step"]
    print(json.dumps(out))
""")


def test_a_full_disk_keeps_the_last_good_checkpoint(tmp_path):
    d = tmp_path / "checkpoints"
    res = subprocess.run([sys.executable, "-c", _CHILD, str(d)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for key in ("state", "weights", "best"):
        msg, last = out[key][:2]
        assert "\n" not in msg and "the last good checkpoint (step 1) is kept" in msg, msg
        assert "File too large" in msg and last == 1
    assert out["state"][2]  # an OSError (and a ValueError, for the command line's one-line errors)
    assert "step 2" in out["state"][0] and "step 3" in out["weights"][0]
    assert out["files"] == ["last.json", "step-000000001.safetensors", "step-000000001.state.pt"]
    assert out["loaded"] == 1


@pytest.mark.slow
def test_train_on_a_full_disk_says_so_in_one_line(tmp_path):
    script = ("ulimit -f 60; exec " + sys.executable + " -m memnets.cli.main train cpu/reduce-lstm epochs=1 "
              "task.train_size=32 batch_size=16 task.eval_size=16 log_every=1 threads=1 model.d_model=64 "
              f"--run-dir {tmp_path / 'run'} --quiet")
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600)
    assert res.returncode == 2
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert "Traceback" not in res.stderr and len(lines) == 1, res.stderr[-3000:]
    assert "File too large" in lines[0] and ("is kept" in lines[0] or "nothing was written" in lines[0])
