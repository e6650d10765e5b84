"""`webagent demos`: the oracle's episodes as behaviour-cloning demonstrations.

    webagent demos --split train --out .webagent/demos/train.jsonl

writes a trajectory store (the learner's BC reads it and rebuilds each turn's messages
with `policy.prompt.build_messages`); only successful episodes are kept.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

import anyio

from runtime.base.config import Config
from runtime.cli.rollout import add_run_arguments, checked_config
from runtime.errors import UsageError
from runtime.task_runs import DemoReport, write_demos
from runtime.webarena_environment import open_environment

__all__ = ["register"]


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "demos", help="write the oracle's episodes of a split as BC demonstrations"
    )
    add_run_arguments(parser, split="train", group_size=1)
    parser.add_argument("--out", metavar="FILE", required=True, help="trajectory store to write")
    parser.set_defaults(func=_demos)


async def _write(config: Config, args: argparse.Namespace) -> DemoReport:
    async with open_environment(config) as environment:
        try:
            tasks = environment.tasks(args.split)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from exc
        if args.tasks:
            tasks = tasks[: args.tasks]
        return await write_demos(
            config,
            environment,
            tasks,
            Path(args.out),
            split=args.split,
            group_size=args.group_size,
            concurrency=args.concurrency,
        )


def _demos(args: argparse.Namespace) -> int:
    config = checked_config(args)
    report = anyio.run(functools.partial(_write, config, args))
    print(
        f"wrote {report.kept} demonstrations ({report.turns} turns) of {report.tasks} tasks "
        f"to {report.path}; {len(report.failures)} oracle episodes failed"
    )
    for line in report.failures[:20]:
        print(f"  failed: {line}")
    return 0 if not report.failures else 1
