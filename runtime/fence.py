"""The fence around an episode's browser: its allowlist and the proxy that enforces it.

Playwright's request routing sees only the first URL of a redirect chain and no
WebSocket at all, so it cannot be the fence. Every BrowserContext instead gets its own
`Fence`: an HTTP proxy on 127.0.0.1 (anyio, in this process) that the context must use
(Playwright's per-context proxy; it adds `<-loopback>` to the bypass list, so loopback
goes through the proxy too). The browser opens no connection of its own; the proxy
opens one upstream connection per request or tunnel, and only to an allowed
(host, port) that no denied pair matches. So every request the browser makes is checked:
each redirect hop (the browser asks the proxy again for the next URL), subresources,
form posts, meta refreshes, script navigations, and WebSockets and https (CONNECT).
WebRTC's UDP would not use the proxy: Chromium runs with `disable_non_proxied_udp`
(`runtime.browser.CHROMIUM_ARGS`), so it sends none.

- `Allowlist`: (host, port) pairs an episode may reach, and denied pairs that always
  win (the daemon's control API, the vLLM server). Every entry names its port (or a
  scheme that implies one); a bare host or a bad port is an `AllowlistError`.
- `Fence`: `async with Fence(allowlist) as fence:` serves the proxy at `fence.url` in a
  task group it owns; leaving the block closes the listener and every connection.
  `statistics()` counts what was forwarded and refused.

Plain-HTTP requests are forwarded with `Connection: close` both ways (one request per
connection), so the browser can never send a second request, meant for another host,
down a connection the proxy opened to the first. A refused request gets a 403 whose
body says what was refused; an unreachable upstream a 502.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import SplitResult, urlsplit

import anyio
import anyio.abc
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = ["Allowlist", "AllowlistError", "Fence", "FenceStatistics"]

log = structlog.get_logger("runtime.fence")

_DEFAULT_PORTS: Final = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_MAX_HEAD: Final = 64 * 1024
_CHUNK: Final = 65536
# Hop-by-hop headers the proxy drops (it sets its own Connection header).
_HOP: Final = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te"}
)
_WILDCARD: Final = frozenset({"", "0.0.0.0", "::"})


class AllowlistError(ValueError):
    """An allowlist entry that names no host, no port, or a port that is not one."""


Address = tuple[str, int]


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _entry(text: str, *, what: str) -> Address:
    """(host, port) of an allowlist entry: a URL or `host:port`."""
    raw = text.strip()
    parts = urlsplit(raw if "//" in raw else f"//{raw}")
    host = (parts.hostname or "").lower()
    if not host:
        raise AllowlistError(f"{what} {text!r} names no host")
    try:
        port = parts.port
    except ValueError:
        raise AllowlistError(f"{what} {text!r} has a port that is not 1-65535") from None
    if port is None:
        port = _DEFAULT_PORTS.get(parts.scheme)
    if port is None:
        raise AllowlistError(
            f"{what} {text!r} names no port: write host:port or a URL with http(s)://"
        )
    if port == 0:
        raise AllowlistError(f"{what} {text!r} has a port that is not 1-65535")
    return host, port


def _url_address(parts: SplitResult) -> Address | None:
    host = (parts.hostname or "").lower()
    try:
        port = parts.port
    except ValueError:
        return None
    port = port if port is not None else _DEFAULT_PORTS.get(parts.scheme)
    if not host or port is None:
        return None
    return host, port


@dataclass(frozen=True, slots=True)
class Allowlist:
    """(host, port) pairs a session may reach; `denied` pairs always lose.

    A denied pair whose host is a wildcard bind address (0.0.0.0, ::) denies its port on
    every host; one on a loopback host denies its port on every loopback spelling
    (localhost, 127.x.y.z, ::1).
    """

    origins: frozenset[Address]
    denied: frozenset[Address] = frozenset()

    @classmethod
    def from_urls(cls, urls: Sequence[str], *, denied: Iterable[Address] = ()) -> Allowlist:
        """The origins of `urls` ("http://127.0.0.1:8001/x" -> 127.0.0.1:8001).

        Raises `AllowlistError` for an entry with no host or no (or a bad) port: a bare
        host never means "every port".
        """
        origins = {_entry(url, what="allowlist entry") for url in urls}
        return cls(frozenset(origins), frozenset((h.lower(), p) for h, p in denied))

    def allows(self, url: str) -> bool:
        """Is `url` http(s) or ws(s) on an allowed, not denied, host and port?"""
        parts = urlsplit(url)
        if parts.scheme not in _DEFAULT_PORTS:
            return False
        address = _url_address(parts)
        return address is not None and self.allows_address(*address)

    def allows_address(self, host: str, port: int) -> bool:
        host = host.lower().strip("[]")
        return (host, port) in {(h.strip("[]"), p) for h, p in self.origins} and not (
            self.is_denied(host, port)
        )

    def is_denied(self, host: str, port: int) -> bool:
        host = host.lower().strip("[]")
        for denied_host, denied_port in self.denied:
            if denied_port != port:
                continue
            other = denied_host.strip("[]")
            if other in _WILDCARD or other == host:
                return True
            if _is_loopback(other) and _is_loopback(host):
                return True
        return False

    def describe(self) -> str:
        return ", ".join(sorted(f"{h}:{p}" for h, p in self.origins))


@dataclass(frozen=True, slots=True)
class FenceStatistics:
    """What `Fence.statistics()` reports."""

    forwarded: int
    tunnels: int
    refused: int
    failed: int


class _Refused(Exception):
    """A request the fence does not forward; `status` and `reason` go to the browser."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Fence:
    """One context's proxy; `async with Fence(allowlist) as fence:` serves at `fence.url`."""

    def __init__(self, allowlist: Allowlist, *, connect_timeout_s: float = 10.0) -> None:
        self.allowlist = allowlist
        self.connect_timeout_s = connect_timeout_s
        self.url = ""
        self.refusals: list[str] = []
        self._forwarded = 0
        self._tunnels = 0
        self._failed = 0
        self._tg: anyio.abc.TaskGroup | None = None

    def statistics(self) -> FenceStatistics:
        return FenceStatistics(
            forwarded=self._forwarded,
            tunnels=self._tunnels,
            refused=len(self.refusals),
            failed=self._failed,
        )

    async def __aenter__(self) -> Fence:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        self.url = f"http://127.0.0.1:{port}"
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._serve, listener, self._tg)
        return self

    async def _serve(
        self, listener: anyio.abc.Listener[anyio.abc.SocketStream], tg: anyio.abc.TaskGroup
    ) -> None:
        async with listener:
            await listener.serve(self._handle_safely, tg)

    async def __aexit__(self, *exc_info: object) -> None:
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)

    # ------------------------------------------------------------------ one connection

    async def _handle_safely(self, client: anyio.abc.SocketStream) -> None:
        # One connection's failure is that connection's: it must not end the fence.
        try:
            await self._handle(client)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return
        except Exception:
            log.exception("fence.connection_failed")

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            reader = BufferedByteReceiveStream(client)
            try:
                head = await reader.receive_until(b"\r\n\r\n", _MAX_HEAD)
            except (anyio.IncompleteRead, anyio.DelimiterNotFound, OSError):
                return
            except (anyio.BrokenResourceError, anyio.EndOfStream):
                return
            lines = head.split(b"\r\n")
            try:
                method, target, version = lines[0].split(b" ")
                if method == b"CONNECT":
                    address = self._connect_target(target.decode("latin-1"))
                    upstream = await self._open(*address)
                    self._tunnels += 1
                    await client.send(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    async with upstream:
                        await _tunnel(reader, client, upstream)
                    return
                address, path = self._http_target(target.decode("latin-1"))
                upstream = await self._open(*address)
            except ValueError:
                await _answer(client, 400, "the proxy could not read this request")
                return
            except _Refused as refused:
                await _answer(client, refused.status, refused.reason)
                return
            self._forwarded += 1
            headers = [line for line in lines[1:] if _name(line) not in _HOP]
            out = b"\r\n".join(
                [method + b" " + path + b" " + version, *headers, b"Connection: close"]
            )
            async with upstream:
                await upstream.send(out + b"\r\n\r\n")
                await _exchange(reader, client, upstream)

    def _connect_target(self, authority: str) -> Address:
        parts = urlsplit(f"//{authority}")
        address = _url_address(parts._replace(scheme="https"))
        if address is None or parts.port is None:
            raise ValueError(authority)
        return address

    def _http_target(self, target: str) -> tuple[Address, bytes]:
        parts = urlsplit(target)
        if parts.scheme != "http":
            raise ValueError(target)
        address = _url_address(parts)
        if address is None:
            raise ValueError(target)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return address, path.encode("latin-1")

    async def _open(self, host: str, port: int) -> anyio.abc.SocketStream:
        """A connection to an allowed (host, port); every resolved address is checked."""
        shown = f"{host}:{port}"
        if not self.allowlist.allows_address(host, port):
            self._refuse(shown)
        try:
            with anyio.fail_after(self.connect_timeout_s):
                infos = await anyio.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
                addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
                for address in addresses:
                    if self.allowlist.is_denied(address, port):
                        self._refuse(f"{shown} (resolves to {address})")
                failure: OSError | None = None
                for address in addresses:  # localhost: ::1, then 127.0.0.1
                    try:
                        return await anyio.connect_tcp(address, port)
                    except OSError as exc:
                        failure = exc
                raise failure or OSError(f"{host} resolves to no address")
        except (OSError, TimeoutError) as exc:
            self._failed += 1
            raise _Refused(
                502, f"webagent fence: could not connect to {shown}: {exc or 'timed out'}"
            ) from exc

    def _refuse(self, shown: str) -> None:
        self.refusals.append(shown)
        log.info("fence.refused", target=shown)
        raise _Refused(
            403,
            f"webagent fence: {shown} is not on this episode's allowlist "
            f"({self.allowlist.describe()})",
        )


def _name(line: bytes) -> bytes:
    return line.partition(b":")[0].strip().lower()


async def _answer(client: anyio.abc.SocketStream, status: int, reason: str) -> None:
    body = reason.encode("utf-8", "replace")
    phrase = {400: b"Bad Request", 403: b"Forbidden", 502: b"Bad Gateway"}[status]
    head = (
        b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (status, phrase, len(body))
    )
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await client.send(head + body)


async def _pipe(source: anyio.abc.ByteReceiveStream, sink: anyio.abc.SocketStream) -> None:
    """Copy until `source` ends, then half-close `sink`."""
    with contextlib.suppress(
        anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError
    ):
        while True:
            await sink.send(await source.receive(_CHUNK))
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await sink.send_eof()


async def _tunnel(
    reader: BufferedByteReceiveStream,
    client: anyio.abc.SocketStream,
    upstream: anyio.abc.SocketStream,
) -> None:
    """CONNECT: bytes both ways until both sides are done."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(_pipe, reader, upstream)
        tg.start_soon(_pipe, upstream, client)


async def _exchange(
    reader: BufferedByteReceiveStream,
    client: anyio.abc.SocketStream,
    upstream: anyio.abc.SocketStream,
) -> None:
    """One plain-HTTP request: the body up, the response down with `Connection: close`;
    done when the upstream has answered (a 101 upgrade becomes a tunnel)."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(_pipe, reader, upstream)
        response = BufferedByteReceiveStream(upstream)
        try:
            head = await response.receive_until(b"\r\n\r\n", _MAX_HEAD)
        except (anyio.IncompleteRead, anyio.DelimiterNotFound, anyio.BrokenResourceError, OSError):
            tg.cancel_scope.cancel()
            return
        lines = head.split(b"\r\n")
        if lines[0].split(b" ")[1:2] != [b"101"]:
            lines = [lines[0], *(h for h in lines[1:] if _name(h) not in _HOP)]
            lines.append(b"Connection: close")
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await client.send(b"\r\n".join(lines) + b"\r\n\r\n")
        await _pipe(response, client)
        if lines[0].split(b" ")[1:2] != [b"101"]:
            tg.cancel_scope.cancel()
