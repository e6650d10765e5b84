"""`webagent sites serve` and `webagent tasks generate|stats` (the built-in sites and suite).

`add_task_commands(cmds)` adds `generate` and `stats` to the `tasks` group that
`runtime.cli.tasks` makes.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import structlog

from runtime.base.config import SitesConfig, load_config
from runtime.base.messages import TaskConfig
from runtime.errors import UsageError
from sites.builtin import ADMIN_HEADER, generate_suite, serve_builtin_sites
from sites.builtin.errors import BuiltinSiteError
from sites.builtin.suite import suite_stats
from sites.errors import TaskFileError
from sites.tasks import load_tasks, write_tasks

__all__ = ["add_task_commands", "register"]

_SPLITS = ("train", "test", "ood")
_log = structlog.get_logger(__name__)


def register(sub: Any) -> None:
    parser = sub.add_parser("sites", help="serve the built-in sites")
    cmds = parser.add_subparsers(title="sites commands", metavar="ACTION", required=True)
    serve = cmds.add_parser(
        "serve",
        help="serve the five built-in sites until interrupted; prints their URLs as JSON",
    )
    _common(serve)
    serve.add_argument("--host", help="listen address (default: sites.host)")
    serve.add_argument("--port", type=int, help="first port; the five sites use PORT..PORT+4")
    serve.add_argument(
        "--person-sessions",
        action="store_true",
        help="also serve /__webagent/, a page that gives a person in a browser a tenant "
        "(anyone who can reach the ports can then make tenants)",
    )
    serve.set_defaults(func=_serve)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file over the defaults")
    parser.add_argument("--seed", type=int, help="data and suite seed (default: sites.seed)")


def add_task_commands(cmds: Any) -> None:
    generate = cmds.add_parser(
        "generate", help="write the built-in suite as train.json, test.json and ood.json"
    )
    _common(generate)
    generate.add_argument("--out", required=True, metavar="DIR", help="output folder")
    generate.set_defaults(func=_generate)

    stats = cmds.add_parser(
        "stats", help="count the built-in suite's tasks per split, site and plan length"
    )
    _common(stats)
    stats.add_argument(
        "--dir", metavar="DIR", help="count the split files in DIR instead of generating them"
    )
    stats.set_defaults(func=_stats)


def _sites_config(args: argparse.Namespace) -> SitesConfig:
    config = load_config(args.config).sites
    changes: dict[str, Any] = {}
    if args.seed is not None:
        changes["seed"] = args.seed
    if getattr(args, "host", None):
        changes["host"] = args.host
    if getattr(args, "port", None) is not None:
        if not 0 <= args.port <= 65535 - 4:
            raise UsageError(f"--port must be between 0 and 65531, got {args.port}")
        changes["port"] = args.port
    return SitesConfig(**{**_fields(config), **changes})


def _fields(config: SitesConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__struct_fields__}


# --------------------------------------------------------------------------- serve


def _serve(args: argparse.Namespace) -> int:
    config = _sites_config(args)
    try:
        anyio.run(_serve_until_signal, config, args.person_sessions)
    except BuiltinSiteError as exc:
        raise UsageError(str(exc)) from exc
    return 0


async def _serve_until_signal(config: SitesConfig, person_sessions: bool) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with serve_builtin_sites(config, person_sessions=person_sessions) as sites:
            # Line 1: the URLs; line 2: what the tenant API needs (never logged).
            print(json.dumps(sites.urls), flush=True)
            tenant_api = {"header": ADMIN_HEADER, "token": sites.admin_token}
            print(json.dumps({"tenant_api": tenant_api}), flush=True)
            _log.info("sites.serving", urls=sites.urls, seed=config.seed)
            async for signum in signals:
                _log.info("sites.stopping", signal=signal.Signals(signum).name)
                break
            _log.info("sites.stopped", **sites.statistics())


# --------------------------------------------------------------------------- tasks


def _generate(args: argparse.Namespace) -> int:
    seed = _sites_config(args).seed
    suite = generate_suite(seed)
    out = Path(args.out)
    for split in _SPLITS:
        write_tasks(out / f"{split}.json", suite[split])
    counts = ", ".join(f"{split} {len(suite[split])}" for split in _SPLITS)
    print(f"wrote {out}/{{train,test,ood}}.json (seed {seed}): {counts}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    if args.dir:
        suite: dict[str, list[TaskConfig]] = {}
        for split in _SPLITS:
            try:
                suite[split] = load_tasks(Path(args.dir) / f"{split}.json")
            except TaskFileError as exc:
                raise UsageError(str(exc)) from exc
        source = args.dir
    else:
        seed = _sites_config(args).seed
        suite = generate_suite(seed)
        source = f"built-in suite, seed {seed}"
    try:
        stats = suite_stats(suite)
    except BuiltinSiteError as exc:
        raise UsageError(str(exc)) from exc
    _print_stats(source, stats, sys.stdout)
    return 0


def _print_stats(source: str, stats: dict[str, dict[str, int]], out: Any) -> None:
    rows = sorted({key for counts in stats.values() for key in counts} - {"total"})
    keys = ["total", *rows]
    width = max(len(key) for key in keys)
    print(f"tasks of the {source}", file=out)
    print(f"{'':<{width}}  " + "  ".join(f"{split:>6}" for split in stats), file=out)
    for key in keys:
        cells = "  ".join(f"{stats[split].get(key, 0):>6}" for split in stats)
        print(f"{key:<{width}}  {cells}", file=out)
