"""``memnets bench <suite>``: time implementations in one process and print ratios."""
from __future__ import annotations

import json

__all__ = ["add_parser"]


def add_parser(sub) -> None:
    from ..bench.registry import SUITES

    p = sub.add_parser("bench", help="benchmark ops and models (ratios measured in one run)",
                       description=__doc__)
    p.add_argument("suite", choices=sorted(SUITES), help="which benchmark suite to run")
    p.add_argument("--json", metavar="PATH", nargs="?", const="-",
                   help="also write the result as JSON to PATH ('-' or no value: stdout)")
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke test, not a measurement)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    import torch

    from ..bench.registry import format_table, run_suite

    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_suite(args.suite, quick=args.quick)
    if args.json == "-":
        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    return 0
