"""`webagent bc`: behaviour cloning on demonstrations, the checkpoint RL starts from.

    webagent bc --demos .webagent/demos/train.jsonl --base .webagent/models/tiny \\
        --out .webagent/models/bc

Reads a trajectory store of demonstrations (`webagent demos`), renders every turn as a
rollout would, trains (full fine-tuning for small models, LoRA merged at the end for large
ones; `[bc]` in the config) and writes a full model folder that vLLM serves. Prints the
train and held-out per-step action accuracy. torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import msgspec

from runtime.base.config import load_config
from runtime.errors import UsageError

__all__ = ["register"]


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "bc",
        help="behaviour cloning on demonstrations (the warm-up checkpoint)",
        description=(
            "Train a model on demonstrations (a trajectory store, e.g. from `webagent demos`) "
            "with the rollouts' own prompt rendering, and write a full model folder. "
            "Prints train and held-out per-step action accuracy (teacher-forced exact match "
            "of the action)."
        ),
    )
    parser.add_argument("--demos", required=True, metavar="FILE", help="demonstrations (JSONL)")
    parser.add_argument("--base", required=True, metavar="MODEL", help="model folder to start from")
    parser.add_argument("--out", required=True, metavar="DIR", help="BC checkpoint folder to write")
    parser.add_argument(
        "--heldout",
        metavar="FILE",
        help="held-out demonstrations (default: hold out bc.heldout_fraction of the tasks)",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file over the defaults")
    parser.add_argument("--max-steps", type=int, metavar="N", help="override bc.max_steps")
    parser.add_argument("--max-minutes", type=float, metavar="M", help="override bc.max_minutes")
    parser.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    parser.add_argument(
        "--json",
        action="store_true",
        help='one JSON object per line on stdout: {"progress": ...} after each step, '
        '{"report": ...} at the end (how the daemon\'s first run follows a BC process)',
    )
    parser.set_defaults(func=_bc)


def _bc(args: argparse.Namespace) -> int:
    from learner.bc import BCProgress, behaviour_clone
    from learner.errors import DemonstrationError, LearnerError, TrainingError
    from policy.profile import settle_auto
    from policy.prompt import system_prompt

    # BC renders the turns as rollouts of its checkpoint will: settled for the base model.
    config = settle_auto(load_config(args.config), args.base)
    bc = config.bc
    if args.max_steps is not None:
        if args.max_steps < 0:
            raise UsageError("--max-steps must be >= 0")
        bc = msgspec.structs.replace(bc, max_steps=args.max_steps)
    if args.max_minutes is not None:
        if args.max_minutes < 0:
            raise UsageError("--max-minutes must be >= 0")
        bc = msgspec.structs.replace(bc, max_minutes=args.max_minutes)

    def emit(progress: BCProgress) -> None:
        print(_json_line("progress", progress), flush=True)

    try:
        report = behaviour_clone(
            args.demos,
            base_model=args.base,
            out=args.out,
            config=bc,
            lora=config.learner,
            heldout=args.heldout,
            keep_thoughts=config.scheduler.keep_thoughts,
            system_prompt=system_prompt(config.policy.system_prompt),
            overwrite=args.overwrite,
            on_step=emit if args.json else None,
        )
    except TrainingError as exc:
        print(f"webagent: bc failed: {exc}", file=sys.stderr if args.json else sys.stdout)
        return 1
    except (DemonstrationError, LearnerError) as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        print(_json_line("report", report), flush=True)
        return 0
    print(
        f"wrote {report.out}: {report.mode} fine-tuning, {report.steps} steps in "
        f"{report.wall_s:.0f} s ({report.tokens_per_s:.0f} tokens/s), stopped by "
        f"{report.stop_reason}"
    )
    print(
        f"per-step action accuracy: train {_share(report.train_accuracy)} "
        f"({report.train_examples} turns), held-out {_share(report.heldout_accuracy)} "
        f"({report.heldout_examples} turns); held-out episodes all right "
        f"(teacher-forced): actions {_share(report.heldout_episode_accuracy)}, whole turns "
        f"(what greedy decoding replays) {_share(report.heldout_whole_episode_accuracy)}"
    )
    return 0


def _json_line(kind: str, value: msgspec.Struct) -> str:
    """{kind: value} as one line of JSON; NaN (no evaluation yet) stays NaN, not null."""
    return json.dumps({kind: msgspec.to_builtins(value)})


def _share(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1%}"
