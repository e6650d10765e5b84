"""Run a fixed set of tasks as groups and collect them: evaluation, demos, benchmarks.

`run_tasks` composes the pieces the way every fixed-size run needs them: a browser pool
sized to the concurrency, a `Rollout`, a `Scheduler` with `num_groups = len(tasks)`, and a
consumer that hands each finished group to `on_group` (e.g. a trajectory store) as it
arrives. Training runs the same pieces endlessly (the daemon).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import msgspec

from runtime.base.config import Config
from runtime.base.files import fsync_dir
from runtime.base.messages import TaskConfig, TrajectoryGroup
from runtime.browser import BrowserPool
from runtime.environment import Environment
from runtime.episode import EpisodeSettings
from runtime.observation import TokenCounter, estimate_tokens
from runtime.protocols import Policy
from runtime.rollout import Rollout
from runtime.scheduler import Scheduler

__all__ = ["DemoReport", "RunResult", "run_tasks", "write_demos"]


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    """The groups of a fixed run, in the order they finished, and its wall time."""

    groups: list[TrajectoryGroup]
    seconds: float


async def run_tasks(
    config: Config,
    environment: Environment,
    policy: Policy,
    tasks: Sequence[TaskConfig],
    *,
    split: str = "",
    group_size: int,
    concurrency: int,
    max_turns: int | None = None,
    count_tokens: TokenCounter = estimate_tokens,
    on_group: Callable[[TrajectoryGroup], Awaitable[None]] | None = None,
    pool: BrowserPool | None = None,
) -> RunResult:
    """Every task of `tasks` once, as a group of `group_size`, `concurrency` episodes at once."""
    settings = EpisodeSettings.from_config(config, max_turns=max_turns)
    browser = msgspec.structs.replace(
        config.browser, max_contexts=max(concurrency, config.browser.max_contexts)
    )
    groups: list[TrajectoryGroup] = []
    started = time.monotonic()

    async def run(active: BrowserPool) -> None:
        rollout = Rollout(
            environment=environment,
            pool=active,
            policy=policy,
            settings=settings,
            max_episodes=concurrency,
            count_tokens=count_tokens,
        )
        send, receive = anyio.create_memory_object_stream[TrajectoryGroup](
            config.scheduler.stream_buffer
        )
        scheduler = Scheduler(
            rollout=rollout,
            tasks=tasks,
            send=send,
            group_size=group_size,
            max_groups=max(1, math.ceil(concurrency / group_size)),
            split=split,
            seed=config.scheduler.seed,
            num_groups=len(tasks),
        )
        async with anyio.create_task_group() as tg, receive:
            tg.start_soon(scheduler.run)
            async for group in receive:
                groups.append(group)
                if on_group is not None:
                    await on_group(group)

    if pool is not None:
        await run(pool)
    else:
        async with BrowserPool(browser) as own:
            await run(own)
    return RunResult(groups=groups, seconds=time.monotonic() - started)


class DemoReport(msgspec.Struct, frozen=True, kw_only=True):
    """What `write_demos` wrote."""

    path: str
    tasks: int
    episodes: int
    kept: int
    turns: int
    failures: list[str]


async def write_demos(
    config: Config,
    environment: Environment,
    tasks: Sequence[TaskConfig],
    out: str | Path,
    *,
    split: str = "train",
    group_size: int = 1,
    concurrency: int = 32,
    style: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> DemoReport:
    """The oracle's successful episodes on `tasks`, as a trajectory store at `out`.

    Written to `out` + ".partial" and renamed into place when complete, so `out` is
    never half-written. Failed oracle episodes are left out and listed in the report.
    `on_progress(tasks done, tasks)` is called after each task's group.
    """
    from runtime.oracle import OraclePolicy
    from runtime.store import TrajectoryStore

    target = Path(out)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    policy = OraclePolicy(style=style or "auto")
    failures: list[str] = []
    counts = {"episodes": 0, "kept": 0, "turns": 0, "groups": 0}
    with TrajectoryStore(partial) as store:

        async def keep(group: TrajectoryGroup) -> None:
            good = [t for t in group.trajectories if t.reward > 0]
            counts["episodes"] += len(group.trajectories)
            counts["groups"] += 1
            if on_progress is not None:
                on_progress(counts["groups"], len(tasks))
            for bad in group.trajectories:
                if bad.reward <= 0:
                    failures.append(f"task {bad.task_id} ({bad.episode_id}): {bad.status}")
            if good:
                counts["kept"] += len(good)
                counts["turns"] += sum(len(t.turns) for t in good)
                await store.append_async(msgspec.structs.replace(group, trajectories=good))

        await run_tasks(
            config,
            environment,
            policy,
            tasks,
            split=split,
            group_size=group_size,
            concurrency=concurrency,
            on_group=keep,
        )
    partial.replace(target)
    fsync_dir(target.parent)
    return DemoReport(
        path=str(target),
        tasks=len(tasks),
        episodes=counts["episodes"],
        kept=counts["kept"],
        turns=counts["turns"],
        failures=failures,
    )
