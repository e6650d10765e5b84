"""Observations of pages nobody in this project's runtime wrote: ids, determinism, budget.

The three fixture pages (a documentation page, a login form, a 300-row table) were
written for these tests in the style of real sites; they are served on 127.0.0.1.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from runtime.base.config import ObservationConfig
from runtime.base.messages import Action
from runtime.browser import BrowserPool
from runtime.observation import (
    ID_ATTRIBUTE,
    Snapshot,
    estimate_tokens,
    render,
)
from runtime.reading import parse_elements

pytestmark = [pytest.mark.anyio]

# What a user can act on, and what of it each page hides on purpose.
INTERACTIVE = "a[href], button, input:not([type=hidden]), select, textarea, summary, [role=button]"
HIDDEN = {
    "docs": ".mobile-menu *, .invisible *",
    "login": "input[type=hidden]",
    "table": "",
}

_MARKS = """([selector, hidden, attr]) => {
  const hiddenSet = new Set(hidden ? document.querySelectorAll(hidden) : []);
  return [...document.querySelectorAll(selector)].map((el) => ({
    html: el.outerHTML.slice(0, 80),
    id: el.getAttribute(attr),
    hidden: hiddenSet.has(el),
  }));
}"""


@pytest.mark.browser
@pytest.mark.parametrize("name", ["docs", "login", "table"])
async def test_every_control_gets_an_id(pool: BrowserPool, web: Any, name: str) -> None:
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web(f"/fixtures/{name}.html")])
        observation = await session.observe(ObservationConfig(style="html", max_tokens=100_000))
        marks = await session.page.evaluate(_MARKS, [INTERACTIVE, HIDDEN[name], ID_ATTRIBUTE])
        visible = [m for m in marks if not m["hidden"]]
        assert len(visible) >= 15
        assert [m["html"] for m in visible if m["id"] is None] == []
        assert [m["html"] for m in marks if m["hidden"] and m["id"] is not None] == []
        ids = [int(m["id"]) for m in visible]
        # Ids are 1..n in DOM order, all of them shown with their number.
        assert ids == sorted(ids)
        assert sorted(observation.elements) == list(range(1, len(observation.elements) + 1))
        assert set(ids) <= set(observation.elements)
        for element_id in ids:
            assert f' id="{element_id}"' in observation.text


@pytest.mark.browser
async def test_what_the_docs_page_shows(pool: BrowserPool, web: Any) -> None:
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/fixtures/docs.html")])
        text = (await session.observe(ObservationConfig(style="html", max_text_chars=60))).text
    assert "Title: Streams — Pipewright 3.2 documentation" in text
    assert (
        '<select id="5" name="version" aria-label="Version"><option selected>3.2 (stable)' in text
    )
    assert "<h2>Parameters</h2>" in text
    assert "<tr><td>buffer</td><td>int</td><td>0</td>" in text
    # Hidden things stay hidden; text is cut to max_text_chars with an ellipsis.
    for hidden in ("Install (mobile)", "Close menu", "invisible", "Secret link"):
        assert hidden not in text
    assert "<p>Closing the sending side ends the consumer's loop. A very l…</p>" in text
    assert max(len(run) for run in re.split(r"<[^>]*>", text)) <= 200


@pytest.mark.browser
async def test_login_form_controls_and_values(pool: BrowserPool, web: Any) -> None:
    config = ObservationConfig(style="html")
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/fixtures/login.html")])
        first = await session.observe(config)
        by_name = {e.attrs.get("name"): e for e in first.elements.values()}
        assert "csrf_token" not in by_name  # type=hidden
        await session.execute(
            Action(kind="do", name="Type", argument="ada", element=by_name["username"].id)
        )
        await session.execute(
            Action(kind="do", name="Type", argument="s3cret", element=by_name["password"].id)
        )
        # The styled checkbox has no box of its own; clicking it still ticks it.
        await session.execute(Action(kind="do", name="Click", element=by_name["remember"].id))
        await session.execute(
            Action(
                kind="do",
                name="Select Dropdown Option",
                argument="español",
                element=by_name["language"].id,
            )
        )
        after = await session.observe(config)
    assert 'name="username" value="ada"' in after.text
    assert 'name="password" value="******"' in after.text  # never the password itself
    assert 'name="remember" value="1" checked' in after.text
    assert "<option selected>Español</option>" in after.text
    assert 'name="area" value="personal" checked' in after.text


@pytest.mark.browser
async def test_observation_is_deterministic(pool: BrowserPool, web: Any) -> None:
    config = ObservationConfig(style="html")
    texts = []
    for _ in range(2):
        async with pool.session(allowed=[web.url]) as session:
            await session.open([web("/fixtures/docs.html")])
            texts.append((await session.observe(config)).text)
            texts.append((await session.observe(config)).text)
    assert len(set(texts)) == 1


@pytest.mark.browser
@pytest.mark.parametrize("style", ["html", "compact"])
async def test_lone_surrogates_a_page_makes_become_replacement_characters(
    pool: BrowserPool, web: Any, style: str
) -> None:
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/surrogates")])
        text = (await session.observe(ObservationConfig(style=style))).text
    text.encode("utf-8")  # a lone surrogate would raise here, and in every store after
    assert "high\ufffdend" in text and "\ufffdbutton" in text and "typed\ufffd" in text
    assert "a pair \U0001f600, a text \\ud800" in text  # a pair, and an escape's text


@pytest.mark.browser
async def test_what_a_page_puts_above_itself_is_cut_to_the_budget(
    pool: BrowserPool, web: Any
) -> None:
    """A 200,000-character title, a 100,000-character URL and 300 dialogs: the observation
    stays within its budget (before, 200,080 characters for the title alone) and still
    shows the page; the notes past the session's cap and the budget are counted."""
    config = ObservationConfig(style="compact", max_tokens=2048)
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/loud")])
        shown = await session.observe(config)
        again = await session.observe(config)
    assert shown.tokens <= 2048 and estimate_tokens(shown.text) <= 2048
    lines = shown.text.splitlines()
    assert max(len(line) for line in lines) <= 512
    assert lines[-2:] == ["the page", "link home [1]"]  # the page itself still shows
    assert any(line.startswith("URL: http://") and line.endswith("q…") for line in lines)
    assert any(line.startswith("Title: TTT") and line.endswith("…") for line in lines)
    assert 'Note: a dialog (alert) said "alert 0 x' in shown.text
    assert re.search(r"^Note: \d+ more notes and errors not shown$", shown.text, re.M)
    assert "alert" not in again.text  # the notes were for one observation


@pytest.mark.browser
@pytest.mark.parametrize("style", ["html", "compact"])
async def test_a_page_nested_thousands_deep_is_observed(
    pool: BrowserPool, web: Any, style: str
) -> None:
    """Before, "maximum recursion depth exceeded while deserializing": every episode on
    such a page ended at its first observation."""
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/deep")])
        shown = await session.observe(ObservationConfig(style=style))
        assert "deep text" in shown.text and "innermost" in shown.text
        link = next(i for i, e in shown.elements.items() if e.text == "deep link")
        await session.execute(Action(kind="do", name="Click", element=link))
        assert (await session.observe(ObservationConfig(style=style))).title == "Home"


@pytest.mark.browser
async def test_long_table_is_cut_to_the_budget_and_scrolls_on(pool: BrowserPool, web: Any) -> None:
    config = ObservationConfig(style="html", max_tokens=1500)
    async with pool.session(allowed=[web.url]) as session:
        await session.open([web("/fixtures/table.html")])
        first = await session.observe(config)
        assert first.tokens <= 1500
        assert estimate_tokens(first.text) <= 1500
        match = re.search(r"<!-- truncated: (\d+) more lines below -->$", first.text)
        assert match is not None and int(match.group(1)) > 250
        orders = [int(o) for o in re.findall(r">#(\d+)</a>", first.text)]
        assert orders == list(range(10001, 10001 + len(orders)))

        await session.execute(Action(kind="do", name="Scroll Down"))
        second = await session.observe(config)
        later = [int(o) for o in re.findall(r">#(\d+)</a>", second.text)]
        # Scrolling continues right after the last row shown: no row is skipped.
        assert later[0] == orders[-1] + 1
        assert "lines above: Scroll Up to see them -->" in second.text
        # The ids of the scrolled view are the page's ids, still in DOM order.
        assert min(second.elements) > max(first.elements)

        # A real tokenizer-like counter (words) is obeyed just as well.
        def words(text: str) -> int:
            return len(text.split())

        counted = await session.observe(
            ObservationConfig(style="html", max_tokens=300), count_tokens=words
        )
        assert counted.tokens == words(counted.text) <= 300


@pytest.mark.browser
async def test_parse_elements_reads_back_what_was_rendered(pool: BrowserPool, web: Any) -> None:
    for style in ("html", "compact"):
        config = ObservationConfig(style=style, max_tokens=100_000)
        async with pool.session(allowed=[web.url]) as session:
            await session.open([web("/fixtures/login.html")])
            observation = await session.observe(config)
        parsed = {e.id: e for e in parse_elements(observation.text, style)}
        assert sorted(parsed) == sorted(observation.elements)
        language = next(e for e in parsed.values() if e.tag == "select")
        assert language.options == ("English", "Español", "Tiếng Việt")
        links = [e.text for e in parsed.values() if e.tag == "a"]
        assert "Forgot your password?" in links
        if style == "html":
            for element_id, element in observation.elements.items():
                assert parsed[element_id].text == element.text
                assert parsed[element_id].tag == element.tag


def _snapshot(root: dict[str, object], scroll_y: int = 0) -> Snapshot:
    return Snapshot(
        url="http://127.0.0.1:1/x",
        title="T",
        scroll_y=scroll_y,
        viewport_height=1000,
        page_height=2000,
        root=root,
    )


def test_render_is_a_pure_function_of_the_snapshot() -> None:
    root = {
        "t": "",
        "b": 0,
        "c": [
            {"t": "h1", "b": 40, "c": ["Shop"]},
            {
                "t": "p",
                "b": 80,
                "c": [
                    "See ",
                    {
                        "t": "a",
                        "i": 1,
                        "a": {"href": "/x", "onclick": "evil()"},
                        "b": 80,
                        "c": ["<script>"],
                    },
                    " now",
                ],
            },
            {
                "t": "",
                "b": 120,
                "c": [{"t": "button", "i": 2, "a": {"title": 'say "hi"'}, "b": 120, "c": []}],
            },
        ],
    }
    config = ObservationConfig(style="html", show_url=False)
    first = render(_snapshot(root), config)
    assert first == render(_snapshot(root), config)
    assert first.text.splitlines() == [
        "Title: T",
        "<h1>Shop</h1>",
        '<p>See <a id="1" href="/x">&lt;script></a> now</p>',
        '<button id="2" title="say &quot;hi&quot;"></button>',
    ]
    # Lines wholly above the scroll position are left out and counted.
    scrolled = render(_snapshot(root, scroll_y=90), config)
    assert "<!-- 2 lines above: Scroll Up to see them -->" in scrolled.text
    assert "<h1>" not in scrolled.text
    assert sorted(scrolled.elements) == [2]


def test_a_header_over_half_the_budget_is_counted_not_shown() -> None:
    root = {"t": "", "b": 0, "c": [{"t": "p", "b": 40, "c": ["the page"]}]}
    config = ObservationConfig(style="compact", show_url=False, max_tokens=300)
    notes = ["Error: the last action failed", *(f"Note: a dialog said {i}" for i in range(80))]
    seen = render(_snapshot(root), config, header=notes)
    lines = seen.text.splitlines()
    assert seen.tokens <= 300 and lines[0] == "Error: the last action failed"
    assert lines[-3:] == [
        f"Note: {81 - (len(lines) - 3)} more notes and errors not shown",
        "Title: T",
        "the page",
    ]
    assert sum(estimate_tokens(line) + 1 for line in lines[:-2]) <= 150
    # A header that fits is shown whole, as before.
    assert render(_snapshot(root), config, header=notes[:3]).text.splitlines()[:3] == notes[:3]


def test_compact_style_puts_text_before_the_id() -> None:
    root = {
        "t": "",
        "b": 0,
        "c": [
            {"t": "h2", "b": 10, "c": ["Cart"]},
            {"t": "a", "i": 1, "a": {"href": "/c"}, "b": 20, "c": ["Electronics"]},
            {
                "t": "input",
                "i": 2,
                "a": {"placeholder": "Search products", "value": "shoes", "name": "q"},
                "b": 30,
                "c": [],
            },
            {
                "t": "select",
                "i": 3,
                "a": {"name": "size"},
                "b": 40,
                "c": [
                    {"t": "option", "a": {}, "c": ["S"]},
                    {"t": "option", "a": {"selected": ""}, "c": ["M"]},
                ],
            },
            {
                "t": "table",
                "b": 60,
                "c": [
                    {
                        "t": "tr",
                        "b": 60,
                        "c": [{"t": "td", "b": 60, "c": ["A"]}, {"t": "td", "b": 60, "c": ["$3"]}],
                    }
                ],
            },
        ],
    }
    text = render(_snapshot(root), ObservationConfig(style="compact", show_url=False)).text
    assert text.splitlines() == [
        "Title: T",
        "## Cart",
        "link Electronics [1]",
        'input q "Search products" = "shoes" [2]',
        "select size [3]: S | M (selected)",
        "| A | $3",
    ]


def _link(i: int, *children: object) -> dict[str, object]:
    return {"t": "a", "i": i, "a": {"href": f"/r/{i}"}, "b": 10 + i, "c": list(children)}


def test_a_long_line_is_wrapped_so_the_rest_of_the_page_shows() -> None:
    # rustdoc's search results: 200 result links side by side in one block, no spaces.
    results = [
        _link(i, f"function core::arch::vec_{i} Vector operation {i}") for i in range(1, 201)
    ]
    root = {
        "t": "",
        "b": 0,
        "c": [{"t": "", "b": 4000, "c": results}, {"t": "p", "b": 4100, "c": ["End"]}],
    }
    for style in ("html", "compact"):
        observation = render(_snapshot(root), ObservationConfig(style=style, show_url=False))
        assert observation.tokens <= 2048
        assert len(observation.elements) >= 40, style
        assert sorted(observation.elements) == list(range(1, len(observation.elements) + 1))
        assert max(len(line) for line in observation.text.splitlines()) < 500
        assert observation.lines_below > 0


def test_a_line_longer_than_the_whole_budget_is_cut_not_hidden() -> None:
    # One element whose text alone is over the budget: what fits of it is shown.
    runs = [f"part {i} of a very long link text. " for i in range(400)]
    root = {"t": "", "b": 0, "c": [_link(1, *runs), {"t": "p", "b": 900, "c": ["After"]}]}
    config = ObservationConfig(style="html", show_url=False, max_tokens=300)
    observation = render(_snapshot(root), config)
    assert observation.tokens <= 300
    assert '<a id="1" href="/r/1">part 0 of a very long link text. part 1' in observation.text
    assert sorted(observation.elements) == [1]
    assert observation.text.endswith("<!-- truncated: 1 more lines below -->")


def test_block_children_of_a_link_are_set_apart_by_spaces() -> None:
    link = _link(
        1,
        {"t": "", "b": 11, "c": ["struct", {"t": "", "b": 11, "c": ["std::collections::HashMap"]}]},
        {"t": "", "b": 11, "c": ["A hash map"]},
    )
    root = {"t": "", "b": 0, "c": [link]}
    for style in ("html", "compact"):
        observation = render(_snapshot(root), ObservationConfig(style=style, show_url=False))
        assert observation.elements[1].text == "struct std::collections::HashMap A hash map"
        assert "struct std::collections::HashMap A hash map" in observation.text


def test_compact_markers_share_the_line_of_their_first_element() -> None:
    root = {
        "t": "",
        "b": 0,
        "c": [
            {"t": "h2", "b": 10, "c": [_link(1, "Vec")]},
            {"t": "", "b": 20, "c": [{"t": "li", "b": 20, "c": [_link(2, "Examples")]}]},
            {"t": "li", "b": 30, "c": [{"t": "", "b": 30, "c": [_link(3, "push"), " appends"]}]},
            {"t": "li", "b": 40, "c": [{"t": "", "b": 40, "c": []}]},
            {"t": "h3", "b": 50, "c": ["Methods"]},
            {"t": "td", "b": 60, "c": [_link(4, "Order 1130")]},
        ],
    }
    text = render(_snapshot(root), ObservationConfig(style="compact", show_url=False)).text
    assert text.splitlines() == [
        "Title: T",
        "## link Vec [1]",
        "- link Examples [2]",
        "- link push [3]",
        "appends",
        "### Methods",
        "| link Order 1130 [4]",
    ]
    parsed = {e.id: (e.tag, e.text) for e in parse_elements(text, "compact")}
    assert parsed == {
        1: ("a", "Vec"),
        2: ("a", "Examples"),
        3: ("a", "push"),
        4: ("a", "Order 1130"),
    }


def test_compact_keeps_a_checkbox_with_its_label() -> None:
    def box(i: int, kind: str, name: str, **extra: str) -> dict[str, object]:
        return {"t": "input", "i": i, "a": {"type": kind, "name": name, **extra}, "b": 10, "c": []}

    root = {
        "t": "",
        "b": 0,
        "c": [
            {
                "t": "label",
                "b": 10,
                "c": [
                    box(1, "checkbox", "remember"),
                    {"t": "", "b": 10, "c": ["Remember this device"]},
                ],
            },
            {
                "t": "label",
                "b": 20,
                "c": [box(2, "radio", "area", checked=""), " Personal banking"],
            },
            {
                "t": "label",
                "b": 30,
                "c": ["Select all ", box(3, "checkbox", "all", **{"aria-label": "All rows"})],
            },
        ],
    }
    text = render(_snapshot(root), ObservationConfig(style="compact", show_url=False)).text
    assert text.splitlines() == [
        "Title: T",
        'checkbox remember "Remember this device" [1]',
        'radio area "Personal banking" (checked) [2]',
        'checkbox all "All rows" [3]',
    ]
    labels = {e.id: e.attrs["label"] for e in parse_elements(text, "compact")}
    assert labels == {1: "Remember this device", 2: "Personal banking", 3: "All rows"}
