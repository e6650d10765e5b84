"""The learner loop: groups in from a bounded stream, adapter versions out.

`Learner.run(receive)` owns the loop (run it in the task group of whoever owns the stream):

1. open the engine in a worker thread: load the base model with a LoRA, resume the newest
   checkpoint (or make and checkpoint v0); re-read the groups that were consumed but not
   trained (`read_groups(ids)`, the trajectory store) and queue them first;
2. publish the current version (`publish(path)`: the daemon wires it to the policy
   layer's hot-swap) and report `task_status.started(version)`;
3. for each group received: journal its id (fsynced), then
   - a group already seen (trained, set aside, or queued) is skipped (`duplicates`);
   - trajectories that ended by an infrastructure failure (`interrupted`, `error:*`: not in
     `EVALUATED_STATUSES`) or whose evaluation left a check unjudged are dropped from their
     group (`Trajectory.scored`), since their reward says nothing about the policy; a
     group left with fewer than two is set aside (`failed`);
   - a group whose rewards are all equal is set aside (`zero_variance`): no signal;
   - a group whose oldest turn was made by a version more than `max_staleness` behind
     the current one is dropped (`stale`); a turn without a version (-1) counts as
     infinitely old;
   - otherwise it is queued; once `batch_groups` are queued, one update runs in a worker
     thread (`anyio.to_thread.run_sync`, so torch never blocks the event loop);
4. after each update (adapter vN+1 saved and checkpointed by the engine): emit
   `UpdateApplied`, publish vN+1, emit `AdapterPublished`, write one `learner.update` log
   line with the metrics. `on_updating(True)` (optional) is called as an update starts and
   `on_updating(False)` once its adapter is published or the update failed: the daemon
   holds new turns meanwhile when `max_staleness` is 0.

With `learner.algorithm = "webrl"` the engine is `learner.webrl_engine.WebRLEngine` and
an update is a WebRL phase: a group needs one evaluated episode, not two, and a group whose
rewards are all equal is trained on too (the critic, not the group, is the baseline);
`on_phase(groups, version)` (optional) is called once the phase's version is published,
and `task_values` asks the critic about new tasks' first states.

`admits(ahead)` tells the daemon's scheduler whether a group started now, behind `ahead`
others not yet received, would still be fresh when it arrives (else it starts none);
`threads` (optional) is asked before every forward pass for the torch thread count.

When the stream closes the loop returns; queued groups short of a batch stay in the
journal and are trained after a restart. `hold()` (a stopping daemon, `max_updates`)
starts no further update: groups still arriving are journaled and queued, and trained
after a restart. Cancelling `run` waits for an update in progress to finish (its
checkpoint included): the worker thread is never abandoned.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import anyio
import msgspec
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream

from learner.batch import Decode
from learner.checkpoint import ConsumedJournal, LearnerState, Ledger, prune_adapters
from learner.demos import BCExample
from learner.engine import Engine, UpdateResult
from learner.errors import CheckpointError, LearnerError, TrainingError
from learner.ranks import Ranks
from learner.webrl_engine import WebRLEngine
from runtime.base.config import LearnerConfig, WebRLConfig
from runtime.base.messages import (
    EVALUATED_STATUSES,
    AdapterPublished,
    Event,
    TrajectoryGroup,
    UpdateApplied,
)

__all__ = ["Learner", "LearnerStatistics", "ReadGroups"]

log = structlog.get_logger("learner")

_T = TypeVar("_T")

Publish = Callable[[Path], Awaitable[None]]
Emit = Callable[[Event], Awaitable[None]]
ReadGroups = Callable[[Sequence[str]], Sequence[TrajectoryGroup]]
OnUpdating = Callable[[bool], None]
# WebRL: called with a phase's groups and the version they were trained into, once that
# version is published (the curriculum's evolution, `runtime.evolution`).
OnPhase = Callable[[Sequence[TrajectoryGroup], int], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class LearnerStatistics:
    """A snapshot for status pages and tests."""

    version: int
    step: int
    updates: int
    groups_received: int
    groups_trained: int
    groups_stale: int
    groups_zero_variance: int
    groups_failed: int
    trajectories_dropped: int
    groups_duplicate: int
    groups_queued: int
    groups_resumed: int
    updating: bool
    last_update_s: float


class Learner:
    """M-GRPO (or WebRL) on a LoRA adapter, fed by a stream of `TrajectoryGroup`s."""

    def __init__(
        self,
        config: LearnerConfig,
        *,
        base_model: str | Path,
        out_dir: str | Path,
        publish: Publish,
        emit: Emit | None = None,
        read_groups: ReadGroups | None = None,
        decode: Decode | None = None,
        adapter_prefix: str = "policy",
        temperature: float = 1.0,
        on_updating: OnUpdating | None = None,
        webrl: WebRLConfig | None = None,
        on_phase: OnPhase | None = None,
        threads: Callable[[], int] | None = None,
        demos: Sequence[BCExample] = (),
    ) -> None:
        self.config = config
        self.out_dir = Path(out_dir)
        self._webrl: WebRLEngine | None = None
        self._engine: Engine
        if config.algorithm == "webrl":
            self._engine = self._webrl = WebRLEngine(
                config,
                webrl or WebRLConfig(),
                base_model=base_model,
                out_dir=out_dir,
                adapter_prefix=adapter_prefix,
                temperature=temperature,
            )
        else:
            self._engine = Engine(
                config,
                base_model=base_model,
                out_dir=out_dir,
                adapter_prefix=adapter_prefix,
                decode=decode,
                temperature=temperature,
                demos=demos,
            )
        self._engine.threads = threads  # asked in the learner's thread, before each forward
        self._on_phase = on_phase
        self._ranks = Ranks(self._engine) if config.data_parallel > 1 else None
        self._publish = publish
        self._emit = emit
        self._read_groups = read_groups
        self._on_updating = on_updating
        self._journal = ConsumedJournal(self.out_dir / "consumed.jsonl")
        self._queue: list[TrajectoryGroup] = []
        self._set_aside = Ledger()
        self._set_aside_dropped = 0  # trajectories dropped since the last update
        self._seen: set[str] = set()
        self._limiter = anyio.CapacityLimiter(1)
        self._updating = False
        self._held = False
        self._updates = 0
        self._received = 0
        self._trained = 0
        self._stale = 0
        self._zero_variance = 0
        self._failed = 0
        self._dropped = 0  # trajectories, over all groups
        self._duplicate = 0
        self._resumed = 0
        self._last_update_s = 0.0

    # ------------------------------------------------------------------ public

    @property
    def version(self) -> int:
        state = self._engine.state
        return -1 if state is None else state.version

    def has_seen(self, group_id: str) -> bool:
        """True once `group_id` is journaled, trained, set aside or queued (after the
        start: `run` has resumed the journal and the checkpoint)."""
        return group_id in self._seen

    @property
    def ranks(self) -> Ranks | None:
        """The other data-parallel ranks (`learner.data_parallel` > 1), else None."""
        return self._ranks

    def hold(self) -> None:
        """Start no further update (one in progress finishes); keep journaling groups."""
        self._held = True

    def adapter_path(self, version: int) -> Path:
        return self._engine.adapter_path(version)

    async def task_values(self, prompts: Sequence[Sequence[int]]) -> list[float]:
        """WebRL: the critic's V(s_0, I) of tasks' first prompts, in the learner's thread
        (after the update in progress, if one is)."""
        engine = self._webrl
        if engine is None:
            raise TrainingError('task values need learner.algorithm = "webrl"')
        return await self._in_thread(lambda: engine.task_values(prompts))

    def admits(self, ahead: int) -> bool:
        """Would a group that reaches the learner after `ahead` others be trained, not set
        aside as stale? (The scheduler's `admit`: start no group that would be.)

        A group started now is made by the current version (its oldest turn) and checked
        when it arrives. By then the update in progress, if any, is published, and one
        more for every `batch_groups` groups queued meanwhile: the ones waiting now and the
        share of the `ahead` that the learner trains (WebRL every evaluated group, M-GRPO
        the mixed ones, estimated from the groups checked so far). It is trained if those
        are at most `max_staleness` versions.
        """
        batch = self.config.batch_groups
        waiting = len(self._queue) - (min(batch, len(self._queue)) if self._updating else 0)
        trainable = self._trained + len(self._queue) + self._stale
        checked = trainable + self._zero_variance + self._failed
        share = (trainable + 1) / (checked + 1)  # 1 before any group is checked
        updates = int(self._updating) + int((waiting + share * ahead) // batch)
        return updates <= self.config.max_staleness

    def statistics(self) -> LearnerStatistics:
        state = self._engine.state
        return LearnerStatistics(
            version=self.version,
            step=0 if state is None else state.step,
            updates=self._updates,
            groups_received=self._received,
            groups_trained=self._trained,
            groups_stale=self._stale,
            groups_zero_variance=self._zero_variance,
            groups_failed=self._failed,
            trajectories_dropped=self._dropped,
            groups_duplicate=self._duplicate,
            groups_queued=len(self._queue),
            groups_resumed=self._resumed,
            updating=self._updating,
            last_update_s=self._last_update_s,
        )

    async def run(
        self,
        groups: MemoryObjectReceiveStream[TrajectoryGroup],
        *,
        task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Resume, publish the current version, then train until `groups` closes."""
        try:
            async with groups:
                await self._run(groups, task_status)
        finally:
            if self._ranks is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self._ranks.close, limiter=self._limiter)

    def _open(self) -> LearnerState:
        """Start the other data-parallel ranks (if any), then open the engine."""
        if self._ranks is not None:
            self._engine.data_parallel = self._ranks.start()
        return self._engine.open()

    def _train(self, batch: Sequence[TrajectoryGroup], set_aside: Ledger) -> UpdateResult:
        """One update; with data-parallel ranks, they get the batch first."""
        if self._ranks is None:
            return self._engine.update(batch, set_aside)
        self._ranks.send(batch, set_aside)
        try:
            return self._engine.update(batch, set_aside)
        except RuntimeError as exc:  # a collective that failed or timed out
            raise self._ranks.check(exc) from exc

    async def _run(
        self, groups: MemoryObjectReceiveStream[TrajectoryGroup], task_status: TaskStatus[int]
    ) -> None:
        state = await self._in_thread(self._open)
        self._seen = state.ledger.handled()
        await self._requeue(state.ledger)
        path = self._engine.adapter_path(state.version)
        await self._publish(path)
        await self._send(
            AdapterPublished(at=time.time(), version=state.version, name=path.name, path=str(path))
        )
        log.info("learner.started", version=state.version, step=state.step, resumed=self._resumed)
        task_status.started(state.version)
        while self._batch_ready():
            await self._update()
        async for group in groups:
            await self._take(group)
            if self._batch_ready():
                await self._update()

    def _batch_ready(self) -> bool:
        return not self._held and len(self._queue) >= self.config.batch_groups

    # ------------------------------------------------------------------ intake

    async def _requeue(self, ledger: Ledger) -> None:
        """Queue the groups consumed before a restart and not trained since."""
        handled = ledger.handled()
        consumed = await anyio.to_thread.run_sync(self._journal.read)
        missing = [gid for gid in consumed if gid not in handled]
        if not missing:
            return
        if self._read_groups is None:
            raise CheckpointError(
                f"{len(missing)} consumed groups were not trained before the restart "
                "and no read_groups is given to re-read them"
            )
        found = await anyio.to_thread.run_sync(self._read_groups, missing)
        by_id = {g.group_id: g for g in found}
        lost = [gid for gid in missing if gid not in by_id]
        if lost:
            raise CheckpointError(f"consumed groups missing from the trajectory store: {lost}")
        for gid in missing:
            self._classify(by_id[gid])
        self._resumed = len(missing)

    async def _take(self, group: TrajectoryGroup) -> None:
        try:
            if group.group_id in self._seen:
                self._duplicate += 1
                log.warning("learner.duplicate_group", group_id=group.group_id)
                return
            await anyio.to_thread.run_sync(self._journal.append, group.group_id)
            self._classify(group)
        finally:
            # Counted once classified: `admits`' callers count the groups on the way here.
            self._received += 1

    def _classify(self, group: TrajectoryGroup) -> None:
        self._seen.add(group.group_id)
        evaluated = [t for t in group.trajectories if t.scored]
        dropped = len(group.trajectories) - len(evaluated)
        # M-GRPO compares a group's episodes with each other: it needs two that differ.
        # WebRL's critic gives every episode its own baseline: one evaluated is enough.
        fewest = 1 if self._webrl is not None else 2
        if dropped:
            self._dropped += dropped
            self._set_aside_dropped += dropped
            log.info(
                "learner.dropped_trajectories",
                group_id=group.group_id,
                dropped=dropped,
                statuses=sorted({t.status for t in group.trajectories} - EVALUATED_STATUSES),
                unjudged=sum(
                    t.status in EVALUATED_STATUSES and not t.scored for t in group.trajectories
                ),
            )
            if len(evaluated) < fewest:
                self._failed += 1
                self._set_aside.failed.append(group.group_id)
                return
            group = msgspec.structs.replace(group, trajectories=evaluated)
        # No signal first: a group with one reward is "zero_variance" however old, so
        # "stale" counts only the groups whose signal came too late.
        if self._webrl is None and not group.rewards_differ():
            self._zero_variance += 1
            self._set_aside.zero_variance.append(group.group_id)
            return
        # The policy's turns: a guided start's first turns are the oracle's (no version).
        versions = [
            t.adapter_version
            for tr in group.trajectories
            for t in tr.turns
            if t.completion_token_ids
        ]
        oldest = min(versions, default=-1)
        if oldest < 0 or self.version - oldest > self.config.max_staleness:
            self._stale += 1
            self._set_aside.stale.append(group.group_id)
            log.info(
                "learner.stale_group", group_id=group.group_id, made_by=oldest, now=self.version
            )
            return
        self._queue.append(group)

    # ------------------------------------------------------------------ update

    async def _in_thread(self, fn: Callable[[], _T]) -> _T:
        """`fn` in the learner's one worker thread; foreign errors become TrainingError."""
        try:
            return await anyio.to_thread.run_sync(fn, limiter=self._limiter)
        except LearnerError:
            raise
        except Exception as exc:
            raise TrainingError(f"{type(exc).__name__}: {exc}") from exc

    async def _update(self) -> None:
        """One update and the publication of its adapter, told to `on_updating`."""
        if self._on_updating is not None:
            self._on_updating(True)
        try:
            await self._update_and_publish()
        finally:
            if self._on_updating is not None:
                self._on_updating(False)

    async def _update_and_publish(self) -> None:
        batch = self._queue[: self.config.batch_groups]
        set_aside = self._set_aside
        stale, zero = len(set_aside.stale), len(set_aside.zero_variance)
        failed, dropped = len(set_aside.failed), self._set_aside_dropped
        started = time.perf_counter()
        log.debug("learner.update_started", version=self.version, groups=len(batch))
        self._updating = True
        try:
            result: UpdateResult = await self._in_thread(lambda: self._train(batch, set_aside))
        finally:
            self._updating = False
        del self._queue[: len(batch)]
        self._set_aside = Ledger()
        self._set_aside_dropped = 0
        self._updates += 1
        self._trained += len(batch)
        metrics = dict(result.metrics)
        metrics["zero_advantage_fraction"] = zero / (zero + len(batch))
        await self._send(
            UpdateApplied(
                at=time.time(),
                version=result.version,
                step=result.step,
                groups_trained=len(batch),
                groups_stale=stale,
                groups_zero_variance=zero,
                groups_failed=failed,
                trajectories_dropped=dropped,
                metrics=metrics,
            )
        )
        publishing = time.perf_counter()
        await self._publish(result.adapter_path)
        publish_s = time.perf_counter() - publishing
        if self.config.keep_adapters:
            keep = max(self.config.keep_adapters, self.config.max_staleness + 2)
            pruned = await anyio.to_thread.run_sync(
                prune_adapters, self._engine.adapters_dir, result.version, keep,
                self._engine.prefix,
            )  # fmt: skip
            if pruned:
                log.info("learner.adapters_pruned", removed=[p.name for p in pruned])
        await self._send(
            AdapterPublished(
                at=time.time(),
                version=result.version,
                name=result.adapter_path.name,
                path=str(result.adapter_path),
            )
        )
        self._last_update_s = time.perf_counter() - started
        if self._on_phase is not None:
            await self._on_phase(batch, result.version)
        with structlog.contextvars.bound_contextvars(adapter=result.adapter_path.name):
            log.info(
                "learner.update",
                version=result.version,
                step=result.step,
                groups=len(batch),
                group_ids=[g.group_id for g in batch],
                stale=stale,
                zero_variance=zero,
                publish_s=round(publish_s, 4),
                update_s=round(self._last_update_s, 4),
                **{k: round(v, 6) for k, v in metrics.items()},
            )

    async def _send(self, event: Event) -> None:
        if self._emit is not None:
            await self._emit(event)
