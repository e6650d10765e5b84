"""Chromium through Playwright: which binary, with which flags, and the pool of contexts.

Debian's `chromium-headless-shell` is preferred for episodes: on two cores it ran ~3x the
actions/s of full Chromium at a third of the memory per context (MACHINE_NOTES.md).
The real binaries are launched, not Debian's wrapper scripts on the PATH; with
`process_memory_mb` through a two-line script of our own (`limited`) that sets the memory
limit and execs the binary.
"""

from __future__ import annotations

import contextlib
import functools
import shlex
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog
from playwright.async_api import Browser, BrowserContext, Playwright, async_playwright
from playwright.async_api import Error as PlaywrightError

from runtime.base.config import BrowserConfig
from runtime.base.messages import Event, Fault
from runtime.errors import BrowserError, playwright_errors
from runtime.fence import Allowlist, AllowlistError, Fence
from runtime.session import BrowserSession, call_until_gone

__all__ = ["CHROMIUM_ARGS", "BrowserPool", "PoolStatistics", "find_chromium", "limited"]

log = structlog.get_logger("runtime.browser")

# Flags that keep Chromium from calling out (this machine has no network, and a closed
# network makes every background request fail), past the fence, and from using the GPU.
CHROMIUM_ARGS: tuple[str, ...] = (
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-default-apps",
    "--mute-audio",
    # WebRTC's UDP does not go through the context's proxy (the fence): without this a
    # page's RTCPeerConnection sent STUN requests to any host and port it named.
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
)

_CANDIDATES: tuple[str, ...] = (
    "/usr/lib/chromium/chromium-headless-shell",
    "/usr/lib/chromium/chromium",
)


def find_chromium(configured: str = "") -> str | None:
    """The Chromium binary to launch: the configured one, else Debian's, else None.

    None means "let Playwright use its own download", which exists only where
    `playwright install` could run.
    """
    if configured:
        if not Path(configured).is_file():
            raise FileNotFoundError(f"browser.executable_path: no such file: {configured}")
        return configured
    for candidate in _CANDIDATES:
        if Path(candidate).is_file():
            return candidate
    return None


def limited(executable: str, memory_mb: int, folder: Path) -> str:
    """A script in `folder` that runs `executable` with its writable memory limited to
    `memory_mb` (RLIMIT_DATA, which every process Chromium starts inherits: each renderer
    has the limit of its own). A page that allocates past it gets allocation errors, or its
    tab crashes; the other tabs and the machine keep their memory."""
    script = folder / "chromium"
    script.write_text(
        f'#!/bin/sh\nulimit -d {memory_mb * 1024} || exit 1\nexec {shlex.quote(executable)} "$@"\n'
    )
    script.chmod(0o700)
    return str(script)


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """What `BrowserPool.statistics()` reports."""

    contexts_open: int
    contexts_waiting: int
    max_contexts: int
    launches: int
    crashes: int
    connected: bool


class BrowserPool:
    """One Chromium per process, one BrowserContext per episode, at most `max_contexts`.

    Use as `async with BrowserPool(config) as pool:` and `async with pool.session(...)`.
    When Chromium dies, every call of the sessions in flight raises `BrowserError` (their
    episodes end `error:browser`); the next `session()` relaunches it from the same
    Playwright object (~0.8 s here) and later episodes run.
    """

    def __init__(
        self,
        config: BrowserConfig,
        *,
        on_event: Callable[[Event], None] | None = None,
        denied: Iterable[tuple[str, int]] = (),
    ) -> None:
        self.config = config
        self.on_event = on_event
        # (host, port) pairs no session may reach (the daemon's API, the policy server).
        self.denied: tuple[tuple[str, int], ...] = tuple(denied)
        self._limiter = anyio.CapacityLimiter(config.max_contexts)
        self._launch_lock = anyio.Lock()
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._launches = 0
        self._crashes = 0
        # Set when the current browser disconnects (a fresh one for each launch).
        self._gone = anyio.Event()
        # Holds the launch script of `limited` while the pool runs.
        self._folder: tempfile.TemporaryDirectory[str] | None = None

    async def __aenter__(self) -> BrowserPool:
        with playwright_errors("start Playwright"):
            self._playwright = await async_playwright().start()
        started = False
        try:
            await self._ensure_browser()
            started = True
        finally:
            if not started:  # an error or a cancellation: leave nothing running
                await self._stop()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stop()

    async def _stop(self) -> None:
        with anyio.move_on_after(self.config.close_timeout_s * 2, shield=True):
            browser, self._browser = self._browser, None
            if browser is not None:
                with contextlib.suppress(PlaywrightError):
                    await browser.close()
            playwright, self._playwright = self._playwright, None
            if playwright is not None:
                with contextlib.suppress(PlaywrightError):
                    await playwright.stop()
        folder, self._folder = self._folder, None
        if folder is not None:
            folder.cleanup()

    def deny(self, url: str) -> None:
        """Make the origin of `url` (the policy server, the control API) unreachable for
        every session opened from now on; a URL without a port or host is ignored."""
        try:
            self.denied = (*self.denied, next(iter(Allowlist.from_urls([url]).origins)))
        except AllowlistError:
            log.warning("browser.deny_ignored", url=url)

    @property
    def contexts_open(self) -> int:
        """Contexts open now (a counter: safe to read from any thread)."""
        return int(self._limiter.borrowed_tokens)

    def statistics(self) -> PoolStatistics:
        limiter = self._limiter.statistics()
        return PoolStatistics(
            contexts_open=self.contexts_open,
            contexts_waiting=limiter.tasks_waiting,
            max_contexts=self.config.max_contexts,
            launches=self._launches,
            crashes=self._crashes,
            connected=self._browser is not None and self._browser.is_connected(),
        )

    async def _ensure_browser(self) -> Browser:
        """The running browser; launches (or relaunches) it when there is none."""
        async with self._launch_lock:
            browser = self._browser
            if browser is not None and browser.is_connected():
                return browser
            if self._playwright is None:
                raise BrowserError("the browser pool is not started (use `async with`)")
            args = [*CHROMIUM_ARGS, *self.config.extra_args]
            executable = find_chromium(self.config.executable_path)
            if self.config.process_memory_mb:
                if self._folder is None:
                    self._folder = tempfile.TemporaryDirectory(prefix="webagent-chromium-")
                executable = limited(
                    executable or self._playwright.chromium.executable_path,
                    self.config.process_memory_mb,
                    Path(self._folder.name),
                )
            try:
                with playwright_errors("launch Chromium"):
                    # Chromium runs in its own process group; with these off, a Ctrl-C or
                    # SIGTERM to our process group does not close it under running episodes:
                    # the daemon drains them and closes the browser itself.
                    browser = await self._playwright.chromium.launch(
                        executable_path=executable,
                        args=args,
                        headless=self.config.headless,
                        handle_sigint=False,
                        handle_sigterm=False,
                        handle_sighup=False,
                    )
            except BrowserError as exc:
                # A browser that dies while it starts never connects, so it never
                # disconnects either: the failed launch is the fault (the next episode
                # launches again).
                self._fault(f"Chromium failed to launch: {exc}")
                raise
            browser.on("disconnected", self._on_disconnected)
            self._browser = browser
            self._gone = anyio.Event()
            self._launches += 1
            if self._launches > 1:
                log.warning("browser.relaunched", launches=self._launches, crashes=self._crashes)
            return browser

    def _on_disconnected(self, browser: Browser) -> None:
        if browser is self._browser:
            self._gone.set()
            self._crashes += 1
            log.warning("browser.disconnected", crashes=self._crashes)
            self._fault("Chromium disconnected; it is relaunched for the next episode")

    def _fault(self, message: str) -> None:
        if self.on_event is not None:
            self.on_event(
                Fault(at=time.time(), kind="browser", message=message, where="runtime.browser")
            )

    @asynccontextmanager
    async def session(
        self,
        *,
        allowed: Sequence[str],
        cookies: Sequence[dict[str, Any]] = (),
        denied: Iterable[tuple[str, int]] = (),
    ) -> AsyncIterator[BrowserSession]:
        """A fresh context limited to the origins of the URLs in `allowed`.

        Every entry of `allowed` names its port (a URL, or `host:port`): anything else is
        an `AllowlistError`. `denied` (host, port) pairs are never reachable, even when
        `allowed` names them (the daemon's own API, the policy server); the pool's own
        `denied` always apply. The context reaches the network only through its own
        `Fence` (a proxy that checks every request). `cookies` are Playwright cookie dicts
        (a site tenant's cookie, for instance). Waits for a free slot when `max_contexts`
        contexts are open.
        """
        allowlist = Allowlist.from_urls(allowed, denied=[*self.denied, *denied])
        async with (
            self._limiter,
            Fence(allowlist, connect_timeout_s=self.config.navigation_timeout_s) as fence,
        ):
            context = await self._new_context(fence.url)
            session = BrowserSession(context, self.config, allowlist)
            try:
                await session.start()
                if cookies:
                    with playwright_errors("set cookies"):
                        await context.add_cookies(list(cookies))  # type: ignore[arg-type]
                yield session
            finally:
                await session.close()

    async def _new_context(self, proxy: str) -> BrowserContext:
        # A browser that died between the check and the call is relaunched once.
        for attempt in range(2):
            browser = await self._ensure_browser()
            gone = self._gone
            try:
                return await call_until_gone(
                    functools.partial(
                        browser.new_context,
                        viewport={
                            "width": self.config.viewport_width,
                            "height": self.config.viewport_height,
                        },
                        accept_downloads=False,
                        service_workers="block",
                        proxy={"server": proxy},
                    ),
                    gone,
                    what="open a browser context",
                    timeout_s=self.config.navigation_timeout_s,
                )
            except BrowserError:
                if attempt == 1 or browser.is_connected():
                    raise
        raise BrowserError("could not open a browser context")  # pragma: no cover
