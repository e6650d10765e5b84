"""WebRL's critic on a tiny model: its examples, one step's loss, and that it learns which
states lead to success."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from learner.critic import Critic, CriticExample, critic_examples
from learner.webrl import critic_loss
from runtime.base.messages import Trajectory, TrajectoryGroup, Turn

SUCCESS_MARK, FAILURE_MARK = 5, 6


def _groups(n: int, seed: int, *, status: str = "exited") -> list[TrajectoryGroup]:
    """Episodes of 1-3 turns; the prompts of an episode that will succeed carry token 5
    somewhere, those of one that will fail token 6 (a fact of the state the critic can
    read), the rest random ids."""
    rng = random.Random(seed)
    groups = []
    for i in range(n):
        success = rng.random() < 0.5
        turns = []
        for t in range(rng.randint(1, 3)):
            ids = [rng.randrange(10, 64) for _ in range(rng.randint(4, 12))]
            ids.insert(rng.randrange(len(ids)), SUCCESS_MARK if success else FAILURE_MARK)
            turns.append(
                Turn(index=t, url="http://x/", observation="", observation_digest="",
                     text="", prompt_token_ids=ids)
            )  # fmt: skip
        trajectory = Trajectory(
            episode_id=f"g{i}-0", group_id=f"g{i}", task_id=i, intent="t", turns=turns,
            reward=float(success), status=status,
        )  # fmt: skip
        groups.append(
            TrajectoryGroup(group_id=f"g{i}", task_id=i, trajectories=[trajectory], created_at=0)
        )
    return groups


def test_examples_are_the_turns_of_evaluated_episodes() -> None:
    groups = _groups(6, seed=0)
    lost = _groups(3, seed=1, status="error:worker")
    examples = critic_examples(groups + lost)
    turns = sum(len(g.trajectories[0].turns) for g in groups)
    assert len(examples) == turns
    for example in examples:
        success = SUCCESS_MARK in example.prompt_ids
        assert example.outcome == int(success)
    no_ids = Turn(index=0, url="", observation="", observation_digest="", text="")
    bare = Trajectory(episode_id="b", group_id="b", task_id=9, intent="t", turns=[no_ids])
    assert (
        critic_examples(
            [TrajectoryGroup(group_id="b", task_id=9, trajectories=[bare], created_at=0)]
        )
        == []
    )


def test_a_step_reports_the_batch_loss(tiny_qwen: Callable[..., Any]) -> None:
    critic = Critic(tiny_qwen(seed=1), seed=1)
    batch = critic_examples(_groups(4, seed=2))
    with torch.no_grad():
        logits = torch.stack([critic.logit(e.prompt_ids) for e in batch])
        outcomes = torch.tensor([e.outcome for e in batch])
        want = critic_loss(logits, outcomes, torch.full((len(batch),), 1 / len(batch)))
    optimizer = torch.optim.SGD(critic.parameters(), lr=0.0)
    assert critic.step(optimizer, batch) == pytest.approx(float(want), rel=1e-5)


def test_the_critic_learns_which_states_succeed(tiny_qwen: Callable[..., Any]) -> None:
    torch.manual_seed(0)
    critic = Critic(tiny_qwen(seed=0).train(), seed=0)
    train = critic_examples(_groups(120, seed=3))
    held = critic_examples(_groups(30, seed=4))

    def mean_values(examples: list[CriticExample]) -> tuple[float, float]:
        values = critic.values([e.prompt_ids for e in examples])
        good = [v for v, e in zip(values, examples, strict=True) if e.outcome]
        bad = [v for v, e in zip(values, examples, strict=True) if not e.outcome]
        return sum(good) / len(good), sum(bad) / len(bad)

    good, bad = mean_values(held)
    assert abs(good - bad) < 0.2  # untrained: it cannot tell
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    rng = random.Random(0)
    for _ in range(200):
        critic.step(optimizer, rng.sample(train, 8))
    good, bad = mean_values(held)
    # Over model seeds 0-7 on one machine, 200 steps gave good >= 0.89, bad <= 0.14 and
    # held-out accuracy >= 0.93; 80 steps left seed 0 at 0.59 / 0.08. The bounds leave
    # room for another CPU's rounding.
    assert good > 0.75 and bad < 0.25, (good, bad)
    values = critic.values([e.prompt_ids for e in held])
    right = sum((v > 0.5) == bool(e.outcome) for v, e in zip(values, held, strict=True))
    assert right / len(held) >= 0.85, right / len(held)
