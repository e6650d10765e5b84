"""`webagent config show|check`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from runtime.config import dump_config, load_config


def register(sub: Any) -> None:
    parser = sub.add_parser("config", help="show or check the configuration")
    cmds = parser.add_subparsers(title="config commands", metavar="ACTION", required=True)

    show = cmds.add_parser("show", help="print the effective configuration as TOML")
    show.add_argument("--config", metavar="FILE", help="TOML file over the defaults")
    show.set_defaults(func=_show)

    check = cmds.add_parser("check", help="validate a configuration file")
    check.add_argument("file", metavar="FILE")
    check.set_defaults(func=_check)


def _show(args: argparse.Namespace) -> int:
    sys.stdout.write(dump_config(load_config(args.config)))
    return 0


def _check(args: argparse.Namespace) -> int:
    load_config(args.file)
    print(f"ok: {args.file}")
    return 0
