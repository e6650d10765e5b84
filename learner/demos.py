"""Demonstrations as BC examples: every successful turn rendered exactly as a rollout
renders it (see `learner.bc`), synthetic copy turns rendered the same way, and the split by
task into train and held-out."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from learner.batch import THINK_CLOSE, think_mask
from learner.errors import DemonstrationError
from policy.prompt import SYSTEM_PROMPT, PromptRenderer, episode_messages
from runtime.base.messages import ChatMessage, TrajectoryGroup, decode_group

__all__ = ["BCExample", "demo_examples", "read_demos", "reply_ids", "split_heldout"]


@dataclass(frozen=True, slots=True)
class BCExample:
    """One demonstrated turn as token ids; `action_mask` marks the scored tokens."""

    task_id: int
    episode_id: str
    turn: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    action_mask: tuple[bool, ...]


def read_demos(path: str | Path) -> list[TrajectoryGroup]:
    """Groups of a trajectory-store file; a torn last line is skipped, any other bad line
    is a DemonstrationError naming file and line."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise DemonstrationError(f"{file}: cannot read ({exc.strerror})") from exc
    lines = data.split(b"\n")
    groups = []
    for number, line in enumerate(lines[:-1], start=1):  # after the last \n: torn or empty
        if not line.strip():
            continue
        try:
            groups.append(decode_group(line))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DemonstrationError(f"{file}:{number}: not a trajectory group ({exc})") from exc
    if not groups:
        raise DemonstrationError(f"{file}: no demonstrations")
    return groups


def _check_template(renderer: PromptRenderer, messages: list[ChatMessage], text: str) -> None:
    """The template must close an assistant turn with the end token right after its text."""
    eos = renderer.special_tokens.get("eos_token", "")
    prompt = renderer.render_text(messages, add_generation_prompt=True)
    full = renderer.render_text(
        [*messages, ChatMessage(role="assistant", content=text)], add_generation_prompt=False
    )
    if not full.startswith(prompt + text + eos):
        raise DemonstrationError(
            "the chat template does not render an assistant turn as generation prompt + "
            f"text + {eos!r}; cannot tell which end token the model generates"
        )


def demo_examples(
    groups: Sequence[TrajectoryGroup],
    renderer: PromptRenderer,
    *,
    keep_thoughts: bool = True,
    system_prompt: str = SYSTEM_PROMPT,
) -> list[BCExample]:
    """Every turn of every successful trajectory, rendered as rollouts render it."""
    eos_id = renderer.eos_token_id
    if eos_id is None:
        raise DemonstrationError("the tokenizer has no eos_token: no end token to learn")
    examples: list[BCExample] = []
    checked = False
    for group in groups:
        for traj in group.trajectories:
            if traj.reward <= 0:
                continue
            sent = episode_messages(
                traj.intent, traj.turns, keep_thoughts=keep_thoughts, system_prompt=system_prompt
            )
            for turn, messages in zip(traj.turns, sent, strict=True):
                if not checked:
                    _check_template(renderer, messages, turn.text)
                    checked = True
                example = _example(
                    renderer, messages, turn.text,
                    task_id=traj.task_id, episode_id=traj.episode_id, turn=turn.index,
                )  # fmt: skip
                examples.append(example)
    if not examples:
        raise DemonstrationError("no successful demonstration turns (reward > 0)")
    return examples


def _example(
    renderer: PromptRenderer,
    messages: list[ChatMessage],
    text: str,
    *,
    task_id: int,
    episode_id: str,
    turn: int,
) -> BCExample:
    """One turn: the rendered prompt, the reply and the end token, the reply's action mask."""
    assert renderer.eos_token_id is not None  # checked by the callers
    completion = [*reply_ids(renderer, text), renderer.eos_token_id]
    return BCExample(
        task_id=task_id,
        episode_id=episode_id,
        turn=turn,
        prompt_ids=tuple(renderer.render(messages)),
        completion_ids=tuple(completion),
        action_mask=tuple(
            think_mask(completion, lambda ids: renderer.decode(ids, skip_special_tokens=False))
        ),
    )


def reply_ids(renderer: PromptRenderer, text: str) -> list[int]:
    """The reply's tokens as a model samples them: the thought through `</think>`, then the
    answer, each encoded on its own.

    Encoded whole, `</think><answer>` fuses the two tags into one token (SmolLM2's BPE has
    `><`), so BC never shows the model a `>` after `</think`. A model that samples that
    `>` anyway (the `<think>` opening teaches it) was then off its training data, and the
    `>` it knew best ends `</answer>`, right before the end token: in three Ice Lake first
    runs 21 of 1,155 sampled turns (5 of 278 at 1cec4d9) ended `</think>` and the end
    token, a parse failure with no answer. Encoded apart, the thought's `>` is followed
    by `<answer>`."""
    head, tag, answer = text.partition(THINK_CLOSE)
    if not tag or not answer:
        return renderer.encode(text)
    return [*renderer.encode(head + tag), *renderer.encode(answer)]


def split_heldout(
    examples: Sequence[BCExample], fraction: float, seed: int
) -> tuple[list[BCExample], list[BCExample]]:
    """(train, held-out), split by task id so held-out tasks are never trained on."""
    tasks = sorted({e.task_id for e in examples})
    random.Random(seed).shuffle(tasks)
    n_held = min(len(tasks) - 1, max(1, round(fraction * len(tasks)))) if fraction > 0 else 0
    held = set(tasks[:n_held])
    return [e for e in examples if e.task_id not in held], [
        e for e in examples if e.task_id in held
    ]
