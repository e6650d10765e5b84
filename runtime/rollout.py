"""Groups: G episodes of one task at once, each in its own context with its own tenant.

`Rollout` holds what every episode needs (environment, browser pool, policy, settings,
the limiter on episodes in flight, the pause gate) and runs groups with `run_group`.
Every episode of a group ends with a `Trajectory`, whatever happens: an environment or
browser failure before the first turn is recorded as a turnless trajectory with its
`error:*` status, and `interrupt_all()` ends running and waiting episodes as
`interrupted`. So a group always holds G trajectories.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import structlog

from runtime.base.messages import Event, GroupReady, TaskConfig, Trajectory, TrajectoryGroup
from runtime.browser import BrowserPool
from runtime.environment import Environment
from runtime.episode import Episode, EpisodeSettings, Gate
from runtime.errors import BrowserError
from runtime.guided import GuidedPolicy, guide_of
from runtime.logs import bind_ids
from runtime.observation import TokenCounter, estimate_tokens
from runtime.oracle import OraclePolicy
from runtime.protocols import Policy

__all__ = ["WORKER_LOST", "GroupRunner", "Rollout", "RolloutStatistics"]

# The status of an episode whose rollout worker died under it (`runtime.cluster`): an
# infrastructure failure, never trained; the scheduler draws its task again.
WORKER_LOST = "error:worker"

log = structlog.get_logger("runtime.rollout")


@dataclass(slots=True)
class RolloutStatistics:
    """Episodes waiting for a slot, running, and finished (by status); turns taken."""

    episodes_waiting: int = 0
    episodes_running: int = 0
    episodes_finished: dict[str, int] = field(default_factory=dict)
    turns: int = 0


class GroupRunner(Protocol):
    """What the scheduler drives: `Rollout` in this process, `runtime.cluster.RayRollout`
    on Ray's rollout workers."""

    @property
    def gate(self) -> Gate: ...

    @property
    def stats(self) -> RolloutStatistics: ...

    async def run_group(
        self, task: TaskConfig, *, group_size: int, split: str = "", group_id: str | None = None
    ) -> TrajectoryGroup: ...

    def interrupt_all(self) -> None: ...


class Rollout:
    """Runs groups of episodes; owns nothing but books (the caller owns the task groups)."""

    def __init__(
        self,
        *,
        environment: Environment,
        pool: BrowserPool,
        policy: Policy,
        settings: EpisodeSettings,
        max_episodes: int = 32,
        count_tokens: TokenCounter = estimate_tokens,
        on_event: Callable[[Event], None] | None = None,
        gate: Gate | None = None,
        oracle: OraclePolicy | None = None,
        guide_shown: bool = True,
    ) -> None:
        self.environment = environment
        self.pool = pool
        self.policy = policy
        # Plays the first steps of guided tasks (`runtime.guided`); without it a guided
        # task is refused (evaluations are never guided).
        self.oracle = oracle
        self.guide_shown = guide_shown  # the oracle's turns in the policy's prompts
        self.settings = settings
        self.count_tokens = count_tokens
        self.on_event = on_event
        self.gate = gate if gate is not None else Gate()
        self.limiter = anyio.CapacityLimiter(max_episodes)
        self.stats = RolloutStatistics()
        self._waiting: set[anyio.CancelScope] = set()
        self._running: set[Episode] = set()
        # Bumped by interrupt_all: episodes of groups begun before it never start.
        self._generation = 0

    def interrupt_all(self) -> None:
        """End every episode of the groups in flight now: running ones keep their turns,
        waiting ones have none. Groups begun afterwards run normally."""
        self._generation += 1
        for scope in list(self._waiting):
            scope.cancel()
        for episode in list(self._running):
            episode.interrupt()

    async def run_group(
        self, task: TaskConfig, *, group_size: int, split: str = "", group_id: str | None = None
    ) -> TrajectoryGroup:
        """G episodes of `task` at once; returns when all G have a trajectory.
        Raises ValueError for a guided task (`TaskConfig.guide`) without an oracle."""
        guide = guide_of(task)
        if guide and self.oracle is None:
            raise ValueError(
                f"task {task.task_id} asks for a guided start (guide={guide}), which only "
                "training with scheduler.guide_longer_than runs"
            )
        group_id = group_id or uuid.uuid4().hex[:12]
        started = time.time()
        results: list[Trajectory | None] = [None] * group_size
        generation = self._generation

        async def one(index: int) -> None:
            episode_id = f"{group_id}-{index}"
            results[index] = await self._episode(task, group_id, episode_id, generation)

        with bind_ids(group_id=group_id, task_id=task.task_id):
            async with anyio.create_task_group() as tg:
                for index in range(group_size):
                    tg.start_soon(one, index)
            trajectories = [t for t in results if t is not None]
            group = TrajectoryGroup(
                group_id=group_id,
                task_id=task.task_id,
                trajectories=trajectories,
                created_at=time.time(),
                split=split,
                guide=guide,
            )
            rewards = [t.reward for t in trajectories]
            if self.on_event is not None:
                self.on_event(
                    GroupReady(
                        at=group.created_at,
                        group_id=group_id,
                        task_id=task.task_id,
                        rewards=rewards,
                    )
                )
            log.info(
                "group.finished",
                size=len(trajectories),
                successes=sum(1 for r in rewards if r > 0),
                statuses=sorted({t.status for t in trajectories}),
                seconds=round(group.created_at - started, 3),
            )
            return group

    async def _episode(
        self, task: TaskConfig, group_id: str, episode_id: str, generation: int
    ) -> Trajectory:
        started = time.time()
        waiting = anyio.CancelScope()
        if generation != self._generation:
            waiting.cancel()  # its group was interrupted before this episode began
        self._waiting.add(waiting)
        self.stats.episodes_waiting += 1
        status = "interrupted"
        error = ""
        trajectory: Trajectory | None = None
        try:
            with waiting:
                async with (
                    self.limiter,
                    self.environment.episode(task) as setup,
                    self.pool.session(allowed=setup.allowed, cookies=setup.cookies) as session,
                ):
                    policy = self.policy
                    if guide := guide_of(task):
                        assert self.oracle is not None  # run_group refused it otherwise
                        policy = GuidedPolicy(self.oracle, policy, guide, shown=self.guide_shown)
                    episode = Episode(
                        episode_id=episode_id,
                        group_id=group_id,
                        task=setup.task,
                        start_urls=setup.start_urls,
                        urls=setup.urls,
                        session=session,
                        policy=policy,
                        evaluate=self.environment.evaluate,
                        settings=self.settings,
                        count_tokens=self.count_tokens,
                        on_event=self.on_event,
                        gate=self.gate,
                    )
                    self._waiting.discard(waiting)
                    self.stats.episodes_waiting -= 1
                    self.stats.episodes_running += 1
                    self._running.add(episode)
                    try:
                        trajectory = await episode.run()
                    finally:
                        self._running.discard(episode)
                        self.stats.episodes_running -= 1
        except BrowserError as exc:
            status, error = "error:browser", str(exc)
        except Exception as exc:  # a tenant that could not be made, a site that is down
            status, error = "error:environment", f"{type(exc).__name__}: {exc}"
            log.exception("episode.environment_failed", episode_id=episode_id)
        finally:
            if waiting in self._waiting:
                self._waiting.discard(waiting)
                self.stats.episodes_waiting -= 1
        if trajectory is None:
            if error:
                log.warning(
                    "episode.not_started", episode_id=episode_id, status=status, error=error
                )
            trajectory = Trajectory(
                episode_id=episode_id,
                group_id=group_id,
                task_id=task.task_id,
                intent=task.intent,
                status=status,
                started_at=started,
                finished_at=time.time(),
            )
        self.stats.episodes_finished[trajectory.status] = (
            self.stats.episodes_finished.get(trajectory.status, 0) + 1
        )
        self.stats.turns += len(trajectory.turns)
        return trajectory
