"""``memnets bench <suite>``: time implementations in one process and print ratios.

``memnets bench launches`` counts instead of timing: the ATen ops and Triton kernel launches
of one training step of each recurrent memory down its CUDA code path, on CPU tensors (no GPU
needed; Triton kernels run through Triton's interpreter, ``TRITON_INTERPRET=1``, which the
command sets for itself unless it is already set).
"""
from __future__ import annotations

import json
import os

__all__ = ["add_parser"]


def add_parser(sub) -> None:
    from ..bench.registry import SUITES
    from ..ops._impl import COMPILE_MODES

    p = sub.add_parser("bench", help="benchmark ops and models (ratios measured in one run)",
                       description=__doc__)
    p.add_argument("suite", choices=sorted(SUITES), help="which benchmark suite to run")
    p.add_argument("--json", metavar="PATH", nargs="?", const="-",
                   help="also write the result as JSON to PATH ('-' or no value: stdout)")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke test, not a measurement)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    lg = p.add_argument_group(
        "launches suite", "kernel launches of one training step (forward, backward, Adam) of LSAM (uni- and "
        "bidirectional), NAM-TM, DNC and NTM down their CUDA code path on CPU tensors: ATen ops that launch a "
        "kernel (views, metadata ops and allocations not counted) and Triton launches, per step and per time "
        "step. Sets TRITON_INTERPRET=1 (unless set) before triton is imported, so Triton kernels run through "
        "the interpreter; --device cuda counts the real CUDA path instead")
    lg.add_argument("--batch", type=int, default=None, help="launches suite: batch size B (default 4)")
    lg.add_argument("--length", type=int, default=None,
                    help="launches suite: sequence length T, even (default 16; T/2 is also run for the "
                         "marginal count per time step)")
    lg.add_argument("--models", nargs="+", default=None, choices=["LSAM", "LSAM bi", "NAM-TM", "DNC", "NTM"],
                    help="launches suite: which memories (default: all)")
    lg.add_argument("--count-bench-lengths", action="store_true",
                    help="launches suite: count each memory once more at the length the GPU bench trains it at "
                         "(LSAM 100, NAM-TM 50, DNC and NTM 41) for per_t_bench, instead of computing it from the "
                         "counts at T and T/2 (slow under the interpreter: minutes a model)")
    g = p.add_argument_group("gpu suite")
    g.add_argument("--out", metavar="PATH", help="write the result as JSON to PATH (like --json PATH)")
    g.add_argument("--device", default=None,
                   help="device for the gpu suite (default: cuda if available); launches suite: cpu (default) "
                        "or cuda")
    g.add_argument("--tiny", action="store_true",
                   help="gpu and launches suites: tiny sizes so that it runs anywhere (a smoke test of the code)")
    g.add_argument("--sections", nargs="+", choices=["scan", "attention", "models"], default=None,
                   help="gpu suite: which sections to run (default: all)")
    g.add_argument("--max-seconds", type=float, default=330.0,
                   help="gpu suite: time budget; rows left when a section's share is spent are skipped")
    g.add_argument("--compile", nargs="+", metavar="MODE", default=None,
                   choices=COMPILE_MODES,
                   help="gpu suite: also time LSAM, DNC and NAM-TM under torch.compile in these modes")
    p.set_defaults(func=_run)


def _run(args) -> int:
    if args.suite == "launches" and (args.device or "cpu").startswith("cpu"):
        # before anything imports triton: its kernels are decorated for the interpreter at import
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from ..bench.registry import format_table, run_suite

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.suite == "launches":
        from ..bench import launches
        from ..bench.registry import bench_env

        if args.sections or args.compile:
            raise SystemExit("--sections and --compile belong to the gpu suite")
        try:
            result = launches.run(quick=args.quick, batch=4 if args.batch is None else args.batch,
                                  length=16 if args.length is None else args.length,
                                  models=tuple(args.models) if args.models else None,
                                  device=args.device or "cpu", tiny=args.tiny, verbose=args.json != "-",
                                  bench_counted=args.count_bench_lengths)
        except ValueError as e:
            raise SystemExit(f"memnets bench launches: {e}")
        result["env"] = bench_env()
    elif args.batch is not None or args.length is not None or args.models or args.count_bench_lengths:
        raise SystemExit("--batch, --length, --models and --count-bench-lengths belong to the launches suite")
    elif args.suite == "gpu":
        from ..bench import gpu
        from ..bench.registry import bench_env

        opts = dict(device=args.device, tiny=args.tiny, max_seconds=args.max_seconds,
                    compile_modes=tuple(args.compile or ()))
        if args.sections:
            opts["sections"] = tuple(s for s in gpu.SECTIONS if s in args.sections)
        result = gpu.run(quick=args.quick, verbose=args.json != "-", **opts)
        result["env"] = bench_env()
    else:
        if args.out or args.device or args.tiny or args.sections or args.compile:
            raise SystemExit("--out, --device, --tiny, --sections and --compile belong to the gpu suite")
        result = run_suite(args.suite, quick=args.quick)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    if args.json == "-":
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    return 0
