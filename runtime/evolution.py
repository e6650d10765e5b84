"""WebRL's self-evolving curriculum: after each phase, new training tasks from the tasks
the policy failed, filtered by the critic.

    phase's groups ──> failed tasks (no evaluated episode succeeded)
        ──> a task maker: children
              built-in sites: sites.builtin.evolve.Evolver (instance / easier / harder,
                              the suite's templates: real evaluators)
              WebArena:       sites.generate.IntentGenerator (a chat model writes intents,
                              judges their feasibility; scored by the outcome reward model)
        ──> V(s_0, I) by the learner's critic ──> kept when low < V < high
        ──> RUN_DIR/evolved_tasks.jsonl (every child, kept or not) ──> scheduler: drawn next

A child's first state s_0 is its first prompt: the system prompt, its task and its start
page. The start page is the observation the first turn of an earlier episode with the same
`start_url` showed (a fresh tenant of a built-in site shows the same page at the same URL),
rendered through the policy's own prompt builder; a child whose start page no episode has
shown yet has no s_0 and is run unfiltered (its record says `value: null`). Every child is
recorded with its parent, phase, kind, value and whether it was kept, one fsynced line
each, before the scheduler sees it; after a restart the file is read back: its kept tasks
join the scheduler again and its instantiations are never made again.

What a maker drops (a generated line that does not parse, an intent judged infeasible, a
parent not from the suite) is counted by reason in the `evolution.phase` log line, never
run. Nothing here may stop training: a failure to evolve is logged (`evolution.failed`)
and the phase goes on without new tasks.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import anyio
import msgspec
import structlog

from runtime.base.config import Config
from runtime.base.messages import EVALUATED_STATUSES, TaskConfig, TrajectoryGroup
from runtime.errors import StoreError
from runtime.store import JsonLines, json_lines
from sites.builtin.evolve import KIND_FIELD, PARENT_FIELD, PHASE_FIELD, Evolver
from sites.generate import Generation

__all__ = [
    "EVOLVED_FILE",
    "BuiltinMaker",
    "EvolvedTask",
    "TaskEvolution",
    "TaskMaker",
    "read_evolved",
]

log = structlog.get_logger("runtime.evolution")

EVOLVED_FILE = "evolved_tasks.jsonl"

# The critic's values of prompts (`learner.trainer.Learner.task_values`).
Values = Callable[[Sequence[Sequence[int]]], Awaitable[list[float]]]
# A task's first prompt ids, given its start page's observation.
FirstPrompt = Callable[[TaskConfig, str], list[int]]
# Where kept tasks go (`runtime.scheduler.Scheduler.add_tasks`).
AddTasks = Callable[[Sequence[TaskConfig]], None]


class TaskMaker(Protocol):
    """Makes new tasks from failed ones (`BuiltinMaker`, `sites.generate.IntentGenerator`)."""

    def used(self, task: TaskConfig) -> None:
        """A task it made before a restart, read back: never made again."""
        ...

    async def generate(
        self,
        failed: Sequence[TaskConfig],
        *,
        phase: int,
        per_parent: int,
        start_pages: Mapping[str, str],
    ) -> Generation: ...


class BuiltinMaker:
    """The built-in suite's evolution (`sites.builtin.evolve.Evolver`) as a `TaskMaker`."""

    def __init__(self, seed: int) -> None:
        self.evolver = Evolver(seed, rng=random.Random(f"{seed}:evolve"))

    def used(self, task: TaskConfig) -> None:
        self.evolver.used(task)

    async def generate(
        self,
        failed: Sequence[TaskConfig],
        *,
        phase: int,
        per_parent: int,
        start_pages: Mapping[str, str],
    ) -> Generation:
        made = self.evolver.evolve(failed, phase=phase, per_parent=per_parent)
        out = Generation(tasks=made.tasks)
        for _ in made.skipped:
            out.drop("parent not from the suite")
        for _ in made.childless:
            out.drop("parent with nothing left to make")
        return out


class EvolvedTask(msgspec.Struct, frozen=True):
    """One generated task, as recorded: kept ones were handed to the scheduler."""

    task: TaskConfig
    parent: int
    phase: int
    kind: str
    value: float | None
    kept: bool


def read_evolved(path: Path) -> list[EvolvedTask]:
    """The records of an `evolved_tasks.jsonl` (none if it does not exist); a torn last
    line is skipped, any other bad line is a StoreError naming file and line."""
    if not path.exists():
        return []
    out = []
    for number, line in json_lines(path, warn_torn=True):
        try:
            out.append(msgspec.json.decode(line, type=EvolvedTask))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"{path}:{number}: not a generated task ({exc})") from exc
    return out


class TaskEvolution:
    """Makes, filters, records and schedules each phase's new tasks."""

    def __init__(
        self,
        config: Config,
        *,
        tasks: Sequence[TaskConfig],
        run_dir: Path,
        values: Values,
        first_prompt: FirstPrompt,
        maker: TaskMaker | None = None,
    ) -> None:
        webrl = config.webrl
        self.per_parent = webrl.evolve_per_parent
        self.low, self.high = webrl.task_value_low, webrl.task_value_high
        self.path = run_dir / EVOLVED_FILE
        self._values = values
        self._first_prompt = first_prompt
        self._tasks = {t.task_id: t for t in tasks}
        self._maker = maker or BuiltinMaker(config.sites.seed)
        self._start_pages: dict[str, str] = {}
        self._add: AddTasks | None = None
        self.made = self.kept = 0

    def resume(self, add: AddTasks) -> list[TaskConfig]:
        """Read the tasks made before a restart; from now on kept tasks go to `add`.
        Returns the kept ones read back (given to `add` too)."""
        self._add = add
        records = read_evolved(self.path)
        for record in records:
            self._maker.used(record.task)
            self._tasks[record.task.task_id] = record.task
        kept = [r.task for r in records if r.kept]
        self.made, self.kept = len(records), len(kept)
        if kept:
            add(kept)
            log.info("evolution.resumed", made=len(records), kept=len(kept))
        return kept

    def observe(self, group: TrajectoryGroup) -> None:
        """Remember the start page a group's first turn showed, by its task's start URL."""
        task = self._tasks.get(group.task_id)
        if task is None or task.start_url in self._start_pages:
            return
        for trajectory in group.trajectories:
            if trajectory.turns and trajectory.turns[0].index == 0:
                self._start_pages[task.start_url] = trajectory.turns[0].observation
                return

    async def phase(self, groups: Sequence[TrajectoryGroup], version: int) -> None:
        """The learner's `on_phase`: new tasks from the phase's failed ones."""
        try:
            await self._phase(groups, version)
        except Exception as exc:  # a failure here must not stop training
            log.error("evolution.failed", phase=version, error=f"{type(exc).__name__}: {exc}")

    async def _phase(self, groups: Sequence[TrajectoryGroup], version: int) -> None:
        for group in groups:
            self.observe(group)
        failed = [self._tasks[g.task_id] for g in groups if _failed(g) and g.task_id in self._tasks]
        parents = list({t.task_id: t for t in failed}.values())
        if not parents or not self.per_parent:
            return
        made = await self._maker.generate(
            parents, phase=version, per_parent=self.per_parent, start_pages=self._start_pages
        )
        pages = [self._start_pages.get(t.start_url) for t in made.tasks]
        judged = [(t, p) for t, p in zip(made.tasks, pages, strict=True) if p is not None]
        prompts = [self._first_prompt(t, p) for t, p in judged]
        scores = await self._values(prompts) if prompts else []
        value_of = {t.task_id: v for (t, _), v in zip(judged, scores, strict=True)}
        records = []
        for task in made.tasks:
            value = value_of.get(task.task_id)
            keep = value is None or self.low < value < self.high
            records.append(
                EvolvedTask(
                    task=task, parent=int(task.extra_fields[PARENT_FIELD]),
                    phase=int(task.extra_fields[PHASE_FIELD]),
                    kind=str(task.extra_fields[KIND_FIELD]), value=value, kept=keep,
                )
            )  # fmt: skip
        await anyio.to_thread.run_sync(self._record, records)
        kept = [r.task for r in records if r.kept]
        for record in records:
            self._tasks[record.task.task_id] = record.task
        self.made += len(records)
        self.kept += len(kept)
        if kept and self._add is not None:
            self._add(kept)
        log.info(
            "evolution.phase",
            phase=version,
            parents=len(parents),
            made=len(records),
            kept=len(kept),
            unfiltered=sum(r.value is None for r in records),
            dropped=made.dropped,
        )

    def _record(self, records: Sequence[EvolvedTask]) -> None:
        with JsonLines(self.path) as out:
            for record in records:
                out.append_line(msgspec.json.encode(record))


def _failed(group: TrajectoryGroup) -> bool:
    """No evaluated episode succeeded, and at least one was evaluated."""
    evaluated = [t for t in group.trajectories if t.status in EVALUATED_STATUSES]
    return bool(evaluated) and not any(t.reward > 0 for t in evaluated)
