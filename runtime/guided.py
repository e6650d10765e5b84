"""Guided starts: the oracle plays a task's first steps, the policy the rest.

A model fresh from BC on tasks of at most 3 steps solves almost no longer task (on the
built-in suite half the test tasks and 8 of the 10 ood templates take 4 or more), so
M-GRPO's groups on them all fail and teach nothing: in the RL runs of docs/model.md, 0 of
31 groups of tasks of 5 or more steps had a success. A guided start begins such a task
where only its last steps remain: the oracle (`runtime.oracle`, the suite's scripted
solution read through the model's own observations) plays the first `guide` steps, then
the policy takes over in the same browser session, with the oracle's turns in its
history as if they were its own. A group of guided episodes starts from one state, so
its rewards still compare the policy's choices; the oracle's turns have no completion
tokens, so the learner trains on the policy's turns only (`learner.batch`). This is a
reverse curriculum (Salimans and Chen 2018, "Learning Montezuma's Revenge from a single
demonstration"): with "signal" drawing, each guided variant is a template of its own
whose prior is pooled with the tasks of the length left to the policy, so the variants
whose groups come out mixed are drawn most, and the policy's part grows with what it
solves.

`guided_variants` makes the variants of a training split (`scheduler.guide_longer_than`);
evaluations are never guided: a `Rollout` without an oracle refuses a guided task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec
from msgspec import UNSET

from policy.prompt import without_first_rounds
from runtime.base.messages import PolicyReply, PolicyRequest, TaskConfig
from runtime.oracle import OraclePolicy
from runtime.protocols import Policy

__all__ = ["GuidedPolicy", "guide_of", "guided_variants", "steps_left"]

# The fewest steps a guided variant leaves to the policy: 1 is the last step alone (the
# answer read off the page the oracle reached, or the exit after its last action).
MIN_LEFT = 1


def guide_of(task: TaskConfig) -> int:
    """The steps the oracle plays first (0: an ordinary task)."""
    return 0 if task.guide is UNSET else int(task.guide)


def guided_variants(
    tasks: Iterable[TaskConfig], longer_than: int, length: Callable[[TaskConfig], int | None]
) -> list[TaskConfig]:
    """For each task whose scripted solution takes n > `longer_than` steps (its exit
    included), n - MIN_LEFT variants: the oracle plays the first g steps, g = 1 .. n -
    MIN_LEFT, leaving the policy n - g of them. Tasks of unknown length (WebArena's) have
    none."""
    variants = []
    for task in tasks:
        steps = length(task)
        if steps is None or steps <= longer_than or guide_of(task):
            continue
        variants += [msgspec.structs.replace(task, guide=g) for g in range(1, steps - MIN_LEFT + 1)]
    return variants


def steps_left(length: Callable[[TaskConfig], int | None]) -> Callable[[TaskConfig], int | None]:
    """`length` counting only the steps a guided task leaves to the policy: the length
    "short_first" orders by and "signal" pools priors by."""

    def left(task: TaskConfig) -> int | None:
        steps = length(task)
        return None if steps is None else steps - guide_of(task)

    return left


class GuidedPolicy:
    """One episode's policy: `oracle` acts until it has played `steps` steps of the
    task's plan, `policy` after that. Scrolls the oracle makes to find a step's target are
    turns, not steps. With `shown` false the policy's prompts leave the oracle's rounds
    out: it starts as if the episode began on the page the oracle left it on."""

    def __init__(
        self, oracle: OraclePolicy, policy: Policy, steps: int, *, shown: bool = True
    ) -> None:
        if steps < 1:
            raise ValueError(f"a guided start needs at least one oracle step, got {steps}")
        self.oracle = oracle
        self.policy = policy
        self.steps = steps
        self.shown = shown
        self.handed_over_at: int | None = None

    async def act(self, request: PolicyRequest) -> PolicyReply:
        if self.handed_over_at is None:
            if request.turn == 0 or self.oracle.steps_done(request.episode_id) < self.steps:
                return await self.oracle.act(request)
            self.oracle.forget(request.episode_id)
            self.handed_over_at = request.turn
        if not self.shown:
            messages = without_first_rounds(
                request.messages, request.task.intent, self.handed_over_at
            )
            request = msgspec.structs.replace(request, messages=messages)
        return await self.policy.act(request)
