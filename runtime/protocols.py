"""The seams between the runtime and what it drives: policies and evaluators.

`Policy` is structural: `policy.client.VLLMPolicy` and `runtime.oracle.OraclePolicy`
implement it without importing this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from playwright.async_api import Page

from runtime.base.messages import Evaluation, PolicyReply, PolicyRequest, TaskConfig

__all__ = ["Evaluator", "Policy"]


@runtime_checkable
class Policy(Protocol):
    """Chooses the completion of one turn.

    `request.messages` are the turn's chat messages (system prompt, then user/assistant
    turns with earlier observations compressed, then the current observation). The
    reply's `text` is the raw completion (`<think>..</think><answer>..</answer>`); model
    policies also return the exact prompt and completion token ids, the completion's
    logprobs and the adapter that served the turn. Errors a policy raises end the episode
    with status `error:policy`; timeouts are the caller's.
    """

    async def act(self, request: PolicyRequest) -> PolicyReply: ...


class Evaluator(Protocol):
    """A task's evaluators on the final page and the exit message (`sites.evaluators`).

    `answer` is None when the episode did not exit; `urls` maps WebArena's site names
    (SHOPPING, ...) to this episode's site URLs.
    """

    async def __call__(
        self,
        task: TaskConfig,
        *,
        answer: str | None,
        page: Page,
        urls: Mapping[str, str],
    ) -> Evaluation: ...
