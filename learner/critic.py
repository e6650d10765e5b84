"""WebRL's critic: V(s_t, I), the chance that an episode succeeds from the state before
turn t, as a language model with a LoRA of its own and a linear head.

The state is the turn's prompt exactly as the policy saw it (`Turn.prompt_token_ids`: the
task, the compressed history and the current page), so the critic needs no renderer of its
own. The head reads the last transformer layer's hidden state at the prompt's last token
and gives a logit; V = sigmoid(logit). Training is `learner.webrl.critic_loss` (binary
cross-entropy against the episode's outcome) over every turn of the evaluated episodes;
values feed `learner.webrl.step_advantages`.

Prompts go through the model one at a time (no padding to get wrong; the embedded
model's turns are ~500 tokens, and the critic's cost is a forward and a backward per turn,
as the actor's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from learner.webrl import critic_loss
from runtime.base.messages import TrajectoryGroup

__all__ = ["Critic", "CriticExample", "critic_examples"]


@dataclass(frozen=True)
class CriticExample:
    """One state: the turn's prompt ids and its episode's outcome (0 or 1)."""

    task_id: int
    episode_id: str
    turn: int
    prompt_ids: tuple[int, ...]
    outcome: int


def critic_examples(groups: Sequence[TrajectoryGroup]) -> list[CriticExample]:
    """Every turn with recorded prompt ids of every evaluated episode (the outcome is the
    reward: 1 when above 0). Infrastructure failures say nothing about the state."""
    out: list[CriticExample] = []
    for group in groups:
        for trajectory in group.trajectories:
            if not trajectory.scored:
                continue
            outcome = int(trajectory.reward > 0)
            out.extend(
                CriticExample(
                    task_id=trajectory.task_id,
                    episode_id=trajectory.episode_id,
                    turn=turn.index,
                    prompt_ids=tuple(turn.prompt_token_ids),
                    outcome=outcome,
                )
                for turn in trajectory.turns
                if turn.prompt_token_ids
            )
    return out


class Critic:
    """A causal LM (a peft model with its own LoRA, or a small model trained fully) and a
    linear value head on its last hidden state."""

    def __init__(self, model: Any, *, seed: int = 0) -> None:
        import torch

        self.model = model
        hidden = int(model.config.hidden_size)
        generator = torch.Generator().manual_seed(seed)
        self.head = torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(1, hidden, generator=generator) / hidden**0.5)
            self.head.bias.zero_()
        self.head.to(next(model.parameters()).device)

    def parameters(self) -> list[Any]:
        """The trainable parameters: the LM's (its LoRA's) and the head's."""
        return [p for p in self.model.parameters() if p.requires_grad] + list(
            self.head.parameters()
        )

    def logit(self, prompt_ids: Sequence[int]) -> Any:
        """The value logit of one state, a 0-d tensor (with grad when grad is on)."""
        import torch

        device = self.head.weight.device
        ids = torch.tensor([list(prompt_ids)], device=device)
        out = self.model(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
        last = out.hidden_states[-1][0, -1]
        return self.head(last.to(self.head.weight.dtype)).squeeze(-1)

    def values(self, prompts: Sequence[Sequence[int]]) -> list[float]:
        """V = sigmoid(logit) of each state (its prompt ids), without grad."""
        import torch

        with torch.no_grad():
            return [float(torch.sigmoid(self.logit(ids))) for ids in prompts]

    def step(self, optimizer: Any, batch: Sequence[CriticExample]) -> float:
        """One optimizer step on a batch (weights 1/len(batch)); returns the batch's loss.
        Each example's loss is backpropagated on its own: the sum is the batch's."""
        import torch

        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        weight = torch.tensor([1.0 / len(batch)])
        for example in batch:
            logit = self.logit(example.prompt_ids).reshape(1)
            outcome = torch.tensor([example.outcome], device=logit.device)
            loss = critic_loss(logit, outcome, weight.to(logit.device))
            loss.backward()  # type: ignore[no-untyped-call]
            total += float(loss.detach())
        optimizer.step()
        return total
