"""WebRL's outcome reward model on the built-in sites: the judge against the evaluators.

    .venv/bin/python -m bench.orm --base .webagent/models/base [--train-tasks 300]
        [--eval-tasks 60] [--minutes 10] [--p-exit 0.15] [--p-wrong 0.5] [--out bench/out]

Labelled rollouts come from a faulty oracle on real Chromium and the built-in sites
(observations as the base model's profile renders them): at each turn, with probability
`--p-exit`, it gives up with a made-up answer (an early, wrong exit); at its own final
exit, with probability `--p-wrong`, its answer is replaced by a made-up one (the right
page, a wrong answer; for tasks judged by the page, not the answer, that is still a
success). The evaluators label every episode. The judge (`learner.orm_training.train_orm`:
the base model's own LoRA, `[bc]` settings, `--minutes` of training) learns from the train
split's rollouts and is scored on rollouts of test and ood tasks, never trained on. The
"always the commoner label" column is the floor a judge must beat.
"""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path
from typing import Any

import anyio
import msgspec

from bench.common import LoadSampler, finish, load_note
from runtime.base.config import Config, load_config
from runtime.base.messages import PolicyReply, PolicyRequest, TrajectoryGroup
from runtime.logs import configure_logging
from runtime.oracle import OraclePolicy
from runtime.task_runs import run_tasks
from runtime.webarena_environment import open_environment

MADE_UP = "I could not find it."
_EXIT = re.compile(r'exit\(message="(.*)"\)')


class FaultyOracle:
    """The oracle, but it gives up early or misreports its answer now and then."""

    def __init__(self, style: str, *, p_exit: float, p_wrong: float, seed: int) -> None:
        self.oracle = OraclePolicy(style=style)
        self.p_exit = p_exit
        self.p_wrong = p_wrong
        self.rng = random.Random(seed)

    async def act(self, request: PolicyRequest) -> PolicyReply:
        if self.rng.random() < self.p_exit:
            text = f'<think>I give up.</think><answer>exit(message="{MADE_UP}")</answer>'
            return PolicyReply(text=text, finish_reason="stop")
        reply = await self.oracle.act(request)
        if _EXIT.search(reply.text) and self.rng.random() < self.p_wrong:
            text = _EXIT.sub(f'exit(message="{MADE_UP}")', reply.text)
            return msgspec.structs.replace(reply, text=text)
        return reply


async def rollouts(config: Config, split: str, tasks: int, policy: Any) -> list[TrajectoryGroup]:
    async with open_environment(config) as env:
        chosen = env.tasks(split)[:tasks]
        result = await run_tasks(
            config, env, policy, chosen, split=split, group_size=1, concurrency=16
        )
    return list(result.groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base model folder")
    parser.add_argument("--config", help="TOML over the defaults ([bc], [learner])")
    parser.add_argument("--train-tasks", type=int, default=300)
    parser.add_argument("--eval-tasks", type=int, default=60, help="of test, and of ood")
    parser.add_argument("--minutes", type=float, default=10.0, help="the judge's training")
    parser.add_argument("--p-exit", type=float, default=0.15)
    parser.add_argument("--p-wrong", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args()
    configure_logging(format="console", level="warning")

    from policy.profile import settle_auto

    config = settle_auto(load_config(args.config), args.base)
    bc = msgspec.structs.replace(
        config.bc, max_minutes=args.minutes, max_steps=0, prompt_loss=0.0, snapshot_minutes=()
    )
    with LoadSampler() as load:
        run(args, config, bc, load)


def run(args: argparse.Namespace, config: Config, bc: Any, load: LoadSampler) -> None:
    from learner.orm_training import load_judge, orm_examples, score_orm, train_orm

    data: dict[str, list[TrajectoryGroup]] = {}
    splits = (("train", args.train_tasks), ("test", args.eval_tasks), ("ood", args.eval_tasks))
    for split, n in splits:
        policy = FaultyOracle(
            config.observation.style, p_exit=args.p_exit, p_wrong=args.p_wrong,
            seed=args.seed + len(data),
        )  # fmt: skip
        data[split] = anyio.run(rollouts, config, split, n, policy, backend="asyncio")
    out = Path(args.out) / "cache" / f"orm-{args.seed}"
    report = train_orm(data["train"], base_model=args.base, out=out, config=bc, lora=config.learner)
    model, renderer, (yes, no) = load_judge(out)
    rows: list[list[object]] = []
    scores: dict[str, Any] = {"held-out train tasks": report.heldout}
    for split in ("test", "ood"):
        scores[f"{split} tasks"] = score_orm(model, orm_examples(data[split], renderer), yes, no)
    for name, s in scores.items():
        floor = max(s.positives, s.examples - s.positives) / s.examples if s.examples else 0.0
        rows.append(
            [name, s.examples, s.positives, f"{s.accuracy:.1%}", f"{s.precision:.1%}",
             f"{s.recall:.1%}", f"{floor:.1%}"]
        )  # fmt: skip
    table = {
        "title": (
            f"the outcome reward model after {report.bc.steps} steps "
            f"({report.bc.wall_s / 60:.1f} min, {report.bc.train_examples} train episodes)"
        ),
        "headers": ["rollouts", "episodes", "successes", "accuracy", "precision", "recall",
                    "always the commoner label"],
        "rows": rows,
    }  # fmt: skip
    notes = [
        f"base {args.base}; faulty oracle p_exit={args.p_exit}, p_wrong={args.p_wrong}; "
        f"judge: {report.bc.mode}, lr {bc.learning_rate}, batch {bc.batch_size}",
        load_note(load),
    ]
    result = {
        "args": vars(args),
        "scores": {k: msgspec.to_builtins(v) for k, v in scores.items()},
        "bc": msgspec.to_builtins(report.bc),
    }
    finish(args.out, "orm", result, table=table, notes=notes, load=load)


if __name__ == "__main__":
    main()
