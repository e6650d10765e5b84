"""Rollouts on a Ray cluster: rollout-worker actors run whole groups, the driver schedules.

    driver (the daemon's process)                      Ray actors, on any host
    Scheduler ── task ──> RayRollout.run_group ──────> RolloutWorker k (least loaded):
        ^                                                its own event loop, Chromium, sites,
        │                                                Rollout, VLLMPolicy ──> vLLM
        └── TrajectoryGroup + the group's events <─────┘
    learner publishes v7 ── RayRollout.follow() ───────> every worker's AdapterFollower
    Gate (pause, update, policy) ── on_change ─────────> every worker's Gate

`cluster.backend = "ray"` swaps this in for `runtime.rollout.Rollout`; the scheduler, the
store, the learner and the hot-swap stay in the driver and do not know the difference
(`runtime.rollout.GroupRunner`). A worker is a threaded actor around a blocking portal:
the event loop with its browser pool, environment (built-in sites served by the worker
itself, or its share of `sites.instances`) and policy client runs in a thread of its own,
and each actor call hands a group to it and blocks until the group is done. Messages
cross as msgpack bytes of the same msgspec types.

A worker that dies (its process killed, its host lost): the groups it had end as
`error:worker` trajectories (an infrastructure failure: stored, never trained; the
scheduler draws their tasks again), a `Fault` event says so, and Ray restarts the actor
(`cluster.max_worker_restarts`). No group goes to it until it answers again; its next
group carries the current adapter version and gate, so it needs nothing else. With every
worker gone for good, `run_group` raises `WorkersLostError`. Ray is optional: `pip install
'webagent-r1[ray]'`, imported only here and only when the backend is "ray".
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import httpx
import msgspec
import structlog
from anyio.from_thread import start_blocking_portal

from policy.adapters import AdapterLease
from policy.client import CompletionClient, SamplingParams, VLLMPolicy
from policy.follower import AdapterFollower
from policy.prompt import PromptRenderer
from policy.replicas import ReplicaSet
from runtime.base.config import Config, ConfigError
from runtime.base.messages import Event, Fault, TaskConfig, Trajectory, TrajectoryGroup
from runtime.browser import BrowserPool
from runtime.episode import EpisodeSettings, Gate
from runtime.observation import TokenCounter, estimate_tokens
from runtime.oracle import OraclePolicy
from runtime.protocols import Policy
from runtime.ray_session import close_actors, import_ray, ray_session
from runtime.rollout import WORKER_LOST, Rollout, RolloutStatistics
from runtime.webarena_environment import open_environment
from sites.judge import HttpJudge

__all__ = [
    "RayRollout",
    "RolloutWorker",
    "WorkerSpec",
    "WorkersLostError",
    "ray_rollout",
]

log = structlog.get_logger("runtime.cluster")


class WorkersLostError(RuntimeError):
    """Every rollout worker died and none was restarted in time."""


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What one rollout worker is built from (its actor's constructor argument)."""

    config: Config  # settled: policy.model names the served model
    index: int
    server_urls: list[str]
    # Episodes at once and policy requests at once on this worker.
    contexts: int
    max_requests: int
    url_overrides: dict[str, str] = {}
    judge_key: str = ""
    # (host, port) no page may reach: the driver's control API.
    denied: list[tuple[str, int]] = []
    # "served": the model on the policy servers; "oracle": the scripted teacher of the
    # built-in sites (`runtime.oracle`: demonstrations, and the rollout overhead benchmark).
    policy: Literal["served", "oracle"] = "served"


class _State(msgspec.Struct, frozen=True):
    """The driver's adapter version and gate, sent with every group and after changes."""

    adapter: AdapterLease | None
    gate: list[str]


class _GroupDone(msgspec.Struct, frozen=True):
    group: TrajectoryGroup
    events: list[Event]


_state_decoder = msgspec.msgpack.Decoder(_State)
_done_decoder = msgspec.msgpack.Decoder(_GroupDone)
_task_decoder = msgspec.msgpack.Decoder(TaskConfig)


@asynccontextmanager
async def _worker_rollout(
    spec: WorkerSpec, follower: AdapterFollower, record: Callable[[Event], None]
) -> AsyncIterator[Rollout]:
    """The worker's browser pool, environment and policy, as one `Rollout`."""
    config = spec.config
    browser = msgspec.structs.replace(
        config.browser, max_contexts=max(config.browser.max_contexts, spec.contexts)
    )
    async with (
        BrowserPool(browser, denied=spec.denied, on_event=record) as pool,
        httpx.AsyncClient(timeout=config.policy.request_timeout_s) as http,
        anyio.create_task_group() as watching,
        open_environment(
            config,
            url_overrides=spec.url_overrides,
            browser=pool,
            judge=HttpJudge.from_config(config.sites, http, api_key=spec.judge_key),
        ) as environment,
    ):
        for url in spec.server_urls:
            pool.deny(url)
        policy: Policy
        count_tokens: TokenCounter = estimate_tokens
        if spec.policy == "oracle":
            policy = OraclePolicy(style=config.observation.style)
        else:
            renderer = await anyio.to_thread.run_sync(
                PromptRenderer.from_model, config.policy.model
            )
            count_tokens = renderer.count_tokens
            server: CompletionClient | ReplicaSet
            if len(spec.server_urls) > 1:
                # Requests to the least-loaded replica; the driver's set loads the adapters.
                server = ReplicaSet.from_config(http, spec.server_urls, config.policy)
                await watching.start(server.watch)
            else:
                server = CompletionClient.from_config(http, spec.server_urls[0], config.policy)
            policy = VLLMPolicy(
                server,
                renderer,
                follower,
                sampling=SamplingParams.from_config(config.policy),
                max_model_len=config.policy.max_model_len,
                max_concurrency=spec.max_requests,
                timeout_s=config.policy.request_timeout_s,
            )
        yield Rollout(
            environment=environment,
            pool=pool,
            policy=policy,
            settings=EpisodeSettings.from_config(config),
            max_episodes=spec.contexts,
            count_tokens=count_tokens,
            on_event=record,
            oracle=OraclePolicy() if config.scheduler.guide_longer_than else None,
            guide_shown=config.scheduler.guide_shown,
        )
        watching.cancel_scope.cancel()


class RolloutWorker:
    """A Ray actor (threaded) that runs whole groups in its own event loop.

    Built from msgpack bytes of a `WorkerSpec`; its methods are called by `RayRollout`.
    """

    def __init__(self, spec: bytes) -> None:
        self.spec = msgspec.msgpack.decode(spec, type=WorkerSpec)
        self._events: list[Event] = []
        self._follower = AdapterFollower()
        # Closed here if start-up fails; kept open (`pop_all`) for `close()` if it does not.
        with contextlib.ExitStack() as exits:
            self._portal = exits.enter_context(start_blocking_portal("asyncio"))
            self._rollout = exits.enter_context(
                self._portal.wrap_async_context_manager(
                    _worker_rollout(self.spec, self._follower, self._events.append)
                )
            )
            self._exits = exits.pop_all()
        log.info("worker.ready", index=self.spec.index, pid=os.getpid())

    def pid(self) -> int:
        return os.getpid()

    def run_group(
        self, task: bytes, group_size: int, split: str, group_id: str, state: bytes
    ) -> bytes:
        """One group of `task` (msgpack `TaskConfig`); msgpack of the group and the events
        since the last group returned."""
        self._portal.call(self._apply, _state_decoder.decode(state))
        group = self._portal.call(
            functools.partial(
                self._rollout.run_group,
                _task_decoder.decode(task),
                group_size=group_size,
                split=split,
                group_id=group_id,
            )
        )
        events = self._portal.call(self._take_events)
        return msgspec.msgpack.encode(_GroupDone(group, events))

    def set_state(self, state: bytes) -> None:
        self._portal.call(self._apply, _state_decoder.decode(state))

    def interrupt_all(self) -> None:
        self._portal.call(self._rollout.interrupt_all)

    def close(self) -> None:
        """Close the browser pool and the sites; the actor can be killed after."""
        self._exits.close()

    def _apply(self, state: _State) -> None:  # in the portal's event loop
        if state.adapter is not None:
            self._follower.follow(state.adapter)
        if self._rollout.gate.closed_for != frozenset(state.gate):
            self._rollout.gate.set_reasons(state.gate)

    def _take_events(self) -> list[Event]:  # in the portal's event loop
        events = list(self._events)
        self._events.clear()
        return events


class RayRollout:
    """The driver's side: `run_group` on the least-loaded worker (see the module docstring)."""

    def __init__(
        self,
        workers: Sequence[Any],
        *,
        current: Callable[[], AdapterLease | None],
        on_event: Callable[[Event], None] | None = None,
        lost_errors: tuple[type[BaseException], ...] = (),
        restarting_errors: tuple[type[BaseException], ...] = (),
        restart_timeout_s: float = 300.0,
    ) -> None:
        self.gate = Gate(on_change=lambda reasons: self._broadcast())
        self.stats = RolloutStatistics()
        self.on_event = on_event
        self._workers = list(workers)
        self._current = current
        self._lost_errors = lost_errors
        self._episodes = [0] * len(self._workers)  # in flight on each worker
        self._next = 0  # round-robin among equally loaded workers
        # Workers that died and are not back yet: no group goes to them.
        self._down: set[int] = set()
        self._restarting = restarting_errors  # a call to a worker Ray is restarting
        self._restart_timeout_s = restart_timeout_s
        self.groups_lost = 0

    def follow(self) -> None:
        """Tell every worker the current adapter version (after each publish)."""
        self._broadcast()

    def interrupt_all(self) -> None:
        for worker in self._workers:
            worker.interrupt_all.remote()

    def _state(self) -> bytes:
        return msgspec.msgpack.encode(_State(self._current(), sorted(self.gate.closed_for)))

    def _broadcast(self) -> None:
        state = self._state()
        for worker in self._workers:
            worker.set_state.remote(state)  # a dead worker learns it with its next group

    def _pick(self) -> int:
        n = len(self._workers)
        order = [(self._next + i) % n for i in range(n) if (self._next + i) % n not in self._down]
        if not order:
            raise WorkersLostError(
                f"all {n} rollout workers died and none came back within "
                f"{self._restart_timeout_s:.0f} s (cluster.max_worker_restarts)"
            )
        chosen = min(order, key=lambda k: self._episodes[k])
        self._next = (chosen + 1) % n
        return chosen

    async def run_group(
        self, task: TaskConfig, *, group_size: int, split: str = "", group_id: str | None = None
    ) -> TrajectoryGroup:
        group_id = group_id or uuid.uuid4().hex[:12]
        index = self._pick()
        self._episodes[index] += group_size
        self.stats.episodes_running += group_size
        started = time.time()
        try:
            call = self._workers[index].run_group.remote(
                msgspec.msgpack.encode(task), group_size, split, group_id, self._state()
            )
            try:
                done = _done_decoder.decode(await call)
            except self._lost_errors as exc:
                group = self._lost(
                    task,
                    group_size=group_size,
                    split=split,
                    group_id=group_id,
                    index=index,
                    started=started,
                    exc=exc,
                )
                await self._await_restart(index)
            else:
                group = done.group
                if self.on_event is not None:
                    for event in done.events:
                        self.on_event(event)
        finally:
            self._episodes[index] -= group_size
            self.stats.episodes_running -= group_size
        for trajectory in group.trajectories:
            finished = self.stats.episodes_finished
            finished[trajectory.status] = finished.get(trajectory.status, 0) + 1
            self.stats.turns += len(trajectory.turns)
        return group

    async def _await_restart(self, index: int) -> None:
        """No group goes to a dead worker until Ray has restarted it (it answers again)."""
        self._down.add(index)
        gone: tuple[type[BaseException], ...] = (TimeoutError, *self._lost_errors)
        try:
            with anyio.fail_after(self._restart_timeout_s):
                while True:
                    try:
                        pid = await self._workers[index].pid.remote()
                        break
                    except self._restarting:
                        await anyio.sleep(0.5)
        except gone as exc:
            log.error("worker.gone", worker=index, error=f"{type(exc).__name__}: {exc}")
            return  # stays down
        self._down.discard(index)
        log.warning("worker.restarted", worker=index, pid=pid)

    def _lost(
        self,
        task: TaskConfig,
        *,
        group_size: int,
        split: str,
        group_id: str,
        index: int,
        started: float,
        exc: BaseException,
    ) -> TrajectoryGroup:
        """The group a dead worker took with it: G turnless `error:worker` trajectories."""
        self.groups_lost += 1
        message = f"{type(exc).__name__}: {str(exc)[:300]}"
        log.error("worker.lost_group", worker=index, group_id=group_id, error=message)
        now = time.time()
        if self.on_event is not None:
            self.on_event(Fault(at=now, kind="worker", message=message, where=f"worker {index}"))
        trajectories = [
            Trajectory(
                episode_id=f"{group_id}-{i}",
                group_id=group_id,
                task_id=task.task_id,
                intent=task.intent,
                status=WORKER_LOST,
                started_at=started,
                finished_at=now,
            )
            for i in range(group_size)
        ]
        return TrajectoryGroup(
            group_id=group_id,
            task_id=task.task_id,
            trajectories=trajectories,
            created_at=now,
            split=split,
        )


def worker_specs(
    config: Config,
    *,
    server_urls: Sequence[str],
    url_overrides: dict[str, str] | None = None,
    judge_key: str = "",
    denied: Sequence[tuple[str, int]] = (),
    policy: Literal["served", "oracle"] = "served",
) -> list[WorkerSpec]:
    """One spec per worker: WebArena instances dealt out among them; the policy's request
    slots shared by the workers in proportion to the servers there are."""
    cluster = config.cluster
    instances = config.sites.instances
    if config.sites.kind == "webarena" and instances and len(instances) < cluster.workers:
        raise ConfigError(
            "config",
            "cluster.workers",
            f"{cluster.workers} workers but {len(instances)} WebArena instances: each worker "
            "needs one of its own",
        )
    per_worker = math.ceil(config.policy.max_concurrency * len(server_urls) / cluster.workers)
    specs = []
    for index in range(cluster.workers):
        sites = config.sites
        if sites.kind == "webarena" and instances:
            sites = msgspec.structs.replace(sites, instances=instances[index :: cluster.workers])
        specs.append(
            WorkerSpec(
                config=msgspec.structs.replace(config, sites=sites),
                index=index,
                server_urls=list(server_urls),
                contexts=cluster.contexts_per_worker,
                max_requests=max(1, per_worker),
                url_overrides=dict(url_overrides or {}),
                judge_key=judge_key,
                denied=list(denied),
                policy=policy,
            )
        )
    return specs


@asynccontextmanager
async def ray_rollout(
    config: Config,
    *,
    server_urls: Sequence[str],
    current: Callable[[], AdapterLease | None],
    on_event: Callable[[Event], None] | None = None,
    url_overrides: dict[str, str] | None = None,
    judge_key: str = "",
    denied: Sequence[tuple[str, int]] = (),
    policy: Literal["served", "oracle"] = "served",
    start_timeout_s: float = 300.0,
) -> AsyncIterator[RayRollout]:
    """Rollout workers on the configured Ray cluster (a local one started for this
    process when `cluster.address` is empty), ready, as a `RayRollout`; closed on exit."""
    ray = import_ray()
    specs = worker_specs(
        config,
        server_urls=server_urls,
        url_overrides=url_overrides,
        judge_key=judge_key,
        denied=denied,
        policy=policy,
    )
    async with ray_session(config), _workers(ray, config, specs, start_timeout_s) as workers:
        yield RayRollout(
            workers,
            current=current,
            on_event=on_event,
            lost_errors=(ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError),
            restarting_errors=(ray.exceptions.ActorUnavailableError,),
            restart_timeout_s=start_timeout_s,
        )


@asynccontextmanager
async def _workers(
    ray: Any, config: Config, specs: Sequence[WorkerSpec], start_timeout_s: float
) -> AsyncIterator[list[Any]]:
    """The rollout-worker actors of `specs`, answering; closed and killed on exit."""
    cluster = config.cluster
    actor = ray.remote(RolloutWorker)
    workers = [
        actor.options(
            num_cpus=cluster.cpus_per_worker,
            max_restarts=cluster.max_worker_restarts,
            max_task_retries=0,
            # Its groups, and the gate, adapter and interrupt calls beside them.
            max_concurrency=spec.contexts + 8,
        ).remote(msgspec.msgpack.encode(spec))
        for spec in specs
    ]
    try:
        with anyio.fail_after(start_timeout_s):
            pids = [await worker.pid.remote() for worker in workers]
        log.info("cluster.ready", workers=len(workers), pids=pids, address=cluster.address)
        yield workers
    finally:
        await close_actors(ray, workers)
