"""The Ray backend: its overhead with one rollout worker, and the driver's scale by simulation.

    .venv/bin/python -m bench.cluster [--levels 8,16] [--repeats 3] [--episodes 32]
                                      [--group-size 4] [--tasks 16] [--style compact]
                                      [--workers 1,4,16,64] [--contexts 16]
                                      [--sim-group-size 8] [--turns 8] [--think-s 0.3]
                                      [--action-s 0.2] [--prompt-ids 500] [--completion-ids 60]
                                      [--waves 3] [--start-timeout-s 240]
                                      [--skip-overhead] [--skip-scale] [--out bench/out]

Part 1, overhead (issue 20, measured item 1). The oracle policy (the scripted teacher, no
LLM) on the built-in sites' test split (the first `--tasks` tasks, cycled to
`--episodes` episodes in groups of `--group-size`), so that only the runtime differs. At
each concurrency C of `--levels` two arms run the same tasks through the real
`runtime.scheduler.Scheduler` (`num_groups` = the tasks, `max_groups` = C / group size, as
`runtime.task_runs.run_tasks` sets them) with a consumer that drains the stream:

- local: a `runtime.rollout.Rollout` in this process (its own Chromium and the built-in
  sites served in-process), C episodes at once;
- ray: the `RayRollout` that `runtime.cluster.ray_rollout` yields for
  `cluster.backend = "ray"`, ONE rollout-worker actor with `contexts_per_worker = C` and
  `policy = "oracle"` (the actor has its own Chromium and sites; the driver only schedules,
  sends tasks and decodes groups).

Ray is started once before the clock (`ray.init`, as `ray_rollout` would: a local cluster
with this machine's CPUs), each arm's browser and actor are started and warmed with one
group off the clock, and the arms alternate in order over `--repeats`. Reported per arm:
episodes/s and steps/s (turns / wall seconds of the scheduler run), the driver process's
CPU seconds (`time.process_time`, all its threads), successes; and the ratio ray/local of
steps/s (median of the per-repeat ratios; target >= 0.9).

Part 2, scale by simulation (issue 20, measured item 2): see `bench.cluster_sim`.

Prints one table per part and writes both to `{--out}/cluster-{stamp}.json` ("table" is
the overhead table, "scale_table" the simulation's).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from bench.cluster_sim import _ray, run_scale, scale_notes, scale_table
from bench.common import LoadSampler, format_table, load_note, median, write_result
from runtime.base.messages import TaskConfig, TrajectoryGroup

if TYPE_CHECKING:
    from runtime.base.config import Config
    from runtime.rollout import GroupRunner

__all__ = ["main", "overhead_table", "run_overhead"]


# =========================================================================== part 1: overhead


@dataclass
class Phase:
    """One arm at one concurrency, one repeat."""

    episodes: int = 0
    steps: int = 0
    groups: int = 0
    seconds: float = 0.0
    driver_cpu_s: float = 0.0
    successes: int = 0
    errors: int = 0

    def summary(self) -> dict[str, float]:
        return {
            "episodes": self.episodes,
            "steps": self.steps,
            "groups": self.groups,
            "seconds": self.seconds,
            "episodes_per_s": self.episodes / self.seconds if self.seconds else math.nan,
            "steps_per_s": self.steps / self.seconds if self.seconds else math.nan,
            "driver_cpu_s": self.driver_cpu_s,
            "successes": self.successes,
            "errors": self.errors,
        }


async def drive(
    runner: GroupRunner,
    tasks: Sequence[TaskConfig],
    *,
    group_size: int,
    concurrency: int,
    config: Config,
    split: str = "test",
) -> Phase:
    """Every task once as a group through the real scheduler (as `run_tasks` sets it up),
    the stream drained by a consumer; timed from the scheduler's start to the last group."""
    from runtime.scheduler import Scheduler

    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](
        config.scheduler.stream_buffer
    )
    scheduler = Scheduler(
        rollout=runner,
        tasks=tasks,
        send=send,
        group_size=group_size,
        max_groups=max(1, math.ceil(concurrency / group_size)),
        split=split,
        seed=config.scheduler.seed,
        num_groups=len(tasks),
    )
    groups: list[TrajectoryGroup] = []
    cpu0, t0 = time.process_time(), time.monotonic()
    async with anyio.create_task_group() as tg, receive:
        tg.start_soon(scheduler.run)
        async for group in receive:
            groups.append(group)
    seconds, cpu = time.monotonic() - t0, time.process_time() - cpu0
    trajectories = [t for g in groups for t in g.trajectories]
    return Phase(
        episodes=len(trajectories),
        steps=sum(len(t.turns) for t in trajectories),
        groups=len(groups),
        seconds=seconds,
        driver_cpu_s=cpu,
        successes=sum(1 for t in trajectories if t.reward > 0),
        errors=sum(1 for t in trajectories if t.status.startswith("error")),
    )


def _task_list(tasks: Sequence[TaskConfig], episodes: int, group_size: int) -> list[TaskConfig]:
    groups = max(1, math.ceil(episodes / group_size))
    return [tasks[i % len(tasks)] for i in range(groups)]


async def _overhead_level(
    args: argparse.Namespace, config: Config, env: Any, chosen: list[TaskConfig], level: int
) -> dict[str, Any]:
    """Both arms at concurrency `level`: their browsers and the actor up and warm, then
    `--repeats` runs of each, alternating which goes first."""
    from runtime.browser import BrowserPool
    from runtime.cluster import ray_rollout
    from runtime.episode import EpisodeSettings
    from runtime.oracle import OraclePolicy
    from runtime.rollout import Rollout

    settings = EpisodeSettings.from_config(config)
    remote_config = msgspec.structs.replace(
        config,
        cluster=msgspec.structs.replace(
            config.cluster, backend="ray", workers=1, contexts_per_worker=level
        ),
    )
    browser = msgspec.structs.replace(
        config.browser, max_contexts=max(level, config.browser.max_contexts)
    )
    runs: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
    t_up = time.monotonic()
    async with (
        BrowserPool(browser) as pool,
        ray_rollout(
            remote_config,
            server_urls=[],
            current=lambda: None,
            policy="oracle",
            start_timeout_s=args.start_timeout_s,
        ) as remote,
    ):
        up_s = time.monotonic() - t_up

        def local() -> Rollout:
            return Rollout(
                environment=env,
                pool=pool,
                policy=OraclePolicy(style=config.observation.style),
                settings=settings,
                max_episodes=level,
            )

        async def one(runner: GroupRunner, tasks: list[TaskConfig]) -> Phase:
            return await drive(
                runner, tasks, group_size=args.group_size, concurrency=level, config=config
            )

        # Warm-up, off the clock: the sites' first requests, the caches, the contexts.
        await one(local(), chosen[:1])
        await one(remote, chosen[:1])
        for repeat in range(args.repeats):
            order = ("local", "ray") if repeat % 2 == 0 else ("ray", "local")
            for arm in order:
                phase = await one(local() if arm == "local" else remote, chosen)
                runs[arm].append(phase.summary())
            print(
                f"C={level} repeat {repeat}: local {runs['local'][-1]['steps_per_s']:.2f} "
                f"steps/s, ray {runs['ray'][-1]['steps_per_s']:.2f} steps/s",
                flush=True,
            )
    ratios = [
        r["steps_per_s"] / loc["steps_per_s"]
        for loc, r in zip(runs["local"], runs["ray"], strict=True)
        if loc["steps_per_s"]
    ]
    return {
        "episodes": len(chosen) * args.group_size,
        "groups": len(chosen),
        "start_up_s": up_s,
        "runs": runs,
        "median": {
            arm: {key: median(r[key] for r in items) for key in items[0]}
            for arm, items in runs.items()
        },
        "ratios": ratios,
        "ratio_ray_local": median(ratios),
    }


async def run_overhead(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    """Part 1: local `Rollout` against one Ray rollout worker, same tasks and concurrency."""
    from runtime.webarena_environment import open_environment

    ray = _ray()
    levels = [int(x) for x in args.levels.split(",")]
    out: dict[str, Any] = {"style": config.observation.style, "levels": {}}
    started = time.monotonic()
    # As ray_rollout would start it for one worker; started here so it is off the clock.
    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
    out["ray_init_s"] = time.monotonic() - started
    try:
        async with open_environment(config) as env:
            tasks = env.tasks("test")[: args.tasks]
            for level in levels:
                chosen = _task_list(tasks, max(level, args.episodes), args.group_size)
                out["levels"][level] = await _overhead_level(args, config, env, chosen, level)
    finally:
        ray.shutdown()
    return out


def overhead_table(result: dict[str, Any]) -> dict[str, Any]:
    headers = [
        "C", "arm", "episodes", "eps/s", "steps/s", "wall s", "driver CPU s", "success",
        "ray/local steps/s",
    ]  # fmt: skip
    rows: list[list[object]] = []
    for level, entry in result["levels"].items():
        for arm in ("local", "ray"):
            m = entry["median"][arm]
            rows.append(
                [
                    int(level),
                    arm,
                    int(m["episodes"]),
                    m["episodes_per_s"],
                    m["steps_per_s"],
                    m["seconds"],
                    m["driver_cpu_s"],
                    f"{int(m['successes'])}/{int(m['episodes'])}",
                    entry["ratio_ray_local"] if arm == "ray" else "",
                ]
            )
    return {
        "title": (
            "Ray backend overhead: oracle rollouts, built-in test split, one rollout worker "
            "against the local backend at the same C (medians over repeats)"
        ),
        "headers": headers,
        "rows": rows,
    }


# =========================================================================== main


async def _run(args: argparse.Namespace, config: Config | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if config is not None:
        out["overhead"] = await run_overhead(args, config)
    if not args.skip_scale:
        out["scale"] = await run_scale(args)
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", help="TOML file over the defaults")
    part1 = parser.add_argument_group("part 1: overhead (oracle, one Ray worker)")
    part1.add_argument("--skip-overhead", action="store_true")
    part1.add_argument(
        "--style", default="compact", choices=("html", "compact"), help="observation style"
    )
    part1.add_argument("--levels", default="8,16", help="concurrency levels C")
    part1.add_argument("--repeats", type=int, default=3)
    part1.add_argument("--tasks", type=int, default=16, help="first N test tasks, cycled")
    part1.add_argument("--episodes", type=int, default=32, help="episodes per run (>= C)")
    part1.add_argument("--group-size", type=int, default=4)
    part2 = parser.add_argument_group("part 2: scale by simulation")
    part2.add_argument("--skip-scale", action="store_true")
    part2.add_argument("--workers", default="1,4,16,64", help="numbers of workers N")
    part2.add_argument("--contexts", type=int, default=16, help="episodes per worker")
    part2.add_argument("--sim-group-size", type=int, default=8)
    part2.add_argument("--turns", type=int, default=8)
    part2.add_argument("--think-s", type=float, default=0.3)
    part2.add_argument("--action-s", type=float, default=0.2)
    part2.add_argument("--prompt-ids", type=int, default=500)
    part2.add_argument("--completion-ids", type=int, default=60)
    part2.add_argument("--waves", type=int, default=3, help="group times measured per N")
    parser.add_argument("--start-timeout-s", type=float, default=240.0)
    parser.add_argument("--out", default="bench/out", help="folder for the JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> Path:
    from bench.common import with_style
    from runtime.base.config import load_config
    from runtime.logs import configure_logging

    args = _parser().parse_args(argv)
    configure_logging(level="warning")
    config = None if args.skip_overhead else with_style(load_config(args.config), args.style)
    with LoadSampler(interval_s=2.0) as load:
        result = anyio.run(_run, args, config)
    notes: list[str] = []
    tables: list[dict[str, Any]] = []
    if "overhead" in result:
        tables.append(overhead_table(result["overhead"]))
        for level, entry in result["overhead"]["levels"].items():
            notes.append(
                f"C={level}: ray/local steps/s {entry['ratio_ray_local']:.3f} (median of "
                f"{', '.join(f'{r:.3f}' for r in entry['ratios'])}; target >= 0.9)"
            )
            for arm, runs in entry["runs"].items():
                failed = [int(r["errors"]) for r in runs]
                if any(failed):
                    notes.append(
                        f"C={level} {arm}: episodes ended error:* in its repeats: {failed} "
                        "(error:worker: the actor died; see the log)"
                    )
    if "scale" in result:
        tables.append(scale_table(result["scale"]))
        notes.extend(scale_notes(result["scale"]))
    notes.append(load_note(load))
    path = write_result(
        args.out,
        "cluster",
        {**result, "scale_table": tables[-1] if "scale" in result else None},
        table=tables[0],
        notes=notes,
        load=load,
        argv=None if argv is None else [__file__, *argv],
    )
    print(f"wrote {path}")
    for table in tables:
        print(format_table(table["headers"], table["rows"], title=table["title"]))
        print("")
    for note in notes:
        print(note)
    return path


if __name__ == "__main__":
    main()
