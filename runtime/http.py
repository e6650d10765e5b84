"""Serve an ASGI app in-process: uvicorn inside the caller's event loop.

The socket is bound and listening before `serve_asgi` yields, so the URL it yields is
usable at once (early connections wait in the listen backlog). uvicorn's own signal
handling is switched off: the process that embeds it (the daemon, a test) owns signals.
"""

from __future__ import annotations

import random
import socket
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import uvicorn
from starlette.types import ASGIApp

__all__ = ["free_port", "serve_asgi"]


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


class _EmbeddedServer(uvicorn.Server):
    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@asynccontextmanager
async def serve_asgi(
    app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0, graceful_s: float = 5.0
) -> AsyncIterator[str]:
    """Serve `app` on host:port (0 = a free port) until the block exits; yields the URL."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=int(max(1, graceful_s)),
    )
    server = _EmbeddedServer(config)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            try:
                url_host = f"[{host}]" if ":" in host else host
                yield f"http://{url_host}:{bound_port}"
            finally:
                server.should_exit = True
    finally:
        sock.close()
