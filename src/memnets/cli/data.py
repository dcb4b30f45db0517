"""``memnets data download|verify|where``: get the real datasets, check them, see which are found.

``download [NAME ...] --to DIR`` fetches bAbI, Omniglot and IMDB (all three by default) from
their official URLs into the layout the loaders read (``DIR/babi/tasks_1-20_v1-2.tar.gz``,
``DIR/omniglot/images_{background,evaluation}.zip`` and ``splits/vinyals/*.txt``,
``DIR/imdb/aclImdb_v1.tar.gz``), checking each file's SHA-256 before it gets its final name;
an interrupted download resumes when the command is run again. Train with ``--data-dir DIR``
(or ``export MEMNETS_DATA=DIR``) afterwards.

``verify`` checks every known file present in the data directory (against its SHA256SUMS
when that lists the file, else against the official digest) and exits 1 if any is bad.
``where`` says which data directory is used and why, what is found there, and the command
that fetches what is missing.
"""
from __future__ import annotations

import argparse
import shlex
import sys

__all__ = ["add_parser"]

EPILOG = """examples:
  memnets data where
  memnets data download --to data                  # all three datasets into ./data
  memnets data download babi imdb --to data --unpack
  memnets data verify --data-dir data
  MEMNETS_DATA_MIRROR=http://mirror.example memnets data download omniglot --to data
A download that breaks off leaves <file>.part; the same command resumes it."""


def add_parser(sub) -> None:
    from ..data_download import DATASETS, MIRROR_ENV

    p = sub.add_parser("data", help="download, verify and locate the real datasets (bAbI, Omniglot, IMDB)",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ds = p.add_subparsers(dest="data_cmd", metavar="ACTION")
    d = ds.add_parser("download", help="download datasets from their official URLs, SHA-256 checked",
                      epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("names", nargs="*", metavar="NAME", help=f"datasets to get: {', '.join(DATASETS)} (default: all)")
    d.add_argument("--to", required=True, metavar="DIR", help="data directory to fill (created if needed)")
    d.add_argument("--url-base", default=None, metavar="URL",
                   help=f"replace the scheme and host of every URL with this (a mirror; default ${MIRROR_ENV})")
    d.add_argument("--unpack", action="store_true",
                   help="also unpack each archive beside it (atomically; the archive is kept)")
    d.add_argument("--timeout", type=float, default=60.0, help="network timeout in seconds (default 60)")
    d.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    d.set_defaults(func=_download)
    v = ds.add_parser("verify", help="check the files of a data directory against their SHA-256")
    v.add_argument("--data-dir", default=None, help="data directory (default $MEMNETS_DATA, else ../shared/data)")
    v.set_defaults(func=_verify)
    w = ds.add_parser("where", help="which data directory is used, what is found, how to get the rest")
    w.add_argument("--data-dir", default=None, help="data directory (default $MEMNETS_DATA, else ../shared/data)")
    w.set_defaults(func=_where)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _download(args) -> int:
    import difflib

    from ..data_download import DATASETS, download
    from .main import UsageError

    for n in args.names:
        if n not in DATASETS:
            close = difflib.get_close_matches(n, DATASETS, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UsageError(f"unknown dataset {n!r}{hint} (datasets: {', '.join(DATASETS)})")
    if args.timeout <= 0:
        raise UsageError(f"--timeout expected a positive number of seconds, got {args.timeout}")
    download(args.names, args.to, url_base=args.url_base, do_unpack=args.unpack, timeout=args.timeout,
             progress=not args.quiet and sys.stderr.isatty(), log=print)
    to = shlex.quote(str(args.to))
    print(f"data ready in {to}: train with --data-dir {to} (or export MEMNETS_DATA={to}); "
          f"`memnets data verify --data-dir {to}` checks it again")
    return 0


def _verify(args) -> int:
    from ..data_download import verify_dir
    from ..datadir import resolve_data_dir

    root = resolve_data_dir(args.data_dir)
    print(f"data directory: {root}")
    results = verify_dir(root)
    for r in results:
        print(r.line())
    bad = [r for r in results if r.bad]
    checked = sum(r.status == "ok" for r in results)
    if bad:
        print(f"{len(bad)} file(s) do not match their SHA-256: {', '.join(r.path for r in bad)}", file=sys.stderr)
        return 1
    print(f"{checked} file(s) verified, none bad")
    return 0


def _where(args) -> int:
    from ..data_download import where_lines

    for line in where_lines(args.data_dir):
        print(line)
    return 0
