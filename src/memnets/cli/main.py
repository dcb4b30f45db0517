"""The ``memnets`` command: one entry point, one module per subcommand.

Each subcommand module in :data:`SUBCOMMANDS` defines ``add_parser(subparsers)`` (which
registers its parser and sets ``func``); modules not shipped are skipped.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

__all__ = ["main", "build_parser", "SUBCOMMANDS", "add_device_option"]

SUBCOMMANDS = (
    "demo", "train", "eval", "table", "configs", "bench", "viz", "report", "capacity", "experiment",
    "suite", "data", "env",
)


JOBS = """which command for which job:
  train       one run: one model, one task, one seed, from a preset or a TOML file
  experiment  the runs behind one documented result (docs/results.md), one after the other
  suite       a grid of presets x seeds as resumable runs, then their tables
  eval, table, viz, report    a finished run: its scores, the tables of several, figures, one HTML page
first run and where to go next: README.md ("A first run") and docs/index.md"""


class UsageError(Exception):
    """Raised by subcommands for bad user input; printed without a traceback, exit 2."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memnets")
    except PackageNotFoundError:  # a source tree on sys.path without installed metadata
        import memnets

        return getattr(memnets, "__version__", "unknown")


def build_parser() -> argparse.ArgumentParser:
    ver = _version()
    parser = argparse.ArgumentParser(
        prog="memnets",
        description="Differentiable neural memories: train, evaluate, benchmark, visualise.",
        epilog=JOBS, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"memnets {ver}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(f"memnets.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"memnets.cli.{name}":
                continue
            raise
        mod.add_parser(sub)
    return parser


def add_device_option(p) -> None:
    """``--device DEVICE`` on a command whose runs take ``key=value`` overrides: the same as the
    override ``device=DEVICE`` (given last, so it wins)."""
    p.add_argument("--device", dest="device_override", default=None, metavar="DEVICE",
                   help="auto (CUDA when available, else CPU), cpu, cuda, cuda:N or mps; the same as the "
                        "override device=DEVICE")


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``, letting ``key=value`` overrides and options come in any order
    (``train P --device cpu max_steps=1``); an unknown option is the only one named in the error."""
    args, extra = parser.parse_known_args(argv)
    if not extra:
        return args
    sub = _subparser(parser, getattr(args, "command", None))
    unknown, loose, i = [], [], 0
    while i < len(extra):
        a = extra[i]
        if a.startswith("-") and len(a) > 1 and not a[1:2].isdigit():
            word = [a]
            if "=" not in a and i + 1 < len(extra) and not extra[i + 1].startswith("-") and "=" not in extra[i + 1]:
                word.append(extra[i + 1])  # its value, if it takes one
                i += 1
            unknown.append(" ".join(word))
        else:
            loose.append(a)
        i += 1
    many = [a for a in sub._actions if not a.option_strings and a.nargs in ("*", "+")
            and isinstance(getattr(args, a.dest, None), list)]
    if loose and many and not unknown:
        getattr(args, many[-1].dest).extend(loose)  # positionals after an option: e.g. more overrides
        loose = []
    if unknown or loose:
        sub.error(f"unrecognized arguments: {' '.join(unknown or loose)}")
    return args


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else list(argv)) == ["--version"]:
        # answered before the subcommands (and torch, which some of them import) are loaded
        print(f"memnets {_version()}")
        raise SystemExit(0)  # as argparse's version action does
    import warnings

    # a warning of memnets' own for the user (a renamed preset or backbone) reads as one line, not as
    # a source location; the warnings of other packages keep their usual form
    if not getattr(warnings.formatwarning, "_memnets", False):
        plain = warnings.formatwarning

        def formatwarning(message, category, filename, lineno, line=None):
            if f"{os.sep}memnets{os.sep}" in str(filename) and issubclass(category, (FutureWarning, DeprecationWarning)):
                return f"memnets: {category.__name__}: {message}\n"
            return plain(message, category, filename, lineno, line)

        formatwarning._memnets = True  # type: ignore[attr-defined]
        warnings.formatwarning = formatwarning
    parser = build_parser()
    args = _parse(parser, argv)
    if getattr(args, "device_override", None):
        args.overrides = [*args.overrides, f"device={args.device_override}"]
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
        sys.stdout.flush()  # a closed pipe surfaces here rather than at interpreter exit
    except BrokenPipeError:
        # the reader went away (`memnets configs ls | head -2`): stop quietly; stdout is pointed
        # at devnull so that the interpreter's final flush does not raise again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # stdout is not a file descriptor
            pass
        return 141  # 128 + SIGPIPE, what a shell reports for a command ended by it
    except (UsageError, ValueError, FileNotFoundError) as e:
        print(f"memnets {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"memnets {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    # `python -m memnets.cli.main`: run the imported module's `main`, so that the UsageError
    # raised by the subcommands (imported from memnets.cli.main) is the class caught here
    from memnets.cli.main import main as _main

    sys.exit(_main())
