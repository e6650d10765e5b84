"""HTTP: the daemon's control API and the agent endpoint, one starlette app.

Routes (every one but `/healthz` needs `Authorization: Bearer <token>` when a token is
configured; tokens are compared in constant time and never logged). In front of the token
check, `runtime.guard.RequestGuard` refuses a foreign Host (421) or Origin (403), a body
that is not `application/json` (415) or too long (413):

    GET  /healthz                  liveness, no auth
    GET  /status                   adapter versions, queues, pools, throughput, success
    GET  /metrics                  Prometheus text format
    POST /control/pause            stop starting new turns (training: rollouts); in serving
                                   mode it answers "paused": false and says why
    POST /control/resume
    POST /policies/load            {"path": DIR}: serve an adapter trained elsewhere
    POST /v1/runs                  RunRequest -> 202 {"run_id": ...}; 422 names the field
                                   (also for a run that can never run: `RunTargets`),
                                   429 + Retry-After when the endpoint is full
    GET  /v1/runs/{id}             RunState
    GET  /v1/runs/{id}/events      server-sent events: `turn` per turn, then `end`
    DELETE /v1/runs/{id}           cancel a run (also POST /v1/runs/{id}/cancel) -> RunState

The app talks to the daemon through two narrow seams: a `DaemonControls` (status, metrics,
pause, policy loading) and a `RunService` that owns the agent runs. `serve_api` is the
daemon's: it wires the agent endpoint's runs (`runtime.agent_episode`) to the served policy
and the environment and serves the app until cancelled.
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import anyio
import msgspec
import structlog
from anyio.abc import TaskStatus
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.agent_episode import run_agent_episode
from runtime.agent_runs import EndpointFull, RunOutcome, RunService, UnknownRun
from runtime.base.config import Config, EndpointConfig
from runtime.base.http import serve_asgi
from runtime.base.messages import RunRequest, RunState, RunTurn, encode
from runtime.browser import BrowserPool
from runtime.environment import Environment
from runtime.episode import EpisodeSettings
from runtime.guard import RequestGuard, RunRefused, RunTargets, http_limits, intent_budget
from runtime.policystack import PolicyStack

__all__ = ["DaemonControls", "build_app"]

log = structlog.get_logger("runtime.api")


class DaemonControls(Protocol):
    """What the control API needs from the daemon."""

    # False in serving mode: there are no rollouts for pause/resume to act on.
    training: bool

    def status(self) -> dict[str, Any]: ...

    def prometheus(self) -> str: ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def load_policy(self, path: str) -> str:
        """Load the adapter at `path`; returns the name it is served under."""
        ...


class PolicyLoad(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    path: str


_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`")
_PID = re.compile(r"(?P<word>\bpid\s*[=:]?\s*)\d+", re.IGNORECASE)


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(encode(payload), status, headers=headers, media_type="application/json")


def _problem(status: int, error: str, **extra: Any) -> Response:
    return _json({"error": error, **extra}, status)


async def _decode(request: Request, type_: type[Any], max_bytes: int) -> Any:
    """The request body as `type_`, or raise a ready 400/413/422 response."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _Reject(_problem(413, f"the body is over {max_bytes} bytes"))
        chunks.append(chunk)
    body = b"".join(chunks)
    try:
        raw = msgspec.json.decode(body) if body else None
    except msgspec.DecodeError as exc:
        raise _Reject(_problem(400, f"body is not valid JSON: {exc}")) from exc
    except RecursionError as exc:  # msgspec's depth limit (10^5 nested brackets)
        raise _Reject(_problem(400, "body is not valid JSON: nested too deeply")) from exc
    if not isinstance(raw, dict):
        raise _Reject(_problem(422, "body must be a JSON object", field=""))
    if isinstance(raw.get("start_url"), str):
        raw["start_url"] = _lower_scheme(raw["start_url"])
    try:
        return msgspec.convert(raw, type_)
    except msgspec.ValidationError as exc:
        message = str(exc)
        match = _AT.search(message)
        field = match["path"] if match else ""
        unknown = _UNKNOWN.match(message)
        if unknown:
            field = f"{field}.{unknown['name']}" if field else unknown["name"]
        raise _Reject(_problem(422, message, field=field)) from exc


def _lower_scheme(url: str) -> str:
    """ "HTTP://Host/x" -> "http://Host/x" (schemes are case-insensitive, RFC 3986)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.lower()}{sep}{rest}" if sep and scheme.isalpha() else url


def _redact(message: str) -> str:
    """An error for a client: without this process's working directory or PID."""
    cwd = str(Path.cwd())
    if cwd != "/":
        message = message.replace(cwd + os.sep, "").replace(cwd, ".")
    message = _PID.sub(r"\g<word><pid>", message)  # this process's or vLLM's ("pid=4242")
    return re.sub(rf"(?<!\d){os.getpid()}(?!\d)", "<pid>", message)


class _Reject(Exception):
    """Carries a finished error response out of a helper."""

    def __init__(self, response: Response) -> None:
        self.response = response


class _BearerAuth:
    """Every route but /healthz needs the configured bearer token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.token or scope["path"] == "/healthz":
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given = value[7:].strip()
        if not hmac.compare_digest(given, self.token):
            response = _problem(401, "missing or wrong bearer token")
            response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


Handler = Callable[[Request], Awaitable[Response]]


def _rejects(handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except _Reject as reject:
            return reject.response

    return wrapped


def build_app(
    *,
    controls: DaemonControls | None,
    runs: RunService | None,
    token: str = "",
    endpoint: EndpointConfig | None = None,
    targets: RunTargets | None = None,
) -> Starlette:
    """The app; `controls` None serves the agent endpoint alone (training off).

    `endpoint` gives the guard its bind address, allowed hosts and origins and the body
    limit (default: `EndpointConfig()`, loopback); `targets` checks runs before they are
    accepted (default: URLs that parse, nothing of this process excluded).
    """
    endpoint = endpoint or EndpointConfig()
    targets = targets or RunTargets()
    max_body = endpoint.max_body_bytes

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def status(request: Request) -> Response:
        payload: dict[str, Any] = controls.status() if controls is not None else {}
        if runs is not None:
            payload["runs"] = runs.statistics()
        return _json(payload)

    async def metrics(request: Request) -> Response:
        text = controls.prometheus() if controls is not None else ""
        if runs is not None:
            text += runs.prometheus()
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    def _need_controls() -> DaemonControls:
        if controls is None:
            raise _Reject(_problem(409, "training is off in this process"))
        return controls

    def _no_rollouts(target: DaemonControls) -> Response | None:
        if target.training:
            return None
        return _json(
            {
                "paused": False,
                "training": False,
                "effect": "none: training is off in this process, so there are no rollouts "
                "to pause or resume; agent runs are not affected",
            }
        )

    async def pause(request: Request) -> Response:
        target = _need_controls()
        if (answer := _no_rollouts(target)) is not None:
            return answer
        await target.pause()
        return _json({"paused": True})

    async def resume(request: Request) -> Response:
        target = _need_controls()
        if (answer := _no_rollouts(target)) is not None:
            return answer
        await target.resume()
        return _json({"paused": False})

    async def load_policy(request: Request) -> Response:
        target = _need_controls()
        body: PolicyLoad = await _decode(request, PolicyLoad, max_body)
        try:
            name = await target.load_policy(body.path)
        except Exception as exc:  # the adapter was refused: say why, keep serving
            log.warning("policy.load_refused", path=body.path, error=str(exc))
            return _problem(422, _redact(str(exc)), field="path")
        return _json({"adapter": name})

    def _need_runs() -> RunService:
        if runs is None:
            raise _Reject(_problem(404, "the agent endpoint is off in this process"))
        return runs

    async def create_run(request: Request) -> Response:
        service = _need_runs()
        body: RunRequest = await _decode(request, RunRequest, max_body)
        try:
            targets.check(body)
            state = service.submit(body)
        except RunRefused as exc:
            return _problem(422, str(exc), field=exc.field)
        except EndpointFull as exc:
            return _json({"error": str(exc)}, 429, headers={"Retry-After": str(exc.retry_after_s)})
        except ValueError as exc:
            field = "max_turns" if "max_turns" in str(exc) else "adapter"
            return _problem(422, str(exc), field=field)
        return _json({"run_id": state.run_id, "status": state.status}, 202)

    def _run_state(request: Request) -> RunState:
        run_id = request.path_params["run_id"]
        try:
            return _need_runs().get(run_id)
        except UnknownRun as exc:
            raise _Reject(_problem(404, str(exc))) from exc

    async def get_run(request: Request) -> Response:
        return _json(_run_state(request))

    async def cancel_run(request: Request) -> Response:
        state = _run_state(request)
        return _json(await _need_runs().cancel(state.run_id))

    async def run_events(request: Request) -> Response:
        state = _run_state(request)
        service = _need_runs()

        async def stream() -> AsyncIterator[bytes]:
            async for item in service.follow(state.run_id):
                kind = "turn" if isinstance(item, RunTurn) else "end"
                yield b"event: " + kind.encode() + b"\ndata: " + encode(item) + b"\n\n"

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    routes = [
        Route("/healthz", healthz),
        Route("/status", status),
        Route("/metrics", metrics),
        Route("/control/pause", _rejects(pause), methods=["POST"]),
        Route("/control/resume", _rejects(resume), methods=["POST"]),
        Route("/policies/load", _rejects(load_policy), methods=["POST"]),
        Route("/v1/runs", _rejects(create_run), methods=["POST"]),
        Route("/v1/runs/{run_id}", _rejects(get_run), methods=["GET"]),
        Route("/v1/runs/{run_id}", _rejects(cancel_run), methods=["DELETE"]),
        Route("/v1/runs/{run_id}/cancel", _rejects(cancel_run), methods=["POST"]),
        Route("/v1/runs/{run_id}/events", _rejects(run_events)),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return _problem(404, f"no route {request.method} {request.url.path}")

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return _problem(405, f"{request.method} not allowed on {request.url.path}")

    return Starlette(
        routes=routes,
        middleware=[
            Middleware(RequestGuard, endpoint=endpoint),
            Middleware(_BearerAuth, token=token),
        ],
        exception_handlers={404: not_found, 405: method_not_allowed},
    )


async def serve_api(
    controls: DaemonControls | None,
    config: Config,
    *,
    environment: Environment,
    pool: BrowserPool,
    stack: PolicyStack,
    token: str,
    task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the app on `endpoint.host:port` until cancelled; `task_status.started(url)`.

    Agent runs drive the served policy (an adapter the request names must be resident)
    in `environment`; `RunTargets` refuses a run aimed at the policy server or at this
    API itself, whose URL joins them once it is bound.
    """
    targets = RunTargets(
        own=list(stack.urls),
        site_urls=environment.urls.values(),
        count_tokens=stack.renderer.count_tokens,
        max_intent_tokens=intent_budget(config),
    )
    settings = EpisodeSettings.from_config(config)

    async def execute(
        run_id: str, request: RunRequest, on_turn: Callable[[RunTurn], None]
    ) -> RunOutcome:
        return await run_agent_episode(
            run_id, request, on_turn, env=environment, pool=pool, policy=stack.policy,
            settings=settings, count_tokens=stack.renderer.count_tokens,
        )  # fmt: skip

    def validate(request: RunRequest) -> None:
        if request.adapter is not None and stack.adapters.resident(request.adapter) is None:
            raise ValueError(f"adapter {request.adapter!r} is not served")

    endpoint = config.endpoint
    async with RunService(
        execute, max_runs=endpoint.max_runs, max_turns=endpoint.max_turns, validate=validate
    ) as runs:
        app = build_app(
            controls=controls, runs=runs, token=token, endpoint=endpoint, targets=targets
        )
        limits = http_limits(endpoint)
        async with serve_asgi(app, host=endpoint.host, port=endpoint.port, limits=limits) as url:
            targets.add_own(url)
            log.info("daemon.api", url=url, auth=bool(token))
            task_status.started(url)
            await anyio.sleep_forever()
