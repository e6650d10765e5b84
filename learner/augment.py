"""Entity-swapped copies of demonstrations: BC data that only copying can fit.

Behaviour-cloned on the built-in suite's oracle demonstrations, the tiny model learns each
step's kind but writes the wrong entity: "Search the map for Bell Market" when the task
asks about Moore Market. The train split names a few hundred entities, each often enough
to be memorised, so predicting a frequent one lowers the loss before copying from the
task does (issue 8's measurements). A swapped copy renames a trajectory's task entities
consistently, in its intent, every observation and every completion, to entities of other
tasks of the same shape; in the copy the entity can only be predicted by copying it.

Entities of an intent: its quoted strings ('...'), its numbers of four characters or more
(order numbers, dates, prices; shorter ones are left alone: element ids and counts are
on every page), and maximal runs of name words: words in under `rare` of all intents, or
capitalised words after the first in under `names` of them (brands: "Lumos"); "&" may
join them ("Sports & Outdoors"). Shapes: quoted strings swap with
quoted strings, numbers with numbers of the same digit pattern, word runs with runs of
the same number of words and the same case pattern. Renaming is whole-word, all entities
of a trajectory in one pass (a swap chain cannot rename twice).
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from collections.abc import Sequence

import msgspec

from runtime.messages import Trajectory, TrajectoryGroup

__all__ = ["entities", "swapped_copies"]

_QUOTED = re.compile(r"'(.+?)'(?=[\s.,?!]|$)")
_NUMBER = re.compile(r"^\d[\d.,:-]*\d$")  # 1129, 2023-12-01, 51.95
_WORD = re.compile(r"[\w][\w/&.'-]*|&")
_TRAILING = ".,?!:;'"


def _words(text: str) -> list[str]:
    return [w.rstrip(_TRAILING) for w in _WORD.findall(text)]


def _shape(entity: str, quoted: bool) -> str:
    if quoted:
        return "'"
    if _NUMBER.match(entity):
        return re.sub(r"\d", "9", entity)
    marks = []
    for word in entity.split():
        marks.append(
            "&" if word == "&" else "/" if "/" in word else "_" if "_" in word
            else "A" if word[0].isupper() else "a"
        )  # fmt: skip
    return " ".join(marks)


def entities(
    intent: str, frequency: Counter[str], intents: int, *, rare: float, names: float
) -> list[str]:
    """The entities of `intent` (see the module doc); `frequency` counts, per word, the
    intents holding it, out of `intents`."""
    first = next(iter(_words(intent)), "")

    def is_name(word: str) -> bool:
        share = frequency[word] / intents
        capital = word[0].isupper() and any(c.islower() for c in word) and word != first
        return share < rare or (capital and share < names)

    parts = _QUOTED.split(intent)  # text, quoted, text, quoted, ..., text
    found = parts[1::2]
    for text in parts[::2]:
        run: list[str] = []
        for word in [*_words(text), ""]:  # "" ends the last run
            joins = word == "&" and bool(run)  # "Sports & Outdoors"
            if joins or (word and not word[0].isdigit() and is_name(word)):
                run.append(word)
            else:
                while run and run[-1] == "&":
                    run.pop()
                if run:
                    found.append(" ".join(run))
                run = []
                if _NUMBER.match(word) and len(word) >= 4:
                    found.append(word)
    return found


def _rename(text: str, pattern: re.Pattern[str], mapping: dict[str, str]) -> str:
    return pattern.sub(lambda m: mapping[m.group(0)], text)


def swapped_copies(
    groups: Sequence[TrajectoryGroup],
    copies: int,
    seed: int,
    *,
    rare: float = 0.02,
    names: float = 0.06,
) -> list[TrajectoryGroup]:
    """`copies` entity-swapped copies of every group (the originals not included), with
    new group and episode ids; trajectories without entities are not copied."""
    if copies <= 0:
        return []
    intents = {t.intent for g in groups for t in g.trajectories}
    frequency: Counter[str] = Counter()
    for intent in intents:
        frequency.update(set(_words(intent)))
    pool: dict[str, set[str]] = defaultdict(set)
    found: dict[str, list[tuple[str, str]]] = {}
    for intent in intents:
        quoted = set(_QUOTED.findall(intent))
        named = entities(intent, frequency, len(intents), rare=rare, names=names)
        found[intent] = [(e, _shape(e, e in quoted)) for e in named]
        for entity, shape in found[intent]:
            pool[shape].add(entity)
    choices = {shape: sorted(members) for shape, members in pool.items()}
    rng = random.Random(seed)
    out: list[TrajectoryGroup] = []
    for copy in range(copies):
        for group in groups:
            trajectories = []
            for traj in group.trajectories:
                mapping = {}
                for entity, shape in found[traj.intent]:
                    others = [e for e in choices[shape] if e != entity]
                    if others:
                        mapping[entity] = rng.choice(others)
                if mapping:
                    trajectories.append(_swap(traj, mapping, f"swap{copy}"))
            if trajectories:
                out.append(
                    msgspec.structs.replace(
                        group, group_id=f"{group.group_id}-swap{copy}", trajectories=trajectories
                    )
                )
    return out


def _swap(traj: Trajectory, mapping: dict[str, str], tag: str) -> Trajectory:
    names = sorted(mapping, key=len, reverse=True)
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(n) for n in names) + r")(?!\w)")
    turns = [
        msgspec.structs.replace(
            turn,
            observation=_rename(turn.observation, pattern, mapping),
            text=_rename(turn.text, pattern, mapping),
        )
        for turn in traj.turns
    ]
    return msgspec.structs.replace(
        traj,
        episode_id=f"{traj.episode_id}-{tag}",
        intent=_rename(traj.intent, pattern, mapping),
        turns=turns,
    )
