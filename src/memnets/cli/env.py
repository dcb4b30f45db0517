"""``memnets env``: what this machine runs memnets with, for a bug report or a slow run.

The versions (memnets, Python, torch, NumPy, triton, flash-linear-attention), the devices, and
which fast path each memory takes here: on the CPU the C kernels (:mod:`memnets.ops._native`,
built on first use with the system C compiler, or their PyTorch paths where they do not load),
on CUDA memnets' Triton kernels (:mod:`memnets.ops.gpu`, which need triton >=
:data:`memnets.ops.gpu.MIN_TRITON`) and fla's for ``nam_scan``; and the data directory.
``--json`` prints the same as one JSON object (:func:`machine_report`).
"""
from __future__ import annotations

import json
import os
import sys
import warnings

__all__ = ["add_parser", "machine_report"]


def _quietly(fn):
    """``fn()`` without the warnings it may give (the report says the same in its own words;
    importing fla on a machine without a GPU warns that it falls back to the CPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def machine_report() -> dict:
    """The report of ``memnets env`` as a dict (every key always present; None where a thing
    is not installed or not there)."""
    import importlib.util
    import platform

    import torch

    import memnets

    from ..datadir import locate_data_dir
    from ..ops import _native
    from ..ops.delta.fla_backend import fla_version
    from ..ops.gpu import MIN_TRITON, triton_ok, triton_release
    from .main import _version

    try:
        import numpy
        numpy_version = numpy.__version__
    except ImportError:
        numpy_version = None
    triton_text = triton_release()
    if triton_text is None and importlib.util.find_spec("triton") is not None:
        triton_text = "unknown version"
    cuda = torch.cuda.is_available()
    data_dir, data_why = locate_data_dir()
    return {
        "memnets": _version(),
        "memnets_path": str(memnets.__file__),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "numpy": numpy_version,
        "threads": torch.get_num_threads(),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "cuda_version": torch.version.cuda,
        "c_kernels": _native.status() if _native.enabled() else {},
        "c_kernels_switched_off": not _native.enabled(),
        "c_kernel_cache": str(_native.cache_dir()),
        "triton": triton_text,
        "triton_minimum": "{}.{}".format(*MIN_TRITON),
        "triton_kernels": _quietly(triton_ok),
        "fla": _quietly(fla_version),  # what nam_scan finds: None where fla is missing or does not import
        "data_dir": os.path.normpath(data_dir),
        "data_dir_from": data_why,
    }


def _lines(r: dict) -> list[str]:
    c = r["c_kernels"]
    if r["c_kernels_switched_off"]:
        c_line = "off (MEMNETS_NATIVE=0): the NAM-TM, its GRU, LSAM and the DNC's access run their PyTorch paths"
    elif c and all(c.values()):
        c_line = f"{', '.join(c)} load (built into {r['c_kernel_cache']})"
    else:
        bad = [k for k, ok in c.items() if not ok]
        c_line = (f"{', '.join(bad)} do not load (no C compiler, or a failed build): their PyTorch paths run, "
                  "1.5 to 2 times as slowly")
    if r["triton"] is None:
        t_line = "not installed: on CUDA the recurrent memories run their PyTorch paths (pip install 'memnets[gpu]')"
    elif r["triton_kernels"]:
        t_line = f"{r['triton']}: memnets' kernels run on CUDA"
    else:
        t_line = (f"{r['triton']}: memnets' kernels not used (they need >= {r['triton_minimum']}, or MEMNETS_TRITON=0)")
    devices = ", ".join(r["cuda_devices"]) if r["cuda_devices"] else "none (CUDA not available)"
    return [
        f"memnets     {r['memnets']} ({r['memnets_path']})",
        f"python      {r['python']} on {r['platform']}",
        f"torch       {r['torch']}, {r['threads']} threads" + (f", CUDA {r['cuda_version']}" if r["cuda_version"] else ""),
        f"numpy       {r['numpy'] or 'not installed'}",
        f"GPUs        {devices}",
        f"C kernels   {c_line}",
        f"triton      {t_line}",
        f"fla         {r['fla'] or 'not installed or not usable (nam_scan on CUDA: the chunked PyTorch path)'}",
        f"data        {r['data_dir']} ({r['data_dir_from']}; memnets data where)",
    ]


def _run(args) -> int:
    report = machine_report()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(_lines(report)))
    sys.stdout.flush()
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("env", help="versions, devices and the fast paths memnets takes on this machine",
                       description=__doc__)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.set_defaults(func=_run)
