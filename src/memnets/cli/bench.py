"""``memnets bench <suite>``: time implementations in one process and print ratios."""
from __future__ import annotations

import json

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
    g = p.add_argument_group("gpu suite")
    g.add_argument("--out", metavar="PATH", help="write the result as JSON to PATH (like --json PATH)")
    g.add_argument("--device", default=None, help="device for the gpu suite (default: cuda if available)")
    g.add_argument("--tiny", action="store_true",
                   help="gpu suite: tiny sizes so that it runs anywhere (a smoke test of the code)")
    g.add_argument("--sections", nargs="+", choices=["scan", "attention", "models"], default=None,
                   help="gpu suite: which sections to run (default: all)")
    g.add_argument("--max-seconds", type=float, default=330.0,
                   help="gpu suite: time budget; rows left when a section's share is spent are skipped")
    g.add_argument("--compile", nargs="+", metavar="MODE", default=None,
                   choices=COMPILE_MODES,
                   help="gpu suite: also time LSAM, DNC and NAM-TM under torch.compile in these modes")
    p.set_defaults(func=_run)


def _run(args) -> int:
    import torch

    from ..bench.registry import format_table, run_suite

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.suite == "gpu":
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
