"""Serve an ASGI app in-process: uvicorn inside the caller's event loop.

The socket is bound and listening before `serve_asgi` yields, so the URL it yields is
usable at once (early connections wait in the listen backlog). uvicorn's own signal
handling is switched off: the process that embeds it (the daemon, a test) owns signals.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager, contextmanager

import anyio
import uvicorn
from starlette.types import ASGIApp

__all__ = ["serve_asgi"]


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
