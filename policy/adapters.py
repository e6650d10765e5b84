"""Versioned LoRA adapters on the server and their hot-swap.

Names are `{prefix}@v{N}` (`policy@v0`, `policy@v1`, ...). v0 is a zero-initialised LoRA,
identical to the base model, so every request names an adapter and no batch ever mixes
base rows with LoRA rows (the vLLM 0.32 CPU LoRA slot bug).

`AdapterManager.publish(path)`:
1. checks the folder's `manifest.json` (an `AdapterManifest`): it must exist, decode, and
   its `weights_sha256` must match `adapter_model.safetensors`; otherwise the adapter is
   half-written or foreign and is refused;
2. loads it under a new name (`/v1/load_lora_adapter`; never in place);
3. checks `/v1/models` lists every resident version, then routes new requests to it;
4. unloads older versions that no request holds and that are outside the staleness
   window (`version < current - staleness_window`), and checks `/v1/models` again.
A version still held by requests is unloaded by the manager's janitor task as soon as its
last lease ends; an unload that fails (server unreachable) is logged and retried at the
next publish or release. Requests hold a lease (`with manager.lease() as lease:`) on one
version for their whole duration. After a server restart, `restore()` loads the resident
versions again (`VLLMPolicy` calls it when the server answers 404 for an adapter).

`publish_new_folders(manager, folder)` is hot reload: every adapter folder that appears
under `folder` (its manifest written) is published; a bad one is refused and logged.
"""

from __future__ import annotations

import contextlib
import hashlib
import statistics as stats
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from policy.errors import (
    AdapterError,
    AdapterManifestError,
    AdapterSwapError,
    PolicyError,
    RequestError,
)
from runtime.base.messages import AdapterManifest, AdapterSwapped, Event

__all__ = [
    "MANIFEST_FILE",
    "WEIGHTS_FILE",
    "AdapterLease",
    "AdapterManager",
    "AdapterServer",
    "AdapterStatistics",
    "SwapResult",
    "adapter_name",
    "publish_new_folders",
    "read_manifest",
    "weights_sha256",
]

_log = structlog.get_logger("policy.adapters")

MANIFEST_FILE = "manifest.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_CONFIG_FILE = "adapter_config.json"


def adapter_name(prefix: str, version: int) -> str:
    """The served name of a version: `policy@v3`."""
    return f"{prefix}@v{version}"


def weights_sha256(folder: str | Path) -> str:
    """sha256 (hex) of the adapter's `adapter_model.safetensors`: what a manifest records."""
    digest = hashlib.sha256()
    with (Path(folder) / WEIGHTS_FILE).open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(folder: str | Path) -> AdapterManifest:
    """The folder's manifest, verified against its weights; raises `AdapterManifestError`."""
    path = Path(folder)
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise AdapterManifestError(f"{path}: no {MANIFEST_FILE} (half-written adapter?)")
    try:
        manifest = msgspec.json.decode(manifest_path.read_bytes(), type=AdapterManifest)
    except (OSError, msgspec.DecodeError) as exc:
        raise AdapterManifestError(f"{manifest_path}: unreadable manifest ({exc})") from exc
    if not (path / _CONFIG_FILE).is_file():
        raise AdapterManifestError(f"{path}: no {_CONFIG_FILE}")
    try:
        actual = weights_sha256(path)
    except OSError as exc:
        raise AdapterManifestError(f"{path}: cannot read {WEIGHTS_FILE} ({exc})") from exc
    if actual != manifest.weights_sha256:
        raise AdapterManifestError(
            f"{path}: {WEIGHTS_FILE} has sha256 {actual[:12]}..., the manifest says "
            f"{manifest.weights_sha256[:12]}... (half-written or replaced adapter)"
        )
    return manifest


class AdapterServer(Protocol):
    """What the manager needs of the server (`policy.client.CompletionClient`)."""

    async def load_adapter(
        self, name: str, path: str, *, timeout_s: float | None = None
    ) -> None: ...

    async def unload_adapter(self, name: str, *, timeout_s: float | None = None) -> bool: ...

    async def models(self, *, timeout_s: float | None = None) -> dict[str, str | None]: ...


class AdapterLease(msgspec.Struct, frozen=True, kw_only=True):
    """The version a request uses, held for the request's whole duration."""

    name: str
    version: int


class SwapResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one `publish` did; `latency_s` runs from the call to new requests routed."""

    name: str
    version: int
    previous: str
    latency_s: float
    unloaded: list[str]


class AdapterStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Versions resident on the server, requests per version, and swap latencies."""

    current: str
    resident: list[str]
    in_flight: dict[str, int]
    swaps: int
    swap_latency_median_s: float
    swap_latency_max_s: float
    unloads_pending: list[str]


@dataclass
class _Resident:
    name: str
    version: int
    path: str
    in_flight: int = 0


class AdapterManager:
    """Adapter versions resident on one server; leases route requests to the current one.

    Use it as an async context manager: it owns the janitor task that unloads versions
    whose last request has finished.
    """

    def __init__(
        self,
        server: AdapterServer,
        *,
        prefix: str = "policy",
        staleness_window: int = 1,
        max_loras: int = 4,
        timeout_s: float | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        if staleness_window < 0:
            raise ValueError("staleness_window must be >= 0")
        self._server = server
        self.prefix = prefix
        self.staleness_window = staleness_window
        self.max_loras = max_loras
        self.timeout_s = timeout_s
        self.on_event = on_event
        self._resident: dict[int, _Resident] = {}
        self._current: int | None = None
        self._lock = anyio.Lock()
        self._changed = anyio.Condition()
        self._wake: MemoryObjectSendStream[None] | None = None
        self._latencies: deque[float] = deque(maxlen=256)
        self._swaps = 0
        self._task_group: TaskGroup | None = None

    async def __aenter__(self) -> Self:
        if self._task_group is not None:
            raise RuntimeError("AdapterManager is already running")
        self._wake, wake_recv = anyio.create_memory_object_stream[None](1)
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._janitor, wake_recv)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._task_group is not None and self._wake is not None
        self._wake.close()  # ends the janitor
        try:
            return await self._task_group.__aexit__(exc_type, exc, tb)
        finally:
            self._task_group = None
            self._wake = None

    # ------------------------------------------------------------------ routing

    @property
    def current(self) -> AdapterLease | None:
        """The version new requests get, or None before the first publish."""
        if self._current is None:
            return None
        return AdapterLease(name=self._resident[self._current].name, version=self._current)

    def resident(self, name: str) -> AdapterLease | None:
        """The resident version called `name` ("policy@v3"), or None."""
        found = self._by_name(name)
        return None if found is None else AdapterLease(name=found.name, version=found.version)

    def _by_name(self, name: str) -> _Resident | None:
        return next((r for r in self._resident.values() if r.name == name), None)

    @contextmanager
    def lease(self, name: str | None = None) -> Iterator[AdapterLease]:
        """Hold the current version (or the resident one called `name`) for one request."""
        if self._current is None:
            raise AdapterError("no adapter published yet: publish v0 (a zero LoRA) first")
        resident = self._resident[self._current] if name is None else self._by_name(name)
        if resident is None:
            names = ", ".join(sorted(r.name for r in self._resident.values()))
            raise AdapterError(f"adapter {name!r} is not served (resident: {names})")
        resident.in_flight += 1
        try:
            yield AdapterLease(name=resident.name, version=resident.version)
        finally:
            resident.in_flight -= 1
            if resident.in_flight == 0 and self._retired(resident.version) and self._wake:
                # A wake-up may be pending already; the janitor may be gone (closing).
                with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
                    self._wake.send_nowait(None)

    def _retired(self, version: int) -> bool:
        """Outside the staleness window: to be unloaded once no request holds it."""
        return self._current is not None and version < self._current - self.staleness_window

    # ------------------------------------------------------------------ publishing

    async def publish(self, path: str | Path) -> SwapResult:
        """Verify, load and route to the adapter at `path`; see the module docstring."""
        started = time.monotonic()
        folder = await anyio.Path(path).resolve()
        manifest = await anyio.to_thread.run_sync(read_manifest, Path(folder))
        async with self._lock:
            if self._current is not None and manifest.version <= self._current:
                raise AdapterError(
                    f"{folder}: version {manifest.version} is not newer than the "
                    f"serving version {self._current}"
                )
            name = adapter_name(self.prefix, manifest.version)
            previous = self._resident[self._current].name if self._current is not None else ""
            await self._server.load_adapter(name, str(folder), timeout_s=self.timeout_s)
            self._resident[manifest.version] = _Resident(name, manifest.version, str(folder))
            await self._verify()
            self._current = manifest.version
            latency = time.monotonic() - started
            try:
                unloaded = await self._unload_idle()
            except RequestError as exc:
                # The swap is done; the old versions stay until the next publish or release.
                _log.warning("adapter.unload_failed", error=str(exc))
                unloaded = []
            self._swaps += 1
            self._latencies.append(latency)
        if len(self._resident) >= self.max_loras:
            _log.warning(
                "adapter.slots_full",
                resident=len(self._resident),
                max_loras=self.max_loras,
                hint="--max-loras must exceed the adapters resident at once",
            )
        if self.on_event is not None:
            self.on_event(
                AdapterSwapped(at=time.time(), name=name, previous=previous, latency_s=latency)
            )
        _log.info(
            "adapter.swapped",
            adapter=name,
            previous=previous,
            latency_s=round(latency, 4),
            unloaded=unloaded,
            resident=sorted(r.name for r in self._resident.values()),
        )
        return SwapResult(
            name=name,
            version=manifest.version,
            previous=previous,
            latency_s=latency,
            unloaded=unloaded,
        )

    async def restore(self) -> list[str]:
        """Load every resident version the server lacks (after a server restart);
        returns their names."""
        async with self._lock:
            served = await self._server.models(timeout_s=self.timeout_s)
            missing = [r for r in self._resident.values() if r.name not in served]
            for resident in missing:
                await self._server.load_adapter(resident.name, resident.path)
            await self._verify()
        return [r.name for r in missing]

    async def unload_all(self) -> list[str]:
        """Unload every version (nothing may be in flight); the manager is empty after."""
        async with self._lock:
            busy = [r.name for r in self._resident.values() if r.in_flight]
            if busy:
                raise AdapterError(f"cannot unload {busy}: requests still hold them")
            names = [r.name for r in self._resident.values()]
            for name in names:
                await self._server.unload_adapter(name, timeout_s=self.timeout_s)
            self._resident.clear()
            self._current = None
            await self._verify()
        return names

    async def _unload_idle(self) -> list[str]:
        """Unload retired versions that no request holds; the lock must be held."""
        idle = [r for r in self._resident.values() if r.in_flight == 0 and self._retired(r.version)]
        if not idle:
            return []
        for resident in idle:
            await self._server.unload_adapter(resident.name, timeout_s=self.timeout_s)
            del self._resident[resident.version]
        await self._verify()
        async with self._changed:
            self._changed.notify_all()
        return [r.name for r in idle]

    async def _verify(self) -> None:
        """Raise `AdapterSwapError` unless the server lists exactly our resident versions."""
        served = await self._server.models(timeout_s=self.timeout_s)
        ours = {name for name in served if name.startswith(f"{self.prefix}@v")}
        expected = {r.name for r in self._resident.values()}
        if ours != expected:
            raise AdapterSwapError(
                f"the server lists {sorted(ours)} but should list {sorted(expected)}"
            )

    async def _janitor(self, wake: MemoryObjectReceiveStream[None]) -> None:
        """Unload versions whose last lease ended (woken by `lease`)."""
        async with wake:
            async for _ in wake:
                async with self._lock:
                    try:
                        unloaded = await self._unload_idle()
                    except PolicyError as exc:
                        # The server may be restarting; the next wake-up retries.
                        _log.warning("adapter.unload_failed", error=str(exc))
                        continue
                if unloaded:
                    _log.info("adapter.unloaded", adapters=unloaded)

    async def wait_unloaded(self) -> None:
        """Wait until no version outside the staleness window is resident."""
        async with self._changed:
            while any(self._retired(v) for v in self._resident):
                await self._changed.wait()

    def statistics(self) -> AdapterStatistics:
        latencies = list(self._latencies)
        return AdapterStatistics(
            current=self.current.name if self.current else "",
            resident=[r.name for r in sorted(self._resident.values(), key=lambda r: r.version)],
            in_flight={r.name: r.in_flight for r in self._resident.values()},
            swaps=self._swaps,
            swap_latency_median_s=stats.median(latencies) if latencies else 0.0,
            swap_latency_max_s=max(latencies, default=0.0),
            unloads_pending=[r.name for r in self._resident.values() if self._retired(r.version)],
        )


async def publish_new_folders(manager: AdapterManager, folder: Path) -> None:
    """Publish every adapter folder (one with a `manifest.json`, at any depth) that appears
    under `folder` (created if missing) or whose manifest is rewritten, until cancelled;
    those there at the start are left alone. A folder that is refused is logged, never
    fatal.

    Each batch of file events rescans the folder rather than trusting the events to name
    the manifest: a folder moved in whole is one event for the folder, and files written
    right after a `mkdir` can land before the watch on the new folder exists."""
    from watchfiles import awatch

    await anyio.Path(folder).mkdir(parents=True, exist_ok=True)

    def manifests() -> dict[Path, int]:
        found = {}
        for path in folder.glob(f"**/{MANIFEST_FILE}"):
            with contextlib.suppress(OSError):  # gone since it was listed
                found[path] = path.stat().st_mtime_ns
        return found

    handled = await anyio.to_thread.run_sync(manifests)
    async for _ in awatch(folder, recursive=True):
        current = await anyio.to_thread.run_sync(manifests)
        for manifest, stamp in sorted(current.items()):
            if handled.get(manifest) == stamp:
                continue
            handled[manifest] = stamp
            try:
                result = await manager.publish(manifest.parent)
                _log.info("daemon.hot_reload", adapter=result.name, path=str(manifest.parent))
            except Exception as exc:
                _log.warning("daemon.hot_reload_refused", path=str(manifest.parent), error=str(exc))
