"""One OpenAI-compatible chat model behind `/v1/chat/completions` (vLLM, OpenAI, ...).

`ChatModel.ask(system, user)` returns the reply's text. httpx errors, a status other than
200, a body that is not a chat completion and a reply without content are raised as the
`error` class given (a `ChatError`: the fuzzy-match judge's `JudgeError`, the task
generator's `GeneratorError`), with the httpx error as the cause where there is one, and
`who` naming the model's part in the message.
"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec

from sites.errors import ChatError

__all__ = ["ChatModel"]


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    message: _Message


class _Completion(msgspec.Struct):
    choices: list[_Choice]


class ChatModel:
    """A chat model at `url` (the server's base URL, with or without `/v1`). The httpx
    client is injected and owned by the caller; `timeout_s` bounds each request."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        url: str,
        model: str,
        api_key: str = "",
        max_tokens: int = 512,
        timeout_s: float = 60.0,
        error: type[ChatError] = ChatError,
        who: str = "chat model",
    ) -> None:
        base = url.rstrip("/").removesuffix("/v1")
        self.endpoint = f"{base}/v1/chat/completions"
        self._client = client
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._max_tokens = max_tokens
        self._timeout_s = timeout_s
        self._error = error
        self._who = who
        self._decoder = msgspec.json.Decoder(_Completion)

    async def ask(self, system: str, user: str, *, temperature: float = 0.0) -> str:
        """The model's reply to one system and one user message."""
        body: dict[str, Any] = {
            "model": self._model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
            "temperature": temperature,
            "max_tokens": self._max_tokens,
        }
        who, where = self._who, self.endpoint
        try:
            response = await self._client.post(
                where, json=body, headers=self._headers, timeout=self._timeout_s
            )
        except httpx.HTTPError as exc:
            raise self._error(f"{who} request to {where} failed: {exc!r}") from exc
        if response.status_code != httpx.codes.OK:
            raise self._error(
                f"{who} at {where} answered {response.status_code}: {response.text[:200]}"
            )
        try:
            completion = self._decoder.decode(response.content)
        except msgspec.DecodeError as exc:
            raise self._error(f"{who} reply is not a chat completion: {exc}") from exc
        if not completion.choices or completion.choices[0].message.content is None:
            raise self._error(f"{who} reply has no message content")
        return completion.choices[0].message.content
