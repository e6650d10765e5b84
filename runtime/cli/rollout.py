"""`webagent rollout`: run a split of the built-in suite as groups and print the figures.

    webagent rollout --policy oracle --split test --group-size 8 --concurrency 32

prints success per site, episodes/s, steps/s and the prompt-token ratio with and without
dynamic context compression; `--out FILE` also stores the groups (trajectory store).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

import anyio

from policy.profile import settle_auto
from runtime.base.config import Config, load_config
from runtime.base.messages import TrajectoryGroup
from runtime.episode import EpisodeSettings
from runtime.errors import UsageError
from runtime.oracle import OraclePolicy
from runtime.protocols import Policy
from runtime.store import TrajectoryStore
from runtime.summary import format_summary, summarize
from runtime.task_runs import RunResult, run_tasks
from runtime.webarena_environment import open_environment

__all__ = ["add_run_arguments", "register"]

# The built-in suite's splits (sites.builtin.generate_suite).
_SPLITS = ("train", "test", "ood")


def add_run_arguments(parser: argparse.ArgumentParser, *, split: str, group_size: int) -> None:
    """Arguments shared by `rollout` and `demos`."""
    parser.add_argument("--config", metavar="FILE", help="TOML file over the defaults")
    parser.add_argument("--split", default=split, help=f"suite split (default: {split})")
    parser.add_argument(
        "--group-size",
        type=int,
        default=group_size,
        help=f"episodes per task (default: {group_size})",
    )
    parser.add_argument(
        "--concurrency", type=int, default=32, help="episodes at once (default: 32)"
    )
    parser.add_argument(
        "--tasks", type=int, metavar="N", help="only the first N tasks of the split"
    )
    parser.add_argument(
        "--max-turns", type=int, help="turns per episode (default: scheduler.max_turns)"
    )
    parser.add_argument("--seed", type=int, help="suite seed (default: sites.seed)")


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "rollout", help="run a split of the built-in suite with a policy and print the figures"
    )
    add_run_arguments(parser, split="test", group_size=8)
    parser.add_argument(
        "--policy",
        choices=("oracle",),
        default="oracle",
        help="oracle: the scripted solutions, through the model's observations and actions",
    )
    parser.add_argument("--out", metavar="FILE", help="append the groups to this trajectory store")
    parser.set_defaults(func=_rollout)


def checked_config(args: argparse.Namespace) -> Config:
    """The configuration with the run's command-line overrides; bad values are UsageErrors."""
    config = load_config(args.config)
    for name in ("group_size", "concurrency", "tasks", "max_turns"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    if args.split not in _SPLITS:
        raise UsageError(
            f"no split {args.split!r} in the built-in suite (splits: train, test, ood)"
        )
    if config.sites.kind != "builtin":
        raise UsageError('this command runs the built-in suite; set sites.kind = "builtin"')
    if args.seed is not None:
        import msgspec

        config = msgspec.structs.replace(
            config, sites=msgspec.structs.replace(config.sites, seed=args.seed)
        )
    return settle_auto(config)  # pages and prompt as `policy.model` reads them


async def run_split(
    config: Config,
    args: argparse.Namespace,
    policy: Policy,
    *,
    store: TrajectoryStore | None = None,
    progress: bool = True,
) -> tuple[RunResult, dict[int, Any]]:
    """Open the configured sites, run the split's tasks, return the groups and the tasks."""
    async with open_environment(config) as environment:
        try:
            tasks = environment.tasks(args.split)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from exc
        if args.tasks:
            tasks = tasks[: args.tasks]
        done = 0

        async def on_group(group: TrajectoryGroup) -> None:
            nonlocal done
            done += 1
            if store is not None:
                await store.append_async(group)
            if progress:
                won = sum(1 for t in group.trajectories if t.reward > 0)
                print(
                    f"[{done}/{len(tasks)}] task {group.task_id}: {won}/{len(group.trajectories)}",
                    file=sys.stderr,
                    flush=True,
                )

        result = await run_tasks(
            config,
            environment,
            policy,
            tasks,
            split=args.split,
            group_size=args.group_size,
            concurrency=args.concurrency,
            max_turns=args.max_turns,
            on_group=on_group,
        )
        return result, {t.task_id: t for t in tasks}


def _rollout(args: argparse.Namespace) -> int:
    config = checked_config(args)
    policy = OraclePolicy()
    store = TrajectoryStore(Path(args.out)) if args.out else None
    try:
        result, tasks = anyio.run(functools.partial(run_split, config, args, policy, store=store))
    finally:
        if store is not None:
            store.close()
    summary = summarize(
        result.groups,
        tasks=tasks,
        seconds=result.seconds,
        keep_thoughts=config.scheduler.keep_thoughts,
        system_prompt=EpisodeSettings.from_config(config).system_prompt,
    )
    print(format_summary(summary, title=f"{args.policy} on {args.split}"))
    if summary.failures:
        print("failures (first 20):")
        for line in summary.failures:
            print(f"  {line}")
    return 0
