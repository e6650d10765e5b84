"""Groups -> per-turn samples, masks, micro-batches; the micro-batch gradient equality."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from learner.batch import build_samples, collate, micro_batches, policy_logprobs, think_mask
from learner.errors import BatchError
from learner.loss import group_advantages, mgrpo_loss
from policy.tiny import train_tokenizer
from runtime.base.messages import TrajectoryGroup, Turn

MakeGroup = Callable[..., TrajectoryGroup]


def advantages_of(groups: list[TrajectoryGroup]) -> list[list[float]]:
    return [
        group_advantages(
            torch.tensor([t.reward for t in g.trajectories], dtype=torch.float64), eps=1e-4
        ).tolist()
        for g in groups
    ]


def some_groups(make_group: MakeGroup, n: int = 3) -> list[TrajectoryGroup]:
    return [
        make_group(seed, group_id=f"g{seed}", rewards=[1.0, 0.0, 0.0, 1.0][: 2 + seed % 3])
        for seed in range(n)
    ]


# --------------------------------------------------------------------------- samples


def test_samples_carry_exact_ids_and_triple_mean_weights(make_group: MakeGroup) -> None:
    groups = some_groups(make_group)
    samples = build_samples(groups, advantages_of(groups))
    turns = [(g, tr, t) for g in groups for tr in g.trajectories for t in tr.turns]
    assert len(samples) == len(turns)
    for s, (g, tr, t) in zip(samples, turns, strict=True):
        assert (s.group_id, s.episode_id, s.turn) == (g.group_id, tr.episode_id, t.index)
        assert list(s.prompt_ids) == t.prompt_token_ids
        assert list(s.completion_ids) == t.completion_token_ids
        assert list(s.old_logprobs) == t.completion_logprobs
        assert all(s.mask)
        n_traj = sum(len(g.trajectories) for g in groups)
        assert s.weight == pytest.approx(1 / (n_traj * len(tr.turns) * len(t.completion_token_ids)))
    assert sum(s.weight * s.trained_tokens for s in samples) == pytest.approx(1.0)


def test_empty_completions_do_not_count(make_group: MakeGroup) -> None:
    group = make_group(1, group_id="g", rewards=[1.0, 0.0], turns=(2, 2))
    first = group.trajectories[0]
    empty = Turn(index=9, url="u", observation="o", observation_digest="d", text="")
    patched = TrajectoryGroup(
        group_id="g",
        task_id=1,
        created_at=0.0,
        trajectories=[
            type(first)(**{**_fields(first), "turns": [*first.turns, empty]}),
            group.trajectories[1],
        ],
    )
    samples = build_samples([patched], advantages_of([patched]))
    assert len(samples) == 4  # the empty turn makes no sample
    # trajectory 0 still averages over its 2 real actions
    n0 = len(first.turns[0].completion_token_ids)
    assert samples[0].weight == pytest.approx(1 / (2 * 2 * n0))


def _fields(obj: Any) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in obj.__struct_fields__}


def test_bad_groups_are_errors_that_name_the_turn(make_group: MakeGroup) -> None:
    group = make_group(2, group_id="gx", rewards=[1.0, 0.0], turns=(1, 1))
    traj = group.trajectories[0]
    turn = traj.turns[0]
    bad_turn = type(turn)(**{**_fields(turn), "completion_logprobs": [-1.0] * 99})
    bad = TrajectoryGroup(
        group_id="gx",
        task_id=1,
        created_at=0.0,
        trajectories=[type(traj)(**{**_fields(traj), "turns": [bad_turn]}), group.trajectories[1]],
    )
    with pytest.raises(BatchError, match=r"group gx, episode gx-e0, turn 0: 99 logprobs"):
        build_samples([bad], advantages_of([bad]))
    no_prompt = type(turn)(**{**_fields(turn), "prompt_token_ids": []})
    bad2 = TrajectoryGroup(
        group_id="gx",
        task_id=1,
        created_at=0.0,
        trajectories=[type(traj)(**{**_fields(traj), "turns": [no_prompt]})],
    )
    with pytest.raises(BatchError, match="without prompt ids"):
        build_samples([bad2], [[0.0]])
    with pytest.raises(BatchError, match="2 trajectories but 1 advantages"):
        build_samples([group], [[0.0]])
    with pytest.raises(BatchError, match="decode"):
        build_samples([group], [[0.0, 0.0]], mask_think=True)


# --------------------------------------------------------------------------- think mask


TEXT = (
    '<think>I should open the cart first.</think><answer>do(action="Click", element="12")</answer>'
)


@pytest.fixture(scope="module")
def bpe() -> Any:
    texts = [TEXT] * 20 + ["some other words to learn: lamp, red shoes, order 1042, é ü"]
    tok = train_tokenizer(texts)
    return tok


def test_think_span_is_left_out_tags_kept(bpe: Any) -> None:
    ids = bpe.encode(TEXT).ids
    mask = think_mask(ids, bpe.decode)
    kept = bpe.decode([i for i, m in zip(ids, mask, strict=True) if m])
    dropped = bpe.decode([i for i, m in zip(ids, mask, strict=True) if not m])
    assert "should open the cart" in dropped
    assert "<answer>" in kept and "Click" in kept and "</answer>" in kept
    assert "cart" not in kept
    # every dropped token lies inside the reasoning
    assert dropped.strip() in "I should open the cart first."
    assert not all(mask) and any(mask)


def test_think_mask_without_span_unclosed_and_twice(bpe: Any) -> None:
    plain = bpe.encode('<answer>do(action="Click", element="12")</answer>').ids
    assert think_mask(plain, bpe.decode) == [True] * len(plain)
    unclosed = bpe.encode("<answer>x</answer><think>lamp red shoes").ids
    m = think_mask(unclosed, bpe.decode)
    kept = bpe.decode([i for i, k in zip(unclosed, m, strict=True) if k])
    assert "lamp" not in kept and "<think>" in kept
    twice = bpe.encode("<think>lamp</think>x<think>order 1042</think>y").ids
    m2 = think_mask(twice, bpe.decode)
    kept2 = bpe.decode([i for i, k in zip(twice, m2, strict=True) if k])
    assert "lamp" not in kept2 and "1042" not in kept2 and "x" in kept2 and "y" in kept2


# --------------------------------------------------------------------------- micro-batches


@pytest.mark.parametrize("budget", [1, 16, 40, 100, 10_000])
def test_micro_batches_respect_budget_and_keep_every_sample(
    make_group: MakeGroup, budget: int
) -> None:
    groups = some_groups(make_group, 4)
    samples = build_samples(groups, advantages_of(groups))
    batches = micro_batches(samples, budget)
    seen = [id(s) for mb in batches for s in mb]
    assert sorted(seen) == sorted(id(s) for s in samples)
    for mb in batches:
        longest = max(s.length for s in mb)
        assert len(mb) == 1 or len(mb) * longest <= budget
    if budget == 10_000:
        assert len(batches) == 1


def test_collate_aligns_completions_at_the_right(make_group: MakeGroup) -> None:
    groups = some_groups(make_group, 2)
    samples = build_samples(groups, advantages_of(groups))
    mb = collate(samples, pad_id=0)
    k = mb.completion_width
    for row, s in enumerate(samples):
        ids = list(s.prompt_ids + s.completion_ids)
        assert mb.input_ids[row, -len(ids) :].tolist() == ids
        assert mb.attention_mask[row].sum().item() == len(ids)
        assert mb.position_ids[row, -len(ids) :].tolist() == list(range(len(ids)))
        c = len(s.completion_ids)
        assert mb.targets[row, k - c :].tolist() == list(s.completion_ids)
        assert mb.weights[row, : k - c].abs().sum().item() == 0.0
        assert mb.weights[row, k - c :].tolist() == pytest.approx([s.weight] * c)
        assert mb.old_logprobs[row, k - c :].tolist() == pytest.approx(list(s.old_logprobs))


# --------------------------------------------------------------------------- real model


def test_padded_logprobs_equal_unpadded_forward(
    make_group: MakeGroup, tiny_qwen: Callable[..., Any]
) -> None:
    model = tiny_qwen().double()
    groups = some_groups(make_group, 2)
    samples = build_samples(groups, advantages_of(groups))
    with torch.no_grad():
        batched = policy_logprobs(model, collate(samples, pad_id=0, dtype=torch.float64))
        k = batched.shape[1]
        for row, s in enumerate(samples):
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            logits = model(input_ids=ids).logits[0].double()
            lp = torch.log_softmax(logits, -1)
            p = len(s.prompt_ids)
            want = [lp[p - 1 + j, tok].item() for j, tok in enumerate(s.completion_ids)]
            got = batched[row, k - len(s.completion_ids) :].tolist()
            assert got == pytest.approx(want, abs=1e-10)


def _grads(model: Any, samples: list[Any], budget: int) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    total = 0.0
    for mb_samples in micro_batches(samples, budget):
        mb = collate(mb_samples, pad_id=0, dtype=torch.float64)
        new = policy_logprobs(model, mb)
        parts = mgrpo_loss(
            new,
            mb.old_logprobs,
            mb.advantages,
            mb.weights,
            eps_low=0.2,
            eps_high=0.2,
            beta=0.04,
            logp_ref=mb.old_logprobs,
        )
        parts.loss.backward()
        total += parts.loss.item()
    return total, [p.grad.detach().clone() for p in model.parameters()]


def test_full_batch_gradient_equals_sum_of_micro_batch_gradients(
    make_group: MakeGroup, tiny_qwen: Callable[..., Any]
) -> None:
    model = tiny_qwen(seed=3).double()
    groups = [
        make_group(seed, group_id=f"g{seed}", rewards=r, turns=(1, 3), completion_len=(1, 8))
        for seed, r in enumerate([[1.0, 0.0, 0.0], [0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    ]
    samples = build_samples(groups, advantages_of(groups))
    # old logprobs from a neighbouring policy so ratios differ from 1 and some clip
    full_loss, full = _grads(model, samples, budget=100_000)
    assert any(g.abs().sum() > 0 for g in full)
    for budget in (1, 24, 50, 90):
        assert len(micro_batches(samples, budget)) > 1
        loss, split = _grads(model, samples, budget)
        assert loss == pytest.approx(full_loss, rel=1e-10, abs=1e-12)
        for a, b in zip(full, split, strict=True):
            assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)
