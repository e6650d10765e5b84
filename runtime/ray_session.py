"""This process's connection to a Ray cluster, for the rollout workers
(`runtime.cluster`) and the vLLM replica actors (`runtime.replica_actors`).

`ray_session(config)` connects to `cluster.address`, or starts a local cluster for this
process when it is empty (sized for the actors the config asks for), and shuts it down on
exit; when this process is connected already it does nothing, so the daemon's policy
stack and its rollout can both enter it. Ray is optional (`pip install
'webagent-r1[ray]'`) and imported only through `import_ray`.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from runtime.base.config import Config, ConfigError

__all__ = ["close_actors", "import_ray", "ray_session"]


def import_ray() -> Any:
    """The `ray` module, or a `ConfigError` naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "config",
            "cluster.backend",
            "\"ray\" needs Ray: pip install 'webagent-r1[ray]'",
        ) from exc
    return ray


@asynccontextmanager
async def ray_session(config: Config) -> AsyncIterator[None]:
    """This process connected to the configured Ray cluster (a local one started for it
    when `cluster.address` is empty) until exit; nothing is done when it already is."""
    ray = import_ray()
    cluster = config.cluster
    if ray.is_initialized():
        yield
        return
    # On the event loop's thread, though it blocks it for seconds (5-8 s on 2 cores): the
    # GCS and raylet a local start makes die with the THREAD that started them (a
    # parent-death signal; checked: `ray.init` in a thread that then exits leaves no GCS),
    # and an idle `anyio.to_thread` worker thread exits after 10 s. From one, the cluster
    # died under a running daemon, 2 runs in 4.
    # Ray takes SIGTERM and SIGINT for itself on this thread (a handler that exits, and its
    # C++ failure handler that aborts: SIGTERM ended a daemon with exit -6, undrained,
    # bench.cluster_faults 2026-12-03); the daemon's own handlers are put back.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if cluster.address:
        ray.init(address=cluster.address, log_to_driver=False)
    else:
        # Enough logical CPUs for the actors asked for, even on a small machine.
        wanted = cluster.workers * cluster.cpus_per_worker
        wanted += cluster.replicas * cluster.cpus_per_replica
        cpus = max(os.cpu_count() or 1, math.ceil(wanted))
        gpus = math.ceil(cluster.replicas * cluster.gpus_per_replica)
        ray.init(num_cpus=cpus, num_gpus=gpus or None, include_dashboard=False, log_to_driver=False)
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)
    try:
        yield
    finally:
        ray.shutdown()


async def close_actors(ray: Any, actors: Sequence[Any], *, timeout_s: float = 60.0) -> None:
    """Ask each actor to `close()` (within `timeout_s` in all, even when cancelled), then
    kill it for good: what it started is stopped, and Ray does not restart it."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(timeout_s):
        for actor in actors:
            with contextlib.suppress(Exception):
                await actor.close.remote()
    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
