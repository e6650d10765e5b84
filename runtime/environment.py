"""Where episodes happen: site URLs, tasks, per-episode tenants, allowlists, evaluators.

An `Environment` gives each episode an `EpisodeSetup`: the task with its placeholders
(`__SHOPPING__`, ...) replaced by this environment's URLs, the start URLs (one tab each),
the URLs whose hosts the episode may visit, and the cookies its context starts with.

- `SitesEnvironment`: fixed site URLs and a list of tasks; no per-episode state (a site
  that keeps state is shared by every episode: fine for read-only tasks and tests).
- `BuiltinEnvironment`: the built-in sites (`sites.builtin`); every episode gets its own
  tenant (copy-on-write state, selected by the `webagent_tenant` cookie), created
  logged in to the task's sites when the task requires login and dropped afterwards, so
  the G episodes of a group never see each other's writes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from playwright.async_api import Page

from runtime.base.config import SitesConfig
from runtime.base.messages import Evaluation, TaskConfig

__all__ = [
    "BuiltinEnvironment",
    "Environment",
    "EpisodeSetup",
    "SitesEnvironment",
    "evaluation_options",
    "serve_builtin_environment",
]


@dataclass(frozen=True, slots=True)
class EpisodeSetup:
    """What one episode starts from."""

    task: TaskConfig
    start_urls: list[str]
    urls: dict[str, str]
    allowed: list[str]
    cookies: list[dict[str, Any]] = field(default_factory=list)
    tenant: str = ""


class Environment(Protocol):
    """What the rollout needs from the sites."""

    @property
    def urls(self) -> Mapping[str, str]: ...

    def tasks(self, split: str) -> list[TaskConfig]: ...

    def episode(self, task: TaskConfig) -> AbstractAsyncContextManager[EpisodeSetup]: ...

    async def evaluate(
        self, task: TaskConfig, *, answer: str | None, page: Page, urls: Mapping[str, str]
    ) -> Evaluation: ...


def _substitute(task: TaskConfig, urls: Mapping[str, str]) -> tuple[TaskConfig, list[str]]:
    from sites.tasks import start_urls, substitute_task

    resolved = substitute_task(task, urls)
    return resolved, start_urls(resolved)


async def _evaluate(
    task: TaskConfig,
    *,
    answer: str | None,
    page: Page,
    urls: Mapping[str, str],
    judge: Any = None,
    options: Mapping[str, float] | None = None,
) -> Evaluation:
    """`sites.evaluators.evaluate` with the configured timeouts."""
    from sites.evaluators import evaluate

    return await evaluate(task, answer=answer, page=page, urls=urls, judge=judge, **(options or {}))


def evaluation_options(config: SitesConfig) -> dict[str, float]:
    """The evaluators' timeouts from the sites configuration."""
    return {
        "locator_timeout_s": config.locator_timeout_s,
        "navigation_timeout_s": config.eval_navigation_timeout_s,
        # The built-in sites render on the server: nothing to wait for after a load.
        "settle_timeout_s": 0.0 if config.kind == "builtin" else config.eval_settle_timeout_s,
    }


class SitesEnvironment:
    """Fixed site URLs (by WebArena name) and tasks by split; no tenants."""

    def __init__(
        self,
        urls: Mapping[str, str],
        tasks: Mapping[str, Sequence[TaskConfig]],
        *,
        judge: Any = None,
        extra_allowed: Sequence[str] = (),
        eval_options: Mapping[str, float] | None = None,
    ) -> None:
        self._urls = dict(urls)
        self._tasks = {split: list(items) for split, items in tasks.items()}
        self.judge = judge
        self.eval_options = dict(eval_options or {})
        self.extra_allowed = list(extra_allowed)

    @property
    def urls(self) -> Mapping[str, str]:
        return self._urls

    def tasks(self, split: str) -> list[TaskConfig]:
        if split not in self._tasks:
            known = ", ".join(sorted(self._tasks)) or "none"
            raise KeyError(f"no split {split!r} (splits: {known})")
        return list(self._tasks[split])

    def allowed_for(self, task: TaskConfig) -> list[str]:
        """Every site URL of this environment and `extra_allowed`.

        Every site is allowed rather than only the task's: WebArena tasks move between
        sites (a map link from a shop page), and all sites here are the task author's.
        A start URL elsewhere is not allowed: the episode ends with `error:task`.
        """
        del task
        return sorted({*self._urls.values(), *self.extra_allowed})

    @asynccontextmanager
    async def episode(self, task: TaskConfig) -> AsyncIterator[EpisodeSetup]:
        resolved, start = _substitute(task, self._urls)
        yield EpisodeSetup(
            task=resolved,
            start_urls=start,
            urls=dict(self._urls),
            allowed=self.allowed_for(resolved),
        )

    async def evaluate(
        self, task: TaskConfig, *, answer: str | None, page: Page, urls: Mapping[str, str]
    ) -> Evaluation:
        return await _evaluate(
            task, answer=answer, page=page, urls=urls, judge=self.judge, options=self.eval_options
        )


class BuiltinEnvironment(SitesEnvironment):
    """The built-in sites, one tenant per episode."""

    def __init__(
        self,
        sites: Any,
        *,
        seed: int = 0,
        tasks: Mapping[str, Sequence[TaskConfig]] | None = None,
        judge: Any = None,
        eval_options: Mapping[str, float] | None = None,
    ) -> None:
        from sites.builtin import generate_suite

        suite = tasks if tasks is not None else generate_suite(seed)
        super().__init__(sites.urls, suite, judge=judge, eval_options=eval_options)
        self.sites = sites

    @asynccontextmanager
    async def episode(self, task: TaskConfig) -> AsyncIterator[EpisodeSetup]:
        from sites.builtin import SITE_NAMES, TENANT_COOKIE

        resolved, start = _substitute(task, self.urls)
        logged_in: tuple[str, ...] = ()
        if resolved.require_login is True:
            known = set(SITE_NAMES.values())
            logged_in = tuple(site for site in resolved.sites if site in known)
        tenant: str = self.sites.create_tenant(logged_in=logged_in)
        try:
            hosts = sorted({urlsplit(url).hostname or "" for url in self.urls.values()})
            cookies = [
                {"name": TENANT_COOKIE, "value": tenant, "domain": host, "path": "/"}
                for host in hosts
                if host
            ]
            yield EpisodeSetup(
                task=resolved,
                start_urls=start,
                urls=dict(self.urls),
                allowed=self.allowed_for(resolved),
                cookies=cookies,
                tenant=tenant,
            )
        finally:
            self.sites.drop_tenant(tenant)


@asynccontextmanager
async def serve_builtin_environment(
    config: SitesConfig,
    *,
    judge: Any = None,
    tasks: Mapping[str, Sequence[TaskConfig]] | None = None,
) -> AsyncIterator[BuiltinEnvironment]:
    """Start the built-in sites in this process and yield their environment.

    `tasks` (by split) replaces the generated suite, e.g. a task folder of one's own.
    """
    from sites.builtin import serve_builtin_sites

    async with serve_builtin_sites(config) as sites:
        yield BuiltinEnvironment(
            sites,
            seed=config.seed,
            tasks=tasks,
            judge=judge,
            eval_options=evaluation_options(config),
        )
