"""``memnets configs ls|show <preset> [key=value ...]``: list and print the shipped presets."""
from __future__ import annotations

import json

__all__ = ["add_parser"]


def add_parser(sub) -> None:
    p = sub.add_parser("configs", help="list or show training presets", description=__doc__)
    cs = p.add_subparsers(dest="configs_cmd", metavar="ACTION")
    ls = cs.add_parser("ls", help="list presets with their descriptions")
    ls.add_argument("prefix", nargs="?", default="", help="only presets starting with this (e.g. cpu/)")
    ls.set_defaults(func=_ls)
    sh = cs.add_parser("show", help="print a preset's resolved config as JSON")
    sh.add_argument("preset", help="preset name or .toml path")
    sh.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides to apply first")
    sh.set_defaults(func=_show)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _ls(args) -> int:
    from ..train.config import list_presets, load_config

    names = [n for n in list_presets() if n.startswith(args.prefix)]
    width = max((len(n) for n in names), default=0)
    for n in names:
        print(f"{n.ljust(width)}  {load_config(n).description}")
    return 0


def _show(args) -> int:
    from ..train.config import ConfigError, config_to_dict, load_config
    from .main import UsageError

    try:
        cfg = load_config(args.preset, args.overrides)
    except ConfigError as e:
        raise UsageError(str(e)) from e
    print(json.dumps(config_to_dict(cfg), indent=2))
    return 0
