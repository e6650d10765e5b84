"""Self-hosted WebArena: site URLs, official task files, state-changing tasks, table columns.

Site URLs are keyed by WebArena's environment variable names (`SITE_VARIABLES`:
SHOPPING, SHOPPING_ADMIN, REDDIT, GITLAB, MAP, WIKIPEDIA, HOMEPAGE). They come from the
configuration (`sites.urls`, `sites.instances[].urls`) and from the environment variables
WebArena users already export; the command line reads the environment once, at the edge
(`urls_from_environ(os.environ)`), and passes the mapping down; nothing here reads
`os.environ`.

Task files are WebArena's own: `config_files/test.raw.json` (812 tasks) and
WebArena-Lite's `test_webarena_lite.raw.json` (165 tasks), or a directory of `N.json`
files; `sites.tasks` loads, checks and substitutes them (`load_webarena_tasks` adds only
the check that every placeholder has a URL). Multi-tab start URLs (` |AND| `) are split by
`sites.tasks.start_urls`.

Storage states are named as WebArena names them: a task's `storage_state`
`./.auth/gitlab.reddit_state.json` means "logged in to gitlab and reddit"
(`state_sites`). Which tasks change state (`changes_state`): those marked
`require_reset`, and those checked by `program_html` (they inspect pages that the agent
is expected to have changed); `string_match` and `url_match` read only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from runtime.base.messages import TaskConfig
from sites.errors import AuthError, SiteURLError
from sites.tasks import PLACEHOLDERS, load_tasks

__all__ = [
    "LOGIN_SITES",
    "SITE_OF_VARIABLE",
    "SITE_VARIABLES",
    "TABLE_COLUMNS",
    "VARIABLE_OF_SITE",
    "changes_state",
    "describe_tasks",
    "load_webarena_tasks",
    "site_urls",
    "state_file_name",
    "state_sites",
    "table_columns",
    "urls_from_environ",
]

SITE_VARIABLES: tuple[str, ...] = PLACEHOLDERS

# Environment variable -> the name tasks use in `sites` (HOMEPAGE has none).
SITE_OF_VARIABLE: dict[str, str] = {
    "SHOPPING": "shopping",
    "SHOPPING_ADMIN": "shopping_admin",
    "REDDIT": "reddit",
    "GITLAB": "gitlab",
    "MAP": "map",
    "WIKIPEDIA": "wikipedia",
}
VARIABLE_OF_SITE: dict[str, str] = {site: var for var, site in SITE_OF_VARIABLE.items()}

# Sites with accounts (WebArena's auto-login covers exactly these four).
LOGIN_SITES: tuple[str, ...] = ("gitlab", "reddit", "shopping", "shopping_admin")

# The paper's WebArena-Lite table: column title -> task `sites` name, in column order.
# A task counts in the column of every site it lists (see `table_columns`).
TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Reddit", "reddit"),
    ("GitLab", "gitlab"),
    ("CMS", "shopping_admin"),
    ("Map", "map"),
    ("Shopping", "shopping"),
)

_STATE_SUFFIX = "_state.json"
_SITE_NAME = re.compile(r"^[a-z][a-z_]*$")

# Official files by size: what `describe_tasks` calls them.
_KNOWN_SIZES = {812: "WebArena", 165: "WebArena-Lite"}


# --------------------------------------------------------------------------- URLs


def urls_from_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The WebArena site variables that are set (and not empty) in `environ`."""
    return {name: environ[name].strip() for name in SITE_VARIABLES if environ.get(name, "").strip()}


def _checked(name: str, url: str, source: str) -> str:
    if name not in SITE_VARIABLES:
        raise SiteURLError(
            name, url, f"unknown site name (known: {', '.join(SITE_VARIABLES)})", source=source
        )
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SiteURLError(name, url, "expected an http(s) URL with a host", source=source)
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise SiteURLError(name, url, f"bad port ({exc})", source=source) from exc
    return url.strip().rstrip("/")


def site_urls(
    configured: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
    *,
    source: str = "sites.urls",
) -> dict[str, str]:
    """`configured` with `overrides` (e.g. the environment's) on top, checked.

    Every URL must be http(s) with a host; names must be WebArena's. Trailing slashes
    are dropped (placeholders are followed by a path: `__GITLAB__/explore`).
    """
    merged = {**configured, **(overrides or {})}
    return {name: _checked(name, url, source) for name, url in merged.items()}


# --------------------------------------------------------------------------- tasks


def load_webarena_tasks(
    path: str | Path, urls: Mapping[str, str] | None = None
) -> list[TaskConfig]:
    """Tasks of a WebArena-format file or directory, checked.

    With `urls`, every placeholder must resolve (the error names the task and field),
    but the tasks keep their placeholders: each episode substitutes the URLs of the
    instance it runs on.
    """
    tasks = load_tasks(path)
    if urls is not None:
        load_tasks(path, urls=urls)  # raises TaskFileError naming an unresolved placeholder
    return tasks


def describe_tasks(tasks: Sequence[TaskConfig]) -> str:
    """ "WebArena-Lite (165 tasks)" for an official file's size, else "N tasks"."""
    name = _KNOWN_SIZES.get(len(tasks))
    return f"{name} ({len(tasks)} tasks)" if name else f"{len(tasks)} tasks"


def changes_state(task: TaskConfig) -> bool:
    """Does the task change the sites' state (so it needs an instance reset before it)?
    A task judged by the outcome reward model ("orm": a generated intent, no page check
    to tell) is taken to, unless it says `require_reset: false`."""
    types = task.eval.eval_types
    if "orm" in types and task.require_reset is not False:
        return True
    return task.require_reset is True or "program_html" in types


def state_sites(task: TaskConfig) -> tuple[str, ...]:
    """The sites a task's `storage_state` logs in to; () when it has none.

    `./.auth/gitlab.reddit_state.json` -> ("gitlab", "reddit"). Known sites without
    accounts (map, wikipedia) are left out: there is nothing to log in to. Raises
    AuthError when the name is not `<site>[.<site>...]_state.json` of known sites.
    """
    raw = task.storage_state
    if not isinstance(raw, str) or not raw.strip():
        return ()
    name = PurePosixPath(raw.strip()).name
    if not name.endswith(_STATE_SUFFIX):
        raise AuthError(
            f"task {task.task_id}: storage_state {raw!r} is not named <site>[.<site>]_state.json"
        )
    sites = name.removesuffix(_STATE_SUFFIX).split(".")
    known = set(SITE_OF_VARIABLE.values())
    unknown = [s for s in sites if s not in known or not _SITE_NAME.match(s)]
    if unknown:
        raise AuthError(
            f"task {task.task_id}: storage_state {raw!r} names unknown site(s) {unknown} "
            f"(sites with accounts: {', '.join(LOGIN_SITES)})"
        )
    return tuple(s for s in sites if s in LOGIN_SITES)


def state_file_name(sites: Iterable[str]) -> str:
    """`gitlab.reddit_state.json`: WebArena's file name for a set of sites (sorted)."""
    return ".".join(sorted(set(sites))) + _STATE_SUFFIX


def table_columns(task: TaskConfig) -> list[str]:
    """The table columns a task counts in: one per listed site that has a column.

    A multi-site task (e.g. sites ["gitlab", "reddit"]) counts in each of its sites'
    columns; the average column counts every task once. Sites without a column
    (wikipedia) count in the average only.
    """
    return [title for title, site in TABLE_COLUMNS if site in task.sites]
