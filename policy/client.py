"""Token-in/token-out client of vLLM's OpenAI-compatible server, and the `VLLMPolicy`.

`CompletionClient` speaks HTTP through an injected `httpx.AsyncClient` (a real one in
production and integration tests, one with `httpx.MockTransport` in unit tests). Every
httpx error is converted in `_send`, the one boundary; connection errors and 5xx answers
are retried with exponential backoff, 4xx answers and timeouts are not. The caller's
timeout bounds the whole call, retries included.

`VLLMPolicy` implements the runtime's `Policy` protocol: it renders the turn's messages to
token ids, leases the current adapter version for the whole request, and returns the
exact prompt ids, completion ids and logprobs of the turn.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import anyio
import httpx
import msgspec
import structlog

from policy.adapters import AdapterLease
from policy.errors import (
    BadRequestError,
    BadResponseError,
    PromptTooLongError,
    RequestError,
    RequestTimeoutError,
    ServerUnavailableError,
)
from policy.prompt import PromptRenderer
from runtime.base.config import PolicyConfig
from runtime.base.messages import PolicyReply, PolicyRequest

__all__ = [
    "AdapterRouting",
    "Completion",
    "CompletionClient",
    "CompletionServer",
    "PolicyStatistics",
    "SamplingParams",
    "VLLMPolicy",
]

_log = structlog.get_logger("policy.client")

Sleep = Callable[[float], Awaitable[None]]


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How one completion is sampled. Temperature 1.0 is on-policy sampling for training."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    # Return the sampled tokens' logprobs (the behaviour policy's, for the learner).
    logprobs: bool = True
    stop_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, config: PolicyConfig) -> SamplingParams:
        return cls(max_tokens=config.max_tokens, temperature=config.temperature, top_p=config.top_p)


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """One completion as the server returned it; `logprobs` has one entry per token."""

    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    model: str


class _Logprobs(msgspec.Struct):
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []


class _Choice(msgspec.Struct):
    text: str
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    logprobs: _Logprobs | None = None


class _CompletionResponse(msgspec.Struct):
    model: str
    choices: list[_Choice]


class _Model(msgspec.Struct):
    id: str
    parent: str | None = None


class _ModelList(msgspec.Struct):
    data: list[_Model]


_completion_decoder = msgspec.json.Decoder(_CompletionResponse)
_models_decoder = msgspec.json.Decoder(_ModelList)

# Transport failures worth another try: the server is (re)starting or dropped the connection.
_RETRYABLE = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
)


def _detail(response: httpx.Response) -> str:
    """The error message of a vLLM/OpenAI error body, or the raw body's start."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
    return response.text[:500]


class CompletionClient:
    """The server's HTTP API: completions, health, models, LoRA load/unload."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        *,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        sleep: Sleep = anyio.sleep,
    ) -> None:
        self._http = http
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._sleep = sleep

    @classmethod
    def from_config(
        cls, http: httpx.AsyncClient, base_url: str, config: PolicyConfig
    ) -> CompletionClient:
        return cls(
            http,
            base_url,
            timeout_s=config.request_timeout_s,
            max_retries=config.max_retries,
            backoff_s=config.retry_backoff_s,
        )

    # ------------------------------------------------------------------ the boundary

    async def _send_once(
        self, method: str, path: str, body: Any | None, timeout_s: float
    ) -> httpx.Response:
        """One HTTP exchange; every httpx error leaves as a `RequestError`."""
        url = f"{self.base_url}{path}"
        try:
            response = await self._http.request(method, url, json=body, timeout=timeout_s)
        except _RETRYABLE as exc:
            raise ServerUnavailableError(f"{path}: {type(exc).__name__}: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise RequestTimeoutError(f"{path}: no answer within {timeout_s:.1f} s") from exc
        except httpx.HTTPError as exc:
            raise RequestError(f"{path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ServerUnavailableError(
                f"{path}: HTTP {response.status_code}: {_detail(response)}"
            )
        if response.status_code >= 400:
            raise BadRequestError(response.status_code, _detail(response), path)
        return response

    async def _send(
        self, method: str, path: str, body: Any | None = None, *, timeout_s: float | None = None
    ) -> httpx.Response:
        """`_send_once` with retries and backoff on `ServerUnavailableError`, all within
        one deadline of `timeout_s` (the client's default when None)."""
        budget = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        try:
            with anyio.fail_after(budget):
                attempt = 0
                while True:
                    try:
                        remaining = max(deadline - time.monotonic(), 1e-3)
                        return await self._send_once(method, path, body, remaining)
                    except ServerUnavailableError:
                        if attempt >= self.max_retries:
                            raise
                    delay = min(self.backoff_s * 2**attempt, self.max_backoff_s)
                    attempt += 1
                    _log.debug("policy.retry", path=path, attempt=attempt, delay_s=delay)
                    await self._sleep(delay)
        except TimeoutError as exc:
            raise RequestTimeoutError(f"{path}: no answer within {budget:.1f} s") from exc

    # ------------------------------------------------------------------ endpoints

    async def complete(
        self,
        prompt_token_ids: Sequence[int],
        *,
        model: str,
        sampling: SamplingParams = SamplingParams(),
        timeout_s: float | None = None,
    ) -> Completion:
        """`/v1/completions` with a token-id prompt; returns exact ids and logprobs."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(prompt_token_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "return_token_ids": True,
            "skip_special_tokens": True,
        }
        if sampling.logprobs:
            body["logprobs"] = 0  # the sampled token's logprob only
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        response = await self._send("POST", "/v1/completions", body, timeout_s=timeout_s)
        try:
            parsed = _completion_decoder.decode(response.content)
        except msgspec.DecodeError as exc:
            raise BadResponseError(f"/v1/completions: unexpected answer ({exc})") from exc
        if len(parsed.choices) != 1:
            raise BadResponseError(f"/v1/completions: {len(parsed.choices)} choices, expected 1")
        choice = parsed.choices[0]
        if choice.token_ids is None or choice.prompt_token_ids is None:
            raise BadResponseError("/v1/completions: no token ids (return_token_ids unsupported?)")
        logprobs: list[float] = []
        if sampling.logprobs:
            raw = choice.logprobs.token_logprobs if choice.logprobs else []
            if len(raw) != len(choice.token_ids) or any(v is None for v in raw):
                raise BadResponseError(
                    f"/v1/completions: {len(raw)} logprobs for {len(choice.token_ids)} tokens"
                )
            logprobs = [float(v) for v in raw if v is not None]
        return Completion(
            text=choice.text,
            prompt_token_ids=choice.prompt_token_ids,
            token_ids=choice.token_ids,
            logprobs=logprobs,
            finish_reason=choice.finish_reason or "",
            model=parsed.model,
        )

    async def first_token_top(
        self,
        prompt_token_ids: Sequence[int],
        *,
        model: str,
        k: int,
        timeout_s: float | None = None,
    ) -> dict[str, float]:
        """The `k` likeliest first tokens after the prompt: {token text: logprob} (greedy,
        one token; a judge's verdict)."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(prompt_token_ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": k,
        }
        response = await self._send("POST", "/v1/completions", body, timeout_s=timeout_s)
        try:
            parsed = _completion_decoder.decode(response.content)
        except msgspec.DecodeError as exc:
            raise BadResponseError(f"/v1/completions: unexpected answer ({exc})") from exc
        choice = parsed.choices[0] if len(parsed.choices) == 1 else None
        top = choice.logprobs.top_logprobs if choice and choice.logprobs else []
        if not top or top[0] is None:
            raise BadResponseError("/v1/completions: no top log-probs for the first token")
        return dict(top[0])

    async def health(self, *, timeout_s: float = 5.0) -> bool:
        """True if `/health` answers 200 now (one try, no retries)."""
        try:
            await self._send_once("GET", "/health", None, timeout_s)
        except RequestError:
            return False
        return True

    async def models(self, *, timeout_s: float | None = None) -> dict[str, str | None]:
        """`/v1/models`: served name -> parent (None for base models, the base for LoRAs)."""
        response = await self._send("GET", "/v1/models", timeout_s=timeout_s)
        try:
            parsed = _models_decoder.decode(response.content)
        except msgspec.DecodeError as exc:
            raise BadResponseError(f"/v1/models: unexpected answer ({exc})") from exc
        return {m.id: m.parent for m in parsed.data}

    async def load_adapter(self, name: str, path: str, *, timeout_s: float | None = None) -> None:
        """`/v1/load_lora_adapter` under `name` (never in place)."""
        body = {"lora_name": name, "lora_path": path}
        await self._send("POST", "/v1/load_lora_adapter", body, timeout_s=timeout_s)

    async def unload_adapter(self, name: str, *, timeout_s: float | None = None) -> bool:
        """`/v1/unload_lora_adapter`; False if the server did not have it (404)."""
        body = {"lora_name": name}
        try:
            await self._send("POST", "/v1/unload_lora_adapter", body, timeout_s=timeout_s)
        except BadRequestError as exc:
            if exc.status == 404:
                return False
            raise
        return True


class PolicyStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Requests of a `VLLMPolicy`: in flight, waiting for a slot, done and failed."""

    in_flight: int
    waiting: int
    max_concurrency: int
    completed: int
    failed: int


class CompletionServer(Protocol):
    """Where `VLLMPolicy` sends completions: one `CompletionClient`, or a
    `policy.replicas.ReplicaSet` of several servers that serve the same model."""

    async def complete(
        self,
        prompt_token_ids: Sequence[int],
        *,
        model: str,
        sampling: SamplingParams = ...,
        timeout_s: float | None = None,
    ) -> Completion: ...


class AdapterRouting(Protocol):
    """Which adapter a request names: `AdapterManager` (this process publishes), or
    `policy.follower.AdapterFollower` (another process does, as on Ray's rollout workers)."""

    def lease(self, name: str | None = None) -> AbstractContextManager[AdapterLease]: ...

    async def restore(self) -> list[str]: ...


class VLLMPolicy:
    """The runtime's `Policy` backed by a vLLM server and the adapter manager."""

    def __init__(
        self,
        client: CompletionServer,
        renderer: PromptRenderer,
        adapters: AdapterRouting,
        *,
        sampling: SamplingParams = SamplingParams(),
        max_model_len: int = 4096,
        max_concurrency: int = 32,
        timeout_s: float | None = None,
    ) -> None:
        self.client = client
        self.renderer = renderer
        self.adapters = adapters
        self.sampling = sampling
        self.max_model_len = max_model_len
        self.timeout_s = timeout_s
        # The resident adapter every turn uses (`pinned`); None: the current version.
        self.adapter: str | None = None
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        self._completed = 0
        self._failed = 0

    def with_sampling(self, sampling: SamplingParams) -> VLLMPolicy:
        """This policy sampling with `sampling` (e.g. greedy evaluations beside sampled
        training rollouts): the same client, adapters and concurrency slots; its own
        completed/failed counts."""
        other = copy.copy(self)
        other.sampling = sampling
        other._completed = other._failed = 0
        return other

    def pinned(self, adapter: str) -> VLLMPolicy:
        """This policy with every turn on the resident adapter `adapter` (a request that
        names its own still wins), for evaluating one version while newer ones are
        published; the caller keeps it resident (a lease held for the evaluation)."""
        other = copy.copy(self)
        other.adapter = adapter
        return other

    async def act(self, request: PolicyRequest) -> PolicyReply:
        """One turn: render `request.messages`, sample with the current adapter (or the
        resident one `request.adapter`, else `self.adapter`, names).

        A 404 from the server (it restarted and lost the adapters) makes the adapter
        manager load them again, and the turn is retried once.
        """
        prompt = self.renderer.render(request.messages)
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise PromptTooLongError(len(prompt), self.max_model_len)
        sampling = msgspec.structs.replace(
            self.sampling, max_tokens=min(self.sampling.max_tokens, room)
        )
        adapter = request.adapter or self.adapter
        started = time.monotonic()
        try:
            async with self._limiter:
                try:
                    lease, completion = await self._complete(prompt, sampling, adapter)
                except BadRequestError as exc:
                    if exc.status != 404 or not await self.adapters.restore():
                        raise
                    # The server lost our adapters (it restarted): they are back, retry.
                    lease, completion = await self._complete(prompt, sampling, adapter)
            if completion.prompt_token_ids != prompt:
                raise BadResponseError(
                    "/v1/completions: the server's prompt ids differ from the ids sent"
                )
        except Exception:
            self._failed += 1
            raise
        self._completed += 1
        _log.debug(
            "policy.completion",
            episode_id=request.episode_id,
            turn=request.turn,
            adapter=lease.name,
            prompt_tokens=len(prompt),
            completion_tokens=len(completion.token_ids),
            finish_reason=completion.finish_reason,
            latency_s=round(time.monotonic() - started, 4),
        )
        return PolicyReply(
            # The text of exactly these ids. The server's own text can differ only by a
            # trailing incomplete UTF-8 character, which its streaming detokenizer holds back.
            text=self.renderer.decode(completion.token_ids),
            prompt_token_ids=prompt,
            completion_token_ids=completion.token_ids,
            completion_logprobs=completion.logprobs,
            adapter=lease.name,
            adapter_version=lease.version,
            finish_reason=completion.finish_reason,
        )

    async def _complete(
        self, prompt: list[int], sampling: SamplingParams, adapter: str | None
    ) -> tuple[AdapterLease, Completion]:
        with self.adapters.lease(adapter) as lease:
            completion = await self.client.complete(
                prompt, model=lease.name, sampling=sampling, timeout_s=self.timeout_s
            )
        return lease, completion

    def statistics(self) -> PolicyStatistics:
        stats = self._limiter.statistics()
        return PolicyStatistics(
            in_flight=stats.borrowed_tokens,
            waiting=stats.tasks_waiting,
            max_concurrency=int(stats.total_tokens),
            completed=self._completed,
            failed=self._failed,
        )
