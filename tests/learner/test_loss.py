"""The M-GRPO loss against an independent float64 reference and hand-computed cases."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import pytest
import torch

from learner.loss import (
    group_advantages,
    mgrpo_loss,
    token_logprobs,
    triple_mean_weights,
)

EPS_LOW, EPS_HIGH = 0.2, 0.28


# --------------------------------------------------------------------------- reference


@dataclass
class Tok:
    new: float
    old: float
    ref: float


def ref_advantages(rewards: list[float], eps: float) -> list[float]:
    """Textbook formula in plain floats, population std."""
    g = len(rewards)
    mean = sum(rewards) / g
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / g)
    if std == 0.0:
        return [0.0] * g
    return [(r - mean) / (std + eps) for r in rewards]


def ref_objective(
    trajs: list[tuple[float, list[list[Tok]]]], beta: float
) -> tuple[float, list[list[list[float]]]]:
    """J and dLoss/dlogp_new per token, by loops: tokens -> actions -> trajectories."""
    kept = [(a, [act for act in acts if act]) for a, acts in trajs]
    kept_trajs = [(a, acts) for a, acts in kept if acts]
    total = 0.0
    grads: list[list[list[float]]] = []
    for adv, acts in trajs:
        g_traj: list[list[float]] = []
        live_acts = [act for act in acts if act]
        for act in acts:
            g_act = []
            for tok in act:
                rho = math.exp(tok.new - tok.old)
                lo, hi = 1 - EPS_LOW, 1 + EPS_HIGH
                clipped_rho = min(max(rho, lo), hi)
                unclipped, clipped = rho * adv, clipped_rho * adv
                term = min(unclipped, clipped)
                # the unclipped branch is the minimum (or both are equal): d/dlogp = rho A;
                # the clipped branch below it: constant in logp_new, no gradient.
                d_term = rho * adv if unclipped <= clipped else 0.0
                d = tok.ref - tok.new
                k3 = math.exp(d) - d - 1
                term -= beta * k3
                d_term += beta * (math.exp(d) - 1)
                w = 1.0 / (len(kept_trajs) * len(live_acts) * len(act))
                total += w * term
                g_act.append(-w * d_term)
            g_traj.append(g_act)
        grads.append(g_traj)
    return total, grads


def flatten(
    trajs: list[tuple[float, list[list[Tok]]]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row per action, right-padded with garbage on weight-0 positions."""
    counts = [[len(act) for act in acts] for _, acts in trajs]
    weights = triple_mean_weights(counts)
    rows = [
        (adv, act, w)
        for (adv, acts), ws in zip(trajs, weights, strict=True)
        for act, w in zip(acts, ws, strict=True)
    ]
    width = max(len(act) for _, act, _ in rows) + 2
    shape = (len(rows), width)
    new = torch.full(shape, 123.0, dtype=torch.float64)
    old = torch.full(shape, -77.0, dtype=torch.float64)
    ref = torch.full(shape, 55.0, dtype=torch.float64)
    wt = torch.zeros(shape, dtype=torch.float64)
    adv = torch.tensor([a for a, _, _ in rows], dtype=torch.float64)
    for n, (_, act, w) in enumerate(rows):
        for t, tok in enumerate(act):
            new[n, t + 1], old[n, t + 1], ref[n, t + 1] = tok.new, tok.old, tok.ref
            wt[n, t + 1] = w
    return new, old, ref, adv, wt


def random_batch(rng: random.Random) -> list[tuple[float, list[list[Tok]]]]:
    trajs = []
    for _ in range(rng.randint(2, 5)):  # groups
        rewards = [float(rng.random() < 0.5) for _ in range(rng.randint(2, 4))]
        if len(set(rewards)) == 1:  # a group that cannot teach: make it mixed
            rewards[0] = 1.0 - rewards[0]
        for a in ref_advantages(rewards, 1e-4):
            acts = []
            for _ in range(rng.randint(1, 4)):
                n = rng.choice([0, 1, 1, 3, 7])
                acts.append(
                    [
                        Tok(
                            new=-rng.uniform(0.05, 4.0),
                            old=-rng.uniform(0.05, 4.0),
                            ref=-rng.uniform(0.05, 4.0),
                        )
                        for _ in range(n)
                    ]
                )
            trajs.append((a, acts))
    return trajs


# --------------------------------------------------------------------------- advantages


def test_advantages_match_reference_population_std() -> None:
    rng = random.Random(1)
    for _ in range(50):
        rewards = [rng.choice([0.0, 1.0, 0.5]) for _ in range(rng.randint(1, 9))]
        got = group_advantages(torch.tensor(rewards, dtype=torch.float64), eps=1e-4)
        assert got.tolist() == pytest.approx(ref_advantages(rewards, 1e-4), abs=1e-12)


def test_advantages_by_hand() -> None:
    eps = 1e-4
    two = group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), eps=eps)
    assert two.tolist() == pytest.approx([0.5 / (0.5 + eps), -0.5 / (0.5 + eps)], abs=1e-15)
    four = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64), eps=eps)
    std = math.sqrt(0.25 * 0.75)  # population
    assert four[0].item() == pytest.approx(0.75 / (std + eps), abs=1e-12)
    assert four[1].item() == pytest.approx(-0.25 / (std + eps), abs=1e-12)
    assert float(four.sum()) == pytest.approx(0.0, abs=1e-12)


def test_zero_variance_and_group_of_one_are_exact_zeros() -> None:
    for rewards in ([1.0, 1.0, 1.0], [0.0, 0.0], [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1], [1.0]):
        adv = group_advantages(torch.tensor(rewards), eps=1e-4)
        assert adv.tolist() == [0.0] * len(rewards)


def test_advantages_reject_bad_shapes() -> None:
    with pytest.raises(ValueError, match="non-empty 1-D"):
        group_advantages(torch.zeros(0), eps=1e-4)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        group_advantages(torch.zeros(2, 2), eps=1e-4)
    with pytest.raises(ValueError, match="floating"):
        group_advantages(torch.tensor([1, 0]), eps=1e-4)


# --------------------------------------------------------------------------- weights


def test_triple_mean_weights() -> None:
    counts = [[2, 0, 1], [4], [0, 0]]
    w = triple_mean_weights(counts)
    # two live trajectories; the first has two live actions, the second one.
    assert w == [[1 / (2 * 2 * 2), 0.0, 1 / (2 * 2 * 1)], [1 / (2 * 1 * 4)], [0.0, 0.0]]
    total = sum(
        wi * n for ws, ns in zip(w, counts, strict=True) for wi, n in zip(ws, ns, strict=True)
    )
    assert total == pytest.approx(1.0)
    assert triple_mean_weights([[0], []]) == [[0.0], []]


# --------------------------------------------------------------------------- objective


@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("seed", range(6))
def test_loss_and_gradient_match_float64_reference(seed: int, beta: float) -> None:
    trajs = random_batch(random.Random(seed))
    want, want_grads = ref_objective(trajs, beta)
    new, old, ref, adv, wt = flatten(trajs)
    new.requires_grad_(True)
    parts = mgrpo_loss(
        new, old, adv, wt, eps_low=EPS_LOW, eps_high=EPS_HIGH, beta=beta, logp_ref=ref
    )
    assert parts.loss.item() == pytest.approx(-want, rel=1e-12, abs=1e-12)
    parts.loss.backward()
    assert new.grad is not None
    grad_rows = [g for traj in want_grads for g in traj]
    for n, row in enumerate(grad_rows):
        got = new.grad[n, 1 : 1 + len(row)].tolist()
        assert got == pytest.approx(row, rel=1e-9, abs=1e-12)
        # padding and masked positions get no gradient
        assert new.grad[n, 0].item() == 0.0
        assert new.grad[n, 1 + len(row) :].abs().sum().item() == 0.0
    if beta == 0:
        assert parts.ref_kl.item() == 0.0
    else:
        assert parts.ref_kl.item() > 0


def test_micro_batches_of_rows_sum_to_the_batch() -> None:
    trajs = random_batch(random.Random(42))
    new, old, ref, adv, wt = flatten(trajs)
    full = mgrpo_loss(new, old, adv, wt, eps_low=EPS_LOW, eps_high=EPS_HIGH, beta=0.1, logp_ref=ref)
    cuts = [0, 1, 4, new.shape[0]]
    parts = [
        mgrpo_loss(
            new[a:b], old[a:b], adv[a:b], wt[a:b],
            eps_low=EPS_LOW, eps_high=EPS_HIGH, beta=0.1, logp_ref=ref[a:b],
        )
        for a, b in itertools.pairwise(cuts)
    ]  # fmt: skip
    for field in full._fields:
        total = sum(getattr(p, field).item() for p in parts)
        assert total == pytest.approx(getattr(full, field).item(), rel=1e-12, abs=1e-14)


def test_one_token_actions_by_hand() -> None:
    # Two trajectories (A = +1, -1), each with two one-token actions; old == new (rho = 1).
    lp = torch.tensor([[-1.0], [-2.0], [-0.5], [-3.0]], dtype=torch.float64, requires_grad=True)
    w = torch.tensor(triple_mean_weights([[1, 1], [1, 1]]), dtype=torch.float64).reshape(4, 1)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    parts = mgrpo_loss(lp, lp.detach(), adv, w, eps_low=0.2, eps_high=0.2)
    assert parts.loss.item() == pytest.approx(0.0, abs=1e-15)  # J = 1/2 (1) + 1/2 (-1)
    parts.loss.backward()
    assert lp.grad is not None
    # dLoss/dlogp = -w * rho * A = -(1/4) A
    assert lp.grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.25, 0.25])
    assert parts.ratio_mean.item() == pytest.approx(1.0)
    assert parts.approx_kl.item() == pytest.approx(0.0, abs=1e-15)
    assert parts.clip_fraction.item() == 0.0


def test_all_masked_row_contributes_nothing_even_with_garbage() -> None:
    new = torch.tensor([[-1.0, -2.0], [float("inf"), -1e30]], dtype=torch.float64)
    old = torch.tensor([[-1.5, -1.0], [-1e30, float("nan")]], dtype=torch.float64)
    w = torch.tensor([[0.5, 0.5], [0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([0.7, 3.0], dtype=torch.float64)
    new.requires_grad_(True)
    parts = mgrpo_loss(new, old, adv, w, eps_low=0.2, eps_high=0.2, beta=0.1, logp_ref=old)
    alone = mgrpo_loss(
        new[:1].detach(), old[:1], adv[:1], w[:1], eps_low=0.2, eps_high=0.2, beta=0.1,
        logp_ref=old[:1],
    )  # fmt: skip
    assert math.isfinite(parts.loss.item())
    assert parts.loss.item() == pytest.approx(alone.loss.item(), rel=1e-15)
    parts.loss.backward()
    assert new.grad is not None
    assert new.grad[1].tolist() == [0.0, 0.0]
    assert all(math.isfinite(x) for x in new.grad[0].tolist())


@pytest.mark.parametrize(
    ("adv", "delta", "clipped"),
    [
        (1.0, +1e-6, True),  # A > 0, rho just above 1 + eps_high: clipped, no gradient
        (1.0, -1e-6, False),  # just below: unclipped
        (-1.0, +1e-6, False),  # A < 0 is never clipped above
    ],
)
def test_upper_boundary(adv: float, delta: float, clipped: bool) -> None:
    rho = 1 + EPS_HIGH + delta
    check_boundary(rho, adv, clipped)


@pytest.mark.parametrize(
    ("adv", "delta", "clipped"),
    [
        (-1.0, -1e-6, True),  # A < 0, rho just below 1 - eps_low: clipped
        (-1.0, +1e-6, False),
        (1.0, -1e-6, False),  # A > 0 is never clipped below
    ],
)
def test_lower_boundary(adv: float, delta: float, clipped: bool) -> None:
    rho = 1 - EPS_LOW + delta
    check_boundary(rho, adv, clipped)


def check_boundary(rho: float, adv: float, clipped: bool) -> None:
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    new = (old + math.log(rho)).requires_grad_(True)
    w = torch.ones(1, 1, dtype=torch.float64)
    parts = mgrpo_loss(
        new, old, torch.tensor([adv], dtype=torch.float64), w, eps_low=EPS_LOW, eps_high=EPS_HIGH
    )
    parts.loss.backward()
    assert new.grad is not None
    bound = min(max(rho, 1 - EPS_LOW), 1 + EPS_HIGH)
    if clipped:
        assert parts.loss.item() == pytest.approx(-bound * adv, rel=1e-12)
        assert new.grad.item() == 0.0
        assert parts.clip_fraction.item() == 1.0
    else:
        assert parts.loss.item() == pytest.approx(-rho * adv, rel=1e-12)
        assert new.grad.item() == pytest.approx(-rho * adv, rel=1e-9)
        assert parts.clip_fraction.item() == 0.0
    assert parts.ratio_mean.item() == pytest.approx(rho, rel=1e-12)
    assert parts.approx_kl.item() == pytest.approx(rho - 1 - math.log(rho), rel=1e-9)


def test_extreme_log_ratio_stays_finite() -> None:
    old = torch.tensor([[-90.0, -1.0]], dtype=torch.float64)
    new = torch.tensor([[-0.01, -95.0]], dtype=torch.float64, requires_grad=True)
    w = torch.full((1, 2), 0.5, dtype=torch.float64)
    parts = mgrpo_loss(new, old, torch.tensor([-1.0]), w, eps_low=0.2, eps_high=0.2)
    assert math.isfinite(parts.loss.item())
    parts.loss.backward()
    assert new.grad is not None
    assert torch.isfinite(new.grad).all()


def test_kl_needs_reference_and_is_zero_at_reference() -> None:
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    w = torch.full((1, 2), 0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match="logp_ref"):
        mgrpo_loss(lp, lp.detach(), torch.ones(1), w, eps_low=0.2, eps_high=0.2, beta=0.1)
    with_kl = mgrpo_loss(
        lp, lp.detach(), torch.ones(1), w, eps_low=0.2, eps_high=0.2, beta=0.5, logp_ref=lp
    )
    assert with_kl.ref_kl.item() == 0.0
    assert with_kl.loss.item() == pytest.approx(-1.0)


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="one shape"):
        mgrpo_loss(
            torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, 4),
            eps_low=0.2, eps_high=0.2,
        )  # fmt: skip


def test_token_logprobs_match_log_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 11, (3, 5), generator=gen)
    want = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), want, atol=1e-12)
    with pytest.raises(ValueError, match="do not align"):
        token_logprobs(logits, targets[:, :4])
