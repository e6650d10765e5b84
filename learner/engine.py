"""The torch side of the learner: model, LoRA, AdamW, schedule, one M-GRPO update, state I/O.

Everything here is synchronous and runs in ONE worker thread (`learner.trainer` calls it
through `anyio.to_thread.run_sync`); nothing here touches the event loop.

One update (`Engine.update`):
1. advantages per group (`learner.loss.group_advantages`), per-turn samples with the
   triple-mean weights (`learner.batch.build_samples`), micro-batches by token budget;
2. with `lora_layers` leaving bottom layers frozen, their output, once per micro-batch:
   every forward below runs only the layers above them (`learner.frozen`);
   old log-probs: the server's (`Turn.completion_logprobs`, the default: the behaviour
   policy's own, so an update costs one forward+backward per micro-batch), or recomputed
   by the learner before any step (`recompute_logprobs`; eval mode, no grad);
3. reference log-probs with the adapter disabled (the base model), only when kl_beta > 0;
   with `bc_coef` > 0, `bc_turns` demonstrated turns drawn for this update (`bc_draw`);
4. `optimizer_steps` passes, each of `minibatches` optimizer steps (one: the whole batch):
   zero grads, forward/backward every micro-batch of the step's share (the loss is a
   token sum, so gradients accumulate to the exact gradient of the share; a share's is
   scaled by the number of shares), then `bc_coef` x the drawn turns' mean negative
   log-likelihood (at temperature 1, as BC trains) forward/backward on top, clip the grad
   norm, AdamW step, lr schedule step;
5. version += 1: save the adapter atomically, then the checkpoint (learner.checkpoint).

Data parallelism (optional, `data_parallel`: a `learner.distributed.DataParallel`): every
rank calls `update` with the same groups; each keeps its share of the micro-batches for
steps 2-4, the LoRA gradients are summed across ranks before the clip (the loss being a
token sum over the whole batch, that sum is the one-process gradient), so every rank takes
the same step; the metric sums are summed too. Rank 0 alone writes adapters and
checkpoints (and should alone publish); the ranks must resume the same state (one learner
folder: one host or a shared file system), which `open` checks.

Learning-rate schedule (per optimizer step): linear warm-up from lr/warmup to lr over
`warmup_steps`, then constant, or cosine decay to 0 at `total_steps` (`schedule`).

Log-probs are computed from logits divided by the rollouts' sampling `temperature`, so that
they are those of the distribution the server sampled from (vLLM's processed logprobs);
top-p truncation is not reproduced (with top_p < 1 the server's log-probs are of the
truncated distribution: recompute them).
The model and optimizer are float32, its products bfloat16 where `learner.compute_dtype`
says so (`learner.precision.compute_autocast`); `torch_threads` is applied in every
calling thread, and again before every forward pass of a model, as `threads()` says at the
time where it is set (the daemon: all cores while no episode runs, so that the learner
takes the CPU the rollouts leave idle).
"""

from __future__ import annotations

import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import structlog

from learner.batch import (
    Decode,
    MicroBatch,
    TurnSample,
    build_samples,
    collate,
    micro_batches,
    minibatch_shares,
    policy_logprobs,
)
from learner.bc_scoring import bc_samples
from learner.checkpoint import (
    LearnerState,
    Ledger,
    SavedCheckpoint,
    latest_checkpoint,
    remove_orphan_adapters,
    write_checkpoint,
)
from learner.demos import BCExample
from learner.errors import BatchError, CheckpointError
from learner.frozen import TOLERANCE as SPLIT_TOLERANCE
from learner.frozen import BottomOutput, bottom_output, frozen_layers
from learner.lora import adapter_name, attach_lora, base_fingerprint, save_adapter
from learner.loss import group_advantages, mgrpo_loss
from learner.precision import compute_autocast, resolve_device
from runtime.base.config import LearnerConfig
from runtime.base.messages import TrajectoryGroup

if TYPE_CHECKING:
    from learner.distributed import DataParallel

log = structlog.get_logger("learner.engine")

__all__ = [
    "Engine",
    "UpdateResult",
    "enable_checkpointing",
    "lr_factor",
    "split_difference",
]


def enable_checkpointing(model: Any) -> None:
    """Gradient checkpointing of every transformer layer (non-reentrant, so frozen inputs
    need no `requires_grad`); it acts in training mode only."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def split_difference(model: Any, frozen: int, autocast: Any) -> float:
    """The largest log-prob difference between the whole forward and the split one on two
    short sequences of seeded random ids, one left-padded (`autocast`: the learner's
    precision)."""
    import torch

    rng = random.Random(0)
    vocab = int(model.config.vocab_size)

    def sample(prompt: int) -> TurnSample:
        return TurnSample(
            group_id="check",
            episode_id="check",
            turn=0,
            prompt_ids=tuple(rng.randrange(vocab) for _ in range(prompt)),
            completion_ids=tuple(rng.randrange(vocab) for _ in range(8)),
            mask=(True,) * 8,
            old_logprobs=(),
            advantage=0.0,
            weight=1.0,
        )

    device = next(model.parameters()).device
    batch = collate([sample(24), sample(16)], pad_id=0).to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast:
            whole = policy_logprobs(model, batch)
            split = policy_logprobs(model, batch, below=bottom_output(model, batch, frozen))
    finally:
        model.train(was_training)
    return float((whole.float() - split.float()).abs().max().item())


def lr_factor(step: int, *, warmup: int, schedule: str, total: int) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "cosine" and total > warmup:
        progress = min(1.0, (step - warmup) / (total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """What one update did."""

    version: int
    step: int
    adapter_path: Path
    metrics: dict[str, float]


class Engine:
    """Model, adapter, optimizer and checkpoints of one learner folder."""

    algorithm: ClassVar[str] = "mgrpo"  # recorded in every checkpoint (`LearnerState`)

    def __init__(
        self,
        config: LearnerConfig,
        *,
        base_model: str | Path,
        out_dir: str | Path,
        adapter_prefix: str = "policy",
        decode: Decode | None = None,
        temperature: float = 1.0,
        data_parallel: DataParallel | None = None,
        demos: Sequence[BCExample] = (),
    ) -> None:
        self.config = config
        self.demos = list(demos)  # the BC term's turns (`bc_coef`)
        self.data_parallel = data_parallel
        self._writes = data_parallel is None or data_parallel.writes
        self.temperature = temperature
        self.base_model = str(base_model)
        self.out_dir = Path(out_dir)
        self.prefix = adapter_prefix
        self.decode = decode
        self.adapters_dir = self.out_dir / "adapters"
        self.checkpoints_dir = self.out_dir / "checkpoints"
        self.state: LearnerState | None = None
        # Torch threads now (asked before every forward pass); None: `torch_threads`.
        self.threads: Callable[[], int] | None = None
        self._model: Any = None
        self._optimizer: Any = None
        self._scheduler: Any = None
        self._device = "cpu"
        self._pad_id = 0
        self._frozen = 0  # bottom layers run once per micro-batch (`_frozen_bottom`)
        if config.mask_think and decode is None:
            raise BatchError("mask_think needs the tokenizer's decode function")
        # "auto" (`runtime.bootstrap.bc_term_of`): the term where demonstrations are given.
        if config.bc_coef > 0 and config.bc_demos != "auto" and not self.demos:
            raise BatchError("learner.bc_coef > 0 needs demonstrated turns")

    # ------------------------------------------------------------------ opening

    def open(self) -> LearnerState:
        """Load the base model with a LoRA; resume the newest checkpoint or start v0."""
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        self._set_threads()
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        self._device = resolve_device(self.config.device)
        fingerprint = base_fingerprint(self.base_model)
        saved = latest_checkpoint(self.checkpoints_dir)
        if saved is not None and saved.state.base_fingerprint != fingerprint:
            raise CheckpointError(
                f"{saved.path} was made on another base model ({saved.state.base_model}); "
                f"refusing to resume on {self.base_model}"
            )
        if self._writes:
            remove_orphan_adapters(
                self.adapters_dir, None if saved is None else saved.state.version, self.prefix
            )
        torch.manual_seed(self.config.seed)  # the LoRA init (A) and dropout draw from it
        base = AutoModelForCausalLM.from_pretrained(self.base_model, dtype=torch.float32)
        pad = base.config.pad_token_id
        self._pad_id = int(pad) if isinstance(pad, int) else 0
        self._model = attach_lora(base, self.config).to(self._device)
        self._follow_threads(self._model)
        if self.config.gradient_checkpointing:
            enable_checkpointing(self._model)
        params = [p for p in self._model.parameters() if p.requires_grad]
        self._optimizer = torch.optim.AdamW(
            params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )
        cfg = self.config
        self._scheduler = torch.optim.lr_scheduler.LambdaLR(
            self._optimizer,
            lambda step: lr_factor(
                step, warmup=cfg.warmup_steps, schedule=cfg.schedule, total=cfg.total_steps
            ),
        )
        self._frozen = self._frozen_bottom()
        self._open_extra()
        if saved is None:
            self.state = LearnerState(
                version=0,
                step=0,
                base_model=self.base_model,
                base_fingerprint=fingerprint,
                adapter_prefix=self.prefix,
                created_at=time.time(),
                algorithm=self.algorithm,
            )
            if self._writes:
                self._save_adapter()
                self._checkpoint()
        else:
            self._restore(saved)
        assert self.state is not None
        dp = self.data_parallel
        if dp is not None and not dp.agree([self.state.version, self.state.step]):
            raise CheckpointError(
                f"rank {dp.rank} opened v{self.state.version} (step {self.state.step}) "
                f"from {self.checkpoints_dir}, not what every rank opened"
            )
        return self.state

    def _frozen_bottom(self) -> int:
        """How many bottom layers an update runs once per micro-batch (`learner.frozen`):
        those below the lowest adapted layer, where `reuse_frozen` is on and the model's
        split forward gives its whole forward's log-probs; else 0."""
        if not self.config.reuse_frozen:
            return 0
        frozen = frozen_layers(self._model)
        if frozen == 0:
            return 0
        difference = split_difference(self._model, frozen, self._autocast())
        usable = difference <= SPLIT_TOLERANCE
        log.info("learner.frozen_layers", layers=frozen, difference=difference, used=usable)
        return frozen if usable else 0

    def _below(self, batches: list[MicroBatch]) -> list[BottomOutput | None]:
        """Each micro-batch's output of the frozen layers (None each where there are none)."""
        if not self._frozen:
            return [None] * len(batches)
        self._model.eval()
        with self._autocast():
            return [bottom_output(self._model, mb, self._frozen) for mb in batches]

    def _open_extra(self) -> None:
        """What a subclass builds besides the policy before a checkpoint is restored."""

    def _write_extra(self, folder: Path) -> None:
        """A subclass's own files of a checkpoint, written into its temporary `folder`."""

    def _restore_extra(self, saved: SavedCheckpoint) -> None:
        """Restore what `_write_extra` wrote (the policy's state is restored already)."""

    def _autocast(self) -> AbstractContextManager[Any]:
        return compute_autocast(self.config.compute_dtype, self._device)

    def _set_threads(self) -> None:
        """Apply `threads()` (or `torch_threads`) to the calling thread: OpenMP's thread
        count is per calling thread, and anyio may run each call on another worker thread."""
        import torch

        wanted = self.config.torch_threads if self.threads is None else self.threads()
        if wanted and torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)

    def _follow_threads(self, model: Any) -> None:
        """`_set_threads` before each forward pass of `model` (so within an update too)."""
        model.register_forward_pre_hook(lambda *_: self._set_threads())

    def _restore(self, saved: SavedCheckpoint) -> None:
        import torch
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        try:
            set_peft_model_state_dict(self._model, load_file(str(saved.lora_file)))
            self._optimizer.load_state_dict(torch.load(saved.optimizer_file, weights_only=True))
            self._scheduler.load_state_dict(torch.load(saved.scheduler_file, weights_only=True))
            rng = torch.load(saved.rng_file, weights_only=True)
            self._restore_extra(saved)
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"{saved.path}: cannot restore ({exc})") from exc
        written_by = saved.state.algorithm
        if written_by and written_by != self.algorithm:
            log.info(
                "learner.algorithm_switched",
                checkpoint=str(saved.path),
                written_by=written_by,
                now=self.algorithm,
            )
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.state = saved.state
        if self._writes and not self.adapter_path(saved.state.version).is_dir():
            # Only possible if someone removed it: the adapter is saved before the checkpoint.
            self._save_adapter()

    # ------------------------------------------------------------------ paths and saving

    def adapter_path(self, version: int) -> Path:
        return self.adapters_dir / adapter_name(version, self.prefix)

    def _save_adapter(self) -> Path:
        assert self.state is not None
        return save_adapter(
            self._model,
            self.adapters_dir,
            version=self.state.version,
            base_model=self.state.base_model,
            fingerprint=self.state.base_fingerprint,
            step=self.state.step,
            config=self.config,
            prefix=self.prefix,
        )

    def _checkpoint(self) -> SavedCheckpoint:
        import torch
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        assert self.state is not None
        model, optimizer, scheduler = self._model, self._optimizer, self._scheduler

        def write(folder: Path) -> None:
            lora = {
                k: v.detach().cpu().contiguous()
                for k, v in get_peft_model_state_dict(model).items()
            }
            save_file(lora, str(folder / "lora.safetensors"))
            torch.save(optimizer.state_dict(), folder / "optimizer.pt")
            torch.save(scheduler.state_dict(), folder / "scheduler.pt")
            cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
            rng = {"torch": torch.get_rng_state(), "cuda": cuda}
            torch.save(rng, folder / "rng.pt")
            self._write_extra(folder)

        return write_checkpoint(
            self.checkpoints_dir, self.state, write, keep=self.config.keep_checkpoints
        )

    # ------------------------------------------------------------------ the update

    def update(self, groups: Sequence[TrajectoryGroup], set_aside: Ledger) -> UpdateResult:
        """Train on `groups`, publish nothing: save adapter vN+1 and checkpoint it.

        `set_aside` holds the stale and zero-variance ids decided since the last update;
        they enter the checkpoint's ledger with the trained ids.
        """
        import torch

        assert self.state is not None, "open() first"
        self._set_threads()
        cfg = self.config
        started = time.perf_counter()
        advantages = [
            group_advantages(
                torch.tensor([t.reward for t in g.trajectories], dtype=torch.float64),
                eps=cfg.adv_eps,
            ).tolist()
            for g in groups
        ]
        samples = build_samples(groups, advantages, mask_think=cfg.mask_think, decode=self.decode)
        cut = micro_batches(samples, cfg.micro_batch_tokens)
        dp = self.data_parallel
        mine = cut if dp is None else dp.share(cut)
        batches = [collate(mb, pad_id=self._pad_id).to(self._device) for mb in mine]
        model = self._model
        below = self._below(batches)
        old = self._old_logprobs(batches, below)
        ref = self._ref_logprobs(batches, below) if cfg.kl_beta > 0 else [None] * len(batches)
        demos = self._bc_batches() if cfg.bc_coef > 0 and self.demos else []
        demos_below = self._below(demos)
        model.train()
        sums = dict.fromkeys(("loss", "clip_fraction", "approx_kl", "ratio_mean", "ref_kl"), 0.0)
        bc_nll = 0.0
        grad_norm = 0.0
        params = [p for p in model.parameters() if p.requires_grad]
        # Every rank cuts the same number of shares (collectives once a step on each).
        shares = minibatch_shares(len(mine), min(cfg.minibatches, len(cut)))
        for _ in range(cfg.optimizer_steps):
            for share in shares:
                self._optimizer.zero_grad(set_to_none=True)
                for i in share:
                    with self._autocast():
                        logp = policy_logprobs(
                            model, batches[i], temperature=self.temperature, below=below[i]
                        )
                    parts = mgrpo_loss(
                        logp,
                        old[i],
                        batches[i].advantages,
                        batches[i].weights,
                        eps_low=cfg.clip_eps_low,
                        eps_high=cfg.clip_eps_high,
                        beta=cfg.kl_beta,
                        logp_ref=ref[i],
                    )
                    # A share holds ~1/len(shares) of the batch's weight: its step keeps
                    # the full batch's scale.
                    (parts.loss * len(shares)).backward()  # type: ignore[no-untyped-call]
                    for key in sums:
                        sums[key] += float(getattr(parts, key).item())
                for mb, mb_below in zip(demos, demos_below, strict=True):
                    with self._autocast():  # temperature 1, as BC trains
                        logp = policy_logprobs(model, mb, below=mb_below)
                    nll = -(mb.weights * logp).sum()
                    (cfg.bc_coef * nll).backward()  # type: ignore[no-untyped-call]
                    bc_nll += float(nll.item())
                if dp is not None:
                    dp.all_reduce_gradients(params)
                grad_norm += float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip).item())
                self._optimizer.step()
                self._scheduler.step()
        model.eval()
        if dp is not None:
            sums = dict(zip(sums, dp.all_reduce_sums(sums.values()), strict=True))
        passes = cfg.optimizer_steps
        steps = passes * len(shares)
        # The sums cover every micro-batch once a pass: a pass's mean is the batch's value.
        metrics = {key: value / passes for key, value in sums.items()}
        rewards = [t.reward for g in groups for t in g.trajectories]
        metrics.update(
            grad_norm=grad_norm / steps,
            lr=float(self._scheduler.get_last_lr()[0]),
            samples=float(sum(len(mb) for mb in cut)),
            tokens=float(sum(s.trained_tokens for s in samples if s.weight > 0)),
            micro_batches=float(len(cut)),
            reward_mean=sum(rewards) / max(1, len(rewards)),
            train_s=time.perf_counter() - started,
        )
        if demos:  # the drawn turns' mean NLL per token, over the steps (each saw them all)
            metrics["bc_nll"] = bc_nll / steps
        return self._commit(groups, set_aside, steps, metrics)

    def bc_draw(self, version: int) -> list[BCExample]:
        """The `bc_turns` demonstrated turns of the update that makes `version` + 1: drawn
        by `seed` and version, so a resumed learner draws what it would have drawn."""
        rng = random.Random(f"{self.config.seed}:{version}")
        return rng.sample(self.demos, min(self.config.bc_turns, len(self.demos)))

    def _bc_batches(self) -> list[MicroBatch]:
        assert self.state is not None
        drawn = bc_samples(self.bc_draw(self.state.version), scoring=False)
        return self._collated(drawn)

    def _collated(self, samples: Sequence[TurnSample]) -> list[MicroBatch]:
        """`samples` cut into micro-batches of `micro_batch_tokens`, collated on the device."""
        cut = micro_batches(samples, self.config.micro_batch_tokens)
        return [collate(mb, pad_id=self._pad_id).to(self._device) for mb in cut]

    def _commit(
        self,
        groups: Sequence[TrajectoryGroup],
        set_aside: Ledger,
        steps: int,
        metrics: dict[str, float],
    ) -> UpdateResult:
        """Version + 1 for `groups` trained in `steps` optimizer steps: the ledger, then
        the adapter and the checkpoint; on a failure to save, nothing of it stays."""
        assert self.state is not None
        trained = dict(self.state.ledger.trained)
        version = self.state.version + 1
        trained.update((g.group_id, version) for g in groups)
        ledger = Ledger(
            trained=trained,
            stale=[*self.state.ledger.stale, *set_aside.stale],
            zero_variance=[*self.state.ledger.zero_variance, *set_aside.zero_variance],
            failed=[*self.state.ledger.failed, *set_aside.failed],
        )
        previous = self.state
        self.state = LearnerState(
            version=version,
            step=previous.step + steps,
            base_model=previous.base_model,
            base_fingerprint=previous.base_fingerprint,
            adapter_prefix=previous.adapter_prefix,
            ledger=ledger,
            created_at=time.time(),
            algorithm=self.algorithm,
        )
        saving = time.perf_counter()
        path = self.adapter_path(version)
        try:
            if self._writes:
                self._save_adapter()
                self._checkpoint()
        except Exception:
            # Nothing of this version is on record: forget it, and remove its adapter
            # (never published), so that the update can be made again.
            self.state = previous
            shutil.rmtree(path, ignore_errors=True)
            raise
        metrics["save_s"] = time.perf_counter() - saving
        return UpdateResult(
            version=version, step=self.state.step, adapter_path=path, metrics=metrics
        )

    def _old_logprobs(
        self, batches: list[MicroBatch], below: list[BottomOutput | None]
    ) -> list[Any]:
        import torch

        if not self.config.recompute_logprobs:
            for mb in batches:
                if not mb.has_old_logprobs:
                    raise BatchError(
                        "recompute_logprobs is off but some turns carry no server logprobs"
                    )
            return [mb.old_logprobs for mb in batches]
        self._model.eval()
        with torch.no_grad(), self._autocast():
            return [
                policy_logprobs(self._model, mb, temperature=self.temperature, below=b).detach()
                for mb, b in zip(batches, below, strict=True)
            ]

    def _ref_logprobs(
        self, batches: list[MicroBatch], below: list[BottomOutput | None]
    ) -> list[Any]:
        import torch

        self._model.eval()
        with torch.no_grad(), self._model.disable_adapter(), self._autocast():
            return [
                policy_logprobs(self._model, mb, temperature=self.temperature, below=b).detach()
                for mb, b in zip(batches, below, strict=True)
            ]
