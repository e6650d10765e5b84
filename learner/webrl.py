"""WebRL's objectives (arXiv 2411.02337), as pure functions of tensors and numbers.

No state, no logging, no I/O. Notation: a trajectory of task I has actions t = 0..T (T its
last), s_t the state before action t; its binary outcome r_T in {0, 1} (the evaluator's,
or the outcome reward model's) comes after the last action, and every earlier step's
reward r_t is 0.

Critic. V(s_t, I) in (0, 1) is the chance of success from s_t, a logit z_t through the
sigmoid, trained by binary cross-entropy against the trajectory's outcome (`critic_loss`)::

    L_V = -sum_t w_t [ r_T log V(s_t) + (1 - r_T) log(1 - V(s_t)) ]

through `logsigmoid`, so a logit of any size stays finite; w_t sum to one over a batch
(1/N for a plain mean), which makes the loss of any split into micro-batches add up.

Advantage of each action (`step_advantages`), lambda mixing a one-step TD error with the
Monte-Carlo return::

    A_t = lam (r_t + gamma V(s_{t+1}) - V(s_t)) + (1 - lam) (gamma^(T - t) r_T - V(s_t))

with V(s_{T+1}) = 0 (nothing follows the last action). The paper writes it undiscounted;
gamma = 1 gives that formula exactly. WebRL's settings are lam = 0.5 and gamma = 0.9 (the
discount of its Monte-Carlo returns), the defaults here.

Actor: the KL-constrained off-policy update (`actor_loss`), pi_ref the policy that the
previous phase ended with::

    L = sum_a w_a (beta [log pi(a|s) - log pi_ref(a|s)] - A_a)^2

log pi(a|s) is an action's whole reply: the SUM of its trained tokens' log-probs (the
paper's sequence probability; WebRL's released trainer divides by the token count, which
this does not). Minimising it moves log pi / pi_ref toward A / beta: up for a positive
advantage, down for a negative one, and no further, which is the KL constraint. w_a sum to
one over a batch (1/N for a plain mean over actions), so micro-batches of rows add up.

Replay: the buffer keeps successful trajectories only; before a phase's update the actor's
perplexity of each stored action, exp(-mean token log-prob), must lie in [1/0.95, 1/0.5]
(`keeps_by_perplexity`: neither already certain, nor too far from what the actor would
do now), and at most `ratio` times the phase's new data is drawn from it (`replay_sample`).
Curriculum: a generated task is kept when its first state's value lies strictly between
0.05 and 0.75 (`critic_keeps_task`: not solved already, not hopeless).

Numerical choices: masked positions are zeroed before they are summed, so padding (even
inf or nan) never reaches the loss or the gradient.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "ActorParts",
    "actor_loss",
    "critic_keeps_task",
    "critic_loss",
    "keeps_by_perplexity",
    "perplexity",
    "replay_sample",
    "step_advantages",
]

T = TypeVar("T")


def step_advantages(values: Tensor, outcome: float, *, lam: float, gamma: float) -> Tensor:
    """A_t for the actions t = 0..T of ONE trajectory.

    values: [T + 1] V(s_0)..V(s_T), the critic's probabilities (not logits) of the states
    before each action, no grad needed. outcome: r_T, 0 or 1. Returns [T + 1] in the dtype
    of `values`.
    """
    if values.ndim != 1 or values.numel() == 0:
        raise ValueError(f"values must be a non-empty 1-D tensor, got {tuple(values.shape)}")
    if outcome not in (0, 1):
        raise ValueError(f"outcome must be 0 or 1, got {outcome!r}")
    if not 0.0 <= lam <= 1.0 or not 0.0 < gamma <= 1.0:
        raise ValueError(f"need 0 <= lam <= 1 and 0 < gamma <= 1, got lam={lam}, gamma={gamma}")
    last = values.numel() - 1
    steps = torch.arange(last + 1, dtype=values.dtype, device=values.device)
    rewards = torch.zeros_like(values)
    rewards[last] = float(outcome)
    following = torch.cat([values[1:], values.new_zeros(1)])  # V(s_{T+1}) = 0
    td = rewards + gamma * following - values
    monte_carlo = float(outcome) * gamma ** (last - steps) - values
    return lam * td + (1.0 - lam) * monte_carlo


def critic_loss(logits: Tensor, outcomes: Tensor, weights: Tensor) -> Tensor:
    """Weighted binary cross-entropy of the critic's logits against the outcomes.

    logits: [N] z_t (V = sigmoid(z)); outcomes: [N] 0/1, each state's trajectory outcome;
    weights: [N], summing to one over the whole batch (0 drops a row). Returns a scalar.
    """
    if not logits.shape == outcomes.shape == weights.shape or logits.ndim != 1:
        raise ValueError(
            "logits, outcomes and weights must be 1-D of one shape, got "
            f"{tuple(logits.shape)}, {tuple(outcomes.shape)}, {tuple(weights.shape)}"
        )
    live = weights != 0
    z = torch.where(live, logits, torch.zeros_like(logits))
    y = outcomes.to(z.dtype)
    nll = -(y * F.logsigmoid(z) + (1.0 - y) * F.logsigmoid(-z))
    return (weights.to(z.dtype) * torch.where(live, nll, torch.zeros_like(nll))).sum()


class ActorParts(NamedTuple):
    """The actor's loss and metrics, each a WEIGHTED SUM over the actions given (so the
    batch's weighted mean when the weights sum to one). Only `loss` carries gradient."""

    loss: Tensor
    log_ratio: Tensor  # log pi(a|s) - log pi_ref(a|s), per action
    target_gap: Tensor  # |beta log-ratio - A|, per action


def actor_loss(
    logp_new: Tensor,
    logp_ref: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor,
    *,
    beta: float,
) -> ActorParts:
    """The KL-constrained actor loss over a (micro-)batch of actions, one per row.

    logp_new: [N, L] log-probs of the reply tokens under the policy being trained (grad);
    logp_ref: [N, L] under the reference policy (no grad); mask: [N, L] bool, true on an
    action's trained tokens; advantages: [N]; weights: [N], summing to one over the batch.
    """
    if not logp_new.shape == logp_ref.shape == mask.shape or logp_new.ndim != 2:
        raise ValueError(
            "logp_new, logp_ref and mask must be 2-D of one shape, got "
            f"{tuple(logp_new.shape)}, {tuple(logp_ref.shape)}, {tuple(mask.shape)}"
        )
    if advantages.shape != (logp_new.shape[0],) or weights.shape != advantages.shape:
        raise ValueError(
            f"advantages and weights must be [{logp_new.shape[0]}], got "
            f"{tuple(advantages.shape)}, {tuple(weights.shape)}"
        )
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    zero = torch.zeros((), dtype=logp_new.dtype, device=logp_new.device)
    per_token = torch.where(mask, logp_new - logp_ref.detach(), zero)
    log_ratio = per_token.sum(dim=-1)
    gap = beta * log_ratio - advantages.to(log_ratio.dtype)
    w = weights.to(log_ratio.dtype)
    loss = (w * gap.square()).sum()
    with torch.no_grad():
        mean_log_ratio = (w * log_ratio).sum()
        mean_gap = (w * gap.abs()).sum()
    return ActorParts(loss=loss, log_ratio=mean_log_ratio, target_gap=mean_gap)


def perplexity(token_logprobs: Sequence[float]) -> float:
    """exp(-mean log-prob) of one action's reply tokens under the actor (inf for none)."""
    if not token_logprobs:
        return math.inf
    return math.exp(-sum(token_logprobs) / len(token_logprobs))


def keeps_by_perplexity(ppl: float, *, low: float, high: float) -> bool:
    """Whether a replayed action is trained on: low <= ppl <= high (WebRL: 1/0.95, 1/0.5)."""
    return low <= ppl <= high


def replay_sample(kept: Sequence[T], *, new: int, ratio: float, rng: random.Random) -> list[T]:
    """At most `ratio` x `new` items drawn without replacement from `kept` (all if fewer)."""
    if new < 0 or ratio < 0:
        raise ValueError(f"need new >= 0 and ratio >= 0, got new={new}, ratio={ratio}")
    limit = min(len(kept), math.floor(ratio * new))
    return rng.sample(list(kept), limit)


def critic_keeps_task(value: float, *, low: float, high: float) -> bool:
    """Whether a generated task goes into the next phase: low < V(s_0, I) < high."""
    return low < value < high
