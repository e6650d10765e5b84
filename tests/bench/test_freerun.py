"""bench/freerun.py: the action kind of a reply, and the demonstrated turns it replays."""

from __future__ import annotations

from bench.freerun import kind_of


def test_kind_of_reads_the_answer_not_the_thought() -> None:
    assert (
        kind_of('<think>do(action="Type")</think><answer>do(action="Click", element="3")</answer>')
        == "Click"
    )
    assert kind_of(
        '<answer>do(action="Select Dropdown Option", argument="x", element="2")</answer>'
    ) == ("Select Dropdown Option")
    assert kind_of('<think>Done.</think><answer>exit(message="")</answer>') == "exit"
    assert kind_of("<answer>go_backward()</answer>") == "go_backward"
    assert kind_of("no answer at all") == "?"
