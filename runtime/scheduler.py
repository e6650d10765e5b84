"""The scheduler: draws tasks, keeps groups in flight, sends finished groups on.

    tasks of a split --(curriculum: shuffled, or toward mixed groups)--> N groups in flight
        each group: G episodes (the rollout's limiter keeps <= M episodes in flight)
    finished group --> bounded memory object stream --> learner / store / evaluation

`run()` ends when `num_groups` groups are finished (evaluation, benchmarks, demos), or,
with `num_groups=None` (training), when `stop()` is called. It closes the send stream it
was given when it returns, so the consumer's `async for` ends. A full stream holds the
finished group (and its slot) back: backpressure, not loss.

`stop(timeout_s)` starts no new group, lets the groups in flight finish, and after
`timeout_s` interrupts the episodes still running; those groups are still sent, with the
episodes recorded as `interrupted`. `pause()`/`resume()` close and open the gate at which
episodes wait before each policy call (no new turns while paused; contexts stay open);
`hold_for_update(True/False)` does the same for the learner's updates, and
`hold_for_policy` while the policy server is down, independently of a pause (the gate
opens when none holds it).

`admit` (optional, training) is asked before each new group: while it says no, no group
starts (the groups in flight go on). The daemon's says no while a group started now would
reach the learner too late to be trained (`Learner.admits`): the learner is then the
bottleneck, and the rollout would only take the CPU from it.

The groups run on a `GroupRunner`: `Rollout` in this process, or `runtime.cluster`'s
`RayRollout` on Ray's rollout workers. A group lost with its worker (every episode
`error:worker`) is sent on like any other (stored, never trained) and its task is drawn
again next.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio
import structlog
from anyio.streams.memory import MemoryObjectSendStream

from runtime.base.messages import TaskConfig, TrajectoryGroup
from runtime.curriculum import Curriculum, CurriculumKind, TaskLength
from runtime.rollout import WORKER_LOST, GroupRunner

__all__ = ["Scheduler", "SchedulerStatistics"]

log = structlog.get_logger("runtime.scheduler")

# Steps/s is measured over this many seconds of recent history.
_RATE_WINDOW_S = 60.0
# How often a new group held back by `admit` asks again (groups take minutes).
_ADMIT_POLL_S = 0.5

# Asked before each new group: True to start it now.
Admit = Callable[[], bool]


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """What `Scheduler.statistics()` reports."""

    groups_in_flight: int
    groups_started: int
    groups_finished: int
    episodes_waiting: int
    episodes_in_flight: int
    episodes_finished: int
    episodes_failed: int
    queue_depth: int
    turns: int
    steps_per_s: float
    episodes_per_s: float
    epoch: int
    paused: bool
    stopping: bool
    # Why new turns wait, when they do: "pause", "update", "policy" (server down).
    held_for: tuple[str, ...] = ()
    # Finished groups whose evaluated rewards differ: the ones M-GRPO learns from.
    groups_mixed: int = 0
    # No new group starts for now: `admit` says it would come too late to be trained.
    waiting_for_learner: bool = False


class Scheduler:
    """Keeps up to `max_groups` groups of `group_size` episodes in flight."""

    def __init__(
        self,
        *,
        rollout: GroupRunner,
        tasks: Sequence[TaskConfig],
        send: MemoryObjectSendStream[TrajectoryGroup],
        group_size: int,
        max_groups: int,
        split: str = "",
        seed: int = 0,
        num_groups: int | None = None,
        shuffle: bool = True,
        curriculum: CurriculumKind = "uniform",
        length: TaskLength | None = None,
        signal_ceiling: float = 1.0,
        signal_warmup: int = 0,
        admit: Admit | None = None,
    ) -> None:
        if not tasks:
            raise ValueError(f"no tasks to schedule (split {split!r} is empty)")
        self.rollout = rollout
        self.tasks = list(tasks)
        self.curriculum = Curriculum(
            self.tasks,
            kind=curriculum,
            group_size=group_size,
            seed=f"{seed}:{split}",
            shuffle=shuffle,
            length=length,
            ceiling=signal_ceiling,
            warmup=signal_warmup,
        )
        self.send = send
        self.group_size = group_size
        self.split = split
        self.num_groups = num_groups
        # A semaphore, not a CapacityLimiter: the producer acquires, the group task releases.
        self._slots = anyio.Semaphore(max_groups)
        self._admit = admit
        self._waiting_for_learner = False
        self._producer = anyio.CancelScope()
        self._idle = anyio.Event()
        self._started = 0
        self._finished = 0
        self._mixed = 0
        self._in_flight = 0
        self._stopping = False
        self._t0 = time.monotonic()
        self._finishes: deque[tuple[float, int, int]] = deque()

    # ------------------------------------------------------------------ control

    def add_tasks(self, tasks: Sequence[TaskConfig]) -> None:
        """New tasks of the training split (WebRL's curriculum): drawn next, each once,
        then part of the pool (`Curriculum.add`)."""
        self.tasks.extend(tasks)
        self.curriculum.add(tasks)

    def pause(self) -> None:
        """No new turns (episodes wait before their next policy call) and no new groups."""
        self.rollout.gate.close("pause")

    def resume(self) -> None:
        self.rollout.gate.open("pause")

    def hold_for_update(self, updating: bool) -> None:
        """As `pause`/`resume`, for the learner's update (a pause outlasts it)."""
        if updating:
            self.rollout.gate.close("update")
        else:
            self.rollout.gate.open("update")

    def hold_for_policy(self, down: bool) -> None:
        """As `hold_for_update`, while the policy server is down (`runtime.supervisor`)."""
        if down:
            self.rollout.gate.close("policy")
        else:
            self.rollout.gate.open("policy")

    @property
    def paused(self) -> bool:
        """Paused by `pause()` (not by an update)."""
        return "pause" in self.rollout.gate.closed_for

    async def stop(self, timeout_s: float) -> None:
        """Start no new group; after `timeout_s`, interrupt what still runs.

        Returns when no group is in flight any more (every one has been sent).
        """
        self._stopping = True
        self._producer.cancel()
        with anyio.move_on_after(timeout_s):
            await self.wait_idle()
        if self._in_flight:
            log.warning("scheduler.interrupting", groups=self._in_flight)
            self.rollout.interrupt_all()
            self.rollout.gate.open_all()  # interrupted episodes must not wait at a closed gate
            await self.wait_idle()

    async def wait_idle(self) -> None:
        """Wait until no group is in flight."""
        while self._in_flight:
            await self._idle.wait()

    # ------------------------------------------------------------------ running

    async def run(self) -> None:
        """Schedule groups until `num_groups` are done or `stop()`; then close `send`."""
        self._t0 = time.monotonic()
        try:
            async with anyio.create_task_group() as tg:
                with self._producer:
                    while self.num_groups is None or self._started < self.num_groups:
                        await self._slots.acquire()
                        opened = False
                        try:
                            await self.rollout.gate.wait_open()
                            await self._admitted()
                            opened = True
                        finally:
                            if not opened:  # cancelled while waiting: give the slot back
                                self._slots.release()
                        task = self.curriculum.next()
                        log.info("scheduler.group_started", task_id=task.task_id)
                        self._started += 1
                        self._in_flight += 1
                        self._idle = anyio.Event()
                        tg.start_soon(self._group, task)
        finally:
            self.send.close()
            log.info(
                "scheduler.finished",
                groups=self._finished,
                seconds=round(time.monotonic() - self._t0, 3),
            )

    async def _admitted(self) -> None:
        """Return once `admit` (if any) lets a new group start."""
        if self._admit is None or self._admit():
            return
        self._waiting_for_learner = True
        log.info("scheduler.waiting_for_learner", groups_in_flight=self._in_flight)
        try:
            while not self._admit():  # noqa: ASYNC110 - a question, not an event: polled
                await anyio.sleep(_ADMIT_POLL_S)
        finally:
            self._waiting_for_learner = False

    async def _group(self, task: TaskConfig) -> None:
        try:
            group = await self.rollout.run_group(task, group_size=self.group_size, split=self.split)
            if group.trajectories and all(t.status == WORKER_LOST for t in group.trajectories):
                # Lost with its worker: its task is drawn next (before this group's slot,
                # or any other, is given back).
                self.curriculum.again(task)
                log.warning("scheduler.again", task_id=task.task_id, group_id=group.group_id)
            # Shielded: a group that finished is delivered even while the run is stopping.
            with anyio.CancelScope(shield=True):
                try:
                    await self.send.send(group)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    log.error("scheduler.group_dropped", group_id=group.group_id)
                    return
            self._finished += 1
            self._mixed += group.rewards_differ()
            self.curriculum.observe(
                group.task_id, [(t.reward, t.status) for t in group.trajectories], group.guide
            )
            turns = sum(len(t.turns) for t in group.trajectories)
            self._finishes.append((time.monotonic(), turns, len(group.trajectories)))
        finally:
            self._in_flight -= 1
            self._slots.release()
            if not self._in_flight:
                self._idle.set()

    # ------------------------------------------------------------------ books

    def statistics(self) -> SchedulerStatistics:
        now = time.monotonic()
        while self._finishes and now - self._finishes[0][0] > _RATE_WINDOW_S:
            self._finishes.popleft()
        window = min(_RATE_WINDOW_S, max(now - self._t0, 1e-9))
        stats = self.rollout.stats
        failed = sum(n for status, n in stats.episodes_finished.items() if _failed(status))
        return SchedulerStatistics(
            groups_in_flight=self._in_flight,
            groups_started=self._started,
            groups_finished=self._finished,
            episodes_waiting=stats.episodes_waiting,
            episodes_in_flight=stats.episodes_running,
            episodes_finished=sum(stats.episodes_finished.values()),
            episodes_failed=failed,
            queue_depth=self.send.statistics().current_buffer_used,
            turns=stats.turns,
            steps_per_s=sum(f[1] for f in self._finishes) / window,
            episodes_per_s=sum(f[2] for f in self._finishes) / window,
            epoch=max(self.curriculum.epoch, 0),
            paused=self.paused,
            stopping=self._stopping,
            held_for=tuple(sorted(self.rollout.gate.closed_for)),
            groups_mixed=self._mixed,
            waiting_for_learner=self._waiting_for_learner,
        )


def _failed(status: str) -> bool:
    return status == "interrupted" or status.startswith("error:")
