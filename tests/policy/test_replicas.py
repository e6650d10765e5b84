"""ReplicaSet against in-memory vLLM servers (one httpx MockTransport handler per replica
URL): least-loaded routing, adapters loaded and verified on every replica, replicas taken
out and brought back, and the adapter manager and `VLLMPolicy` on top of a set."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
import structlog.testing
from anyio.abc import TaskGroup

from policy.adapters import MANIFEST_FILE, WEIGHTS_FILE, AdapterManager
from policy.client import CompletionClient, VLLMPolicy
from policy.errors import AdapterSwapError, BadRequestError, ServerUnavailableError
from policy.prompt import PromptRenderer
from policy.replicas import Placement, ReplicaSet
from runtime.base.config import PolicyConfig
from runtime.base.messages import AdapterManifest, ChatMessage, PolicyRequest, TaskConfig
from runtime.replica_actors import ActorPlacement, read_adapter_files, write_adapter_files

pytestmark = pytest.mark.anyio

BASE = "/models/tiny"


class _Server:
    """One vLLM server's routes in memory. `refusing`: every request is a refused
    connection; `fail_loads`, `fail_unloads`: those answer 500; `refuse_loads`: loads
    answer 400;
    `hidden`: loaded but (wrongly) not listed; `holds`: a completion whose prompt starts
    with a key waits for that event; `load_gate`: loads wait for it."""

    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}
        self.hidden: set[str] = set()
        self.refusing = False
        self.fail_loads = False
        self.refuse_loads = False
        self.fail_unloads = False
        self.holds: dict[int, anyio.Event] = {}
        self.load_gate: anyio.Event | None = None
        self.calls: list[str] = []
        self.served: list[tuple[int, str]] = []  # (first prompt id, model) of each completion

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.calls.append(
            {
                "/health": "health",
                "/v1/models": "models",
                "/v1/load_lora_adapter": f"load {body.get('lora_name')}",
                "/v1/unload_lora_adapter": f"unload {body.get('lora_name')}",
                "/v1/completions": f"complete {body.get('model')}",
            }[path]
        )
        if self.refusing:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/models":
            names = [n for n in self.loaded if n not in self.hidden]
            data = [{"id": BASE, "parent": None}] + [{"id": n, "parent": BASE} for n in names]
            return httpx.Response(200, json={"data": data})
        if path == "/v1/load_lora_adapter":
            if self.load_gate is not None:
                await self.load_gate.wait()
            if self.fail_loads:
                return httpx.Response(500, json={"error": {"message": "engine busy"}})
            if self.refuse_loads:
                return httpx.Response(400, json={"error": {"message": "no such path"}})
            self.loaded[body["lora_name"]] = body["lora_path"]
            return httpx.Response(200, text="Success")
        if path == "/v1/unload_lora_adapter":
            if self.fail_unloads:
                return httpx.Response(500, json={"error": {"message": "engine busy"}})
            if self.loaded.pop(body["lora_name"], None) is None:
                return httpx.Response(404, json={"error": {"message": "not found"}})
            return httpx.Response(200, text="Success")
        model, prompt = body["model"], body["prompt"]
        if model != BASE and model not in self.loaded:
            message = f"The model `{model}` does not exist."
            return httpx.Response(404, json={"error": {"message": message}})
        if prompt[0] in self.holds:
            await self.holds[prompt[0]].wait()
        self.served.append((prompt[0], model))
        choice = {
            "text": "x",
            "token_ids": [7],
            "prompt_token_ids": prompt,
            "logprobs": {"token_logprobs": [-0.1]},
            "finish_reason": "length",
        }
        return httpx.Response(200, json={"model": model, "choices": [choice]})


def _replica_set(
    *hosts: str, probe_interval_s: float = 2.0, placements: Sequence[Placement | None] = ()
) -> tuple[ReplicaSet, list[_Server]]:
    servers = {host: _Server() for host in hosts}

    async def route(request: httpx.Request) -> httpx.Response:
        return await servers[request.url.host](request)

    http = httpx.AsyncClient(transport=httpx.MockTransport(route))
    clients = [
        CompletionClient(http, f"http://{host}", max_retries=1, backoff_s=0.0) for host in hosts
    ]
    replicas = ReplicaSet(clients, placements=placements, probe_interval_s=probe_interval_s)
    return replicas, list(servers.values())


def _adapter(root: Path, version: int) -> Path:
    folder = root / f"v{version}"
    folder.mkdir(parents=True)
    weights = f"weights of v{version}".encode()
    (folder / WEIGHTS_FILE).write_bytes(weights)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}))
    manifest = AdapterManifest(
        name=f"policy@v{version}",
        version=version,
        base_model="tiny",
        base_fingerprint="f" * 64,
        weights_sha256=hashlib.sha256(weights).hexdigest(),
    )
    (folder / MANIFEST_FILE).write_bytes(msgspec.json.encode(manifest))
    return folder


async def _ask(replicas: ReplicaSet, first: int, model: str = BASE) -> None:
    completion = await replicas.complete([first, 1, 2], model=model)
    assert completion.prompt_token_ids == [first, 1, 2]


async def _in_flight(tg: TaskGroup, replicas: ReplicaSet, first: int) -> None:
    """Start a request and return once it has reached its server (and waits there)."""
    tg.start_soon(_ask, replicas, first)
    await anyio.wait_all_tasks_blocked()


def _firsts(server: _Server) -> list[int]:
    return [first for first, _ in server.served]


# ------------------------------------------------------------------ routing


async def test_requests_go_to_the_least_loaded_replica_ties_in_turn() -> None:
    replicas, (a, b) = _replica_set("a.test", "b.test")
    for first in range(4):  # all idle: in turn
        await _ask(replicas, first)
    assert (_firsts(a), _firsts(b)) == ([0, 2], [1, 3])

    gates = {first: anyio.Event() for first in (10, 11, 12, 13, 14)}
    a.holds = b.holds = gates
    async with anyio.create_task_group() as tg:
        await _in_flight(tg, replicas, 10)  # -> a (its turn)
        await _in_flight(tg, replicas, 11)  # -> b (a is busy)
        gates[11].set()
        await anyio.wait_all_tasks_blocked()  # b is idle again, a still holds 10
        await _in_flight(tg, replicas, 12)  # -> b: the least loaded, though a's turn
        await _in_flight(tg, replicas, 13)  # -> a: 1 each, a's turn
        await _in_flight(tg, replicas, 14)  # -> b: 2 on a, 1 on b
        stats = {s.url: s for s in replicas.statistics()}
        assert (stats["http://a.test"].in_flight, stats["http://b.test"].in_flight) == (2, 2)
        for gate in gates.values():
            gate.set()
    assert sorted(_firsts(a)) == [0, 2, 10, 13]
    assert sorted(_firsts(b)) == [1, 3, 11, 12, 14]
    assert [(s.in_flight, s.completed, s.failures) for s in replicas.statistics()] == [
        (0, 4, 0),
        (0, 5, 0),
    ]


async def test_an_adapter_goes_only_to_replicas_that_have_it() -> None:
    replicas, (a, b) = _replica_set("a.test", "b.test")
    b.load_gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(replicas.load_adapter, "policy@v1", "/adapters/v1")
        await anyio.wait_all_tasks_blocked()  # a has v1; b is still loading it
        for first in (1, 2):
            await _ask(replicas, first, "policy@v1")
        await _ask(replicas, 3)  # the base model: any replica (b's turn)
        b.load_gate.set()
    for first in (4, 5):
        await _ask(replicas, first, "policy@v1")
    assert (a.served, b.served) == (
        [(1, "policy@v1"), (2, "policy@v1"), (4, "policy@v1")],
        [(3, BASE), (5, "policy@v1")],
    )


# ------------------------------------------------------------------ adapters


async def test_adapters_are_loaded_and_verified_on_every_replica(tmp_path: Path) -> None:
    replicas, servers = _replica_set("a.test", "b.test")
    async with AdapterManager(replicas, staleness_window=0) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        await manager.publish(_adapter(tmp_path, 1))
        for server in servers:
            assert list(server.loaded) == ["policy@v1"]
            # Each load and unload is checked against this replica's own /v1/models.
            assert server.calls == [
                "load policy@v0",
                "models",
                "load policy@v1",
                "models",
                "unload policy@v0",
                "models",
            ]
        await _ask(replicas, 1, "policy@v1")
        await _ask(replicas, 2, "policy@v1")
        assert [s.served for s in servers] == [[(1, "policy@v1")], [(2, "policy@v1")]]


async def test_a_swap_is_refused_when_one_replica_does_not_list_the_version(
    tmp_path: Path,
) -> None:
    replicas, (_, b) = _replica_set("a.test", "b.test")
    b.hidden.add("policy@v1")  # loaded, but b does not serve it
    async with AdapterManager(replicas) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        with pytest.raises(
            AdapterSwapError,
            match=r"replica http://b\.test lists \['policy@v0'\] .* should list "
            r"\['policy@v0', 'policy@v1'\]",
        ):
            await manager.publish(_adapter(tmp_path, 1))
        assert manager.current is not None and manager.current.name == "policy@v0"


async def test_a_load_one_replica_refuses_is_undone_on_the_others(tmp_path: Path) -> None:
    replicas, (a, b) = _replica_set("a.test", "b.test")
    async with AdapterManager(replicas) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        b.refuse_loads = True
        v1 = _adapter(tmp_path, 1)
        with pytest.raises(BadRequestError, match="no such path"):
            await manager.publish(v1)
        assert a.calls[-2:] == ["load policy@v1", "unload policy@v1"]
        assert list(a.loaded) == list(b.loaded) == ["policy@v0"]
        assert manager.current is not None and manager.current.name == "policy@v0"
        b.refuse_loads = False
        await manager.publish(v1)  # both still live, both agree
        assert list(a.loaded) == list(b.loaded) == ["policy@v0", "policy@v1"]


async def test_a_replica_that_fails_an_unload_is_out_until_it_drops_the_version(
    tmp_path: Path,
) -> None:
    replicas, (a, b) = _replica_set("a.test", "b.test")
    async with AdapterManager(replicas, staleness_window=0) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        b.fail_unloads = True
        swap = await manager.publish(_adapter(tmp_path, 1))  # verified on a, the live one
        assert swap.unloaded == ["policy@v0"]
        assert (list(a.loaded), sorted(b.loaded)) == (["policy@v1"], ["policy@v0", "policy@v1"])
        assert "could not unload policy@v0" in replicas.statistics()[1].reason
        assert await replicas.probe() == []  # it still cannot
        b.fail_unloads = False
        assert await replicas.probe() == ["http://b.test"]
        assert list(b.loaded) == ["policy@v1"]


# ------------------------------------------------------------------ failures


async def test_a_replica_that_refuses_connections_is_taken_out() -> None:
    replicas, (a, b) = _replica_set("a.test", "b.test")
    a.refusing = True
    with structlog.testing.capture_logs() as logs:
        for first in range(3):
            await _ask(replicas, first)  # no error surfaces
    assert a.calls == ["complete /models/tiny"] * 2  # its own try and retry, then out
    assert _firsts(b) == [0, 1, 2]
    stats = replicas.statistics()
    assert [(s.live, s.completed, s.failures) for s in stats] == [(False, 0, 1), (True, 3, 0)]
    assert "Connection refused" in stats[0].reason
    down = [e for e in logs if e["event"] == "replica.down"]
    assert [(e["url"], e["live"]) for e in down] == [("http://a.test", 1)]
    assert await replicas.health()


async def test_with_every_replica_down_the_error_says_so() -> None:
    replicas, servers = _replica_set("a.test", "b.test")
    for server in servers:
        server.refusing = True
    with pytest.raises(
        ServerUnavailableError,
        match=r"no live policy replica .*0 of 2 live; down: http://a\.test: .*refused; "
        r"http://b\.test: .*refused",
    ):
        await _ask(replicas, 1)
    assert not await replicas.health()
    with pytest.raises(ServerUnavailableError, match="no live policy replica"):
        await replicas.models()


async def test_a_replica_that_lost_its_adapters_is_taken_out_and_restored(
    tmp_path: Path,
) -> None:
    replicas, (a, b) = _replica_set("a.test", "b.test")
    async with AdapterManager(replicas) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        a.loaded.clear()  # a restarted between two health probes
        await _ask(replicas, 1, "policy@v0")  # a answers 404: out; b serves it
        assert b.served == [(1, "policy@v0")]
        assert "lost policy@v0" in replicas.statistics()[0].reason
        assert await replicas.probe() == ["http://a.test"]
        assert list(a.loaded) == ["policy@v0"]


async def test_a_replica_rejoins_only_after_the_resident_adapters_are_loaded(
    tmp_path: Path,
) -> None:
    replicas, (a, b) = _replica_set("a.test", "b.test")
    async with AdapterManager(replicas, staleness_window=1) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        await manager.publish(_adapter(tmp_path, 1))
        a.refusing = True
        await _ask(replicas, 1, "policy@v1")
        # While a is out: v2 is published and v0 unloaded, on b only.
        await manager.publish(_adapter(tmp_path, 2))
        assert sorted(b.loaded) == ["policy@v1", "policy@v2"]
        assert sorted(a.loaded) == ["policy@v0", "policy@v1"]
        assert await replicas.probe() == []  # /health refused

        a.refusing = False
        a.fail_loads = True
        a.calls.clear()
        assert await replicas.probe() == []  # v2 does not load: a stays out
        assert a.calls[:4] == ["health", "models", "unload policy@v0", "load policy@v2"]
        assert "rejoin failed" in replicas.statistics()[0].reason
        for first in (2, 3):
            await _ask(replicas, first, "policy@v2")
        assert not a.served and _firsts(b) == [1, 2, 3]

        a.fail_loads = False
        a.calls.clear()
        assert await replicas.probe() == ["http://a.test"]
        assert a.calls == ["health", "models", "load policy@v2", "models"]
        assert sorted(a.loaded) == ["policy@v1", "policy@v2"]
        for first in (4, 5):
            await _ask(replicas, first, "policy@v2")
        assert (a.served, _firsts(b)) == ([(4, "policy@v2")], [1, 2, 3, 5])
        await manager.publish(_adapter(tmp_path, 3))  # verified on both again
        assert sorted(a.loaded) == sorted(b.loaded) == ["policy@v2", "policy@v3"]


async def test_a_replica_that_restarted_between_calls_is_restored_by_the_next_probe(
    tmp_path: Path,
) -> None:
    """A replica that restarts quietly (nothing sent to it meanwhile) answers /health but
    has lost its adapters: the probe takes it out and loads them back before it serves."""
    replicas, (a, b) = _replica_set("a.test", "b.test")
    async with AdapterManager(replicas, staleness_window=1) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        assert await replicas.probe() == []  # both hold v0: nothing to do
        assert [s.live for s in replicas.statistics()] == [True, True]
        b.loaded.clear()  # the restart
        a.calls.clear()
        assert await replicas.probe() == ["http://b.test"]
        assert sorted(b.loaded) == ["policy@v0"]
        assert a.calls == ["models"]  # a was only checked
        for first in (1, 2):
            await _ask(replicas, first, "policy@v0")
        assert (a.served, b.served) == ([(1, "policy@v0")], [(2, "policy@v0")])


class _Lost(Exception):
    """Stands for Ray's RayActorError."""


class _Method:
    def __init__(self, run: Any) -> None:
        self._run = run

    def remote(self, *args: Any) -> Any:
        return self._run(*args)  # a coroutine: awaited as Ray's ObjectRef would be


class _NodeActor:
    """A `VLLMReplica` actor handle at its seam: `put_adapter` and `remove_adapter` write
    and delete on its "node" (a folder of its own), as the actor's methods do."""

    def __init__(self, node: Path) -> None:
        self.node = node
        self.dead = False
        self.put_adapter = _Method(self._put)
        self.remove_adapter = _Method(self._remove)

    async def _put(self, name: str, files: dict[str, bytes]) -> str:
        if self.dead:
            raise _Lost("The actor died unexpectedly before finishing this task.")
        return str(write_adapter_files(self.node, name, files))

    async def _remove(self, name: str) -> None:
        if self.dead:
            raise _Lost("dead")
        for file in (self.node / name).iterdir():
            file.unlink()
        (self.node / name).rmdir()


async def test_a_replica_with_a_placement_loads_the_files_it_was_sent(tmp_path: Path) -> None:
    """Replica b shares no file system: each version's files go to its node first, and it
    loads them from there; unloading deletes them; a placement that cannot reach its
    actor takes the replica out, and the rejoin sends the resident versions again."""
    actor = _NodeActor(tmp_path / "node-b")
    placement = ActorPlacement(actor, lost_errors=(_Lost,))
    replicas, (a, b) = _replica_set("a.test", "b.test", placements=[None, placement])
    learner = tmp_path / "learner"
    async with AdapterManager(replicas, staleness_window=1) as manager:
        v0 = _adapter(learner, 0)
        await manager.publish(v0)
        assert a.loaded == {"policy@v0": str(v0)}
        assert b.loaded == {"policy@v0": str(actor.node / "policy@v0")}
        assert read_adapter_files(actor.node / "policy@v0") == read_adapter_files(v0)
        await manager.publish(_adapter(learner, 1))
        await manager.publish(_adapter(learner, 2))  # v0 is unloaded: its copy goes too
        assert sorted(p.name for p in actor.node.iterdir()) == ["policy@v1", "policy@v2"]

        actor.dead = True
        await manager.publish(_adapter(learner, 3))  # b cannot be sent v3: it is taken out
        assert "replica actor unreachable" in replicas.statistics()[1].reason
        assert sorted(a.loaded) == ["policy@v2", "policy@v3"]
        actor.dead = False
        b.loaded.clear()  # and its vLLM restarted meanwhile
        assert await replicas.probe() == ["http://b.test"]
        assert sorted(b.loaded) == ["policy@v2", "policy@v3"]
        assert b.loaded["policy@v3"] == str(actor.node / "policy@v3")
        await _ask(replicas, 1, "policy@v3")
        await _ask(replicas, 2, "policy@v3")
        assert _firsts(a) + _firsts(b) in ([1, 2], [2, 1])


def test_adapter_files_are_written_whole_or_not_at_all(tmp_path: Path) -> None:
    files = {"adapter_config.json": b"{}", "adapter_model.safetensors": b"w" * 100}
    folder = write_adapter_files(tmp_path, "policy@v1", files)
    assert read_adapter_files(folder) == files
    replaced = write_adapter_files(tmp_path, "policy@v1", {"adapter_config.json": b"[]"})
    assert read_adapter_files(replaced) == {"adapter_config.json": b"[]"}
    for name in ("../up", "a/b", "", ".."):
        with pytest.raises(ValueError, match="not a usable adapter name"):
            write_adapter_files(tmp_path, name, files)
    with pytest.raises(ValueError, match="not a usable file name"):
        write_adapter_files(tmp_path, "policy@v2", {"../../etc/x": b""})
    with pytest.raises(TypeError):  # a file that cannot be written: nothing is left
        write_adapter_files(tmp_path, "policy@v3", {"a": b"x", "b": 3})  # type: ignore[dict-item]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy@v1"]


async def test_watch_brings_a_replica_back_once_it_answers() -> None:
    replicas, (a, _) = _replica_set("a.test", "b.test", probe_interval_s=0.01)
    a.refusing = True
    await _ask(replicas, 1)
    async with anyio.create_task_group() as tg:
        await tg.start(replicas.watch)
        with anyio.fail_after(5):
            while a.calls.count("health") < 2:  # noqa: ASYNC110 - the watch's own period
                await anyio.sleep(0.01)
            assert not replicas.statistics()[0].live
            a.refusing = False
            while not replicas.statistics()[0].live:  # noqa: ASYNC110 - as above
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()


def test_from_config_takes_the_request_and_health_settings() -> None:
    config = PolicyConfig(request_timeout_s=30.0, max_retries=5, health_interval_s=3.0)
    replicas = ReplicaSet.from_config(httpx.AsyncClient(), ["http://a:8000/", "http://b"], config)
    assert [s.url for s in replicas.statistics()] == ["http://a:8000", "http://b"]
    assert (replicas.probe_interval_s, replicas.health_timeout_s) == (3.0, 5.0)
    with pytest.raises(ValueError, match="repeat"):
        ReplicaSet.from_config(httpx.AsyncClient(), ["http://a", "http://a/"], config)
    with pytest.raises(ValueError, match="at least one"):
        ReplicaSet([])


# ------------------------------------------------------------------ end to end


async def test_policy_and_manager_on_a_replica_set_publish_two_versions(
    tmp_path: Path, tiny_model: Path
) -> None:
    replicas, servers = _replica_set("a.test", "b.test")
    async with AdapterManager(replicas, staleness_window=0) as manager:
        policy = VLLMPolicy(replicas, PromptRenderer.from_model(tiny_model), manager)
        task = TaskConfig(task_id=1, intent="t", start_url="http://x/")
        request = PolicyRequest(
            episode_id="e", turn=0, task=task, messages=[ChatMessage(role="user", content="hi")]
        )
        for version in (0, 1):
            await manager.publish(_adapter(tmp_path, version))
            for server in servers:
                assert list(server.loaded) == [f"policy@v{version}"]
            replies = [await policy.act(request) for _ in range(4)]
            assert {(r.adapter, r.adapter_version) for r in replies} == {
                (f"policy@v{version}", version)
            }
            assert all(r.completion_token_ids == [7] for r in replies)
            for server in servers:
                models = [model for _, model in server.served]
                assert models.count(f"policy@v{version}") == 2
    assert policy.statistics().completed == 8
