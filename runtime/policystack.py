"""The policy stack: vLLM server, adapter manager, first adapter, `Policy`, in one `async with`.

    async with policy_stack(config, adapter="runs/x/adapters/policy@v12") as stack:
        stack.policy        # VLLMPolicy: the runtime's Policy
        stack.adapters      # AdapterManager: publish newer versions for hot-swap
        stack.published     # the first SwapResult (policy@v12 here, or policy@v0)

With `publish=False` nothing is published (`published` is None): the caller publishes
the first version itself before any request (the daemon's learner does).

From the configuration it starts the vLLM server as a child process (or, with
`policy.url`, connects to a running one), opens the HTTP client, renders prompts with
the model's own tokenizer and chat template, enters the adapter manager (its janitor
task unloads versions nobody uses any more) and publishes the given adapter after
checking its manifest against its weights, or v0: a zero LoRA equal to the base model
(every request names an adapter; see `policy.adapters`). On exit, adapters are unloaded
from an external server, the client is closed, and a server we started is stopped with
its whole process group.

The model is `policy.model`, or, when that is empty, the `base_model` recorded in the
adapter's manifest. v0 is made once per base model and LoRA shape under
`{daemon.data_dir}/adapters/` (torch, transformers and peft are imported then, in a
worker thread, with the model built on the meta device: no weights are loaded).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import structlog

from policy.adapters import AdapterManager, SwapResult, read_manifest, weights_sha256
from policy.client import CompletionClient, SamplingParams, VLLMPolicy
from policy.errors import AdapterManifestError, PolicyError
from policy.prompt import PromptRenderer
from policy.server import VLLMServer
from runtime.config import Config, LearnerConfig
from runtime.messages import Event

__all__ = ["PolicyStack", "policy_stack", "zero_adapter"]

log = structlog.get_logger("runtime.policystack")


@dataclass(frozen=True, slots=True)
class PolicyStack:
    """What `policy_stack` yields."""

    policy: VLLMPolicy
    adapters: AdapterManager
    client: CompletionClient
    server: VLLMServer
    renderer: PromptRenderer
    published: SwapResult | None
    model: str


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
    publish: bool = True,
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
    renderer = await anyio.to_thread.run_sync(PromptRenderer.from_model, model)
    server_log = Path(log_path or Path(config.daemon.run_dir) / "vllm.log")
    await anyio.Path(server_log.parent).mkdir(parents=True, exist_ok=True)
    pcfg = config.policy
    async with (
        VLLMServer(pcfg, model=model, log_path=server_log) as server,
        _client(http, pcfg.request_timeout_s) as session,
    ):
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
            if publish:
                if folder is None:
                    folder = await zero_adapter(
                        model, Path(config.daemon.data_dir) / "adapters", config.learner
                    )
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
                )
            finally:
                if not server.managed:  # leave a shared server as we found it
                    with anyio.move_on_after(pcfg.request_timeout_s, shield=True):
                        try:
                            await adapters.unload_all()
                        except PolicyError as exc:
                            log.warning("policy.unload_failed", error=str(exc))


@asynccontextmanager
async def _client(
    given: httpx.AsyncClient | None, timeout_s: float
) -> AsyncIterator[httpx.AsyncClient]:
    if given is not None:
        yield given
        return
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        yield client


async def zero_adapter(model: str, parent: Path, learner: LearnerConfig) -> Path:
    """v0 for `model`: a zero LoRA of the learner's rank and targets, made once and kept
    under `parent` (checked against its manifest when reused)."""
    return await anyio.to_thread.run_sync(_zero_adapter_sync, model, parent, learner)


def _zero_adapter_sync(model: str, parent: Path, learner: LearnerConfig) -> Path:
    from learner.lora import base_fingerprint

    local = Path(model).is_dir()
    fingerprint = base_fingerprint(model) if local else f"hub:{model}"
    shape = f"r{learner.lora_rank}a{learner.lora_alpha}-{len(learner.lora_targets)}t"
    key = fingerprint.removeprefix("hub:").replace("/", "--")[:40]
    root = parent / f"zero-{key}-{shape}"
    folder = root / "policy@v0"
    if folder.is_dir():
        try:
            manifest = read_manifest(folder)
            if manifest.version == 0 and manifest.base_fingerprint == fingerprint:
                return folder
        except AdapterManifestError as exc:
            log.warning("policy.zero_adapter_unusable", folder=str(folder), error=str(exc))
        raise PolicyError(f"{folder} exists but is not v0 of {model}; remove it")
    _make_zero_adapter(model, root, fingerprint, learner)
    return folder


def _make_zero_adapter(model: str, root: Path, fingerprint: str, learner: LearnerConfig) -> None:
    """Write `root/policy@v0` atomically: adapter_config.json, zero weights, manifest."""
    import shutil
    import time
    import uuid

    import msgspec
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from learner.lora import ADAPTER_WEIGHTS, MANIFEST, attach_lora, fsync_dir, fsync_tree
    from runtime.messages import AdapterManifest

    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".policy@v0.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with torch.device("meta"):
            base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))  # type: ignore[no-untyped-call]
        peft_model = attach_lora(base, learner)
        weights = {
            name: torch.zeros(tensor.shape, dtype=torch.float32)
            for name, tensor in get_peft_model_state_dict(peft_model).items()
        }
        tmp.mkdir()
        peft_config = peft_model.peft_config["default"]
        peft_config.base_model_name_or_path = model
        peft_config.save_pretrained(str(tmp))
        save_file(weights, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        fsync_tree(tmp)
        manifest = AdapterManifest(
            name="policy@v0",
            version=0,
            base_model=model,
            base_fingerprint=fingerprint,
            weights_sha256=weights_sha256(tmp),
            created_at=time.time(),
            lora_rank=learner.lora_rank,
            lora_alpha=learner.lora_alpha,
            target_modules=list(learner.lora_targets),
        )
        with (tmp / MANIFEST).open("wb") as handle:
            handle.write(msgspec.json.format(msgspec.json.encode(manifest)))
            handle.flush()
            os.fsync(handle.fileno())
        fsync_dir(tmp)
        tmp.rename(root / "policy@v0")
        fsync_dir(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
