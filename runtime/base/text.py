"""Text that UTF-8 can hold.

A Python string can carry a lone UTF-16 surrogate (a page's script makes one with
`String.fromCharCode(0xD800)` and Playwright hands it over as is); UTF-8, and so msgspec
and every file written here, cannot. These replace each with U+FFFD.
"""

from __future__ import annotations

from typing import Any

__all__ = ["well_formed", "well_formed_tree"]


def well_formed(text: str) -> str:
    """`text` with each lone surrogate (no UTF-8 holds one) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text


def well_formed_tree(value: Any) -> Any:
    """A tree of builtins (`msgspec.to_builtins`) with `well_formed` strings, keys included."""
    if isinstance(value, str):
        return well_formed(value)
    if isinstance(value, dict):
        return {well_formed_tree(k): well_formed_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [well_formed_tree(v) for v in value]
    return value
