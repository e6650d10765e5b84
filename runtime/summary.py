"""Figures of finished groups: success by site, statuses, throughput, prompt tokens.

`prompt_tokens(trajectory)` rebuilds each turn's prompt with `policy.prompt` twice: as
sent (earlier observations compressed to `** Simplified html **`) and as it would have
been without compression (every earlier observation in full). Tokens are counted over
the messages' contents with the `count_tokens` given (default: `estimate_tokens`, one
token per 3 UTF-8 bytes); chat-template tokens are left out of both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from policy.prompt import SYSTEM_PROMPT, episode_messages, strip_thought, user_message
from runtime.base.messages import ChatMessage, TaskConfig, Trajectory, TrajectoryGroup
from runtime.observation import TokenCounter, estimate_tokens

__all__ = ["RolloutSummary", "format_summary", "prompt_tokens", "summarize"]


def _count(messages: Sequence[ChatMessage], count_tokens: TokenCounter) -> int:
    return sum(count_tokens(m.content) for m in messages)


def prompt_tokens(
    trajectory: Trajectory,
    *,
    keep_thoughts: bool = True,
    count_tokens: TokenCounter = estimate_tokens,
    system_prompt: str = SYSTEM_PROMPT,
) -> tuple[int, int]:
    """(tokens of the prompts as sent, tokens without compression), summed over turns."""
    compressed = full = 0
    uncompressed: list[ChatMessage] = []
    all_sent = episode_messages(
        trajectory.intent,
        trajectory.turns,
        keep_thoughts=keep_thoughts,
        system_prompt=system_prompt,
    )
    for turn, sent in zip(trajectory.turns, all_sent, strict=True):
        compressed += _count(sent, count_tokens)
        whole = [
            sent[0],
            *uncompressed,
            user_message(trajectory.intent, turn.index, turn.observation),
        ]
        full += _count(whole, count_tokens)
        uncompressed += [
            user_message(trajectory.intent, turn.index, turn.observation),
            ChatMessage(
                role="assistant", content=turn.text if keep_thoughts else strip_thought(turn.text)
            ),
        ]
    return compressed, full


@dataclass(slots=True)
class RolloutSummary:
    """What a rollout run did."""

    groups: int = 0
    episodes: int = 0
    turns: int = 0
    successes: int = 0
    # Episodes whose evaluation left a check unjudged: no score, left out of every rate.
    unjudged: int = 0
    seconds: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    # site -> (successes, judged episodes)
    by_site: dict[str, list[int]] = field(default_factory=dict)
    prompt_tokens: int = 0
    prompt_tokens_uncompressed: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def success_rate(self) -> float:
        judged = self.episodes - self.unjudged
        return self.successes / judged if judged else 0.0

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.seconds if self.seconds else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0

    @property
    def compression_ratio(self) -> float:
        """Prompt tokens sent / prompt tokens without compression (lower is better)."""
        if not self.prompt_tokens_uncompressed:
            return 1.0
        return self.prompt_tokens / self.prompt_tokens_uncompressed


def summarize(
    groups: Iterable[TrajectoryGroup],
    *,
    tasks: Mapping[int, TaskConfig] | None = None,
    seconds: float = 0.0,
    keep_thoughts: bool = True,
    count_tokens: TokenCounter = estimate_tokens,
    system_prompt: str = SYSTEM_PROMPT,
) -> RolloutSummary:
    """Figures over `groups`; `tasks` (by id) gives each episode's site."""
    summary = RolloutSummary(seconds=seconds)
    for group in groups:
        summary.groups += 1
        task = tasks.get(group.task_id) if tasks else None
        site = ",".join(task.sites) if task is not None and task.sites else "?"
        for trajectory in group.trajectories:
            summary.episodes += 1
            summary.turns += len(trajectory.turns)
            summary.statuses[trajectory.status] += 1
            won = trajectory.reward > 0
            counts = summary.by_site.setdefault(site, [0, 0])
            if trajectory.evaluation is not None and trajectory.evaluation.unjudged:
                summary.unjudged += 1
            else:
                summary.successes += won
                counts[0] += won
                counts[1] += 1
            sent, full = prompt_tokens(
                trajectory,
                keep_thoughts=keep_thoughts,
                count_tokens=count_tokens,
                system_prompt=system_prompt,
            )
            summary.prompt_tokens += sent
            summary.prompt_tokens_uncompressed += full
            if not won and len(summary.failures) < 20:
                summary.failures.append(_failure(trajectory))
    return summary


def _failure(trajectory: Trajectory) -> str:
    detail = ""
    if trajectory.evaluation is not None:
        failed = [c for c in trajectory.evaluation.checks if c.passed is not True]
        detail = "; ".join(f"{c.kind}: {c.detail}" for c in failed)[:300]
    last = trajectory.turns[-1] if trajectory.turns else None
    error = (last.parse_error or last.action_error or "") if last else ""
    return (
        f"task {trajectory.task_id} episode {trajectory.episode_id}: {trajectory.status}, "
        f"answer={trajectory.answer!r} {detail} {error}".strip()
    )


def format_summary(
    summary: RolloutSummary,
    *,
    title: str = "rollout",
    tokens_note: str = "message contents counted at 3 UTF-8 bytes per token",
) -> str:
    """A plain-text table of the summary."""
    lines = [
        f"{title}: {summary.groups} groups, {summary.episodes} episodes, {summary.turns} steps"
    ]
    lines.append(f"{'site':<16}{'success':>10}{'episodes':>10}{'rate':>8}")
    for site, (won, total) in sorted(summary.by_site.items()):
        rate = f"{won / total:>8.1%}" if total else f"{'-':>8}"
        lines.append(f"{site:<16}{won:>10}{total:>10}{rate}")
    judged = summary.episodes - summary.unjudged
    lines.append(f"{'all':<16}{summary.successes:>10}{judged:>10}{summary.success_rate:>8.1%}")
    if summary.unjudged:
        lines.append(
            f"unjudged: {summary.unjudged} episodes had a check no judge could score (not "
            "counted above)"
        )
    lines.append("statuses: " + ", ".join(f"{k}={v}" for k, v in sorted(summary.statuses.items())))
    lines.append(
        f"throughput: {summary.episodes_per_s:.2f} episodes/s, {summary.steps_per_s:.2f} steps/s "
        f"over {summary.seconds:.1f} s"
    )
    lines.append(
        f"prompt tokens: {summary.prompt_tokens} with compression, "
        f"{summary.prompt_tokens_uncompressed} without "
        f"(ratio {summary.compression_ratio:.3f}; {tokens_note})"
    )
    return "\n".join(lines)
