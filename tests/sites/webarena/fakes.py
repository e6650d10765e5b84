"""What the WebArena tests run against instead of real WebArena (loaded by the conftests).

- `FakeResetServer`: a reset server on 127.0.0.1 speaking the protocol of the WebArena
  setup scripts' reset server (`GET /reset`: 200 "Reset initiated", 418 when one runs;
  `GET /status`: "Reset ongoing", "Ready for duty!", or 500 "Error executing reset
  script"). Modes: "ok" (ready `delay_s` after /reset: "slow" with a delay), "failing"
  (the reset script fails), "hanging" (never ready: times out), "refusing" (/reset 500).
- `BuiltinInstance`: the built-in sites served as one WebArena instance: one tenant is
  the instance's shared state (its cookie goes with every context), and a reset replaces
  it with a fresh tenant: the seeded data again, every login session gone. Several
  instances share the same servers with different tenants.
- `BUILTIN_ACCOUNTS`: `sites.accounts` for the built-in sites' login forms (their
  `/login` pages with `username`/`password` fields and a "Log In" button) and accounts.
- `serve_app`: any ASGI app on 127.0.0.1 in this event loop.
- `as_webarena(task)`: a built-in task as a WebArena file holds it, with a storage state
  named after its sites when it requires login.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import anyio
import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from runtime.base.config import WebArenaAccountConfig
from runtime.base.messages import TaskConfig
from sites.builtin import TENANT_COOKIE, BuiltinSites
from sites.pool import Instance, Resetter

_LOGIN = {
    "login_path": "/login",
    "username_field": "css:input[name=username]",
    "password_field": "css:input[name=password]",
    "submit": "role:button:Log In",
}

BUILTIN_ACCOUNTS: dict[str, WebArenaAccountConfig] = {
    "shopping": WebArenaAccountConfig(
        username="emma.lopez@example.com", check_path="/account", **_LOGIN
    ),
    "shopping_admin": WebArenaAccountConfig(check_path="/orders", **_LOGIN),
    "reddit": WebArenaAccountConfig(
        username="MarvelsGrandpa17", check_path="/subscriptions", **_LOGIN
    ),
    "gitlab": WebArenaAccountConfig(
        check_path="/", check_keyword="Signed in as byteblaze", **_LOGIN
    ),
}


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = anyio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


@contextlib.asynccontextmanager
async def serve_app(app: Any) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 (a free port) in this event loop; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = _Server(
        uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, ws="none")
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(10):
                await server.ready.wait()
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


class FakeResetServer:
    """A reset server for one instance; `on_reset` runs when a reset completes."""

    def __init__(
        self,
        *,
        mode: str = "ok",
        delay_s: float = 0.0,
        on_reset: Callable[[], None] | None = None,
    ) -> None:
        assert mode in ("ok", "failing", "hanging", "refusing"), mode
        self.mode = mode
        self.delay_s = delay_s
        self.on_reset = on_reset
        self.reset_requests = 0
        self.status_requests = 0
        self.completed = 0
        self.started = anyio.Event()  # set by the first /reset
        self._running_since: float | None = None
        self._failure = ""
        self.app = Starlette(
            routes=[
                Route("/reset", self._reset, methods=["GET"]),
                Route("/status", self._status, methods=["GET"]),
            ]
        )

    async def _reset(self, request: Request) -> Response:
        self.reset_requests += 1
        if self.mode == "refusing":
            return PlainTextResponse("Internal error: docker is not running", status_code=500)
        if self._running_since is not None:
            return PlainTextResponse("Reset already running", status_code=418)
        self._running_since = time.monotonic()
        self._failure = ""
        self.started.set()
        return PlainTextResponse('Reset initiated, check status <a href="/status">here</a>')

    async def _status(self, request: Request) -> Response:
        self.status_requests += 1
        since = self._running_since
        if (
            since is not None
            and self.mode != "hanging"
            and time.monotonic() - since >= self.delay_s
        ):
            self._running_since = None
            if self.mode == "failing":
                self._failure = "Command 'bash reset.sh' returned non-zero exit status 1."
            else:
                self.completed += 1
                if self.on_reset is not None:
                    self.on_reset()
        if self._running_since is not None:
            return PlainTextResponse("Reset ongoing")
        if self._failure:
            return PlainTextResponse(
                f"Error executing reset script:<p>{self._failure}</p>", status_code=500
            )
        return PlainTextResponse("Ready for duty!")


class BuiltinInstance:
    """The built-in sites as one WebArena instance (one tenant = the shared state)."""

    def __init__(self, sites: BuiltinSites, name: str) -> None:
        self.sites = sites
        self.name = name
        self.tenant = sites.create_tenant()
        self.resets = 0

    @property
    def urls(self) -> dict[str, str]:
        return dict(self.sites.urls)

    def cookies(self) -> list[dict[str, Any]]:
        host = urlsplit(self.sites.urls["SHOPPING"]).hostname or "127.0.0.1"
        return [{"name": TENANT_COOKIE, "value": self.tenant, "domain": host, "path": "/"}]

    def reset(self) -> None:
        """Back to the seeded data with nobody logged in (what a WebArena reset does)."""
        self.sites.drop_tenant(self.tenant)
        self.tenant = self.sites.create_tenant()
        self.resets += 1

    def log_out_everywhere(self) -> None:
        """Expire every login session of this instance (what a session timeout does)."""
        tenant = self.sites.tenants.lookup(self.tenant)
        assert tenant is not None
        tenant.sessions.clear()

    def instance(self, resetter: Resetter | None = None, *, max_episodes: int = 32) -> Instance:
        return Instance(
            name=self.name,
            urls=self.urls,
            resetter=resetter,
            max_episodes=max_episodes,
            cookies=self.cookies,
        )


def as_webarena(task: TaskConfig, *, sites: Sequence[str] | None = None) -> TaskConfig:
    """The task with `sites` (default: its own) and WebArena's storage-state name."""
    names = list(sites or task.sites)
    state = None
    if task.require_login is True:
        state = "./.auth/" + ".".join(sorted(names)) + "_state.json"
    return msgspec.structs.replace(task, sites=names, storage_state=state)
