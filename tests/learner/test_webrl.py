"""WebRL's critic, advantage, actor loss and replay rules against float64 references in
plain Python and hand-computed cases."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from learner.webrl import (
    actor_loss,
    critic_keeps_task,
    critic_loss,
    keeps_by_perplexity,
    perplexity,
    replay_sample,
    step_advantages,
)

# --------------------------------------------------------------------------- advantages


def ref_advantages(values: list[float], outcome: int, lam: float, gamma: float) -> list[float]:
    """The formula term by term, by a loop."""
    last = len(values) - 1
    out = []
    for t, v in enumerate(values):
        reward = float(outcome) if t == last else 0.0
        following = values[t + 1] if t < last else 0.0
        mc_return = gamma ** (last - t) * outcome
        out.append(lam * (reward + gamma * following - v) + (1 - lam) * (mc_return - v))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_advantages_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.random() for _ in range(rng.randint(1, 9))]
    outcome = rng.choice([0, 1])
    lam, gamma = rng.choice([(0.5, 0.9), (0.0, 1.0), (1.0, 0.95), (0.3, 1.0)])
    got = step_advantages(torch.tensor(values, dtype=torch.float64), outcome, lam=lam, gamma=gamma)
    assert got.tolist() == pytest.approx(ref_advantages(values, outcome, lam, gamma), abs=1e-14)


def test_advantages_by_hand() -> None:
    # Two actions, success, the paper's undiscounted form (gamma = 1), lam 0.5:
    # A_0 = 0.5 (0 + 0.6 - 0.2) + 0.5 (1 - 0.2) = 0.6
    # A_1 = 0.5 (1 + 0 - 0.6) + 0.5 (1 - 0.6) = 0.4
    got = step_advantages(torch.tensor([0.2, 0.6], dtype=torch.float64), 1, lam=0.5, gamma=1.0)
    assert got.tolist() == pytest.approx([0.6, 0.4], abs=1e-15)
    # A failure the critic saw coming (V = 0 throughout) teaches nothing; one it did not
    # (V high) is pushed down at every step.
    assert step_advantages(torch.zeros(3), 0, lam=0.5, gamma=0.9).tolist() == [0.0] * 3
    assert bool((step_advantages(torch.full((3,), 0.8), 0, lam=0.5, gamma=0.9) < 0).all())
    # One action: A = r - V whatever lam is.
    for lam in (0.0, 0.5, 1.0):
        one = step_advantages(torch.tensor([0.25], dtype=torch.float64), 1, lam=lam, gamma=0.9)
        assert one.item() == pytest.approx(0.75, abs=1e-15)


def test_advantages_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="non-empty 1-D"):
        step_advantages(torch.zeros(0), 1, lam=0.5, gamma=0.9)
    with pytest.raises(ValueError, match="outcome must be 0 or 1"):
        step_advantages(torch.zeros(2), 0.5, lam=0.5, gamma=0.9)
    with pytest.raises(ValueError, match="lam"):
        step_advantages(torch.zeros(2), 1, lam=1.5, gamma=0.9)
    with pytest.raises(ValueError, match="gamma"):
        step_advantages(torch.zeros(2), 1, lam=0.5, gamma=0.0)


# --------------------------------------------------------------------------- critic


def ref_critic(
    logits: list[float], outcomes: list[int], weights: list[float]
) -> tuple[float, list[float]]:
    """Loss and dLoss/dz by a loop: -w [y log s(z) + (1 - y) log(1 - s(z))], d = w (s(z) - y)."""
    loss, grads = 0.0, []
    for z, y, w in zip(logits, outcomes, weights, strict=True):
        s = 1 / (1 + math.exp(-z))
        loss += -w * (y * math.log(s) + (1 - y) * math.log(1 - s)) if w else 0.0
        grads.append(w * (s - y))
    return loss, grads


@pytest.mark.parametrize("seed", range(6))
def test_critic_loss_and_gradient_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 12)
    logits = [rng.uniform(-6, 6) for _ in range(n)]
    outcomes = [rng.choice([0, 1]) for _ in range(n)]
    weights = [1.0 / n] * n
    want, want_grad = ref_critic(logits, outcomes, weights)
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    got = critic_loss(z, torch.tensor(outcomes), torch.tensor(weights, dtype=torch.float64))
    assert got.item() == pytest.approx(want, rel=1e-12)
    got.backward()
    assert z.grad is not None
    assert z.grad.tolist() == pytest.approx(want_grad, rel=1e-9, abs=1e-15)


def test_critic_loss_is_finite_at_huge_logits_and_ignores_masked_rows() -> None:
    z = torch.tensor([200.0, -200.0, float("nan"), float("inf")], dtype=torch.float64)
    z.requires_grad_(True)
    y = torch.tensor([0, 1, 1, 0])
    w = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    loss = critic_loss(z, y, w)
    assert loss.item() == pytest.approx(200.0, rel=1e-12)  # -log s(-200) = 200, both rows
    loss.backward()
    assert z.grad is not None
    assert z.grad.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="one shape"):
        critic_loss(torch.zeros(2), torch.zeros(3), torch.zeros(2))


# --------------------------------------------------------------------------- actor


def random_actions(rng: random.Random) -> list[tuple[float, list[tuple[float, float]]]]:
    """(advantage, [(logp_new, logp_ref) per trained token]) per action; some with none."""
    return [
        (
            rng.uniform(-1, 1),
            [
                (-rng.uniform(0.01, 3), -rng.uniform(0.01, 3))
                for _ in range(rng.choice([0, 1, 2, 5]))
            ],
        )
        for _ in range(rng.randint(1, 7))
    ]


def ref_actor(
    actions: list[tuple[float, list[tuple[float, float]]]], beta: float
) -> tuple[float, list[float]]:
    """Loss and the per-action dLoss/dlogp_new of each token: 2 w beta (beta delta - A)."""
    w = 1.0 / len(actions)
    loss, grads = 0.0, []
    for adv, toks in actions:
        delta = sum(new - ref for new, ref in toks)
        loss += w * (beta * delta - adv) ** 2
        grads.append(2 * w * beta * (beta * delta - adv))
    return loss, grads


def tensors(
    actions: list[tuple[float, list[tuple[float, float]]]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row per action, padded with garbage where the mask is false."""
    width = max(len(toks) for _, toks in actions) + 2
    shape = (len(actions), width)
    new = torch.full(shape, float("nan"), dtype=torch.float64)
    ref = torch.full(shape, float("inf"), dtype=torch.float64)
    mask = torch.zeros(shape, dtype=torch.bool)
    for n, (_, toks) in enumerate(actions):
        for t, (a, b) in enumerate(toks):
            new[n, t + 1], ref[n, t + 1], mask[n, t + 1] = a, b, True
    adv = torch.tensor([a for a, _ in actions], dtype=torch.float64)
    weights = torch.full((len(actions),), 1.0 / len(actions), dtype=torch.float64)
    return new, ref, adv, mask, weights


@pytest.mark.parametrize("beta", [0.05, 1.0])
@pytest.mark.parametrize("seed", range(6))
def test_actor_loss_and_gradient_match_reference(seed: int, beta: float) -> None:
    actions = random_actions(random.Random(seed))
    want, want_grads = ref_actor(actions, beta)
    new, ref, adv, mask, weights = tensors(actions)
    new.requires_grad_(True)
    parts = actor_loss(new, ref, adv, mask, weights, beta=beta)
    assert parts.loss.item() == pytest.approx(want, rel=1e-12)
    parts.loss.backward()
    assert new.grad is not None
    for n, (_, toks) in enumerate(actions):
        row = new.grad[n]
        assert row[1 : 1 + len(toks)].tolist() == pytest.approx(
            [want_grads[n]] * len(toks), rel=1e-9
        )
        assert row[~mask[n]].abs().sum().item() == 0.0  # padding: no gradient, no nan


def test_actor_micro_batches_of_rows_sum_to_the_batch() -> None:
    actions = random_actions(random.Random(7)) + random_actions(random.Random(8))
    new, ref, adv, mask, weights = tensors(actions)
    full = actor_loss(new, ref, adv, mask, weights, beta=0.3)
    cuts = [0, 1, 3, len(actions)]
    pieces = [
        actor_loss(new[a:b], ref[a:b], adv[a:b], mask[a:b], weights[a:b], beta=0.3)
        for a, b in itertools.pairwise(cuts)
    ]
    for field in full._fields:
        total = sum(getattr(p, field).item() for p in pieces)
        assert total == pytest.approx(getattr(full, field).item(), rel=1e-12)


def test_actor_by_hand_moves_toward_advantage_over_beta() -> None:
    # One action of two tokens, at the reference (delta 0), A = 0.5, beta 0.1:
    # L = (0 - 0.5)^2 = 0.25; dL/dlogp = 2 * 0.1 * (0 - 0.5) = -0.1 per token (raise both).
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    parts = actor_loss(lp, lp.detach(), torch.tensor([0.5]), mask, torch.ones(1), beta=0.1)
    assert parts.loss.item() == pytest.approx(0.25)
    parts.loss.backward()
    assert lp.grad is not None
    assert lp.grad.tolist() == [pytest.approx([-0.1, -0.1])]
    # At log pi/pi_ref = A / beta the loss and its gradient are zero: the constraint holds it.
    at_target = (lp.detach() + torch.tensor([[2.5, 2.5]])).requires_grad_(True)
    held = actor_loss(at_target, lp.detach(), torch.tensor([0.5]), mask, torch.ones(1), beta=0.1)
    assert held.loss.item() == pytest.approx(0.0, abs=1e-24)
    assert held.log_ratio.item() == pytest.approx(5.0)
    held.loss.backward()
    assert at_target.grad is not None
    assert at_target.grad.abs().max().item() == pytest.approx(0.0, abs=1e-12)


def test_actor_rejects_bad_shapes_and_beta() -> None:
    lp = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="one shape"):
        actor_loss(lp, torch.zeros(2, 4), torch.zeros(2), mask, torch.ones(2), beta=0.1)
    with pytest.raises(ValueError, match=r"must be \[2\]"):
        actor_loss(lp, lp, torch.zeros(3), mask, torch.ones(3), beta=0.1)
    with pytest.raises(ValueError, match="beta must be > 0"):
        actor_loss(lp, lp, torch.zeros(2), mask, torch.ones(2), beta=0.0)


# --------------------------------------------------------------------------- replay, curriculum


def test_perplexity_and_its_filter_at_the_bounds() -> None:
    low, high = 1 / 0.95, 1 / 0.5
    assert perplexity([math.log(0.5)] * 3) == pytest.approx(2.0)
    assert perplexity([]) == math.inf
    assert keeps_by_perplexity(perplexity([math.log(0.7)]), low=low, high=high)
    assert keeps_by_perplexity(high, low=low, high=high)
    assert keeps_by_perplexity(low, low=low, high=high)
    assert not keeps_by_perplexity(1.0, low=low, high=high)  # already certain: nothing to learn
    assert not keeps_by_perplexity(perplexity([math.log(0.4)]), low=low, high=high)  # too far
    assert not keeps_by_perplexity(math.inf, low=low, high=high)


def test_replay_draws_at_most_ratio_times_the_new_data() -> None:
    kept = list(range(50))
    drawn = replay_sample(kept, new=10, ratio=2.0, rng=random.Random(0))
    assert len(drawn) == 20 and len(set(drawn)) == 20 and set(drawn) <= set(kept)
    assert sorted(replay_sample(kept[:5], new=10, ratio=2.0, rng=random.Random(0))) == kept[:5]
    assert replay_sample(kept, new=0, ratio=2.0, rng=random.Random(0)) == []
    again = replay_sample(kept, new=10, ratio=2.0, rng=random.Random(0))
    assert again == drawn  # the rng decides, nothing else
    with pytest.raises(ValueError, match="new >= 0"):
        replay_sample(kept, new=-1, ratio=2.0, rng=random.Random(0))


def test_critic_task_filter_is_strict_at_both_ends() -> None:
    assert critic_keeps_task(0.3, low=0.05, high=0.75)
    assert not critic_keeps_task(0.05, low=0.05, high=0.75)
    assert not critic_keeps_task(0.75, low=0.05, high=0.75)
    assert not critic_keeps_task(0.9, low=0.05, high=0.75)
