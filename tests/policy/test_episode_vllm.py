"""A runtime episode on the built-in sites driven by the tiny model through vLLM: it fails
the task (random weights), but every turn is recorded with the exact token ids."""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import httpx
import msgspec
import pytest

from policy.adapters import AdapterManager
from policy.client import CompletionClient, SamplingParams, VLLMPolicy
from policy.profile import settle_auto
from policy.prompt import PromptRenderer, build_messages
from policy.server import VLLMServer
from runtime.base.config import BrowserConfig, Config, ObservationConfig, PolicyConfig, SitesConfig
from runtime.browser import BrowserPool
from runtime.environment import serve_builtin_environment
from runtime.episode import EpisodeSettings
from runtime.task_runs import run_tasks

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.browser, pytest.mark.slow]


async def test_episode_driven_by_the_tiny_model_records_exact_ids(
    vllm_server: VLLMServer, zero_adapter: Path, tiny_model: Path
) -> None:
    renderer = PromptRenderer.from_model(tiny_model)
    prefix = f"e{uuid.uuid4().hex[:8]}"
    config = settle_auto(Config(policy=PolicyConfig(model=str(tiny_model))))
    config = msgspec.structs.replace(
        config,
        observation=ObservationConfig(style="html", max_tokens=600),
        browser=BrowserConfig(action_timeout_s=3.0, navigation_timeout_s=10.0),
    )
    async with (
        httpx.AsyncClient() as http,
        serve_builtin_environment(SitesConfig()) as environment,
        BrowserPool(config.browser) as pool,
    ):
        client = CompletionClient(http, vllm_server.url)
        async with AdapterManager(client, prefix=prefix) as adapters:
            await adapters.publish(zero_adapter)
            policy = VLLMPolicy(
                client,
                renderer,
                adapters,
                sampling=SamplingParams(max_tokens=48, temperature=1.0),
                max_model_len=2048,
            )
            [task] = environment.tasks("test")[:1]
            result = await run_tasks(
                config,
                environment,
                policy,
                [task],
                group_size=2,
                concurrency=2,
                max_turns=3,
                count_tokens=renderer.count_tokens,
                pool=pool,
            )
            await adapters.unload_all()

    [group] = result.groups
    assert len(group.trajectories) == 2
    sent_prompt = EpisodeSettings.from_config(config).system_prompt  # the model's profile
    for trajectory in group.trajectories:
        assert trajectory.status in ("max_turns", "exited", "repeated_actions"), trajectory
        assert trajectory.reward == 0.0
        assert trajectory.adapter_versions == [0]
        assert 1 <= len(trajectory.turns) <= 3
        for i, turn in enumerate(trajectory.turns):
            # The prompt is rebuilt from the record alone: compressed history + observation.
            history = [t.text for t in trajectory.turns[:i]]
            messages = build_messages(
                trajectory.intent, history, turn.observation, system_prompt=sent_prompt
            )
            assert turn.prompt_token_ids == renderer.render(messages)
            assert renderer.decode(turn.completion_token_ids) == turn.text
            assert len(turn.completion_logprobs) == len(turn.completion_token_ids) > 0
            assert all(math.isfinite(lp) for lp in turn.completion_logprobs)
            assert turn.adapter == f"{prefix}@v0"
            assert turn.adapter_version == 0
            assert turn.observation.strip()
            assert (turn.action is None) != (turn.parse_error is None)
