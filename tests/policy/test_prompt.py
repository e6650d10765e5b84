from __future__ import annotations

import pytest

from policy.prompt import (
    COMPRESSED_OBSERVATION,
    SYSTEM_PROMPT,
    build_messages,
    strip_thought,
    without_first_rounds,
)


def test_first_turn_states_task_and_full_observation() -> None:
    msgs = build_messages("Buy a lamp", [], '<a id="1">Lamps</a>')
    assert [m.role for m in msgs] == ["system", "user"]
    assert msgs[0].content == SYSTEM_PROMPT
    assert msgs[1].content == 'Task: Buy a lamp\n\nRound 0\n<a id="1">Lamps</a>'


def test_earlier_observations_compressed_actions_kept() -> None:
    history = [
        '<think>find lamps</think><answer>do(action="Click", element="1")</answer>',
        '<think>open it</think>\n<answer>do(action="Click", element="7")</answer>',
    ]
    msgs = build_messages("Buy a lamp", history, "<p>cart</p>", keep_thoughts=False)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[1].content == f"Task: Buy a lamp\n\nRound 0\n{COMPRESSED_OBSERVATION}"
    assert msgs[3].content == f"Round 1\n{COMPRESSED_OBSERVATION}"
    assert msgs[2].content == '<answer>do(action="Click", element="1")</answer>'
    assert msgs[4].content == '<answer>do(action="Click", element="7")</answer>'
    assert msgs[5].content == "Round 2\n<p>cart</p>"
    # No earlier page text survives anywhere.
    assert all("cart" not in m.content for m in msgs[:-1])


def test_earlier_thoughts_are_kept_by_default() -> None:
    text = "<think>a</think><answer>go_backward()</answer>"
    assert build_messages("t", [text], "o")[2].content == text
    assert build_messages("t", [text], "o", keep_thoughts=False)[2].content == (
        "<answer>go_backward()</answer>"
    )


def test_strip_thought_handles_several_and_missing() -> None:
    assert (
        strip_thought("<think>x</think><think>y</think> <answer>z</answer>") == "<answer>z</answer>"
    )
    assert strip_thought("no tags") == "no tags"


def test_leaving_out_the_first_rounds_is_the_episode_begun_later() -> None:
    replies = ["<think>a</think><answer>A</answer>", "<think>b</think><answer>B</answer>",
               "<think>c</think><answer>C</answer>"]  # fmt: skip
    messages = build_messages("Do it.", replies, "<p>page 3</p>", system_prompt="sys")
    for count in range(4):
        assert without_first_rounds(messages, "Do it.", count) == build_messages(
            "Do it.", replies[count:], "<p>page 3</p>", system_prompt="sys"
        )
    with pytest.raises(ValueError, match="cannot leave out 4 of the 3 earlier rounds"):
        without_first_rounds(messages, "Do it.", 4)
    with pytest.raises(ValueError, match="cannot leave out 1 of the"):
        without_first_rounds(messages[:-1], "Do it.", 1)  # ends with a reply
    first = build_messages("Do it.", [], "<p>page 0</p>", system_prompt="sys")
    with pytest.raises(ValueError, match="not round 0's user message"):
        without_first_rounds(first, "Another task.", 0)
