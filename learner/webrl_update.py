"""One WebRL actor update on a phase's turns: the critic's values give each turn its
advantage, the KL-constrained loss moves the policy's log-ratio to the reference toward
A / beta.

The reference policy is the one that produced the phase's rollouts (WebRL's pi_ref, the
previous phase's policy), so its log-probs are the server's sampled ones
(`Turn.completion_logprobs`); a turn without them cannot be trained and is a `BatchError`
naming it. The policy's own log-probs are taken at the temperature the server sampled at,
as the M-GRPO learner does. Each turn is one action; the actions of a batch weigh
1/N each, so micro-batches (`learner.batch.micro_batches`, cut by padded tokens) add up to
the batch's loss and gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from learner.batch import MicroBatch, TurnSample, policy_logprobs
from learner.critic import Critic
from learner.errors import BatchError
from learner.webrl import ActorParts, actor_loss, step_advantages
from runtime.base.messages import TrajectoryGroup

if TYPE_CHECKING:
    from learner.frozen import BottomOutput

__all__ = ["actor_samples", "actor_step"]


def actor_samples(
    groups: Sequence[TrajectoryGroup], critic: Critic, *, lam: float, gamma: float
) -> list[TurnSample]:
    """One sample per turn of every evaluated episode, its advantage from the critic's
    values of the episode's states (`step_advantages`), each weighing 1/N."""
    import torch

    rows: list[tuple[str, str, int, list[int], list[int], list[float], float]] = []
    for group in groups:
        for trajectory in group.trajectories:
            if not trajectory.scored or not trajectory.turns:
                continue
            for turn in trajectory.turns:
                where = f"episode {trajectory.episode_id}, turn {turn.index}"
                if not turn.prompt_token_ids or not turn.completion_token_ids:
                    raise BatchError(f"{where}: no token ids to train on")
                if len(turn.completion_logprobs) != len(turn.completion_token_ids):
                    raise BatchError(f"{where}: no reference log-probs for its completion")
            values = torch.tensor(
                critic.values([t.prompt_token_ids for t in trajectory.turns]), dtype=torch.float64
            )
            outcome = int(trajectory.reward > 0)
            advantages = step_advantages(values, outcome, lam=lam, gamma=gamma).tolist()
            rows.extend(
                (group.group_id, trajectory.episode_id, turn.index, turn.prompt_token_ids,
                 turn.completion_token_ids, turn.completion_logprobs, advantage)
                for turn, advantage in zip(trajectory.turns, advantages, strict=True)
            )  # fmt: skip
    weight = 1.0 / len(rows) if rows else 0.0
    return [
        TurnSample(
            group_id=gid, episode_id=eid, turn=index, prompt_ids=tuple(prompt),
            completion_ids=tuple(completion), mask=(True,) * len(completion),
            old_logprobs=tuple(logprobs), advantage=advantage, weight=weight,
        )
        for gid, eid, index, prompt, completion, logprobs, advantage in rows
    ]  # fmt: skip


def actor_step(
    model: Any,
    optimizer: Any,
    batches: Sequence[MicroBatch],
    *,
    beta: float,
    temperature: float,
    grad_clip: float = math.inf,
    below: Sequence[BottomOutput | None] | None = None,
) -> ActorParts:
    """One optimizer step over the collated micro-batches of a phase's samples (their
    weights summing to one: `micro_batches` then `collate`, on the model's device), the
    gradient's norm clipped to `grad_clip`; returns the batch's loss and metrics, summed
    over its micro-batches. `below`: each micro-batch's output of the model's frozen
    bottom layers (`learner.frozen`), in the same order."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    totals = [torch.zeros(()) for _ in ActorParts._fields]
    for mb, mb_below in zip(batches, below or [None] * len(batches), strict=True):
        logp_new = policy_logprobs(model, mb, temperature=temperature, below=mb_below)
        mask = mb.weights > 0
        row_weights = mb.weights.amax(dim=1)  # every trained token of a row has its weight
        parts = actor_loss(logp_new, mb.old_logprobs, mb.advantages, mask, row_weights, beta=beta)
        parts.loss.backward()  # type: ignore[no-untyped-call]
        totals = [t + p.detach().cpu() for t, p in zip(totals, parts, strict=True)]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    optimizer.step()
    return ActorParts(*totals)
