"""The fuzzy-match judge: a `Judge` protocol and `HttpJudge`, an OpenAI-compatible client.

WebArena grades `fuzzy_match` answers with an LLM (two questions: "does this answer mean
the reference?" and, for unachievable tasks, "does the reported reason agree with the
actual one?"). Any chat model behind `/v1/chat/completions` can play that part (vLLM,
OpenAI, ...). The verdict is the last verdict word in the reply, so a judge that reasons
first still parses. httpx errors are converted here into `JudgeError`.
"""

from __future__ import annotations

import re
from typing import Protocol

import httpx

from runtime.base.config import ConfigError, SitesConfig
from sites.chat import ChatModel
from sites.errors import JudgeError

__all__ = ["HttpJudge", "Judge", "parse_fuzzy_verdict", "parse_unachievable_verdict"]


class Judge(Protocol):
    """Grades answers that no string rule can: both methods return pass/fail."""

    async def fuzzy_match(self, *, intent: str, reference: str, answer: str) -> bool:
        """Whether `answer` means the same as `reference` for the task `intent`."""
        ...

    async def unachievable_match(self, *, intent: str, reason: str, answer: str) -> bool:
        """Whether `answer` gives the same reason as `reason` for why `intent` cannot be done."""
        ...


_SYSTEM = "You grade the answers people give to tasks on websites. You are strict but fair."

_FUZZY = (
    "Someone was given a task on a website and answered it. Decide whether their answer "
    "means the same as the reference answer. Other wording, formatting or extra detail is "
    "fine; missing, different or wrong information is not. The string 'N/A' means that "
    "the task cannot be done.\n\n"
    "Task: {intent}\n"
    "Reference answer: {reference}\n"
    "Given answer: {answer}\n\n"
    "End your reply with exactly one verdict: correct, incorrect or partially correct."
)

_UNACHIEVABLE = (
    "The task below cannot be done on the website, for the actual reason given. Someone "
    "tried it, stopped, and reported a reason. Decide whether the reported reason agrees "
    "with the actual reason, even if only implicitly.\n\n"
    "Task: {intent}\n"
    "Actual reason: {reason}\n"
    "Reported reason: {answer}\n\n"
    "End your reply with exactly one word: same or different."
)

_FUZZY_WORDS = re.compile(r"\b(partially correct|incorrect|correct)\b")
_UA_WORDS = re.compile(r"\b(same|different)\b")


def parse_fuzzy_verdict(reply: str) -> bool:
    """True for a final "correct"; False for "incorrect" or "partially correct"."""
    found = _FUZZY_WORDS.findall(reply.lower())
    if not found:
        raise JudgeError(
            f"no verdict (correct/incorrect/partially correct) in reply {reply[:200]!r}"
        )
    return bool(found[-1] == "correct")


def parse_unachievable_verdict(reply: str) -> bool:
    """True for a final "same", False for "different"."""
    found = _UA_WORDS.findall(reply.lower())
    if not found:
        raise JudgeError(f"no verdict (same/different) in reply {reply[:200]!r}")
    return bool(found[-1] == "same")


class HttpJudge:
    """A `Judge` that asks a chat model behind an OpenAI-compatible endpoint.

    `url` is the server's base URL, with or without `/v1`. The client is injected (and
    owned) by the caller; `timeout_s` bounds each request.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        url: str,
        model: str,
        api_key: str = "",
        max_tokens: int = 512,
        timeout_s: float = 60.0,
    ) -> None:
        self._chat = ChatModel(
            client, url=url, model=model, api_key=api_key, max_tokens=max_tokens,
            timeout_s=timeout_s, error=JudgeError, who="judge",
        )  # fmt: skip

    @classmethod
    def from_config(
        cls, config: SitesConfig, client: httpx.AsyncClient, *, api_key: str = ""
    ) -> HttpJudge | None:
        """The configured judge, or None when `sites.judge_url` is empty."""
        if not config.judge_url:
            return None
        if not config.judge_model:
            raise ConfigError("config", "sites.judge_model", "required when sites.judge_url is set")
        return cls(
            client,
            url=config.judge_url,
            model=config.judge_model,
            api_key=api_key,
            timeout_s=config.judge_timeout_s,
        )

    async def fuzzy_match(self, *, intent: str, reference: str, answer: str) -> bool:
        reply = await self._ask(_FUZZY.format(intent=intent, reference=reference, answer=answer))
        return parse_fuzzy_verdict(reply)

    async def unachievable_match(self, *, intent: str, reason: str, answer: str) -> bool:
        reply = await self._ask(_UNACHIEVABLE.format(intent=intent, reason=reason, answer=answer))
        return parse_unachievable_verdict(reply)

    async def _ask(self, prompt: str) -> str:
        return await self._chat.ask(_SYSTEM, prompt)
