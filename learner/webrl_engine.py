"""The torch side of WebRL (arXiv 2411.02337): one update is one phase.

`WebRLEngine` is `learner.engine.Engine` (the policy's model, LoRA, AdamW, schedule,
adapters and checkpoints) with a critic and a replay buffer beside it. One phase
(`update(groups, set_aside)`, the groups every evaluated episode of which it trains on):

1. the critic (`learner.critic.Critic`: a second copy of the base model with a LoRA of its
   own and a linear head) takes `critic_steps` optimizer steps on the phase's states, each
   labelled with its episode's outcome;
2. every action of the phase gets its advantage from the critic's values of its episode's
   states (`learner.webrl_update.actor_samples`); pi_ref is the policy that produced it
   (the server's sampled log-probs);
3. replay: at most `replay_ratio` x the phase's actions are drawn from the actions of the
   buffer's successful episodes (earlier phases'), and those whose perplexity under the
   actor lies in [perplexity_low, perplexity_high] are kept; their pi_ref is the actor's
   own log-probs from that same forward (the policy before this phase's update), their
   advantage the critic's. Drawing before filtering bounds the forward passes to the
   number drawn (the paper filters the whole buffer; on a CPU that is a forward over
   every stored action every phase);
4. `learner.optimizer_steps` actor steps of the KL-constrained loss over new and replayed
   actions together (`learner.webrl_update.actor_step`, micro-batched, grad-clipped);
5. the phase's successful episodes join the buffer (the newest `replay_size` kept);
   version + 1: adapter, then the checkpoint, which holds the critic (LoRA, head,
   optimizer) and the buffer besides the policy's state, so a restart resumes all of it.
   A checkpoint M-GRPO wrote (`LearnerState.algorithm`; before that was recorded: one with
   none of those files) resumes the policy and starts a fresh critic and an empty buffer;
   a WebRL checkpoint missing any of them is refused.

`task_values(prompts)` gives the critic's V(s_0, I) of new tasks' first prompts (the
curriculum's filter, `runtime.evolution`). Everything runs in the learner's one worker
thread, as the M-GRPO engine does.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import structlog

from learner.batch import TurnSample, collate, micro_batches, policy_logprobs
from learner.checkpoint import Ledger, SavedCheckpoint
from learner.critic import Critic, CriticExample, critic_examples
from learner.engine import Engine, UpdateResult
from learner.errors import CheckpointError
from learner.lora import attach_lora
from learner.webrl import keeps_by_perplexity, perplexity, replay_sample, step_advantages
from learner.webrl_update import actor_samples, actor_step
from runtime.base.config import LearnerConfig, WebRLConfig
from runtime.base.messages import Trajectory, TrajectoryGroup

__all__ = ["WebRLEngine"]

CRITIC_LORA = "critic_lora.safetensors"
CRITIC_HEAD = "critic_head.pt"
CRITIC_OPTIMIZER = "critic_optimizer.pt"
REPLAY_FILE = "replay.jsonl"
_EXTRA_FILES = (CRITIC_LORA, CRITIC_HEAD, CRITIC_OPTIMIZER, REPLAY_FILE)

log = structlog.get_logger("learner.webrl_engine")

_Key = tuple[str, str, int]  # a turn: group id, episode id, turn index


class _Stored(msgspec.Struct, frozen=True):
    """One successful episode in the replay buffer, with the group it came in."""

    group_id: str
    trajectory: Trajectory


class WebRLEngine(Engine):
    """The policy (as `Engine`), a critic, and a buffer of successful episodes."""

    algorithm: ClassVar[str] = "webrl"

    def __init__(
        self,
        config: LearnerConfig,
        webrl: WebRLConfig,
        *,
        base_model: str | Path,
        out_dir: str | Path,
        adapter_prefix: str = "policy",
        temperature: float = 1.0,
    ) -> None:
        super().__init__(
            config,
            base_model=base_model,
            out_dir=out_dir,
            adapter_prefix=adapter_prefix,
            temperature=temperature,
        )
        self.webrl = webrl
        self.critic: Critic | None = None
        self._critic_optimizer: Any = None
        self.replay: list[_Stored] = []
        self._rng = random.Random(config.seed)

    # ------------------------------------------------------------------ state

    def _open_extra(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(self.base_model, dtype=torch.float32)
        critic = Critic(attach_lora(base, self.config).to(self._device), seed=self.config.seed)
        self._follow_threads(critic.model)
        self.critic = critic
        self._critic_optimizer = torch.optim.AdamW(
            critic.parameters(), lr=self.webrl.critic_learning_rate
        )

    def _write_extra(self, folder: Path) -> None:
        import torch
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        critic = self._require_critic()
        lora = {
            k: v.detach().cpu().contiguous()
            for k, v in get_peft_model_state_dict(critic.model).items()
        }
        save_file(lora, str(folder / CRITIC_LORA))
        torch.save(critic.head.state_dict(), folder / CRITIC_HEAD)
        torch.save(self._critic_optimizer.state_dict(), folder / CRITIC_OPTIMIZER)
        with (folder / REPLAY_FILE).open("wb") as out:
            for stored in self.replay:
                out.write(msgspec.json.encode(stored) + b"\n")

    def _restore_extra(self, saved: SavedCheckpoint) -> None:
        import torch
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        critic = self._require_critic()
        folder = saved.path
        missing = [name for name in _EXTRA_FILES if not (folder / name).is_file()]
        written_by = saved.state.algorithm  # "": written before it was recorded
        from_mgrpo = written_by != "webrl" if written_by else len(missing) == len(_EXTRA_FILES)
        if from_mgrpo:
            log.info(  # an M-GRPO run's checkpoint: the critic and the buffer start anew
                "webrl.fresh_critic", checkpoint=str(folder), version=saved.state.version
            )
            return
        if missing:
            raise CheckpointError(f"{folder}: WebRL's {', '.join(missing)} missing")
        set_peft_model_state_dict(critic.model, load_file(str(folder / CRITIC_LORA)))
        critic.head.load_state_dict(torch.load(folder / CRITIC_HEAD, weights_only=True))
        self._critic_optimizer.load_state_dict(
            torch.load(folder / CRITIC_OPTIMIZER, weights_only=True)
        )
        replay: list[_Stored] = []
        for number, line in enumerate((folder / REPLAY_FILE).read_bytes().splitlines(), 1):
            try:
                replay.append(msgspec.json.decode(line, type=_Stored))
            except msgspec.DecodeError as exc:
                raise CheckpointError(f"{folder / REPLAY_FILE}:{number}: {exc}") from exc
        self.replay = replay

    def _require_critic(self) -> Critic:
        if self.critic is None:
            raise CheckpointError("open() first: the critic is made there")
        return self.critic

    # ------------------------------------------------------------------ queries

    def task_values(self, prompts: Sequence[Sequence[int]]) -> list[float]:
        """The critic's V(s_0, I) of each prompt (a task's first turn)."""
        self._set_threads()
        critic = self._require_critic()
        critic.model.eval()
        return critic.values(prompts)

    # ------------------------------------------------------------------ the phase

    def update(self, groups: Sequence[TrajectoryGroup], set_aside: Ledger) -> UpdateResult:
        """Train critic and actor on one phase's groups; save adapter vN+1 and checkpoint."""
        assert self.state is not None, "open() first"
        self._set_threads()
        cfg, w = self.config, self.webrl
        critic = self._require_critic()
        started = time.perf_counter()

        critic_loss = self._train_critic(critic_examples(groups))
        critic.model.eval()
        critic_s = time.perf_counter() - started
        new = actor_samples(groups, critic, lam=w.lam, gamma=w.gamma)
        drawn, replayed = self._replay(critic, len(new))
        samples = _reweighted([*new, *replayed])
        values_s = time.perf_counter() - started - critic_s

        model = self._model
        totals = [0.0, 0.0, 0.0]
        steps = cfg.optimizer_steps if samples else 0
        batches = self._collated(samples)
        # The frozen bottom layers' output, once for all the steps (`learner.frozen`).
        below = self._below(batches)
        model.train()
        for _ in range(steps):
            with self._autocast():
                parts = actor_step(
                    model, self._optimizer, batches, beta=w.beta,
                    temperature=self.temperature, grad_clip=cfg.grad_clip, below=below,
                )  # fmt: skip
            self._scheduler.step()
            totals = [t + float(p) for t, p in zip(totals, parts, strict=True)]
        model.eval()

        successes = [
            _Stored(group_id=g.group_id, trajectory=t)
            for g in groups
            for t in g.trajectories
            if t.scored and t.reward > 0 and t.turns
        ]
        self.replay = [*self.replay, *successes][-w.replay_size :] if w.replay_size else []
        rewards = [t.reward for g in groups for t in g.trajectories]
        per_step = max(1, steps)
        metrics = {
            "loss": totals[0] / per_step,
            "log_ratio": totals[1] / per_step,
            "target_gap": totals[2] / per_step,
            "critic_loss": critic_loss,
            "advantage_mean": sum(s.advantage for s in new) / max(1, len(new)),
            "lr": float(self._scheduler.get_last_lr()[0]),
            "samples": float(len(samples)),
            "samples_new": float(len(new)),
            "replay_drawn": float(drawn),
            "replay_kept": float(len(replayed)),
            "replay_buffer": float(len(self.replay)),
            "tokens": float(sum(len(s.completion_ids) for s in samples)),
            "reward_mean": sum(rewards) / max(1, len(rewards)),
            "train_s": time.perf_counter() - started,
            "critic_s": critic_s,  # the critic's steps
            "values_s": values_s,  # its values of every state; the replay's perplexities
        }
        return self._commit(groups, set_aside, steps, metrics)

    def _train_critic(self, examples: list[CriticExample]) -> float:
        """`critic_steps` steps of `critic_batch` states, in shuffled passes; the mean
        loss of the steps (0.0 when there is nothing to train on)."""
        w = self.webrl
        if not examples or not w.critic_steps:
            return 0.0
        critic = self._require_critic()
        critic.model.train()
        order: list[CriticExample] = []
        losses = []
        for _ in range(w.critic_steps):
            batch: list[CriticExample] = []
            while len(batch) < min(w.critic_batch, len(examples)):
                if not order:
                    order = list(examples)
                    self._rng.shuffle(order)
                batch.append(order.pop())
            with self._autocast():
                losses.append(critic.step(self._critic_optimizer, batch))
        return sum(losses) / len(losses)

    def _replay(self, critic: Critic, new: int) -> tuple[int, list[TurnSample]]:
        """(how many buffered actions were drawn, those kept by perplexity), each with its
        advantage from the critic and the actor's log-probs as pi_ref."""
        import torch

        w = self.webrl
        candidates = [
            (stored, index)
            for stored in self.replay
            for index in range(len(stored.trajectory.turns))
        ]
        drawn = replay_sample(candidates, new=new, ratio=w.replay_ratio, rng=self._rng)
        if not drawn:
            return 0, []
        rows = [
            TurnSample(
                group_id=stored.group_id, episode_id=stored.trajectory.episode_id,
                turn=stored.trajectory.turns[index].index,
                prompt_ids=tuple(stored.trajectory.turns[index].prompt_token_ids),
                completion_ids=tuple(stored.trajectory.turns[index].completion_token_ids),
                mask=(True,) * len(stored.trajectory.turns[index].completion_token_ids),
                old_logprobs=(), advantage=0.0, weight=1.0,
            )
            for stored, index in drawn
        ]  # fmt: skip
        actor = self._actor_logprobs(rows)
        kept: list[TurnSample] = []
        advantages: dict[str, list[float]] = {}
        for (stored, index), row in zip(drawn, rows, strict=True):
            logprobs = actor.get((row.group_id, row.episode_id, row.turn))
            if logprobs is None or not keeps_by_perplexity(
                perplexity(logprobs), low=w.perplexity_low, high=w.perplexity_high
            ):
                continue
            trajectory = stored.trajectory
            if trajectory.episode_id not in advantages:
                values = torch.tensor(
                    critic.values([t.prompt_token_ids for t in trajectory.turns]),
                    dtype=torch.float64,
                )
                advantages[trajectory.episode_id] = step_advantages(
                    values, 1.0, lam=w.lam, gamma=w.gamma
                ).tolist()
            advantage = advantages[trajectory.episode_id][index]
            kept.append(replace(row, old_logprobs=tuple(logprobs), advantage=advantage))
        return len(drawn), kept

    def _actor_logprobs(self, rows: Sequence[TurnSample]) -> dict[_Key, list[float]]:
        """Each row's completion log-probs under the actor now (no grad), by its key."""
        import torch

        out: dict[_Key, list[float]] = {}
        self._model.eval()
        with torch.no_grad(), self._autocast():
            for chunk in micro_batches(rows, self.config.micro_batch_tokens):
                mb = collate(chunk, pad_id=self._pad_id).to(self._device)
                logp = policy_logprobs(self._model, mb, temperature=self.temperature).float()
                width = mb.completion_width
                for r, sample in enumerate(chunk):
                    c = len(sample.completion_ids)
                    out[(sample.group_id, sample.episode_id, sample.turn)] = (
                        logp[r, width - c :].cpu().tolist()
                    )
        return out


def _reweighted(samples: Sequence[TurnSample]) -> list[TurnSample]:
    """The samples with weights 1/N each: every action of the phase counts the same."""
    weight = 1.0 / len(samples) if samples else 0.0
    return [replace(s, weight=weight) for s in samples]
