"""Every advertised action runs for real; the allowlist, tabs, dialogs and downloads."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from runtime.base.config import BrowserConfig, ObservationConfig
from runtime.base.messages import Action
from runtime.browser import BrowserPool
from runtime.errors import ActionError, ElementNotFound, NavigationBlocked, ObservationError
from runtime.fence import AllowlistError
from runtime.observation import Observation
from runtime.session import Allowlist, BrowserSession

pytestmark = [pytest.mark.anyio]

CONFIG = ObservationConfig(style="html")


def _id(observation: Observation, text: str = "", **attrs: str) -> int:
    for element in observation.elements.values():
        if text and element.text != text:
            continue
        if all(element.attrs.get(k) == v for k, v in attrs.items()):
            return element.id
    raise AssertionError(f"no element {text!r} {attrs} in\n{observation.text}")


def do(name: str, element: int | None = None, argument: str | None = None) -> Action:
    return Action(kind="do", name=name, element=element, argument=argument)


async def _out(session: BrowserSession) -> str:
    text = await session.page.text_content("#out")
    return text or ""


def test_allowlist_by_origin() -> None:
    allow = Allowlist.from_urls(["http://127.0.0.1:8001/shop", "localhost:9999"])
    assert allow.allows("http://127.0.0.1:8001/x?y=1")
    assert not allow.allows("http://127.0.0.1:8002/")
    assert not allow.allows("http://localhost/")  # a port is named: only that one
    assert allow.allows("http://LOCALHOST:9999/")
    assert not allow.allows("https://example.com/")
    for refused in ("file:///etc/passwd", "data:text/html,x", "chrome://version", "javascript:1"):
        assert not allow.allows(refused)
    assert allow.describe() == "127.0.0.1:8001, localhost:9999"
    with pytest.raises(AllowlistError, match="'localhost' names no port"):
        Allowlist.from_urls(["localhost"])  # never "every port"


@pytest.mark.browser
async def test_form_actions(pool: BrowserPool, web: Any) -> None:
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/form")])
        obs = await session.observe(CONFIG)
        await session.execute(do("Type", _id(obs, name="q"), "old text"))
        await session.execute(do("Type", _id(obs, name="q"), "blue shoes"))  # replaces
        await session.execute(do("Select Dropdown Option", _id(obs, name="size"), "large"))
        await session.execute(do("Type", _id(obs, name="note"), "ring twice"))
        with pytest.raises(ActionError, match="has no option 'Huge'; its options are 'Small'"):
            await session.execute(do("Select Dropdown Option", _id(obs, name="size"), "Huge"))
        with pytest.raises(ActionError, match="not a dropdown"):
            await session.execute(do("Select Dropdown Option", _id(obs, name="q"), "x"))
        await session.execute(do("Hover", _id(obs, "Hover me")))
        assert await _out(session) == "hovered"
        await session.execute(do("Right Click", _id(obs, "Right click me")))
        assert await _out(session) == "right-clicked"
        await session.execute(do("Click", _id(obs, "Click me")))
        assert await _out(session) == "clicked"
        await session.execute(do("Click", _id(obs, name="q")))
        await session.execute(do("Press Enter"))  # submits the form from the focused field
        result = await session.observe(CONFIG)
        assert result.url.startswith(web("/result?"))
        for line in ("<li>q=blue shoes</li>", "<li>size=Large</li>", "<li>note=ring twice</li>"):
            assert line in result.text

        await session.execute(Action(kind="go_backward"))
        back = await session.observe(CONFIG)
        assert back.url == web("/form")
        await session.execute(Action(kind="go_forward"))
        assert (await session.observe(CONFIG)).url.startswith(web("/result?"))

        await session.execute(Action(kind="go_backward"))
        obs = await session.observe(CONFIG)
        await session.execute(do("Search", _id(obs, name="q"), "red hat"))
        assert "<li>q=red hat</li>" in (await session.observe(CONFIG)).text

        started = time.monotonic()
        await session.execute(do("Wait"))
        assert time.monotonic() - started >= pool.config.wait_action_s


@pytest.mark.browser
async def test_dialogs_are_dismissed_and_downloads_refused(pool: BrowserPool, web: Any) -> None:
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/form")])
        obs = await session.observe(CONFIG)
        await session.execute(do("Click", _id(obs, "Alert")))
        obs = await session.observe(CONFIG)
        assert 'Note: a dialog (alert) said "Saved!" and was dismissed' in obs.text
        await session.execute(do("Click", _id(obs, "Delete")))
        assert await _out(session) == "kept"  # confirm() was answered "Cancel"
        obs = await session.observe(CONFIG)
        assert 'Note: a dialog (confirm) said "Delete?" and was dismissed' in obs.text
        await session.execute(do("Click", _id(obs, "Download report")))
        obs = await session.observe(CONFIG)
        assert "Note: a download (report.csv) was refused" in obs.text
        assert obs.url == web("/form")


@pytest.mark.browser
async def test_tabs_popups_and_switching(pool: BrowserPool, web: Any) -> None:
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/tabs"), web("/")])
        obs = await session.observe(CONFIG)
        assert obs.url == web("/tabs")
        assert f"Tabs: [0] {web('/tabs')} (current) | [1] {web('/')}" in obs.text
        await session.execute(do("Click", _id(obs, "Form in a new tab")))
        obs = await session.observe(CONFIG)
        assert obs.url == web("/form")
        assert "Note: a new tab opened (tab 2) and is now current" in obs.text
        await session.execute(do("Switch Tab", argument="0"))
        obs = await session.observe(CONFIG)
        assert obs.url == web("/tabs")
        async with session.context.expect_page():
            await session.execute(do("Click", _id(obs, "Open home")))  # window.open
        obs = await session.observe(CONFIG)
        assert len(session.pages) == 4
        assert obs.url == web("/")
        with pytest.raises(ActionError, match="there is no tab 7"):
            await session.execute(do("Switch Tab", argument="7"))


@pytest.mark.browser
async def test_a_page_gets_no_more_memory_than_the_limit(web: Any) -> None:
    """browser.process_memory_mb bounds each Chromium process: a page that fills typed
    arrays stops short of the limit (without one it held all 1,536 MiB it asked for)."""
    config = BrowserConfig(process_memory_mb=512, navigation_timeout_s=20.0)
    async with BrowserPool(config) as limited, limited.session(allowed=[web.url]) as session:
        await session.open([web("/hog")])
        title = await session.page.title()
        assert title.startswith("held ") and int(title.split()[1]) < 512
        await session.execute(do("Goto", argument=web("/")))  # the episode goes on
        assert (await session.observe(CONFIG)).title == "Home"


@pytest.mark.browser
async def test_tabs_past_the_cap_are_closed(pool: BrowserPool, web: Any) -> None:
    """A click that calls window.open 30 times (before: 30 tabs, and 200 from a button
    that called it 200 times)."""
    cap = pool.config.max_tabs
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/tabs")])
        obs = await session.observe(CONFIG)
        await session.execute(do("Click", _id(obs, "Open 30")))
        with anyio.fail_after(30):
            while len(session.context.pages) > cap:  # noqa: ASYNC110 - polled: no event
                await anyio.sleep(0.1)
        await anyio.sleep(1)
        assert len(session.pages) == len(session.context.pages) == cap
        obs = await session.observe(CONFIG)
        assert f"Note: a new tab was closed: an episode may have {cap} tabs open" in obs.text
        await session.execute(do("Switch Tab", argument=str(cap - 1)))
        assert (await session.observe(CONFIG)).url.startswith(web("/?"))


@pytest.mark.browser
async def test_allowlist_blocks_leaving_the_sites(pool: BrowserPool, web: Any) -> None:
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/tabs")])
        obs = await session.observe(CONFIG)
        await session.execute(do("Click", _id(obs, "Leave the site")))
        obs = await session.observe(CONFIG)
        assert obs.url == web("/tabs")  # still here
        assert obs.text.startswith(f"Error: navigation to {web.other}/elsewhere was blocked")
        with pytest.raises(NavigationBlocked, match=r"only 127\.0\.0\.1:"):
            await session.execute(do("Goto", argument=f"{web.other}/elsewhere"))
        for url in ("file:///etc/passwd", "data:text/html,<h1>x</h1>", "chrome://version"):
            with pytest.raises(NavigationBlocked, match="only http"):
                await session.execute(do("Goto", argument=url))
        for link in ("Data link", "File link"):
            await session.execute(do("Click", _id(obs, link)))
            after = await session.observe(CONFIG)
            assert after.url == web("/tabs")
            assert "Title: Tabs" in after.text
        # Relative URLs are resolved against the current page.
        await session.execute(do("Goto", argument="/form"))
        assert (await session.observe(CONFIG)).url == web("/form")


@pytest.mark.browser
async def test_stale_and_missing_elements_are_errors_not_misclicks(
    pool: BrowserPool, web: Any
) -> None:
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/changing")])
        obs = await session.observe(CONFIG)
        rename = _id(obs, "Rename me")
        await session.execute(do("Click", rename))
        # The page changed after it was shown: the old id is refused.
        with pytest.raises(ElementNotFound, match=f"element {rename} changed since"):
            await session.execute(do("Click", rename))
        obs = await session.observe(CONFIG)
        renamed = _id(obs, "Renamed")
        await session.execute(do("Click", _id(obs, "Remove the other")))
        with pytest.raises(ElementNotFound, match=f"element {renamed} is not on the page any more"):
            await session.execute(do("Click", renamed))
        with pytest.raises(ElementNotFound, match="there is no element 99"):
            await session.execute(do("Click", 99))
        obs = await session.observe(CONFIG)
        await session.execute(do("Click", _id(obs, "Reload")))
        with pytest.raises(ElementNotFound, match="not on the page any more"):
            await session.execute(do("Click", _id(obs, "Reload")))


@pytest.mark.browser
async def test_a_hung_page_times_out_instead_of_hanging(pool: BrowserPool, web: Any) -> None:
    started = time.monotonic()
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/busy")])
        obs = await session.observe(CONFIG)
        with pytest.raises(ActionError):
            await session.execute(do("Click", _id(obs, "Hang")), timeout_s=1.0)
        with pytest.raises((ObservationError, ActionError)):
            await session.observe(CONFIG, timeout_s=1.0)
    assert time.monotonic() - started < 30


def test_playwright_errors_are_converted_at_the_boundary() -> None:
    from playwright._impl._errors import TargetClosedError
    from playwright.async_api import Error as PlaywrightError
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    from runtime.errors import BrowserError, playwright_errors

    cases: list[tuple[Exception, bool, type[Exception], str]] = [
        (PlaywrightTimeout("Timeout 3000ms exceeded."), True, ActionError, "Click: timed out"),
        (PlaywrightTimeout("Timeout 3000ms exceeded."), False, BrowserError, "Click: timed out"),
        (TargetClosedError(), True, BrowserError, "Click: "),
        (
            PlaywrightError("Target page, context or browser has been closed"),
            True,
            BrowserError,
            "",
        ),
        (
            PlaywrightError("Locator.fill: Error: Element is not an <input>\nCall log: ..."),
            True,
            ActionError,
            "Click: Error: Element is not an <input>",
        ),
    ]
    for raised, action, expected, message in cases:
        with pytest.raises(expected) as info, playwright_errors("Click", action=action):
            raise raised
        assert message in str(info.value)
        assert info.value.__cause__ is raised
        assert not isinstance(info.value, PlaywrightError)
