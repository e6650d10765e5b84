"""The fuzzy-match judge over an OpenAI-compatible endpoint (httpx.MockTransport seam)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from runtime.base.config import ConfigError, SitesConfig
from sites.errors import JudgeError
from sites.judge import HttpJudge, parse_fuzzy_verdict, parse_unachievable_verdict

pytestmark = pytest.mark.anyio


def _reply(content: str | None, status: int = 200) -> httpx.Response:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
    return httpx.Response(status, json=body)


def _judge(
    handler: Callable[[httpx.Request], httpx.Response], url: str = "http://judge.test:8000"
) -> tuple[HttpJudge, httpx.AsyncClient]:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return HttpJudge(client, url=url, model="grader", api_key="sk-test", timeout_s=5), client


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("correct", True),
        ("Incorrect", False),
        ("The answer is partially correct.", False),
        (
            "It gives the park but not the time, so not fully correct... Verdict: incorrect",
            False,
        ),
        ("At first it looks incorrect, but the units differ only. Verdict: correct", True),
    ],
)
def test_fuzzy_verdicts(reply: str, verdict: bool) -> None:
    assert parse_fuzzy_verdict(reply) is verdict


def test_unreadable_verdicts_are_errors() -> None:
    with pytest.raises(JudgeError, match="no verdict"):
        parse_fuzzy_verdict("I cannot tell.")
    with pytest.raises(JudgeError, match="no verdict"):
        parse_unachievable_verdict("maybe")
    assert parse_unachievable_verdict("They look the same to me. same") is True
    assert parse_unachievable_verdict("Different.") is False


async def test_request_shape_and_fuzzy_pass() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _reply("Both say 12 minutes on foot. correct")

    judge, client = _judge(handler, url="http://judge.test:8000/v1/")
    async with client:
        ok = await judge.fuzzy_match(
            intent="How long to walk to the park?", reference="walking: 12min", answer="12 minutes"
        )
    assert ok is True
    (request,) = seen
    assert str(request.url) == "http://judge.test:8000/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    body: dict[str, Any] = json.loads(request.content)
    assert body["model"] == "grader" and body["temperature"] == 0
    prompt = body["messages"][-1]["content"]
    for part in ("How long to walk to the park?", "walking: 12min", "12 minutes", "'N/A'"):
        assert part in prompt


async def test_unachievable_prompt_carries_the_reason() -> None:
    prompts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        prompts.append(json.loads(request.content)["messages"][-1]["content"])
        return _reply("different")

    judge, client = _judge(handler)
    async with client:
        ok = await judge.unachievable_match(
            intent="Phone of the customer who returned most kettles",
            reason="No kettle was ever returned",
            answer="The store has no phone numbers",
        )
    assert ok is False
    assert "Actual reason: No kettle was ever returned" in prompts[0]
    assert "Reported reason: The store has no phone numbers" in prompts[0]


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (lambda r: httpx.Response(500, text="model overloaded"), "answered 500: model overloaded"),
        (lambda r: httpx.Response(200, text="<html>"), "not a chat completion"),
        (lambda r: _reply(None), "no message content"),
        (lambda r: httpx.Response(200, json={"choices": []}), "no message content"),
        (lambda r: _reply("hmm"), "no verdict"),
    ],
)
async def test_bad_replies_raise_judge_error(
    handler: Callable[[httpx.Request], httpx.Response], message: str
) -> None:
    judge, client = _judge(handler)
    async with client:
        with pytest.raises(JudgeError, match=message):
            await judge.fuzzy_match(intent="i", reference="r", answer="a")


async def test_transport_errors_are_converted() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    judge, client = _judge(handler)
    async with client:
        with pytest.raises(JudgeError, match="failed: ConnectError") as info:
            await judge.fuzzy_match(intent="i", reference="r", answer="a")
    assert isinstance(info.value.__cause__, httpx.ConnectError)


async def test_from_config() -> None:
    async with httpx.AsyncClient() as client:
        assert HttpJudge.from_config(SitesConfig(), client) is None
        judge = HttpJudge.from_config(
            SitesConfig(judge_url="http://j:1", judge_model="m"), client, api_key="k"
        )
        assert isinstance(judge, HttpJudge)
        with pytest.raises(ConfigError, match=r"sites\.judge_model: required"):
            HttpJudge.from_config(SitesConfig(judge_url="http://j:1"), client)
