"""The control API and agent endpoint over real HTTP (uvicorn on 127.0.0.1).

The daemon's controls and the episode executor are seams here; the daemon's own tests
drive the same app with real episodes.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import structlog
from structlog.testing import capture_logs

from runtime.agent_runs import RunOutcome, RunService
from runtime.api import build_app
from runtime.base.config import EndpointConfig
from runtime.base.http import free_port, serve_asgi
from runtime.base.messages import RunRequest, RunTurn
from runtime.guard import RunTargets

pytestmark = pytest.mark.anyio
TOKEN = "s3cret-token-value"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Script:
    """An executor whose runs take turns only when the test releases them."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.started = anyio.Event()
        self.fail = False

    async def __call__(
        self, run_id: str, request: RunRequest, on_turn: Callable[[RunTurn], None]
    ) -> RunOutcome:
        on_turn(RunTurn(index=0, url=request.start_url, thought="look", action="do(...)"))
        self.started.set()
        await self.release.wait()
        if self.fail:
            raise RuntimeError("browser went away")
        on_turn(RunTurn(index=1, url=request.start_url, thought="done", action="exit(...)"))
        return RunOutcome(answer="42", episode_status="exited", reward=1.0, adapter="policy@v1")


class Controls:
    def __init__(self, *, training: bool = True) -> None:
        self.training = training
        self.paused = False
        self.loaded: list[str] = []

    def status(self) -> dict[str, Any]:
        return {"paused": self.paused, "adapter": "policy@v3"}

    def prometheus(self) -> str:
        return "# TYPE webagent_updates_total counter\nwebagent_updates_total 3\n"

    async def pause(self) -> None:
        self.paused = True

    async def resume(self) -> None:
        self.paused = False

    async def load_policy(self, path: str) -> str:
        if not path.startswith("/ok"):
            raise ValueError(f"{path}: no manifest.json")
        self.loaded.append(path)
        return "policy@v4"


async def _final_state(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """Follow the run's event stream to its `end` event (no polling)."""
    async with client.stream("GET", f"/v1/runs/{run_id}/events", headers=AUTH) as stream:
        kind = ""
        async for line in stream.aiter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "end":
                result: dict[str, Any] = json.loads(line[6:])
                return result
    raise AssertionError("stream ended without an end event")


@pytest.fixture
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, Script, Controls]]:
    script, controls = Script(), Controls()
    async with RunService(script, max_runs=1, max_turns=20) as runs:
        app = build_app(controls=controls, runs=runs, token=TOKEN)
        async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client, script, controls


async def test_auth_guards_everything_but_healthz(served: Any) -> None:
    client, _, _ = served
    assert (await client.get("/healthz")).status_code == 200
    for method, path in [
        ("GET", "/status"),
        ("GET", "/metrics"),
        ("POST", "/control/pause"),
        ("POST", "/v1/runs"),
        ("GET", "/v1/runs/x"),
    ]:
        none = await client.request(method, path)
        wrong = await client.request(method, path, headers={"Authorization": "Bearer nope"})
        assert none.status_code == wrong.status_code == 401, path
        assert none.headers["WWW-Authenticate"] == "Bearer"
    assert (await client.get("/status", headers=AUTH)).status_code == 200


async def test_run_lifecycle_and_sse(served: Any) -> None:
    client, script, _ = served
    body = {"intent": "What is the answer?", "start_url": "http://127.0.0.1:1/", "max_turns": 5}
    created = await client.post("/v1/runs", json=body, headers=AUTH)
    assert created.status_code == 202
    run_id = created.json()["run_id"]
    await script.started.wait()

    events: list[tuple[str, dict[str, Any]]] = []
    async with client.stream("GET", f"/v1/runs/{run_id}/events", headers=AUTH) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        kind = ""
        async for line in stream.aiter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[6:])))
                if len(events) == 1:  # the first turn arrived while the run is still going
                    state = (await client.get(f"/v1/runs/{run_id}", headers=AUTH)).json()
                    assert state["status"] == "running"
                    script.release.set()
    assert [k for k, _ in events] == ["turn", "turn", "end"]
    assert events[1][1]["action"] == "exit(...)"
    final = (await client.get(f"/v1/runs/{run_id}", headers=AUTH)).json()
    assert final["status"] == "finished"
    assert final["answer"] == "42" and final["reward"] == 1.0
    assert [t["index"] for t in final["turns"]] == [0, 1]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"intent": "", "start_url": "http://a/"}, "intent"),
        ({"intent": "x", "start_url": "file:///etc/passwd"}, "start_url"),
        ({"intent": "x", "start_url": "http://a/", "max_turns": 0}, "max_turns"),
        ({"intent": "x", "start_url": "http://a/", "max_turns": 21}, "max_turns"),
        ({"intent": "x", "start_url": "http://a/", "colour": "red"}, "colour"),
        ({"start_url": "http://a/"}, ""),
        ([1, 2], ""),
    ],
)
async def test_validation_is_422_naming_field(served: Any, body: Any, field: str) -> None:
    client, _, _ = served
    response = await client.post("/v1/runs", json=body, headers=AUTH)
    assert response.status_code == 422
    assert response.json()["field"] == field
    if field:
        assert field in response.json()["error"]


async def test_not_json_is_400(served: Any) -> None:
    client, _, _ = served
    headers = {**AUTH, "Content-Type": "application/json"}
    response = await client.post("/v1/runs", content=b"{nope", headers=headers)
    assert response.status_code == 400


async def test_full_endpoint_is_429_with_retry_after(served: Any) -> None:
    client, script, _ = served
    body = {"intent": "x", "start_url": "http://a/"}
    assert (await client.post("/v1/runs", json=body, headers=AUTH)).status_code == 202
    full = await client.post("/v1/runs", json=body, headers=AUTH)
    assert full.status_code == 429
    assert int(full.headers["Retry-After"]) >= 1
    script.release.set()


async def test_failed_run_reports_error(served: Any) -> None:
    client, script, _ = served
    script.fail = True
    script.release.set()
    run_id = (
        await client.post("/v1/runs", json={"intent": "x", "start_url": "http://a/"}, headers=AUTH)
    ).json()["run_id"]
    with anyio.fail_after(5):
        state = await _final_state(client, run_id)
    assert state["status"] == "failed"
    assert state["error"] == "browser went away"


async def test_control_routes_reach_engine(served: Any) -> None:
    client, _, controls = served
    assert (await client.post("/control/pause", headers=AUTH)).json() == {"paused": True}
    assert controls.paused
    assert (await client.get("/status", headers=AUTH)).json()["paused"] is True
    await client.post("/control/resume", headers=AUTH)
    assert not controls.paused
    ok = await client.post("/policies/load", json={"path": "/ok/v4"}, headers=AUTH)
    assert ok.json() == {"adapter": "policy@v4"}
    bad = await client.post("/policies/load", json={"path": "/half-written"}, headers=AUTH)
    assert bad.status_code == 422 and "manifest" in bad.json()["error"]
    metrics = (await client.get("/metrics", headers=AUTH)).text
    assert "webagent_updates_total 3" in metrics
    assert 'webagent_runs_total{outcome="accepted"} 0' in metrics


async def test_unknown_run_and_route(served: Any) -> None:
    client, _, _ = served
    assert (await client.get("/v1/runs/nope", headers=AUTH)).status_code == 404
    assert (await client.get("/nope", headers=AUTH)).status_code == 404


async def test_token_never_logged(served: Any) -> None:
    client, script, _ = served
    script.release.set()
    merge = structlog.contextvars.merge_contextvars
    with capture_logs(processors=[merge]) as logs:
        await client.get("/status", headers={"Authorization": f"Bearer {TOKEN}x"})
        await client.post(
            "/v1/runs", json={"intent": TOKEN[:3], "start_url": "http://a/"}, headers=AUTH
        )
        await client.post("/policies/load", json={"path": "/bad"}, headers=AUTH)
    assert logs  # something was logged (the refused policy at least)
    assert TOKEN not in repr(logs)


async def test_shutdown_marks_in_flight_runs_interrupted() -> None:
    script = Script()
    async with RunService(script, max_runs=2, max_turns=20) as runs:
        state = runs.submit(RunRequest(intent="x", start_url="http://a/"))
        await script.started.wait()
    assert runs.get(state.run_id).status == "failed"
    assert runs.get(state.run_id).error == "interrupted"


# ---------------------------------------------------------------- the guard


@pytest.fixture
async def open_api() -> AsyncIterator[tuple[httpx.AsyncClient, str, Script, Controls]]:
    """The token-less default: loopback only, guarded by Host, Origin and Content-Type."""
    script, controls = Script(), Controls()
    async with RunService(script, max_runs=1, max_turns=20) as runs:
        app = build_app(controls=controls, runs=runs, endpoint=EndpointConfig(max_body_bytes=4096))
        async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client, url, script, controls


async def test_a_foreign_host_header_is_refused(open_api: Any) -> None:
    """DNS rebinding: a page on rebind.evil.example that resolves to 127.0.0.1."""
    client, url, _, _ = open_api
    port = url.rsplit(":", 1)[1]
    for path in ("/status", "/healthz"):
        refused = await client.get(path, headers={"Host": f"rebind.evil.example:{port}"})
        assert refused.status_code == 421, path
        assert "rebind.evil.example" in refused.json()["error"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
        assert (await client.get("/status", headers={"Host": host})).status_code == 200, host


async def test_a_cross_origin_text_plain_post_is_refused(open_api: Any) -> None:
    """CSRF: a form or fetch on evil.example posting to the token-less API."""
    client, url, _, controls = open_api
    csrf = await client.post(
        "/control/pause",
        content=b"{}",
        headers={"Content-Type": "text/plain", "Origin": "http://evil.example"},
    )
    assert csrf.status_code == 403 and "evil.example" in csrf.json()["error"]
    assert not controls.paused
    same = await client.post("/control/pause", headers={"Origin": url})
    assert same.status_code == 200 and controls.paused


async def test_only_json_bodies_are_parsed(open_api: Any) -> None:
    client, _, _, controls = open_api
    body = json.dumps({"intent": "x", "start_url": "http://127.0.0.1:9/"}).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        response = await client.post("/v1/runs", content=body, headers=headers)
        assert response.status_code == 415, content_type
    typed = {"Content-Type": "application/json; charset=utf-8"}
    assert (await client.post("/v1/runs", content=body, headers=typed)).status_code == 202
    plain = await client.post(
        "/control/pause", content=b"x", headers={"Content-Type": "text/plain"}
    )
    assert plain.status_code == 415 and not controls.paused


async def test_deep_or_oversized_json_is_a_client_error(open_api: Any) -> None:
    client, _, _, _ = open_api
    json_type = {"Content-Type": "application/json"}
    deep = b"[" * 100_000 + b"]" * 100_000
    big = await client.post("/v1/runs", content=deep, headers=json_type)
    assert big.status_code == 413  # over this fixture's max_body_bytes = 4096
    nested = b"[" * 2000 + b"]" * 2000
    response = await client.post("/policies/load", content=nested, headers=json_type)
    assert response.status_code in (400, 422)
    script, controls = Script(), Controls()
    async with RunService(script, max_runs=1, max_turns=20) as runs:
        app = build_app(controls=controls, runs=runs)
        async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as other:
            response = await other.post("/v1/runs", content=deep, headers=json_type)
            assert response.status_code == 400
            assert "nested too deeply" in response.json()["error"]


async def test_a_run_can_be_cancelled(open_api: Any) -> None:
    client, _, script, _ = open_api
    body = {"intent": "x", "start_url": "http://127.0.0.1:9/"}
    run_id = (await client.post("/v1/runs", json=body)).json()["run_id"]
    await script.started.wait()
    with anyio.fail_after(5):
        cancelled = await client.delete(f"/v1/runs/{run_id}")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    with anyio.fail_after(5):
        assert (await _final_state(client, run_id))["status"] == "cancelled"
    # The slot is free again (max_runs = 1), and the other spelling cancels too.
    script.started = anyio.Event()
    second = (await client.post("/v1/runs", json=body)).json()["run_id"]
    await script.started.wait()
    assert (await client.post(f"/v1/runs/{second}/cancel")).json()["status"] == "cancelled"
    assert (await client.delete("/v1/runs/nope")).status_code == 404
    metrics = (await client.get("/metrics")).text
    assert 'webagent_runs_total{outcome="cancelled"} 2' in metrics


async def test_pause_in_serving_mode_says_it_does_nothing() -> None:
    controls = Controls(training=False)
    async with RunService(Script(), max_runs=1, max_turns=20) as runs:
        app = build_app(controls=controls, runs=runs)
        async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url) as client:
            for route in ("/control/pause", "/control/resume"):
                answer = (await client.post(route)).json()
                assert answer["paused"] is False and answer["training"] is False, route
                assert "training is off" in answer["effect"]
    assert not controls.paused


async def test_policy_load_errors_show_no_working_directory_or_pid(open_api: Any) -> None:
    client, _, _, controls = open_api

    async def refuse(path: str) -> str:
        raise ValueError(
            f"{Path.cwd() / path}: no manifest.json (server pid {os.getpid()}); "
            f"(EngineCore_0 pid=4242) in {os.getpid()}"
        )

    controls.load_policy = refuse
    response = await client.post("/policies/load", json={"path": "adapters/v9"})
    error = response.json()["error"]
    assert response.status_code == 422
    assert (
        error
        == "adapters/v9: no manifest.json (server pid <pid>); (EngineCore_0 pid=<pid>) in <pid>"
    )


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"start_url": "http://127.0.0.1:{api}/status"}, "start_url", "own API"),
        ({"start_url": "http://localhost:{policy}/v1/models"}, "start_url", "policy server"),
        ({"start_url": "http://0.0.0.0:8080/"}, "start_url", "unspecified"),
        ({"start_url": "http://[::]:8080/"}, "start_url", "unspecified"),
        ({"start_url": "http://[::1/"}, "start_url", "not a URL"),
        ({"start_url": "http://127.0.0.1:99999/"}, "start_url", "not a URL"),
        ({"start_url": "http://localhost:{site}/"}, "start_url", "127.0.0.1:"),
        ({"sites": ["127.0.0.1"]}, "sites[0]", "names no port"),
        ({"sites": ["127.0.0.1:99999"]}, "sites[0]", "bad port"),
        ({"sites": ["http://127.1:{api}"]}, "sites[0]", "own API"),
        ({"intent": "word " * 50}, "intent", "tokens"),
        ({"evaluation": {"eval_types": ["vibes"]}}, "evaluation.eval_types[0]", "vibes"),
    ],
)
async def test_runs_that_can_never_run_are_422_up_front(
    change: dict[str, Any], field: str, words: str
) -> None:
    script = Script()
    policy, site = free_port(), free_port()
    async with RunService(script, max_runs=1, max_turns=20) as runs:
        targets = RunTargets(
            own=[f"http://127.0.0.1:{policy}"],
            site_urls=[f"http://127.0.0.1:{site}"],
            count_tokens=lambda text: len(text.split()),
            max_intent_tokens=20,
        )
        app = build_app(controls=Controls(), runs=runs, targets=targets)
        async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url) as client:
            targets.add_own(url)
            ports = {"api": url.rsplit(":", 1)[1], "policy": str(policy), "site": str(site)}
            body: dict[str, Any] = {"intent": "x", "start_url": f"http://127.0.0.1:{site}/"}
            for key, value in change.items():
                body[key] = _fill(value, ports)
            response = await client.post("/v1/runs", json=body)
            assert response.status_code == 422, response.text
            assert response.json()["field"] == field
            assert words in response.json()["error"]
            assert not script.started.is_set()
            ok = {"intent": "x", "start_url": f"HTTP://127.0.0.1:{site}/", "sites": ["h:81"]}
            assert (await client.post("/v1/runs", json=ok)).status_code == 202


def _fill(value: Any, ports: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**ports) if "{" in value else value
    if isinstance(value, list):
        return [_fill(v, ports) for v in value]
    return value
