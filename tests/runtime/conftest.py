"""Fixtures of the runtime tests: a local web server with test pages, a browser pool.

`web` serves `fixtures/*.html` (pages written for these tests in the style of real
sites) and the small pages in `PAGES` on 127.0.0.1; `other_web` is a second server whose
origin is outside the allowlist of the sessions under test.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from runtime.base.config import BrowserConfig
from runtime.browser import BrowserPool

FIXTURES = Path(__file__).parent / "fixtures"

PAGES: dict[str, str] = {
    "/": """<!doctype html><title>Home</title><h1>Home</h1>
<a href="/form">Form</a> <a href="/tabs">Tabs</a>""",
    "/form": """<!doctype html><title>Form</title><h1>Order form</h1>
<form action="/result" method="get">
<input name="q" placeholder="Query">
<select name="size"><option>Small</option><option>Medium</option><option>Large</option></select>
<textarea name="note"></textarea>
<button type="submit">Send</button>
</form>
<button id="hv" onmouseover="document.getElementById('out').textContent='hovered'">Hover me</button>
<button id="rc"
  oncontextmenu="document.getElementById('out').textContent='right-clicked'; return false"
>Right click me</button>
<button onclick="document.getElementById('out').textContent='clicked'">Click me</button>
<button onclick="alert('Saved!')">Alert</button>
<button
  onclick="document.getElementById('out').textContent = confirm('Delete?') ? 'deleted' : 'kept'"
>Delete</button>
<a href="/download">Download report</a>
<p id="out">nothing yet</p>""",
    "/tabs": """<!doctype html><title>Tabs</title><h1>Tabs</h1>
<a href="/form" target="_blank">Form in a new tab</a>
<button onclick="window.open('/')">Open home</button>
<button onclick="for (let i = 0; i < 30; i++) window.open('/?' + i)">Open 30</button>
<a href="OTHER/elsewhere">Leave the site</a>
<a href="data:text/html,<h1>data</h1>">Data link</a>
<a href="file:///etc/passwd">File link</a>""",
    "/changing": """<!doctype html><title>Changing</title>
<button id="b" onclick="this.textContent='Renamed'">Rename me</button>
<button onclick="document.getElementById('b').remove()">Remove the other</button>
<button onclick="location.reload()">Reload</button>""",
    "/long": "<!doctype html><title>Long</title><h1>Long page</h1>"
    + "".join(
        f'<p style="height:40px">Paragraph {i} <a href="/p/{i}">link {i}</a></p>'
        for i in range(200)
    ),
    "/busy": """<!doctype html><title>Busy</title><button onclick="for(;;){}">Hang</button>""",
    # A page that sets the length of what goes above it: its title, its URL and its dialogs.
    "/loud": """<!doctype html><title>Loud</title><p>the page</p><a href="/">home</a><script>
document.title = "T".repeat(200000);
history.replaceState(null, "", "/loud?" + "q".repeat(100000));
for (let i = 0; i < 300; i++) alert("alert " + i + " " + "x".repeat(150));
</script>""",
    # Nesting past what a JSON decoder reads (msgspec: about 500 levels of the tree), made
    # with the DOM (the HTML parser stops nesting at 512): 600 divs, then 300 buttons.
    "/deep": """<!doctype html><title>Deep</title><body><script>
let el = document.body;
for (let i = 0; i < 600; i++) el = el.appendChild(document.createElement("div"));
el.innerHTML = "<p>deep text</p><a href='/'>deep link</a>";
for (let i = 0; i < 300; i++) {
  el = el.appendChild(document.createElement("span"));
  el.setAttribute("role", "button");
}
el.textContent = "innermost";
</script>""",
    # A page that takes memory: typed arrays, 64 MiB at a time, up to 1.5 GiB.
    "/hog": """<!doctype html><title>Hog</title><body><script>
const held = [];
let mb = 0;
try {
  while (mb < 1536) { held.push(new Uint8Array(64 << 20).fill(1)); mb += 64; }
} catch (e) {}
document.title = "held " + mb;
</script>""",
    # Text no UTF-8 can hold: lone UTF-16 surrogates, which a page's script can make.
    "/surrogates": """<!doctype html><title>Surrogates</title>
<p id="t">x</p><button id="b">x</button><input id="i" name="q"><p>a pair 😀, a text \\ud800</p>
<script>
const high = String.fromCharCode(0xD800), low = String.fromCharCode(0xDC00);
document.getElementById("t").textContent = "high" + high + "end";
document.getElementById("b").textContent = low + "button";
document.getElementById("i").value = "typed" + high;
document.title = "Title" + low;
</script>""",
}


def _result_page(query: str) -> str:
    params = {k: v[0] for k, v in parse_qs(query).items()}
    items = "".join(f"<li>{k}={v}</li>" for k, v in sorted(params.items()))
    return f"<!doctype html><title>Result</title><h1>Result</h1><ul>{items}</ul>"


@dataclass
class Web:
    url: str
    other: str = ""

    def __call__(self, path: str) -> str:
        return self.url + path


def _serve(pages: dict[str, str], other: list[str]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/download":
                body = b"id,total\n1,2\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/csv")
                self.send_header("Content-Disposition", "attachment; filename=report.csv")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if parts.path == "/result":
                text = _result_page(parts.query)
            elif parts.path.startswith("/fixtures/"):
                file = FIXTURES / parts.path.removeprefix("/fixtures/")
                text = file.read_text(encoding="utf-8") if file.is_file() else ""
            else:
                text = pages.get(parts.path, "")
            if not text:
                text = f"<!doctype html><title>{parts.path}</title><p>page {parts.path}</p>"
            body = text.replace("OTHER", other[0] if other else "").encode("utf-8")
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


@pytest.fixture(scope="session")
def web() -> Iterator[Web]:
    other_holder: list[str] = []
    main = _serve(PAGES, other_holder)
    other = _serve({"/elsewhere": "<title>Elsewhere</title><p>outside</p>"}, [])
    other_holder.append(f"http://127.0.0.1:{other.server_address[1]}")
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (main, other)]
    for thread in threads:
        thread.start()
    yield Web(url=f"http://127.0.0.1:{main.server_address[1]}", other=other_holder[0])
    for server in (main, other):
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
async def pool(anyio_backend: str) -> AsyncIterator[BrowserPool]:
    config = BrowserConfig(action_timeout_s=3.0, navigation_timeout_s=10.0, wait_action_s=0.2)
    async with BrowserPool(config) as browser_pool:
        yield browser_pool
