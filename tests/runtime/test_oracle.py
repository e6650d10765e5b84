"""The oracle's replies on a compact page: the id read from the page, the thought naming
the element chosen as the page shows it, id included (so the action copies the thought)."""

from __future__ import annotations

import pytest

from runtime.base.messages import ChatMessage, ElementQuery, OracleStep, PolicyRequest, TaskConfig
from runtime.oracle import OraclePolicy

PAGE = """URL: http://127.0.0.1:8000/project/-/merge_requests
Title: Merge requests
link Merge requests [6]
2 merge requests
- link Fix: settings panel [12]
- link Refactor: install guide [13]
textbox q "Search" [14]"""

PLAN = [
    OracleStep(
        action="Click",
        target=ElementQuery(tag="a", text="Refactor: install guide"),
        thought="Open the merge request.",
    ),
    OracleStep(
        action="Search", target=ElementQuery(tag="textbox"), argument="lint", thought="Search it!"
    ),
    OracleStep(action="Click", target=ElementQuery(tag="a", text="Merge requests")),
    OracleStep(action="exit", message="master", thought="It targets master."),
]
TASK = TaskConfig(task_id=1, intent="Which branch?", sites=["gitlab"], start_url="")


async def _replies() -> list[str]:
    oracle = OraclePolicy(lambda task: PLAN, style="compact")
    out = []
    for turn in range(len(PLAN)):
        request = PolicyRequest(
            episode_id="e", turn=turn, task=TASK, messages=[ChatMessage(role="user", content=PAGE)]
        )
        out.append((await oracle.act(request)).text)
    return out


@pytest.mark.parametrize(
    ("turn", "reply"),
    [
        (
            0,
            "<think>Open the merge request (link Refactor: install guide [13]).</think>"
            '<answer>do(action="Click", element="13")</answer>',
        ),
        (
            1,
            '<think>Search it (textbox q "Search" [14])!</think>'
            '<answer>do(action="Search", argument="lint", element="14")</answer>',
        ),
        (
            2,
            "<think>I will click a 'Merge requests' (link Merge requests [6]).</think>"
            '<answer>do(action="Click", element="6")</answer>',
        ),
        (3, '<think>It targets master.</think><answer>exit(message="master")</answer>'),
    ],
)
@pytest.mark.anyio
async def test_the_thought_names_the_element_the_action_uses(turn: int, reply: str) -> None:
    assert (await _replies())[turn] == reply
