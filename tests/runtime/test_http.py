"""runtime.base.http: free ports outside the ephemeral range, and serve_asgi's limits over real
sockets on 127.0.0.1 (TCP_NODELAY, request-head size and deadline, connection cap)."""

from __future__ import annotations

import contextlib
import logging
import socket
import statistics
import time
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from runtime.base.http import HttpLimits, ServerStats, free_port, serve_asgi


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_free_port_is_bindable_and_below_the_ephemeral_range() -> None:
    ports = {free_port() for _ in range(20)}
    assert all(20000 <= port < _ephemeral_low() for port in ports), ports
    assert len(ports) > 1, "the choice is random, not one fixed port"
    port = ports.pop()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_port_skips_a_port_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        taken = busy.getsockname()[1]
        busy.listen()
        # Only the taken port, then bind(0): the taken one is skipped.
        monkeypatch.setattr("random.shuffle", lambda ports: ports.sort(key=lambda p: p != taken))
        port = free_port(attempts=1)
        assert port != taken


# ---------------------------------------------------------------- serve_asgi's limits


async def _ok(request: Request) -> Response:
    return PlainTextResponse("ok\n")


_APP = Starlette(routes=[Route("/healthz", _ok)])


@pytest.mark.anyio
async def test_keep_alive_responses_are_not_delayed_by_nagle() -> None:
    """Without TCP_NODELAY on accepted sockets every response here took ~44 ms."""
    async with serve_asgi(_APP) as url, httpx.AsyncClient(base_url=url) as client:
        await client.get("/healthz")
        times = []
        for _ in range(30):
            started = time.perf_counter()
            response = await client.get("/healthz")
            times.append(time.perf_counter() - started)
            assert response.status_code == 200
    assert statistics.median(times) < 0.03, times  # Nagle + delayed ACK: >= 40 ms


async def _half_open(port: int) -> anyio.abc.SocketStream:
    stream = await anyio.connect_tcp("127.0.0.1", port)
    await stream.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return stream


async def _closed_by_server(stream: anyio.abc.SocketStream, wait_s: float) -> bool:
    with anyio.move_on_after(wait_s):
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            pass
        return True
    return False


@pytest.mark.anyio
async def test_a_flood_of_half_open_connections_neither_takes_healthz_down_nor_floods_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = ServerStats()
    limits = HttpLimits(max_connections=100, header_timeout_s=60)
    caplog.set_level(logging.DEBUG)
    async with serve_asgi(_APP, limits=limits, stats=stats) as url:
        port = int(url.rsplit(":", 1)[1])
        flood = [await _half_open(port) for _ in range(2000)]
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                started = time.perf_counter()
                response = await client.get("/healthz", timeout=5)
                elapsed = time.perf_counter() - started
            assert response.status_code == 200 and elapsed < 2, elapsed
            # The server held at most max_connections of them: the oldest were closed.
            closed = [await _closed_by_server(s, 0.05) for s in flood[:1800]]
            assert all(closed), closed.count(False)
            assert stats.evicted >= 1900, stats
        finally:
            for stream in flood:
                await stream.aclose()
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert len(noisy) < 5, [r.getMessage() for r in noisy[:5]]


@pytest.mark.anyio
async def test_a_request_head_that_never_ends_is_closed_after_the_header_timeout() -> None:
    stats = ServerStats()
    async with serve_asgi(_APP, limits=HttpLimits(header_timeout_s=0.3), stats=stats) as url:
        stream = await _half_open(int(url.rsplit(":", 1)[1]))
        started = time.perf_counter()
        # A byte now and then does not keep it open (a slow-loris client).
        await stream.send(b"a")
        assert await _closed_by_server(stream, 3)
        assert time.perf_counter() - started < 2
        assert stats.header_timeouts == 1
        await stream.aclose()
        async with httpx.AsyncClient(base_url=url) as client:
            # A keep-alive client that sends its requests in time is not affected.
            for _ in range(3):
                assert (await client.get("/healthz")).status_code == 200


@pytest.mark.anyio
async def test_an_oversized_request_head_is_refused_before_the_app() -> None:
    async with serve_asgi(_APP, limits=HttpLimits(max_header_bytes=8192)) as url:
        stream = await anyio.connect_tcp("127.0.0.1", int(url.rsplit(":", 1)[1]))
        head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 65536
        with contextlib.suppress(anyio.BrokenResourceError, OSError):
            await stream.send(head)
        reply = b""
        with anyio.fail_after(3):
            try:
                while chunk := await stream.receive():
                    reply += chunk
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                pass
        await stream.aclose()
    assert reply.startswith(b"HTTP/1.1 400"), reply[:80]
