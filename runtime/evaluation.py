"""Evaluation runs: success per site in the paper's table, per-task results, an HTML report.

`run_evaluation` runs every task as a group of `group_size` episodes through
`runtime.task_runs.run_tasks` (the same rollout loop as everything else) and writes, under
`out_dir`:

    results.jsonl       one line per task (`TaskResult`), appended as groups finish
                        (as `results.jsonl.partial`, renamed when the run is complete)
    trajectories.jsonl  the groups, whole (`runtime.store.TrajectoryStore`)
    summary.json        the table, statuses, timings, environment statistics
    table.md            the table as Markdown
    report.html         one self-contained page (inline CSS, no script, no external
                        asset) listing every task and each episode's turns: thought,
                        action, URL and errors, with the evaluators' checks

The table follows the WebArena-Lite table of the WebAgent-R1 paper: columns Reddit,
GitLab, CMS (shopping_admin), Map, Shopping and Avg. A cell is successes / episodes of
the tasks whose `sites` list that site; a multi-site task counts in the column of every
site it lists (so a GitLab+Reddit task appears under both), and Avg. counts every task
exactly once (it is the overall success rate, not the mean of the columns). Tasks of
sites without a column (wikipedia) count in Avg. only. The number of multi-site tasks
is reported beside the table.

An episode whose evaluation left a check unjudged (a fuzzy match without
`sites.judge_url`, an `"orm"` check without an outcome reward model, or a judge that
answered neither way) has no score: it is counted apart (`unjudged`) and left out of
every rate, whose denominator is the judged episodes. Counting it as a failure would
report a guess.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import jinja2
import msgspec
import structlog

from runtime.actions import format_action
from runtime.base.config import Config
from runtime.base.files import write_atomic
from runtime.base.messages import (
    EvalFinished,
    Event,
    TaskConfig,
    Trajectory,
    TrajectoryGroup,
    encode,
)
from runtime.base.text import well_formed
from runtime.browser import BrowserPool
from runtime.environment import Environment
from runtime.observation import TokenCounter, estimate_tokens
from runtime.policystack import PolicyStack
from runtime.protocols import Policy
from runtime.store import TrajectoryStore
from runtime.task_runs import run_tasks
from runtime.webarena_environment import WebArenaEnvironment
from sites.webarena import TABLE_COLUMNS, table_columns

__all__ = [
    "AVERAGE",
    "Cell",
    "EpisodeResult",
    "EvalReport",
    "PeriodicEvaluations",
    "TaskResult",
    "format_table",
    "render_report",
    "run_evaluation",
    "score_table",
    "task_result",
]

log = structlog.get_logger("runtime.evaluation")

AVERAGE = "Avg."


class EpisodeResult(msgspec.Struct, frozen=True, kw_only=True):
    """One episode of a task, without its observations."""

    episode_id: str
    status: str
    reward: float
    answer: str | None
    turns: int
    seconds: float
    failed_checks: list[str] = []
    # Some check could not be judged: no score (left out of the rates).
    unjudged: bool = False


class TaskResult(msgspec.Struct, frozen=True, kw_only=True):
    """One task's group: a line of `results.jsonl`."""

    task_id: int
    intent: str
    sites: list[str]
    columns: list[str]
    group_id: str
    episodes: list[EpisodeResult]
    successes: int
    # Over the judged episodes (0.0 when none was judged).
    success_rate: float
    # How the episodes got their sites (WebArena: the instance pool's policy and cost).
    environment: dict[str, Any] = {}
    unjudged: int = 0
    # The task's template (`TaskConfig.intent_template_id`), where it has one: greedy success
    # moves template by template, so comparisons group by it (`bench.compare`).
    intent_template_id: int | str | None = None


class Cell(msgspec.Struct, frozen=True, kw_only=True):
    """One table cell: successes over the judged episodes of `tasks` tasks."""

    tasks: int
    episodes: int
    successes: int
    unjudged: int = 0

    @property
    def judged(self) -> int:
        return self.episodes - self.unjudged

    @property
    def rate(self) -> float:
        return self.successes / self.judged if self.judged else 0.0


class EvalReport(msgspec.Struct, frozen=True, kw_only=True):
    """What an evaluation run measured and where it wrote it."""

    title: str
    tasks: int
    episodes: int
    successes: int
    table: dict[str, Cell]
    multi_site_tasks: int
    statuses: dict[str, int]
    seconds: float
    out_dir: str
    environment: dict[str, Any] = {}
    unjudged: int = 0

    @property
    def judged(self) -> int:
        return self.episodes - self.unjudged

    @property
    def success_rate(self) -> float:
        """Over the judged episodes (see the module docstring)."""
        return self.successes / self.judged if self.judged else 0.0


# --------------------------------------------------------------------------- scoring


def _failed_checks(trajectory: Trajectory) -> list[str]:
    if trajectory.evaluation is None:
        return []
    return [f"{c.kind}: {c.detail}"[:300] for c in trajectory.evaluation.checks if not c.passed]


def task_result(
    task: TaskConfig, group: TrajectoryGroup, environment: dict[str, Any] | None = None
) -> TaskResult:
    """The group of `task` as a results line."""
    episodes = [
        EpisodeResult(
            episode_id=t.episode_id,
            status=t.status,
            reward=t.reward,
            answer=t.answer,
            turns=len(t.turns),
            seconds=round(t.finished_at - t.started_at, 3),
            failed_checks=_failed_checks(t),
            unjudged=t.evaluation is not None and t.evaluation.unjudged,
        )
        for t in group.trajectories
    ]
    successes = sum(1 for e in episodes if e.reward > 0 and not e.unjudged)
    unjudged = sum(1 for e in episodes if e.unjudged)
    judged = len(episodes) - unjudged
    template = task.intent_template_id
    return TaskResult(
        task_id=task.task_id,
        intent=task.intent,
        sites=list(task.sites),
        columns=table_columns(task),
        group_id=group.group_id,
        episodes=episodes,
        successes=successes,
        success_rate=successes / judged if judged else 0.0,
        environment=environment or {},
        unjudged=unjudged,
        intent_template_id=template if isinstance(template, int | str) else None,
    )


def score_table(results: Sequence[TaskResult]) -> dict[str, Cell]:
    """The paper's columns and Avg. (see the module docstring for multi-site tasks)."""
    counts: dict[str, list[int]] = {title: [0, 0, 0, 0] for title, _ in TABLE_COLUMNS}
    counts[AVERAGE] = [0, 0, 0, 0]
    for result in results:
        for title in [*result.columns, AVERAGE]:
            cell = counts[title]
            cell[0] += 1
            cell[1] += len(result.episodes)
            cell[2] += result.successes
            cell[3] += result.unjudged
    return {
        title: Cell(tasks=n, episodes=episodes, successes=won, unjudged=unjudged)
        for title, (n, episodes, won, unjudged) in counts.items()
    }


def _cell_counts(cell: Cell) -> str:
    """successes/judged, with the unjudged episodes named when there are any."""
    return f"{cell.successes}/{cell.judged}" + (f" +{cell.unjudged}?" if cell.unjudged else "")


def format_table(report: EvalReport) -> str:
    """The table as Markdown: success rate (%) with successes/judged episodes under it
    (and `+N?` for N episodes left unjudged)."""
    titles = list(report.table)
    rates = [f"{cell.rate * 100:.1f}" if cell.judged else "-" for cell in report.table.values()]
    counts = [_cell_counts(cell) for cell in report.table.values()]
    lines = [
        f"{report.title}: {report.tasks} tasks, {report.episodes} episodes, {report.seconds:.1f} s",
        "| " + " | ".join(titles) + " |",
        "|" + "|".join("---:" for _ in titles) + "|",
        "| " + " | ".join(rates) + " |",
        "| " + " | ".join(counts) + " |",
        f"multi-site tasks: {report.multi_site_tasks} (counted in each of their sites' "
        f"columns, once in {AVERAGE})",
        "statuses: " + ", ".join(f"{k}={v}" for k, v in sorted(report.statuses.items())),
    ]
    if report.unjudged:
        lines.append(
            f"unjudged: {report.unjudged} of {report.episodes} episodes had a check no judge "
            "could score (+N? above); they are left out of the rates"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- the run


async def run_evaluation(
    config: Config,
    environment: Environment,
    policy: Policy,
    tasks: Sequence[TaskConfig],
    *,
    out_dir: str | Path,
    group_size: int = 1,
    concurrency: int = 8,
    max_turns: int | None = None,
    title: str = "evaluation",
    pool: BrowserPool | None = None,
    count_tokens: TokenCounter = estimate_tokens,
    on_result: Callable[[TaskResult], Awaitable[None]] | None = None,
) -> EvalReport:
    """Run `tasks` and write the results, the table and the HTML report to `out_dir`."""
    out = Path(out_dir)
    partial = out / "results.jsonl.partial"
    await anyio.to_thread.run_sync(_fresh_dir, out, partial)
    by_id = {task.task_id: task for task in tasks}
    results: list[TaskResult] = []
    webarena = environment if isinstance(environment, WebArenaEnvironment) else None
    with TrajectoryStore(out / "trajectories.jsonl") as store, partial.open("ab") as lines:

        async def on_group(group: TrajectoryGroup) -> None:
            cost = webarena.log_group(group) if webarena is not None else None
            extra = cost.as_fields() if cost is not None else {}
            result = task_result(by_id[group.task_id], group, extra)
            results.append(result)
            lines.write(encode(result) + b"\n")
            lines.flush()
            await store.append_async(group)
            if on_result is not None:
                await on_result(result)

        run = await run_tasks(
            config,
            environment,
            policy,
            tasks,
            split="eval",
            group_size=group_size,
            concurrency=concurrency,
            max_turns=max_turns,
            count_tokens=count_tokens,
            on_group=on_group,
            pool=pool,
        )
        os.fsync(lines.fileno())
    partial.replace(out / "results.jsonl")
    results.sort(key=lambda r: r.task_id)
    groups = sorted(run.groups, key=lambda g: g.task_id)
    statuses = Counter(e.status for r in results for e in r.episodes)
    report = EvalReport(
        title=title,
        tasks=len(results),
        episodes=sum(len(r.episodes) for r in results),
        successes=sum(r.successes for r in results),
        unjudged=sum(r.unjudged for r in results),
        table=score_table(results),
        multi_site_tasks=sum(1 for r in results if len(r.columns) > 1),
        statuses=dict(statuses),
        seconds=round(run.seconds, 3),
        out_dir=str(out),
        environment=webarena.statistics() if webarena is not None else {},
    )
    write_atomic(out / "summary.json", msgspec.json.format(msgspec.json.encode(report)))
    write_atomic(out / "table.md", (format_table(report) + "\n").encode())
    html_report = well_formed(render_report(report, results, groups, by_id))
    write_atomic(out / "report.html", html_report.encode())
    log.info(
        "evaluation.finished",
        tasks=report.tasks,
        episodes=report.episodes,
        success_rate=round(report.success_rate, 4),
        seconds=report.seconds,
        out_dir=str(out),
    )
    return report


class PeriodicEvaluations:
    """A training run's evaluations: the test and ood splits' fixed, seeded subsets of
    `daemon.eval_episodes` tasks at `daemon.eval_temperature`, each time `want(updates)` is
    called (at most one waits: a call while one is pending is dropped). Each split ends in
    an `EvalFinished` record; its files go to `<run_dir>/eval/u<updates>-<split>/`."""

    def __init__(self, config: Config, run_dir: Path, record: Callable[[Event], None]) -> None:
        self.config = config
        self.run_dir = run_dir
        self._record = record
        self._wanted, self._requests = anyio.create_memory_object_stream[int](1)

    def want(self, updates: int) -> None:
        with contextlib.suppress(anyio.WouldBlock):  # one is pending already
            self._wanted.send_nowait(updates)

    async def run(self, environment: Environment, pool: BrowserPool, stack: PolicyStack) -> None:
        config = self.config
        # A quarter of the rollouts' episodes: evaluations share the policy's request slots
        # with the training rollouts and must not starve them.
        concurrency = max(1, config.scheduler.max_episodes_in_flight // 4)
        sampling = msgspec.structs.replace(
            stack.policy.sampling, temperature=config.daemon.eval_temperature
        )
        policy = stack.policy.with_sampling(sampling)
        async with self._requests:
            async for updates in self._requests:
                with contextlib.ExitStack() as held:
                    # The version published now, leased (kept resident) and pinned for the
                    # whole evaluation, which outlasts several updates on a CPU: without the
                    # pin, later turns would go to the versions published meanwhile.
                    pinned, version = policy, 0
                    if stack.adapters.current is not None:
                        lease = held.enter_context(stack.adapters.lease())
                        pinned, version = policy.pinned(lease.name), lease.version
                    for split in ("test", "ood"):
                        await self._evaluate(
                            split,
                            updates=updates,
                            version=version,
                            environment=environment,
                            pool=pool,
                            stack=stack,
                            policy=pinned,
                            concurrency=concurrency,
                        )

    async def _evaluate(
        self,
        split: str,
        *,
        updates: int,
        version: int,
        environment: Environment,
        pool: BrowserPool,
        stack: PolicyStack,
        policy: Policy,
        concurrency: int,
    ) -> None:
        config = self.config
        try:
            tasks = _eval_tasks(
                environment, split, config.daemon.eval_episodes, config.scheduler.seed
            )
        except KeyError:
            return
        report = await run_evaluation(
            config,
            environment,
            policy,
            tasks,
            out_dir=self.run_dir / "eval" / f"u{updates:05d}-{split}",
            concurrency=concurrency,
            title=f"{split} after {updates} updates (v{version})",
            pool=pool,
            count_tokens=stack.renderer.count_tokens,
        )
        self._record(
            EvalFinished(
                at=time.time(),
                split=split,
                version=version,
                episodes=report.episodes,
                success=report.success_rate,
                by_site={title: cell.rate for title, cell in report.table.items() if cell.judged},
            )
        )


def _eval_tasks(environment: Environment, split: str, episodes: int, seed: int) -> list[TaskConfig]:
    """A fixed, seeded subset of a split: the same tasks at every evaluation."""
    order = list(environment.tasks(split))
    random.Random(f"eval:{seed}:{split}").shuffle(order)
    return order[: min(len(order), max(1, episodes))]


def _fresh_dir(out: Path, partial: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    partial.unlink(missing_ok=True)


# --------------------------------------------------------------------------- HTML

_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ report.title }}</title>
<style>
body { font: 14px/1.4 sans-serif; margin: 16px 24px; color: #222; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; }
.ok { color: #176c2e; font-weight: bold; } .bad { color: #a01818; font-weight: bold; }
section.task { border-top: 2px solid #999; margin-top: 18px; }
details { margin: 6px 0 6px 12px; } summary { cursor: pointer; }
td.thought { max-width: 420px; white-space: pre-wrap; }
td.url, td.action { max-width: 360px; word-break: break-all; font-family: monospace; }
.err { color: #a01818; }
</style></head><body>
<h1>{{ report.title }}</h1>
<p>{{ report.tasks }} tasks, {{ report.episodes }} episodes, {{ report.successes }} successes
({{ "%.1f" % (report.success_rate * 100) }}% of the judged), {{ "%.1f" % report.seconds }} s.
{% if report.unjudged %}{{ report.unjudged }} episodes had a check no judge could score:
they are left out of the rates.{% endif %}
Multi-site tasks ({{ report.multi_site_tasks }}) count in each of their sites' columns and
once in the {{ average }} column.</p>
<table id="table"><tr>
{% for title in report.table %}<th class="num">{{ title }}</th>{% endfor %}
</tr><tr>
{% for cell in report.table.values() %}<td class="num">
{% if cell.judged %}{{ "%.1f" % (cell.rate * 100) }}{% else %}-{% endif %}
<br><small>{{ cell_counts(cell) }}</small></td>
{% endfor %}
</tr></table>
<p>Statuses:
{% for k, v in report.statuses|dictsort %}{{ k }}={{ v }}{{ ", " if not loop.last }}{% endfor %}
</p>
<h2>Tasks</h2>
<table id="tasks">
<tr><th class="num">task</th><th>sites</th><th class="num">success</th><th>intent</th></tr>
{% for r in results %}
<tr><td class="num"><a href="#task-{{ r.task_id }}">{{ r.task_id }}</a></td>
<td>{{ r.sites|join(", ") }}</td>
<td class="num {{ 'ok' if r.successes else 'bad' }}">{{ r.successes }}/{{ r.episodes|length }}</td>
<td>{{ r.intent }}</td></tr>
{% endfor %}
</table>
{% for r in results %}{% set task = tasks[r.task_id] %}
<section class="task" id="task-{{ r.task_id }}" data-task-id="{{ r.task_id }}">
<h3>Task {{ r.task_id }}
<span class="{{ 'ok' if r.successes else 'bad' }}">{{ r.successes }}/{{ r.episodes|length }}</span>
</h3>
<p>{{ r.intent }}</p>
<p><small>sites: {{ r.sites|join(", ") }} &middot; start: <code>{{ task.start_url }}</code>
&middot; evaluators: {{ task.eval.eval_types|join(", ") }}
{% if r.environment %}&middot; instances: {{ r.environment.get("policy", "") }}
(resets {{ r.environment.get("resets", 0) }}, reset {{ r.environment.get("reset_s", 0) }} s,
wait {{ r.environment.get("wait_s", 0) }} s)
{% for e in r.environment.get("errors", []) %}<br><span class="err">{{ e }}</span>{% endfor %}
{% endif %}</small></p>
{% for t in groups.get(r.task_id, []) %}
<details{% if t.reward <= 0 %} open{% endif %}><summary>episode {{ t.episode_id }}:
<span class="{{ 'ok' if t.reward > 0 else 'bad' }}">{{ t.status }}, reward {{ t.reward }}</span>,
{{ t.turns|length }} turns{% if t.answer is not none %}, answer <q>{{ t.answer }}</q>{% endif %}
</summary>
{% if t.evaluation %}<ul>
{% for c in t.evaluation.checks %}
<li class="{{ 'ok' if c.passed else 'bad' }}">{{ c.kind }}: {{ c.detail }}</li>
{% endfor %}
</ul>{% endif %}
{% if t.turns %}
<table class="turns">
<tr><th class="num">#</th><th>URL</th><th>thought</th><th>action</th><th>error</th></tr>
{% for turn in t.turns %}
<tr><td class="num">{{ turn.index }}</td><td class="url">{{ turn.url }}</td>
<td class="thought">{{ turn.thought }}</td><td class="action">{{ action(turn) }}</td>
<td class="err">{{ turn.parse_error or turn.action_error or "" }}</td></tr>
{% endfor %}
</table>
{% else %}<p class="err">No turns (the episode did not start: {{ t.status }}).</p>{% endif %}
</details>
{% endfor %}
</section>
{% endfor %}
</body></html>
"""

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
_REPORT = _ENV.from_string(_TEMPLATE)


def _action(turn: Any) -> str:
    return format_action(turn.action) if turn.action is not None else ""


def render_report(
    report: EvalReport,
    results: Sequence[TaskResult],
    groups: Sequence[TrajectoryGroup],
    tasks: dict[int, TaskConfig],
) -> str:
    """The HTML report: one page, inline CSS, every task and every turn."""
    by_task: dict[int, list[Trajectory]] = {}
    for group in groups:
        by_task.setdefault(group.task_id, []).extend(group.trajectories)
    return _REPORT.render(
        report=report,
        results=results,
        groups=by_task,
        tasks=tasks,
        average=AVERAGE,
        action=_action,
        cell_counts=_cell_counts,
    )
