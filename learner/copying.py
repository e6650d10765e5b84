"""Synthetic look-up-and-copy turns: BC data for tiny models that only copying can fit.

Behaviour-cloned on the oracle's demonstrations, the tiny model learns each step's
command but writes a frequent training entity where the task names another one ("Enter
the start Adams Academy." for "Nelson Park"): `python -m bench.errors` finds 31% of the
test turns there, the largest class of wrong turns. Every entity here is a fresh draw of
1-3 words of the sites' own vocabulary (or a number), so no prior predicts it and the loss
falls only once the model copies: the entity from the task into the thought and the
argument, the element id from the page line that holds the entity, the value from the
line that names the entity.

Each turn is the first round of a one-page episode, rendered as rollouts render it:
`Task: ...`, a compact page (`link Kelby Socks [7]`), and a reply in the demonstrations'
form. Three kinds, in equal shares:

    open    "Open E." on a page of links and buttons      -> Click on E's id
    enter   "Search for E." on a page with a search input -> Search E in the input
    read    "What is the F of E?" on a page of "E: F V"   -> exit(message="V")

Measured (`bench.recipe --minutes 22 --copy-turns 6000`, idle 2-core machine): with as many
copy turns as demonstration turns, 22 minutes of BC reached held-out whole turns 0.16
against 0.26 without them, 0/219 test tasks closed-loop, and the checkpoint copied none of
150 fresh copy turns (`bench.errors --copy`). So `bc.copy_turns` is 0 by default.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import NamedTuple

from runtime.messages import TrajectoryGroup

__all__ = ["CopyTurn", "copy_turns", "vocabulary"]

_WORD = re.compile(r"\b[A-Za-z][a-z]{2,11}\b(?!…)")  # not a word cut short by "…"
_FIELDS = ("price", "status", "score", "count", "code", "date", "total", "rating")
_ROLES = ("link", "link", "link", "button")


class CopyTurn(NamedTuple):
    """One synthetic turn."""

    intent: str
    observation: str
    reply: str


def vocabulary(groups: Sequence[TrajectoryGroup], limit: int = 4000) -> list[str]:
    """Words of the demonstrations' intents and pages (letters only, 3-12 long), the most
    frequent `limit`, capitalised, in a fixed order."""
    counts: dict[str, int] = {}
    for group in groups:
        for traj in group.trajectories:
            texts = [traj.intent, *(turn.observation for turn in traj.turns)]
            for text in texts:
                for word in _WORD.findall(text):
                    key = word.capitalize()
                    counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts, key=lambda w: (-counts[w], w))[:limit]
    return sorted(ranked)


def copy_turns(words: Sequence[str], n: int, seed: int) -> list[CopyTurn]:
    """`n` synthetic turns drawn with `seed` (see the module doc)."""
    if len(words) < 20:
        raise ValueError(f"a vocabulary of {len(words)} words is too small for copy turns")
    rng = random.Random(seed)
    makers = (_open, _enter, _read)
    return [makers[i % 3](rng, words) for i in range(n)]


def _entity(rng: random.Random, words: Sequence[str]) -> str:
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))


def _entities(rng: random.Random, words: Sequence[str], k: int) -> list[str]:
    out: list[str] = []
    while len(out) < k:
        entity = _entity(rng, words)
        if entity not in out:
            out.append(entity)
    return out


def _value(rng: random.Random, field: str) -> str:
    if field == "date":
        return f"2023-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if field == "price":
        return f"${rng.randint(1, 999)}.{rng.randint(0, 99):02d}"
    if field == "status":
        return rng.choice(("Pending", "Complete", "Closed", "Open", "Canceled", "Processing"))
    return str(rng.randint(0, 9999))


def _header(rng: random.Random, words: Sequence[str]) -> list[str]:
    title = _entity(rng, words)
    return [f"URL: http://127.0.0.1:{rng.randint(30000, 60000)}/", f"Title: {title}", f"# {title}"]


def _open(rng: random.Random, words: Sequence[str]) -> CopyTurn:
    names = _entities(rng, words, rng.randint(5, 20))
    target = rng.randrange(len(names))
    first = rng.randint(1, 12)
    lines = _header(rng, words)
    lines += [f"{rng.choice(_ROLES)} {name} [{first + i}]" for i, name in enumerate(names)]
    name = names[target]
    reply = (
        f"<think>Open {name}.</think>"
        f'<answer>do(action="Click", element="{first + target}")</answer>'
    )
    return CopyTurn(f"Open {name}.", "\n".join(lines), reply)


def _enter(rng: random.Random, words: Sequence[str]) -> CopyTurn:
    names = _entities(rng, words, rng.randint(4, 12))
    query = _entity(rng, words)
    at = rng.randrange(len(names) + 1)
    lines = _header(rng, words)
    items = [f"{rng.choice(_ROLES)} {name}" for name in names]
    items.insert(at, 'input q "Search"')
    first = rng.randint(1, 12)
    lines += [f"{item} [{first + i}]" for i, item in enumerate(items)]
    reply = (
        f"<think>Search for {query}.</think>"
        f'<answer>do(action="Search", argument="{query}", element="{first + at}")</answer>'
    )
    return CopyTurn(f"Search for {query}.", "\n".join(lines), reply)


def _read(rng: random.Random, words: Sequence[str]) -> CopyTurn:
    field = rng.choice(_FIELDS)
    names = _entities(rng, words, rng.randint(3, 12))
    values = [_value(rng, field) for _ in names]
    target = rng.randrange(len(names))
    lines = _header(rng, words)
    lines += [f"- {name}: {field} {value}" for name, value in zip(names, values, strict=True)]
    name, value = names[target], values[target]
    reply = f'<think>{name} has {field} {value}.</think><answer>exit(message="{value}")</answer>'
    return CopyTurn(f"What is the {field} of {name}?", "\n".join(lines), reply)
