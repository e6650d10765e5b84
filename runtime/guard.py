"""The API's fences: who may call it, from where, with what, and which runs it takes.

- `endpoint_token(endpoint, environ)`: the bearer token from `token`, `token_file` or
  `token_env` (one of them), checked against the bind address: no token is allowed on a
  loopback host only, and any other host needs a token of `MIN_TOKEN_CHARS` or more.
  `endpoint_problems` is the part of that check a config file alone decides
  (`webagent config check`). Both raise or return `ConfigError`-style (field, problem).
- `RequestGuard`: ASGI middleware in front of the bearer check. The Host header must name
  this API (DNS rebinding), an Origin header must be the API's own or a configured one
  (CSRF), a request body must be `application/json` (415 else) and its declared length
  at most `max_body_bytes` (413; the API caps what it reads to the same).
- `RunTargets`: what a `POST /v1/runs` may point the browser at, checked before a run is
  accepted (422 naming the field): http(s) URLs that parse, never the unspecified address,
  the API's own port or the policy server's; `sites` entries that name their port; the
  built-in sites' loopback spelled as their URLs spell it (else no tenant); an intent that
  fits the prompt; an evaluation that can be scored.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final
from urllib.parse import SplitResult, urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.base.config import Config, ConfigError, EndpointConfig
from runtime.base.http import HttpLimits
from runtime.base.messages import RunRequest, TaskConfig
from sites.errors import TaskFileError
from sites.tasks import check_task

__all__ = [
    "MIN_TOKEN_CHARS",
    "RequestGuard",
    "RunRefused",
    "RunTargets",
    "endpoint_problems",
    "endpoint_token",
    "http_limits",
    "intent_budget",
    "is_loopback",
]

MIN_TOKEN_CHARS: Final = 32
_MAKE_ONE = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
_LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, any spelling Chromium accepts) is loopback."""
    name = host.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    address = _address(name)
    return address is not None and address.is_loopback


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address `name` spells, legacy IPv4 forms (127.1, 0x7f000001) included."""
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(name))
    except (OSError, ValueError):
        return None


def _is_unspecified(name: str) -> bool:
    address = _address(name.strip("[]"))
    return address is not None and address.is_unspecified


# ---------------------------------------------------------------------- the token


def endpoint_problems(endpoint: EndpointConfig) -> list[tuple[str, str]]:
    """(field, problem) for what makes `endpoint` unsafe, as far as the file decides."""
    sources = [n for n in ("token", "token_file", "token_env") if getattr(endpoint, n)]
    if len(sources) > 1:
        return [(f"endpoint.{sources[1]}", f"set only one of {', '.join(sources)}")]
    if not endpoint.enabled or is_loopback(endpoint.host):
        return []
    if not sources:
        return [
            (
                "endpoint.host",
                f"{endpoint.host} is not a loopback address, so the API needs a token: set "
                f"endpoint.token_file or endpoint.token_env (or token), at least "
                f"{MIN_TOKEN_CHARS} characters, e.g. from `{_MAKE_ONE}`",
            )
        ]
    if endpoint.token:
        return _strength("endpoint.token", endpoint.token, endpoint.host)
    return []


def _strength(field: str, token: str, host: str) -> list[tuple[str, str]]:
    if is_loopback(host) or len(token) >= MIN_TOKEN_CHARS:
        return []
    return [
        (
            field,
            f"the token is {len(token)} characters; a host other than loopback ({host}) "
            f"needs at least {MIN_TOKEN_CHARS}, e.g. from `{_MAKE_ONE}`",
        )
    ]


def endpoint_token(endpoint: EndpointConfig, environ: Mapping[str, str]) -> str:
    """The bearer token the API requires ("" for none); raises `ConfigError` when the
    endpoint must not start (see the module docstring)."""
    source = "[endpoint]"
    for field, problem in endpoint_problems(endpoint):
        raise ConfigError(source, field, problem)
    if not endpoint.enabled:
        return ""
    token, field = endpoint.token, "endpoint.token"
    if endpoint.token_file:
        field = "endpoint.token_file"
        try:
            lines = Path(endpoint.token_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(source, field, f"cannot read {endpoint.token_file} ({exc})") from exc
        token = lines[0].strip() if lines else ""
        if not token:
            raise ConfigError(source, field, f"{endpoint.token_file} is empty")
    elif endpoint.token_env:
        field = "endpoint.token_env"
        token = environ.get(endpoint.token_env, "").strip()
        if not token:
            raise ConfigError(
                source, field, f"the environment variable {endpoint.token_env} is not set"
            )
    for field_, problem in _strength(field, token, endpoint.host):
        raise ConfigError(source, field_, problem)
    return token


def http_limits(endpoint: EndpointConfig) -> HttpLimits:
    """The connection limits `serve_asgi` enforces for the API."""
    return HttpLimits(
        max_header_bytes=endpoint.max_header_bytes,
        header_timeout_s=endpoint.header_timeout_s,
        keep_alive_s=endpoint.keep_alive_s,
        max_connections=endpoint.max_connections,
    )


# ---------------------------------------------------------------------- requests


class RequestGuard:
    """Host, Origin, Content-Type and body size of every HTTP request (see module doc)."""

    def __init__(self, app: ASGIApp, endpoint: EndpointConfig) -> None:
        self.app = app
        self.max_body = endpoint.max_body_bytes
        self.origins = {o.rstrip("/").lower() for o in endpoint.allowed_origins}
        names = {h.lower().strip("[]") for h in endpoint.allowed_hosts}
        host = endpoint.host.lower().strip("[]")
        self.any_host = "*" in names or (_is_unspecified(host) and not names)
        if is_loopback(host):
            names |= _LOOPBACK_NAMES
        self.hosts = names | {host}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        problem = self._refusal(scope["method"], headers)
        if problem is not None:
            status, error = problem
            await JSONResponse({"error": error}, status)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, method: str, headers: Headers) -> tuple[int, str] | None:
        host_header = headers.get("host", "")
        name = _host_name(host_header)
        if not self.any_host and name not in self.hosts:
            return 421, (
                f"Host {host_header!r} is not this API's; add it to endpoint.allowed_hosts "
                "if a proxy or a DNS name in front of the API sends it"
            )
        origin = headers.get("origin")
        if origin is not None and not self._same_origin(origin, host_header):
            return 403, (
                f"cross-origin request from {origin!r} refused; add the origin to "
                "endpoint.allowed_origins to allow it"
            )
        length = headers.get("content-length")
        has_body = headers.get("transfer-encoding") is not None or (length or "0") != "0"
        content_type = headers.get("content-type")
        if has_body or content_type is not None:
            media = (content_type or "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                return 415, (
                    f"a request body must be application/json, not {content_type or 'untyped'}"
                )
        if length is not None and (not length.isdecimal() or int(length) > self.max_body):
            return 413, f"the body is over {self.max_body} bytes (endpoint.max_body_bytes)"
        return None

    def _same_origin(self, origin: str, host_header: str) -> bool:
        origin = origin.rstrip("/").lower()
        if origin in self.origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and parts.netloc == host_header.lower()


def _host_name(host_header: str) -> str:
    """ "Example.org:8765" -> "example.org"; "[::1]:80" -> "::1"."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


# ---------------------------------------------------------------------- runs


class RunRefused(ValueError):
    """A run request that can never run; `field` names what was wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


def intent_budget(config: Config) -> int:
    """Tokens an intent may take: the context less the reply and a quarter of the context
    kept for the system prompt and a page (an intent over it can never get an answer)."""
    policy = config.policy
    return max(1, policy.max_model_len - policy.max_tokens - policy.max_model_len // 4)


class RunTargets:
    """Checks a `RunRequest` before it is accepted (see the module docstring).

    `own` are the URLs of servers a run must never reach (the API, the policy server);
    `site_urls` the sites' URLs, whose host spelling a run must keep; `count_tokens` and
    `max_intent_tokens` bound the intent.
    """

    def __init__(
        self,
        *,
        own: Iterable[str] = (),
        site_urls: Iterable[str] = (),
        count_tokens: Callable[[str], int] | None = None,
        max_intent_tokens: int = 0,
    ) -> None:
        self.own_ports = {port for url in own if (port := _url_port(url)) is not None}
        self.sites: dict[int, str] = {}
        for url in site_urls:
            parts = urlsplit(url)
            port = _url_port(url)
            if port is not None and parts.hostname and is_loopback(parts.hostname):
                self.sites[port] = parts.hostname.lower()
        self.count_tokens = count_tokens
        self.max_intent_tokens = max_intent_tokens

    def add_own(self, url: str) -> None:
        """One more server of this process (the API, once it listens on its port)."""
        port = _url_port(url)
        if port is not None:
            self.own_ports.add(port)

    def check(self, request: RunRequest) -> None:
        """Raise `RunRefused` for a request that can never run."""
        self._url("start_url", request.start_url)
        for i, entry in enumerate(request.sites):
            field = f"sites[{i}]"
            if "://" not in entry and _explicit_port(field, f"//{entry}") is None:
                raise RunRefused(
                    field, f"{entry!r} names no port: give host:port or a URL with a scheme"
                )
            self._url(field, entry if "://" in entry else f"http://{entry}")
        if self.count_tokens is not None and self.max_intent_tokens:
            tokens = self.count_tokens(request.intent)
            if tokens > self.max_intent_tokens:
                raise RunRefused(
                    "intent",
                    f"the intent is {tokens} tokens; at most {self.max_intent_tokens} fit "
                    "the model's context with a page and the reply",
                )
        if request.evaluation is not None:
            task = TaskConfig(
                task_id=-1,
                intent=request.intent,
                start_url=request.start_url,
                eval=request.evaluation,
            )
            try:
                check_task(task)
            except TaskFileError as exc:
                field = exc.field.removeprefix("eval")
                raise RunRefused(f"evaluation{field}", exc.problem) from exc

    def _url(self, field: str, url: str) -> None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise RunRefused(field, f"{url!r} is not a URL ({exc})") from exc
        if parts.scheme.lower() not in ("http", "https"):
            raise RunRefused(field, f"{url!r}: only http and https URLs can be visited")
        host = (parts.hostname or "").lower()
        if not host:
            raise RunRefused(field, f"{url!r} has no host")
        if _is_unspecified(host):
            raise RunRefused(field, f"{host} is the unspecified address, not a site")
        port = port or _default_port(parts)
        # This machine: loopback, any address literal (the API may listen on 0.0.0.0) or
        # its own name.
        local = (
            is_loopback(host) or _address(host) is not None or host == socket.gethostname().lower()
        )
        if local and port in self.own_ports:
            raise RunRefused(
                field, f"{host}:{port} is this daemon's own API or policy server, not a site"
            )
        spelled = self.sites.get(port)
        if is_loopback(host) and spelled is not None and host != spelled:
            raise RunRefused(
                field,
                f"{host}:{port} is a built-in site spelled differently from its URL; use "
                f"{spelled}:{port} (the site's tenant cookie is set for that host)",
            )


def _url_port(url: str) -> int | None:
    try:
        parts = urlsplit(url)
        return parts.port or _default_port(parts)
    except ValueError:
        return None


def _default_port(parts: SplitResult) -> int:
    return 443 if parts.scheme.lower() == "https" else 80


def _explicit_port(field: str, text: str) -> int | None:
    try:
        return urlsplit(text).port
    except ValueError as exc:
        raise RunRefused(field, f"{text.lstrip('/')!r} has a bad port ({exc})") from exc
