"""``memnets configs ls|show|keys``: list and print the shipped presets, and every config key.

    memnets configs ls [PREFIX]
    memnets configs show PRESET|FILE.toml [key=value ...] [--toml]
    memnets configs keys [--markdown]
"""
from __future__ import annotations

import json

__all__ = ["add_parser"]


def add_parser(sub) -> None:
    import argparse

    p = sub.add_parser("configs", help="list or show training presets and config keys", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    cs = p.add_subparsers(dest="configs_cmd", metavar="ACTION")
    ls = cs.add_parser("ls", aliases=["list"], help="list presets with their descriptions")
    ls.add_argument("prefix", nargs="?", default="", help="only presets starting with this (e.g. cpu/)")
    ls.set_defaults(func=_ls)
    sh = cs.add_parser("show", help="print a preset's resolved config as JSON (or TOML)")
    sh.add_argument("preset", nargs="?", help="preset name (see `memnets configs ls`) or .toml path")
    sh.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides to apply first")
    sh.add_argument("--toml", action="store_true",
                    help="print TOML that `memnets train FILE.toml` accepts, instead of JSON")
    sh.set_defaults(func=_show)
    ks = cs.add_parser("keys", help="every config key with its type, default and meaning")
    ks.add_argument("--markdown", action="store_true", help="a Markdown table (the one in docs/config.md)")
    ks.set_defaults(func=_keys)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _ls(args) -> int:
    from ..train.config import list_presets, load_config

    names = [n for n in list_presets() if n.startswith(args.prefix)]
    width = max((len(n) for n in names), default=0)
    for n in names:
        print(f"{n.ljust(width)}  {load_config(n).description}")
    return 0


def _show(args) -> int:
    from ..train.config import ConfigError, config_to_dict, config_to_toml, load_config
    from .main import UsageError

    if not args.preset:
        raise UsageError("expected a preset name or a .toml path, e.g. `memnets configs show cpu/reduce-nam_tm` "
                         "(`memnets configs ls` lists the presets, `memnets configs keys` the keys)")
    try:
        cfg = load_config(args.preset, args.overrides)
    except ConfigError as e:
        raise UsageError(str(e)) from e
    if args.toml:
        print(config_to_toml(cfg), end="")
    else:
        print(json.dumps(config_to_dict(cfg), indent=2))
    return 0


def _keys(args) -> int:
    from ..train.config import keys_markdown, keys_text

    print(keys_markdown() if args.markdown else keys_text())
    return 0
