"""One episode's browser: a BrowserContext, its tabs, the host allowlist, and the actions.

`BrowserSession` is made by `BrowserPool.session()`. It

- checks the allowlist by request routing, to tell the model: requests to other hosts
  are aborted and a blocked navigation is reported in the next observation (the fence
  itself is `runtime.fence`: the context's proxy, which sees every request and every
  redirect hop, WebSockets included); `Goto` refuses
  other hosts and every scheme but http(s) before navigating (Chromium itself refuses
  page-initiated top-level navigations to `data:`, `file:` and `chrome:` URLs, and any tab
  found on such a URL after an action is closed or sent back);
- tracks tabs: popups and pages opened with target=_blank join `pages` and become the
  current tab (past `max_tabs` open, a new one is closed at once); `Switch Tab` picks one
  by index;
- dismisses dialogs (accepting only `beforeunload`, so navigation goes on) and refuses
  downloads, reporting both in the next observation (32 notes at most; a page that opens
  dialogs in a loop gets the rest counted);
- executes every action of the DSL for real (`runtime.acting`), bounded in time, on
  elements named by the ids of the last observation.

Every Playwright call runs under `playwright_errors`, so only the runtime's errors leave.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar

import anyio
import structlog
from playwright.async_api import BrowserContext, Dialog, Download, Page, Request, Route
from playwright.async_api import Error as PlaywrightError

from runtime.acting import perform
from runtime.actions import format_action, shorten
from runtime.base.config import BrowserConfig, ObservationConfig
from runtime.base.messages import Action
from runtime.errors import (
    ActionError,
    BrowserError,
    NavigationBlocked,
    playwright_errors,
)
from runtime.fence import Allowlist
from runtime.observation import (
    Observation,
    TokenCounter,
    estimate_tokens,
    render,
    snapshot,
)

__all__ = ["Allowlist", "BrowserSession", "call_until_gone"]

T = TypeVar("T")

log = structlog.get_logger("runtime.session")

# How long an aborted navigation may take to show up as a (refused) download.
_DOWNLOAD_GRACE_S: Final = 1.0
# Notices (and blocked navigations) kept between two observations; the rest are counted.
_MAX_NOTES: Final = 32


async def call_until_gone(
    call: Callable[[], Awaitable[T]], gone: anyio.Event, *, what: str, timeout_s: float
) -> T:
    """`await call()` (a Playwright call), given up as soon as `gone` is set or after
    `timeout_s`, either way as `BrowserError`.

    Playwright's `new_page()` (and `new_context()`) on a browser killed meanwhile never
    returns: seen here with 8 contexts opening tabs while Chromium was SIGKILLed, every
    one of them waited for good. Racing the call against the disconnection ends it.
    """
    result: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            try:
                with playwright_errors(what):
                    result.append(await call())
            except Exception as exc:  # raised below, outside the task group
                failure.append(exc)
            tg.cancel_scope.cancel()

        tg.start_soon(run)
        with anyio.move_on_after(timeout_s):
            await gone.wait()
        tg.cancel_scope.cancel()
    if failure:
        raise failure[0]
    if result:
        return result[0]
    if gone.is_set():
        raise BrowserError(f"{what}: the browser is gone")
    raise BrowserError(f"{what}: no answer within {timeout_s:g} s")


def _is_safe_idle(url: str) -> bool:
    """Pages that are on no host at all and harmless: the blank page."""
    return url in ("about:blank", "")


class BrowserSession:
    """One episode's BrowserContext; made by `BrowserPool.session()`."""

    def __init__(
        self,
        context: BrowserContext,
        config: BrowserConfig,
        allowlist: Allowlist,
    ) -> None:
        self.context = context
        self.config = config
        self.allowlist = allowlist
        self.pages: list[Page] = []
        self.active: Page | None = None
        self.notices: list[str] = []
        self.observation: Observation | None = None
        # Navigations blocked since the last observation (shown as errors), by page.
        self.blocked: list[str] = []
        # Notices and blocked navigations past _MAX_NOTES since the last observation.
        self._unshown = 0
        self._blocked_pages: list[Page] = []
        self._opening = False
        # Tabs opened past config.max_tabs, until closed.
        self._excess: set[Page] = set()
        self._crashed = False
        self._new_page = anyio.Event()
        # Set when the context closes; it does when Chromium dies.
        self._gone = anyio.Event()
        # Main-frame navigation requests in flight, and an event set when one ends.
        self._navigations: set[Request] = set()
        self._navigation_ended = anyio.Event()
        # Set when a navigation was aborted (what a download does): its download event
        # follows a moment later.
        self._download: anyio.Event | None = None

    # ------------------------------------------------------------------ setup

    async def start(self) -> None:
        """Install routing and tab tracking; called once by the pool."""
        self.context.set_default_timeout(self.config.action_timeout_s * 1000)
        self.context.set_default_navigation_timeout(self.config.navigation_timeout_s * 1000)
        self.context.on("page", self._on_page)
        self.context.on("page", self._close_excess)
        self.context.on("close", lambda _: self._gone.set())
        with playwright_errors("set up the browser context"):
            await self.context.route("**/*", self._route)

    async def open(self, urls: Sequence[str]) -> None:
        """Open the start URLs, one tab each; the first tab is the current one."""
        if not urls:
            raise ValueError("open() needs at least one URL")
        for url in urls:
            if not self.allowlist.allows(url):
                raise NavigationBlocked(f"start URL {url} is not on an allowed host")
        for url in urls:
            self._opening = True
            try:
                page = await call_until_gone(
                    self.context.new_page,
                    self._gone,
                    what="open a tab",
                    timeout_s=self.config.navigation_timeout_s,
                )
            finally:
                self._opening = False
            self._adopt(page)
            await self.navigate(page, url, action=True)
        self.active = self.pages[0]
        with playwright_errors("bring the first tab to front"):
            await self.active.bring_to_front()

    @property
    def page(self) -> Page:
        if self.active is None or self.active.is_closed():
            if not self.pages:
                raise BrowserError("the episode has no open tab")
            self.active = self.pages[-1]
        return self.active

    # ------------------------------------------------------------------ events

    def _adopt(self, page: Page) -> None:
        if page in self.pages:
            return
        self.pages.append(page)
        page.on("dialog", self._on_dialog)
        page.on("download", self._on_download)
        page.on("close", self._on_close)
        page.on("crash", self._on_crash)
        page.on("request", self._on_request)
        page.on("requestfinished", self._on_request_done)
        page.on("requestfailed", self._on_request_done)

    def _on_request(self, request: Request) -> None:
        if request.is_navigation_request() and request.frame.parent_frame is None:
            self._navigations.add(request)

    def _on_request_done(self, request: Request) -> None:
        if request in self._navigations:
            if request.failure == "net::ERR_ABORTED" and self._download is None:
                self._download = anyio.Event()
            self._navigations.discard(request)
            self._navigation_ended.set()
            self._navigation_ended = anyio.Event()

    def _on_page(self, page: Page) -> None:
        known = page in self.pages or self._opening
        if not known and len(self.pages) >= self.config.max_tabs:
            self._excess.add(page)  # closed by _close_excess, the next handler
            self._note(
                self.notices,
                f"a new tab was closed: an episode may have {self.config.max_tabs} tabs open",
            )
            self._new_page.set()
            return
        self._adopt(page)
        self._new_page.set()
        if not known:
            self.active = page
            self._note(
                self.notices, f"a new tab opened (tab {len(self.pages) - 1}) and is now current"
            )

    async def _close_excess(self, page: Page) -> None:
        if page in self._excess:
            self._excess.discard(page)
            with contextlib.suppress(PlaywrightError):
                await page.close()

    def _on_close(self, page: Page) -> None:
        if page in self.pages:
            self.pages.remove(page)
        if self.active is page:
            self.active = self.pages[-1] if self.pages else None

    def _on_crash(self, page: Page) -> None:
        self._crashed = True

    async def _on_dialog(self, dialog: Dialog) -> None:
        kind = dialog.type
        message = " ".join(dialog.message.split())[:200]
        verb = "accepted" if kind == "beforeunload" else "dismissed"
        self._note(self.notices, f'a dialog ({kind}) said "{message}" and was {verb}')
        try:
            if kind == "beforeunload":
                await dialog.accept()
            else:
                await dialog.dismiss()
        except PlaywrightError:  # the page closed with the dialog open
            return

    def _on_download(self, download: Download) -> None:
        self._note(self.notices, f"a download ({download.suggested_filename}) was refused")
        if self._download is not None:
            self._download.set()

    async def _route(self, route: Route, request: Request) -> None:
        url = request.url
        try:
            if self.allowlist.allows(url):
                await route.continue_()
                return
            if request.is_navigation_request() and request.frame.parent_frame is None:
                self._note(
                    self.blocked,
                    f"navigation to {shorten(url, 100)} was blocked: only "
                    f"{self.allowlist.describe()} may be visited",
                )
                self._blocked_pages.append(request.frame.page)
            await route.abort("blockedbyclient")
        except PlaywrightError:  # the context is closing; nothing to route any more
            return

    def _note(self, notes: list[str], text: str) -> None:
        """Add to `notes` (the notices or the blocked navigations) while they hold fewer
        than `_MAX_NOTES`; past that only count (a page may open dialogs in a loop)."""
        if len(notes) < _MAX_NOTES:
            notes.append(text)
        else:
            self._unshown += 1

    def drain_notices(self) -> list[str]:
        notices, self.notices = self.notices, []
        if self._unshown:
            notices.append(f"{self._unshown} more dialogs, tabs or blocked navigations")
            self._unshown = 0
        return notices

    def tabs_line(self) -> str | None:
        """`Tabs: [0] Shop | [1] Docs (current)` when more than one tab is open."""
        if len(self.pages) < 2:
            return None
        parts = []
        for index, page in enumerate(self.pages):
            mark = " (current)" if page is self.active else ""
            parts.append(f"[{index}] {shorten(page.url, 60)}{mark}")
        return "Tabs: " + " | ".join(parts)

    # ------------------------------------------------------------------ observing

    async def observe(
        self,
        config: ObservationConfig,
        *,
        error: str | None = None,
        count_tokens: TokenCounter = estimate_tokens,
        timeout_s: float | None = None,
    ) -> Observation:
        """The current tab rendered; `error` (the last action's) and notices go on top."""
        self._check_alive()
        await self._settle()
        snap = await snapshot(
            self.page, config, timeout_s=timeout_s or self.config.observation_timeout_s
        )
        # The header is built after the page answered: a dialog blocks the page's scripts
        # until it is dismissed, so its notice is in by now.
        header = [f"Error: {error}"] if error else []
        header += [f"Error: {blocked}" for blocked in self.blocked]
        self.blocked = []
        header += [f"Note: {notice}" for notice in self.drain_notices()]
        tabs = self.tabs_line()
        if tabs:
            header.append(tabs)
        self.observation = render(snap, config, header=header, count_tokens=count_tokens)
        return self.observation

    # ------------------------------------------------------------------ acting

    async def execute(self, action: Action, *, timeout_s: float | None = None) -> None:
        """Carry out `action` on the current tab; raises ActionError for the model.

        Without `timeout_s`, an element must become actionable within `action_timeout_s`
        and a navigation the action starts gets `navigation_timeout_s` on top; a caller's
        `timeout_s` bounds both together.
        """
        self._check_alive()
        limit = timeout_s or self.config.action_timeout_s
        navigation_ms = 0.0 if timeout_s else self.navigation_timeout_ms
        # The outer scope also bounds calls that have no Playwright timeout of their own.
        bound = limit + 2 * navigation_ms / 1000 + self.config.observation_timeout_s
        with anyio.move_on_after(bound) as scope:
            await perform(self, action, ms=limit * 1000, navigation_ms=navigation_ms)
        if scope.cancelled_caught:
            raise ActionError(f"{format_action(action)} did not finish within {bound:g} s")
        await self._police_tabs()

    async def navigate(self, page: Page, url: str, *, action: bool = False) -> None:
        with playwright_errors(f"go to {shorten(url, 100)}", action=action):
            await page.goto(url, wait_until="load", timeout=self.navigation_timeout_ms)

    # ------------------------------------------------------------------ housekeeping

    @property
    def navigation_timeout_ms(self) -> float:
        return self.config.navigation_timeout_s * 1000

    def expect_tab(self) -> anyio.Event:
        """An event set when the next tab joins the episode (after a click that opens one)."""
        self._new_page = anyio.Event()
        return self._new_page

    def _check_alive(self) -> None:
        if self._gone.is_set():
            raise BrowserError("the browser context closed (Chromium died or was closed)")
        if self._crashed:
            raise BrowserError("the page crashed")
        if not self.pages:
            raise BrowserError("every tab of the episode is closed")

    async def _settle(self) -> None:
        """Let a navigation that an action started finish loading (bounded, never fails).

        Waiting for its request to end also lets a navigation that turned into a download
        report the refused download before the page is observed."""
        page = self.page
        with anyio.move_on_after(self.config.navigation_timeout_s):
            while self._navigations:
                await self._navigation_ended.wait()
        if self._download is not None:
            with anyio.move_on_after(_DOWNLOAD_GRACE_S):
                await self._download.wait()
            self._download = None
        with anyio.move_on_after(self.config.navigation_timeout_s):
            try:
                await page.wait_for_load_state("load", timeout=self.navigation_timeout_ms)
            except PlaywrightError as exc:
                if "closed" in str(exc) or type(exc).__name__ == "TargetClosedError":
                    raise BrowserError(f"the page closed: {exc}") from exc

    async def _police_tabs(self) -> None:
        """Undo blocked navigations; close or send back tabs outside the allowlist."""
        blocked, self._blocked_pages = self._blocked_pages, []
        for page in dict.fromkeys(blocked):
            if page.is_closed():
                continue
            await self._undo_blocked(page)
        for page in list(self.pages):
            url = page.url
            if (
                _is_safe_idle(url)
                or self.allowlist.allows(url)
                or url.startswith("chrome-error://")
            ):
                continue
            self._note(self.notices, f"the page {shorten(url, 100)} is not allowed and was closed")
            with playwright_errors("close a tab that left the allowlist", action=True):
                if len(self.pages) > 1:
                    await page.close()
                else:
                    await page.goto("about:blank")

    async def _undo_blocked(self, page: Page) -> None:
        """A tab whose navigation was aborted shows Chromium's error page: go back from it
        (or close the tab when it has nothing to go back to)."""
        with anyio.move_on_after(self.config.action_timeout_s):
            try:
                await page.wait_for_url(
                    lambda url: url.startswith("chrome-error://"),
                    timeout=self.navigation_timeout_ms,
                )
            except PlaywrightError:
                return
        if not page.url.startswith("chrome-error://"):
            return
        with playwright_errors("go back from a blocked navigation", action=True):
            response = await page.go_back(timeout=self.navigation_timeout_ms)
            if response is None and page.url.startswith("chrome-error://"):
                if len(self.pages) > 1:
                    await page.close()
                else:
                    await page.goto("about:blank")

    async def close(self) -> None:
        """Close the context (shielded and bounded: cleanup runs even when cancelled)."""
        with anyio.move_on_after(self.config.close_timeout_s, shield=True):
            try:
                await self.context.close()
            except PlaywrightError as exc:
                log.debug("session.close_failed", error=str(exc))
