"""WebRL's task generator for WebArena: a chat model writes new intents from failed tasks,
judges their feasibility; what cannot be used is dropped and counted, never run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from policy.server import VLLMServer
from runtime.base.messages import TaskConfig
from sites.chat import ChatModel
from sites.errors import GeneratorError
from sites.generate import GENERATED_ID_BASE, IntentGenerator, parse_intents
from sites.tasks import check_task

pytestmark = pytest.mark.anyio

PARENT = TaskConfig(
    task_id=12, intent="What is the price of the cheapest red mug?", start_url="__SHOPPING__/",
    sites=["shopping"], require_login=True, storage_state="./.auth/shopping_state.json",
    intent_template_id=5, instantiation_dict={"color": "red"},
)  # fmt: skip

WRITTEN = "\n".join([
    '{"intent": "What is the price of the cheapest blue mug?", "kind": "easier"}',
    "Here are your tasks:",  # not JSON
    '{"intent": "   ", "kind": "harder"}',  # no intent
    '{"intent": "Open https://evil.test and log in", "kind": "harder"}',  # a URL
    '{"intent": "what is the price of the cheapest red mug?", "kind": "easier"}',  # the parent
    '{"intent": "' + "x" * 301 + '", "kind": "harder"}',  # too long
    '{"intent": "Add the cheapest blue mug to the cart, then report the cart total.",'
    ' "kind": "harder"},',
    '{"intent": "List the three best-rated kettles.", "kind": "easier"}',  # judged "No"
    '{"intent": "Which mug has the most reviews?", "kind": "sideways"}',  # no verdict
    '{"intent": "Name the newest teapot.", "kind": "easier"}',
    '{"intent": "Find the oldest order.", "kind": "easier"}',  # over the number asked for
])  # fmt: skip

VERDICTS = {
    "cheapest blue mug?": "The page lists mugs. Yes",
    "cart total": "Yes, the cart exists.",
    "best-rated kettles": "Kettles are not sold here. No.",
    "most reviews": "I cannot tell.",
    "newest teapot": "yes",
}


def _server(write: Callable[[], httpx.Response]) -> tuple[httpx.MockTransport, list[dict]]:
    asked: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        asked.append(body)
        user = body["messages"][1]["content"]
        if "Write " in user:
            return write()
        reply = next(v for k, v in VERDICTS.items() if k in user)
        return httpx.Response(200, json={"choices": [{"message": {"content": reply}}]})

    return httpx.MockTransport(answer), asked


def _ok(text: str) -> Callable[[], httpx.Response]:
    return lambda: httpx.Response(200, json={"choices": [{"message": {"content": text}}]})


async def test_usable_feasible_intents_become_orm_tasks_the_rest_is_counted() -> None:
    transport, asked = _server(_ok(WRITTEN))
    async with httpx.AsyncClient(transport=transport) as http:
        model = ChatModel(http, url="http://llm.test/v1", model="writer", error=GeneratorError)
        made = await IntentGenerator(model).generate(
            [PARENT], phase=3, per_parent=3, start_pages={"__SHOPPING__/": "mugs: red, blue"}
        )
    assert [t.intent for t in made.tasks] == [
        "What is the price of the cheapest blue mug?",
        "Add the cheapest blue mug to the cart, then report the cart total.",
        "Name the newest teapot.",
    ]
    assert made.dropped == {
        "not JSON": 1, "no intent": 1, "names a URL": 1, "a repeat": 1, "too long": 1,
        "infeasible": 1, "no feasibility verdict": 1, "over the number asked for": 1,
    }  # fmt: skip
    assert [t.task_id for t in made.tasks] == [GENERATED_ID_BASE + i for i in range(3)]
    for task in made.tasks:
        check_task(task)  # a task file could hold it
        assert task.eval.eval_types == ["orm"]
        assert (task.start_url, task.sites, task.storage_state) == (
            PARENT.start_url, PARENT.sites, PARENT.storage_state,
        )  # fmt: skip
        assert task.intent_template_id is not PARENT.intent_template_id  # unset
        assert task.extra_fields["evolved_from"] == 12 and task.extra_fields["phase"] == 3
    assert [t.extra_fields["kind"] for t in made.tasks] == ["easier", "harder", "easier"]
    # The feasibility question shows the start page the parent's episodes saw.
    feasibility = [a for a in asked if "Can this task be done" in a["messages"][1]["content"]]
    assert len(feasibility) == 5 and "mugs: red, blue" in feasibility[0]["messages"][1]["content"]
    assert asked[0]["model"] == "writer" and asked[0]["temperature"] == 1.0


async def test_a_failing_generator_drops_the_parent_and_goes_on() -> None:
    transport, _ = _server(lambda: httpx.Response(503, text="overloaded"))
    async with httpx.AsyncClient(transport=transport) as http:
        model = ChatModel(http, url="http://llm.test", model="m", error=GeneratorError)
        generator = IntentGenerator(model)
        generator.used(TaskConfig(task_id=GENERATED_ID_BASE + 9, intent="t", start_url="/"))
        made = await generator.generate([PARENT, PARENT], phase=1, per_parent=2, start_pages={})
    assert made.tasks == [] and made.dropped == {"request failed": 2}
    assert generator.next_id == GENERATED_ID_BASE + 10


def test_parse_intents_reads_json_lines() -> None:
    from sites.generate import Generation

    out = Generation()
    found = parse_intents('{"intent": "a  b"}\n[1]\n\n{"intent": "c", "kind": "harder"}', out)
    assert found == [("a b", "related"), ("c", "harder")]
    assert out.dropped == {"no intent": 1}


def test_parse_intents_counts_hostile_lines_and_keeps_the_rest() -> None:
    from sites.generate import Generation

    out = Generation()
    reply = "\n".join(["[" * 100_000, "1" * 5000, '{"intent": "ok"}', "{not json"])
    assert parse_intents(reply, out) == [("ok", "related")]
    assert out.dropped == {"not JSON": 3}


@pytest.mark.vllm
async def test_a_real_chat_server_that_writes_nonsense_gives_no_task(
    vllm_server: VLLMServer, tiny_model: Path
) -> None:
    """The tiny model behind vLLM's chat API: whatever it writes is parsed as lines and
    dropped with a reason; nothing unusable becomes a task."""
    async with httpx.AsyncClient() as http:
        model = ChatModel(http, url=vllm_server.url, model=str(vllm_server.model),
                          max_tokens=48, error=GeneratorError)  # fmt: skip
        made = await IntentGenerator(model).generate(
            [PARENT], phase=1, per_parent=2, start_pages={}
        )
    for task in made.tasks:  # anything kept passed every check
        check_task(task)
        assert 0 < len(task.intent) <= 300
    assert made.tasks or made.dropped
