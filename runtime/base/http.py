"""Serve an ASGI app in-process: uvicorn inside the caller's event loop.

`serve_asgi` is the one embedded HTTP server of the project (the control API, the agent
endpoint, the built-in sites): it yields the URL once uvicorn has started, and uvicorn's
own signal handling is switched off: the process that embeds it (the daemon, a test)
owns signals.

`listen_socket` is the one way this project opens a listening TCP socket (the API and the
built-in sites): it names IPPROTO_TCP, so asyncio sets TCP_NODELAY on every accepted
socket (with proto 0 each keep-alive response waits ~40 ms for Nagle's delayed ACK).

`serve_asgi` also bounds what a client can hold before the app sees a request
(`HttpLimits`): the request head's size (431-free: h11 answers 400 and closes), the time
to send a complete head (`header_timeout_s`, from connect or from the previous response),
idle keep-alive time, and the number of open connections: when a new connection would pass
`max_connections`, the oldest one still waiting for its request head is closed, so a flood
of half-open connections costs no file descriptors beyond the limit and a fresh request
(`/healthz`) still gets through. Dropped connections are counted, not logged one by one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HttpLimits", "ServerStats", "free_port", "listen_socket", "serve_asgi"]


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PORT = 20000


def free_port(host: str = "127.0.0.1", *, attempts: int = 200) -> int:
    """A port free on `host` now, for a server that binds it later (and again on restart).

    Chosen below the kernel's ephemeral range: a port from `bind(0)` lies inside it, so any
    outgoing connection (a browser, an HTTP client, vLLM's own sockets) may take it before
    the server binds, and the server fails with "Address already in use". Falls back to
    `bind(0)` where the range is unknown or leaves no room below it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = _LOWEST_PORT
    candidates = list(range(_LOWEST_PORT, low))
    random.shuffle(candidates)
    for port in [*candidates[:attempts], 0]:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            bound: int = sock.getsockname()[1]
            return bound
    raise OSError(f"no free port on {host}")


def listen_socket(host: str, port: int, *, backlog: int = 2048) -> socket.socket:
    """A bound, listening, non-blocking TCP socket on host:port (0: any free port).

    IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only when the
    listening socket says TCP. Raises OSError when the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one client may hold before (and between) requests; see the module docstring."""

    max_header_bytes: int = 16 * 1024
    header_timeout_s: float = 10.0
    keep_alive_s: int = 5
    max_connections: int = 512


@dataclass(slots=True)
class ServerStats:
    """Counters of one server: connections closed by the limits."""

    header_timeouts: int = 0
    evicted: int = 0
    waiting: dict[Any, None] = field(default_factory=dict)  # connections without a head yet


def _protocol_class(limits: HttpLimits, stats: ServerStats) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a request-head deadline and a connection cap."""
    quiet = logging.getLogger("runtime.base.http.uvicorn")
    quiet.setLevel(logging.ERROR)  # "Invalid HTTP request" per bad client: counted by h11 400s

    class _Limited(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self.logger = quiet
            if len(self.connections) >= limits.max_connections and stats.waiting:
                oldest = next(iter(stats.waiting))
                stats.evicted += 1
                oldest._close_waiting()
            super().connection_made(transport)
            self._wait_for_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_received()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:
                self._head_received()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._wait_for_head()

        def _wait_for_head(self) -> None:
            self._head_received()
            stats.waiting[self] = None
            self._head_timer = self.loop.call_later(limits.header_timeout_s, self._head_late)

        def _head_received(self) -> None:
            stats.waiting.pop(self, None)
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            stats.header_timeouts += 1
            self._close_waiting()

        def _close_waiting(self) -> None:
            self._head_received()
            if not self.transport.is_closing():
                self.transport.close()

    return _Limited


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signals alone (the owning process handles them) and
    says when it has started."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = anyio.Event()

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


_GUARDED = HttpLimits()


@asynccontextmanager
async def serve_asgi(
    app: ASGIApp,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    graceful_s: float = 5.0,
    startup_s: float = 30.0,
    limits: HttpLimits | None = _GUARDED,
    stats: ServerStats | None = None,
    name: str = "http",
    sock: socket.socket | None = None,
) -> AsyncIterator[str]:
    """Serve `app` on host:port (0 = a free port) until the block exits; yields the URL
    once the server has started (TimeoutError after `startup_s`).

    `limits` (default `HttpLimits()`) bounds what a client may hold, on uvicorn's h11
    protocol; None serves with uvicorn's own protocol (httptools where installed) and no
    bounds, for servers that only this process's own browsers reach (the built-in sites).
    `stats`, when given, is kept up to date. OSError when the address cannot be bound.
    `sock`, when given, is a listening socket served instead of binding host:port (closed
    at the end; a benchmark compares sockets with it).
    """
    sock = sock if sock is not None else listen_socket(host, port)
    bound_port = sock.getsockname()[1]
    guarded: dict[str, Any] = {}
    if limits is not None:
        guarded = {
            "http": _protocol_class(limits, stats if stats is not None else ServerStats()),
            "h11_max_incomplete_event_size": limits.max_header_bytes,
            "timeout_keep_alive": limits.keep_alive_s,
        }
    config = uvicorn.Config(
        app,
        ws="none",
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=int(max(1, round(graceful_s))),
        **guarded,
    )
    server = _EmbeddedServer(config)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock], name=f"{name} server")
            try:
                with anyio.fail_after(startup_s):
                    await server.ready.wait()
                url_host = f"[{host}]" if ":" in host else host
                yield f"http://{url_host}:{bound_port}"
            finally:
                server.should_exit = True
    finally:
        sock.close()
