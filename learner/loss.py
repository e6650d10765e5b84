"""The M-GRPO objective (WebAgent-R1), as pure functions of tensors.

No state, no logging, no I/O. Notation: a batch holds trajectories i (from several groups),
trajectory i holds actions j (one per turn), action j holds completion tokens t.

Advantages (one per trajectory, shared by all its tokens)::

    A_i = (R_i - mean(R)) / (std(R) + eps)        over the G trajectories of one group

- `std` is the population standard deviation (divide by G, not G - 1): the group is the
  whole set being standardised, not a sample from which a wider spread is estimated, and
  it keeps the scale independent of G for binary rewards (one success among two gives
  A = +-1 / (1 + 2 eps), not +-0.707). It also makes a group of one defined.
- A group whose rewards are all equal (including a group of one) has A_i = 0 exactly; the
  learner sets such groups aside (they carry no signal) and counts them.

Per-token objective, with rho = exp(logp_new - logp_old)::

    J_t = min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)  -  beta * k3_t
    k3_t = exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1      (only when beta > 0)

Averaging, exactly as M-GRPO: over the tokens of an action, then over the actions of a
trajectory, then over the trajectories of the batch::

    J = 1/|B| sum_i 1/|T_i| sum_j 1/|o_ij| sum_t J_ijt        loss = -J

This is a weighted sum over tokens with w_ijt = 1 / (|B| |T_i| |o_ij|) (`triple_mean_weights`).
Because the weights are fixed for the whole batch before any forward pass, the loss is a
plain sum over tokens, so summing the losses (and gradients) of any split of the batch into
micro-batches gives exactly the full-batch value. An action with no trained token (empty
completion, or fully masked) does not count in |T_i|; a trajectory with no such action
does not count in |B|.

Numerical choices: the log-ratio is clamped to [-20, 20] before `exp` (a token whose ratio
leaves e^+-20 gets a large, finite term and no gradient, instead of inf/nan); masked
positions (weight 0) are zeroed before any `exp`, so padding never produces nan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "LossParts",
    "group_advantages",
    "mgrpo_loss",
    "token_logprobs",
    "triple_mean_weights",
]

_MAX_LOG_RATIO = 20.0


def group_advantages(rewards: Tensor, *, eps: float) -> Tensor:
    """Standardised rewards of ONE group.

    rewards: [G] floating. Returns [G] of the same dtype:
    `(R - mean(R)) / (std(R) + eps)` with the population std (correction 0), and exactly
    zeros when all rewards are equal (zero variance; a group of one).
    """
    if rewards.ndim != 1 or rewards.numel() == 0:
        raise ValueError(
            f"rewards must be a non-empty 1-D tensor, got shape {tuple(rewards.shape)}"
        )
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be floating point, got {rewards.dtype}")
    if bool((rewards == rewards[0]).all()):
        return torch.zeros_like(rewards)
    centered = rewards - rewards.mean()
    return centered / (rewards.std(correction=0) + eps)


def triple_mean_weights(token_counts: Sequence[Sequence[int]]) -> list[list[float]]:
    """Per-token weight of every action, making a token sum the M-GRPO triple mean.

    token_counts[i][j]: number of trained tokens of action j of trajectory i (0 allowed).
    Returns w[i][j] = 1 / (|B| * |T_i| * token_counts[i][j]) for every action with tokens,
    0.0 for actions without; |T_i| counts only actions with tokens and |B| only
    trajectories with at least one such action. All weights are 0.0 when no action has
    a token. The weights of all tokens sum to 1 (or 0).
    """
    live = [[n for n in turns if n > 0] for turns in token_counts]
    n_traj = sum(1 for turns in live if turns)
    out: list[list[float]] = []
    for turns, kept in zip(token_counts, live, strict=True):
        n_actions = len(kept)
        out.append([1.0 / (n_traj * n_actions * n) if n > 0 else 0.0 for n in turns])
    return out


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log p(targets[n, t]) under logits[n, t].

    logits: [N, T, V] (already shifted: position t predicts targets[:, t]); targets:
    [N, T] int64. Returns [N, T] in the dtype of `logits` (computed in float32 at least).
    Uses logsumexp so no [N, T, V] log-softmax is kept beyond what autograd needs.
    """
    if logits.shape[:2] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not align"
        )
    work = logits if logits.dtype == torch.float64 else logits.float()
    picked = work.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(work, dim=-1)


class LossParts(NamedTuple):
    """The loss and its metrics, each a WEIGHTED SUM over the tokens given.

    With weights summing to one over a whole batch each field is the triple mean over that
    batch; summed over micro-batches they add up to it. Only `loss` carries gradient.
    """

    loss: Tensor  # -J (minimised)
    clip_fraction: Tensor  # share of tokens whose clipped branch is active
    approx_kl: Tensor  # k3 estimate of KL(old || new): (rho - 1) - log rho
    ratio_mean: Tensor  # mean of rho
    ref_kl: Tensor  # k3 estimate of KL(new || ref); 0 when beta == 0


def mgrpo_loss(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    weights: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    beta: float = 0.0,
    logp_ref: Tensor | None = None,
) -> LossParts:
    """The M-GRPO loss over a (micro-)batch of completion tokens.

    logp_new: [N, T] log-probs of the taken tokens under the policy being trained (grad).
    logp_old: [N, T] log-probs under the behaviour policy (or the learner before this
    update); no grad. advantages: [N] (one per row: a turn's trajectory advantage) or
    [N, T]. weights: [N, T], `triple_mean_weights` spread over the tokens, 0 on prompt,
    padding and masked tokens. logp_ref: [N, T], required when beta > 0.

    Clipping (PPO): a token counts as clipped when the clipped branch is the minimum and
    differs, i.e. A > 0 and rho > 1 + eps_high, or A < 0 and rho < 1 - eps_low; exactly on
    a boundary it is not clipped (the two branches are equal there).
    """
    if logp_new.shape != logp_old.shape or logp_new.shape != weights.shape:
        raise ValueError(
            "logp_new, logp_old and weights must have one shape, got "
            f"{tuple(logp_new.shape)}, {tuple(logp_old.shape)}, {tuple(weights.shape)}"
        )
    if beta > 0 and logp_ref is None:
        raise ValueError("beta > 0 needs logp_ref")
    adv = advantages.unsqueeze(-1) if advantages.ndim == 1 else advantages
    adv = adv.to(logp_new.dtype)
    live = weights != 0
    zero = torch.zeros((), dtype=logp_new.dtype, device=logp_new.device)
    log_ratio = torch.where(live, logp_new - logp_old.detach(), zero)
    log_ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    if beta > 0:
        assert logp_ref is not None
        ref_delta = torch.where(live, logp_ref.detach() - logp_new, zero)
        ref_delta = ref_delta.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        k3_ref = torch.exp(ref_delta) - ref_delta - 1.0
        objective = surrogate - beta * k3_ref
        ref_kl = (weights * k3_ref).sum().detach()
    else:
        objective = surrogate
        ref_kl = zero.clone()
    loss = -(weights * objective).sum()
    with torch.no_grad():
        is_clipped = ((adv > 0) & (ratio > 1.0 + eps_high)) | ((adv < 0) & (ratio < 1.0 - eps_low))
        clip_fraction = (weights * is_clipped.to(weights.dtype)).sum()
        approx_kl = (weights * ((ratio - 1.0) - log_ratio)).sum()
        ratio_mean = (weights * ratio).sum()
    return LossParts(
        loss=loss,
        clip_fraction=clip_fraction,
        approx_kl=approx_kl,
        ratio_mean=ratio_mean,
        ref_kl=ref_kl,
    )
