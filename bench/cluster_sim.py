"""Part 2 of `python -m bench.cluster`: the driver's scale, with simulated rollout workers.

A real rollout worker needs a browser, so one machine holds few; these sleep through their
groups and return full-size results, so the real driver (`RayRollout`, `Scheduler`) faces
many and its own limit shows before the machine's.

Scale by simulation (issue 20, measured item 2). `SimWorker`, an actor with the
methods of `runtime.cluster.RolloutWorker`, runs no browser: its `run_group` sleeps
`--turns` x (`--think-s` + `--action-s`) (times a per-group jitter of +-20%, mean 1) and
returns the msgpack of a `_GroupDone`-shaped result holding a `TrajectoryGroup` of
`--sim-group-size` trajectories with that many realistic turns (`--prompt-ids` prompt and
`--completion-ids` completion token ids, logprobs, a ~1,500-character observation) and the
events a real worker returns (episode started, turn taken, episode finished, group ready).
For each N of `--workers`, N actors are started (timed: that is where the machine's limit
shows), handed to the real `RayRollout(workers, current=..., lost_errors=...)` and driven
by the real `Scheduler` with `max_groups` = N x `--contexts` / group size (every worker
busy) and a consumer that drains the stream. After half a group time, `--waves` group
times are measured: groups/s dispatched (started by the scheduler) and absorbed (decoded
and consumed), against the ideal (groups in flight / mean group time); episodes in flight
(sampled every 0.25 s); the driver's CPU (process time over the window) per group and as
a share of one core. The probe stops at the first N whose actors do not all start within
`--start-timeout-s`. The driver would saturate where its CPU share nears one core (it is
one Python process and one event loop): the notes fit its CPU share as idle + cost x
groups/s over the levels that kept up and extrapolate to one core. A level that falls
behind while the driver has CPU to spare is the machine's limit (worker processes and
Ray's own on too few cores), and the notes say so.

Ray workers import this module to build `SimWorker` (the class is sent by reference): the
local cluster is started with `runtime_env={"env_vars": {"PYTHONPATH": <repository root>}}`
so they find the `bench` package wherever the driver was started from.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import math
import os
import random
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec

from bench.common import pss_tree
from runtime.base.messages import (
    Action,
    EpisodeFinished,
    EpisodeStarted,
    Event,
    GroupReady,
    TaskConfig,
    Trajectory,
    TrajectoryGroup,
    Turn,
    TurnTaken,
    TurnTimings,
)

__all__ = ["SimSpec", "SimWorker", "payload_bytes", "run_scale", "scale_notes", "scale_table"]


ROOT = Path(__file__).resolve().parents[1]

# The simulated tokenizer's vocabulary (ids drawn below it: SmolLM2's size, so the msgpack
# of an id takes the bytes a real one does).
_VOCAB = 49_152
_JITTER = 0.2


def _ray() -> Any:
    """Ray, imported when a part needs it (the `ray` extra: pip install 'webagent-r1[ray]')."""
    return importlib.import_module("ray")


class SimSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a simulated worker's groups look like (its actor's constructor argument)."""

    index: int = 0
    turns: int = 8
    think_s: float = 0.3
    action_s: float = 0.2
    prompt_ids: int = 500
    completion_ids: int = 60
    observation_chars: int = 1500

    @property
    def group_s(self) -> float:
        """The mean time a group takes (its episodes run at once)."""
        return self.turns * (self.think_s + self.action_s)


class _SimDone(msgspec.Struct, frozen=True):
    """The shape of `runtime.cluster._GroupDone`: the driver decodes it with that type."""

    group: TrajectoryGroup
    events: list[Event]


_sim_task_decoder = msgspec.msgpack.Decoder(TaskConfig)
_sim_encoder = msgspec.msgpack.Encoder()


def _sim_turns(spec: SimSpec) -> list[Turn]:
    """`spec.turns` turns with realistic payloads, drawn once per worker."""
    rng = random.Random(spec.index)
    words = ["link", "button", "textbox", "Order", "#000", "Search", "Next", "Price", "$12.99"]
    turns = []
    for k in range(spec.turns):
        lines: list[str] = []
        while sum(len(line) + 1 for line in lines) < spec.observation_chars:
            lines.append(
                f"[{len(lines)}] {rng.choice(words)} '{' '.join(rng.choices(words, k=4))}'"
            )
        observation = "\n".join(lines)[: spec.observation_chars]
        thought = f"Open the next order (link Order #{k:06d} [{k + 3}])."
        answer = f'do(action="Click", element="{k + 3}")'
        turns.append(
            Turn(
                index=k,
                url=f"http://127.0.0.1:7770/orders?page={k}",
                observation=observation,
                observation_digest=hashlib.sha256(observation.encode()).hexdigest()[:16],
                text=f"<think>{thought}</think><answer>{answer}</answer>",
                thought=thought,
                action=Action(kind="do", name="Click", element=k + 3),
                prompt_token_ids=[rng.randrange(_VOCAB) for _ in range(spec.prompt_ids)],
                completion_token_ids=[rng.randrange(_VOCAB) for _ in range(spec.completion_ids)],
                completion_logprobs=[-rng.random() * 2 for _ in range(spec.completion_ids)],
                adapter="policy@v0",
                adapter_version=0,
                timings=TurnTimings(observe_s=0.05, policy_s=spec.think_s, act_s=spec.action_s),
            )
        )
    return turns


class SimWorker:
    """A simulated rollout worker: `runtime.cluster.RolloutWorker`'s methods, no browser.

    Built from msgpack bytes of a `SimSpec`; a threaded actor (one thread per group)."""

    def __init__(self, spec: bytes) -> None:
        self.spec = msgspec.msgpack.decode(spec, type=SimSpec)
        self._turns = _sim_turns(self.spec)
        self._lock = threading.Lock()
        self._running: set[threading.Event] = set()

    def pid(self) -> int:
        return os.getpid()

    def run_group(
        self, task: bytes, group_size: int, split: str, group_id: str, state: bytes
    ) -> bytes:
        """Sleeps for the group's turns, then returns its msgpack (`_GroupDone`'s shape)."""
        del state  # a real worker applies the adapter version and gate here
        decoded = _sim_task_decoder.decode(task)
        spec = self.spec
        jitter = 1 + _JITTER * (2 * random.Random(group_id).random() - 1)
        duration = spec.group_s * jitter
        wake = threading.Event()
        with self._lock:
            self._running.add(wake)
        started = time.time()
        try:
            interrupted = wake.wait(duration)
        finally:
            with self._lock:
                self._running.discard(wake)
        now = time.time()
        taken = len(self._turns)
        status = "exited"
        if interrupted:
            taken = min(taken, int((now - started) / duration * len(self._turns)))
            status = "interrupted"
        events: list[Event] = []
        trajectories = []
        for i in range(group_size):
            episode_id = f"{group_id}-{i}"
            turns = self._turns[:taken]
            events.append(
                EpisodeStarted(
                    at=started, episode_id=episode_id, group_id=group_id, task_id=decoded.task_id
                )
            )
            events.extend(
                TurnTaken(
                    at=started + (k + 1) * duration / len(self._turns),
                    episode_id=episode_id,
                    index=k,
                    action=f'do(action="Click", element="{k + 3}")',
                    adapter="policy@v0",
                )
                for k in range(taken)
            )
            reward = float(i % 2)
            events.append(
                EpisodeFinished(
                    at=now,
                    episode_id=episode_id,
                    group_id=group_id,
                    task_id=decoded.task_id,
                    status=status,
                    reward=reward,
                    turns=taken,
                    prompt_tokens=taken * spec.prompt_ids,
                    completion_tokens=taken * spec.completion_ids,
                    split=split,
                )
            )
            trajectories.append(
                Trajectory(
                    episode_id=episode_id,
                    group_id=group_id,
                    task_id=decoded.task_id,
                    intent=decoded.intent,
                    turns=turns,
                    answer="",
                    reward=reward,
                    status=status,
                    adapter_versions=[0],
                    started_at=started,
                    finished_at=now,
                )
            )
        group = TrajectoryGroup(
            group_id=group_id,
            task_id=decoded.task_id,
            trajectories=trajectories,
            created_at=now,
            split=split,
        )
        events.append(
            GroupReady(
                at=now,
                group_id=group_id,
                task_id=decoded.task_id,
                rewards=[t.reward for t in trajectories],
            )
        )
        return _sim_encoder.encode(_SimDone(group, events))

    def set_state(self, state: bytes) -> None:
        del state  # nothing to follow: the simulated policy has no adapter

    def interrupt_all(self) -> None:
        """End the groups sleeping now (their episodes `interrupted`, with the turns so far)."""
        with self._lock:
            for wake in self._running:
                wake.set()

    def close(self) -> None:
        self.interrupt_all()


def _sim_tasks(n: int = 16) -> list[TaskConfig]:
    return [
        TaskConfig(
            task_id=i,
            intent=f"What is the total of my order number {i:06d}?",
            start_url="http://127.0.0.1:7770/orders",
            sites=["shopping"],
        )
        for i in range(n)
    ]


@dataclass
class _Consumed:
    groups: int = 0
    turns: int = 0
    events: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


def _wait_gone(pids: Sequence[int], timeout_s: float = 30.0) -> None:
    """Until the killed actors' processes have exited (their memory is back); in a thread."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)


async def _scale_level(
    args: argparse.Namespace, n: int, worker_class: Any, baseline_pss: int
) -> dict[str, Any]:
    """N simulated workers driven by the real scheduler; see the module docstring."""
    from runtime.cluster import RayRollout
    from runtime.scheduler import Scheduler

    ray = _ray()
    spec = SimSpec(
        turns=args.turns,
        think_s=args.think_s,
        action_s=args.action_s,
        prompt_ids=args.prompt_ids,
        completion_ids=args.completion_ids,
    )
    per_worker = max(1, args.contexts // args.sim_group_size)
    actor = ray.remote(worker_class)
    entry: dict[str, Any] = {"workers": n}
    t0 = time.monotonic()
    workers = [
        actor.options(
            num_cpus=1, max_restarts=0, max_task_retries=0, max_concurrency=per_worker + 8
        ).remote(msgspec.msgpack.encode(msgspec.structs.replace(spec, index=i)))
        for i in range(n)
    ]
    pids: list[int] = []
    try:
        try:
            with anyio.fail_after(args.start_timeout_s):
                pids = [await w.pid.remote() for w in workers]
        except (TimeoutError, ray.exceptions.RayError) as exc:
            entry["start_up_s"] = time.monotonic() - t0
            entry["failed"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            return entry
        entry["start_up_s"] = time.monotonic() - t0
        entry["start_up_per_worker_s"] = entry["start_up_s"] / n
        entry["tree_pss_mib"] = pss_tree() / 2**20
        entry["pss_per_worker_mib"] = (pss_tree() - baseline_pss) / 2**20 / n
        consumed = _Consumed()

        def count(event: Event) -> None:
            consumed.events += 1

        runner = RayRollout(
            workers,
            current=lambda: None,
            on_event=count,
            lost_errors=(ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError),
        )
        send, receive = anyio.create_memory_object_stream[TrajectoryGroup](4)
        max_groups = n * per_worker
        scheduler = Scheduler(
            rollout=runner,
            tasks=_sim_tasks(),
            send=send,
            group_size=args.sim_group_size,
            max_groups=max_groups,
            split="train",
        )

        async def consume() -> None:
            async with receive:
                async for group in receive:
                    consumed.groups += 1
                    for t in group.trajectories:
                        consumed.turns += len(t.turns)
                        consumed.statuses[t.status] = consumed.statuses.get(t.status, 0) + 1

        window: dict[str, float] = {}
        samples: list[int] = []

        async def measure() -> None:
            await anyio.sleep(spec.group_s / 2)
            before = scheduler.statistics()
            g0, cpu0, w0 = consumed.groups, time.process_time(), time.monotonic()
            end = w0 + args.waves * spec.group_s
            while (now := time.monotonic()) < end:
                await anyio.sleep(min(0.25, end - now))
                samples.append(runner.stats.episodes_running)
            after = scheduler.statistics()
            window.update(
                seconds=time.monotonic() - w0,
                cpu_s=time.process_time() - cpu0,
                dispatched=after.groups_started - before.groups_started,
                absorbed=consumed.groups - g0,
            )
            await scheduler.stop(spec.group_s * (1 + _JITTER) + 10)

        async with anyio.create_task_group() as tg:
            tg.start_soon(scheduler.run)
            tg.start_soon(consume)
            tg.start_soon(measure)
        seconds = window["seconds"]
        ideal = max_groups / spec.group_s
        absorbed = window["absorbed"] / seconds
        entry.update(
            groups_in_flight=max_groups,
            episodes_in_flight_target=max_groups * args.sim_group_size,
            episodes_in_flight_mean=sum(samples) / len(samples) if samples else math.nan,
            episodes_in_flight_min=min(samples, default=0),
            window_s=seconds,
            ideal_groups_per_s=ideal,
            dispatched_groups_per_s=window["dispatched"] / seconds,
            absorbed_groups_per_s=absorbed,
            groups_in_window=window["absorbed"],
            efficiency=absorbed / ideal,
            driver_cpu_s=window["cpu_s"],
            driver_cpu_share=window["cpu_s"] / seconds,
            driver_cpu_ms_per_group=(
                window["cpu_s"] / window["absorbed"] * 1000 if window["absorbed"] else math.nan
            ),
            groups_consumed=consumed.groups,
            turns_consumed=consumed.turns,
            events_consumed=consumed.events,
            statuses=consumed.statuses,
            groups_lost=runner.groups_lost,
        )
        return entry
    finally:
        with anyio.CancelScope(shield=True):
            for w in workers:
                with contextlib.suppress(Exception):
                    ray.kill(w, no_restart=True)
            await anyio.to_thread.run_sync(_wait_gone, pids)


def payload_bytes(spec: SimSpec, group_size: int) -> int:
    """The msgpack size of one simulated group (what the driver decodes per group)."""
    worker = SimWorker(msgspec.msgpack.encode(msgspec.structs.replace(spec, think_s=0, action_s=0)))
    task = msgspec.msgpack.encode(_sim_tasks(1)[0])
    return len(worker.run_group(task, group_size, "train", "payload", b""))


async def run_scale(args: argparse.Namespace) -> dict[str, Any]:
    """Part 2: the driver with N simulated workers, N over `--workers` until start-up fails."""
    ray = _ray()
    # By reference (defined here, never `__main__`): the workers import this module.
    worker_class = SimWorker
    levels = [int(x) for x in args.workers.split(",")]
    spec = SimSpec(
        turns=args.turns,
        think_s=args.think_s,
        action_s=args.action_s,
        prompt_ids=args.prompt_ids,
        completion_ids=args.completion_ids,
    )
    out: dict[str, Any] = {
        "spec": msgspec.to_builtins(spec),
        "group_s": spec.group_s,
        "group_size": args.sim_group_size,
        "contexts_per_worker": args.contexts,
        "payload_kib_per_group": payload_bytes(spec, args.sim_group_size) / 1024,
        "levels": [],
    }
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    started = time.monotonic()
    # As ray_rollout starts a local cluster: logical CPUs enough for the most workers.
    ray.init(
        num_cpus=max(os.cpu_count() or 1, *levels),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    out["ray_init_s"] = time.monotonic() - started
    try:
        baseline = pss_tree()
        for n in levels:
            entry = await _scale_level(args, n, worker_class, baseline)
            out["levels"].append(entry)
            if "failed" in entry:
                print(f"{n} workers: start-up failed: {entry['failed']}", flush=True)
                break
            print(
                f"{n} workers: started in {entry['start_up_s']:.1f} s, "
                f"{entry['absorbed_groups_per_s']:.2f} groups/s "
                f"({entry['efficiency']:.0%} of ideal), driver "
                f"{entry['driver_cpu_ms_per_group']:.1f} ms CPU/group",
                flush=True,
            )
    finally:
        ray.shutdown()
    out.update(_saturation(out["levels"]))
    return out


def _counted(entry: dict[str, Any]) -> float:
    """The groups absorbed in a level's window."""
    return float(entry["absorbed_groups_per_s"] * entry["window_s"])


def _kept_up(entry: dict[str, Any]) -> bool:
    """At least 90% of ideal, less one group's worth when few groups were counted."""
    return bool(entry["efficiency"] >= 0.9 - 1 / max(_counted(entry), 1.0))


def _saturation(levels: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The most workers started; where one driver core would run out; the most episodes
    sustained (`_kept_up`: >= 90% of ideal).

    The driver's CPU share is fitted as idle + cost x groups/s over the levels that kept
    up (the machine was not the limit there), so one core lasts to
    (1 - idle) / cost groups/s; with one such level, its CPU per group is the cost."""
    ran = [e for e in levels if "failed" not in e]
    if not ran:
        return {"max_workers_started": 0, "first_failed": levels[0]["workers"] if levels else None}
    sustained = [e for e in ran if _kept_up(e)]
    fit = sustained or ran
    top = fit[-1]
    if len(fit) >= 2:
        cost, idle = statistics.linear_regression(
            [e["absorbed_groups_per_s"] for e in fit], [e["driver_cpu_share"] for e in fit]
        )
    else:
        cost, idle = top["driver_cpu_ms_per_group"] / 1000, 0.0
    groups_at_core = (1 - idle) / cost if cost > 0 else math.nan
    per_worker = top["ideal_groups_per_s"] / top["workers"]  # groups/s one busy worker yields
    episodes_per_worker = top["episodes_in_flight_target"] / top["workers"]
    return {
        "max_workers_started": ran[-1]["workers"],
        "first_failed": next((e["workers"] for e in levels if "failed" in e), None),
        "driver_cpu_ms_per_group_fit": cost * 1000,
        "driver_idle_cores_fit": idle,
        "groups_per_s_at_one_core": groups_at_core,
        "workers_at_one_core": groups_at_core / per_worker,
        "episodes_at_one_core": groups_at_core / per_worker * episodes_per_worker,
        "max_episodes_sustained": max(
            (e["episodes_in_flight_mean"] for e in sustained), default=0.0
        ),
        # Levels that fell behind while the driver had CPU to spare: the machine's limit.
        "machine_limited": [
            e["workers"] for e in ran if not _kept_up(e) and e["driver_cpu_share"] < 0.8
        ],
    }


def scale_table(result: dict[str, Any]) -> dict[str, Any]:
    headers = [
        "workers", "start-up s", "PSS/worker MiB", "groups in flight", "episodes in flight",
        "ideal groups/s", "dispatched/s", "absorbed/s", "of ideal", "driver CPU ms/group",
        "driver cores",
    ]  # fmt: skip
    rows: list[list[object]] = []
    for e in result["levels"]:
        if "failed" in e:
            rows.append([e["workers"], e["start_up_s"], "start-up failed", *[""] * 8])
            continue
        rows.append(
            [
                e["workers"],
                e["start_up_s"],
                e["pss_per_worker_mib"],
                e["groups_in_flight"],
                e["episodes_in_flight_mean"],
                e["ideal_groups_per_s"],
                e["dispatched_groups_per_s"],
                e["absorbed_groups_per_s"],
                e["efficiency"],
                e["driver_cpu_ms_per_group"],
                e["driver_cpu_share"],
            ]
        )
    return {
        "title": (
            f"one driver, N simulated rollout workers (groups of {result['group_size']}, "
            f"{result['spec']['turns']} turns, {result['group_s']:.1f} s a group, "
            f"{result['payload_kib_per_group']:.0f} KiB a group)"
        ),
        "headers": headers,
        "rows": rows,
    }


def scale_notes(result: dict[str, Any]) -> list[str]:
    first_failed = result.get("first_failed")
    notes = [
        f"max workers started: {result['max_workers_started']}"
        + (f" (start-up failed at {first_failed})" if first_failed else " (all asked for)")
    ]
    if result["max_workers_started"]:
        notes.append(
            f"driver CPU = {result['driver_idle_cores_fit']:.3f} cores idle + "
            f"{result['driver_cpu_ms_per_group_fit']:.1f} ms a group (fit over the levels that "
            f"kept up): one core saturates at ~{result['groups_per_s_at_one_core']:.0f} "
            f"groups/s, i.e. ~{result['workers_at_one_core']:.0f} workers or "
            f"~{result['episodes_at_one_core']:.0f} episodes in flight at these group times"
        )
        notes.append(
            "most episodes in flight one driver sustained here (>= 90% of ideal, less one "
            "group's worth when few were counted): "
            f"{result['max_episodes_sustained']:.0f}"
        )
    few = [
        (e["workers"], round(_counted(e)))
        for e in result["levels"]
        if "failed" not in e and _counted(e) < 20
    ]
    if few:
        notes.append(
            "few groups in the window (N, groups): "
            + ", ".join(f"({n}, {g})" for n, g in few)
            + ": one group more or less moves their rates by 1/groups (--waves measures longer)"
        )
    if result.get("machine_limited"):
        notes.append(
            f"N = {result['machine_limited']}: below 90% of ideal with the driver under 0.8 "
            "core: this machine's CPUs (worker processes, raylet) are the limit, not the driver"
        )
    return notes
