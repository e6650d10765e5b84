"""Debian's Chromium is found and drives a page served on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.async_api import BrowserContext

from runtime.browser import find_chromium

PAGE = b"""<!doctype html><title>t</title>
<button id="b" onclick="document.getElementById('out').textContent='clicked'">Go</button>
<p id="out">waiting</p>"""


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_debian_headless_shell_is_preferred() -> None:
    assert find_chromium() == "/usr/lib/chromium/chromium-headless-shell"
    with pytest.raises(FileNotFoundError, match="executable_path"):
        find_chromium("/nonexistent/chrome")


@pytest.mark.anyio
@pytest.mark.browser
async def test_click_on_local_page(context: BrowserContext, server_url: str) -> None:
    page = await context.new_page()
    await page.goto(server_url)
    assert await page.text_content("#out") == "waiting"
    await page.click("#b")
    assert await page.text_content("#out") == "clicked"
