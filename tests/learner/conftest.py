"""Fixtures of the learner tests: tiny real models and trajectory groups built from ids."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from runtime.messages import Trajectory, TrajectoryGroup, Turn

MakeGroup = Callable[..., TrajectoryGroup]


def _group(
    rng: random.Random,
    *,
    group_id: str,
    rewards: Sequence[float],
    vocab: int = 60,
    turns: tuple[int, int] = (1, 3),
    prompt_len: tuple[int, int] = (3, 12),
    completion_len: tuple[int, int] = (1, 6),
    version: int = 0,
    logprobs: bool = True,
) -> TrajectoryGroup:
    trajectories = []
    for i, reward in enumerate(rewards):
        episode = f"{group_id}-e{i}"
        made = []
        for t in range(rng.randint(*turns)):
            n = rng.randint(*completion_len)
            made.append(
                Turn(
                    index=t,
                    url="http://127.0.0.1/",
                    observation="<p>o</p>",
                    observation_digest="d",
                    text="x",
                    prompt_token_ids=[
                        rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_len))
                    ],
                    completion_token_ids=[rng.randrange(3, vocab) for _ in range(n)],
                    completion_logprobs=[-rng.uniform(0.1, 3.0) for _ in range(n)]
                    if logprobs
                    else [],
                    adapter=f"policy@v{version}",
                    adapter_version=version,
                )
            )
        trajectories.append(
            Trajectory(
                episode_id=episode,
                group_id=group_id,
                task_id=1,
                intent="t",
                turns=made,
                reward=reward,
                adapter_versions=[version],
            )
        )
    return TrajectoryGroup(group_id=group_id, task_id=1, trajectories=trajectories, created_at=0.0)


@pytest.fixture
def make_group() -> MakeGroup:
    """`make_group(seed, group_id=..., rewards=[...], ...)`: a group of random token ids."""

    def make(seed: int = 0, **kwargs: Any) -> TrajectoryGroup:
        return _group(random.Random(seed), **kwargs)

    return make


@pytest.fixture(scope="session")
def tiny_qwen() -> Callable[..., Any]:
    """`tiny_qwen(vocab=64, seed=0)`: a randomly initialised 2-layer Qwen2 (eval mode)."""

    def make(vocab: int = 64, seed: int = 0, hidden: int = 32) -> Any:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(seed)
        config = Qwen2Config(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=True,
            use_sliding_window=False,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=None,
        )
        return Qwen2ForCausalLM(config).eval()

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Qwen2 folder (P's `make_tiny_model`: BPE tokenizer + ChatML)."""
    from policy.tiny import TinyModelSpec, TokenizerRecipe, base_corpus, make_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    spec = TinyModelSpec(
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_position_embeddings=1024,
    )
    make_tiny_model(out, base_corpus(0, 100), spec=spec, recipe=TokenizerRecipe(vocab_size=512))
    return out
