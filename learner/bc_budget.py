"""When BC stops, evaluates and how fast it learns under its bound (`bc.max_minutes`,
`bc.max_steps`): pure functions of elapsed time, step time and evaluation cost, split from
`learner.bc`, which calls them once a step."""

from __future__ import annotations

import math

__all__ = [
    "another_step_fits",
    "budget_progress",
    "first_eval_estimate_s",
    "periodic_eval_fits",
    "schedule_factor",
]


def another_step_fits(
    *, elapsed_s: float, budget_s: float, step_s: float, final_eval_s: float
) -> bool:
    """Whether one more step and the evaluation that ends the run still fit in `budget_s`.

    `bc.max_minutes` bounds the whole run, its final evaluation included: the bootstrap's
    BC is the stage before rollouts, and an evaluation (2 x `eval_examples` turns) takes
    1.5-2 minutes on 2 cores. Before the first evaluation the caller passes
    `first_eval_estimate_s`.
    """
    return elapsed_s + step_s + final_eval_s <= budget_s


def periodic_eval_fits(
    *, elapsed_s: float, budget_s: float, step_s: float, eval_s: float, period_steps: int
) -> bool:
    """Whether an evaluation every `period_steps` (`bc.eval_every_steps`) is worth its time
    now, under `bc.max_minutes`: only if a whole period of steps and the final evaluation
    still fit after it. Otherwise the final one comes within the period anyway, and this
    one would only take its minutes from training. (The Ice Lake first run at 1cec4d9
    evaluated at step 100, 688 s of training in, for 120 s; then one more step and the
    final evaluation no longer fit, so BC ended at 809 s of its 900 with ~13 steps unused.)
    """
    return elapsed_s + eval_s + period_steps * step_s + eval_s <= budget_s


def budget_progress(
    *, step: int, max_steps: int, elapsed_s: float, budget_s: float, final_eval_s: float
) -> float:
    """How far a BC run is through its bound, 0..1: the larger of `step` of `max_steps` and
    `elapsed_s` of the training time `budget_s` leaves before its final evaluation (a bound
    of 0 does not count). `bc.schedule = "cosine"` decays the learning rate by it."""
    shares = [0.0]
    if max_steps:
        shares.append(step / max_steps)
    if budget_s:
        shares.append(elapsed_s / max(budget_s - final_eval_s, 1e-9))
    return min(1.0, max(shares))


def schedule_factor(schedule: str, progress: float) -> float:
    """Multiplier of `bc.learning_rate` after warm-up at `progress` (`budget_progress`):
    1 ("constant") or a half cosine from 1 to 0 ("cosine")."""
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, progress))))
    return 1.0


# A no-grad forward over a turn's tokens costs at most this share of a training step's
# per-turn time: over 1,024 tokens of SmolLM2 with top-10 LoRA, 3.5 CPU-s against 5.0 for
# forward+backward (docs/model.md); with LoRA on more layers, or full fine-tuning, less.
_FORWARD_SHARE = 0.7


def first_eval_estimate_s(*, step_s: float, batch_size: int, eval_turns: int) -> float:
    """What the first evaluation (`eval_turns` turns, no gradients) will take, from the
    mean training step of `batch_size` turns: an upper estimate, for the budget before any
    evaluation has been timed. (The Ice Lake first run at b03c851, whose only evaluation
    was its last, ended 1.9 minutes past 15 without it: 88 steps of 10.1 s, then 122 s.)"""
    return _FORWARD_SHARE * step_s * eval_turns / batch_size
