"""The control API and agent endpoint over real HTTP (uvicorn on 127.0.0.1).

The daemon's engine and the episode executor are seams here; the daemon's own tests
drive the same app with real episodes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest
import structlog
from structlog.testing import capture_logs

from runtime.api import build_app
from runtime.http import serve_asgi
from runtime.messages import RunRequest, RunTurn
from runtime.runs import RunOutcome, RunService

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


class Engine:
    def __init__(self) -> None:
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
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, Script, Engine]]:
    script, engine = Script(), Engine()
    async with RunService(script, max_runs=1, max_turns=20) as runs:
        app = build_app(engine=engine, runs=runs, token=TOKEN)
        async with serve_asgi(app) as url, httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield client, script, engine


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
    response = await client.post("/v1/runs", content=b"{nope", headers=AUTH)
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
    client, _, engine = served
    assert (await client.post("/control/pause", headers=AUTH)).json() == {"paused": True}
    assert engine.paused
    assert (await client.get("/status", headers=AUTH)).json()["paused"] is True
    await client.post("/control/resume", headers=AUTH)
    assert not engine.paused
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
