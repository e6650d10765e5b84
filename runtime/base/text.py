"""Text that UTF-8 can hold, and lines that fit a budget.

A Python string can carry a lone UTF-16 surrogate (a page's script makes one with
`String.fromCharCode(0xD800)` and Playwright hands it over as is); UTF-8, and so msgspec
and every file written here, cannot. `well_formed` replaces each with U+FFFD.

A page also chooses the length of its title, of its URL (`history.replaceState`) and how
many dialogs it opens; `fit_lines` keeps such lines within a prompt's budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["fit_lines", "shorten", "well_formed", "well_formed_json", "well_formed_tree"]


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


# JSON.stringify writes a lone UTF-16 surrogate (a page's script makes one with
# String.fromCharCode(0xD800)) as an escape, "\ud800"; msgspec refuses such an escape and
# UTF-8 cannot hold the character, so each becomes U+FFFD. An escaped pair (high then low)
# is a character and stays, as does a backslash before "ud800" that is itself escaped (an
# even run of backslashes: page text).
_SURROGATE_ESCAPE = re.compile(
    r"(?<!\\)((?:\\\\)*)"  # an even run of backslashes: not an escape of its own
    r"(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a pair
    r"|\\u[dD][89a-fA-F][0-9a-fA-F]{2})"  # or a lone one
)


def _pair_or_replacement(match: re.Match[str]) -> str:
    escape = match[2]
    return match[1] + (escape if len(escape) == 12 else "\\ufffd")


def well_formed_json(payload: str) -> str:
    """JSON text with each escape of a lone surrogate replaced by the escape of U+FFFD."""
    if "\\u" not in payload:
        return payload
    return _SURROGATE_ESCAPE.sub(_pair_or_replacement, payload)


def shorten(text: str, limit: int = 60) -> str:
    """`text` on one line, cut to `limit` characters with "…"."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def fit_lines(
    lines: Sequence[str],
    budget: int,
    count_tokens: Callable[[str], int],
    *,
    line_chars: int,
    dropped: Callable[[int], str],
) -> list[str]:
    """`lines`, each `shorten`ed to `line_chars`, from the first while they fit in `budget`
    tokens (a line costs its tokens and one for its newline); the ones that do not are
    replaced by the line `dropped(count)`, which the budget leaves room for."""
    kept: list[str] = []
    used = 0
    for index, whole in enumerate(lines):
        line = shorten(whole, line_chars)
        cost = count_tokens(line) + 1
        last = index == len(lines) - 1
        reserve = 0 if last else count_tokens(dropped(len(lines))) + 1
        if used + cost + reserve > budget:
            return [*kept, dropped(len(lines) - index)]
        kept.append(line)
        used += cost
    return kept
