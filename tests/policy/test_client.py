"""CompletionClient through an injected httpx client with MockTransport: request shape,
retries and backoff, and the one boundary where httpx errors become policy errors."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from policy.client import CompletionClient, SamplingParams
from policy.errors import (
    BadRequestError,
    BadResponseError,
    PolicyError,
    RequestError,
    RequestTimeoutError,
    ServerUnavailableError,
)

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], httpx.Response]


def _completion(prompt: list[int], ids: list[int], text: str = "ok") -> dict[str, object]:
    return {
        "model": "policy@v0",
        "choices": [
            {
                "text": text,
                "finish_reason": "stop",
                "token_ids": ids,
                "prompt_token_ids": prompt,
                "logprobs": {"token_logprobs": [-0.5] * len(ids)},
            }
        ],
    }


class _Recorder:
    """A MockTransport handler that answers from a script and records requests."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _client(handler: Handler, **kwargs: object) -> tuple[CompletionClient, list[float]]:
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    options: dict[str, object] = {"max_retries": 3, "backoff_s": 0.5, "sleep": sleep}
    options.update(kwargs)
    return CompletionClient(http, "http://vllm.test/", **options), delays  # type: ignore[arg-type]


async def test_completion_request_is_token_in_token_out() -> None:
    recorder = _Recorder(httpx.Response(200, json=_completion([5, 6, 7], [9, 2], "hi")))
    client, _ = _client(recorder)
    out = await client.complete(
        [5, 6, 7], model="policy@v3", sampling=SamplingParams(max_tokens=7, temperature=0.0)
    )
    body = json.loads(recorder.requests[0].content)
    assert recorder.requests[0].url == "http://vllm.test/v1/completions"
    assert body["prompt"] == [5, 6, 7]
    assert body["model"] == "policy@v3"
    assert body["return_token_ids"] is True
    assert body["logprobs"] == 0
    assert body["max_tokens"] == 7
    assert body["temperature"] == 0.0
    assert "seed" not in body
    assert out.prompt_token_ids == [5, 6, 7]
    assert out.token_ids == [9, 2]
    assert out.logprobs == [-0.5, -0.5]
    assert out.text == "hi"
    assert out.finish_reason == "stop"


async def test_5xx_and_connection_errors_are_retried_with_backoff() -> None:
    recorder = _Recorder(
        httpx.Response(503, json={"error": {"message": "busy"}}),
        httpx.ConnectError("refused"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.Response(200, json=_completion([1], [2])),
    )
    client, delays = _client(recorder)
    out = await client.complete([1], model="m")
    assert out.token_ids == [2]
    assert len(recorder.requests) == 4
    assert delays == [0.5, 1.0, 2.0]


async def test_retries_exhausted_raise_server_unavailable_with_detail() -> None:
    recorder = _Recorder(httpx.Response(500, json={"error": {"message": "engine dead"}}))
    client, delays = _client(recorder, max_retries=2, max_backoff_s=0.75)
    with pytest.raises(ServerUnavailableError, match="HTTP 500: engine dead"):
        await client.complete([1], model="m")
    assert len(recorder.requests) == 3
    assert delays == [0.5, 0.75]  # capped


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_4xx_is_not_retried(status: int) -> None:
    recorder = _Recorder(
        httpx.Response(status, json={"error": {"message": "The model `x` does not exist."}})
    )
    client, delays = _client(recorder)
    with pytest.raises(BadRequestError) as info:
        await client.complete([1], model="x")
    assert info.value.status == status
    assert "does not exist" in info.value.detail
    assert len(recorder.requests) == 1
    assert delays == []


async def test_read_timeout_is_a_timeout_and_not_retried() -> None:
    recorder = _Recorder(httpx.ReadTimeout("slow"))
    client, delays = _client(recorder)
    with pytest.raises(RequestTimeoutError):
        await client.complete([1], model="m", timeout_s=3.0)
    assert len(recorder.requests) == 1
    assert delays == []


async def test_caller_timeout_bounds_retries() -> None:
    """The deadline covers the whole call: a real (anyio) sleep between retries runs out."""
    recorder = _Recorder(httpx.ConnectError("refused"))
    http = httpx.AsyncClient(transport=httpx.MockTransport(recorder))
    client = CompletionClient(http, "http://vllm.test", max_retries=100, backoff_s=0.05)
    with pytest.raises(RequestTimeoutError, match=r"within 0\.3 s"):
        await client.complete([1], model="m", timeout_s=0.3)
    assert 2 <= len(recorder.requests) < 100


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("x"),
        httpx.ConnectTimeout("x"),
        httpx.ReadError("x"),
        httpx.WriteError("x"),
        httpx.RemoteProtocolError("x"),
        httpx.ReadTimeout("x"),
        httpx.WriteTimeout("x"),
        httpx.PoolTimeout("x"),
        httpx.LocalProtocolError("x"),
        httpx.UnsupportedProtocol("x"),
        httpx.ProxyError("x"),
        httpx.DecodingError("x"),
        httpx.TooManyRedirects("x"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_no_httpx_error_leaks(exc: Exception) -> None:
    client, _ = _client(_Recorder(exc), max_retries=1)
    with pytest.raises(RequestError) as info:
        await client.complete([1], model="m")
    assert isinstance(info.value.__cause__, httpx.HTTPError)
    assert not isinstance(info.value, httpx.HTTPError)
    for call in (client.models(), client.load_adapter("a", "/p"), client.unload_adapter("a")):
        with pytest.raises(PolicyError):
            await call


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        json.dumps({"model": "m", "choices": []}).encode(),
        json.dumps({"model": "m", "choices": [{"text": "x"}]}).encode(),
        json.dumps(
            {
                "model": "m",
                "choices": [
                    {
                        "text": "x",
                        "token_ids": [1, 2],
                        "prompt_token_ids": [1],
                        "logprobs": {"token_logprobs": [-1.0]},
                    }
                ],
            }
        ).encode(),
    ],
    ids=["not-json", "no-choices", "no-token-ids", "logprob-count"],
)
async def test_malformed_answers_are_bad_responses(body: bytes) -> None:
    client, _ = _client(_Recorder(httpx.Response(200, content=body)))
    with pytest.raises(BadResponseError):
        await client.complete([1], model="m")


async def test_admin_endpoints() -> None:
    seen: list[tuple[str, str, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.content))
        if request.url.path == "/v1/models":
            data = [{"id": "/models/tiny", "parent": None}, {"id": "p@v0", "parent": "/m"}]
            return httpx.Response(200, json={"object": "list", "data": data})
        if request.url.path == "/v1/unload_lora_adapter":
            return httpx.Response(404, json={"error": {"message": "cannot be found"}})
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, text="Success")

    client, _ = _client(handler)
    assert await client.models() == {"/models/tiny": None, "p@v0": "/m"}
    await client.load_adapter("p@v1", "/adapters/v1")
    assert json.loads(seen[-1][2]) == {"lora_name": "p@v1", "lora_path": "/adapters/v1"}
    assert await client.unload_adapter("p@v9") is False  # 404: it was not there
    assert await client.health() is True


async def test_health_is_false_when_unreachable() -> None:
    client, delays = _client(_Recorder(httpx.ConnectError("refused")))
    assert await client.health() is False
    assert delays == []  # one try only
