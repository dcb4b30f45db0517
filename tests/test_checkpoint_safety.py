"""Checkpoints through the public engine API: no pickled code runs, torn writes lose nothing,
a corrupt checkpoint is reported clearly, two processes cannot share a run directory."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memnets.train import RunExistsError, load_config, train
from memnets.train import checkpoint as ck
from memnets.train.checkpoint import RunLock, RunLockedError

TOML = """
name = "tiny"
seed = 1
epochs = 2
batch_size = 16
log_every = 1
checkpoint_every = 2
threads = 1
[model]
backbone = "bilstm"
d_model = 8
options = { num_layers = 1 }
[task]
name = "palindrome"
train_digits = [1, 3]
train_size = 64
eval_size = 16
splits = { id = [2, 3], od_easy = [4, 4], od_hard = [5, 5] }
[optim]
lr = 0.003
"""


def _cfg(tmp: Path):
    p = tmp / "tiny.toml"
    p.write_text(TOML)
    return load_config(p)


def _records(run_dir: Path) -> list[dict]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in recs:
        r.pop("samples_per_s", None)
        r.pop("wall_s", None)
    return recs


def _strip(res: dict) -> dict:
    return {k: v for k, v in res.items() if k != "wall_s"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted tiny run: (its directory, its results)."""
    tmp = tmp_path_factory.mktemp("ref")
    res = train(_cfg(tmp), tmp / "run", quiet=True)
    return tmp / "run", res


def _pointer(run_dir: Path) -> dict:
    return json.loads((run_dir / "checkpoints" / "last.json").read_text())


class _Payload:
    """Unpickling this would create ``path`` (a stand-in for arbitrary code)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _plant_payload(run_dir: Path, marker: Path) -> None:
    state_file = run_dir / "checkpoints" / _pointer(run_dir)["state"]
    buf = io.BytesIO()
    torch.save({"step": 8, "evil": _Payload(str(marker))}, buf)
    state_file.write_bytes(buf.getvalue())


def test_torch_load_is_called_weights_only(reference, tmp_path, monkeypatch):
    seen = []
    real = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(ck.torch, "load", spy)
    run_dir, _ = reference
    from memnets.train import build_model

    st = ck.load_checkpoint(run_dir / "checkpoints", build_model(_cfg(tmp_path)))
    assert seen == [True] and st["step"] == 8
    # the weights themselves are safetensors (no pickle at all)
    head = (run_dir / "checkpoints" / _pointer(run_dir)["weights"]).read_bytes()[:8]
    assert int.from_bytes(head, "little") < 10_000  # a safetensors header length, not a zip/pickle magic


def test_pickle_payload_in_checkpoint_is_not_executed(reference, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference[0], run_dir)
    (run_dir / "results.json").unlink()
    _only_last(run_dir)
    marker = tmp_path / "PWNED"
    _plant_payload(run_dir, marker)
    with pytest.raises(ck.CorruptCheckpointError) as e:
        train(_cfg(tmp_path), run_dir, resume=True, quiet=True)
    assert "weights_only" in str(e.value) or "Unsupported global" in str(e.value), str(e.value)[:500]
    assert not marker.exists()
    # the control: an unrestricted unpickler would have run the payload
    torch.load(run_dir / "checkpoints" / _pointer(run_dir)["state"], weights_only=False)
    assert marker.exists()


class _Crash(Exception):
    pass


def test_crash_before_the_pointer_keeps_the_previous_checkpoint(reference, tmp_path, monkeypatch):
    """A crash after the step files but before ``last.json`` moves: resume from the older one.

    A half-written temporary file is left behind as well. The resumed run must end exactly
    like the uninterrupted one.
    """
    ref_dir, ref_res = reference
    run_dir = tmp_path / "run"
    real = ck.atomic_write_text

    def crashing(path, text):
        if Path(path).name == "last.json" and json.loads(text)["step"] == 6:
            (Path(path).parent / ".last.json.partial.tmp").write_text(text[:7])
            raise _Crash("simulated power loss")
        return real(path, text)

    monkeypatch.setattr(ck, "atomic_write_text", crashing)
    with pytest.raises(_Crash):
        train(_cfg(tmp_path), run_dir, quiet=True)
    monkeypatch.setattr(ck, "atomic_write_text", real)
    assert _pointer(run_dir)["step"] == 4  # the commit point never moved past step 4
    assert (run_dir / "checkpoints" / "step-000000006.safetensors").exists()  # orphaned newer files
    res = train(_cfg(tmp_path), run_dir, resume=True, quiet=True)
    assert _strip(res) == _strip(ref_res)
    assert _records(run_dir) == _records(ref_dir)
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == [
        "step-000000006.safetensors", "step-000000006.state.pt",
        "step-000000008.safetensors", "step-000000008.state.pt"]


def test_crash_while_writing_weights_leaves_no_partial_file(reference, tmp_path, monkeypatch):
    ref_dir, ref_res = reference
    run_dir = tmp_path / "run"
    real = ck.save_file

    def torn(tensors, filename, metadata=None):
        if ".step-000000006.safetensors." in Path(filename).name:
            real(tensors, filename, metadata=metadata)
            with open(filename, "r+b") as f:  # half the bytes reached the disk
                f.truncate(100)
            raise _Crash("killed mid-write")
        real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(ck, "save_file", torn)
    with pytest.raises(_Crash):
        train(_cfg(tmp_path), run_dir, quiet=True)
    monkeypatch.setattr(ck, "save_file", real)
    ckdir = run_dir / "checkpoints"
    assert not list(ckdir.glob("*.tmp")), "a torn temporary file was left behind"
    assert _pointer(run_dir)["step"] == 4
    res = train(_cfg(tmp_path), run_dir, resume=True, quiet=True)
    assert _strip(res) == _strip(ref_res)


def _corrupt(run_dir: Path, which: str) -> Path:
    ptr = _pointer(run_dir)
    if which == "truncated-state":
        f = run_dir / "checkpoints" / ptr["state"]
        f.write_bytes(f.read_bytes()[:5000])
    elif which == "truncated-weights":
        f = run_dir / "checkpoints" / ptr["weights"]
        f.write_bytes(f.read_bytes()[:1000])
    elif which == "tampered-weights":
        f = run_dir / "checkpoints" / ptr["weights"]
        b = bytearray(f.read_bytes())
        b[10:20] = b"\xff" * 10
        f.write_bytes(bytes(b))
    else:
        f = run_dir / "checkpoints" / "last.json"
        f.write_text('{"step": 8, "weights": ')
    return f


def _only_last(run_dir: Path) -> None:
    """Remove the fallback checkpoint, so that the one named by last.json is the only one."""
    ptr = _pointer(run_dir)
    keep = {ptr["weights"], ptr["state"]}
    for p in (run_dir / "checkpoints").glob("step-*"):
        if p.name not in keep:
            p.unlink()


def test_the_previous_checkpoint_is_kept_as_a_fallback(reference):
    names = sorted(p.name for p in (reference[0] / "checkpoints").glob("step-*"))
    assert names == ["step-000000006.safetensors", "step-000000006.state.pt",
                     "step-000000008.safetensors", "step-000000008.state.pt"]


@pytest.mark.parametrize("which", ["truncated-state", "truncated-weights", "tampered-weights"])
def test_corrupt_checkpoint_gives_a_clear_error(reference, tmp_path, which):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference[0], run_dir)
    (run_dir / "results.json").unlink()
    _only_last(run_dir)
    bad = _corrupt(run_dir, which)
    with pytest.raises(ck.CorruptCheckpointError) as e:
        train(_cfg(tmp_path), run_dir, resume=True, quiet=True)
    assert isinstance(e.value, ValueError)
    assert bad.name in str(e.value) and "corrupt" in str(e.value)
    assert not (run_dir / "results.json").exists()


@pytest.mark.parametrize("which", ["truncated-state", "truncated-weights", "tampered-weights", "torn-pointer"])
def test_corrupt_checkpoint_falls_back_to_the_newest_that_loads(reference, tmp_path, which, capsys):
    """The resumed run says which file is corrupt and which checkpoint it used, and ends
    exactly like the uninterrupted run (the data order is a function of seed and epoch)."""
    import shutil

    ref_dir, ref_res = reference
    run_dir = tmp_path / "run"
    shutil.copytree(ref_dir, run_dir)
    (run_dir / "results.json").unlink()
    bad = _corrupt(run_dir, which)
    res = train(_cfg(tmp_path), run_dir, resume=True, quiet=True)
    err = capsys.readouterr().err
    assert bad.name in err and "corrupt" in err
    used = "step-000000008" if which == "torn-pointer" else "step-000000006"
    assert f"resuming from {used}" in err, err
    assert _strip(res) == _strip(ref_res)
    assert _records(run_dir) == _records(ref_dir)


def test_corrupt_pointer_with_no_step_files_is_a_clear_error(reference, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference[0], run_dir)
    for p in (run_dir / "checkpoints").glob("step-*"):
        p.unlink()
    bad = _corrupt(run_dir, "torn-pointer")
    with pytest.raises(ValueError, match="last.json is corrupt"):
        ck.load_checkpoint(run_dir / "checkpoints", torch.nn.Linear(1, 1))
    assert bad.exists()


def test_corrupt_checkpoint_is_refused_and_the_best_weights_stay_loadable(reference, tmp_path):
    """Whatever the message, a corrupt checkpoint is never silently used, and the separate
    ``best.safetensors`` is untouched and still loads."""
    import shutil

    from memnets.train import build_model

    run_dir = tmp_path / "run"
    shutil.copytree(reference[0], run_dir)
    (run_dir / "results.json").unlink()
    _only_last(run_dir)
    for which in ("truncated-state", "tampered-weights"):
        _corrupt(run_dir, which)
        with pytest.raises(ck.CorruptCheckpointError, match="is corrupt or truncated"):
            train(_cfg(tmp_path), run_dir, resume=True, quiet=True)
        assert not (run_dir / "results.json").exists()
        assert not (run_dir / "lock").exists()  # the failed process released the directory
    model = build_model(_cfg(tmp_path))
    ck.load_weights(run_dir / "checkpoints" / "best.safetensors", model)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_existing_run_is_not_overwritten(reference, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(reference[0], run_dir)
    before = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(RunExistsError, match="already holds a run; pass --resume"):
        train(_cfg(tmp_path), run_dir, quiet=True)
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_two_runs_in_one_directory_are_refused(tmp_path):
    """A live process holding the lock: the engine and the command line both refuse, clearly."""
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_dir.mkdir()
        (run_dir / "lock").write_text(str(holder.pid))
        with pytest.raises(RunLockedError, match=f"in use by process {holder.pid}"):
            train(_cfg(tmp_path), run_dir, quiet=True)
        from memnets.cli.main import main

        cfg_file = tmp_path / "tiny.toml"
        rc = main(["train", str(cfg_file), "--run-dir", str(run_dir), "--quiet"])
        assert rc == 2
        assert (run_dir / "lock").read_text() == str(holder.pid)  # the holder keeps it
        assert not (run_dir / "metrics.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    # once the holder is gone its stale lock is taken over
    with RunLock(run_dir):
        assert (run_dir / "lock").read_text() == str(os.getpid())
    assert not (run_dir / "lock").exists()


def test_eval_of_a_corrupt_run_is_a_usage_error(reference, tmp_path, capsys):
    import shutil

    from memnets.cli.main import main

    run_dir = tmp_path / "run"
    shutil.copytree(reference[0], run_dir)
    best = run_dir / "checkpoints" / "best.safetensors"
    best.write_bytes(best.read_bytes()[:500])
    try:
        rc = main(["eval", str(run_dir)])
    except Exception:
        rc = None
    assert rc == 2 and "best.safetensors" in capsys.readouterr().err


@pytest.mark.parametrize("text", ['{"name": "tiny", "epochs": ', '[1, 2]', '{"epochs": "many"}'])
def test_eval_of_a_malformed_config_is_a_usage_error(reference, tmp_path, capsys, text):
    import shutil

    from memnets.cli.main import main

    run_dir = tmp_path / "run"
    shutil.copytree(reference[0], run_dir)
    (run_dir / "config.json").write_text(text)
    rc = main(["eval", str(run_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and "config.json" in err and "Traceback" not in err


def test_eval_of_weights_that_do_not_fit_the_config_is_a_usage_error(reference, tmp_path, capsys):
    import shutil

    from memnets.cli.main import main

    run_dir = tmp_path / "run"
    shutil.copytree(reference[0], run_dir)
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["model"]["d_model"] = 12  # the saved weights have d_model 8
    (run_dir / "config.json").write_text(json.dumps(cfg))
    rc = main(["eval", str(run_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and "does not fit the model" in err and "best.safetensors" in err
