"""What the model sees of a page: interactive elements marked with ids, as simplified HTML.

`observe.js` (injected, package data) marks every visible interactive element (links,
buttons, inputs, selects, textareas, elements with click roles or `onclick`, editable
elements) with an integer id in DOM order (attribute `data-webagent-id`) and returns the
visible page as a small tree. `render()` turns that tree into text, deterministically:

- style "html" (WebAgent-R1): `<button id="25">Clear all</button>`; headings, paragraphs,
  list items and table rows one per line, table cells and labels kept, other markup
  dropped; attributes from `ObservationConfig.attributes` only; every text run cut to
  `max_text_chars`.
- style "compact" (for small models): text then id, few attributes:
  `link Electronics [3]`, `input Search products = "shoes" [5]`, `# Heading`, `- item`,
  table cells joined by ` | `.

The page is rendered from the current scroll position down: lines wholly above the
viewport are left out (`<!-- 12 lines above: Scroll Up -->`). A hard token budget
(`max_tokens`) cuts the rest with `<!-- truncated: 312 more lines below -->`. What goes
above the page (errors, notes, the URL, the title: the page sets all but the first) takes
at most half of it, each line at most 512 characters.

Tokens are counted with the `count_tokens` given (the policy's tokenizer when there is
one); the default `estimate_tokens` assumes 3 UTF-8 bytes per token, which over-counts
for BPE vocabularies of 32k+ (English and HTML average ~3.5-4.5 bytes per token there)
and so keeps the budget; with a small local vocabulary pass the real tokenizer.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from typing import Any, Final

import anyio
import msgspec
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page

from runtime.base.config import ObservationConfig
from runtime.base.text import fit_lines, shorten, well_formed_json
from runtime.compact import FIELD_KINDS, MARKERS, PREFIX, compact_element
from runtime.errors import BrowserError, ObservationError, is_closed

__all__ = [
    "FIELD_KINDS",
    "ID_ATTRIBUTE",
    "VOID_TAGS",
    "Element",
    "Observation",
    "Snapshot",
    "estimate_tokens",
    "observe",
    "observe_script",
    "render",
    "snapshot",
]

ID_ATTRIBUTE: Final = "data-webagent-id"
TokenCounter = Callable[[str], int]

# Tags that start a line of their own (their children stay on it unless they are blocks).
_LINE_TAGS: Final = frozenset(
    {
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "p",
        "li",
        "tr",
        "dt",
        "dd",
        "caption",
        "pre",
        "blockquote",
    }
)
# No space just inside the tags of line and cell elements: `<li> <a ..>x</a> </li>`.
_SPACED = "li|tr|td|th|p|h[1-6]|label|dt|dd|caption|pre|blockquote"
_TIGHT_OPEN: Final = re.compile(rf"(<(?:{_SPACED})>) ")
_TIGHT_CLOSE: Final = re.compile(rf" (</(?:{_SPACED})>)")
VOID_TAGS: Final = frozenset({"input", "img"})


def estimate_tokens(text: str) -> int:
    """A conservative token count: one token per 3 UTF-8 bytes, rounded up."""
    return (len(text.encode("utf-8")) + 2) // 3


@cache
def observe_script() -> str:
    """The JavaScript function injected into pages (runtime/observe.js)."""
    return files("runtime").joinpath("observe.js").read_text(encoding="utf-8")


_ATTEMPTS = 3
# Characters a line above the page (an error, a note, the URL, the title) keeps.
_HEAD_LINE_CHARS = 512
_NAVIGATED = ("Execution context was destroyed", "Cannot find context", "navigat")


def _navigated(exc: PlaywrightError) -> bool:
    """Did a navigation interrupt the script (rather than the browser failing)?"""
    return any(marker in str(exc) for marker in _NAVIGATED)


@cache
def _wrapped_script() -> str:
    """observe.js returning its result as one JSON string: Playwright's own transfer of a
    large object tree costs ~10x the script itself (0.5 s against 0.03 s on a big table)."""
    return f"(args) => JSON.stringify(({observe_script().strip()})(args))"


@dataclass(frozen=True, slots=True)
class Element:
    """One interactive element of an observation, as the model sees it."""

    id: int
    tag: str
    text: str
    attrs: dict[str, str] = field(default_factory=dict)
    # The option texts of a <select>.
    options: tuple[str, ...] = ()
    # tag|text|name|type, as observe.js computes it; checked again before acting.
    fingerprint: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What observe.js returned for one page."""

    url: str
    title: str
    scroll_y: int
    viewport_height: int
    page_height: int
    root: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Observation:
    """One rendered page: the text the model reads and the ids it may act on."""

    url: str
    title: str
    text: str
    digest: str
    elements: dict[int, Element]
    tokens: int
    lines_above: int = 0
    lines_below: int = 0
    # Page y of the bottom of the last line shown (where Scroll Down continues).
    shown_bottom: int = 0
    scroll_y: int = 0
    viewport_height: int = 0


async def snapshot(page: Page, config: ObservationConfig, *, timeout_s: float) -> Snapshot:
    """Run observe.js on `page` (under a cancel scope: evaluate has no timeout)."""
    args = {
        "idAttr": ID_ATTRIBUTE,
        "maxText": config.max_text_chars,
        "attributes": list(config.attributes),
    }
    payload: str | None = None
    with anyio.move_on_after(timeout_s):
        # A navigation that commits while the script runs destroys its context: wait
        # for the new page to load and observe that one instead.
        for attempt in range(_ATTEMPTS):
            try:
                payload = await page.evaluate(_wrapped_script(), args)
                break
            except PlaywrightError as exc:
                if is_closed(exc):
                    raise BrowserError(f"observe the page: {exc}") from exc
                if attempt + 1 == _ATTEMPTS or not _navigated(exc):
                    raise ObservationError(f"the page could not be observed: {exc}") from exc
                with contextlib.suppress(PlaywrightError):
                    await page.wait_for_load_state("load")
    if payload is None:
        raise ObservationError(f"the page did not answer within {timeout_s:g} s")
    raw = _decode_payload(payload)
    return Snapshot(
        url=str(raw["url"]),
        title=str(raw["title"]),
        scroll_y=int(raw["scrollY"]),
        viewport_height=int(raw["viewportHeight"]),
        page_height=int(raw["pageHeight"]),
        root=raw["root"],
    )


def _decode_payload(payload: str) -> dict[str, Any]:
    """observe.js's JSON, lone surrogates replaced; ObservationError if unreadable."""
    try:
        raw: dict[str, Any] = msgspec.json.decode(well_formed_json(payload))
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ObservationError(f"the page's observation is not readable: {exc}") from exc
    return raw


async def observe(
    page: Page,
    config: ObservationConfig,
    *,
    timeout_s: float,
    header: Sequence[str] = (),
    count_tokens: TokenCounter = estimate_tokens,
) -> Observation:
    """Mark and render `page`; `header` lines (errors, notices, tabs) go first."""
    snap = await snapshot(page, config, timeout_s=timeout_s)
    return render(snap, config, header=header, count_tokens=count_tokens)


# --------------------------------------------------------------------------- rendering


@dataclass(slots=True)
class _Line:
    text: str
    bottom: int


# A line longer than this is wrapped where one piece (a text run, an element) ends, so a
# block of many links (a list of search results) cannot fill the whole budget as one line.
_WRAP_CHARS: Final = 320


class _Writer:
    """Collects lines; `style` decides how each node is written."""

    def __init__(self, config: ObservationConfig) -> None:
        if config.style == "auto":
            raise ValueError(
                'observation.style "auto" is settled against the model before episodes run '
                "(policy.profile.settle_auto)"
            )
        self.config = config
        self.compact = config.style == "compact"
        self.lines: list[_Line] = []
        self.elements: dict[int, Element] = {}
        # The current line: pieces with their bottom edges.
        self._parts: list[tuple[str, int]] = []

    # -- line buffer
    def put(self, text: str, bottom: int) -> None:
        """Append to the current line (spacing comes from the page's own whitespace)."""
        if text:
            self._parts.append((text, bottom))

    def _marker_only(self) -> bool:
        """Does the current line hold only a compact list or heading marker?"""
        return self.compact and "".join(p for p, _ in self._parts).strip() in MARKERS

    def drop_marker(self) -> None:
        if self._marker_only():
            self._parts = []

    def flush(self) -> None:
        if self._marker_only():
            return  # "- " waits for the item's first content: "- link Examples [6]"
        start = 0
        length = 0
        for index, (piece, _) in enumerate(self._parts):
            length += len(piece)
            if (
                length >= _WRAP_CHARS
                and index + 1 < len(self._parts)
                and not self._parts[index + 1][0].lstrip().startswith("</")  # not "</p>" alone
            ):
                self._line(self._parts[start : index + 1])
                start, length = index + 1, 0
        self._line(self._parts[start:])
        self._parts = []

    def _line(self, parts: list[tuple[str, int]]) -> None:
        text = " ".join("".join(p for p, _ in parts).split())
        if not self.compact:
            text = _TIGHT_OPEN.sub(r"\1", text)
            text = _TIGHT_CLOSE.sub(r"\1", text)
        if text:
            self.lines.append(_Line(text, max(b for _, b in parts)))

    # -- nodes
    def block(self, node: Any, bottom: int) -> None:
        """Write `node` at block level: line tags and blocks start new lines."""
        if isinstance(node, str):
            self.put(self.text(node), bottom)
            return
        tag: str = node["t"]
        here = int(node.get("b", bottom)) or bottom
        if "i" in node:
            if self.compact:  # one element per line: "link Electronics [3]"
                self.flush()
                self.put(self.interactive(node), here)
                self.flush()
            else:
                self.put(self.interactive(node), here)
            return
        if self.compact and tag == "label":
            box = _lone_box(node)
            if box is not None:  # "checkbox remember "Remember this device" [7]"
                self.flush()
                self.put(self.interactive(box, label=self.inline(_without(node, box))), here)
                self.flush()
                return
        if tag in ("", "table") or tag in _LINE_TAGS:
            self.flush()
            if tag in _LINE_TAGS:
                self.drop_marker()  # an empty item's marker gives way to this line's
            if tag == "table" and not self.compact:
                self.put("<table>", here)
                self.flush()
            elif tag in _LINE_TAGS:
                self.put(self._open(tag, node) if not self.compact else PREFIX.get(tag, ""), here)
            for child in node["c"]:
                self.block(child, here)
            if tag in _LINE_TAGS and not self.compact:
                self.put(f"</{tag}>", here)
            self.flush()
            self.drop_marker()
            if tag == "table" and not self.compact:
                self.put("</table>", here)
                self.flush()
            return
        if self.compact and _has_interactive(node):
            self.put(PREFIX.get(tag, ""), here)
            for child in node["c"]:
                self.block(child, here)
            return
        self.put(self.inline(node), here)

    def inline(self, node: Any) -> str:
        """`node` and everything under it on one line."""
        if isinstance(node, str):
            return self.text(node)
        if "i" in node:
            return self.interactive(node)
        tag: str = node["t"]
        inner = self._inline_children(node["c"])
        if self.compact:
            if tag == "img":
                return f"image {node['a'].get('alt', '')}"
            if tag in ("td", "th"):
                return f" | {inner} "
            return inner
        if tag == "":
            return inner
        if tag in VOID_TAGS:
            return self._open(tag, node)
        return f"{self._open(tag, node)}{inner}</{tag}>"

    def _inline_children(self, children: list[Any]) -> str:
        """Children on one line; a block among them is set off by spaces, as a browser
        would break the line ("struct std::vec::Vec A contiguous growable array")."""
        parts = []
        for child in children:
            text = self.inline(child)
            if not isinstance(child, str) and "i" not in child and _is_block(child["t"]):
                text = f" {text} "
            parts.append(text)
        return " ".join("".join(parts).split())

    def interactive(self, node: Any, *, label: str = "") -> str:
        element_id = int(node["i"])
        tag: str = node["t"]
        attrs: dict[str, str] = {
            k: _clip(str(v), self.config.max_text_chars) for k, v in node["a"].items()
        }
        if tag == "select":
            options = tuple(self.text(o["c"][0]).strip() if o["c"] else "" for o in node["c"])
            selected = [i for i, o in enumerate(node["c"]) if "selected" in o.get("a", {})]
            inner_nodes = node["c"]
            text = ""
        else:
            options = ()
            selected = []
            inner_nodes = node["c"]
            text = self._inline_children(inner_nodes)
        self.elements[element_id] = Element(
            id=element_id,
            tag=tag,
            text=_plain(text),
            attrs=attrs,
            options=options,
            fingerprint=str(node.get("f", "")),
        )
        if self.compact:
            return compact_element(
                element_id,
                tag,
                text=text,
                attrs=attrs,
                options=options,
                selected=selected,
                label=label,
            )
        open_tag = self._open(tag, {"a": attrs}, element_id=element_id)
        if tag == "select":
            inner = "".join(
                f"<option{' selected' if i in selected else ''}>{_escape(opt)}</option>"
                for i, opt in enumerate(options)
            )
            return f"{open_tag}{inner}</select>"
        if tag in VOID_TAGS:
            return open_tag
        return f"{open_tag}{text}</{tag}>"

    def text(self, raw: str) -> str:
        clipped = _clip(raw, self.config.max_text_chars, keep_edges=True)
        return clipped if self.compact else _escape(clipped)

    def _open(self, tag: str, node: Any, *, element_id: int | None = None) -> str:
        parts = [tag]
        if element_id is not None:
            parts.append(f'id="{element_id}"')
        for name in self.config.attributes:
            value = node.get("a", {}).get(name)
            if value is None:
                continue
            parts.append(name if value == "" else f'{name}="{_attr(value)}"')
        return "<" + " ".join(parts) + ">"


def _is_block(tag: str) -> bool:
    return tag in ("", "table", "td", "th") or tag in _LINE_TAGS


def _interactives(node: Any) -> list[Any]:
    if isinstance(node, str):
        return []
    if "i" in node:
        return [node]
    return [found for child in node["c"] for found in _interactives(child)]


def _lone_box(label: Any) -> Any:
    """The one checkbox or radio inside a label with no other control, or None."""
    found = _interactives(label)
    if len(found) != 1 or found[0]["t"] != "input":
        return None
    kind = str(found[0]["a"].get("type", "")).lower()
    return found[0] if kind in ("checkbox", "radio") else None


def _without(node: Any, target: Any) -> Any:
    """`node`'s tree without `target` (the label's text around its checkbox)."""
    if isinstance(node, str):
        return node
    return {**node, "c": [_without(c, target) for c in node["c"] if c is not target]}


def _has_interactive(node: Any) -> bool:
    if isinstance(node, str):
        return False
    return "i" in node or any(_has_interactive(child) for child in node["c"])


def _clip(text: str, limit: int, *, keep_edges: bool = False) -> str:
    """`text` cut to `limit` characters with an ellipsis (edge spaces kept if asked)."""
    if len(text.strip()) <= limit:
        return text if keep_edges else text.strip()
    core = text.strip()[: max(limit - 1, 1)].rstrip() + "…"
    if keep_edges:
        lead = " " if text[:1].isspace() else ""
        trail = " " if text[-1:].isspace() else ""
        return lead + core + trail
    return core


_TAG_LIKE = re.compile(r"<(?=[A-Za-z/!?])")


def _escape(text: str) -> str:
    """Text that cannot be read as markup: only a `<` that starts a tag is escaped."""
    return _TAG_LIKE.sub("&lt;", text)


def _attr(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;")


def _plain(rendered: str) -> str:
    """Visible text of an inline rendering (tags of nested elements removed)."""
    return " ".join(re.sub(r"<[^>]*>", " ", rendered).split()).replace("&lt;", "<")


def render(
    snap: Snapshot,
    config: ObservationConfig,
    *,
    header: Sequence[str] = (),
    count_tokens: TokenCounter = estimate_tokens,
) -> Observation:
    """The observation text of `snap`: header, then lines from the scroll position down,
    cut to `config.max_tokens` tokens (as `count_tokens` counts them)."""
    writer = _Writer(config)
    writer.block(snap.root, 0)
    writer.flush()
    lines = writer.lines
    above = 0
    if snap.scroll_y > 0:
        kept = [line for line in lines if line.bottom > snap.scroll_y]
        above = len(lines) - len(kept)
        lines = kept
    own = [f"URL: {snap.url}"] if config.show_url else []
    if snap.title:
        own.append(f"Title: {snap.title}")
    if above:
        own.append(f"<!-- {above} lines above: Scroll Up to see them -->")
    # The page sets its title, URL and dialogs: each line is cut, and the notes past half
    # the budget are counted, not shown (a 200,000-character title made an observation of
    # 120,890 tokens).
    own = [shorten(line, _HEAD_LINE_CHARS) for line in own]
    budget = config.max_tokens
    room = budget // 2 - sum(count_tokens(line) + 1 for line in own)
    head = [
        *fit_lines(header, room, count_tokens, line_chars=_HEAD_LINE_CHARS, dropped=_more),
        *own,
    ]
    used = sum(count_tokens(line) + 1 for line in head)
    shown: list[_Line] = []
    marker_reserve = count_tokens("<!-- truncated: 100000 more lines below -->") + 1
    for index, line in enumerate(lines):
        cost = count_tokens(line.text) + 1
        rest_needs_marker = index < len(lines) - 1
        room = budget - used - (marker_reserve if rest_needs_marker else 0)
        if cost > room:
            if not shown:  # one line longer than the budget: show what fits of it
                part = _cut_to(line.text, room - 1, count_tokens)
                if part:
                    shown.append(_Line(part, line.bottom))
            break
        shown.append(line)
        used += cost
    text = _assemble(head, shown, len(lines) - len(shown))
    # Counting line by line may differ from counting the whole text: drop lines to fit.
    while count_tokens(text) > budget and shown:
        drop = max(1, len(shown) // 8)
        shown = shown[:-drop]
        text = _assemble(head, shown, len(lines) - len(shown))
    elements = _visible_elements(writer, shown)
    return Observation(
        url=snap.url,
        title=snap.title,
        text=text,
        digest=hashlib.sha256(text.encode("utf-8")).hexdigest()[:16],
        elements=elements,
        tokens=count_tokens(text),
        lines_above=above,
        lines_below=len(lines) - len(shown),
        shown_bottom=shown[-1].bottom if shown else snap.scroll_y,
        scroll_y=snap.scroll_y,
        viewport_height=snap.viewport_height,
    )


def _cut_to(text: str, tokens: int, count_tokens: TokenCounter) -> str:
    """The longest prefix of `text` (plus an ellipsis) that counts at most `tokens`."""
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if count_tokens(text[:mid] + "…") <= tokens:
            low = mid
        else:
            high = mid - 1
    return text[:low].rstrip() + "…" if low else ""


def _more(count: int) -> str:
    return f"Note: {count} more notes and errors not shown"


def _assemble(head: list[str], shown: list[_Line], below: int) -> str:
    body = [line.text for line in shown]
    if below:
        body.append(f"<!-- truncated: {below} more lines below -->")
    return "\n".join([*head, *body])


def _visible_elements(writer: _Writer, shown: list[_Line]) -> dict[int, Element]:
    """The elements whose ids appear in the shown text (the only ones the model can use)."""
    text = "\n".join(line.text for line in shown)
    if writer.compact:
        present = {int(m) for m in re.findall(r"\[(\d+)\]", text)}
    else:
        present = {int(m) for m in re.findall(r' id="(\d+)"', text)}
    return {i: e for i, e in writer.elements.items() if i in present}
