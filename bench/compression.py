"""Dynamic context compression: prompt tokens per turn, per episode and per learner update.

    .venv/bin/python -m bench.compression [--model DIR] [--tokenizer DIR] [--tasks N]
                                          [--group-size 4] [--batch-groups 4] [--out bench/out]

Runs the oracle on the built-in test split (each task once, observations budgeted in the
model's own tokens as the daemon does), then renders every turn's prompt with the model's
chat template two ways:

- compressed: `policy.prompt.build_messages` (earlier observations -> `** Simplified html **`,
  earlier actions kept), exactly what the runtime sends;
- full history: every earlier observation kept in full, with the same actions.

Reported: prompt tokens per turn (median, p95, max), per episode (median, mean), and the
learner's tokens per update either way: `--batch-groups` groups of `--group-size`
trajectories (the oracle is deterministic, so a group repeats one trajectory) through
`learner.batch.build_samples` and `micro_batches` (budget `learner.micro_batch_tokens`),
counting the tokens of the samples and the padded tokens forwarded (rows x longest row
of each micro-batch). The tokenizer is the tiny model's (`webagent model init`, made once
under `--out/cache`), or `--model DIR`; `--tokenizer DIR` (any Hugging Face tokenizer
folder with a chat template) adds a second set of columns.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from bench.common import (
    LoadSampler,
    finish,
    load_note,
    median,
    percentile,
    tiny_model,
    with_style,
)
from learner.batch import build_samples, micro_batches
from policy.prompt import PromptRenderer, build_messages, strip_thought, user_message
from runtime.base.config import Config, load_config
from runtime.base.messages import ChatMessage, Trajectory, TrajectoryGroup, Turn
from runtime.logs import configure_logging
from runtime.oracle import OraclePolicy
from runtime.task_runs import run_tasks
from runtime.webarena_environment import open_environment


def full_messages(
    intent: str, turns: Sequence[Turn], index: int, *, keep_thoughts: bool
) -> list[ChatMessage]:
    """Turn `index`'s messages without compression: every earlier observation in full."""
    compressed = build_messages(
        intent,
        [t.text for t in turns[:index]],
        turns[index].observation,
        keep_thoughts=keep_thoughts,
    )
    messages = [compressed[0]]
    for k, turn in enumerate(turns[:index]):
        messages.append(user_message(intent, k, turn.observation))
        kept = turn.text if keep_thoughts else strip_thought(turn.text)
        messages.append(ChatMessage(role="assistant", content=kept))
    messages.append(compressed[-1])
    return messages


async def oracle_episodes(config: Config, renderer: PromptRenderer, tasks: int) -> list[Trajectory]:
    policy = OraclePolicy(style=config.observation.style)
    async with open_environment(config) as env:
        chosen = env.tasks("test")[:tasks] if tasks else env.tasks("test")
        result = await run_tasks(
            config,
            env,
            policy,
            chosen,
            split="test",
            group_size=1,
            concurrency=16,
            count_tokens=renderer.count_tokens,
        )
    return [t for g in result.groups for t in g.trajectories if t.turns]


def _with_ids(
    trajectory: Trajectory, renderer: PromptRenderer, *, compressed: bool, keep: bool
) -> Trajectory:
    """The trajectory with each turn's prompt and completion ids, rendered one way."""
    turns = []
    for index, turn in enumerate(trajectory.turns):
        if compressed:
            history = [t.text for t in trajectory.turns[:index]]
            messages = build_messages(
                trajectory.intent, history, turn.observation, keep_thoughts=keep
            )
        else:
            messages = full_messages(trajectory.intent, trajectory.turns, index, keep_thoughts=keep)
        turns.append(
            msgspec.structs.replace(
                turn,
                prompt_token_ids=renderer.render(messages),
                completion_token_ids=renderer.encode(turn.text),
            )
        )
    return msgspec.structs.replace(trajectory, turns=turns)


def measure(
    trajectories: list[Trajectory],
    renderer: PromptRenderer,
    *,
    keep_thoughts: bool,
    group_size: int,
    batch_groups: int,
    micro_batch_tokens: int,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for way in ("compressed", "full"):
        rendered = [
            _with_ids(t, renderer, compressed=way == "compressed", keep=keep_thoughts)
            for t in trajectories
        ]
        per_turn = [len(tn.prompt_token_ids) for t in rendered for tn in t.turns]
        per_episode = [sum(len(tn.prompt_token_ids) for tn in t.turns) for t in rendered]
        groups = [
            TrajectoryGroup(
                group_id=f"g{i}",
                task_id=t.task_id,
                trajectories=[
                    msgspec.structs.replace(t, episode_id=f"g{i}-{k}") for k in range(group_size)
                ],
                created_at=0.0,
            )
            for i, t in enumerate(rendered)
        ]
        updates = []
        for start in range(0, len(groups) - batch_groups + 1, batch_groups):
            batch = groups[start : start + batch_groups]
            advantages = [[1.0] * len(g.trajectories) for g in batch]
            samples = build_samples(batch, advantages)
            batches = micro_batches(samples, micro_batch_tokens)
            updates.append(
                {
                    "sample_tokens": sum(s.length for s in samples),
                    "trained_tokens": sum(s.trained_tokens for s in samples),
                    "padded_tokens": sum(len(mb) * mb[0].length for mb in batches),
                    "micro_batches": len(batches),
                }
            )
        out[way] = {
            "turn_median": median(per_turn),
            "turn_p95": percentile(per_turn, 0.95),
            "turn_max": max(per_turn, default=0),
            "episode_median": median(per_episode),
            "episode_mean": sum(per_episode) / max(1, len(per_episode)),
            "turns": len(per_turn),
            "episodes": len(per_episode),
            "update_sample_tokens": median(u["sample_tokens"] for u in updates),
            "update_padded_tokens": median(u["padded_tokens"] for u in updates),
            "update_micro_batches": median(u["micro_batches"] for u in updates),
            "updates": updates,
        }
    return out


def _rows(name: str, m: dict[str, Any]) -> list[list[object]]:
    rows: list[list[object]] = []
    c, f = m["compressed"], m["full"]
    for label, key in (
        ("prompt tokens / turn (median)", "turn_median"),
        ("prompt tokens / turn (p95)", "turn_p95"),
        ("prompt tokens / turn (max)", "turn_max"),
        ("prompt tokens / episode (median)", "episode_median"),
        ("prompt tokens / episode (mean)", "episode_mean"),
        ("learner tokens / update (samples)", "update_sample_tokens"),
        ("learner tokens / update (padded, forwarded)", "update_padded_tokens"),
        ("learner micro-batches / update", "update_micro_batches"),
    ):
        ratio = float(f[key]) / float(c[key]) if c[key] else math.nan
        rows.append([name, label, float(c[key]), float(f[key]), ratio])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="TOML file over the defaults")
    parser.add_argument(
        "--style", default="html", choices=("html", "compact"), help="observation style"
    )
    parser.add_argument("--model", help="model folder for the tokenizer (default: tiny model)")
    parser.add_argument("--tokenizer", help="another tokenizer folder (Hugging Face format)")
    parser.add_argument("--tasks", type=int, default=0, help="first N test tasks (0: all)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--batch-groups", type=int, default=0, help="0: learner.batch_groups")
    parser.add_argument("--out", default="bench/out", help="folder for the JSON")
    args = parser.parse_args()
    configure_logging(level="warning")
    config = with_style(load_config(args.config), args.style)
    model = Path(args.model) if args.model else tiny_model(args.out)
    renderer = PromptRenderer.from_model(model)
    batch_groups = args.batch_groups or config.learner.batch_groups
    keep = config.scheduler.keep_thoughts
    with LoadSampler(interval_s=2.0) as load:
        trajectories = anyio.run(oracle_episodes, config, renderer, args.tasks)
        kwargs: dict[str, Any] = {
            "keep_thoughts": keep,
            "group_size": args.group_size,
            "batch_groups": batch_groups,
            "micro_batch_tokens": config.learner.micro_batch_tokens,
        }
        tokenizers = {f"tiny ({model.name})" if not args.model else str(model): renderer}
        if args.tokenizer:
            tokenizers[str(args.tokenizer)] = PromptRenderer.from_model(args.tokenizer)
        measured = {name: measure(trajectories, r, **kwargs) for name, r in tokenizers.items()}
    won = sum(1 for t in trajectories if t.reward > 0)
    rows = [row for name, m in measured.items() for row in _rows(name, m)]
    table: dict[str, Any] = {
        "title": (
            f"prompt tokens with and without dynamic context compression: {len(trajectories)} "
            f"oracle episodes of the test split ({won} successful)"
        ),
        "headers": ["tokenizer", "measure", "compressed", "full history", "full/compressed"],
        "rows": rows,
    }
    notes = [
        f"an update: {batch_groups} groups x {args.group_size} trajectories, micro-batch "
        f"budget {config.learner.micro_batch_tokens} padded tokens; keep_thoughts={keep}; "
        f"observation budget {config.observation.max_tokens} tokens, style "
        f"{config.observation.style}",
        load_note(load),
    ]
    result = {
        "episodes": len(trajectories),
        "successes": won,
        "turns": sum(len(t.turns) for t in trajectories),
        "measured": measured,
    }
    finish(args.out, "compression", result, table=table, notes=notes, load=load)


if __name__ == "__main__":
    main()
