"""bench/copyform.py: its synthetic copy tasks, and a few training steps on the tiny model."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from bench import copyform
from policy.prompt import PromptRenderer


def test_repeat_targets_are_the_second_run_after_its_first_token() -> None:
    pool = list(range(100, 140))
    for gap in (0, 7):
        ids, labels = copyform.repeat_sequence(random.Random(1), pool, gap)
        run = ids[: copyform.RUN]
        assert len(ids) == len(labels) == 2 * copyform.RUN + gap
        assert ids[copyform.RUN + gap :] == run
        targets = [(k, t) for k, t in enumerate(labels) if t != copyform.IGNORE]
        assert [t for _, t in targets] == run[1:]
        assert targets[0][0] == copyform.RUN + gap + 1  # the run's first token is no target


def test_shifted_copies_stand_at_different_distances() -> None:
    pool = list(range(100, 140))
    distances = set()
    for seed in range(20):
        ids, labels = copyform.shifted_sequence(random.Random(seed), pool)
        assert len(ids) == len(labels)
        targets = [(k, t) for k, t in enumerate(labels) if t != copyform.IGNORE]
        run = [ids[targets[0][0] - 1]] + [t for _, t in targets]
        assert 8 <= len(run) <= 40
        assert ids[-len(run) :] == run
        assert [ids[k] for k, _ in targets] == [t for _, t in targets]
        start = next(k for k in range(len(ids)) if ids[k : k + len(run)] == run)
        distances.add(len(ids) - len(run) - start)
    assert len(distances) > 10  # no fixed offset to attend to


@pytest.mark.parametrize("id_first", [False, True])
def test_lookup_targets_are_the_ids_after_the_queried_words(
    tiny_model: Path, id_first: bool
) -> None:
    renderer = PromptRenderer.from_model(tiny_model)
    words = copyform.site_words()
    assert len(words) > 50 and all(w.isalpha() for w in words)
    ids, labels = copyform.lookup_sequence(
        random.Random(3), renderer.encode, words, id_first=id_first
    )
    assert len(ids) == len(labels)
    text = renderer.decode(ids)
    page, *queries = text.split("click ")
    assert len(queries) == 4
    # Each page line as {"link Kelby Socks": "7]"}, whichever side of the words the id is on.
    pattern = r"(\w+) \[(\d+\])\s(.+)" if id_first else r"(\w+) (.+) \[(\d+\])"
    lines = {}
    for line in page.strip().split("\n"):
        role, *rest = re.fullmatch(pattern, line).groups()  # type: ignore[union-attr]
        number, key = rest if id_first else reversed(rest)
        lines[f"{role} {key}"] = number
    answers = []
    for query in queries:
        key, number = query.strip().rsplit(" [", 1)
        on_page = lines.get(f"link {key}", lines.get(f"button {key}"))
        assert on_page == number
        answers.append(f" [{number}")
    # The targets decode to the queries' ids and nothing else.
    spans, span = [], []
    for token, label in zip(ids, labels, strict=True):
        if label != copyform.IGNORE:
            assert label == token
            span.append(token)
        elif span:
            spans.append(renderer.decode(span))
            span = []
    assert spans == answers


def test_a_few_steps_make_a_curve(tiny_model: Path) -> None:
    pool = list(range(200, 260))
    result = copyform.train(
        tiny_model,
        lambda rng: copyform.repeat_sequence(rng, pool),
        steps=3,
        batch=4,
        lr=1e-3,
        seed=0,
    )
    assert result["steps"] == 3
    steps = [s for s, _, _ in result["curve"]]
    assert steps[0] == 0 and steps == sorted(steps)
    assert all(0.0 <= acc <= 1.0 for _, _, acc in result["curve"])
    assert result["targets_per_sequence"] == copyform.RUN - 1
    assert result["sequence_tokens"] == 2 * copyform.RUN
