"""A WebRL actor update on a tiny model: advantages from the critic, the KL-constrained
step raising the log-ratio of good actions and lowering that of bad ones."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from learner.batch import MicroBatch, TurnSample, collate, micro_batches, policy_logprobs
from learner.critic import Critic
from learner.errors import BatchError
from learner.webrl_update import actor_samples, actor_step
from runtime.base.messages import Trajectory, TrajectoryGroup, Turn


def _groups(model: Any, n: int, seed: int) -> list[TrajectoryGroup]:
    """Episodes of 1-2 turns with random prompts and completions; their reference
    log-probs are `model`'s own (so the log-ratio starts at 0). Even episodes succeed."""
    rng = random.Random(seed)
    groups = []
    for i in range(n):
        turns = []
        for t in range(rng.randint(1, 2)):
            prompt = [rng.randrange(2, 64) for _ in range(rng.randint(3, 8))]
            completion = [rng.randrange(2, 64) for _ in range(rng.randint(1, 4))]
            turns.append(
                Turn(index=t, url="", observation="", observation_digest="", text="",
                     prompt_token_ids=prompt, completion_token_ids=completion)
            )  # fmt: skip
        trajectory = Trajectory(
            episode_id=f"g{i}-0", group_id=f"g{i}", task_id=i, intent="t", turns=turns,
            reward=float(i % 2 == 0), status="exited",
        )  # fmt: skip
        groups.append(
            TrajectoryGroup(group_id=f"g{i}", task_id=i, trajectories=[trajectory], created_at=0)
        )
    return [_with_logprobs(model, g) for g in groups]


def _with_logprobs(model: Any, group: TrajectoryGroup) -> TrajectoryGroup:
    import msgspec

    trajectories = []
    for trajectory in group.trajectories:
        turns = []
        for turn in trajectory.turns:
            lp = _logprobs(model, turn.prompt_token_ids, turn.completion_token_ids)
            turns.append(msgspec.structs.replace(turn, completion_logprobs=lp))
        trajectories.append(msgspec.structs.replace(trajectory, turns=turns))
    return msgspec.structs.replace(group, trajectories=trajectories)


def _logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    from learner.batch import TurnSample

    sample = TurnSample(
        group_id="", episode_id="", turn=0, prompt_ids=tuple(prompt),
        completion_ids=tuple(completion), mask=(True,) * len(completion), old_logprobs=(),
        advantage=0.0, weight=1.0,
    )  # fmt: skip
    with torch.no_grad():
        return [float(x) for x in policy_logprobs(model, collate([sample], pad_id=0))[0]]


def test_samples_take_their_advantage_from_the_critic(tiny_qwen: Callable[..., Any]) -> None:
    policy = tiny_qwen(seed=0)
    groups = _groups(policy, 6, seed=1)
    critic = Critic(tiny_qwen(seed=1), seed=1)
    samples = actor_samples(groups, critic, lam=0.5, gamma=0.9)
    turns = [t for g in groups for t in g.trajectories[0].turns]
    assert len(samples) == len(turns)
    assert sum(s.weight for s in samples) == pytest.approx(1.0)
    first = groups[0].trajectories[0]  # a success
    values = critic.values([t.prompt_token_ids for t in first.turns])
    last = len(values) - 1
    want_last = 0.5 * (1 - values[last]) + 0.5 * (1 - values[last])  # r_T + 0 - V, MC 1 - V
    mine = [s for s in samples if s.episode_id == first.episode_id]
    assert mine[-1].advantage == pytest.approx(want_last, abs=1e-6)
    assert mine[-1].old_logprobs == tuple(first.turns[-1].completion_logprobs)


def test_a_turn_without_reference_logprobs_is_named(tiny_qwen: Callable[..., Any]) -> None:
    import msgspec

    policy = tiny_qwen(seed=0)
    group = _groups(policy, 1, seed=2)[0]
    bare = msgspec.structs.replace(group.trajectories[0].turns[0], completion_logprobs=[])
    broken = msgspec.structs.replace(
        group, trajectories=[msgspec.structs.replace(group.trajectories[0], turns=[bare])]
    )
    with pytest.raises(BatchError, match="g0-0, turn 0: no reference log-probs"):
        actor_samples([broken], Critic(tiny_qwen(seed=1)), lam=0.5, gamma=0.9)


def test_steps_move_log_ratios_toward_advantage_over_beta(tiny_qwen: Callable[..., Any]) -> None:
    torch.manual_seed(0)
    policy = tiny_qwen(seed=0).train()
    groups = _groups(policy, 8, seed=3)
    samples = actor_samples(groups, Critic(tiny_qwen(seed=1), seed=1), lam=0.5, gamma=0.9)
    assert {s.advantage > 0 for s in samples} == {True, False}
    frozen = torch.optim.SGD(policy.parameters(), lr=0.0)
    whole = actor_step(policy, frozen, _batches(samples, 10_000), beta=0.5, temperature=1.0)
    split = actor_step(policy, frozen, _batches(samples, 12), beta=0.5, temperature=1.0)
    assert split.loss.item() == pytest.approx(whole.loss.item(), rel=1e-5)
    assert whole.log_ratio.item() == pytest.approx(0.0, abs=1e-5)  # the reference is itself
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    batches = _batches(samples, 64)
    losses = [
        actor_step(policy, optimizer, batches, beta=0.5, temperature=1.0).loss.item()
        for _ in range(30)
    ]
    assert losses[-1] < 0.2 * losses[0]
    for sample in samples:
        now = sum(_logprobs(policy, list(sample.prompt_ids), list(sample.completion_ids)))
        ratio = now - sum(sample.old_logprobs)
        assert (ratio > 0) == (sample.advantage > 0), (ratio, sample.advantage)


def _batches(samples: list[TurnSample], token_budget: int) -> list[MicroBatch]:
    return [collate(chunk, pad_id=0) for chunk in micro_batches(samples, token_budget)]
