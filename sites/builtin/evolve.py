"""WebRL's in-breadth evolution on the built-in sites: new training tasks from failed ones.

WebRL (arXiv 2411.02337) seeds each phase's new tasks with the tasks the policy failed,
some easier and some harder. Here the suite's own templates write them, so every new task
keeps a real evaluator and an oracle plan. For each failed parent, `Evolver.evolve` makes
up to `per_parent` children, taking the kinds in turn:

- "instance": the parent's template with an instantiation that no split holds
  (`suite.spare_candidates`: past the template's test share and `train_cap`);
- "easier": another in-distribution template of the parent's site whose oracle plan is
  shorter than the parent's (a template's length is its first spare instantiation's);
- "harder": one whose plan is longer.

When a kind has nothing left (no shorter template, no spare instantiation), the next kind
is tried; a parent with nothing at all gets no child. Each instantiation is used once,
across phases. Ood templates are never used, so no ood task is ever trained on. A child's
`extra_fields` carry its parent's task id (`evolved_from`), its `phase` and its `kind`;
ids count up from `EVOLVED_ID_BASE`. A parent that is not a built-in suite task (no seed,
template or instantiation the suite knows) is skipped and counted, never guessed at.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from runtime.base.messages import TaskConfig
from sites.builtin.errors import NotInSuiteError
from sites.builtin.suite import SEED_FIELD, plan_for, spare_candidates, task_from, templates

__all__ = [
    "EVOLVED_ID_BASE",
    "KINDS",
    "KIND_FIELD",
    "PARENT_FIELD",
    "PHASE_FIELD",
    "Evolution",
    "Evolver",
]

EVOLVED_ID_BASE = 300_000
PARENT_FIELD = "evolved_from"
PHASE_FIELD = "phase"
KIND_FIELD = "kind"
KINDS = ("instance", "easier", "harder")


@dataclass
class Evolution:
    """One phase's new tasks and the parents that could not be evolved."""

    tasks: list[TaskConfig] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # task ids of parents not from the suite
    childless: list[int] = field(default_factory=list)  # parents with nothing left to make


class Evolver:
    """Makes new tasks from failed ones, phase after phase, for one suite seed."""

    def __init__(self, seed: int, *, rng: random.Random, next_id: int = EVOLVED_ID_BASE) -> None:
        self.seed = seed
        self.rng = rng
        self.next_id = next_id
        self._templates = templates()
        self._spare = spare_candidates(seed)
        self._length = {
            tid: len(task_from(self._templates[tid], pool[0], task_id=0, seed=seed)[1])
            for tid, pool in self._spare.items()
            if pool
        }

    def remaining(self, template_id: int) -> int:
        """Spare instantiations of a template not used yet."""
        return len(self._spare.get(template_id, []))

    def used(self, task: TaskConfig) -> None:
        """Mark a task made earlier (by this suite seed's evolution, read back after a
        restart) as made: its instantiation is not given again, ids continue after it."""
        template_id = task.intent_template_id
        pool = self._spare.get(template_id, []) if isinstance(template_id, int) else []
        if task.instantiation_dict in pool:
            pool.remove(task.instantiation_dict)
        self.next_id = max(self.next_id, task.task_id + 1)

    def evolve(self, failed: Sequence[TaskConfig], *, phase: int, per_parent: int) -> Evolution:
        """Up to `per_parent` new tasks for each failed parent, in the parents' order."""
        out = Evolution()
        for parent in failed:
            try:
                if parent.extra_fields.get(SEED_FIELD) != self.seed:
                    raise NotInSuiteError(f"task {parent.task_id}: another seed's suite")
                length = len(plan_for(parent))
            except NotInSuiteError:
                out.skipped.append(parent.task_id)
                continue
            made = 0
            for k in range(per_parent):
                for kind in KINDS[k % 3 :] + KINDS[: k % 3]:  # this kind first, then the rest
                    template_id = self._pick(kind, parent, length)
                    if template_id is not None:
                        out.tasks.append(self._child(template_id, parent, phase, kind))
                        made += 1
                        break
            if made == 0:
                out.childless.append(parent.task_id)
        return out

    def _pick(self, kind: str, parent: TaskConfig, length: int) -> int | None:
        own = parent.intent_template_id  # an int: plan_for accepted the parent
        if kind == "instance":
            return own if isinstance(own, int) and self.remaining(own) else None
        site = parent.sites[0] if parent.sites else None
        options = sorted(
            tid
            for tid, n in self._length.items()
            if tid != own
            and self.remaining(tid)
            and self._templates[tid].site == site
            and (n < length if kind == "easier" else n > length)
        )
        return self.rng.choice(options) if options else None

    def _child(self, template_id: int, parent: TaskConfig, phase: int, kind: str) -> TaskConfig:
        pool = self._spare[template_id]
        params = pool.pop(self.rng.randrange(len(pool)))
        task, _ = task_from(
            self._templates[template_id], params, task_id=self.next_id, seed=self.seed
        )
        self.next_id += 1
        extra = {
            **task.extra_fields,
            PARENT_FIELD: parent.task_id,
            PHASE_FIELD: phase,
            KIND_FIELD: kind,
        }
        return msgspec.structs.replace(task, extra_fields=extra)
