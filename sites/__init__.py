"""Web environments: WebArena's task format, evaluators, the built-in sites, WebArena.

- `sites.tasks`: load, check, substitute and write WebArena task files.
- `sites.evaluators`: `evaluate(task, answer=..., page=..., urls=...)` -> `Evaluation`.
- `sites.matching`: the string, number and URL rules the evaluators use.
- `sites.judge`: the fuzzy-match `Judge` protocol and `HttpJudge`.
- `sites.builtin`: the built-in sites and their task suite.
"""

from sites.errors import SiteError, TaskFileError
from sites.evaluators import evaluate
from sites.judge import HttpJudge, Judge
from sites.tasks import load_tasks, start_urls, substitute_task

__all__ = [
    "HttpJudge",
    "Judge",
    "SiteError",
    "TaskFileError",
    "evaluate",
    "load_tasks",
    "start_urls",
    "substitute_task",
]
