"""Fixtures of the learner tests: tiny real models and trajectory groups built from ids."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from runtime.base.messages import ChatMessage, Trajectory, TrajectoryGroup, Turn

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


@pytest.fixture(scope="session")
def make_group() -> MakeGroup:
    """`make_group(seed, group_id=..., rewards=[...], ...)`: a group of random token ids."""

    def make(seed: int = 0, **kwargs: Any) -> TrajectoryGroup:
        return _group(random.Random(seed), **kwargs)

    return make


@pytest.fixture(scope="session")
def tiny_qwen() -> Callable[..., Any]:
    """`tiny_qwen(vocab=64, seed=0, layers=2)`: a randomly initialised Qwen2 (eval mode)."""

    def make(vocab: int = 64, seed: int = 0, hidden: int = 32, layers: int = 2) -> Any:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(seed)
        config = Qwen2Config(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
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


def random_demos(seed: int, count: int, vocab: int = 500) -> list[Any]:
    """`count` demonstrated turns (`learner.demos.BCExample`) of random ids."""
    from learner.demos import BCExample

    rng = random.Random(seed)
    demos = []
    for i in range(count):
        completion = tuple(rng.randrange(3, vocab) for _ in range(rng.randint(2, 6)))
        demos.append(BCExample(
            task_id=i, episode_id=f"d{i}", turn=0,
            prompt_ids=tuple(rng.randrange(3, vocab) for _ in range(rng.randint(4, 12))),
            completion_ids=completion, action_mask=(True,) * len(completion),
        ))  # fmt: skip
    return demos


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


# --------------------------------------------------------------------------- a synthetic task
# Two turns; each turn shows a page and the agent must click one of four elements; the
# episode succeeds when both clicks are on element 2 and both completions have the exact
# format. The instruction names a command, as a web task would, but the right action does
# not depend on it: measured here, a 0.1M-parameter model needed 150-200 steps of clean
# supervision before it even started to use the command word (and RL could not make a
# turn-dependent choice, element 2 then 4, sharper than ~0.85 in 40 updates), so the RL
# test depends on no look-up or conditioning skill, only on sharpening one choice.


class CommandTask:
    """Prompts, demonstrations and the reward of the synthetic two-turn task."""

    SYSTEM = "Act."
    COMMANDS = ("alpha", "bravo", "charlie", "delta")
    PAGES = ("<p>Step one</p>", "<p>Step two</p>")
    RIGHT = (2, 2)
    # The whole completion must have the format: with a reward that only searched for the
    # answer, RL let the format tokens drift (the first "<think" token was dropped within
    # 10 updates, then the end token), since no reward protected them.
    ANSWER = re.compile(
        r'<think>[^<>]*</think><answer>do\(action="Click", element="(\d)"\)</answer>'
    )

    @staticmethod
    def completion(element: int) -> str:
        return f'<think>ok</think><answer>do(action="Click", element="{element}")</answer>'

    def intent(self, command: str) -> str:
        return f"Command {command}"

    def messages(self, command: str, history: Sequence[str], turn: int) -> list[ChatMessage]:
        from policy.prompt import build_messages

        return build_messages(
            self.intent(command), history, self.PAGES[turn], system_prompt=self.SYSTEM
        )

    def right(self, turn: int, text: str) -> bool:
        match = self.ANSWER.fullmatch(text)
        return match is not None and int(match.group(1)) == self.RIGHT[turn]

    def corpus(self) -> list[str]:
        """ChatML texts of the task, for training the tokenizer."""
        import jinja2

        from policy.tiny import CHATML_TEMPLATE

        template = jinja2.Template(CHATML_TEMPLATE)
        texts = []
        for command in self.COMMANDS:
            for element in range(1, 5):
                history = [self.completion(element)]
                for turn in range(2):
                    chat = [
                        {"role": m.role, "content": m.content}
                        for m in self.messages(command, history[:turn], turn)
                    ]
                    chat.append({"role": "assistant", "content": self.completion(element)})
                    texts.append(template.render(messages=chat, add_generation_prompt=False))
        return texts * 3

    def demos(self, per_command: int, p_right: float, seed: int) -> list[TrajectoryGroup]:
        """Demonstrations of a noisy oracle: each turn right with probability p_right,
        else a uniformly random element (recorded with reward 1: they are demonstrations)."""
        rng = random.Random(seed)
        groups = []
        for task_id, command in enumerate(self.COMMANDS):
            trajectories = []
            for i in range(per_command):
                turns = []
                for t in range(2):
                    element = self.RIGHT[t] if rng.random() < p_right else rng.randint(1, 4)
                    turns.append(
                        Turn(
                            index=t,
                            url="http://127.0.0.1/",
                            observation=self.PAGES[t],
                            observation_digest=f"p{t}",
                            text=self.completion(element),
                        )
                    )
                trajectories.append(
                    Trajectory(
                        episode_id=f"{command}-{i}",
                        group_id=f"demo-{command}",
                        task_id=task_id,
                        intent=self.intent(command),
                        turns=turns,
                        reward=1.0,
                    )
                )
            groups.append(
                TrajectoryGroup(
                    group_id=f"demo-{command}",
                    task_id=task_id,
                    trajectories=trajectories,
                    created_at=0.0,
                )
            )
        return groups


@pytest.fixture(scope="session")
def command_task() -> CommandTask:
    return CommandTask()


@pytest.fixture(scope="session")
def command_model_dir(tmp_path_factory: pytest.TempPathFactory, command_task: CommandTask) -> Path:
    """A fresh tiny Qwen2 (hidden 64, 2 layers) with a tokenizer trained on the task."""
    from policy.tiny import TinyModelSpec, TokenizerRecipe, make_tiny_model

    out = tmp_path_factory.mktemp("command") / "tiny"
    spec = TinyModelSpec(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
    )
    recipe = TokenizerRecipe(vocab_size=600, min_frequency=1)
    make_tiny_model(out, command_task.corpus(), spec=spec, recipe=recipe, seed=0)
    return out


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """torch on one thread in every learner test, restored after it: on 2 cores shared
    with other work, a tiny model's step ran 25x slower on 2 threads (OpenMP spinning)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def command_bc(
    tmp_path_factory: pytest.TempPathFactory, command_task: CommandTask, command_model_dir: Path
) -> tuple[Path, Any]:
    """The task's BC checkpoint: 200 steps on noisy demonstrations (each turn right with
    probability 0.6, so a converged model is right ~0.7 per turn, ~half the episodes).
    One command's demonstrations are held out. Returns (folder, BCReport)."""
    import torch

    from learner.bc import behaviour_clone
    from policy.profile import TINY_PROMPT_LOSS
    from runtime.base.config import BCConfig

    out = tmp_path_factory.mktemp("command-bc") / "bc"
    config = BCConfig(
        learning_rate=3e-3,
        batch_size=32,
        warmup_steps=10,
        max_steps=200,
        max_minutes=10,
        eval_every_steps=100,
        heldout_fraction=0.25,
        eval_examples=64,
        prompt_loss=TINY_PROMPT_LOSS,  # what settle_auto gives a tiny model
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = behaviour_clone(
            command_task.demos(64, 0.6, seed=0),
            base_model=command_model_dir,
            out=out,
            config=config,
            system_prompt=command_task.SYSTEM,
        )
    finally:
        torch.set_num_threads(threads)
    return out, report
