"""Synthetic look-up-and-copy turns (learner.copying) and their BC examples."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from learner.copying import copy_turns, vocabulary
from learner.demos import copy_examples
from policy.prompt import PromptRenderer, build_messages
from runtime.actions import parse_completion, thought_of
from runtime.messages import Trajectory, TrajectoryGroup, Turn
from runtime.reading import parse_elements

WORDS = [f"Word{chr(97 + i)}{chr(97 + j)}" for i in range(6) for j in range(6)]


def test_every_reply_is_what_the_page_and_the_task_say() -> None:
    turns = copy_turns(WORDS, 60, seed=3)
    kinds = {"Click": 0, "Search": 0, "exit": 0}
    for turn in turns:
        completion = parse_completion(turn.reply)
        action = completion.action
        elements = {e.id: e for e in parse_elements(turn.observation, "compact")}
        if action.kind == "exit":
            kinds["exit"] += 1
            match = re.fullmatch(r"What is the (\w+) of (.+)\?", turn.intent)
            assert match is not None
            field, entity = match.groups()
            assert f"- {entity}: {field} {action.message}" in turn.observation.splitlines()
            assert thought_of(turn.reply) == f"{entity} has {field} {action.message}."
            continue
        assert action.element is not None
        kinds[action.name] += 1
        if action.name == "Click":
            entity = turn.intent.removeprefix("Open ").removesuffix(".")
            assert elements[action.element].text == entity
            # the entity names one element only: the id is found by copying, not guessed
            assert [e.id for e in elements.values() if e.text == entity] == [action.element]
        else:
            assert action.name == "Search"
            assert action.argument == turn.intent.removeprefix("Search for ").removesuffix(".")
            assert elements[action.element].attrs["kind"] == "input"
        assert thought_of(turn.reply) == turn.intent
    assert kinds == {"Click": 20, "Search": 20, "exit": 20}


def test_turns_are_seeded_and_entities_are_fresh() -> None:
    assert copy_turns(WORDS, 9, seed=1) == copy_turns(WORDS, 9, seed=1)
    assert copy_turns(WORDS, 9, seed=1) != copy_turns(WORDS, 9, seed=2)
    intents = {t.intent for t in copy_turns(WORDS, 300, seed=0)}
    # fresh draws (one-word entities of a 36-word list repeat), not a small pool to memorise
    assert len(intents) > 250
    with pytest.raises(ValueError, match="vocabulary of 3 words"):
        copy_turns(WORDS[:3], 1, seed=0)


def _group(intent: str, observations: list[str]) -> TrajectoryGroup:
    turns = [
        Turn(index=k, url="http://x/", observation=o, observation_digest="", text="")
        for k, o in enumerate(observations)
    ]
    traj = Trajectory(episode_id="e", group_id="g", task_id=9999, intent=intent, turns=turns)
    return TrajectoryGroup(group_id="g", task_id=9999, trajectories=[traj], created_at=0.0)


def test_vocabulary_takes_whole_words_of_intents_and_pages() -> None:
    group = _group(
        "Find the Lumos lamp", ["link Kelby Socks [3]\nNotebook Documentatio…", "button Go [2]"]
    )
    words = vocabulary([group])
    assert words == sorted(words)
    assert {"Find", "The", "Lumos", "Lamp", "Link", "Kelby", "Socks", "Button"} <= set(words)
    assert "Documentatio" not in words  # cut short by the page's "…"
    assert "Go" not in words  # under three letters


def test_copy_examples_render_round_zero_as_rollouts_do(command_model_dir: Path) -> None:
    renderer = PromptRenderer.from_model(command_model_dir)
    pages = [" ".join(WORDS[k : k + 6]) for k in range(0, len(WORDS), 6)]
    group = _group("Open the page", pages)
    examples = copy_examples([group], renderer, 4, seed=5, system_prompt="Sys.")
    turns = copy_turns(vocabulary([group]), 4, seed=5)
    eos = renderer.eos_token_id
    for example, turn in zip(examples, turns, strict=True):
        messages = build_messages(turn.intent, [], turn.observation, system_prompt="Sys.")
        assert list(example.prompt_ids) == renderer.render(messages)
        assert list(example.completion_ids) == [*renderer.encode(turn.reply), eos]
        assert (example.task_id, example.turn) == (-1, 0)
    assert len({e.episode_id for e in examples}) == 4


def test_bc_trains_on_the_copy_turns_too(
    tmp_path: Path, command_task: Any, command_model_dir: Path
) -> None:
    from learner.bc import behaviour_clone
    from runtime.config import BCConfig

    # the command task's pages are short: pad them with words so the vocabulary is usable
    demos = command_task.demos(8, 1.0, seed=0)
    extra = _group("Open the page", [" ".join(WORDS)])
    trained = []
    for copies in (0, 12):
        config = BCConfig(max_steps=1, eval_every_steps=1, eval_examples=4, copy_turns=copies)
        report = behaviour_clone(
            [*demos, extra], base_model=command_model_dir, out=tmp_path / f"bc{copies}",
            config=config, system_prompt=command_task.SYSTEM,
        )  # fmt: skip
        trained.append(report.train_examples)
    assert trained[1] == trained[0] + 12
