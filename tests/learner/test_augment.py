"""Entity-swapped copies of demonstrations (learner.augment)."""

from __future__ import annotations

from collections import Counter

from learner.augment import entities, swapped_copies
from runtime.messages import Trajectory, TrajectoryGroup, Turn


def group(task_id: int, intent: str, pages_and_texts: list[tuple[str, str]]) -> TrajectoryGroup:
    turns = [
        Turn(index=i, url="http://127.0.0.1/", observation=page, observation_digest="", text=text)
        for i, (page, text) in enumerate(pages_and_texts)
    ]
    traj = Trajectory(
        episode_id=f"e{task_id}", group_id=f"g{task_id}", task_id=task_id, intent=intent,
        turns=turns, reward=1.0,
    )  # fmt: skip
    return TrajectoryGroup(group_id=f"g{task_id}", task_id=task_id, trajectories=[traj],
                           created_at=0.0)  # fmt: skip


def search(name: str) -> str:
    return f'<think>Search the map for {name}.</think><answer>do(action="Search", argument="{name}", element="2")</answer>'  # noqa: E501


MAP = [
    group(1, "What kind of place is Moore Market?",
          [("input q [2] | link Moore Market [4] | Moore Market is near", search("Moore Market"))]),
    group(2, "What kind of place is Brown Gardens?",
          [("input q [2] | link Brown Gardens [4]", search("Brown Gardens"))]),
    group(3, "On which date was order 1129 placed? Buy 2 of it.",
          [("link Orders [2] | order 1129 | 2 items", '<answer>do(action="Search", '
            'argument="1129", element="2")</answer>')]),
    group(4, "On which date was order 1044 placed? Buy 2 of it.",
          [("order 1044", "<answer>exit(message=\"\")</answer>")]),
]  # fmt: skip


def test_entities_are_quoted_strings_long_numbers_and_runs_of_rare_or_capitalised_words() -> None:
    intents = [
        "Open the post 'Help me' in the cooking forum.",
        "Open the post 'Hi' in the diy forum.",
    ]
    frequency: Counter[str] = Counter()
    for intent in intents:
        frequency.update(set(intent.rstrip(".").replace("'", " ").split()))
    found = entities(intents[0], frequency, 2, rare=0.6, names=0.0)
    assert found == ["Help me", "cooking"]
    frequency = Counter({"Buy": 2, "of": 2, "2": 2, "&": 2, "Sports": 1, "Outdoors": 1})
    assert entities(
        "Buy 2 of Sports & Outdoors 2023-12-01.", frequency, 2, rare=0.6, names=0.0
    ) == [
        "Sports & Outdoors",
        "2023-12-01",
    ]


def test_a_copy_renames_the_task_entities_everywhere_and_nothing_else() -> None:
    copies = swapped_copies(MAP, 1, seed=0, rare=0.3)
    by_task = {g.task_id: g.trajectories[0] for g in copies}
    moore = by_task[1]
    assert moore.intent == "What kind of place is Brown Gardens?"
    assert moore.turns[0].observation == (
        "input q [2] | link Brown Gardens [4] | Brown Gardens is near"
    )
    assert moore.turns[0].text == search("Brown Gardens")
    order = by_task[3]
    assert order.intent == "On which date was order 1044 placed? Buy 2 of it."
    # the number is renamed; the single digits (ids, counts) are not
    assert order.turns[0].observation == "link Orders [2] | order 1044 | 2 items"
    assert 'argument="1044", element="2"' in order.turns[0].text
    # new ids, originals untouched
    assert {g.group_id for g in copies}.isdisjoint({g.group_id for g in MAP})
    assert moore.episode_id != MAP[0].trajectories[0].episode_id
    assert MAP[0].trajectories[0].intent == "What kind of place is Moore Market?"


def test_no_copies_and_nothing_to_swap_give_nothing() -> None:
    assert swapped_copies(MAP, 0, seed=0) == []
    lone = [group(9, "Open the cart.", [("link Cart [3]", '<answer>exit(message="")</answer>')])]
    assert swapped_copies(lone, 2, seed=0, rare=0.6) == []
