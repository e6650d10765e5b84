"""`webagent eval`: success per site in the paper's table, per-task results, an HTML report.

    webagent eval --tasks test_webarena_lite.raw.json --policy runs/x/adapters/policy@v40 \\
        --max-turns 15 --out runs/eval-lite
    webagent eval --policy oracle          # the built-in suite's test split

`--policy` is `oracle` (the built-in tasks' scripted solutions) or an adapter folder
(served by vLLM through `runtime.policystack`). The sites are the configured ones
(`sites.kind`): the built-in sites served in this process, or self-hosted WebArena,
whose URLs come from the config and from WebArena's environment variables (SHOPPING,
SHOPPING_ADMIN, REDDIT, GITLAB, MAP, WIKIPEDIA, HOMEPAGE; read here, at the edge).
Storage states are made (or checked) before the run. Without `--tasks`, the tasks are
the `--split` of the built-in suite (or of `sites.tasks` for WebArena). `--orm DIR` then
judges the run's evaluated episodes with WebRL's outcome reward model (`webagent orm
train`) and scores it against the evaluators (`OUT/orm.json`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec

from policy.adapters import read_manifest
from policy.errors import PolicyError
from policy.profile import settle_auto
from runtime.base.config import Config, load_config
from runtime.base.files import write_atomic
from runtime.base.messages import TaskConfig
from runtime.browser import BrowserPool
from runtime.errors import UsageError
from runtime.evaluation import EvalReport, TaskResult, format_table, run_evaluation
from runtime.observation import TokenCounter, estimate_tokens
from runtime.oracle import OraclePolicy
from runtime.protocols import Policy
from runtime.webarena_environment import WebArenaEnvironment, open_environment
from sites.errors import SiteError
from sites.judge import HttpJudge
from sites.webarena import describe_tasks, load_webarena_tasks, urls_from_environ

__all__ = ["register"]


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "eval",
        help="evaluate a policy on a task file: success per site, results, HTML report",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file over the defaults")
    parser.add_argument(
        "--tasks",
        metavar="FILE",
        help="WebArena-format task file or folder (default: the --split of the suite)",
    )
    parser.add_argument("--split", default="test", help="split when --tasks is not given")
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N tasks")
    parser.add_argument(
        "--policy",
        default="oracle",
        metavar="ADAPTER|model|oracle",
        help=(
            "an adapter folder (with manifest.json) on policy.model, 'model' for policy.model "
            "itself (the embedded default: the BC model), or 'oracle' (default)"
        ),
    )
    parser.add_argument(
        "--max-turns", type=int, help="turns per episode (default: scheduler.max_turns)"
    )
    parser.add_argument("--group-size", type=int, default=1, help="episodes per task (1)")
    parser.add_argument("--concurrency", type=int, default=8, help="episodes at once (8)")
    parser.add_argument(
        "--out", metavar="DIR", help="output folder (default: RUN_DIR/eval-<date>-<time>)"
    )
    parser.add_argument("--seed", type=int, help="built-in sites' seed (default: sites.seed)")
    parser.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="sampling temperature of the policy (default: daemon.eval_temperature, 0: greedy)",
    )
    parser.add_argument(
        "--orm",
        metavar="DIR",
        help="also judge the evaluated episodes with this outcome reward model (a judge "
        "from `webagent orm train`): its accuracy, precision and recall against the "
        "evaluators, printed and written to OUT/orm.json",
    )
    parser.set_defaults(func=_eval)


def _checked(args: argparse.Namespace) -> Config:
    for name in ("limit", "max_turns", "group_size", "concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    if args.temperature is not None and not 0 <= args.temperature <= 10:
        raise UsageError(f"--temperature must be between 0 and 10, not {args.temperature}")
    if args.orm is not None and not Path(args.orm).is_dir():
        raise UsageError(f"--orm: {args.orm!r} is not a folder (a judge from `webagent orm train`)")
    if args.policy not in ("oracle", "model") and not Path(args.policy).is_dir():
        raise UsageError(
            f"--policy: expected 'oracle', 'model' or an adapter folder, got {args.policy!r}"
        )
    config = load_config(args.config)
    temperature = config.daemon.eval_temperature if args.temperature is None else args.temperature
    config = msgspec.structs.replace(
        config, policy=msgspec.structs.replace(config.policy, temperature=temperature)
    )
    if args.seed is not None:
        config = msgspec.structs.replace(
            config, sites=msgspec.structs.replace(config.sites, seed=args.seed)
        )
    # Pages and prompt as the evaluated model reads them: an adapter's base when
    # policy.model is empty.
    model = config.policy.model
    if not model and args.policy not in ("oracle", "model"):
        try:
            model = read_manifest(args.policy).base_model
        except PolicyError as exc:
            raise UsageError(f"--policy {args.policy}: {exc}") from exc
    return settle_auto(config, model)


def _eval(args: argparse.Namespace) -> int:
    config = _checked(args)
    tasks: list[TaskConfig] | None = None
    if args.tasks:
        try:
            tasks = load_webarena_tasks(args.tasks)
        except SiteError as exc:
            raise UsageError(str(exc)) from exc
    out = Path(args.out or Path(config.daemon.run_dir) / time.strftime("eval-%Y%m%d-%H%M%S"))
    environ = os.environ  # read here, at the edge, and passed down
    key_name = config.sites.judge_api_key_env
    run = _Run(
        config=config,
        args=args,
        tasks=tasks,
        out=out,
        url_overrides=urls_from_environ(environ),
        judge_key=environ.get(key_name, "") if key_name else "",
    )
    try:
        report = anyio.run(run.main)
    except (SiteError, PolicyError) as exc:
        raise UsageError(str(exc)) from exc
    except ExceptionGroup as group:
        user = _user_error(group)
        if user is None:
            raise
        raise UsageError(str(user)) from group
    print(format_table(report))
    print(f"results: {out / 'results.jsonl'}")
    print(f"report: {out / 'report.html'}")
    if args.orm:
        _judge(args.orm, out)
    return 0


def _judge(orm: str, out: Path) -> None:
    """The outcome reward model's verdicts on this evaluation's episodes, against the
    evaluators' (WebRL's judge, scored where the evaluators are known)."""
    from dataclasses import asdict

    from runtime.cli.orm import judge_rollouts, judged_line

    scores = judge_rollouts(orm, [str(out / "trajectories.jsonl")])
    write_atomic(
        out / "orm.json", msgspec.json.format(msgspec.json.encode({"judge": orm, **asdict(scores)}))
    )
    print(judged_line("orm judge", scores))


def _user_error(group: BaseExceptionGroup[Any]) -> Exception | None:
    """The first error in a (nested) group that a user can fix, if any."""
    for exc in group.exceptions:
        if isinstance(exc, SiteError | PolicyError | UsageError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _user_error(exc)
            if found is not None:
                return found
    return None


class _Run:
    """One `webagent eval` invocation inside the event loop."""

    def __init__(
        self,
        *,
        config: Config,
        args: argparse.Namespace,
        tasks: list[TaskConfig] | None,
        out: Path,
        url_overrides: Mapping[str, str],
        judge_key: str,
    ) -> None:
        self.config = config
        self.args = args
        self.tasks = tasks
        self.out = out
        self.url_overrides = dict(url_overrides)
        self.judge_key = judge_key

    async def main(self) -> EvalReport:
        config, args = self.config, self.args
        browser = msgspec.structs.replace(
            config.browser, max_contexts=max(args.concurrency, config.browser.max_contexts)
        )
        async with httpx.AsyncClient() as http, BrowserPool(browser) as pool:
            judge = HttpJudge.from_config(config.sites, http, api_key=self.judge_key)
            async with open_environment(
                config, url_overrides=self.url_overrides, browser=pool, judge=judge
            ) as environment:
                tasks = self._tasks(environment)
                if isinstance(environment, WebArenaEnvironment):
                    made = await environment.prepare(tasks)
                    for instance, files in made.items():
                        print(f"storage states of {instance}: {', '.join(files)}", file=sys.stderr)
                source = args.tasks or f"split {args.split}"
                title = f"{Path(args.policy).name} on {source} ({describe_tasks(tasks)})"
                done = 0

                async def progress(result: TaskResult) -> None:
                    nonlocal done
                    done += 1
                    print(
                        f"[{done}/{len(tasks)}] task {result.task_id}: "
                        f"{result.successes}/{len(result.episodes)}"
                        + (f" ({result.unjudged} unjudged)" if result.unjudged else ""),
                        file=sys.stderr,
                        flush=True,
                    )

                async with _policy(config, args.policy) as (policy, count_tokens):
                    return await run_evaluation(
                        config,
                        environment,
                        policy,
                        tasks,
                        out_dir=self.out,
                        group_size=args.group_size,
                        concurrency=args.concurrency,
                        max_turns=args.max_turns,
                        title=title,
                        pool=pool,
                        count_tokens=count_tokens,
                        on_result=progress,
                    )

    def _tasks(self, environment: Any) -> Sequence[TaskConfig]:
        if self.tasks is not None:
            tasks: Sequence[TaskConfig] = self.tasks
        else:
            try:
                tasks = environment.tasks(self.args.split)
            except KeyError as exc:
                raise UsageError(
                    f"{exc.args[0]}; pass --tasks FILE (or set sites.tasks for WebArena)"
                ) from exc
        if self.args.limit:
            tasks = tasks[: self.args.limit]
        if not tasks:
            raise UsageError("no tasks to evaluate")
        return tasks


@asynccontextmanager
async def _policy(config: Config, name: str) -> AsyncIterator[tuple[Policy, TokenCounter]]:
    if name == "oracle":
        yield OraclePolicy(), estimate_tokens
        return
    from runtime.policystack import policy_stack

    # On a shared server (policy.url), our own adapter names leave a daemon's alone.
    prefix = f"{config.policy.adapter_prefix}-eval{os.getpid()}" if config.policy.url else None
    adapter: str | Path = name
    if name == "model":  # the model itself: served through v0, an adapter of zeros
        if not config.policy.model:
            raise UsageError("--policy model serves policy.model, which is empty: set it")
        from runtime.bootstrap import zero_adapter_of

        adapter = await zero_adapter_of(config, config.policy.model)
    async with policy_stack(config, adapter=adapter, prefix=prefix) as stack:
        yield stack.policy, stack.renderer.count_tokens
