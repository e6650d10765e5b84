"""Evaluations of the same tasks, compared task by task against the first.

    .venv/bin/python -m bench.compare [NAME=]BASE [NAME=]RUN ... [--ids] [--builtin-seed N]

Each argument is the `--out` folder of a `webagent eval` (or its `results.jsonl`), named
by NAME or else by the folder. The first is the base. Per run: the tasks it scored, how
many it solved (a task's success is its share of scored episodes, `task_rates`: an
infrastructure error or an unjudged episode is left out, not counted as a failure), and,
over the tasks both it and the base scored, the paired difference in points with its
standard error, the tasks only one of the two solved and the sign test's p-value
(`paired_difference`).

Greedy success moves template by template: a policy that learns or forgets a template
wins or loses most of its tasks at once, so the tasks of one template are not independent
and the paired error understates the uncertainty. Where the results name each task's
template (`intent_template_id`, written by `webagent eval`), the table adds the error with
the tasks grouped by template (`clustered_se`); for results written before that, on the
built-in sites, `--builtin-seed N` takes the templates from the suite of sites' seed N.
`--ids` lists the task ids each run gained and lost against the base.

With `--builtin-seed N` a further table splits each run by the length of the oracle's plan
of its tasks (1-3, 4, 5 or more steps: `by_plan_length`), with the scored episodes that
answered in fewer turns than the plan (an exit before the task can be done) and those that
ran out (the turn limit, the repeat guard): a policy that learned only short tasks answers
too soon on long ones; one that roams hits the limit.

RL moves whole templates either way within a few updates, so one trained policy says
little about its configuration. Runs given the same NAME are seeds of one arm (policies
trained with different seeds, evaluated on the same tasks): a second table gives each such
arm its mean success and mean paired difference over the seeds, with the standard error
over seeds (their standard deviation / sqrt(seeds)), the figure to hold against a target.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.common import format_table
from bench.learning_stats import paired_difference, read_jsonl, task_rates, task_templates
from runtime.base.messages import EVALUATED_STATUSES, TaskConfig

HEADERS = ("run", "scored", "solved", "success %", "paired", "vs base (points)",
           "± by template", "only run", "only base", "sign p")  # fmt: skip
# (lowest, highest) steps of each column of the plan-length table; None: no upper bound
PLAN_BUCKETS: tuple[tuple[int, int | None], ...] = ((1, 3), (4, 4), (5, None))
RAN_OUT = frozenset({"max_turns", "repeated_actions"})
SEED_HEADERS = ("arm", "seeds", "success % (mean)", "vs base (points, mean)", "± over seeds",
                "per seed")  # fmt: skip


def _results(spec: str) -> tuple[str, Path]:
    """NAME=PATH or PATH -> (name, results.jsonl); a missing file is an error naming it."""
    name, sep, path_text = spec.partition("=")
    path = Path(path_text if sep else spec)
    if not sep:
        name = path.stem if path.suffix == ".jsonl" else path.name
    results = path if path.suffix == ".jsonl" else path / "results.jsonl"
    if not results.is_file():
        raise argparse.ArgumentTypeError(f"{spec}: no {results} (a `webagent eval --out` folder?)")
    return name, results


@functools.cache
def _builtin_tasks(seed: int) -> list[TaskConfig]:
    """Every task of the built-in suite of sites' seed `seed`, made once per seed."""
    from sites.builtin.suite import generate_suite

    return [task for tasks in generate_suite(seed).values() for task in tasks]


def builtin_templates(seed: int) -> dict[int, int | str]:
    """task_id -> `intent_template_id` of every task of the built-in suite of sites' seed
    `seed` (what `webagent eval` now writes on each line)."""
    return {
        task.task_id: task.intent_template_id
        for task in _builtin_tasks(seed)
        if isinstance(task.intent_template_id, int | str)
    }


def builtin_plan_lengths(seed: int) -> dict[int, int]:
    """task_id -> the number of steps of the oracle's plan (its exit included) of every task
    of the built-in suite of sites' seed `seed`."""
    from sites.builtin.suite import plan_length

    lengths = {task.task_id: plan_length(task) for task in _builtin_tasks(seed)}
    return {task: length for task, length in lengths.items() if length is not None}


def _plan_column(length: int) -> int:
    """The `PLAN_BUCKETS` column of a plan of `length` steps."""
    return next(
        k
        for k, (low, high) in enumerate(PLAN_BUCKETS)
        if low <= length and (high is None or length <= high)
    )


def by_plan_length(runs: list[tuple[str, Path]], lengths: dict[int, int]) -> list[dict[str, Any]]:
    """One row per run: `solved` and `tasks` per `PLAN_BUCKETS` column (tasks scored, by the
    length of their plan), and over its scored episodes of known plan length `episodes`,
    `early` (exited in fewer turns than the plan) and `ran_out` (`RAN_OUT` statuses).
    Tasks whose plan is unknown are left out."""
    rows = []
    for name, path in runs:
        rates = task_rates(path)
        solved = [0] * len(PLAN_BUCKETS)
        tasks = [0] * len(PLAN_BUCKETS)
        for task, rate in rates.items():
            if task not in lengths:
                continue
            column = _plan_column(lengths[task])
            tasks[column] += 1
            solved[column] += rate > 0
        episodes = early = ran_out = 0
        for line in read_jsonl(path):
            plan = lengths.get(int(line["task_id"]))
            if plan is None:
                continue
            for episode in line["episodes"]:
                if episode["status"] not in EVALUATED_STATUSES or episode.get("unjudged"):
                    continue
                episodes += 1
                early += episode["status"] == "exited" and episode["turns"] < plan
                ran_out += episode["status"] in RAN_OUT
        rows.append({"run": name, "solved": solved, "tasks": tasks, "episodes": episodes,
                     "early": early, "ran_out": ran_out})  # fmt: skip
    return rows


def _plan_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[object]]]:
    columns = [
        f"{low}+" if high is None else str(low) if low == high else f"{low}-{high}"
        for low, high in PLAN_BUCKETS
    ]
    headers = ["run", *(f"{c} steps" for c in columns), "episodes", "answered early", "ran out"]
    table = [
        [r["run"], *(f"{s}/{t}" for s, t in zip(r["solved"], r["tasks"], strict=True)),
         r["episodes"], r["early"], r["ran_out"]]
        for r in rows
    ]  # fmt: skip
    return headers, table


def compare(
    runs: list[tuple[str, Path]], templates: dict[int, int | str] | None = None
) -> list[dict[str, Any]]:
    """One row per run: its own figures (`scored` tasks, `solved`: those with a success,
    `success`: the mean of the tasks' rates) and its paired difference against the first
    run over the `tasks` both scored, with `template_se` where the template of every one of
    them is known (the results' own, else `templates`)."""
    known = dict(templates or {})
    for _, path in runs:
        known.update(task_templates(path))
    rates = [(name, task_rates(path)) for name, path in runs]
    base_name, base = rates[0]
    base_solved = {task for task, r in base.items() if r > 0}
    rows = []
    for name, rate in rates:
        solved = {task for task, r in rate.items() if r > 0}
        shared = set(rate) & set(base)
        pair = paired_difference(
            {(0, t): rate[t] for t in shared},
            {(0, t): base[t] for t in shared},
            {(0, t): template for t, template in known.items()},
        )
        rows.append({
            "run": name, "scored": len(rate), "solved": len(solved),
            "success": sum(rate.values()) / len(rate) if rate else float("nan"),
            "base": base_name, **pair,
            "gained": sorted((solved - base_solved) & shared),
            "lost": sorted((base_solved - solved) & shared),
        })  # fmt: skip
    return rows


def over_seeds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per name that `compare`'s rows after the base hold more than once (seeds
    of one arm): `success` and `difference` are means over the seeds, `se_seeds` the
    standard deviation of the seeds' differences / sqrt(seeds), `per_seed` those
    differences in the order given."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in rows[1:]:
        by_name.setdefault(row["run"], []).append(row)
    arms = []
    for name, seeds in by_name.items():
        if len(seeds) < 2:
            continue
        diffs = [r["difference"] for r in seeds]
        arms.append({
            "arm": name, "seeds": len(seeds),
            "success": statistics.fmean(r["success"] for r in seeds),
            "difference": statistics.fmean(diffs),
            "se_seeds": statistics.stdev(diffs) / math.sqrt(len(diffs)), "per_seed": diffs,
        })  # fmt: skip
    return arms


def _table(rows: list[dict[str, Any]]) -> list[list[object]]:
    out: list[list[object]] = []
    for k, r in enumerate(rows):
        versus = "base" if k == 0 else f"{100 * r['difference']:+.1f} ± {100 * r['se']:.1f}"
        grouped = "n/a" if math.isnan(r["template_se"]) else f"{100 * r['template_se']:.1f}"
        out.append([r["run"], r["scored"], r["solved"], 100 * r["success"], r["tasks"], versus,
                    "-" if k == 0 else grouped, r["only_a"], r["only_b"], r["sign_p"]])  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("runs", nargs="+", metavar="[NAME=]RUN", help="the base first")
    parser.add_argument("--ids", action="store_true", help="list the task ids gained and lost")
    parser.add_argument(
        "--builtin-seed", type=int, metavar="N", help="templates: the built-in suite of seed N"
    )
    args = parser.parse_args(argv)
    try:
        runs = [_results(spec) for spec in args.runs]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    templates = builtin_templates(args.builtin_seed) if args.builtin_seed is not None else None
    rows = compare(runs, templates)
    title = f"{len(rows)} evaluations against {rows[0]['run']}, task by task"
    print(format_table(HEADERS, _table(rows), title=title))
    arms = over_seeds(rows)
    if arms:
        table = [[a["arm"], a["seeds"], 100 * a["success"], f"{100 * a['difference']:+.1f}",
                  f"{100 * a['se_seeds']:.1f}", " ".join(f"{100 * d:+.1f}" for d in a["per_seed"])]
                 for a in arms]  # fmt: skip
        print(format_table(SEED_HEADERS, table, title=f"seeds of one arm against {rows[0]['run']}"))
    if args.builtin_seed is not None:
        seed = args.builtin_seed
        headers, table = _plan_table(by_plan_length(runs, builtin_plan_lengths(seed)))
        title = f"tasks solved by the length of the oracle's plan (suite of seed {seed})"
        print(format_table(headers, table, title=title))
    if args.ids:
        for r in rows[1:]:
            print(f"{r['run']}: gained {r['gained']} lost {r['lost']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
