"""The policy server's supervisor without vLLM: a stand-in executable (VLLMServer's
`python` seam) that serves vLLM's /health, /v1/models and LoRA routes over real HTTP on
127.0.0.1 and keeps a child in its process group, as vLLM keeps its engine core. Killed
(-9), hung (SIGSTOP) or, external, gone away: the outage is found within seconds, the
child never outlives its server, the adapters come back verified, and each outage and
recovery is a `Fault`."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import psutil  # type: ignore[import-untyped]
import pytest

from policy.adapters import AdapterManager
from policy.client import CompletionClient
from policy.server import VLLMServer
from runtime.base.config import PolicyConfig
from runtime.base.http import free_port
from runtime.base.messages import Event, Fault
from runtime.supervisor import ServerSupervisor

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

_STAND_IN = """
import http.server, json, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
engine = subprocess.Popen(["sleep", "300"])  # stays in our process group, as vLLM's does
with open(sys.argv[0] + ".engine", "w") as out:
    out.write(str(engine.pid))
loaded = {}
class Api(http.server.BaseHTTPRequestHandler):
    def _answer(self, code, body=None):
        data = json.dumps(body or {}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self._answer(200)
        elif self.path == "/v1/models":
            data = [{"id": "base", "parent": None}]
            data += [{"id": n, "parent": "base"} for n in loaded]
            self._answer(200, {"data": data})
        else:
            self._answer(404)
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/load_lora_adapter":
            loaded[body["lora_name"]] = body["lora_path"]
            self._answer(200)
        elif self.path == "/v1/unload_lora_adapter":
            self._answer(200 if loaded.pop(body["lora_name"], None) else 404)
        else:
            self._answer(404)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Api).serve_forever()
"""

_FAST = {"health_interval_s": 0.2, "health_timeout_s": 0.5, "health_failures": 2}


def _stand_in(tmp_path: Path) -> Path:
    script = tmp_path / "fake-vllm"
    script.write_text(f"#!{sys.executable}\n{_STAND_IN}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _engine(script: Path) -> psutil.Process:
    return psutil.Process(int(Path(f"{script}.engine").read_text()))


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _gone_pid(pid: int) -> bool:
    try:
        return _gone(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


class _Watch:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.downs: list[str] = []
        self.ups = 0

    def up(self) -> None:
        self.ups += 1

    def faults(self) -> list[str]:
        return [e.kind for e in self.events if isinstance(e, Fault)]


@asynccontextmanager
async def _supervised(
    server: VLLMServer, config: PolicyConfig, adapter: Path, watch: _Watch
) -> AsyncIterator[tuple[ServerSupervisor, CompletionClient]]:
    async with httpx.AsyncClient() as http:
        client = CompletionClient(http, server.url, max_retries=0, timeout_s=2.0)
        async with AdapterManager(client, prefix="policy", timeout_s=2.0) as adapters:
            await adapters.publish(adapter)
            supervisor = ServerSupervisor(
                config,
                server=server,
                client=client,
                adapters=adapters,
                on_down=watch.downs.append,
                on_up=watch.up,
                on_event=watch.events.append,
            )
            async with anyio.create_task_group() as tg:
                await tg.start(supervisor.run)
                yield supervisor, client
                tg.cancel_scope.cancel()


async def test_a_killed_or_hung_server_is_restarted_with_its_adapters(
    tmp_path: Path, zero_adapter: Path
) -> None:
    script = _stand_in(tmp_path)
    config = PolicyConfig(**_FAST)
    server = VLLMServer(config, model="m", log_path=tmp_path / "vllm.log", python=str(script))
    watch = _Watch()
    async with server, _supervised(server, config, zero_adapter, watch) as (supervisor, client):
        # 1. kill -9 of the API server alone: its engine core would be re-parented and run on.
        first, engine = server.pid, _engine(script)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        with anyio.fail_after(3):
            await supervisor.wait_down()
        assert watch.downs and "exited" in watch.downs[0]
        with anyio.fail_after(30):
            await supervisor.wait_up()
        assert _gone(engine), "the engine core outlived its API server"
        assert server.pid != first and server.running
        assert "policy@v0" in await client.models()  # reloaded and verified
        # 2. A hung server (stopped, still alive): found by /health probes, killed, restarted.
        hung, engine = server.pid, _engine(script)
        assert hung is not None
        os.kill(hung, signal.SIGSTOP)
        with anyio.fail_after(5):
            await supervisor.wait_down()
        assert "did not answer /health" in watch.downs[1]
        with anyio.fail_after(30):
            await supervisor.wait_up()
        assert _gone(engine), "the engine core outlived its hung API server"
        assert _gone_pid(hung)
        assert "policy@v0" in await client.models()
        stats = supervisor.statistics()
        assert (stats.state, stats.outages, stats.restarts) == ("up", 2, 2)
        assert len(stats.recovery_s) == 2 and all(s < 30 for s in stats.recovery_s)
    assert watch.ups == 2
    assert watch.faults() == ["policy_server", "policy_server_recovered"] * 2
    recovered = [e for e in watch.events if isinstance(e, Fault)][1]
    assert "policy@v0" in recovered.message


async def test_an_external_server_that_goes_away_is_awaited_and_reloaded(
    tmp_path: Path, zero_adapter: Path, lora_adapter: Callable[..., Path]
) -> None:
    script = _stand_in(tmp_path)
    port = free_port()

    def launch() -> subprocess.Popen[bytes]:
        return subprocess.Popen([str(script), "--port", str(port)], start_new_session=True)

    v1, v2 = lora_adapter(1), lora_adapter(2)
    config = PolicyConfig(url=f"http://127.0.0.1:{port}", **_FAST)
    server = VLLMServer(config)
    watch = _Watch()
    external = launch()
    try:
        async with server, _supervised(server, config, zero_adapter, watch) as (sup, client):
            os.killpg(external.pid, signal.SIGKILL)
            external.wait()
            with anyio.fail_after(5):
                await sup.wait_down()
            assert "did not answer /health" in watch.downs[0]
            assert sup.statistics().state == "down" and not await sup.check()
            stopping = anyio.Event()
            published = anyio.Event()

            async def publish(folder: Path) -> None:
                await sup.publish(folder, stopping=stopping)
                published.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(publish, v1)  # waits for the server, not an error
                await anyio.wait_all_tasks_blocked()
                assert not published.is_set()
                external = launch()  # back, with no adapter loaded
                with anyio.fail_after(30):
                    await sup.wait_up()
                    await published.wait()
            served = await client.models()
            assert {"policy@v0", "policy@v1"} <= set(served)
            stats = sup.statistics()
            assert (stats.outages, stats.restarts, stats.managed) == (1, 0, False)
            # Stopping while it is down: the publish is given up (the next start makes it).
            os.killpg(external.pid, signal.SIGKILL)
            external.wait()
            with anyio.fail_after(5):
                await sup.wait_down()
            stopping.set()
            with anyio.fail_after(5):
                await sup.publish(v2, stopping=stopping)
            assert sup.adapters.current is not None and sup.adapters.current.version == 1
            external = launch()
            with anyio.fail_after(30):
                await sup.wait_up()
    finally:
        os.killpg(external.pid, signal.SIGKILL)
        external.wait()
    assert watch.faults() == ["policy_server", "policy_server_recovered"] * 2
