"""Observations of pages that scroll on their own and of real documentation pages.

A sidebar that scrolls independently (fixtures/sidebar.html, written for these tests) and
the Rust toolchain's own rustdoc and mdBook pages (`rustup doc --path`; nobody here wrote
them), served on 127.0.0.1. What is painted on screen is measured in the browser: a control
is on screen when the point at its centre hits it (or something inside it), and clipped
when a scroll container hides it wholly. An observation must show every control on screen
(the sidebar does not crowd out the main content), none that is clipped, stay within its
budget, be identical when repeated, and Scroll Down must move through the window and the
scroll containers.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runtime.base.config import ObservationConfig
from runtime.base.messages import Action
from runtime.browser import BrowserPool
from runtime.errors import ElementNotFound
from runtime.observation import ID_ATTRIBUTE, Observation, estimate_tokens

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

STYLES = ["html", "compact"]

CONTROLS = "a[href], button, input:not([type=hidden]), select, textarea, summary"

_MEASURE = """([selector, attr]) => {
  const clippedAway = (el, r) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const o = getComputedStyle(p).overflowY;
      if (o !== "auto" && o !== "scroll" && o !== "hidden") continue;
      const pr = p.getBoundingClientRect();
      if (r.bottom <= pr.top || r.top >= pr.bottom) return true;
    }
    return false;
  };
  const out = [];
  for (const el of document.querySelectorAll(selector)) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    const x = r.left + r.width / 2;
    const y = r.top + r.height / 2;
    let painted = false;
    if (x >= 0 && y >= 0 && x < innerWidth && y < innerHeight) {
      const hit = document.elementFromPoint(x, y);
      painted = hit !== null && (hit === el || el.contains(hit) || hit.contains(el));
    }
    out.push({
      id: el.getAttribute(attr),
      painted,
      clipped: clippedAway(el, r),
      html: el.outerHTML.slice(0, 80),
    });
  }
  return out;
}"""


async def _measure(page: Any) -> list[dict[str, Any]]:
    """Every control of `page`: its mark, whether it is painted, whether it is clipped."""
    result: list[dict[str, Any]] = await page.evaluate(_MEASURE, [CONTROLS, ID_ATTRIBUTE])
    return result


def _crowded_out(controls: list[dict[str, Any]], observation: Observation) -> list[str]:
    """Controls painted on screen that the observation does not show."""
    shown = {str(i) for i in observation.elements}
    return [c["html"] for c in controls if c["painted"] and c["id"] not in shown]


def _clipped_shown(controls: list[dict[str, Any]], observation: Observation) -> list[str]:
    """Controls the observation shows although a scroll container hides them."""
    shown = {str(i) for i in observation.elements}
    return [c["html"] for c in controls if c["clipped"] and c["id"] in shown]


def _id(observation: Observation, text: str) -> int:
    return next(e.id for e in observation.elements.values() if e.text == text)


# --------------------------------------------------------------------------- a sidebar


@pytest.mark.parametrize("style", STYLES)
async def test_a_scrolling_sidebar_shows_only_what_is_on_screen(
    pool: BrowserPool, web: Any, style: str
) -> None:
    config = ObservationConfig(style=style)
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/fixtures/sidebar.html")])
        first = await session.observe(config)
        controls = await _measure(session.page)
        assert _crowded_out(controls, first) == []
        assert _clipped_shown(controls, first) == []
        # ~40 of the 300 sidebar links fit in the 1080 px viewport; the rest are clipped.
        assert 30 <= sum("method_" in e.text for e in first.elements.values()) <= 50
        assert "method_299" not in first.text
        assert "The opening paragraph of the main content" in first.text
        assert "Section 3" in first.text
        # A wide table in a wrapper that scrolls across keeps its far columns.
        assert "far column" in [e.text for e in first.elements.values()]

        # Scroll Down moves both the window and the sidebar.
        seen = [first.text]
        for _ in range(8):
            await session.execute(Action(kind="do", name="Scroll Down"))
            seen.append((await session.observe(config)).text)
            controls = await _measure(session.page)
            assert _crowded_out(controls, session.observation) == []
            assert _clipped_shown(controls, session.observation) == []
            assert session.observation.tokens <= config.max_tokens
        assert "method_150" in "".join(seen)
        assert "Section 40" in "".join(seen)
        assert "method_150" not in first.text and "Section 40" not in first.text


async def test_a_stale_id_of_a_hidden_element_is_refused(pool: BrowserPool, web: Any) -> None:
    config = ObservationConfig(style="html", max_tokens=100_000)
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/fixtures/sidebar.html")])
        observation = await session.observe(config)
        link = _id(observation, "the next section")
        await session.execute(
            Action(kind="do", name="Click", element=_id(observation, "Hide the content"))
        )
        url = session.page.url
        with pytest.raises(ElementNotFound, match=f"element {link} is hidden now"):
            await session.execute(Action(kind="do", name="Click", element=link))
        assert session.page.url == url
        # A control still shown is clicked as before.
        method = _id(observation, "method_003")
        await session.execute(Action(kind="do", name="Click", element=method))
        assert session.page.url.endswith("#m3")


# --------------------------------------------------------------------------- rustdoc


def _rust_docs() -> Path:
    """The toolchain's HTML documentation folder, or a skip saying what is missing."""
    if shutil.which("rustup") is None:
        pytest.skip("no Rust toolchain: rustup is not installed (the rustdoc pages come from it)")
    found = subprocess.run(
        ["rustup", "doc", "--path"], capture_output=True, text=True, timeout=30, check=False
    )
    index = Path(found.stdout.strip())
    if found.returncode != 0 or not (index.parent / "std" / "vec" / "struct.Vec.html").is_file():
        pytest.skip(f"the Rust toolchain has no HTML docs (`rustup doc --path`: {found.stdout!r})")
    return index.parent


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def rustdoc() -> Iterator[str]:
    """The toolchain's documentation served on 127.0.0.1: its base URL."""
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(_rust_docs()))
    )
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


VEC = "/std/vec/struct.Vec.html"
SEARCH = "/std/index.html?search=Vec"
BOOK = "/book/index.html"


_SEARCHED = """() => {
  const tabs = [...document.querySelectorAll("#search-tabs button")];
  return tabs.length > 0 && tabs.every((b) => /\\(\\d+\\)/.test(b.textContent));
}"""


async def _open(session: Any, base: str, path: str) -> None:
    await session.open([base + path])
    if "?search=" in path:
        # The search runs in the page's scripts after loading its index files; wait until
        # every results tab has its count.
        await session.page.wait_for_function(_SEARCHED)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("path", [VEC, BOOK])
async def test_the_sidebar_does_not_crowd_out_main_content(
    pool: BrowserPool, rustdoc: str, style: str, path: str
) -> None:
    config = ObservationConfig(style=style)
    async with pool.session(allowed=[rustdoc]) as session:
        await _open(session, rustdoc, path)
        observation = await session.observe(config)
        controls = await _measure(session.page)
    assert _crowded_out(controls, observation) == []
    assert _clipped_shown(controls, observation) == []
    assert observation.tokens <= config.max_tokens


@pytest.mark.parametrize("style", STYLES)
async def test_vec_documentation_appears_after_scrolling(
    pool: BrowserPool, rustdoc: str, style: str
) -> None:
    config = ObservationConfig(style=style)
    async with pool.session(allowed=[rustdoc]) as session:
        await _open(session, rustdoc, VEC)
        texts = [(await session.observe(config)).text]
        assert "A contiguous growable array type" in texts[0]
        for _ in range(8):
            await session.execute(Action(kind="do", name="Scroll Down"))
            observation = await session.observe(config)
            assert observation.tokens <= config.max_tokens
            texts.append(observation.text)
    later = "\n".join(texts[1:])
    # Text of the page's main content far below the first screen, and sidebar links that
    # were clipped out of the sidebar at first.
    assert "Constructs a new, empty Vec" not in texts[0]
    assert "Constructs a new, empty Vec" in later
    assert "with_capacity_in" not in texts[0]
    assert "with_capacity_in" in later


@pytest.mark.parametrize("style", STYLES)
async def test_search_results_show_in_both_styles(
    pool: BrowserPool, rustdoc: str, style: str
) -> None:
    config = ObservationConfig(style=style)
    async with pool.session(allowed=[rustdoc]) as session:
        await _open(session, rustdoc, SEARCH)
        first = await session.observe(config)
        await session.execute(Action(kind="do", name="Scroll Down"))
        second = await session.observe(config)
    results = [e for e in first.elements.values() if e.attrs.get("href", "").startswith("../")]
    assert first.tokens <= config.max_tokens
    # The block children of a result link are set apart by spaces.
    assert "struct std::vec::Vec A contiguous growable array type" in first.text
    assert len([e for e in results if "::" in e.text]) >= 20
    # Scrolling shows results further down the list.
    later = {e.text for e in second.elements.values() if "::" in e.text}
    assert later - {e.text for e in results}


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("path", [VEC, SEARCH, BOOK])
async def test_rustdoc_observations_are_repeatable_and_within_budget(
    pool: BrowserPool, rustdoc: str, style: str, path: str
) -> None:
    config = ObservationConfig(style=style, max_tokens=1500)
    async with pool.session(allowed=[rustdoc]) as session:
        await _open(session, rustdoc, path)
        first = await session.observe(config)
        again = await session.observe(config)
    assert first.text == again.text
    assert first.tokens == estimate_tokens(first.text) <= 1500
    assert len(first.elements) >= 10
