"""`webagent tasks check|generate|stats`: WebArena-format task files and the built-in suite.

`check` is here; `generate` and `stats` (the built-in suite) come from `runtime.cli.sites`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from runtime.cli.sites import add_task_commands
from runtime.errors import UsageError
from sites.errors import TaskFileError
from sites.evaluators import unsupported
from sites.tasks import count_tasks, load_tasks


def register(sub: Any) -> None:
    parser = sub.add_parser("tasks", help="WebArena-format task files and the built-in suite")
    cmds = parser.add_subparsers(title="tasks commands", metavar="ACTION", required=True)
    _add_check(cmds)
    add_task_commands(cmds)


def _add_check(cmds: Any) -> None:
    check = cmds.add_parser(
        "check",
        help="validate a task file (or a directory of N.json files) and count its tasks",
    )
    check.add_argument("file", metavar="FILE")
    check.add_argument(
        "--url",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="site URL for a placeholder (SHOPPING=http://host:7770); with any --url, "
        "every placeholder must resolve",
    )
    check.set_defaults(func=_check)


def _site_urls(pairs: list[str]) -> dict[str, str] | None:
    if not pairs:
        return None
    urls: dict[str, str] = {}
    for pair in pairs:
        name, sep, url = pair.partition("=")
        if not sep or not name or not url:
            raise UsageError(f"--url expects NAME=URL, got {pair!r}")
        urls[name.strip()] = url.strip()
    return urls


def _table(title: str, counts: dict[str, int], out: Any) -> None:
    print(f"{title}:", file=out)
    width = max((len(key) for key in counts), default=0)
    for key, count in counts.items():
        print(f"  {key:<{width}}  {count:>5}", file=out)


def _check(args: argparse.Namespace) -> int:
    try:
        tasks = load_tasks(args.file, urls=_site_urls(args.url))
    except TaskFileError as exc:
        raise UsageError(str(exc)) from exc
    out = sys.stdout
    counts = count_tasks(tasks)
    print(f"ok: {args.file}: {counts.total} tasks", file=out)
    _table("by site", counts.by_site, out)
    _table("by evaluator", counts.by_eval_type, out)
    _table("by rule", counts.by_rule, out)
    problems = [(task.task_id, why) for task in tasks for why in unsupported(task)]
    if problems:
        ids = sorted({task_id for task_id, _ in problems})
        print(f"not fully evaluable here: {len(ids)} tasks (scored as unjudged)", file=out)
        for task_id, why in problems:
            print(f"  task {task_id}: {why}", file=out)
    return 0
