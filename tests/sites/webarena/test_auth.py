"""Auto-login against the built-in sites served as a WebArena instance, in real Chromium:
storage states per site and per site set, their check, reuse, expiry and refresh."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from playwright.async_api import Browser, BrowserContext
from structlog.testing import capture_logs

from runtime.base.config import WebArenaAccountConfig
from sites.auth import (
    STANDARD_ACCOUNTS,
    ContextFactory,
    StorageStates,
    accounts_from_config,
    merge_cookies,
)
from sites.builtin import BuiltinSites
from sites.errors import AuthError

pytestmark = [pytest.mark.anyio, pytest.mark.browser]


def contexts(browser: Browser) -> ContextFactory:
    @asynccontextmanager
    async def new_context(cookies: Sequence[dict[str, Any]]) -> AsyncIterator[BrowserContext]:
        context = await browser.new_context()
        try:
            if cookies:
                await context.add_cookies(list(cookies))  # type: ignore[arg-type]
            yield context
        finally:
            await context.close()

    return new_context


def states(tmp_path: Path, fakes: ModuleType, **kwargs: Any) -> StorageStates:
    return StorageStates(tmp_path / "auth", accounts_from_config(fakes.BUILTIN_ACCOUNTS), **kwargs)


async def test_states_per_site_and_pair_are_made_then_reused(
    browser: Browser, builtin_sites: BuiltinSites, fakes: ModuleType, tmp_path: Path
) -> None:
    instance = fakes.BuiltinInstance(builtin_sites, "wa-0")
    auth = states(tmp_path, fakes)
    new_context = contexts(browser)

    cookies = await auth.ensure(
        "wa-0", instance.urls, ["shopping"], new_context, base_cookies=instance.cookies()
    )
    path = tmp_path / "auth" / "wa-0" / "shopping_state.json"
    assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert any(c["name"] == "webagent_tenant" for c in cookies)

    await auth.ensure(
        "wa-0", instance.urls, ["reddit", "gitlab"], new_context, base_cookies=instance.cookies()
    )
    assert (tmp_path / "auth" / "wa-0" / "gitlab.reddit_state.json").is_file()
    assert auth.statistics().logins == 2

    # Within the check interval the state is reused without a page load.
    checks = auth.statistics().checks
    await auth.ensure(
        "wa-0", instance.urls, ["shopping"], new_context, base_cookies=instance.cookies()
    )
    assert (auth.statistics().logins, auth.statistics().checks) == (2, checks)

    # A context holding the state is logged in: the account page loads, no redirect.
    async with new_context(cookies) as context:
        page = await context.new_page()
        await page.goto(instance.urls["SHOPPING"] + "/account")
        assert page.url.endswith("/account")
        assert "Signed in as emma.lopez@example.com" in await page.content()

    # Another process (a new StorageStates) checks the saved file and uses it as is.
    again = states(tmp_path, fakes)
    await again.ensure(
        "wa-0", instance.urls, ["shopping"], new_context, base_cookies=instance.cookies()
    )
    assert (again.statistics().logins, again.statistics().checks) == (0, 1)


async def test_expired_states_are_refreshed(
    browser: Browser, builtin_sites: BuiltinSites, fakes: ModuleType, tmp_path: Path
) -> None:
    instance = fakes.BuiltinInstance(builtin_sites, "wa-1")
    auth = states(tmp_path, fakes, check_interval_s=3600)
    new_context = contexts(browser)

    async def ensure() -> None:
        await auth.ensure(
            "wa-1", instance.urls, ["reddit"], new_context, base_cookies=instance.cookies()
        )

    await ensure()
    instance.log_out_everywhere()  # the session expired on the server
    await ensure()  # trusted: verified less than check_interval_s ago
    assert auth.statistics().expired == 0

    auth.invalidate("wa-1")  # what the pool does after a reset
    with capture_logs() as logs:
        await ensure()
    expired = [e for e in logs if e["event"] == "auth.expired"]
    assert expired and "/subscriptions redirected to" in expired[0]["problem"]
    assert "/login" in expired[0]["problem"]
    assert (auth.statistics().expired, auth.statistics().logins) == (1, 2)

    instance.reset()  # a new tenant: the saved cookie no longer opens a session
    auth.invalidate("wa-1")
    await ensure()
    assert (auth.statistics().expired, auth.statistics().logins) == (2, 3)


async def test_a_wrong_password_is_a_clear_error(
    browser: Browser, builtin_sites: BuiltinSites, fakes: ModuleType, tmp_path: Path
) -> None:
    instance = fakes.BuiltinInstance(builtin_sites, "wa-2")
    overrides = dict(fakes.BUILTIN_ACCOUNTS)
    overrides["shopping_admin"] = WebArenaAccountConfig(
        password="wrong", check_path="/orders", **fakes._LOGIN
    )
    auth = StorageStates(tmp_path, accounts_from_config(overrides))
    with pytest.raises(AuthError, match=r"logged in, but shopping_admin: .*/orders redirected to"):
        await auth.ensure(
            "wa-2",
            instance.urls,
            ["shopping_admin"],
            contexts(browser),
            base_cookies=instance.cookies(),
        )
    assert auth.statistics().failures == 1
    assert not (tmp_path / "wa-2" / "shopping_admin_state.json").exists()


async def test_a_login_form_that_goes_nowhere_times_out(
    browser: Browser, builtin_sites: BuiltinSites, fakes: ModuleType, tmp_path: Path
) -> None:
    instance = fakes.BuiltinInstance(builtin_sites, "wa-3")
    overrides = dict(fakes.BUILTIN_ACCOUNTS)
    overrides["gitlab"] = WebArenaAccountConfig(
        **{**fakes._LOGIN, "submit": "css:h1"}, check_path="/", check_keyword="Signed in as"
    )
    auth = StorageStates(tmp_path, accounts_from_config(overrides), timeout_s=1.0)
    with pytest.raises(AuthError, match=r"logging in to gitlab took more than 1 s"):
        await auth.ensure(
            "wa-3", instance.urls, ["gitlab"], contexts(browser), base_cookies=instance.cookies()
        )


def test_accounts_are_webarenas_unless_configured() -> None:
    standard = accounts_from_config({})
    assert standard == STANDARD_ACCOUNTS
    assert standard["reddit"].username == "MarvelsGrantMan136"
    assert (
        standard["reddit"].check_url("http://h:9999")
        == "http://h:9999/user/MarvelsGrantMan136/account"
    )
    changed = accounts_from_config({"gitlab": WebArenaAccountConfig(password="s3cret")})
    assert changed["gitlab"].password == "s3cret"
    assert changed["gitlab"].username == "byteblaze"
    assert changed["gitlab"].login_path == "/users/sign_in"
    with pytest.raises(AuthError, match=r"sites.accounts.twitter: unknown site"):
        accounts_from_config({"twitter": WebArenaAccountConfig()})
    with pytest.raises(AuthError, match=r"sites.accounts.shopping.submit: locator 'button'"):
        accounts_from_config({"shopping": WebArenaAccountConfig(submit="button")})


def test_instance_cookies_win_over_state_cookies() -> None:
    state = [
        {"name": "t", "value": "old", "domain": "h", "path": "/"},
        {"name": "s", "value": "1", "domain": "h", "path": "/"},
    ]
    base = [{"name": "t", "value": "new", "domain": "h", "path": "/"}]
    merged = merge_cookies(state, base)
    assert sorted((c["name"], c["value"]) for c in merged) == [("s", "1"), ("t", "new")]
