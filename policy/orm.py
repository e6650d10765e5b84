"""WebRL's outcome reward model (ORM): a YES/NO judge of a finished episode.

WebRL (arXiv 2411.02337) scores tasks that have no evaluator with a judge that reads only
the instruction, the agent's actions and the final page, and answers YES or NO; the
episode succeeded when P(YES) > P(NO) for the reply's first token (here the words are
"Yes" and "No", one token each in SmolLM2's vocabulary). The judge is the base
model with a LoRA of its own, trained on rollouts whose tasks do have evaluators.

- `orm_messages` writes the judge's chat: a fixed system prompt, then one user message
  with the task, the actions in order (each turn's `<answer>` part; a turn that gave none
  says so) and the page the episode ended on.
- `orm_example` is a labelled rollout as (messages, "Yes" or "No"), from an evaluated
  trajectory; infrastructure failures ("interrupted", "error:*") carry no label and give
  None.
- `verdict` reads the first token's top log-probs: the probability of every listed token
  that is the first token of Yes (or of No) once stripped of spaces is summed per side
  (`first_tokens`: "Yes" and "No" for SmolLM2, "Y" and "N" for the tiny test model).
  Neither listed: unjudged (`Verdict.success` None), counted apart, never a failure.
- `OrmJudge` renders them with the model's chat template and asks the server for the
  first token's top log-probs under the judge adapter's name (`CompletionClient`, so
  transport errors are the policy layer's `RequestError`s).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import msgspec

from policy.client import CompletionClient
from policy.prompt import PromptRenderer
from runtime.base.messages import ChatMessage, Trajectory

__all__ = [
    "NO",
    "ORM_SYSTEM_PROMPT",
    "YES",
    "OrmJudge",
    "Verdict",
    "orm_example",
    "orm_inputs",
    "orm_messages",
    "verdict",
]

# The labels a trained judge answers with: one token each in SmolLM2's vocabulary (its
# "YES" is two tokens, "Y" and "ES").
YES = "Yes"
NO = "No"

ORM_SYSTEM_PROMPT = (
    "You judge whether a web agent completed its task. You see the task, the agent's "
    f"actions in order and the page it ended on. Answer with one word: {YES} if the task "
    f"is done (and any answer the agent gave is right), {NO} otherwise."
)

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """One judgement: success None when neither YES nor NO was among the top tokens."""

    success: bool | None
    p_yes: float
    p_no: float


def orm_messages(intent: str, actions: Sequence[str], final_page: str) -> list[ChatMessage]:
    """The judge's messages for one episode."""
    listed = "\n".join(f"{i}. {a}" for i, a in enumerate(actions, 1)) or "(no action)"
    user = f"Task: {intent}\n\nActions:\n{listed}\n\nFinal page:\n{final_page}\n\nDone?"
    return [
        ChatMessage(role="system", content=ORM_SYSTEM_PROMPT),
        ChatMessage(role="user", content=user),
    ]


def _action_of(text: str) -> str:
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else "(no valid action)"


def orm_inputs(trajectory: Trajectory) -> tuple[str, list[str], str]:
    """What the judge reads of an episode: its task, its actions in order (each turn's
    `<answer>` part) and the last page it was shown (empty without turns)."""
    actions = [_action_of(turn.text) for turn in trajectory.turns]
    final = trajectory.turns[-1].observation if trajectory.turns else ""
    return trajectory.intent, actions, final


def orm_example(trajectory: Trajectory) -> tuple[list[ChatMessage], str] | None:
    """(the judge's messages, `YES` or `NO`) for an evaluated trajectory, else None."""
    if not trajectory.scored or not trajectory.turns:
        return None
    messages = orm_messages(*orm_inputs(trajectory))
    return messages, YES if trajectory.reward > 0 else NO


def verdict(top_logprobs: Mapping[str, float], *, yes: str = YES, no: str = NO) -> Verdict:
    """The judgement from the first reply token's top log-probs ({token text: logprob}):
    the probabilities of the tokens that are `yes` (or `no`) once stripped of spaces."""
    p = {yes: 0.0, no: 0.0}
    for token, logprob in top_logprobs.items():
        word = token.strip()
        if word in p and math.isfinite(logprob):
            p[word] += math.exp(logprob)
    if p[yes] == 0.0 and p[no] == 0.0:
        return Verdict(success=None, p_yes=0.0, p_no=0.0)
    return Verdict(success=p[yes] > p[no], p_yes=p[yes], p_no=p[no])


def first_tokens(renderer: PromptRenderer) -> tuple[int, int]:
    """The first token ids of `YES` and `NO` for a model: the verdict compares these two.
    They must differ (a model whose labels start alike cannot be read from one token)."""
    yes, no = renderer.encode(YES)[0], renderer.encode(NO)[0]
    if yes == no:
        raise ValueError(f"{YES!r} and {NO!r} start with the same token for this model")
    return yes, no


class OrmJudge:
    """Asks the judge adapter `model` for verdicts through the policy's server client."""

    def __init__(
        self, client: CompletionClient, renderer: PromptRenderer, *, model: str, k: int = 20
    ) -> None:
        self.client = client
        self.renderer = renderer
        self.model = model
        self.k = k
        yes, no = first_tokens(renderer)
        self._words = {"yes": renderer.decode([yes]).strip(), "no": renderer.decode([no]).strip()}

    async def judge(self, intent: str, actions: Sequence[str], final_page: str) -> Verdict:
        """The verdict on one episode; the client's `RequestError`s pass through."""
        prompt = self.renderer.render(orm_messages(intent, actions, final_page))
        top = await self.client.first_token_top(prompt, model=self.model, k=self.k)
        return verdict(top, **self._words)
