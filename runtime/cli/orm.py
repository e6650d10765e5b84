"""`webagent orm`: WebRL's outcome reward model, a Yes/No judge of finished episodes.

    webagent orm train --rollouts runs/*/trajectories.jsonl --base .webagent/models/base \\
        --out .webagent/models/orm
    webagent orm eval --model .webagent/models/orm --rollouts runs/eval-test/trajectories.jsonl

`train` labels every evaluated trajectory of the stores with its evaluator's reward,
trains the base model's own LoRA on them with BC's loop (`[bc]` in the config: steps,
minutes, learning rate, held-out share by task) and writes it as an adapter (the whole
model for a model small enough to train fully). Both print accuracy, precision and recall
of the judge's Yes against the evaluators' labels. torch is imported only when a command
runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec

from runtime.base.config import load_config
from runtime.errors import UsageError

__all__ = ["register"]


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "orm",
        help="WebRL's outcome reward model: train and score a Yes/No judge of episodes",
        description="Train the outcome reward model on evaluator-labelled rollouts, or score one.",
    )
    commands = parser.add_subparsers(title="orm commands", metavar="COMMAND", required=True)
    train = commands.add_parser("train", help="train the judge's LoRA on labelled rollouts")
    train.add_argument(
        "--rollouts", required=True, nargs="+", metavar="FILE", help="trajectory stores (JSONL)"
    )
    train.add_argument("--base", required=True, metavar="MODEL", help="the base model folder")
    train.add_argument("--out", required=True, metavar="DIR", help="the judge folder to write")
    train.add_argument("--config", metavar="FILE", help="TOML file over the defaults")
    train.add_argument("--max-steps", type=int, metavar="N", help="override bc.max_steps")
    train.add_argument("--max-minutes", type=float, metavar="M", help="override bc.max_minutes")
    train.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    train.set_defaults(func=_train)
    score = commands.add_parser("eval", help="score a judge against the evaluators")
    score.add_argument("--model", required=True, metavar="DIR", help="a judge from `orm train`")
    score.add_argument(
        "--rollouts", required=True, nargs="+", metavar="FILE", help="trajectory stores (JSONL)"
    )
    score.set_defaults(func=_eval)


def _groups(paths: list[str]) -> list[Any]:
    from learner.demos import read_demos
    from learner.errors import DemonstrationError

    groups = []
    for path in paths:
        try:
            groups.extend(read_demos(path))
        except DemonstrationError as exc:
            raise UsageError(str(exc)) from exc
    return groups


def _train(args: argparse.Namespace) -> int:
    from learner.errors import LearnerError, TrainingError
    from learner.orm_training import train_orm

    config = load_config(args.config)
    bc = config.bc
    for flag, field, value in (
        ("--max-steps", "max_steps", args.max_steps),
        ("--max-minutes", "max_minutes", args.max_minutes),
    ):
        if value is not None:
            if value < 0:
                raise UsageError(f"{flag} must be >= 0")
            bc = msgspec.structs.replace(bc, **{field: value})
    if bc.prompt_loss == "auto":  # the judge learns its verdict, not the pages
        bc = msgspec.structs.replace(bc, prompt_loss=0.0)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise UsageError(f"{out} exists (pass --overwrite to replace it)")
    try:
        report = train_orm(
            _groups(args.rollouts), base_model=args.base, out=out, config=bc,
            lora=config.learner,
        )  # fmt: skip
    except TrainingError as exc:
        print(f"webagent: orm train failed: {exc}")
        return 1
    except LearnerError as exc:
        raise UsageError(str(exc)) from exc
    print(
        f"wrote {out}: {report.bc.mode}, {report.bc.steps} steps in {report.bc.wall_s:.0f} s, "
        f"stopped by {report.bc.stop_reason}"
    )
    print(judged_line("train", report.train))
    print(judged_line("held-out", report.heldout))
    return 0


def _eval(args: argparse.Namespace) -> int:
    print(judged_line("rollouts", judge_rollouts(args.model, args.rollouts)))
    return 0


def judge_rollouts(model: str | Path, rollouts: list[str]) -> Any:
    """A judge from `orm train` against the evaluators on the evaluated episodes of some
    trajectory stores (`learner.orm_training.OrmScores`); bad input is a UsageError."""
    from learner.errors import LearnerError
    from learner.orm_training import load_judge, orm_examples, score_orm

    try:
        judge, renderer, (yes, no) = load_judge(model)
        examples = orm_examples(_groups(rollouts), renderer)
    except LearnerError as exc:
        raise UsageError(str(exc)) from exc
    return score_orm(judge, examples, yes, no)


def judged_line(name: str, scores: Any) -> str:
    """One line of a judge's scores, as `orm train` and `orm eval` print them."""
    return (
        f"{name}: {scores.examples} episodes ({scores.positives} successes): accuracy "
        f"{scores.accuracy:.1%}, precision {scores.precision:.1%}, recall {scores.recall:.1%}"
    )
