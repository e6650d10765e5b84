"""Errors of the policy layer.

    Exception
    └── PolicyError                 base of everything the policy layer raises on purpose
        ├── ModelFilesError         a model folder without a usable tokenizer or chat template
        ├── PromptTooLongError      a rendered prompt leaves no room to generate
        ├── ServerError             the vLLM server process
        │   ├── ServerStartError    it did not come up in time, or exited while starting
        │   └── ServerExitedError   it exited while it was expected to serve
        ├── RequestError            one HTTP exchange with the server failed
        │   ├── ServerUnavailableError  connection refused/reset/closed, or 5xx after retries
        │   ├── RequestTimeoutError     no answer within the caller's timeout
        │   ├── BadRequestError         4xx: the server refused what was sent (`status`, `detail`)
        │   └── BadResponseError        a 2xx answer without the fields asked for
        └── AdapterError            adapter versions and hot-swap
            ├── AdapterManifestError  missing, unreadable or mismatching manifest.json
            └── AdapterSwapError      the server does not list the adapters it should

httpx errors are converted to `RequestError`s in one place (`policy.client._send`); no
httpx exception leaves the package.
"""

from __future__ import annotations

__all__ = [
    "AdapterError",
    "AdapterManifestError",
    "AdapterSwapError",
    "BadRequestError",
    "BadResponseError",
    "ModelFilesError",
    "PolicyError",
    "PromptTooLongError",
    "RequestError",
    "RequestTimeoutError",
    "ServerError",
    "ServerExitedError",
    "ServerStartError",
    "ServerUnavailableError",
]


class PolicyError(Exception):
    """Base of the policy layer's own errors."""


class ModelFilesError(PolicyError):
    """A model folder that lacks a usable tokenizer.json or chat template."""


class PromptTooLongError(PolicyError):
    """A rendered prompt that leaves no room for the completion within max_model_len."""

    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"prompt of {prompt_tokens} tokens leaves no room to generate "
            f"(max_model_len {max_model_len})"
        )


class ServerError(PolicyError):
    """The vLLM server process; `log_tail` holds the last lines of its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        text = (
            f"{message}\n--- last lines of the server log ---\n{log_tail}" if log_tail else message
        )
        super().__init__(text)


class ServerStartError(ServerError):
    """The server did not become healthy in time, or exited while starting."""


class ServerExitedError(ServerError):
    """The server exited while it was expected to serve."""


class RequestError(PolicyError):
    """One HTTP exchange with the server failed."""


class ServerUnavailableError(RequestError):
    """The server could not be reached, dropped the connection, or kept answering 5xx."""


class RequestTimeoutError(RequestError):
    """The server did not answer within the caller's timeout."""


class BadRequestError(RequestError):
    """The server refused the request (4xx); `status` and `detail` say why."""

    def __init__(self, status: int, detail: str, path: str) -> None:
        self.status = status
        self.detail = detail
        self.path = path
        super().__init__(f"{path}: HTTP {status}: {detail}")


class BadResponseError(RequestError):
    """A successful answer that lacks the fields the request asked for."""


class AdapterError(PolicyError):
    """Adapter versions and hot-swap."""


class AdapterManifestError(AdapterError):
    """An adapter folder whose manifest.json is missing, unreadable or does not match."""


class AdapterSwapError(AdapterError):
    """After a load or unload, the server does not list the adapters it should."""
