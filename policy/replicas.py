"""Several vLLM servers that serve the same model, used as one.

A `ReplicaSet` stands wherever one `CompletionClient` does: `VLLMPolicy` sends its
completions through it, and `AdapterManager` loads, unloads and verifies adapters through
it (it is an `AdapterServer`), so neither knows there is more than one server. Each
replica is a `CompletionClient` with its own retries and timeouts.

    VLLMPolicy ───── complete ──────┐              ┌─> A  live, 3 in flight
                                    ├─> ReplicaSet ┼─> B  live, 1 in flight   <- the next request
    AdapterManager ─ load, unload, ─┘              └─> C  down: /health probed every few s,
                     models (every live replica)          back once its adapters are loaded

Adapters. `load_adapter` and `unload_adapter` act on every live replica, and the set
remembers what it loaded and did not unload (the manager's resident versions).
`models()` asks every live replica and raises `AdapterSwapError` naming one that does not
list exactly those of its adapters, so the manager's check after a swap covers every
replica before any request uses the version. It returns the union of the listings: a
stray `policy@vN` on any one replica fails the manager's own check. A load one replica
refuses (4xx) is undone on those that took it and raised, so the swap is refused as with
one server; a replica that cannot be reached during a load or unload, or fails an unload,
is taken out instead (it gets the current set when it rejoins).

Requests. `complete` goes to the live replica with the fewest requests in flight that
has the adapter, ties taken in turn. A replica that fails with `ServerUnavailableError`
(refused or reset connection, 5xx after its own retries), or answers 404 for an adapter
it was given (it restarted and lost it), is taken out, and the request is tried on
another; with none left, `ServerUnavailableError` says so. Each try has the caller's
whole timeout. A timeout or a refused request is the request's failure, not the
replica's: it is raised as it is.

Placement. A replica that does not share the learner's file system gets a `Placement`
(`runtime.replica_actors.ActorPlacement`: the files go through Ray to the replica's
node): before a load, `place(name, path)` puts the adapter where that replica can read
it and gives the path to load from; after an unload, `remove(name)` deletes it there.
Without one, the replica loads the learner's path as it is (one host, or a shared file
system). A placement that cannot reach its replica raises `ServerUnavailableError`.

Rejoining. `watch()`, run in the owner's task group, calls `probe()` every
`probe_interval_s`: a live replica that no longer lists the resident adapters (it
restarted between two calls) is taken out, and a down replica whose `/health` answers
gets every resident adapter loaded (and the set's unloaded ones unloaded), is verified
with `/v1/models`, and only then takes requests again. The set's lock keeps loads,
unloads, checks and rejoins apart, so a version published while a replica rejoins is on
it before it takes requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import httpx
import msgspec
import structlog
from anyio.abc import TaskStatus

from policy.client import Completion, CompletionClient, SamplingParams
from policy.errors import (
    AdapterSwapError,
    BadRequestError,
    PolicyError,
    RequestError,
    ServerUnavailableError,
)
from runtime.base.config import PolicyConfig

__all__ = ["Placement", "ReplicaSet", "ReplicaStatistics"]

_log = structlog.get_logger("policy.replicas")


class ReplicaStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """One replica in `ReplicaSet.statistics()`; `failures` counts its failed requests."""

    url: str
    live: bool
    reason: str  # why it is down; "" while live
    in_flight: int
    completed: int
    failures: int


class Placement(Protocol):
    """Puts adapter folders where one replica can read them (see the module docstring)."""

    async def place(self, name: str, path: str) -> str: ...

    async def remove(self, name: str) -> None: ...


@dataclass(eq=False)
class _Replica:
    client: CompletionClient
    placement: Placement | None = None
    live: bool = True
    reason: str = ""
    adapters: set[str] = field(default_factory=set)  # loaded into it through the set
    in_flight: int = 0
    completed: int = 0
    failures: int = 0

    @property
    def url(self) -> str:
        return self.client.base_url

    async def load(self, name: str, path: str, timeout_s: float | None) -> None:
        """Place the adapter (when it has a placement) and load it."""
        if self.placement is not None:
            path = await self.placement.place(name, path)
        await self.client.load_adapter(name, path, timeout_s=timeout_s)
        _log.info("replica.loaded", url=self.url, adapter=name, path=path)

    async def unload(self, name: str, timeout_s: float | None) -> bool:
        had = await self.client.unload_adapter(name, timeout_s=timeout_s)
        if self.placement is not None:
            await self.placement.remove(name)
        return had


class ReplicaSet:
    """Policy servers of one model behind one `CompletionClient`-like face (see the module
    docstring). Every replica starts live; run `watch()` so that those taken out rejoin."""

    def __init__(
        self,
        clients: Sequence[CompletionClient],
        *,
        placements: Sequence[Placement | None] = (),
        probe_interval_s: float = 2.0,
        health_timeout_s: float = 5.0,
    ) -> None:
        urls = [client.base_url for client in clients]
        if not urls:
            raise ValueError("a ReplicaSet needs at least one replica")
        if len(set(urls)) != len(urls):
            raise ValueError(f"replica URLs repeat: {urls}")
        if len(placements) > len(clients):
            raise ValueError(f"{len(placements)} placements for {len(clients)} replicas")
        places = [*placements, *[None] * (len(clients) - len(placements))]
        self._replicas = [_Replica(c, p) for c, p in zip(clients, places, strict=True)]
        self.probe_interval_s = probe_interval_s
        self.health_timeout_s = health_timeout_s
        self._resident: dict[str, str] = {}  # name -> path: loaded and not unloaded
        self._known: set[str] = set()  # every name ever loaded through the set
        self._lock = anyio.Lock()
        self._turn = 0  # where the next tie-break starts

    @classmethod
    def from_config(
        cls,
        http: httpx.AsyncClient,
        urls: Sequence[str],
        config: PolicyConfig,
        *,
        placements: Sequence[Placement | None] = (),
    ) -> ReplicaSet:
        return cls(
            [CompletionClient.from_config(http, url, config) for url in urls],
            placements=placements,
            probe_interval_s=config.health_interval_s,
            health_timeout_s=config.health_timeout_s,
        )

    # ------------------------------------------------------------------ membership

    def _live(self) -> list[_Replica]:
        return [r for r in self._replicas if r.live]

    def _take_out(self, replica: _Replica, reason: str) -> None:
        if not replica.live:
            return
        replica.live = False
        replica.reason = reason
        _log.warning(
            "replica.down",
            url=replica.url,
            reason=reason,
            live=len(self._live()),
            replicas=len(self._replicas),
        )

    def _unavailable(self, what: str) -> ServerUnavailableError:
        down = "; ".join(f"{r.url}: {r.reason}" for r in self._replicas if not r.live)
        return ServerUnavailableError(
            f"{what}: no live policy replica can take it "
            f"({len(self._live())} of {len(self._replicas)} live; down: {down or 'none'})"
        )

    def _check(self, replica: _Replica, listing: dict[str, str | None]) -> None:
        """Raise `AdapterSwapError` unless `listing` (the replica's /v1/models) holds
        exactly the resident ones of the adapters loaded through the set."""
        ours = sorted(name for name in listing if name in self._known)
        expected = sorted(self._resident)
        if ours != expected:
            raise AdapterSwapError(
                f"replica {replica.url} lists {ours} of this replica set's adapters "
                f"but should list {expected}"
            )

    # ------------------------------------------------------------------ requests

    def _pick(self, model: str, tried: list[_Replica]) -> _Replica | None:
        """The least-loaded live replica not tried yet that has `model` (any, for a model
        not loaded through the set, such as the base model); ties in turn."""
        count = len(self._replicas)
        ours = any(model in r.adapters for r in self._replicas)
        rotated = [self._replicas[(self._turn + i) % count] for i in range(count)]
        candidates = [
            r for r in rotated if r.live and r not in tried and (not ours or model in r.adapters)
        ]
        if not candidates:
            return None
        chosen = min(candidates, key=lambda r: r.in_flight)
        self._turn = (self._replicas.index(chosen) + 1) % count
        return chosen

    async def complete(
        self,
        prompt_token_ids: Sequence[int],
        *,
        model: str,
        sampling: SamplingParams = SamplingParams(),
        timeout_s: float | None = None,
    ) -> Completion:
        """`CompletionClient.complete` on the least-loaded live replica with `model`,
        tried on the next one while replicas fail as unavailable."""
        tried: list[_Replica] = []
        while (replica := self._pick(model, tried)) is not None:
            tried.append(replica)
            replica.in_flight += 1
            try:
                completion = await replica.client.complete(
                    prompt_token_ids, model=model, sampling=sampling, timeout_s=timeout_s
                )
            except RequestError as exc:
                replica.failures += 1
                if isinstance(exc, ServerUnavailableError):
                    self._take_out(replica, str(exc))
                elif (
                    isinstance(exc, BadRequestError)
                    and exc.status == 404
                    and model in replica.adapters
                ):
                    self._take_out(replica, f"it lost {model} (restarted?): {exc}")
                else:
                    raise
                continue
            finally:
                replica.in_flight -= 1
            replica.completed += 1
            return completion
        raise self._unavailable(f"/v1/completions with {model}")

    async def health(self, *, timeout_s: float = 5.0) -> bool:
        """True if a live replica answers `/health` now (one try each, until one does)."""
        for replica in self._live():
            if await replica.client.health(timeout_s=timeout_s):
                return True
        return False

    # ------------------------------------------------------------------ adapters

    async def load_adapter(self, name: str, path: str, *, timeout_s: float | None = None) -> None:
        """Load `name` into every live replica; a replica's refusal undoes the load on the
        others and is raised."""
        async with self._lock:
            self._known.add(name)
            loaded: list[_Replica] = []
            for replica in self._live():
                try:
                    await replica.load(name, path, timeout_s)
                except ServerUnavailableError as exc:
                    self._take_out(replica, str(exc))
                    continue
                except RequestError as exc:
                    _log.warning(
                        "replica.load_refused", url=replica.url, adapter=name, error=str(exc)
                    )
                    await self._undo_load(name, loaded, timeout_s)
                    raise
                replica.adapters.add(name)
                loaded.append(replica)
            if not loaded:
                raise self._unavailable(f"loading {name}")
            self._resident[name] = path

    async def _undo_load(self, name: str, loaded: list[_Replica], timeout_s: float | None) -> None:
        for replica in loaded:
            replica.adapters.discard(name)
            try:
                await replica.unload(name, timeout_s)
            except RequestError as exc:
                self._take_out(replica, f"could not undo the load of {name}: {exc}")

    async def unload_adapter(self, name: str, *, timeout_s: float | None = None) -> bool:
        """Unload `name` from every live replica; False if none of them had it. A replica
        that fails to is taken out; if all do, `name` stays resident and this raises."""
        async with self._lock:
            had = False
            unloaded = 0
            for replica in self._live():
                try:
                    had |= await replica.unload(name, timeout_s)
                except RequestError as exc:
                    self._take_out(replica, f"could not unload {name}: {exc}")
                    continue
                replica.adapters.discard(name)
                unloaded += 1
            if not unloaded:
                raise self._unavailable(f"unloading {name}")
            self._resident.pop(name, None)
            return had

    async def models(self, *, timeout_s: float | None = None) -> dict[str, str | None]:
        """The union of the live replicas' `/v1/models`, after checking that each lists
        exactly the resident adapters of the set (`AdapterSwapError` names one that does
        not)."""
        async with self._lock:
            merged: dict[str, str | None] = {}
            answered = 0
            for replica in self._live():
                try:
                    listing = await replica.client.models(timeout_s=timeout_s)
                except ServerUnavailableError as exc:
                    self._take_out(replica, str(exc))
                    continue
                self._check(replica, listing)
                merged.update(listing)
                answered += 1
            if not answered:
                raise self._unavailable("/v1/models")
            return merged

    # ------------------------------------------------------------------ rejoining

    async def probe(self) -> list[str]:
        """Check that each live replica still holds the resident adapters (one that
        restarted between two of our calls has lost them: it is taken out), then try once
        to bring back each down replica; returns the URLs that rejoined."""
        await self._check_live()
        return [r.url for r in self._replicas if not r.live and await self._rejoin(r)]

    async def _check_live(self) -> None:
        if not self._resident:  # nothing loaded through this set (a rollout worker's)
            return
        async with self._lock:
            for replica in self._live():
                try:
                    listing = await replica.client.models(timeout_s=self.health_timeout_s)
                except RequestError as exc:
                    self._take_out(replica, str(exc))
                    continue
                missing = sorted(set(self._resident).difference(listing))
                if missing:
                    self._take_out(replica, f"it lost {missing} (restarted?)")

    async def _rejoin(self, replica: _Replica) -> bool:
        if not await replica.client.health(timeout_s=self.health_timeout_s):
            return False
        async with self._lock:
            try:
                served = await replica.client.models()
                for name in sorted(self._known.difference(self._resident).intersection(served)):
                    await replica.unload(name, None)
                for name, path in self._resident.items():
                    if name not in served:
                        await replica.load(name, path, None)
                self._check(replica, await replica.client.models())
            except PolicyError as exc:
                replica.reason = f"rejoin failed: {exc}"
                _log.warning("replica.rejoin_failed", url=replica.url, error=str(exc))
                return False
            replica.adapters = set(self._resident)
            replica.live = True
            replica.reason = ""
        _log.info(
            "replica.rejoined",
            url=replica.url,
            adapters=sorted(replica.adapters),
            live=len(self._live()),
            replicas=len(self._replicas),
        )
        return True

    async def watch(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """`probe()` every `probe_interval_s` until cancelled."""
        task_status.started()
        while True:
            await anyio.sleep(self.probe_interval_s)
            await self.probe()

    def statistics(self) -> list[ReplicaStatistics]:
        return [
            ReplicaStatistics(
                url=r.url,
                live=r.live,
                reason=r.reason,
                in_flight=r.in_flight,
                completed=r.completed,
                failures=r.failures,
            )
            for r in self._replicas
        ]
