"""Reading a rendered observation back into its interactive elements.

`parse_elements(text, style)` reads only what the model reads; the oracle resolves its
plan steps with it, so a plan works exactly when the ids it needs are in the text.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Final

from runtime.observation import FIELD_KINDS, VOID_TAGS, Element

__all__ = ["compact_shown_as", "parse_elements"]


class _ElementParser(HTMLParser):
    """Reads back the interactive elements of an "html" style observation."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[Element] = []
        self._open: list[tuple[int, str, dict[str, str], list[str], list[str]]] = []
        self._option: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: ("" if v is None else v) for k, v in attrs}
        if tag == "option" and self._open:
            self._option = []
            return
        raw_id = values.pop("id", None)
        if raw_id is None or not raw_id.isdecimal():
            return
        if tag in VOID_TAGS:
            self.found.append(Element(id=int(raw_id), tag=tag, text="", attrs=values))
            return
        self._open.append((int(raw_id), tag, values, [], []))

    def handle_endtag(self, tag: str) -> None:
        if tag == "option" and self._option is not None and self._open:
            self._open[-1][4].append(" ".join("".join(self._option).split()))
            self._option = None
            return
        if self._open and self._open[-1][1] == tag:
            element_id, name, attrs, text, options = self._open.pop()
            self.found.append(
                Element(
                    id=element_id,
                    tag=name,
                    text=" ".join("".join(text).split()),
                    attrs=attrs,
                    options=tuple(options),
                )
            )

    def handle_data(self, data: str) -> None:
        if self._option is not None:
            self._option.append(data)
            return
        for entry in self._open:
            entry[3].append(data)


def parse_elements(text: str, style: str = "html") -> list[Element]:
    """The interactive elements of a rendered observation, in id order.

    This reads only what the model reads; the oracle resolves its targets with it.
    For "compact" observations tags are recovered from the kind word (link -> a) and the
    label is the only attribute (under "label").
    """
    if style == "compact":
        return sorted(_parse_compact(text), key=lambda e: e.id)
    parser = _ElementParser()
    for line in text.splitlines():
        if line.startswith(("URL: ", "Title: ", "Error: ", "Note: ", "Tabs: ")):
            continue
        parser.feed(line + "\n")
    parser.close()
    return sorted(parser.found, key=lambda e: e.id)


_COMPACT_ELEMENT: Final = re.compile(
    r"^(?P<kind>[A-Za-z][\w-]*)(?: (?P<body>.*?))? \[(?P<id>\d+)\](?:: (?P<opts>.*))?$"
)
_COMPACT_FIELD: Final = re.compile(
    r'^(?P<name>[^\s"]+)?\s*(?:"(?P<hint>[^"]*)")?\s*(?:= "(?P<value>[^"]*)")?\s*'
    r"(?P<checked>\(checked\))?$"
)
_TAG_OF_KIND: Final = {"link": "a", "checkbox": "input", "radio": "input", "submit": "input"}
# A list item's or heading's marker before its first element: "- link Examples [6]".
_COMPACT_MARKER: Final = re.compile(r"^(?:#{1,6}|-|\|) ")


def compact_shown_as(text: str, element: int) -> str | None:
    """How a compact observation shows element `element`, without its id and list or
    heading marker ("link Refactor: install guide", 'textbox q "Search"'); None when no
    line of `text` is that element."""
    for line in text.splitlines():
        match = _COMPACT_ELEMENT.match(_COMPACT_MARKER.sub("", line, count=1))
        if match is not None and int(match["id"]) == element:
            return f"{match['kind']} {match['body'] or ''}".strip()
    return None


def _parse_compact(text: str) -> list[Element]:
    found: list[Element] = []
    for line in text.splitlines():
        match = _COMPACT_ELEMENT.match(_COMPACT_MARKER.sub("", line, count=1))
        if match is None:
            continue
        kind = match["kind"]
        body = (match["body"] or "").strip()
        attrs = {"kind": kind}
        options: tuple[str, ...] = ()
        if match["opts"] is not None:
            options = tuple(o.removesuffix(" (selected)") for o in match["opts"].split(" | "))
        field = _COMPACT_FIELD.match(body) if kind in FIELD_KINDS else None
        if field is not None:
            for name in ("name", "value"):
                if field[name] is not None:
                    attrs[name] = field[name]
            if field["checked"]:
                attrs["checked"] = ""
            body = field["hint"] or ""
        attrs["label"] = body
        found.append(
            Element(
                id=int(match["id"]),
                tag=_TAG_OF_KIND.get(kind, kind),
                text=attrs.get("value", body) if kind == "textarea" else body,
                attrs=attrs,
                options=options,
            )
        )
    return found
