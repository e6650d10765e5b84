"""Online training, once the policy is served: rollouts, the store, the learner.

    scheduler ── groups ──> pump ──> store (fsync) ──> learner (worker thread)
        ^                                                  │ publish (through the supervisor)
        ├── held while the server is down, or (max_staleness 0) while an update runs
        └── no new group while it would reach the learner stale (`Learner.admits`)

`Training` is what the daemon starts when it trains. `start` makes the learner resume and
publish its version, then starts the scheduler and the pump; every finished group is
stored (fsynced) before the learner sees it, and a group stored but never journaled (a
kill between the two) is handed to the learner first. `drain` lets groups in flight
finish (or records them interrupted after the timeout); `done` is set once the learner's
loop has returned, that is, once every drained group is journaled.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import httpx
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from policy.client import CompletionClient
from policy.orm import OrmJudge
from policy.prompt import build_messages
from runtime.base.config import Config, ConfigError
from runtime.base.messages import Event, TaskConfig, TrajectoryGroup
from runtime.browser import BrowserPool
from runtime.cluster import RayRollout, ray_rollout
from runtime.environment import Environment
from runtime.episode import EpisodeSettings
from runtime.evolution import BuiltinMaker, TaskEvolution, TaskMaker
from runtime.guided import guided_variants, steps_left
from runtime.labeling import JUDGE_NAME, OrmJudgeAdapter, OrmLabeler
from runtime.oracle import OraclePolicy
from runtime.policystack import PolicyStack
from runtime.rollout import GroupRunner, Rollout
from runtime.scheduler import Scheduler
from runtime.store import TrajectoryStore, read_groups, unseen_groups
from runtime.supervisor import ServerSupervisor
from sites.builtin import plan_length
from sites.chat import ChatModel
from sites.errors import GeneratorError
from sites.generate import IntentGenerator

if TYPE_CHECKING:
    from learner.demos import BCExample
    from learner.trainer import Learner

__all__ = ["Training"]

log = structlog.get_logger("runtime.training")


class Training:
    """The scheduler, the pump and the learner of one training run."""

    def __init__(
        self,
        config: Config,
        *,
        model: str,
        run_dir: Path,
        stack: PolicyStack,
        supervisor: ServerSupervisor,
        stopping: anyio.Event,
        record: Callable[[Event], None],
        url_overrides: Mapping[str, str] | None = None,
        judge_key: str = "",
        denied: Sequence[tuple[str, int]] = (),
        http: httpx.AsyncClient | None = None,
        generator_key: str = "",
    ) -> None:
        self.config = config
        self.store_path = run_dir / "trajectories.jsonl"
        self.scheduler: Scheduler | None = None
        self._handed_first = 0  # stored groups never journaled, handed to the learner first
        self._pool: BrowserPool | None = None  # every episode's browser contexts (in `start`)
        self.done = anyio.Event()
        # What rollout workers on Ray need besides the config (`runtime.cluster`).
        self._url_overrides = dict(url_overrides or {})
        self._judge_key = judge_key
        self._denied = list(denied)
        self._ray: RayRollout | None = None
        self._rollouts_over = anyio.Event()
        self._stack = stack
        self._supervisor = supervisor
        self._stopping = stopping
        self._record = record
        self._run_dir = run_dir
        self._settings = EpisodeSettings.from_config(config)  # the episodes' (and prompts')
        self._http = http  # WebRL's task generator's (the daemon's client for chat models)
        self._generator_key = generator_key
        # WebRL's curriculum on the built-in sites (made in `start`, once tasks are known).
        self.evolution: TaskEvolution | None = None
        # The outcome reward model's verdicts for tasks without an evaluator (sites.orm_judge).
        self.labeler: OrmLabeler | None = None
        if config.sites.orm_judge:
            client = stack.client
            if not isinstance(client, CompletionClient):
                raise ConfigError(
                    "config", "sites.orm_judge", "needs one policy server, not replicas"
                )
            adapter = OrmJudgeAdapter(client, config.sites.orm_judge, served_model=model)
            # As many top log-probs as the server gives (policy.max_logprobs).
            judge = OrmJudge(client, stack.renderer, model=JUDGE_NAME, k=config.policy.max_logprobs)
            self.labeler = OrmLabeler(judge, adapter, on_event=self._emit)
        webrl = config.learner.algorithm == "webrl"
        from learner.trainer import Learner  # torch: loaded only where training runs

        demos = self._bc_demos(stack) if config.learner.bc_coef > 0 else []

        self.learner: Learner = Learner(
            config.learner,
            base_model=model,
            out_dir=run_dir / "learner",
            publish=self._publish,
            emit=self._emit,
            read_groups=functools.partial(read_groups, self.store_path),
            decode=stack.renderer.decode,
            adapter_prefix=config.policy.adapter_prefix,
            temperature=config.policy.temperature,
            on_updating=self.hold_for_update if config.learner.max_staleness == 0 else None,
            webrl=config.webrl,
            on_phase=self._evolve if webrl else None,
            threads=self._learner_threads,
            demos=demos,
        )

    def _bc_demos(self, stack: PolicyStack) -> list[BCExample]:
        """`learner.bc_demos`' successful turns rendered as the episodes render prompts
        (the BC term of `learner.bc_coef`); a file that cannot be used is a ConfigError."""
        from learner.demos import demo_examples, read_demos
        from learner.errors import DemonstrationError

        path = self.config.learner.bc_demos
        try:
            return demo_examples(
                read_demos(path),
                stack.renderer,
                keep_thoughts=self._settings.keep_thoughts,
                system_prompt=self._settings.system_prompt,
            )
        except DemonstrationError as exc:
            raise ConfigError("config", "learner.bc_demos", str(exc)) from exc

    def hold(self) -> None:
        """No update after the one in progress: groups from a drain are trained after a
        restart."""
        self.learner.hold()

    def hold_for_policy(self, down: bool) -> None:
        """No new turns while the policy server is down (they would fail for want of it)."""
        if self.scheduler is not None:
            self.scheduler.hold_for_policy(down)

    def hold_for_update(self, updating: bool) -> None:
        """`max_staleness` 0: no new turns while the learner updates (a group with a turn
        of the version being replaced is stale once the update is published)."""
        if self.scheduler is not None:
            self.scheduler.hold_for_update(updating)

    async def start(self, tg: TaskGroup, environment: Environment, pool: BrowserPool) -> None:
        """Resume the learner (which publishes its version), then start rollouts."""
        config = self.config
        self._pool = pool
        if self._stopping.is_set():  # a stop that came during start-up holds it too
            self.hold()
        # Opened first: a torn last line (a kill mid-append) is cut before anything reads.
        store = TrajectoryStore(self.store_path)
        groups_send, groups_recv = anyio.create_memory_object_stream[TrajectoryGroup](
            config.scheduler.stream_buffer
        )
        started = False
        try:
            learn_send, learn_recv = anyio.create_memory_object_stream[TrajectoryGroup](0)
            version = await tg.start(self._learn, learn_recv)
            log.info("daemon.learner_ready", version=version)
            rollout: GroupRunner
            if config.cluster.backend == "ray":
                rollout = self._ray = await tg.start(self._ray_workers)
            else:
                rollout = Rollout(
                    environment=environment,
                    pool=pool,
                    policy=self._stack.policy,
                    settings=self._settings,
                    max_episodes=config.scheduler.max_episodes_in_flight,
                    count_tokens=self._stack.renderer.count_tokens,
                    on_event=self._record,
                    oracle=OraclePolicy() if config.scheduler.guide_longer_than else None,
                    guide_shown=config.scheduler.guide_shown,
                )
            tasks = list(environment.tasks(config.scheduler.split))
            if config.scheduler.guide_longer_than:
                tasks += guided_variants(tasks, config.scheduler.guide_longer_than, plan_length)
            scheduler = Scheduler(
                rollout=rollout,
                tasks=tasks,
                send=groups_send,
                group_size=config.scheduler.group_size,
                max_groups=config.scheduler.max_groups_in_flight,
                split=config.scheduler.split,
                seed=config.scheduler.seed + max(self.learner.version, 0),
                curriculum=config.scheduler.curriculum,
                length=steps_left(plan_length),
                signal_ceiling=config.scheduler.signal_ceiling,
                signal_warmup=config.scheduler.signal_warmup,
                admit=self._admit if config.scheduler.only_fresh_groups else None,
            )
            # A resumed run goes on from its store: the rewards seen, the tasks drawn.
            await anyio.to_thread.run_sync(
                scheduler.curriculum.observe_store, self.store_path, config.scheduler.split
            )
            if config.learner.max_staleness == 0 and self.learner.statistics().updating:
                scheduler.hold_for_update(True)  # released when that update is published
            if not self._supervisor.is_up:
                scheduler.hold_for_policy(True)  # released when the server is back
            self.scheduler = scheduler
            maker = self._task_maker()
            if maker is not None:
                self.evolution = TaskEvolution(
                    config,
                    tasks=scheduler.tasks,
                    run_dir=self._run_dir,
                    values=self.learner.task_values,
                    first_prompt=self._first_prompt,
                    maker=maker,
                )
                await anyio.to_thread.run_sync(self.evolution.resume, scheduler.add_tasks)
            unjournaled = await anyio.to_thread.run_sync(
                unseen_groups, self.store_path, self.learner.has_seen
            )
            self._handed_first = len(unjournaled)
            if unjournaled:
                log.warning("daemon.unjournaled_groups", groups=[g.group_id for g in unjournaled])
            started = True
        finally:
            if not started:  # start-up failed or was cancelled: nothing will append
                store.close()
        tg.start_soon(self._schedule, scheduler)
        tg.start_soon(self._pump, groups_recv, learn_send, store, unjournaled)

    def _admit(self) -> bool:
        """The scheduler's `admit`: a new group only where the learner would train it.
        The groups ahead of it: those started (and the unjournaled ones handed over
        first) that the learner has not taken yet."""
        if self.scheduler is None:
            return True
        started = self.scheduler.statistics().groups_started + self._handed_first
        return self.learner.admits(started - self.learner.statistics().groups_received)

    def _learner_threads(self) -> int:
        """The learner's torch threads now: `learner.torch_threads` while an episode runs
        (training's or an evaluation's: a browser context is open), `learner.idle_threads`
        while none does. Called in the learner's thread: it only reads counters."""
        cores = os.cpu_count() or 1
        learner = self.config.learner
        scheduler, pool = self.scheduler, self._pool
        if scheduler is None or pool is None:
            return learner.torch_threads or cores
        busy = scheduler.rollout.stats.episodes_running > 0 or pool.contexts_open > 0
        return (learner.torch_threads if busy else learner.idle_threads) or cores

    async def drain(self, timeout_s: float) -> None:
        """No new groups; those in flight finish, or end `interrupted` after `timeout_s`."""
        if self.scheduler is not None:
            await self.scheduler.stop(timeout_s)

    async def _schedule(self, scheduler: Scheduler) -> None:
        try:
            await scheduler.run()
        finally:
            self._rollouts_over.set()  # the Ray workers may close

    async def _ray_workers(
        self, *, task_status: TaskStatus[RayRollout] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Rollout workers on Ray, held until the scheduler has returned."""
        adapters = self._stack.adapters
        async with ray_rollout(
            self.config,
            server_urls=self._stack.urls,
            current=lambda: adapters.current,
            on_event=self._record,
            url_overrides=self._url_overrides,
            judge_key=self._judge_key,
            denied=self._denied,
            start_timeout_s=self.config.policy.startup_timeout_s,
        ) as rollout:
            task_status.started(rollout)
            await self._rollouts_over.wait()

    async def _learn(
        self,
        groups: MemoryObjectReceiveStream[TrajectoryGroup],
        *,
        task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            await self.learner.run(groups, task_status=task_status)
        finally:
            self.done.set()

    async def _publish(self, path: Path) -> None:
        await self._supervisor.publish(path, stopping=self._stopping)
        if self._ray is not None:
            self._ray.follow()  # the workers' next turns use the new version

    async def _emit(self, event: Event) -> None:
        self._record(event)

    def _task_maker(self) -> TaskMaker | None:
        """WebRL's maker of new tasks: the built-in suite's, or on WebArena the configured
        chat model's (`webrl.generator_url`); None when the curriculum makes none."""
        config = self.config
        webrl = config.webrl
        if config.learner.algorithm != "webrl" or not webrl.evolve_per_parent:
            return None
        if config.sites.kind == "builtin":
            return BuiltinMaker(config.sites.seed)
        if not webrl.generator_url or self._http is None:
            return None
        model = ChatModel(
            self._http, url=webrl.generator_url, model=webrl.generator_model,
            api_key=self._generator_key, timeout_s=webrl.generator_timeout_s,
            error=GeneratorError, who="task generator",
        )  # fmt: skip
        return IntentGenerator(model)

    async def _evolve(self, groups: Sequence[TrajectoryGroup], version: int) -> None:
        """WebRL's `on_phase`: the curriculum makes new tasks from the phase's failures."""
        if self.evolution is not None:
            await self.evolution.phase(groups, version)

    def _first_prompt(self, task: TaskConfig, observation: str) -> list[int]:
        """The prompt ids of a task's first turn on a start page showing `observation`,
        as an episode builds them (`runtime.episode`)."""
        settings = self._settings
        messages = build_messages(
            task.intent,
            [],
            observation,
            keep_thoughts=settings.keep_thoughts,
            system_prompt=settings.system_prompt,
        )
        return self._stack.renderer.render(messages)

    async def _pump(
        self,
        groups: MemoryObjectReceiveStream[TrajectoryGroup],
        learner: MemoryObjectSendStream[TrajectoryGroup],
        store: TrajectoryStore,
        unjournaled: list[TrajectoryGroup],
    ) -> None:
        """Every finished group: stored (fsynced) first, then handed to the learner;
        `unjournaled` (stored already) goes to the learner before them."""
        async with groups, learner:
            try:
                for group in unjournaled:
                    await learner.send(group)
                async for finished in groups:
                    group = finished
                    if self.labeler is not None:  # tasks without an evaluator: the ORM's reward
                        group = await self.labeler.label(finished)
                    await store.append_async(group)
                    if self.evolution is not None:
                        self.evolution.observe(group)
                    await learner.send(group)
            finally:
                store.close()
