"""A pool of self-hosted WebArena instances, leased per episode, reset between writers.

A WebArena instance (one set of the sites' containers) has one shared state: an episode
that places an order changes what the next episode sees. The reference implementations
run the rollouts of a group side by side on one instance and never reset it between
them, so later rollouts are scored on a state earlier ones changed. This pool does not:

- A **state-changing** episode (`exclusive=True`: `require_reset`, or checked by
  `program_html`; `sites.webarena.changes_state`) holds an instance alone, and that
  instance is reset right before it, unless nothing changed it since its last reset
  ("fresh"). With fewer instances than the group's size, the group's episodes are
  spread over the instances and queue for them.
- A **read-only** episode shares an instance with other read-only episodes (up to the
  instance's `max_episodes`) without a reset. It avoids instances a writer changed since
  their last reset ("dirty"): it takes a clean one, or resets an idle dirty one, and only
  reads a dirty one when that instance has no reset hook (counted as `dirty_reads`).
- Waiting is first come, first served, with writers first: once a state-changing
  request waits, later read-only requests wait behind it, so writers are not starved.
- A reset that fails or times out takes the instance out of the pool (logged, counted
  and listed with its error in `statistics().failed`) and the waiting episode tries
  another instance. With no instance left, every request fails with `NoInstanceError`:
  episodes end with an error instead of being scored on a state nobody reset.
- An instance without a reset hook runs state-changing episodes on whatever state it
  has (logged as a warning and counted as `unreset_exclusive`): the user's choice.

Reset hooks: `HttpResetter` speaks the reset-server protocol of the WebArena setup
scripts (`GET /reset` answers 200, or 418 when a reset is already running; `GET /status`
answers "Reset ongoing", "Ready for duty!" or a 500 "Error executing reset script"),
polling every `poll_s` within `timeout_s`; `CommandResetter` runs a shell command in its
own process group (killed as a group on timeout) and needs exit status 0. Both then wait
until every site URL of the instance answers (status < 500). httpx and subprocess
failures become `ResetError` here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from subprocess import PIPE, STDOUT
from typing import Any, Literal, Protocol

import anyio
import httpx
import structlog

from sites.errors import NoInstanceError, ResetError

__all__ = [
    "CommandResetter",
    "HttpResetter",
    "Instance",
    "InstancePool",
    "Lease",
    "PoolStatistics",
    "Resetter",
    "wait_sites",
]

log = structlog.get_logger("sites.pool")

_TAIL_BYTES = 2000


class Resetter(Protocol):
    """Brings an instance back to its initial state; raises ResetError when it cannot."""

    def describe(self) -> str: ...

    async def reset(self) -> None: ...


async def wait_sites(client: httpx.AsyncClient, urls: Sequence[str], poll_s: float) -> None:
    """Wait until each URL answers with a status below 500 (the caller bounds the time)."""
    for url in urls:
        while True:
            try:
                response = await client.get(url, follow_redirects=False)
                if response.status_code < 500:
                    break
            except httpx.HTTPError:
                pass  # not up yet: a refused connection is what a restarting site gives
            await anyio.sleep(poll_s)


class HttpResetter:
    """`GET {url}/reset`, then `GET {url}/status` every `poll_s` until ready."""

    def __init__(
        self,
        instance: str,
        url: str,
        client: httpx.AsyncClient,
        *,
        timeout_s: float = 900.0,
        poll_s: float = 5.0,
        site_urls: Sequence[str] = (),
    ) -> None:
        self.instance = instance
        self.url = url.rstrip("/")
        self.client = client
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.site_urls = list(site_urls)
        self._last = ""

    def describe(self) -> str:
        return f"reset server {self.url}"

    async def reset(self) -> None:
        self._last = "no answer yet"
        try:
            with anyio.fail_after(self.timeout_s):
                await self._start()
                await self._wait_ready()
                self._last = "reset done; waiting for the sites"
                await wait_sites(self.client, self.site_urls, self.poll_s)
        except TimeoutError as exc:
            raise ResetError(
                self.instance,
                f"{self.describe()}: not ready within {self.timeout_s:g} s (last: {self._last})",
            ) from exc

    async def _start(self) -> None:
        try:
            response = await self.client.get(f"{self.url}/reset")
        except httpx.HTTPError as exc:
            raise ResetError(
                self.instance, f"cannot reach {self.url}/reset ({type(exc).__name__}: {exc})"
            ) from exc
        if response.status_code not in (200, 418):  # 418: a reset is already running
            raise ResetError(
                self.instance,
                f"GET {self.url}/reset answered {response.status_code}: {response.text[:300]!r}",
            )

    async def _wait_ready(self) -> None:
        while True:
            try:
                response = await self.client.get(f"{self.url}/status")
            except httpx.HTTPError as exc:  # the reset server may be busy or restarting
                self._last = f"{type(exc).__name__}: {exc}"
            else:
                text = response.text.strip()
                self._last = f"{response.status_code} {text[:200]!r}"
                lowered = text.lower()
                if response.status_code >= 500 or "error" in lowered or "fail" in lowered:
                    raise ResetError(
                        self.instance, f"{self.url}/status reports a failed reset: {self._last}"
                    )
                if response.status_code == 200 and "ready" in lowered:
                    return
            await anyio.sleep(self.poll_s)


class CommandResetter:
    """A shell command that resets the instance and exits 0, in its own process group."""

    def __init__(
        self,
        instance: str,
        command: str,
        *,
        timeout_s: float = 900.0,
        poll_s: float = 5.0,
        client: httpx.AsyncClient | None = None,
        site_urls: Sequence[str] = (),
    ) -> None:
        self.instance = instance
        self.command = command
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.client = client
        self.site_urls = list(site_urls)

    def describe(self) -> str:
        return f"command {self.command!r}"

    async def reset(self) -> None:
        try:
            with anyio.fail_after(self.timeout_s):
                await self._run()
                if self.client is not None:
                    await wait_sites(self.client, self.site_urls, self.poll_s)
        except TimeoutError as exc:
            raise ResetError(
                self.instance, f"{self.describe()} did not finish within {self.timeout_s:g} s"
            ) from exc

    async def _run(self) -> None:
        try:
            process = await anyio.open_process(
                self.command, stdout=PIPE, stderr=STDOUT, start_new_session=True
            )
        except OSError as exc:
            raise ResetError(self.instance, f"cannot start {self.describe()}: {exc}") from exc
        tail = bytearray()
        try:
            assert process.stdout is not None
            async for chunk in process.stdout:
                tail += chunk
                del tail[:-_TAIL_BYTES]
            code = await process.wait()
        finally:
            if process.returncode is None:  # cancelled or timed out: kill the whole group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                with anyio.CancelScope(shield=True):
                    await process.wait()
            with anyio.CancelScope(shield=True):
                await process.aclose()
        if code != 0:
            output = tail.decode("utf-8", errors="replace").strip()
            raise ResetError(
                self.instance, f"{self.describe()} exited with status {code}: {output[-500:]!r}"
            )


def _no_cookies() -> list[dict[str, Any]]:
    return []


@dataclass(frozen=True, slots=True)
class Instance:
    """One WebArena instance: its site URLs (by WebArena name) and how to reset it.

    `cookies()` gives cookies every browser context on this instance starts with (none
    for WebArena; the built-in sites served as an instance need their tenant cookie).
    """

    name: str
    urls: Mapping[str, str]
    resetter: Resetter | None = None
    max_episodes: int = 32
    cookies: Callable[[], list[dict[str, Any]]] = _no_cookies


@dataclass(frozen=True, slots=True)
class Lease:
    """An episode's hold on an instance, and what getting it cost."""

    instance: str
    urls: dict[str, str]
    exclusive: bool
    reset: bool
    reset_s: float
    wait_s: float
    dirty: bool
    cookies: list[dict[str, Any]]

    @property
    def policy(self) -> str:
        """ "exclusive-reset", "exclusive-fresh", "exclusive-unreset", "shared" or
        "shared-dirty": how this episode got its instance."""
        if self.exclusive:
            return (
                "exclusive-reset"
                if self.reset
                else ("exclusive-unreset" if self.dirty else "exclusive-fresh")
            )
        return "shared-dirty" if self.dirty else "shared"


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """What `InstancePool.statistics()` reports."""

    instances: int
    healthy: int
    failed: dict[str, str]
    waiting: int
    readers: dict[str, int]
    exclusive: list[str]
    resetting: list[str]
    leases_shared: int
    leases_exclusive: int
    resets: int
    reset_failures: int
    reset_s: float
    wait_s: float
    unreset_exclusive: int
    dirty_reads: int


_State = Literal["unknown", "fresh", "dirty"]


@dataclass(eq=False, slots=True)
class _Slot:
    instance: Instance
    index: int
    readers: int = 0
    exclusive: bool = False
    resetting: bool = False
    state: _State = "unknown"
    error: str = ""

    @property
    def idle(self) -> bool:
        return not self.readers and not self.exclusive and not self.resetting


@dataclass(eq=False, slots=True)
class _Request:
    exclusive: bool
    event: anyio.Event = field(default_factory=anyio.Event)
    slot: _Slot | None = None
    reset: bool = False
    dirty: bool = False
    error: Exception | None = None


class InstancePool:
    """Leases instances to episodes (see the module docstring for the policy).

    `on_reset(name)` is called after each successful reset (the auth layer re-checks the
    instance's storage states then).
    """

    def __init__(
        self,
        instances: Sequence[Instance],
        *,
        on_reset: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not instances:
            raise ValueError("an instance pool needs at least one instance")
        names = [i.name for i in instances]
        if len(set(names)) != len(names):
            raise ValueError(f"instance names must be unique: {names}")
        self._slots = [_Slot(instance, index) for index, instance in enumerate(instances)]
        self._queue: deque[_Request] = deque()
        self._on_reset = on_reset
        self._clock = clock
        self._counts = {
            "leases_shared": 0,
            "leases_exclusive": 0,
            "resets": 0,
            "reset_failures": 0,
            "unreset_exclusive": 0,
            "dirty_reads": 0,
        }
        self._reset_s = 0.0
        self._wait_s = 0.0
        self._queued = anyio.Event()

    @property
    def instances(self) -> list[Instance]:
        return [slot.instance for slot in self._slots]

    def healthy(self) -> list[Instance]:
        return [slot.instance for slot in self._slots if not slot.error]

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            instances=len(self._slots),
            healthy=sum(1 for s in self._slots if not s.error),
            failed={s.instance.name: s.error for s in self._slots if s.error},
            waiting=len(self._queue),
            readers={s.instance.name: s.readers for s in self._slots},
            exclusive=[s.instance.name for s in self._slots if s.exclusive],
            resetting=[s.instance.name for s in self._slots if s.resetting],
            reset_s=self._reset_s,
            wait_s=self._wait_s,
            **self._counts,
        )

    async def wait_queued(self, count: int = 1) -> None:
        """Wait until at least `count` requests wait for an instance."""
        while len(self._queue) < count:
            await self._queued.wait()

    # ------------------------------------------------------------------ leasing

    @asynccontextmanager
    async def lease(self, *, exclusive: bool) -> AsyncIterator[Lease]:
        """Hold an instance for one episode: alone (`exclusive`) or shared."""
        lease, slot = await self._acquire(exclusive)
        self._counts["leases_exclusive" if exclusive else "leases_shared"] += 1
        self._wait_s += lease.wait_s
        log.info(
            "webarena.lease",
            instance=lease.instance,
            policy=lease.policy,
            reset_s=round(lease.reset_s, 3),
            wait_s=round(lease.wait_s, 3),
        )
        try:
            yield lease
        finally:
            if exclusive:
                slot.exclusive = False
            else:
                slot.readers -= 1
            self._dispatch()

    async def _acquire(self, exclusive: bool) -> tuple[Lease, _Slot]:
        started = self._clock()
        reset_s = 0.0
        retry = False
        while True:
            request = _Request(exclusive)
            if retry:
                self._queue.appendleft(request)
            else:
                self._queue.append(request)
            self._dispatch()
            if request in self._queue:  # it waits: wake `wait_queued`
                self._queued.set()
                self._queued = anyio.Event()
            await self._wait_granted(request)
            if request.error is not None:
                raise request.error
            slot = request.slot
            assert slot is not None
            if not request.reset:
                break
            t0 = self._clock()
            try:
                done = await self._reset(slot)
            finally:
                reset_s += self._clock() - t0
            if done:
                if exclusive:
                    slot.exclusive = True
                    slot.state = "dirty"
                else:
                    slot.readers += 1
                self._dispatch()  # readers waiting may join the fresh instance
                break
            retry = True
        wait_s = max(0.0, self._clock() - started - reset_s)
        lease = Lease(
            instance=slot.instance.name,
            urls=dict(slot.instance.urls),
            exclusive=exclusive,
            reset=request.reset,
            reset_s=reset_s,
            wait_s=wait_s,
            dirty=request.dirty,
            cookies=list(slot.instance.cookies()),
        )
        return lease, slot

    async def _wait_granted(self, request: _Request) -> None:
        granted = False
        try:
            await request.event.wait()
            granted = True
        finally:
            if not granted:  # cancelled while waiting (or just after being granted)
                if request in self._queue:
                    self._queue.remove(request)
                elif request.slot is not None:
                    slot = request.slot
                    if request.reset:
                        slot.resetting = False
                    elif request.exclusive:
                        slot.exclusive = False
                    else:
                        slot.readers -= 1
                self._dispatch()

    async def _reset(self, slot: _Slot) -> bool:
        """Reset a slot granted for resetting; False (slot failed) when the reset failed."""
        resetter = slot.instance.resetter
        assert resetter is not None
        name = slot.instance.name
        t0 = self._clock()
        outcome = "cancelled"
        try:
            await resetter.reset()
            outcome = "done"
        except ResetError as exc:
            outcome = "failed"
            slot.error = str(exc)
            self._counts["reset_failures"] += 1
            log.error(
                "webarena.instance_failed",
                instance=name,
                error=str(exc),
                healthy=sum(1 for s in self._slots if not s.error),
            )
        finally:
            seconds = self._clock() - t0
            self._reset_s += seconds
            slot.resetting = False
            if outcome == "cancelled":
                slot.state = "dirty"  # a reset cut short leaves an unknown state
                self._dispatch()
        if outcome == "failed":
            self._dispatch()
            return False
        slot.state = "fresh"
        self._counts["resets"] += 1
        log.info("webarena.reset", instance=name, seconds=round(seconds, 3))
        if self._on_reset is not None:
            self._on_reset(name)
        return True

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self) -> None:
        """Grant what can be granted, first come first served, writers first."""
        if not any(not slot.error for slot in self._slots):
            failures = "; ".join(f"{s.instance.name}: {s.error}" for s in self._slots)
            while self._queue:
                request = self._queue.popleft()
                request.error = NoInstanceError(
                    f"no WebArena instance is left in the pool ({failures})"
                )
                request.event.set()
            return
        writer_waiting = False
        for request in list(self._queue):
            if request.exclusive:
                slot = self._pick_exclusive()
                if slot is None:
                    writer_waiting = True
                    continue
                if slot.instance.resetter is not None and slot.state != "fresh":
                    self._grant(request, slot, reset=True)
                else:
                    if slot.instance.resetter is None:
                        request.dirty = True
                        self._counts["unreset_exclusive"] += 1
                        log.warning(
                            "webarena.unreset_exclusive",
                            instance=slot.instance.name,
                            hint="this instance has no reset hook; a state-changing task "
                            "runs on whatever state earlier episodes left",
                        )
                    self._grant(request, slot, reset=False)
            elif not writer_waiting:
                picked = self._pick_shared()
                if picked is not None:
                    slot, reset, dirty = picked
                    request.dirty = dirty
                    if dirty:
                        self._counts["dirty_reads"] += 1
                    self._grant(request, slot, reset=reset)

    def _grant(self, request: _Request, slot: _Slot, *, reset: bool) -> None:
        self._queue.remove(request)
        request.slot = slot
        request.reset = reset
        if reset:
            slot.resetting = True
        elif request.exclusive:
            slot.exclusive = True
            slot.state = "dirty"
        else:
            slot.readers += 1
        request.event.set()

    def _pick_exclusive(self) -> _Slot | None:
        idle = [s for s in self._slots if not s.error and s.idle]
        if not idle:
            return None
        return min(
            idle,
            key=lambda s: (
                s.state != "fresh",
                s.instance.resetter is None,
                s.state == "dirty",
                s.index,
            ),
        )

    def _pick_shared(self) -> tuple[_Slot, bool, bool] | None:
        """(slot, reset first, dirty read) for a read-only episode, or None to wait."""
        open_ = [
            s
            for s in self._slots
            if not s.error
            and not s.exclusive
            and not s.resetting
            and s.readers < s.instance.max_episodes
        ]
        clean = [s for s in open_ if s.state != "dirty"]
        if clean:
            return min(clean, key=lambda s: (s.readers, s.index)), False, False
        resettable = [s for s in open_ if s.idle and s.instance.resetter is not None]
        if resettable:
            return min(resettable, key=lambda s: s.index), True, False
        unresettable = [s for s in open_ if s.instance.resetter is None]
        if unresettable:
            return min(unresettable, key=lambda s: (s.readers, s.index)), False, True
        return None
