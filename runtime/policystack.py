"""The policy stack: vLLM server, adapter manager, first adapter, `Policy`, in one `async with`.

    async with policy_stack(config, adapter="runs/x/adapters/policy@v12") as stack:
        stack.policy        # VLLMPolicy: the runtime's Policy
        stack.adapters      # AdapterManager: publish newer versions for hot-swap
        stack.published     # the first SwapResult (policy@v12 here)

Without an adapter nothing is published (`published` is None): the caller publishes the
first version itself before any request (the daemon's learner does; to serve the base
model, the composition root passes v0 from `learner.lora.zero_adapter`: every request
names an adapter, see `policy.adapters`).

From the configuration it starts the vLLM server as a child process (or, with
`policy.url`, connects to a running one; with `cluster.replica_urls`, to several running
ones as a `policy.replicas.ReplicaSet`: every adapter loaded and verified on each; with
`cluster.replicas`, it launches that many more as Ray actors, `runtime.replica_actors`,
which get the adapters' files through Ray),
opens the HTTP client, renders prompts with the model's own tokenizer and chat
template, enters the adapter manager (its janitor task unloads versions nobody uses any
more) and publishes the given adapter after checking its manifest against its weights.
On exit, adapters are unloaded from an external server, the client is closed, and a
server we started is stopped with its whole process group.

The model is `policy.model`, or, when that is empty, the `base_model` recorded in the
adapter's manifest.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import msgspec
import structlog

from policy.adapters import AdapterManager, SwapResult, read_manifest
from policy.client import CompletionClient, SamplingParams, VLLMPolicy
from policy.errors import PolicyError
from policy.prompt import PromptRenderer
from policy.replicas import Placement, ReplicaSet
from policy.server import VLLMServer
from runtime.base.config import Config
from runtime.base.messages import Event
from runtime.ray_session import ray_session
from runtime.replica_actors import LaunchedReplica, launch_replicas

__all__ = ["PolicyStack", "policy_stack"]

log = structlog.get_logger("runtime.policystack")


@dataclass(frozen=True, slots=True)
class PolicyStack:
    """What `policy_stack` yields."""

    policy: VLLMPolicy
    adapters: AdapterManager
    # The server's client, or a `ReplicaSet` over `cluster.replica_urls`.
    client: CompletionClient | ReplicaSet
    # The server launched (or the external one, or the first replica).
    server: VLLMServer
    renderer: PromptRenderer
    published: SwapResult | None
    model: str
    # Every policy server's URL (the one server, or each replica).
    urls: tuple[str, ...]


def _model_of(config: Config, adapter: Path | None) -> str:
    if config.policy.model:
        return config.policy.model
    if adapter is not None:
        return read_manifest(adapter).base_model
    raise PolicyError(
        "policy.model is empty: set it in the config, or pass an adapter whose manifest "
        "names its base model"
    )


@asynccontextmanager
async def policy_stack(
    config: Config,
    *,
    adapter: str | Path | None = None,
    prefix: str | None = None,
    log_path: str | Path | None = None,
    http: httpx.AsyncClient | None = None,
    on_event: Callable[[Event], None] | None = None,
) -> AsyncIterator[PolicyStack]:
    """Start or connect to the server and yield a ready `Policy` (see the module docstring).

    `prefix` names the adapters on the server (default `policy.adapter_prefix`; use
    another one to share an external server with a running daemon). Raises
    `PolicyError` (e.g. `AdapterManifestError` for an unusable adapter folder).
    """
    folder = Path(adapter) if adapter is not None else None
    if folder is not None:
        await anyio.to_thread.run_sync(read_manifest, folder)  # refuse a bad folder early
    model = await anyio.to_thread.run_sync(_model_of, config, folder)
    server_log = Path(log_path or Path(config.daemon.run_dir) / "vllm.log")
    await anyio.Path(server_log.parent).mkdir(parents=True, exist_ok=True)
    pcfg = config.policy
    if (config.cluster.replica_urls or config.cluster.replicas) and pcfg.url:
        raise PolicyError("set policy.url or cluster replicas (replica_urls, replicas), not both")
    async with contextlib.AsyncExitStack() as launching:
        launched: list[LaunchedReplica] = []
        if config.cluster.replicas:  # vLLM replicas as Ray actors
            await launching.enter_async_context(ray_session(config))
            launched = await launching.enter_async_context(launch_replicas(config, model=model))
        external = config.cluster.replica_urls
        async with _stack(
            config,
            model=model,
            folder=folder,
            prefix=prefix,
            server_log=server_log,
            http=http,
            on_event=on_event,
            replicas=[*external, *(r.url for r in launched)],
            placements=[*(None for _ in external), *(r.placement for r in launched)],
        ) as stack:
            yield stack


@asynccontextmanager
async def _stack(
    config: Config,
    *,
    model: str,
    folder: Path | None,
    prefix: str | None,
    server_log: Path,
    http: httpx.AsyncClient | None,
    on_event: Callable[[Event], None] | None,
    replicas: Sequence[str],
    placements: Sequence[Placement | None],
) -> AsyncIterator[PolicyStack]:
    pcfg = config.policy
    renderer = await anyio.to_thread.run_sync(PromptRenderer.from_model, model)
    async with (
        # With replicas, `server` is the first of them (external: awaited, never launched).
        VLLMServer(
            msgspec.structs.replace(pcfg, url=replicas[0]) if replicas else pcfg,
            model=model,
            log_path=server_log,
        ) as server,
        _client(http, pcfg.request_timeout_s) as session,
        anyio.create_task_group() as watching,
    ):
        client: CompletionClient | ReplicaSet
        if replicas:
            client = ReplicaSet.from_config(session, replicas, pcfg, placements=placements)
            await watching.start(client.watch)  # brings replicas back once they answer
        else:
            client = CompletionClient.from_config(session, server.url, pcfg)
        async with AdapterManager(
            client,
            prefix=prefix or pcfg.adapter_prefix,
            staleness_window=config.learner.max_staleness,
            max_loras=pcfg.max_loras,
            timeout_s=pcfg.request_timeout_s,
            on_event=on_event,
        ) as adapters:
            published: SwapResult | None = None
            if folder is not None:
                published = await adapters.publish(folder)
            policy = VLLMPolicy(
                client,
                renderer,
                adapters,
                sampling=SamplingParams.from_config(pcfg),
                max_model_len=pcfg.max_model_len,
                max_concurrency=pcfg.max_concurrency,
                timeout_s=pcfg.request_timeout_s,
            )
            log.info(
                "policy.ready",
                model=model,
                server=server.url,
                managed=server.managed,
                adapter=published.name if published else None,
            )
            try:
                yield PolicyStack(
                    policy=policy,
                    adapters=adapters,
                    client=client,
                    server=server,
                    renderer=renderer,
                    published=published,
                    model=model,
                    urls=tuple(replicas) or (server.url,),
                )
            finally:
                if isinstance(client, ReplicaSet):
                    log.info("policy.replicas", replicas=msgspec.to_builtins(client.statistics()))
                if not server.managed:  # leave a shared server as we found it
                    with anyio.move_on_after(pcfg.request_timeout_s, shield=True):
                        try:
                            await adapters.unload_all()
                        except PolicyError as exc:
                            log.warning("policy.unload_failed", error=str(exc))
        watching.cancel_scope.cancel()


@asynccontextmanager
async def _client(
    given: httpx.AsyncClient | None, timeout_s: float
) -> AsyncIterator[httpx.AsyncClient]:
    if given is not None:
        yield given
        return
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        yield client
