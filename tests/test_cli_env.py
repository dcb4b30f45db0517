"""``memnets env``: the versions, devices and fast paths of this machine, as lines or JSON."""
import json

import pytest
import torch

from memnets.cli.main import main


def _report(capsys, *args) -> str:
    assert main(["env", *args]) == 0
    return capsys.readouterr().out


def test_env_json_names_what_this_machine_runs(capsys, monkeypatch, tmp_path):
    from memnets.ops import _native
    from memnets.ops.gpu import triton_ok

    monkeypatch.setenv("MEMNETS_DATA", str(tmp_path))
    r = json.loads(_report(capsys, "--json"))
    assert r["torch"] == torch.__version__
    assert r["cuda_devices"] == ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                                 if torch.cuda.is_available() else [])
    assert r["c_kernels"] == _native.status() and set(r["c_kernels"]) == {"dnc", "gru", "lsam", "nam_tape", "nam_tm_heads", "ntm"}
    assert r["triton_kernels"] == triton_ok() and r["triton_minimum"] == "3.5"
    assert r["data_dir"] == str(tmp_path) and r["data_dir_from"] == "MEMNETS_DATA environment variable"


def test_env_lines_say_which_paths_run(capsys, monkeypatch):
    monkeypatch.setenv("MEMNETS_NATIVE", "0")
    monkeypatch.setenv("MEMNETS_TRITON", "0")
    out = _report(capsys)
    lines = {line[:12].strip(): line[12:] for line in out.splitlines()}  # a name, then its value
    assert set(lines) == {"memnets", "python", "torch", "numpy", "GPUs", "C kernels", "triton", "fla", "data"}
    assert lines["torch"].startswith(torch.__version__)
    assert lines["C kernels"].startswith("off (MEMNETS_NATIVE=0)")
    assert ("not installed" in lines["triton"]) or ("not used" in lines["triton"] and "MEMNETS_TRITON=0" in lines["triton"])


def test_env_says_an_older_triton_is_not_used(capsys, monkeypatch):
    from memnets.cli import env

    real = env.machine_report

    def older():
        r = real()
        r.update(triton="3.4.0", triton_kernels=False)
        return r
    monkeypatch.setattr(env, "machine_report", older)
    out = _report(capsys)
    assert "triton      3.4.0: memnets' kernels not used (they need >= 3.5" in out


def test_a_cuda_run_records_its_triton(monkeypatch):
    from memnets.ops import gpu
    from memnets.train.env import run_env

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    env = run_env(torch.device("cuda", 0))
    assert env["triton"] == gpu.triton_release() and env["triton_kernels"] == gpu.triton_ok()
    assert "native_kernels" not in env
    assert "triton" not in run_env(torch.device("cpu"))


def test_env_refuses_unknown_options(capsys):
    with pytest.raises(SystemExit):
        main(["env", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
