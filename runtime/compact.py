"""How the "compact" observation style writes an element (made for small models).

`compact_element` gives one element's line: text then id, few attributes
(`link Electronics [3]`, `input q "Search products" = "shoes" [5]`, `checkbox remember
"Remember this device" [7]`); `PREFIX` holds the markers of headings, list items and
cells (`## `, `- `, `| `), which `runtime.observation` keeps on the line of their first
content. `runtime.reading` reads these lines back.
"""

from __future__ import annotations

from typing import Final

__all__ = ["FIELD_KINDS", "MARKERS", "PREFIX", "compact_element"]

PREFIX: Final = {
    "h1": "# ",
    "h2": "## ",
    "h3": "### ",
    "h4": "#### ",
    "h5": "##### ",
    "h6": "###### ",
    "li": "- ",
    "dt": "",
    "dd": "  ",
    "td": "| ",
    "th": "| ",
}

_KIND: Final = {"a": "link", "button": "button", "select": "select", "textarea": "textarea"}
_COMPACT_LABEL: Final = ("aria-label", "title", "alt", "name")
_COMPACT_HINT: Final = ("placeholder", "aria-label", "title")
FIELD_KINDS: Final = frozenset({"input", "select", "textarea", "checkbox", "radio"})
# Markers that only start a line: kept for the line's first content.
MARKERS: Final = frozenset(p.strip() for p in PREFIX.values() if p.strip())


def compact_element(
    element_id: int,
    tag: str,
    *,
    text: str,
    attrs: dict[str, str],
    options: tuple[str, ...],
    selected: list[int],
    label: str = "",
) -> str:
    """`link Electronics [3]`; form fields: `input q "Search" = "shoes" [5]` (kind, name,
    hint (placeholder, aria-label or title; else the text of the label around a checkbox
    or radio), current value)."""
    kind = _KIND.get(tag)
    if tag == "input":
        input_type = attrs.get("type", "text").lower()
        kind = input_type if input_type in ("checkbox", "radio", "submit", "button") else "input"
    if kind is None:
        kind = attrs.get("role") or tag
    if kind in FIELD_KINDS:
        parts = [kind]
        if attrs.get("name"):
            parts.append("".join(attrs["name"].split()))
        hint = next((attrs[n] for n in _COMPACT_HINT if attrs.get(n)), "") or label.strip()
        if hint:
            parts.append(f'"{_unquote(hint)}"')
        value = text if tag == "textarea" else attrs.get("value", "")
        if value and kind not in ("checkbox", "radio"):
            parts.append(f'= "{_unquote(value)}"')
        if "checked" in attrs:
            parts.append("(checked)")
        out = " ".join(parts)
        if tag == "select":
            shown = [f"{o} (selected)" if i in selected else o for i, o in enumerate(options)]
            return f"{out} [{element_id}]: {' | '.join(shown)}"
        return f"{out} [{element_id}]"
    label = text or next((attrs[n] for n in _COMPACT_LABEL if attrs.get(n)), "")
    if tag == "input" and not label:
        label = attrs.get("value", "")
    return f"{kind} {label} [{element_id}]" if label else f"{kind} [{element_id}]"


def _unquote(text: str) -> str:
    return text.replace('"', "'")
