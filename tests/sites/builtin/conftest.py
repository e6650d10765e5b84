"""Fixtures of the built-in sites' tests.

- `builtin_sites`: the five sites served in-process once for the session (seed 0).
- `suite`: the generated task suite of seed 0.
- `plan_runner`: executes an oracle plan with Playwright, resolving each ElementQuery
  among the page's visible interactive elements (exactly one must match, or `nth` of
  several), the way the runtime's oracle resolves it in the observation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import BrowserContext, Page

from runtime.base.config import SitesConfig
from runtime.base.messages import ElementQuery, OracleStep, TaskConfig
from sites.builtin import TENANT_COOKIE, BuiltinSites, generate_suite, serve_builtin_sites
from sites.tasks import substitute_task

_RESOLVE = """([tag, text, contains, attrs, nth]) => {
  const norm = (s) => (s || "").replace(/\\s+/g, " ").trim();
  for (const el of document.querySelectorAll("[data-plan-target]")) {
    el.removeAttribute("data-plan-target");
  }
  const pool = document.querySelectorAll(
    "a[href], button, input:not([type=hidden]), select, textarea");
  const hits = [];
  for (const el of pool) {
    if (!el.getClientRects().length) continue;
    if (tag && el.tagName.toLowerCase() !== tag) continue;
    const shown = norm(el.innerText);
    if (text !== null && shown !== norm(text)) continue;
    if (contains !== null && !shown.includes(norm(contains))) continue;
    if (!Object.entries(attrs).every(([k, v]) => el.getAttribute(k) === v)) continue;
    hits.push(el);
  }
  if (hits.length > nth) hits[nth].setAttribute("data-plan-target", "1");
  return hits.length;
}"""


class PlanError(AssertionError):
    """A plan step whose target is missing or ambiguous on the page."""


class PlanRunner:
    """Runs built-in tasks' plans in a BrowserContext with a tenant of its own."""

    def __init__(self, sites: BuiltinSites) -> None:
        self.sites = sites

    async def start(self, context: BrowserContext, task: TaskConfig) -> tuple[Page, TaskConfig]:
        """A fresh tenant (logged in as the task needs) and a page on the start URL."""
        logged_in = task.sites if task.require_login is True else []
        tenant = self.sites.create_tenant(logged_in=logged_in)
        await context.add_cookies(
            [{"name": TENANT_COOKIE, "value": tenant, "url": self.sites.urls["SHOPPING"]}]
        )
        concrete = substitute_task(task, self.sites.urls)
        page = await context.new_page()
        response = await page.goto(concrete.start_url)
        assert response is not None and response.status == 200, concrete.start_url
        return page, concrete

    async def target(self, page: Page, query: ElementQuery, where: str) -> None:
        count = await page.evaluate(
            _RESOLVE, [query.tag, query.text, query.text_contains, query.attrs, query.nth]
        )
        if count == 0 or count <= query.nth:
            raise PlanError(f"{where}: no element matches {query} on {page.url}")
        if count > 1 and query.nth == 0:
            raise PlanError(f"{where}: {count} elements match {query} on {page.url}")

    async def run(self, page: Page, plan: list[OracleStep], where: str = "") -> str:
        """Perform every step; returns the exit message."""
        for index, step in enumerate(plan):
            label = f"{where} step {index} ({step.action})"
            if step.action == "exit":
                assert index == len(plan) - 1, f"{label}: exit before the end"
                return step.message or ""
            assert step.target is not None, f"{label}: no target"
            await self.target(page, step.target, label)
            element = page.locator("[data-plan-target]")
            match step.action:
                case "Click":
                    async with page.expect_navigation():
                        await element.click()
                case "Type":
                    await element.fill(step.argument or "")
                case "Search":
                    await element.fill(step.argument or "")
                    async with page.expect_navigation():
                        await element.press("Enter")
                case "Select Dropdown Option":
                    await element.select_option(label=step.argument or "")
                case _:
                    raise PlanError(f"{label}: the built-in plans do not use {step.action}")
        raise PlanError(f"{where}: the plan does not end with exit")


@pytest.fixture(scope="session")
async def builtin_sites(anyio_backend: str) -> AsyncIterator[BuiltinSites]:
    async with serve_builtin_sites(SitesConfig()) as sites:
        yield sites


@pytest.fixture(scope="session")
def suite() -> dict[str, list[TaskConfig]]:
    return generate_suite(0)


@pytest.fixture
def plan_runner(builtin_sites: BuiltinSites) -> PlanRunner:
    return PlanRunner(builtin_sites)
