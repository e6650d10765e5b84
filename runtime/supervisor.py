"""The policy server's supervisor: notices a dead or hung vLLM and brings it back.

    running ──(process exit, or `health_failures` /health misses in a row)──> down
       ^                                                                       |
       |   launched by us: stop the whole process group (engine core and       |
       |   workers included), start again on the same port, reload the         |
       |   resident adapters and verify them (/v1/models)                      |
       └── external (`policy.url`): wait until /health answers, reload <───────┘

While it is down `on_down(reason)` is called once (the daemon closes the rollouts' gate:
new turns wait, so no episode fails for want of a server), and `on_up()` once it is back.
Turns in flight when it died fail as `error:policy` (an infrastructure error the learner
never trains on). Each outage and each recovery is a `Fault` event (kinds
"policy_server" and "policy_server_recovered"); `statistics()` is what `/status` shows.
A restart that fails is retried with a growing pause (up to `_MAX_BACKOFF_S`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import msgspec
import structlog
from anyio.abc import TaskStatus

from policy.adapters import AdapterManager
from policy.client import CompletionClient
from policy.errors import PolicyError, RequestError, ServerExitedError
from policy.replicas import ReplicaSet
from policy.server import VLLMServer
from runtime.base.config import PolicyConfig
from runtime.base.messages import Event, Fault

__all__ = ["ServerState", "ServerSupervisor"]

log = structlog.get_logger("runtime.supervisor")

_MAX_BACKOFF_S = 30.0


async def _unless(stopping: anyio.Event, wait: Callable[[], Awaitable[None]]) -> bool:
    """`await wait()`, given up once `stopping` is set; True if it returned."""
    done = False
    async with anyio.create_task_group() as tg:

        async def waiting() -> None:
            nonlocal done
            await wait()
            done = True
            tg.cancel_scope.cancel()

        async def stop() -> None:
            await stopping.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(waiting)
        tg.start_soon(stop)
    return done


class ServerState(msgspec.Struct, frozen=True, kw_only=True):
    """What `ServerSupervisor.statistics()` reports."""

    state: str  # "up" | "down" (being restarted or awaited)
    managed: bool  # launched by us (restarted) or external (awaited)
    url: str
    reason: str  # why it is down; the last outage's reason once up again
    since: float  # wall time of the last change of state
    outages: int
    restarts: int
    recovery_s: list[float]  # each outage's time from detection to serving again


class ServerSupervisor:
    """Watches one server; `run()` in the owner's task group (see the module docstring)."""

    def __init__(
        self,
        config: PolicyConfig,
        *,
        server: VLLMServer,
        client: CompletionClient | ReplicaSet,
        adapters: AdapterManager,
        on_down: Callable[[str], None] | None = None,
        on_up: Callable[[], None] | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.config = config
        self.server = server
        self.client = client
        self.adapters = adapters
        self.on_down = on_down
        self.on_up = on_up
        self.on_event = on_event
        self._up = anyio.Event()
        self._up.set()
        self._down = anyio.Event()
        self._reason = ""
        self._since = time.time()
        self._outages = 0
        self._restarts = 0
        self._recovery: list[float] = []

    @property
    def is_up(self) -> bool:
        return self._up.is_set()

    async def wait_up(self) -> None:
        """Wait until the server serves (returns at once while it does)."""
        await self._up.wait()

    async def wait_down(self) -> None:
        """Wait until the supervisor has found the server down (returns at once while it is)."""
        await self._down.wait()

    async def publish(self, path: Path, *, stopping: anyio.Event) -> None:
        """`adapters.publish(path)` once the server serves; a publish that fails because it
        just went down is tried again once it is back. Given up (logged) when `stopping`
        is set while it is down: the learner's checkpoint holds the version, and the next
        start publishes it."""
        while True:
            if not self.is_up and not await _unless(stopping, self.wait_up):
                log.warning("policy.publish_skipped", adapter=path.name, reason="server down")
                return
            try:
                await self.adapters.publish(path)
                return
            except RequestError:
                if await self.check():
                    raise  # the server answers: not an outage
                log.warning("policy.publish_waits", adapter=path.name, reason="server down")
                await _unless(stopping, self.wait_down)

    async def check(self) -> bool:
        """True if the server answers /health now (one probe); False while it is down."""
        if not self._up.is_set():
            return False
        return await self.client.health(timeout_s=self.config.health_timeout_s)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch, and recover after each outage, until cancelled."""
        task_status.started()
        while True:
            reason = await self._wait_down()
            await self._recover(reason)

    # ------------------------------------------------------------------ watching

    async def _wait_down(self) -> str:
        """Return why the server is down: its process exited, or /health stopped answering."""
        found: list[str] = []
        async with anyio.create_task_group() as tg:

            async def exited() -> None:
                try:
                    await self.server.wait_exited()
                except ServerExitedError as exc:
                    found.append(str(exc))
                tg.cancel_scope.cancel()

            async def unhealthy() -> None:
                cfg = self.config
                misses = 0
                while misses < cfg.health_failures:
                    await anyio.sleep(cfg.health_interval_s)
                    healthy = await self.client.health(timeout_s=cfg.health_timeout_s)
                    misses = 0 if healthy else misses + 1
                found.append(
                    f"vLLM at {self.server.url} did not answer /health within "
                    f"{cfg.health_timeout_s:g} s, {misses} times in a row"
                )
                tg.cancel_scope.cancel()

            if self.server.managed:
                tg.start_soon(exited)
            tg.start_soon(unhealthy)
        return found[0]

    # ------------------------------------------------------------------ recovering

    async def _recover(self, reason: str) -> None:
        detected = time.monotonic()
        self._up = anyio.Event()
        self._down.set()
        self._reason = reason
        self._since = time.time()
        self._outages += 1
        managed = self.server.managed
        action = "restarting it" if managed else "rollouts wait until it is back"
        log.warning("policy.server_down", reason=reason, managed=managed)
        self._fault("policy_server", f"{reason}; {action}")
        if self.on_down is not None:
            self.on_down(reason)
        backoff = self.config.health_interval_s
        while True:
            try:
                if managed:
                    # Down already (or hung: deaf to SIGTERM): no graceful shutdown to wait for.
                    self.server.kill()
                    await self.server.restart()
                    self._restarts += 1
                else:
                    await self._wait_healthy()
                reloaded = await self.adapters.restore()  # verified against /v1/models
                break
            except PolicyError as exc:
                log.warning("policy.recovery_failed", error=str(exc), retry_in_s=backoff)
                self._fault("policy_server", f"recovery failed: {exc}; retrying in {backoff:g} s")
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
        took = time.monotonic() - detected
        self._recovery.append(took)
        self._since = time.time()
        self._down = anyio.Event()
        self._up.set()
        if self.on_up is not None:
            self.on_up()
        resident = self.adapters.statistics().resident
        log.info("policy.server_recovered", seconds=round(took, 2), reloaded=reloaded)
        self._fault(
            "policy_server_recovered",
            f"vLLM at {self.server.url} serves again after {took:.1f} s "
            f"({'restarted' if managed else 'it came back'}); adapters "
            f"{', '.join(resident) or 'none'} verified",
        )

    async def _wait_healthy(self) -> None:
        """An external server: wait until /health answers (probed every interval)."""
        cfg = self.config
        while True:
            if await self.client.health(timeout_s=cfg.health_timeout_s):
                return
            await anyio.sleep(cfg.health_interval_s)

    def _fault(self, kind: str, message: str) -> None:
        if self.on_event is not None:
            self.on_event(Fault(at=time.time(), kind=kind, message=message, where="policy.server"))

    def statistics(self) -> ServerState:
        return ServerState(
            state="up" if self._up.is_set() else "down",
            managed=self.server.managed,
            url=self.server.url,
            reason=self._reason,
            since=self._since,
            outages=self._outages,
            restarts=self._restarts,
            recovery_s=[round(s, 3) for s in self._recovery],
        )
