"""Trajectory groups become per-turn training samples, micro-batches and padded tensors.

One sample per turn: the exact prompt ids the server saw (`Turn.prompt_token_ids`) followed
by the completion ids it returned (`Turn.completion_token_ids`); the loss covers completion
tokens only, optionally without the reasoning inside `<think>...</think>`.

Every trained token carries the weight `1 / (|B| |T_i| |o_ij|)` of the M-GRPO triple mean
(`learner.loss.triple_mean_weights`), fixed for the whole batch before any forward pass, so
any split into micro-batches sums to exactly the full-batch loss and gradient.

Micro-batches are cut by a token budget on the PADDED size (rows x longest row), the size
that costs memory and compute; samples are sorted by length first to keep padding low. A
sample longer than the budget goes alone. Rows are LEFT-padded with explicit position ids,
so every completion ends at the last column and the forward pass computes logits only for
the last `max completion + 1` positions (`logits_to_keep`), never for the whole prompt.
Packing several samples into one row would need a varlen attention kernel (flash-attention)
that the CPU build lacks, so rows are padded, not packed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from learner.errors import BatchError
from learner.loss import triple_mean_weights
from runtime.base.messages import TrajectoryGroup

if TYPE_CHECKING:
    import torch

    from learner.frozen import BottomOutput

__all__ = [
    "MicroBatch",
    "TurnSample",
    "build_samples",
    "collate",
    "micro_batches",
    "minibatch_shares",
    "policy_logprobs",
    "think_mask",
]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True, slots=True)
class TurnSample:
    """One turn as a training row.

    `mask[k]` says whether completion token k is trained; `weight` is the triple-mean
    weight of each of its trained tokens (0.0 when none is); `old_logprobs` are the
    server's (behaviour policy's) log-probs of the completion tokens, empty if unknown.
    """

    group_id: str
    episode_id: str
    turn: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    mask: tuple[bool, ...]
    old_logprobs: tuple[float, ...]
    advantage: float
    weight: float

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)


def think_mask(completion_ids: Sequence[int], decode: Decode) -> list[bool]:
    """False for completion tokens lying entirely inside a `<think>...</think>` span.

    The span is found on the decoded text and mapped back to tokens through the decoded
    lengths of growing prefixes (token k covers characters [len(decode(ids[:k])),
    len(decode(ids[:k+1])))). The tags themselves stay trained (the format is learnt);
    only the reasoning between them is left out. A token that straddles a tag stays
    trained. An unclosed `<think>` leaves everything after it out. Several spans are all
    masked. Exact for tokenizers whose tokens decode to whole characters (byte-level BPE
    on ASCII tags included).
    """
    text = decode(completion_ids)
    spans: list[tuple[int, int]] = []
    pos = 0
    while (start := text.find(THINK_OPEN, pos)) >= 0:
        inner = start + len(THINK_OPEN)
        end = text.find(THINK_CLOSE, inner)
        spans.append((inner, len(text) if end < 0 else end))
        if end < 0:
            break
        pos = end + len(THINK_CLOSE)
    mask = [True] * len(completion_ids)
    if not spans:
        return mask
    begin = 0
    for k in range(len(completion_ids)):
        finish = len(decode(completion_ids[: k + 1]))
        if finish > begin and any(lo <= begin and finish <= hi for lo, hi in spans):
            mask[k] = False
        begin = finish
    return mask


def build_samples(
    groups: Sequence[TrajectoryGroup],
    advantages: Sequence[Sequence[float]],
    *,
    mask_think: bool = False,
    decode: Decode | None = None,
) -> list[TurnSample]:
    """One sample per turn of every trajectory; weights make the batch's triple mean.

    advantages[g][i]: advantage of trajectory i of group g (`learner.loss.group_advantages`).
    Turns without completion tokens get weight 0 (and do not count in |T_i|). Raises
    BatchError naming the group, episode and turn when token ids are missing or the
    server's logprobs do not match the completion.
    """
    if len(advantages) != len(groups):
        raise BatchError(f"{len(groups)} groups but {len(advantages)} advantage lists")
    if mask_think and decode is None:
        raise BatchError("mask_think needs a decode function (the tokenizer's)")
    rows: list[list[tuple[str, str, int, list[int], list[int], list[bool], list[float], float]]]
    rows = []
    for group, advs in zip(groups, advantages, strict=True):
        if len(advs) != len(group.trajectories):
            raise BatchError(
                f"group {group.group_id}: {len(group.trajectories)} trajectories "
                f"but {len(advs)} advantages"
            )
        for traj, adv in zip(group.trajectories, advs, strict=True):
            if not math.isfinite(adv):
                raise BatchError(f"group {group.group_id}: advantage {adv} is not finite")
            traj_rows = []
            for turn in traj.turns:
                where = f"group {group.group_id}, episode {traj.episode_id}, turn {turn.index}"
                completion = list(turn.completion_token_ids)
                if not completion:
                    continue
                if not turn.prompt_token_ids:
                    raise BatchError(f"{where}: completion ids without prompt ids")
                logprobs = list(turn.completion_logprobs)
                if logprobs and len(logprobs) != len(completion):
                    raise BatchError(
                        f"{where}: {len(logprobs)} logprobs for {len(completion)} completion tokens"
                    )
                if mask_think:
                    assert decode is not None
                    mask = think_mask(completion, decode)
                else:
                    mask = [True] * len(completion)
                traj_rows.append(
                    (
                        group.group_id,
                        traj.episode_id,
                        turn.index,
                        list(turn.prompt_token_ids),
                        completion,
                        mask,
                        logprobs,
                        adv,
                    )
                )
            rows.append(traj_rows)
    weights = triple_mean_weights([[sum(r[5]) for r in traj] for traj in rows])
    samples = []
    for traj_rows, traj_weights in zip(rows, weights, strict=True):
        for row, weight in zip(traj_rows, traj_weights, strict=True):
            gid, eid, index, prompt, completion, mask, logprobs, adv = row
            samples.append(
                TurnSample(
                    group_id=gid,
                    episode_id=eid,
                    turn=index,
                    prompt_ids=tuple(prompt),
                    completion_ids=tuple(completion),
                    mask=tuple(mask),
                    old_logprobs=tuple(logprobs),
                    advantage=adv,
                    weight=weight,
                )
            )
    return samples


def micro_batches(samples: Sequence[TurnSample], token_budget: int) -> list[list[TurnSample]]:
    """Samples with trained tokens, sorted longest first, cut so rows x longest <= budget.

    A sample longer than the budget forms a micro-batch of its own. Samples with no
    trained token are dropped (they add nothing to the loss). Deterministic.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    live = sorted(
        (s for s in samples if s.weight > 0 and s.trained_tokens > 0),
        key=lambda s: (-s.length, s.group_id, s.episode_id, s.turn),
    )
    out: list[list[TurnSample]] = []
    current: list[TurnSample] = []
    for sample in live:
        # sorted longest first: the first row of `current` is its longest.
        if current and (len(current) + 1) * current[0].length > token_budget:
            out.append(current)
            current = []
        current.append(sample)
    if current:
        out.append(current)
    return out


def minibatch_shares(count: int, shares: int) -> list[list[int]]:
    """Micro-batch indices 0..count-1 dealt round-robin into max(1, `shares`) minibatches.

    `micro_batches` sorts longest first, so dealing in turn gives each share about the
    same tokens. A share may be empty (fewer micro-batches than shares on this rank): its
    optimizer step then sees no gradient from this rank.
    """
    n = max(1, shares)
    return [list(range(i, count, n)) for i in range(n)]


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """Left-padded tensors of some samples; the last `K` columns hold every completion.

    input_ids, attention_mask, position_ids: [N, L]. targets, weights, old_logprobs: [N, K]
    with K = longest completion; column k of these is predicted by logits column k of
    `model(..., logits_to_keep=K + 1)` (whose last column is dropped). weights are 0 on
    padding, prompt and masked tokens; old_logprobs are 0.0 where the server gave none.
    advantages: [N].
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    weights: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    has_old_logprobs: bool

    @property
    def completion_width(self) -> int:
        return int(self.targets.shape[1])

    def to(self, device: Any) -> MicroBatch:
        return MicroBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            targets=self.targets.to(device),
            weights=self.weights.to(device),
            old_logprobs=self.old_logprobs.to(device),
            advantages=self.advantages.to(device),
            has_old_logprobs=self.has_old_logprobs,
        )


def collate(
    samples: Sequence[TurnSample], *, pad_id: int, dtype: torch.dtype | None = None
) -> MicroBatch:
    """Left-pad samples into one MicroBatch (int64 ids; weights, logprobs and advantages
    in `dtype`, float32 by default)."""
    import torch

    dtype = dtype or torch.float32
    if not samples:
        raise ValueError("collate needs at least one sample")
    n = len(samples)
    width = max(s.length for s in samples)
    k = max(len(s.completion_ids) for s in samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    targets = torch.full((n, k), pad_id, dtype=torch.long)
    weights = torch.zeros((n, k), dtype=dtype)
    old = torch.zeros((n, k), dtype=dtype)
    for row, s in enumerate(samples):
        ids = s.prompt_ids + s.completion_ids
        c = len(s.completion_ids)
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids) :] = 1
        targets[row, k - c :] = torch.tensor(s.completion_ids, dtype=torch.long)
        weights[row, k - c :] = torch.tensor(s.mask, dtype=dtype) * s.weight
        if s.old_logprobs:
            old[row, k - c :] = torch.tensor(s.old_logprobs, dtype=dtype)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        targets=targets,
        weights=weights,
        old_logprobs=old,
        advantages=torch.tensor([s.advantage for s in samples], dtype=dtype),
        has_old_logprobs=all(bool(s.old_logprobs) for s in samples),
    )


def policy_logprobs(
    model: Any,
    batch: MicroBatch,
    *,
    temperature: float = 1.0,
    below: BottomOutput | None = None,
) -> torch.Tensor:
    """[N, K] log-probs of `batch.targets` under `model` (a causal LM, peft or not), with
    the logits divided by the sampling `temperature` (what the server sampled from).

    `below`: the output of the model's frozen bottom layers on this batch
    (`learner.frozen.bottom_output`); the forward then runs only the layers above them.
    """
    from learner.frozen import top_layers_only
    from learner.loss import token_logprobs

    k = batch.completion_width
    common = {
        "attention_mask": batch.attention_mask,
        "position_ids": batch.position_ids,
        "logits_to_keep": k + 1,
        "use_cache": False,
    }
    if below is None:
        out = model(input_ids=batch.input_ids, **common)
    else:
        with top_layers_only(model, below.layers):
            out = model(inputs_embeds=below.hidden, **common)
    logits = out.logits[:, :-1, :]
    if temperature != 1.0:
        logits = logits / temperature
    return token_logprobs(logits, batch.targets)
