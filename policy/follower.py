"""The adapter version another process publishes, as the requests of this one see it.

On Ray (`runtime.cluster`) the driver's `AdapterManager` loads, verifies and routes each
new version; a rollout worker only needs to know which name its requests should carry
now. The driver tells every worker after each swap (`follow`), and repeats it with each
group it hands out, so a worker that restarted learns the version with its first group.

    driver: AdapterManager.publish(v7) ── AdapterSwapped ──> worker: follower.follow(v7)
    worker: VLLMPolicy.act ── lease() ── "policy@v7" ──> vLLM

It leases like the manager (`VLLMPolicy` cannot tell them apart), but it loads nothing:
a 404 for a version the driver has since unloaded (a request that outlived two updates
under `max_staleness` 1) is not restored here, and that turn fails (`error:policy`, an
infrastructure failure the learner does not train on).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from policy.adapters import AdapterLease
from policy.errors import AdapterError

__all__ = ["AdapterFollower"]


class AdapterFollower:
    """The current version as last told; newer versions replace it, older ones are ignored."""

    def __init__(self) -> None:
        self._current: AdapterLease | None = None

    @property
    def current(self) -> AdapterLease | None:
        return self._current

    def follow(self, lease: AdapterLease) -> bool:
        """Route new requests to `lease` if it is newer than the current one; True if it was."""
        if self._current is not None and lease.version <= self._current.version:
            return False
        self._current = lease
        return True

    @contextmanager
    def lease(self, name: str | None = None) -> Iterator[AdapterLease]:
        """The current version (or `name`, which must be the current one) for one request."""
        current = self._current
        if current is None:
            raise AdapterError("no adapter version received from the driver yet")
        if name is not None and name != current.name:
            raise AdapterError(f"adapter {name!r} is not the version served now ({current.name})")
        yield current

    async def restore(self) -> list[str]:
        """Nothing to restore here: the driver's manager owns what the server holds."""
        return []
