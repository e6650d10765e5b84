"""Which training task comes next: in shuffled order, or toward groups that carry signal.

M-GRPO learns only from a group whose rewards differ: a group that all fails or all
succeeds has zero advantage everywhere and costs its rollouts for nothing. On the built-in
sites success is mostly a property of the task's template (SmolLM2 after 45 minutes of
BC, 25 groups of 4 at temperature 0.5: 32 of 100 episodes succeeded, yet only 5 groups
were mixed, 6 all succeeded and 14 all failed).

`"uniform"`: every task once per epoch, shuffled (seeded), as the scheduler always did.

`"short_first"`: every task once per epoch, the shortest first: the shuffled order sorted
(stably) by the length of the task's scripted solution (`length`; a task of unknown length
comes last). A model fresh from a short BC solves short tasks sometimes and long ones
almost never, and only a group with both rewards teaches M-GRPO anything, so the first
updates come sooner when the first groups are short ones; the long tasks follow within
the epoch. Under both, a resumed run takes the tasks its store says were drawn off the
epoch it stopped in (`observe_store`), so a daemon restarted often still reaches the long
tasks.

`"signal"`: tasks are drawn by template (`intent_template_id`, else the intent). Each
template keeps the rewards of its last `window` evaluated episodes; its weight is its
task count times the chance that the next group of G is mixed,

    P(mixed) = 1 - E[p^G] - E[(1-p)^G],   p ~ Beta(1/2 + successes, 1/2 + failures)

(E[p^G] of a Beta is a product of G ratios), so a template never seen keeps its uniform
share and one that always fails or always succeeds fades but never reaches zero (the
policy moves; the window forgets). Within a template, tasks come in shuffled order.
Given the tasks' lengths, a template's prior is not Jeffreys' but its length's: the other
templates of the same length pool their windows into a mean m = (1/2 + successes) / (1 +
episodes), and the prior is Beta(m, 1 - m) (Jeffreys' strength, one episode; with nothing
pooled yet it is Jeffreys' own). Success on the built-in sites follows the length: the
first run's model, 49 groups under Jeffreys' prior alone, solved episodes only of 3-step
tasks (5 groups of 17 mixed); the 24 groups of 4 to 8 steps all failed, and a template with
16 failures kept 23% of an unseen one's weight, so half the draws went to tasks of lengths
nobody solved. With the pooled prior, once 12 groups of a length have all failed, an unseen
template of that length weighs 4% of what Jeffreys' prior gives it (a 3-step one, its
length at 13 successes in 68 episodes, 63%).

A fresh "signal" has seen no rewards, so it weighs every template alike, and most
templates are all-solved or all-failed by a fresh BC model: from the first run's model, the
first 38 groups so drawn had no mixed one (the first update began after 4.2 minutes of
rollouts), where "short_first" order gave 2 in its first 6 (18 s). With `warmup`
n > 0, "signal" draws in "short_first" order until it has seen n mixed groups (a resumed
run counts its store's), then by weight: its templates then start with the short tasks'
rewards, as the measured "signal" arms did (they started from the first run's first update).

With a `ceiling` below 1 ("signal" only), a template's weight counts only the chance of a
mixed group with its success rate below the ceiling: E[(1 - p^G - (1-p)^G) 1{p < ceiling}].
Greedy evaluation is what is reported, and a template that sampling solves more often than
not is mostly one that greedy decoding solves already. In the 82-minute "signal" run from the
first run's model, the five 3-step templates whose test tasks greedy BC all solved (5 of 5)
took 51 of the 192 groups in its store; their episodes succeeded 166 times in 204 (v1-v5:
31 in 36), and v15 solved 4 of their 5 test tasks greedily, one fewer than BC.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

from runtime.base.messages import EVALUATED_STATUSES, TaskConfig
from runtime.guided import guide_of
from runtime.store import iter_outcomes

__all__ = ["Curriculum", "CurriculumKind", "TaskLength", "mixed_probability"]

CurriculumKind = Literal["uniform", "short_first", "signal"]
# A task's difficulty for "short_first": its scripted solution's steps, None when unknown.
TaskLength = Callable[[TaskConfig], int | None]

# Jeffreys prior on a template's success rate.
_PRIOR = 0.5


def mixed_probability(
    successes: float,
    failures: float,
    group_size: int,
    prior: tuple[float, float] = (_PRIOR, _PRIOR),
    ceiling: float = 1.0,
) -> float:
    """P(a group of `group_size` has both rewards, and the success rate p < `ceiling`)
    under the Beta posterior of p."""
    a, b = prior[0] + successes, prior[1] + failures
    if ceiling < 1.0:
        return _mixed_below(a, b, group_size, ceiling)
    all_one = all_zero = 1.0
    for i in range(group_size):
        all_one *= (a + i) / (a + b + i)
        all_zero *= (b + i) / (a + b + i)
    return max(0.0, 1.0 - all_one - all_zero)


def _mixed_below(a: float, b: float, group_size: int, ceiling: float, points: int = 512) -> float:
    """E[(1 - p^G - (1-p)^G) 1{p < ceiling}], p ~ Beta(a, b), by the midpoint rule. The
    factor vanishes like G p at 0, so the integrand stays bounded even for a < 1."""
    log_norm = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    step = ceiling / points
    total = 0.0
    for i in range(points):
        p = (i + 0.5) * step
        mixed = 1.0 - p**group_size - (1.0 - p) ** group_size
        total += mixed * math.exp(log_norm + (a - 1) * math.log(p) + (b - 1) * math.log1p(-p))
    return max(0.0, total * step)


def template_of(task: TaskConfig) -> str:
    """The key rewards are kept under: the template (else the intent), and for a guided
    start (`runtime.guided`) the steps the oracle plays, a template of its own."""
    template = task.intent_template_id
    name = f"t:{template}" if isinstance(template, int | str) else f"i:{task.intent}"
    guide = guide_of(task)
    return f"{name}@{guide}" if guide else name


class Curriculum:
    """Draws the next task; `observe` feeds it each finished group."""

    def __init__(
        self,
        tasks: Sequence[TaskConfig],
        *,
        kind: CurriculumKind = "uniform",
        group_size: int,
        seed: str,
        shuffle: bool = True,
        window: int = 16,
        length: TaskLength | None = None,
        ceiling: float = 1.0,
        warmup: int = 0,
    ) -> None:
        if not tasks:
            raise ValueError("no tasks to draw from")
        if not 0.0 < ceiling <= 1.0:
            raise ValueError(f"ceiling must be in (0, 1], got {ceiling}")
        if kind == "short_first" and length is None:
            raise ValueError('curriculum "short_first" needs the tasks\' lengths')
        self.kind = kind
        self.group_size = group_size
        # "signal": mixed groups to see in "short_first" order first.
        self.warmup = warmup if kind == "signal" else 0
        self.mixed_seen = 0
        self.ceiling = ceiling
        self.shuffle = shuffle
        self.epoch = -1
        self._seed = seed
        self._length = length
        self._rng = random.Random(f"{seed}:draws")
        self._tasks = list(tasks)
        self._order: list[TaskConfig] = []
        self._by_template: dict[str, list[TaskConfig]] = defaultdict(list)
        # (task_id, guide) -> template: a task and its guided variants share the id.
        self._template_of_id: dict[tuple[int, int], str] = {}
        # Under "signal" with lengths: each template's length (its first task's), the
        # templates that share a prior.
        self._class_of: dict[str, int | None] = {}
        self._classes: dict[int | None, list[str]] = defaultdict(list)
        for task in self._tasks:
            self._join(task)
        self._queues: dict[str, list[TaskConfig]] = {}
        self._rounds: dict[str, int] = defaultdict(int)
        self._rewards: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        self._again: deque[TaskConfig] = deque()
        self._fresh: deque[TaskConfig] = deque()

    def next(self) -> TaskConfig:
        if self._again:
            return self._again.popleft()
        if self._fresh:
            return self._fresh.popleft()
        if self.kind != "signal" or self.mixed_seen < self.warmup:
            return self._next_in_order()
        names = sorted(self._by_template)
        weights = [self.weight(name) for name in names]
        return self._next_of(self._rng.choices(names, weights=weights)[0])

    def again(self, task: TaskConfig) -> None:
        """Draw `task` next, before the order resumes: its group was lost to the
        infrastructure (a rollout worker that died) and says nothing about the policy."""
        self._again.append(task)

    def add(self, tasks: Iterable[TaskConfig]) -> None:
        """New tasks (WebRL's curriculum, `runtime.evolution`): each is drawn once next, in
        the order given (after any put back by `again`), then joins the pool: the shuffled
        order from the next epoch on, and its template's draws under "signal"."""
        for task in tasks:
            self._tasks.append(task)
            self._join(task)
            self._fresh.append(task)

    def _join(self, task: TaskConfig) -> None:
        template = template_of(task)
        self._by_template[template].append(task)
        self._template_of_id[task.task_id, guide_of(task)] = template
        if self._length is not None and template not in self._class_of:
            steps = self._length(task)
            self._class_of[template] = steps
            self._classes[steps].append(template)

    def observe(self, task_id: int, outcomes: Iterable[tuple[float, str]], guide: int = 0) -> None:
        """Remember a finished group's (reward, status) pairs under its task's template
        (its guided variant's, with `guide`); episodes that ended by an infrastructure
        failure say nothing and are skipped."""
        template = self._template_of_id.get((task_id, guide))
        if template is None:
            return
        scored = [1.0 if reward > 0.5 else 0.0 for reward, status in outcomes
                  if status in EVALUATED_STATUSES]  # fmt: skip
        self._rewards[template].extend(scored)
        self.mixed_seen += len(set(scored)) > 1  # as `rewards_differ`: the group can teach

    def observe_store(self, path: str | Path, split: str) -> int:
        """Observe the groups of `split` in a trajectory store, so a resumed run goes on
        from what it saw (only the rewards are decoded): "signal" weighs their rewards,
        and the ordered kinds take the tasks already drawn off their epoch
        (`skip_drawn`). Returns how many groups were observed."""
        drawn: list[int] = []
        observed = 0
        for group in iter_outcomes(path):
            if group.split == split:
                outcomes = [(t.reward, t.status) for t in group.trajectories]
                self.observe(group.task_id, outcomes, group.guide)
                observed += 1
                if not group.guide:  # the ordered kinds' epochs hold the plain tasks
                    drawn.append(group.task_id)
        self.skip_drawn(drawn)
        return observed

    def skip_drawn(self, task_ids: Iterable[int]) -> None:
        """Take tasks drawn before (oldest first) off the order, epoch by epoch: the run
        goes on with the rest of the epoch it stopped in, not with a new one; under
        "short_first" a restarted daemon would otherwise never get past the short tasks.
        A task seen again within an epoch (a lost group run again, an epoch's last
        groups finishing after the next began) or not in the pool is passed over.
        Nothing to do under "signal" past its warm-up: its draws are weighted, not ordered."""
        if self.kind == "signal" and self.mixed_seen >= self.warmup:
            return
        if not self._order:
            self._new_epoch()
        pool = {task.task_id for task in self._order}
        done: set[int] = set()
        for task_id in task_ids:
            if task_id not in pool or task_id in done:
                continue
            done.add(task_id)
            if len(done) == len(pool):  # that epoch was drawn whole
                self._new_epoch()
                pool = {task.task_id for task in self._order}
                done = set()
        self._order = [task for task in self._order if task.task_id not in done]

    def weight(self, template: str) -> float:
        rewards = self._rewards.get(template, ())
        successes = sum(rewards)
        chance = mixed_probability(
            successes,
            len(rewards) - successes,
            self.group_size,
            self.prior(template),
            self.ceiling,
        )
        return len(self._by_template[template]) * chance

    def prior(self, template: str) -> tuple[float, float]:
        """Beta(m, 1 - m), m the pooled success of the other templates of its length
        (Jeffreys' (1/2, 1/2) without lengths or with nothing pooled)."""
        if template not in self._class_of:
            return (_PRIOR, _PRIOR)
        successes = episodes = 0.0
        for other in self._classes[self._class_of[template]]:
            if other != template and other in self._rewards:
                successes += sum(self._rewards[other])
                episodes += len(self._rewards[other])
        mean = (_PRIOR + successes) / (2 * _PRIOR + episodes)
        return (mean, 1.0 - mean)

    def weights(self) -> dict[str, float]:
        """Each template's current weight (what `next` draws by, under "signal")."""
        return {name: self.weight(name) for name in sorted(self._by_template)}

    def _next_in_order(self) -> TaskConfig:
        if not self._order:
            self._new_epoch()
        return self._order.pop()

    def _new_epoch(self) -> None:
        self.epoch += 1
        self._order = list(self._tasks)
        if self.shuffle:
            random.Random(f"{self._seed}:{self.epoch}").shuffle(self._order)
        if self.kind == "short_first" or self.warmup:
            self._order.sort(key=self._shortness)  # stable: shuffled within a length
        self._order.reverse()  # pop() from the end takes them in shuffled order

    def _shortness(self, task: TaskConfig) -> tuple[bool, int]:
        steps = self._length(task) if self._length is not None else None
        return (steps is None, steps or 0)

    def _next_of(self, template: str) -> TaskConfig:
        queue = self._queues.get(template)
        if not queue:
            self._rounds[template] += 1
            queue = list(self._by_template[template])
            random.Random(f"{self._seed}:{template}:{self._rounds[template]}").shuffle(queue)
            queue.reverse()
            self._queues[template] = queue
        # Every template's tasks drawn once = one epoch, as in the shuffled order.
        self.epoch = max(0, min(self._rounds.get(name, 0) for name in self._by_template) - 1)
        return queue.pop()
