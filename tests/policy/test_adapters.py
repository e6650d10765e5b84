"""Adapter manifests and the manager's bookkeeping, against vLLM's adapter API as an
httpx MockTransport seam (the same manager runs against the real server in
test_vllm_server.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
import structlog.testing

from policy.adapters import (
    MANIFEST_FILE,
    WEIGHTS_FILE,
    AdapterManager,
    publish_new_folders,
    read_manifest,
    weights_sha256,
)
from policy.client import CompletionClient, SamplingParams, VLLMPolicy
from policy.errors import AdapterError, AdapterManifestError, AdapterSwapError
from policy.prompt import PromptRenderer
from runtime.base.messages import (
    AdapterManifest,
    AdapterSwapped,
    ChatMessage,
    Event,
    PolicyRequest,
    TaskConfig,
)


def _adapter(root: Path, version: int, *, weights: bytes = b"", manifest: bool = True) -> Path:
    folder = root / f"v{version}"
    folder.mkdir(parents=True)
    data = weights or f"weights of v{version}".encode()
    (folder / WEIGHTS_FILE).write_bytes(data)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}))
    if manifest:
        entry = AdapterManifest(
            name=f"policy@v{version}",
            version=version,
            base_model="tiny",
            base_fingerprint="f" * 64,
            weights_sha256=hashlib.sha256(data).hexdigest(),
        )
        (folder / MANIFEST_FILE).write_bytes(msgspec.json.encode(entry))
    return folder


class _FakeAdapterApi:
    """vLLM's adapter routes, in memory: load, unload, and the /v1/models listing."""

    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}
        self.hidden: set[str] = set()  # loaded but (wrongly) not listed
        self.fail_unloads = False
        self.calls: list[str] = []
        self.temperatures: list[float] = []  # of each completion request

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        if path == "/v1/models":
            names = ["/models/tiny", *(n for n in self.loaded if n not in self.hidden)]
            return httpx.Response(200, json={"data": [{"id": n} for n in names]})
        if path == "/v1/load_lora_adapter":
            self.calls.append(f"load {body['lora_name']}")
            if body["lora_name"] in self.loaded:
                return httpx.Response(400, json={"error": {"message": "already loaded"}})
            self.loaded[body["lora_name"]] = body["lora_path"]
            return httpx.Response(200, text="Success")
        if path == "/v1/completions":
            self.temperatures.append(body["temperature"])
            if body["model"] not in self.loaded:
                message = f"The model `{body['model']}` does not exist."
                return httpx.Response(404, json={"error": {"message": message}})
            choice = {
                "text": "x",
                "token_ids": [7],
                "prompt_token_ids": body["prompt"],
                "logprobs": {"token_logprobs": [-0.1]},
                "finish_reason": "length",
            }
            return httpx.Response(200, json={"model": body["model"], "choices": [choice]})
        if path == "/v1/unload_lora_adapter":
            self.calls.append(f"unload {body['lora_name']}")
            if self.fail_unloads:
                return httpx.Response(500, json={"error": {"message": "engine busy"}})
            if self.loaded.pop(body["lora_name"], None) is None:
                return httpx.Response(404, json={"error": {"message": "not found"}})
            return httpx.Response(200, text="Success")
        return httpx.Response(404)


def _manager(
    api: _FakeAdapterApi, window: int = 1, on_event: Callable[[Event], None] | None = None
) -> AdapterManager:
    http = httpx.AsyncClient(transport=httpx.MockTransport(api))
    client = CompletionClient(http, "http://vllm.test", max_retries=0)
    return AdapterManager(client, staleness_window=window, on_event=on_event)


# ------------------------------------------------------------------ manifests


def test_manifest_verified_against_weights(tmp_path: Path) -> None:
    folder = _adapter(tmp_path, 3)
    manifest = read_manifest(folder)
    assert manifest.version == 3
    assert manifest.weights_sha256 == weights_sha256(folder)


def test_missing_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AdapterManifestError, match=r"no manifest\.json"):
        read_manifest(_adapter(tmp_path, 1, manifest=False))


def test_changed_weights_are_refused(tmp_path: Path) -> None:
    folder = _adapter(tmp_path, 1)
    (folder / WEIGHTS_FILE).write_bytes(b"half-written")
    with pytest.raises(AdapterManifestError, match="sha256"):
        read_manifest(folder)


def test_bad_manifest_names_the_problem(tmp_path: Path) -> None:
    folder = _adapter(tmp_path, 1)
    good = (folder / MANIFEST_FILE).read_bytes()
    (folder / MANIFEST_FILE).write_text('{"name": "x", "version": "one"}')
    with pytest.raises(AdapterManifestError, match=r"unreadable manifest .*version"):
        read_manifest(folder)
    (folder / MANIFEST_FILE).write_bytes(good)
    (folder / WEIGHTS_FILE).unlink()
    with pytest.raises(AdapterManifestError, match=r"cannot read adapter_model\.safetensors"):
        read_manifest(folder)


# ------------------------------------------------------------------ the manager


@pytest.mark.anyio
async def test_publish_routes_and_unloads_outside_the_window(tmp_path: Path) -> None:
    api = _FakeAdapterApi()
    events: list[Event] = []
    async with _manager(api, window=1, on_event=events.append) as manager:
        with pytest.raises(AdapterError, match="publish v0"), manager.lease():
            pass
        first = await manager.publish(_adapter(tmp_path, 0))
        assert (first.name, first.previous) == ("policy@v0", "")
        with manager.lease() as lease:
            assert (lease.name, lease.version) == ("policy@v0", 0)
        await manager.publish(_adapter(tmp_path, 1))
        assert sorted(api.loaded) == ["policy@v0", "policy@v1"]  # v0 is inside the window
        swap = await manager.publish(_adapter(tmp_path, 2))
        assert swap.previous == "policy@v1"
        assert swap.unloaded == ["policy@v0"]
        assert sorted(api.loaded) == ["policy@v1", "policy@v2"]
        stats = manager.statistics()
        assert stats.current == "policy@v2"
        assert stats.resident == ["policy@v1", "policy@v2"]
        assert stats.swaps == 3
        assert stats.swap_latency_max_s >= stats.swap_latency_median_s > 0
    assert [(e.name, e.previous) for e in events if isinstance(e, AdapterSwapped)] == [
        ("policy@v0", ""),
        ("policy@v1", "policy@v0"),
        ("policy@v2", "policy@v1"),
    ]


@pytest.mark.anyio
async def test_a_leased_version_is_unloaded_only_after_its_last_lease(tmp_path: Path) -> None:
    api = _FakeAdapterApi()
    async with _manager(api, window=0) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        with manager.lease() as held:
            await manager.publish(_adapter(tmp_path, 1))
            with manager.lease() as newer:
                assert newer.name == "policy@v1"
            assert "policy@v0" in api.loaded
            assert manager.statistics().in_flight == {"policy@v0": 1, "policy@v1": 0}
            assert manager.statistics().unloads_pending == ["policy@v0"]
            assert held.name == "policy@v0"
        with anyio.fail_after(5):
            await manager.wait_unloaded()
        assert sorted(api.loaded) == ["policy@v1"]
        assert api.calls == ["load policy@v0", "load policy@v1", "unload policy@v0"]


@pytest.mark.anyio
async def test_refuses_old_versions_and_half_written_adapters(tmp_path: Path) -> None:
    api = _FakeAdapterApi()
    async with _manager(api) as manager:
        await manager.publish(_adapter(tmp_path, 2))
        with pytest.raises(AdapterError, match="not newer"):
            await manager.publish(_adapter(tmp_path, 1))
        with pytest.raises(AdapterManifestError):
            await manager.publish(_adapter(tmp_path, 3, manifest=False))
        assert list(api.loaded) == ["policy@v2"]
        assert manager.current is not None and manager.current.version == 2


@pytest.mark.anyio
async def test_a_server_that_does_not_list_the_adapter_fails_the_swap(tmp_path: Path) -> None:
    api = _FakeAdapterApi()
    api.hidden.add("policy@v0")
    async with _manager(api) as manager:
        with pytest.raises(AdapterSwapError, match=r"lists \[\] but should list \['policy@v0'\]"):
            await manager.publish(_adapter(tmp_path, 0))
        assert manager.current is None  # never routed to it


@pytest.mark.anyio
async def test_restore_reloads_after_a_server_restart(tmp_path: Path) -> None:
    api = _FakeAdapterApi()
    async with _manager(api) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        await manager.publish(_adapter(tmp_path, 1))
        api.loaded.clear()  # what a restarted server knows
        assert sorted(await manager.restore()) == ["policy@v0", "policy@v1"]
        assert sorted(api.loaded) == ["policy@v0", "policy@v1"]
        assert await manager.unload_all() == ["policy@v0", "policy@v1"]
        assert api.loaded == {}


@pytest.mark.anyio
async def test_a_failed_unload_is_retried_by_the_next_publish(tmp_path: Path) -> None:
    api = _FakeAdapterApi()
    api.fail_unloads = True
    async with _manager(api, window=0) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        with manager.lease():
            await manager.publish(_adapter(tmp_path, 1))
        # The janitor's unload of v0 got a 500; it logs and keeps v0 as resident.
        await anyio.wait_all_tasks_blocked()
        assert manager.statistics().resident == ["policy@v0", "policy@v1"]
        api.fail_unloads = False
        swap = await manager.publish(_adapter(tmp_path, 2))
        assert swap.unloaded == ["policy@v0", "policy@v1"]
        assert sorted(api.loaded) == ["policy@v2"]


@pytest.mark.anyio
async def test_policy_reloads_adapters_a_restarted_server_lost(
    tmp_path: Path, tiny_model: Path
) -> None:
    api = _FakeAdapterApi()
    async with _manager(api) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        policy = VLLMPolicy(manager._server, PromptRenderer.from_model(tiny_model), manager)  # type: ignore[arg-type]
        task = TaskConfig(task_id=1, intent="t", start_url="http://x/")
        request = PolicyRequest(
            episode_id="e", turn=0, task=task, messages=[ChatMessage(role="user", content="hi")]
        )
        api.loaded.clear()  # the server restarted
        reply = await policy.act(request)
        assert reply.adapter == "policy@v0"
        assert reply.completion_token_ids == [7]
        assert list(api.loaded) == ["policy@v0"]
        assert api.calls == ["load policy@v0", "load policy@v0"]


@pytest.mark.anyio
async def test_with_sampling_changes_only_the_sampling(tmp_path: Path, tiny_model: Path) -> None:
    api = _FakeAdapterApi()
    async with _manager(api) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        sampled = VLLMPolicy(
            manager._server,  # type: ignore[arg-type]
            PromptRenderer.from_model(tiny_model),
            manager,
            sampling=SamplingParams(temperature=1.0, max_tokens=8),
            max_concurrency=3,
        )
        greedy = sampled.with_sampling(SamplingParams(temperature=0.0, max_tokens=8))
        task = TaskConfig(task_id=1, intent="t", start_url="http://x/")
        request = PolicyRequest(
            episode_id="e", turn=0, task=task, messages=[ChatMessage(role="user", content="hi")]
        )
        await greedy.act(request)
        await sampled.act(request)
        assert api.temperatures == [0.0, 1.0]
        assert sampled.sampling.temperature == 1.0
        assert (greedy.statistics().completed, sampled.statistics().completed) == (1, 1)
        async with greedy._limiter:  # one set of concurrency slots for both
            assert sampled.statistics().in_flight == 1


@pytest.mark.anyio
async def test_a_pinned_policy_stays_on_its_leased_version(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The daemon's evaluation: one version for all its turns while newer ones publish."""
    api = _FakeAdapterApi()
    async with _manager(api, window=0) as manager:
        await manager.publish(_adapter(tmp_path, 0))
        policy = VLLMPolicy(manager._server, PromptRenderer.from_model(tiny_model), manager)  # type: ignore[arg-type]
        task = TaskConfig(task_id=1, intent="t", start_url="http://x/")
        request = PolicyRequest(
            episode_id="e", turn=0, task=task, messages=[ChatMessage(role="user", content="hi")]
        )
        with manager.lease() as held:
            pinned = policy.pinned(held.name)
            await manager.publish(_adapter(tmp_path, 1))
            await manager.publish(_adapter(tmp_path, 2))
            assert (await pinned.act(request)).adapter == "policy@v0"  # kept by the lease
            assert (await policy.act(request)).adapter == "policy@v2"
            named = msgspec.structs.replace(request, adapter="policy@v2")
            assert (await pinned.act(named)).adapter == "policy@v2"  # the request's own wins
        with anyio.fail_after(5):
            await manager.wait_unloaded()
        with pytest.raises(AdapterError, match="policy@v0"):
            await pinned.act(request)  # released: gone, and said so


@pytest.mark.anyio
async def test_hot_reload_publishes_each_new_folder_and_refuses_a_bad_one(
    tmp_path: Path,
) -> None:
    """`daemon.watch_adapters`: a folder whose manifest appears is served (the file
    watcher is real), written in place or moved in whole; one whose weights do not match
    its manifest is refused and logged, and the watch goes on to the next."""
    api = _FakeAdapterApi()
    watched = tmp_path / "incoming"

    def refused(logs: list[dict[str, Any]], folder: Path) -> list[dict[str, Any]]:
        return [
            e
            for e in logs
            if e["event"] == "daemon.hot_reload_refused" and e["path"] == str(folder)
        ]

    async with _manager(api, window=2) as manager, anyio.create_task_group() as tg:

        async def served(version: int) -> None:
            with anyio.fail_after(20):
                while manager.current is None or manager.current.version != version:  # noqa: ASYNC110 - polled as /status would
                    await anyio.sleep(0.05)

        with structlog.testing.capture_logs() as logs:
            tg.start_soon(publish_new_folders, manager, watched)
            # The watcher is up once a probe folder's (empty) manifest is refused.
            probe = watched / "probe"
            with anyio.fail_after(30):
                while not refused(logs, probe):
                    if watched.is_dir():
                        probe.mkdir(exist_ok=True)
                        (probe / MANIFEST_FILE).write_text("")
                    await anyio.sleep(0.5)
            _adapter(watched, 1)
            await served(1)
            bad = watched / "v2"  # its manifest names other weights (a half-copied folder)
            bad.mkdir()
            (bad / WEIGHTS_FILE).write_bytes(b"half of the weights")
            (bad / "adapter_config.json").write_text(json.dumps({"r": 8}))
            manifest = (watched / "v1" / MANIFEST_FILE).read_bytes()
            (bad / MANIFEST_FILE).write_bytes(manifest.replace(b"@v1", b"@v2"))
            with anyio.fail_after(20):
                while not refused(logs, bad):  # noqa: ASYNC110 - a log line, no event
                    await anyio.sleep(0.05)
            assert "sha256" in refused(logs, bad)[0]["error"]
            # Moved in whole (one event, for the folder), as `mv` into the folder does.
            (_adapter(tmp_path / "staging", 3)).rename(watched / "v3")
            await served(3)
        tg.cancel_scope.cancel()
    assert "load policy@v1" in api.calls and "load policy@v3" in api.calls
    assert "load policy@v2" not in api.calls
