"""Fixtures shared by every test folder.

- `anyio_backend`: asyncio (Playwright's async API needs it), session-scoped so that
  session-scoped async fixtures (one browser per test session) work.
- `browser`: one real Chromium for the whole session; `context`: a fresh one per test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, BrowserContext, async_playwright

from runtime.browser import CHROMIUM_ARGS, find_chromium


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
async def browser(anyio_backend: str) -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(
            executable_path=find_chromium(), args=list(CHROMIUM_ARGS), headless=True
        )
        yield chromium
        await chromium.close()


@pytest.fixture
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    ctx = await browser.new_context()
    ctx.set_default_timeout(10_000)
    yield ctx
    await ctx.close()
