"""`webagent config show|check`.

`check` also applies the endpoint's safety rules (`runtime.guard.endpoint_problems`): a
host other than loopback needs a token of real strength. A token named by `token_file` or
`token_env` is checked when it can be read here; when it cannot (the file or variable
exists only where the daemon runs), a note on stderr says so.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from runtime.base.config import ConfigError, dump_config, load_config
from runtime.guard import endpoint_problems, endpoint_token


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
    config = load_config(args.file)
    endpoint = config.endpoint
    for field, problem in endpoint_problems(endpoint):
        raise ConfigError(args.file, field, problem)
    if endpoint.enabled and (endpoint.token_file or endpoint.token_env):
        readable = (
            Path(endpoint.token_file).exists()
            if endpoint.token_file
            else endpoint.token_env in os.environ
        )
        if readable:
            try:
                endpoint_token(endpoint, os.environ)
            except ConfigError as exc:
                raise ConfigError(args.file, exc.field, exc.problem) from exc
        else:
            where = endpoint.token_file or f"${endpoint.token_env}"
            print(
                f"note: {where} is not readable here; the daemon reads it at start", file=sys.stderr
            )
    print(f"ok: {args.file}")
    return 0
