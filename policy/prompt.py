"""What the model reads: the system prompt, and each turn's messages with compression.

The same functions build the messages of rollouts (runtime), of behaviour-cloning data
and of the learner's samples, so a turn is rendered identically everywhere.

Dynamic context compression (WebAgent-R1): turn t sees the system prompt, the task, every
earlier turn with its observation replaced by `** Simplified html **` and its action kept
(its thought too when `keep_thoughts`), then the full current observation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from runtime.messages import ChatMessage

__all__ = [
    "COMPRESSED_OBSERVATION",
    "SYSTEM_PROMPT",
    "build_messages",
    "strip_thought",
    "user_message",
]

COMPRESSED_OBSERVATION = "** Simplified html **"

SYSTEM_PROMPT = """\
You are a web agent. You complete a task in a web browser, one action per round.
Each round shows the current page as simplified HTML; interactive elements carry an id,
e.g. <button id="25">Clear all</button>. Earlier pages are shown as ** Simplified html **.

Reply with your reasoning and exactly one action:
<think>your reasoning</think><answer>ACTION</answer>

ACTION is one of:
do(action="Click", element="ID")
do(action="Right Click", element="ID")
do(action="Type", argument="TEXT", element="ID")
do(action="Search", argument="TEXT", element="ID")
do(action="Hover", element="ID")
do(action="Scroll Up")
do(action="Scroll Down")
do(action="Press Enter")
do(action="Switch Tab", argument="TAB_INDEX")
do(action="Select Dropdown Option", argument="OPTION", element="ID")
do(action="Wait")
do(action="Goto", argument="URL")
go_backward()
go_forward()
exit(message="ANSWER")

Type replaces the text of a field; Search types and presses Enter. Use exit when the task
is done; its message is your answer (leave it empty if the task asks for no answer)."""

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def strip_thought(completion: str) -> str:
    """The completion without its `<think>...</think>` span(s)."""
    return _THINK.sub("", completion).strip()


def user_message(intent: str, round_index: int, observation: str) -> ChatMessage:
    """The user turn of round `round_index`; the task is stated in round 0."""
    if round_index == 0:
        content = f"Task: {intent}\n\nRound 0\n{observation}"
    else:
        content = f"Round {round_index}\n{observation}"
    return ChatMessage(role="user", content=content)


def build_messages(
    intent: str,
    history: Sequence[str],
    observation: str,
    *,
    keep_thoughts: bool = False,
    system_prompt: str = SYSTEM_PROMPT,
) -> list[ChatMessage]:
    """The messages of the turn after `history` (earlier completions, oldest first).

    Earlier observations are compressed to `COMPRESSED_OBSERVATION`; `observation` is the
    current page in full.
    """
    messages = [ChatMessage(role="system", content=system_prompt)]
    for index, completion in enumerate(history):
        messages.append(user_message(intent, index, COMPRESSED_OBSERVATION))
        kept = completion if keep_thoughts else strip_thought(completion)
        messages.append(ChatMessage(role="assistant", content=kept))
    messages.append(user_message(intent, len(history), observation))
    return messages
