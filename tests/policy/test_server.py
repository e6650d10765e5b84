"""VLLMServer's command line, environment and process handling, without vLLM: a stand-in
executable (the `python` seam) that fails or hangs with a child in its process group."""

from __future__ import annotations

import contextlib
import stat
import sys
from pathlib import Path

import anyio
import httpx
import psutil  # type: ignore[import-untyped]
import pytest

from policy.allocator import find_tcmalloc
from policy.errors import ServerExitedError, ServerStartError
from policy.server import (
    VLLMServer,
    cpu_has_bfloat16,
    server_command,
    server_dtype,
    server_env,
)
from runtime.base.config import PolicyConfig


def test_cpu_command_and_environment(tmp_path: Path) -> None:
    config = PolicyConfig(max_loras=5, max_cpu_loras=9, kv_cache_gib=1.5, extra_args=("--x",))
    cmd = server_command(config, model=str(tmp_path), port=8123, python="py")
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.launchers.api_server.entry"]
    joined = " ".join(cmd)
    for part in (
        f"--model {tmp_path}",
        "--port 8123",
        "--enable-lora",
        "--max-loras 5",
        "--max-cpu-loras 9",
        "--max-lora-rank 8",
        f"--dtype {'bfloat16' if cpu_has_bfloat16() else 'float32'}",  # policy.dtype "auto"
        "--logprobs-mode processed_logprobs",
    ):
        assert part in joined
    assert cmd[-1] == "--x"
    assert "--gpu-memory-utilization" not in cmd
    env = server_env(config, model=str(tmp_path), base={"PATH": "/bin"})
    assert env["PATH"] == "/bin"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # whole GiB, rounded up
    assert env["HF_HUB_OFFLINE"] == "1"  # a local folder needs no hub
    assert env["WEBAGENT_VLLM_LORA_OPS"] == "grouped"  # policy/lora_ops.py's plugin acts
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env  # cpu_threads 0: vLLM's own binding
    assert env.get("LD_PRELOAD") == find_tcmalloc()  # allocator "auto"
    env = server_env(
        PolicyConfig(lora_ops="vllm", cpu_threads=2, allocator="system"),
        model=str(tmp_path),
        base={},
    )
    assert env["WEBAGENT_VLLM_LORA_OPS"] == "vllm"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert "LD_PRELOAD" not in env


def test_dtype_auto_takes_bfloat16_only_where_the_cpu_multiplies_it(tmp_path: Path) -> None:
    zen4 = tmp_path / "zen4"
    zen4.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    older = tmp_path / "older"
    older.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert cpu_has_bfloat16(zen4) and not cpu_has_bfloat16(older)
    assert not cpu_has_bfloat16(tmp_path / "missing")
    assert server_dtype(PolicyConfig(dtype="float16")) == "float16"  # as set, on any device
    assert server_dtype(PolicyConfig(device="gpu")) == "auto"  # vLLM's choice on a GPU
    assert server_dtype(PolicyConfig()) == ("bfloat16" if cpu_has_bfloat16() else "float32")


def test_gpu_command_and_hub_model() -> None:
    config = PolicyConfig(device="gpu", gpu_memory_utilization=0.5, dtype="bfloat16")
    cmd = server_command(config, model="Qwen/Qwen2.5-3B-Instruct", port=1, python="py")
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.5"
    env = server_env(config, model="Qwen/Qwen2.5-3B-Instruct", base={})
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert "HF_HUB_OFFLINE" not in env


def _stand_in(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.anyio
async def test_a_server_that_exits_raises_with_its_log(tmp_path: Path) -> None:
    python = _stand_in(tmp_path, 'echo "ValueError: no model at $4"; exit 3')
    server = VLLMServer(
        PolicyConfig(), model="/no/model", log_path=tmp_path / "run" / "vllm.log", python=python
    )
    with pytest.raises(ServerStartError, match="exited with code 3") as info:
        await server.start()
    assert "ValueError: no model at /no/model" in info.value.log_tail
    assert "ValueError: no model" in str(info.value)
    assert not server.running


@pytest.mark.anyio
async def test_a_server_that_hangs_is_stopped_with_its_whole_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    python = _stand_in(tmp_path, f"sleep 300 & echo $! > {pids}; echo starting; wait")
    server = VLLMServer(PolicyConfig(), model="m", log_path=tmp_path / "vllm.log", python=python)
    with pytest.raises(ServerStartError, match="not healthy after 1 s") as info:
        await server.start(timeout_s=1.0)
    assert "starting" in info.value.log_tail
    child = int(pids.read_text())
    with contextlib.suppress(psutil.NoSuchProcess):  # gone altogether, or only a zombie
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert server.pid is None


_HEALTHY_THEN_CRASH = """
import http.server, sys, threading, os
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        print("served", self.path, flush=True)
        if os.path.exists(sys.argv[0] + ".crash"):
            threading.Timer(0.1, lambda: os._exit(9)).start()
    def log_message(self, *args):
        pass
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.mark.anyio
async def test_start_wait_exited_restart_and_stop(tmp_path: Path) -> None:
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\n{_HEALTHY_THEN_CRASH}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    server = VLLMServer(PolicyConfig(), model="m", log_path=tmp_path / "vllm.log",
                        python=str(script))  # fmt: skip
    async with server:
        assert server.running
        first_pid, url = server.pid, server.url
        assert url.startswith("http://127.0.0.1:")
        await anyio.Path(f"{script}.crash").touch()
        async with httpx.AsyncClient() as http:
            await http.get(f"{url}/health")
        with anyio.fail_after(10), pytest.raises(ServerExitedError, match="code 9") as info:
            await server.wait_exited()
        assert "served /health" in info.value.log_tail
        await anyio.Path(f"{script}.crash").unlink()
        await server.restart()
        assert server.running
        assert server.url == url  # same port after a restart
        assert server.pid != first_pid
        assert server.statistics().starts == 2
        pid = server.pid
    assert server.pid is None
    assert not psutil.pid_exists(pid)


def test_needs_a_model_or_a_url() -> None:
    with pytest.raises(ValueError, match="needs a model"):
        VLLMServer(PolicyConfig())
    assert VLLMServer(PolicyConfig(url="http://h:1/")).url == "http://h:1"


def test_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """SIGKILL of the parent leaves no server behind (parent-death signal via setpriv)."""
    import signal
    import subprocess

    pid_file = tmp_path / "server.pid"
    python = _stand_in(tmp_path, f"echo $$ > {pid_file}; exec sleep 300")
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import anyio\n"
        "from policy.server import VLLMServer\n"
        "from runtime.base.config import PolicyConfig\n"
        "async def main():\n"
        f"    server = VLLMServer(PolicyConfig(), model='m', log_path={str(tmp_path / 'l')!r},"
        f" python={python!r})\n"
        "    await server.start(timeout_s=300)\n"
        "anyio.run(main)\n"
    )
    proc = subprocess.Popen([sys.executable, str(parent)])
    try:
        for _ in range(200):  # the stand-in writes its pid once it runs
            if pid_file.exists() and pid_file.read_text().strip():
                break
            psutil.wait_procs([psutil.Process(proc.pid)], timeout=0.05)
        # Taken while it runs: the server may be gone before the parent's wait returns.
        server = psutil.Process(int(pid_file.read_text()))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        gone, alive = psutil.wait_procs([server], timeout=10)
        assert not alive, "the server outlived the process that started it"
        assert gone
    finally:
        proc.kill()
