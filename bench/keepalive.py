"""Keep-alive request latency of the embedded server, with and without TCP_NODELAY.

`serve_asgi` (runtime/base/http.py) serves the control API and agent endpoint (uvicorn's
h11 protocol with `HttpLimits`) and the built-in sites (uvicorn's own protocol, httptools)
on a socket from `listen_socket`, which names IPPROTO_TCP so that asyncio sets TCP_NODELAY
on every accepted connection. The "proto 0" arm is the same server on a socket opened as
uvicorn opens its own (`socket.socket(family, SOCK_STREAM)`): asyncio then leaves Nagle's
algorithm on, and a response written in two pieces (head, then body) waits for the
client's delayed ACK. One client sends sequential GETs on one kept-alive connection;
arms alternate in rounds, so the machine's noise falls on all of them alike.

    .venv/bin/python -m bench.keepalive --requests 200 --rounds 3
"""

from __future__ import annotations

import argparse
import socket
import time
from typing import Any

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from bench.common import LoadSampler, finish, load_note, median, percentile
from runtime.base import http

PAGE = "<html><body>" + "".join(f"<a href='/p/{i}'>item {i}</a>" for i in range(400)) + "</body>"


_STATUS = b'{"state":"running","version":3,"groups":41,"updates":7}'


async def _status(request: Request) -> Response:
    return Response(_STATUS, media_type="application/json")


async def _page(request: Request) -> Response:
    return HTMLResponse(PAGE)


APP = Starlette(routes=[Route("/status", _status), Route("/page", _page)])


def _proto0_socket(host: str, port: int, *, backlog: int = 2048) -> socket.socket:
    """A listening socket as uvicorn opens its own: protocol 0, so no TCP_NODELAY."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


async def _arm(server: str, nodelay: bool, path: str, requests: int) -> list[float]:
    """Seconds per request, `requests` sequential GETs on one keep-alive connection."""
    limits = http.HttpLimits() if server == "api" else None
    sock = http.listen_socket("127.0.0.1", 0) if nodelay else _proto0_socket("127.0.0.1", 0)
    async with (
        http.serve_asgi(APP, limits=limits, sock=sock) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        for _ in range(5):  # warm up: connection, routes
            (await client.get(path)).raise_for_status()
        times = []
        for _ in range(requests):
            began = time.perf_counter()
            response = await client.get(path)
            times.append(time.perf_counter() - began)
            response.raise_for_status()
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/out", help="folder for the JSON")
    args = parser.parse_args(argv)
    arms = [
        (server, path, nodelay)
        for server in ("api", "sites")
        for path in ("/status", "/page")
        for nodelay in (True, False)
    ]
    samples: dict[tuple[str, str, bool], list[float]] = {arm: [] for arm in arms}
    with LoadSampler(interval_s=1.0) as load:
        for _ in range(args.rounds):
            for server, path, nodelay in arms:
                times = anyio.run(_arm, server, nodelay, path, args.requests, backend="asyncio")
                samples[(server, path, nodelay)].extend(times)
    rows: list[list[object]] = []
    results: list[dict[str, Any]] = []
    for server, path, nodelay in arms:
        times = samples[(server, path, nodelay)]
        base = median(samples[(server, path, True)])
        row = {
            "server": server, "path": path, "socket": "TCP (nodelay)" if nodelay else "proto 0",
            "requests": len(times), "p50_ms": median(times) * 1e3,
            "p95_ms": percentile(times, 0.95) * 1e3, "x_nodelay": median(times) / base,
        }  # fmt: skip
        results.append(row)
        rows.append(list(row.values()))
    table = {
        "title": "keep-alive GETs on one connection, serve_asgi (medians over all rounds)",
        "headers": ["server", "path", "socket", "requests", "p50 ms", "p95 ms", "x nodelay"],
        "rows": rows,
    }
    notes = [
        f"{args.rounds} rounds of {args.requests} requests per arm, arms alternating; "
        f"/status is {len(_STATUS)} bytes of JSON, /page {len(PAGE)} bytes of HTML",
        "api: uvicorn's h11 protocol with HttpLimits (the control API and agent endpoint); "
        "sites: uvicorn's own protocol (httptools), as the built-in sites serve",
        load_note(load),
    ]
    finish(args.out, "keepalive", {"arms": results}, table=table, notes=notes, load=load)


if __name__ == "__main__":
    main()
