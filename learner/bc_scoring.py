"""BC's samples and its teacher-forced scoring (`learner.bc` trains with them).

`bc_samples` turns demonstration turns into the learner's `TurnSample`s: for training,
every completion token (the per-action token mean, then the mean over actions); for
scoring, weight 1 on the action tokens. `teacher_forced_scores` is the accuracy BC reports:
with the demonstration's own prompt and thought as context, is the argmax token the
demonstrated one at every action position (and at every completion position), per turn and
per episode, with the mean NLL of a reply token; on a seeded sample of whole episodes
(`whole_episodes`).
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from learner.batch import MicroBatch, TurnSample, collate, micro_batches
from learner.demos import BCExample
from learner.loss import token_logprobs, triple_mean_weights

__all__ = [
    "Scores",
    "bc_samples",
    "completion_logits",
    "prompt_logprob_sum",
    "teacher_forced_scores",
    "whole_episodes",
]


def bc_samples(examples: Sequence[BCExample], *, scoring: bool) -> list[TurnSample]:
    """Training samples (every completion token; per-action token mean, then per-action
    mean) or scoring samples (weight 1 on action tokens)."""
    if scoring:
        masks = [e.action_mask for e in examples]
        weights = [1.0] * len(examples)
    else:
        masks = [(True,) * len(e.completion_ids) for e in examples]
        weights = [w[0] for w in triple_mean_weights([[len(m)] for m in masks])]
    return [
        TurnSample(
            group_id="bc",
            episode_id=e.episode_id,
            turn=e.turn,
            prompt_ids=e.prompt_ids,
            completion_ids=e.completion_ids,
            mask=m,
            old_logprobs=(),
            advantage=1.0,
            weight=w,
        )
        for e, m, w in zip(examples, masks, weights, strict=True)
    ]


def completion_logits(model: Any, mb: MicroBatch) -> Any:
    """Logits predicting the completion columns of `mb` ([N, K, vocab])."""
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        position_ids=mb.position_ids,
        logits_to_keep=mb.completion_width + 1,
        use_cache=False,
    )
    return out.logits[:, :-1, :]


def prompt_logprob_sum(model: Any, mb: MicroBatch, completions: Sequence[int]) -> tuple[Any, Any]:
    """(log-probs of the completion columns [N, K], the sum of the log-probs of every
    prompt token after each row's first) from one forward over all positions."""
    import torch

    logits = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        position_ids=mb.position_ids,
        use_cache=False,
    ).logits
    k = mb.completion_width
    completion = token_logprobs(logits[:, -k - 1 : -1, :], mb.targets)
    width = mb.input_ids.shape[1]
    target_column = torch.arange(1, width, device=mb.input_ids.device)
    first_completion = width - torch.tensor(completions, device=mb.input_ids.device)
    in_prompt = target_column[None, :] < first_completion[:, None]
    real = (mb.attention_mask[:, 1:] * mb.attention_mask[:, :-1]).bool()
    logp = token_logprobs(logits[:, :-1, :], mb.input_ids[:, 1:])
    return completion, (logp * (in_prompt & real)).sum()


class Scores(NamedTuple):
    """Teacher-forced shares: action right (given the demonstrated thought) and whole turn
    right, per turn and per episode (every turn of it); the mean NLL of a reply token."""

    turns: float
    episodes: float
    whole_turns: float
    whole_episodes: float
    loss: float


def teacher_forced_scores(
    model: Any,
    examples: Sequence[BCExample],
    budget: int,
    pad_id: int,
    device: str,
    *,
    autocast: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Scores:
    """Teacher-forced exact match against the argmax: of the action tokens, and of every
    completion token; and the completion tokens' mean NLL (`Scores`)."""
    import torch

    if not examples:
        return Scores(math.nan, math.nan, math.nan, math.nan, math.nan)
    # (episode, hit) in micro-batch order: micro_batches sorts samples longest first
    action_hits: list[tuple[str, bool]] = []
    whole_hits: list[tuple[str, bool]] = []
    nll = 0.0
    reply_tokens = 0
    model.eval()
    with torch.no_grad(), autocast():
        for mb_samples in micro_batches(bc_samples(examples, scoring=True), budget):
            mb = collate(mb_samples, pad_id=pad_id).to(device)
            logits = completion_logits(model, mb)
            hit = logits.argmax(-1) == mb.targets
            logp = token_logprobs(logits, mb.targets)
            scored = mb.weights > 0
            width = mb.completion_width
            for row, sample in enumerate(mb_samples):
                episode = sample.episode_id
                action_hits.append((episode, bool((hit[row] | ~scored[row]).all())))
                reply = slice(width - len(sample.completion_ids), width)
                whole_hits.append((episode, bool(hit[row, reply].all())))
                nll -= float(logp[row, reply].sum())
                reply_tokens += len(sample.completion_ids)

    def by_episode(hits: list[tuple[str, bool]]) -> float:
        episodes: dict[str, bool] = {}
        for episode, ok in hits:
            episodes[episode] = episodes.get(episode, True) and ok
        return sum(episodes.values()) / len(episodes)

    n = len(action_hits)
    return Scores(
        sum(ok for _, ok in action_hits) / n,
        by_episode(action_hits),
        sum(ok for _, ok in whole_hits) / n,
        by_episode(whole_hits),
        nll / reply_tokens,
    )


def whole_episodes(
    examples: Sequence[BCExample], turns: int, rng: random.Random
) -> list[BCExample]:
    """A seeded sample of whole episodes holding about `turns` turns."""
    by_episode: dict[str, list[BCExample]] = {}
    for example in examples:
        by_episode.setdefault(example.episode_id, []).append(example)
    keys = sorted(by_episode)
    rng.shuffle(keys)
    picked: list[BCExample] = []
    for key in keys:
        if len(picked) >= turns:
            break
        picked.extend(by_episode[key])
    return picked
