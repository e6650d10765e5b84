"""Self-hosted WebArena as an `Environment`, and the one factory of environments.

`WebArenaEnvironment` gives each episode an instance from `sites.pool.InstancePool`
(alone and freshly reset for a state-changing task, shared for a read-only one), the
task with that instance's URLs substituted, every site URL of the instance as the
allowlist, and the cookies of the task's storage state (`sites.auth.StorageStates`,
logged in on demand) on top of the instance's own cookies. The lease is held until the
episode has been evaluated (the rollout evaluates inside `episode()`).

Per group, the pool's policy and cost are booked under the `group_id` the rollout binds
(structlog contextvars) and logged as one `webarena.group` line by `log_group(group)`
when the group is done; each episode also logs `webarena.lease`.

`open_environment(config)` builds the right environment from the configuration: the
built-in sites served in this process (`sites.kind = "builtin"`), or WebArena
(`"webarena"`) with instances from `sites.instances` (or one instance, "default", from
`sites.urls`). The daemon and the command line use this one function. Environment
variables are read by the caller and passed in as `url_overrides`.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec
import structlog
from playwright.async_api import BrowserContext

from runtime.base.config import Config, SitesConfig
from runtime.base.messages import TaskConfig, TrajectoryGroup
from runtime.browser import BrowserPool
from runtime.environment import (
    EpisodeSetup,
    SitesEnvironment,
    evaluation_options,
    serve_builtin_environment,
)
from sites.auth import StorageStates, accounts_from_config
from sites.errors import AuthError, SiteURLError
from sites.pool import CommandResetter, HttpResetter, Instance, InstancePool, Resetter
from sites.tasks import start_urls, substitute_task
from sites.webarena import (
    LOGIN_SITES,
    changes_state,
    load_webarena_tasks,
    site_urls,
    state_sites,
)

__all__ = [
    "GroupCost",
    "WebArenaEnvironment",
    "instances_from_config",
    "open_environment",
    "tasks_from_path",
]

log = structlog.get_logger("runtime.webarena_environment")

_PLACEHOLDER = re.compile(r"__([A-Z][A-Z0-9_]*?)__")
_MAX_GROUPS_BOOKED = 1024
_SPLIT_FILES = ("train", "test", "ood")


@dataclass(slots=True)
class GroupCost:
    """How a group's episodes got their instances, and what it cost."""

    episodes: int = 0
    policies: dict[str, int] = field(default_factory=dict)
    instances: set[str] = field(default_factory=set)
    resets: int = 0
    reset_s: float = 0.0
    wait_s: float = 0.0
    max_wait_s: float = 0.0
    # Why episodes of the group could not start (no instance left, login failed, ...).
    errors: list[str] = field(default_factory=list)

    def as_fields(self) -> dict[str, Any]:
        return {
            "errors": list(self.errors),
            "policy": "+".join(sorted(self.policies)),
            "episodes": self.episodes,
            "instances": sorted(self.instances),
            "resets": self.resets,
            "reset_s": round(self.reset_s, 3),
            "wait_s": round(self.wait_s, 3),
            "max_wait_s": round(self.max_wait_s, 3),
        }


class WebArenaEnvironment(SitesEnvironment):
    """WebArena instances leased per episode; storage states applied as cookies.

    `tasks` maps split names to tasks; a split named "*" answers every split name (one
    task file serving training and evaluation alike).
    """

    def __init__(
        self,
        pool: InstancePool,
        tasks: Mapping[str, Sequence[TaskConfig]],
        *,
        states: StorageStates | None = None,
        browser: BrowserPool | None = None,
        judge: Any = None,
        extra_allowed: Sequence[str] = (),
        eval_options: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(
            pool.instances[0].urls,
            tasks,
            judge=judge,
            extra_allowed=extra_allowed,
            eval_options=eval_options,
        )
        self.pool = pool
        self.states = states
        self.browser = browser
        self._groups: OrderedDict[str, GroupCost] = OrderedDict()
        for split_tasks in self._tasks.values():
            check_placeholders(split_tasks, pool.instances)

    def tasks(self, split: str) -> list[TaskConfig]:
        if split not in self._tasks and "*" in self._tasks:
            return list(self._tasks["*"])
        return super().tasks(split)

    # ------------------------------------------------------------------ auth

    @asynccontextmanager
    async def _auth_context(
        self, cookies: Sequence[dict[str, Any]], *, allowed: Sequence[str]
    ) -> AsyncIterator[BrowserContext]:
        if self.browser is None:
            raise AuthError("auto-login needs a browser pool (WebArenaEnvironment(browser=...))")
        async with self.browser.session(allowed=allowed, cookies=cookies) as session:
            yield session.context

    def _logins(self, task: TaskConfig) -> tuple[str, ...]:
        """The sites whose storage state the task starts with."""
        named = state_sites(task)
        if named:
            return named
        if task.require_login is True:
            return tuple(site for site in task.sites if site in LOGIN_SITES)
        return ()

    async def _cookies(
        self, instance: Instance, sites: Sequence[str], base: Sequence[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        if not sites:
            return list(base)
        if self.states is None:
            raise AuthError(f"sites {list(sites)} need a login but auto-login is not set up")
        allowed = sorted({*instance.urls.values(), *self.extra_allowed})

        def new_context(cookies: Sequence[dict[str, Any]]) -> Any:
            return self._auth_context(cookies, allowed=allowed)

        return await self.states.ensure(
            instance.name, instance.urls, sites, new_context, base_cookies=base
        )

    async def prepare(self, tasks: Sequence[TaskConfig]) -> dict[str, list[str]]:
        """Make (or check) every storage state `tasks` need, per healthy instance: each
        login site alone and each set of sites a task names. Returns the state file names
        per instance; raises AuthError on the first that cannot be made."""
        combos: set[tuple[str, ...]] = set()
        for task in tasks:
            sites = self._logins(task)
            if sites:
                combos.add(tuple(sorted(set(sites))))
                combos.update((site,) for site in sites)
        made: dict[str, list[str]] = {}
        for instance in self.pool.healthy():
            for combo in sorted(combos):
                await self._cookies(instance, combo, instance.cookies())
            if self.states is not None:
                made[instance.name] = [
                    self.states.path(instance.name, c).name for c in sorted(combos)
                ]
        return made

    # ------------------------------------------------------------------ episodes

    @asynccontextmanager
    async def episode(self, task: TaskConfig) -> AsyncIterator[EpisodeSetup]:
        setup: EpisodeSetup | None = None
        try:
            logins = self._logins(task)
            async with self.pool.lease(exclusive=changes_state(task)) as lease:
                self._book(lease)
                instance = next(i for i in self.pool.instances if i.name == lease.instance)
                resolved = substitute_task(task, lease.urls)
                cookies = await self._cookies(instance, logins, lease.cookies)
                setup = EpisodeSetup(
                    task=resolved,
                    start_urls=start_urls(resolved),
                    urls=dict(lease.urls),
                    allowed=sorted({*lease.urls.values(), *self.extra_allowed}),
                    cookies=cookies,
                    tenant=lease.instance,
                )
                yield setup
        except Exception as exc:
            if setup is None:  # the episode could not start: say why in the group's books
                cost = self._group_cost()
                if cost is not None and len(cost.errors) < 5:
                    cost.errors.append(f"{type(exc).__name__}: {exc}")
            raise

    def _group_cost(self) -> GroupCost | None:
        group_id = structlog.contextvars.get_contextvars().get("group_id")
        if not isinstance(group_id, str) or not group_id:
            return None
        cost = self._groups.get(group_id)
        if cost is None:
            cost = self._groups[group_id] = GroupCost()
            while len(self._groups) > _MAX_GROUPS_BOOKED:
                self._groups.popitem(last=False)
        return cost

    def _book(self, lease: Any) -> None:
        cost = self._group_cost()
        if cost is None:
            return
        cost.episodes += 1
        cost.policies[lease.policy] = cost.policies.get(lease.policy, 0) + 1
        cost.instances.add(lease.instance)
        cost.resets += int(lease.reset)
        cost.reset_s += lease.reset_s
        cost.wait_s += lease.wait_s
        cost.max_wait_s = max(cost.max_wait_s, lease.wait_s)

    def group_cost(self, group_id: str) -> GroupCost | None:
        """The booked cost of a group (None when none of its episodes got an instance)."""
        return self._groups.get(group_id)

    def log_group(self, group: TrajectoryGroup) -> GroupCost | None:
        """Log the group's instance policy and cost as one line and forget it."""
        cost = self._groups.pop(group.group_id, None)
        if cost is not None:
            log.info(
                "webarena.group", group_id=group.group_id, task_id=group.task_id, **cost.as_fields()
            )
        return cost

    def statistics(self) -> dict[str, Any]:
        """The pool's and the storage states' statistics, as plain data."""
        out: dict[str, Any] = {"pool": msgspec.to_builtins(self.pool.statistics())}
        if self.states is not None:
            out["auth"] = msgspec.to_builtins(self.states.statistics())
        return out


def check_placeholders(tasks: Sequence[TaskConfig], instances: Sequence[Instance]) -> None:
    """Raise SiteURLError when a task uses a placeholder an instance has no URL for."""
    needed: dict[str, int] = {}
    for task in tasks:
        texts = [task.start_url]
        if isinstance(task.eval.reference_url, str):
            texts.append(task.eval.reference_url)
        texts += [entry.url for entry in task.eval.program_html or []]
        for text in texts:
            for name in _PLACEHOLDER.findall(text):
                needed.setdefault(name, task.task_id)
    for instance in instances:
        for name, task_id in sorted(needed.items()):
            if name not in instance.urls:
                raise SiteURLError(
                    name,
                    "",
                    f"instance {instance.name!r} has no URL for it, and task {task_id} uses "
                    f"__{name}__ (set sites.urls.{name}, the {name} environment variable, "
                    f"or the instance's urls)",
                )


def instances_from_config(
    config: SitesConfig,
    client: httpx.AsyncClient,
    *,
    url_overrides: Mapping[str, str] | None = None,
) -> list[Instance]:
    """The configured instances; without `sites.instances`, one "default" instance from
    `sites.urls` (with `url_overrides`, e.g. the environment's, on top). An instance's own
    URLs win over `sites.urls`, which fill the names it leaves out."""
    base = site_urls(config.urls, url_overrides, source="sites.urls")
    if not config.instances:
        if not base:
            raise SiteURLError(
                "SHOPPING",
                "",
                "no WebArena site URLs: set sites.urls (or sites.instances) in the config, "
                "or export SHOPPING, SHOPPING_ADMIN, REDDIT, GITLAB, MAP, ...",
            )
        return [Instance(name="default", urls=base)]
    instances: list[Instance] = []
    for index, spec in enumerate(config.instances):
        where = f"sites.instances[{index}]"
        urls = {**base, **site_urls(spec.urls, source=f"{where}.urls")}
        if not urls:
            raise SiteURLError("SHOPPING", "", f"{where} ({spec.name}) has no site URLs")
        if spec.reset_url and spec.reset_command:
            raise SiteURLError(
                "reset_url", spec.reset_url, f"{where}: set reset_url or reset_command, not both"
            )
        resetter: Resetter | None = None
        if spec.reset_url:
            parts = urlsplit(spec.reset_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise SiteURLError(
                    "reset_url", spec.reset_url, f"{where}: expected an http(s) URL with a host"
                )
            resetter = HttpResetter(
                spec.name,
                spec.reset_url,
                client,
                timeout_s=spec.reset_timeout_s,
                poll_s=spec.reset_poll_s,
                site_urls=sorted(set(urls.values())),
            )
        elif spec.reset_command:
            resetter = CommandResetter(
                spec.name,
                spec.reset_command,
                timeout_s=spec.reset_timeout_s,
                poll_s=spec.reset_poll_s,
                client=client,
                site_urls=sorted(set(urls.values())),
            )
        instances.append(
            Instance(name=spec.name, urls=urls, resetter=resetter, max_episodes=spec.max_episodes)
        )
    return instances


def tasks_from_path(path: str | Path) -> dict[str, list[TaskConfig]]:
    """Tasks by split: a folder with train/test/ood.json gives those splits; any other
    file (or folder of N.json files) serves every split ("*")."""
    folder = Path(path)
    if folder.is_dir():
        found = {s: folder / f"{s}.json" for s in _SPLIT_FILES if (folder / f"{s}.json").is_file()}
        if found:
            return {split: load_webarena_tasks(file) for split, file in found.items()}
    return {"*": load_webarena_tasks(folder)}


@asynccontextmanager
async def open_environment(
    config: Config,
    *,
    url_overrides: Mapping[str, str] | None = None,
    browser: BrowserPool | None = None,
    judge: Any = None,
) -> AsyncIterator[SitesEnvironment]:
    """The configured environment, ready for episodes; closed on exit.

    Built-in: the sites served in this process. WebArena: the instance pool, auto-login
    with storage states under `sites.auth_dir` (contexts from `browser`, or from a small
    browser pool opened here), and the tasks of `sites.tasks` if set.
    """
    sites = config.sites
    if sites.kind == "builtin":
        # `sites.tasks`: a folder with train/test/ood.json of built-in tasks of one's own.
        own = tasks_from_path(sites.tasks) if sites.tasks else None
        async with serve_builtin_environment(sites, judge=judge, tasks=own) as builtin:
            yield builtin
        return
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=30.0))
        instances = instances_from_config(sites, client, url_overrides=url_overrides)
        tasks = tasks_from_path(sites.tasks) if sites.tasks else {}
        states = StorageStates(
            sites.auth_dir,
            accounts_from_config(sites.accounts),
            check_interval_s=sites.auth_check_interval_s,
            timeout_s=sites.auth_timeout_s,
        )
        if browser is None:
            small = msgspec.structs.replace(config.browser, max_contexts=4)
            browser = await stack.enter_async_context(BrowserPool(small))
        pool = InstancePool(instances, on_reset=states.invalidate)
        environment = WebArenaEnvironment(
            pool,
            tasks,
            states=states,
            browser=browser,
            judge=judge,
            eval_options=evaluation_options(sites),
        )
        log.info(
            "webarena.ready",
            instances=[i.name for i in instances],
            resets={i.name: i.resetter.describe() if i.resetter else "none" for i in instances},
            tasks={split: len(items) for split, items in tasks.items()},
        )
        yield environment
