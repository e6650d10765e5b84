"""Behaviour cloning on demonstrations: the warm-up checkpoint RL starts from.

Demonstrations are a trajectory store (JSON lines of `TrajectoryGroup`, as `webagent
demos` writes them). Every turn of every successful trajectory (reward > 0) is one example
(`learner.demos`), rendered exactly as a rollout renders it:

- messages = `policy.prompt.build_messages(intent, earlier completions, observation)`;
- prompt ids = the model's `PromptRenderer` (its chat template, generation prompt on);
- completion ids = the tokenizer's ids of the completion text + the end token (the chat
  template's end-of-turn token, which is what the model generates to stop; checked once
  against how the template closes an assistant turn).

Loss: negative log-likelihood of every completion token (thoughts included: they teach the
format), averaged over the tokens of an action, then over the actions of the minibatch:
the per-turn weights of `learner.loss.triple_mean_weights` with every turn its own
trajectory, so micro-batching by token budget is exact, as in RL. With `bc.prompt_loss`
w > 0, plus w times the mean negative log-likelihood of the minibatch's prompt tokens (a
language-model loss on the pages and the task; logits then cover every position). Its
"auto" (the default) is settled by the caller (`policy.profile.settle_auto`:
`TINY_PROMPT_LOSS` for a tiny model made here and 0 for any other: pages repeat the names a
reply must copy, so the loss on them teaches the tiny model to read them; a pretrained
model already can), as is the system prompt the turns are rendered with.

Accuracy (train and held-out, per step): teacher-forced exact match of the ACTION: with the
demonstration's own prompt and thought as context, the argmax token equals the demonstrated
token at every completion position outside `<think>...</think>` (the answer, its tags and
the end token). Equivalently: greedy decoding from the demonstrated thought would emit
exactly the demonstrated action and stop. Scored on a fixed, seeded subset of turns
(`learner.bc_scoring`).

Modes: full fine-tuning (tiny models), or LoRA merged into the weights at the end (large
models); "auto" picks full up to `BCConfig.full_max_params`. The result is a full model
folder (`save_pretrained` + the base's tokenizer files), written atomically, that vLLM
serves and `learner.trainer` starts from. Stops at `max_steps`, `max_minutes` (the final
evaluation included, `another_step_fits`), held-out `target_accuracy`, or held-out
`target_success` when an episode evaluator is given.
With `bc.snapshot_minutes`, the model as it was at each of those wall minutes (evaluated
there, LoRA merged into a copy) is also written beside `out`, as `<out>-<M>m`: one run
gives the closed-loop curve of BC minutes (`bench.recipe`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import msgspec
import structlog

from learner.batch import collate, micro_batches
from learner.bc_budget import (
    another_step_fits,
    budget_progress,
    first_eval_estimate_s,
    periodic_eval_fits,
    schedule_factor,
)
from learner.bc_scoring import (
    bc_samples,
    completion_logits,
    prompt_logprob_sum,
    teacher_forced_scores,
    whole_episodes,
)
from learner.demos import BCExample, demo_examples, read_demos, split_heldout
from learner.engine import lr_factor
from learner.errors import LearnerError, TrainingError
from learner.lora import attach_lora
from learner.loss import token_logprobs
from learner.precision import compute_autocast, resolve_device
from policy.prompt import PromptRenderer
from runtime.base.config import BCConfig, LearnerConfig
from runtime.base.files import write_folder
from runtime.base.messages import TrajectoryGroup

__all__ = [
    "BCEval",
    "BCExample",
    "BCProgress",
    "BCReport",
    "another_step_fits",
    "bc_step",
    "behaviour_clone",
    "demo_examples",
    "first_eval_estimate_s",
    "periodic_eval_fits",
    "read_demos",
    "snapshot_path",
    "split_heldout",
    "train_examples",
]

log = structlog.get_logger("learner.bc")

# Files of a model folder that `save_pretrained` writes itself; the rest (tokenizer,
# chat template, notes) is copied from the base.
_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
REPORT_FILE = "bc.json"


class BCEval(msgspec.Struct, frozen=True, kw_only=True):
    """One evaluation point."""

    step: int
    wall_s: float  # since the start, evaluations included
    train_s: float  # in optimizer steps only
    # CPU seconds of this process since the start (all threads): on a shared machine,
    # the measure of work done that other processes do not inflate.
    cpu_s: float
    tokens: int  # forwarded in training so far (prompt + completion)
    loss: float
    train_accuracy: float  # per turn, teacher-forced exact action
    heldout_accuracy: float
    # Episodes whose every turn is right under teacher forcing: on the deterministic
    # built-in sites, an upper bound of closed-loop success (a wrong turn ends it).
    train_episode_accuracy: float
    heldout_episode_accuracy: float
    heldout_success: float | None = None
    # Whole turns (thought, action and end token) that are the argmax at every position:
    # what greedy decoding reproduces exactly. The action-only figures above take the
    # demonstrated thought as given, which a free-running model must write itself.
    heldout_whole_accuracy: float = math.nan
    heldout_whole_episode_accuracy: float = math.nan
    # Mean negative log-likelihood of the held-out replies' tokens (thought, action, end):
    # over the same turns, steadier than the exact-match shares, which flip a turn at once.
    heldout_loss: float = math.nan


class BCProgress(msgspec.Struct, frozen=True, kw_only=True):
    """Where a BC run is, after a step (`behaviour_clone(on_step=...)`)."""

    step: int
    max_steps: int  # 0: bounded by time only
    loss: float  # mean over the steps since the last evaluation
    heldout_accuracy: float  # at the last evaluation (nan before the first)
    elapsed_s: float
    left_s: float | None  # by max_minutes or max_steps, whichever ends first
    learning_rate: float = math.nan  # of the step just taken (bc.warmup_steps, bc.schedule)


def _progress(
    step: int,
    window: Sequence[float],
    history: Sequence[BCEval],
    started: float,
    cfg: BCConfig,
    *,
    learning_rate: float,
) -> BCProgress:
    elapsed = time.monotonic() - started
    lefts = []
    if cfg.max_minutes:
        lefts.append(max(0.0, 60 * cfg.max_minutes - elapsed))
    if cfg.max_steps:
        lefts.append(elapsed / step * max(0, cfg.max_steps - step))
    return BCProgress(
        step=step,
        max_steps=cfg.max_steps,
        loss=sum(window) / len(window) if window else math.nan,
        heldout_accuracy=history[-1].heldout_accuracy if history else math.nan,
        elapsed_s=elapsed,
        left_s=min(lefts) if lefts else None,
        learning_rate=learning_rate,
    )


class BCReport(msgspec.Struct, frozen=True, kw_only=True):
    """What `behaviour_clone` did; also written as `bc.json` in the output folder."""

    out: str
    base_model: str
    mode: str
    parameters: int
    trainable_parameters: int
    train_examples: int
    heldout_examples: int
    steps: int
    wall_s: float
    tokens_per_s: float  # training tokens (prompt + completion) forwarded per second
    prompt_loss: float = 0.0  # the weight of the prompt tokens' loss used (bc.prompt_loss)
    stop_reason: str
    train_accuracy: float
    heldout_accuracy: float
    heldout_episode_accuracy: float
    heldout_success: float | None = None
    heldout_whole_accuracy: float = math.nan
    heldout_whole_episode_accuracy: float = math.nan
    heldout_loss: float = math.nan
    history: list[BCEval] = []
    # Folders of the `bc.snapshot_minutes` models written before this one.
    snapshots: list[str] = []


def snapshot_path(out: str | Path, minutes: float) -> Path:
    """Where BC writing `out` puts its `bc.snapshot_minutes` model of `minutes`."""
    out = Path(out)
    return out.parent / f"{out.name}-{minutes:g}m"


def bc_step(
    model: Any,
    optimizer: Any,
    batch: Sequence[BCExample],
    cfg: BCConfig,
    *,
    pad_id: int,
    device: str,
    prompt_loss: float = 0.0,
    autocast: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> tuple[float, int]:
    """One optimizer step on a minibatch (`prompt_loss`: the resolved `bc.prompt_loss`;
    forward passes inside `autocast()`); returns (loss, tokens forwarded: prompt and
    completion, padding excluded)."""
    import torch

    model.train()
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    tokens = 0
    prompt_tokens = sum(len(e.prompt_ids) - 1 for e in batch)
    for mb_samples in micro_batches(bc_samples(batch, scoring=False), cfg.micro_batch_tokens):
        mb = collate(mb_samples, pad_id=pad_id).to(device)
        with autocast():
            if prompt_loss > 0 and prompt_tokens > 0:
                completions = [len(s.completion_ids) for s in mb_samples]
                logp, prompt_sum = prompt_logprob_sum(model, mb, completions)
                loss = -(mb.weights * logp).sum() - prompt_loss * prompt_sum / prompt_tokens
            else:
                logp = token_logprobs(completion_logits(model, mb), mb.targets)
                loss = -(mb.weights * logp).sum()
        loss.backward()
        total += float(loss.item())
        tokens += int(mb.attention_mask.sum())
    params = [p for p in model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    optimizer.step()
    return total, tokens


def behaviour_clone(
    demos: str | Path | Sequence[TrajectoryGroup],
    *,
    base_model: str | Path,
    out: str | Path,
    config: BCConfig = BCConfig(),
    lora: LearnerConfig = LearnerConfig(),
    heldout: str | Path | Sequence[TrajectoryGroup] | None = None,
    keep_thoughts: bool = True,
    system_prompt: str,
    evaluate_success: Callable[[Any], float] | None = None,
    overwrite: bool = False,
    should_stop: Callable[[], bool] | None = None,
    on_step: Callable[[BCProgress], None] | None = None,
) -> BCReport:
    """Train on the demonstrations and write the BC checkpoint to `out` (see module doc).

    `system_prompt` is the text rollouts of the checkpoint will send (the settled
    `policy.system_prompt`); `config.prompt_loss` must be settled too ("auto" is a
    LearnerError: `policy.profile.settle_auto` decides it). `should_stop()` true (checked
    before each step; e.g. a daemon's Ctrl-C) abandons the run: LearnerError, nothing
    written.

    `evaluate_success(model)` (optional) returns held-out episode success of the torch
    model at each evaluation; it enables `config.target_success`. `on_step` is called
    (from the calling thread) after every step with a `BCProgress`.
    """
    target = Path(out)
    if target.exists() and not overwrite:
        raise LearnerError(f"{target} exists (pass overwrite to replace it)")
    if config.max_steps == 0 and config.max_minutes == 0:
        raise LearnerError("BC needs a bound: bc.max_steps or bc.max_minutes")
    if config.prompt_loss == "auto":
        raise LearnerError(
            "bc.prompt_loss is 'auto': settle the config for the base model first "
            "(policy.profile.settle_auto)"
        )
    prompt_loss = config.prompt_loss
    renderer = PromptRenderer.from_model(base_model)
    groups = read_demos(demos) if isinstance(demos, (str, Path)) else list(demos)

    def examples_of(chosen: Sequence[TrajectoryGroup]) -> list[BCExample]:
        return demo_examples(
            chosen, renderer, keep_thoughts=keep_thoughts, system_prompt=system_prompt
        )

    examples = examples_of(groups)
    if heldout is None:
        train, held = split_heldout(examples, config.heldout_fraction, config.seed)
    else:
        train = examples
        held = examples_of(read_demos(heldout) if isinstance(heldout, (str, Path)) else heldout)
    try:
        return train_examples(
            train, held, base_model=str(base_model), target=target, config=config, lora=lora,
            evaluate_success=evaluate_success, should_stop=should_stop, prompt_loss=prompt_loss,
            on_step=on_step,
        )  # fmt: skip
    except LearnerError:
        raise
    except Exception as exc:  # torch, transformers, peft: one boundary
        raise TrainingError(f"BC failed: {type(exc).__name__}: {exc}") from exc


def train_examples(
    train: list[BCExample],
    held: list[BCExample],
    *,
    base_model: str,
    target: Path,
    config: BCConfig,
    lora: LearnerConfig,
    evaluate_success: Callable[[Any], float] | None,
    should_stop: Callable[[], bool] | None = None,
    prompt_loss: float = 0.0,
    on_step: Callable[[BCProgress], None] | None = None,
    merge: bool = True,
) -> BCReport:
    """BC's loop on examples made elsewhere (`behaviour_clone` makes them from
    demonstrations; WebRL's outcome reward model from labelled rollouts). A LoRA is merged
    into the written model, or with `merge` false written as the adapter alone (its
    `adapter_config.json` and weights, beside the base's tokenizer files)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)

    def autocast() -> AbstractContextManager[Any]:
        return compute_autocast(lora.compute_dtype, device)

    model: Any = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    pad = model.config.pad_token_id
    pad_id = int(pad) if isinstance(pad, int) else 0
    parameters = sum(p.numel() for p in model.parameters())
    mode = config.mode
    if mode == "auto":
        mode = "full" if parameters <= config.full_max_params else "lora"
    if mode == "lora":
        model = attach_lora(model, lora)
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    score_rng = random.Random(config.seed + 1)
    held_eval = whole_episodes(held, config.eval_examples, score_rng)
    train_eval = whole_episodes(train, config.eval_examples, score_rng)
    eval_turns = len(held_eval) + len(train_eval)
    history: list[BCEval] = []
    started = time.monotonic()
    cpu_started = time.process_time()
    order: list[BCExample] = []
    step = 0
    tokens = 0
    train_s = 0.0  # time in optimizer steps (evaluations excluded)
    window: list[float] = []
    stop_reason = ""

    # How long the latest evaluation took (the final one costs about as much); None before
    # the first.
    eval_s: float | None = None

    def evaluate() -> BCEval:
        nonlocal eval_s
        tick = time.monotonic()
        success = None if evaluate_success is None else float(evaluate_success(model.eval()))
        budget = config.micro_batch_tokens
        train_scores = teacher_forced_scores(
            model, train_eval, budget, pad_id, device, autocast=autocast
        )
        held_scores = teacher_forced_scores(
            model, held_eval, budget, pad_id, device, autocast=autocast
        )
        point = BCEval(
            step=step,
            wall_s=time.monotonic() - started,
            train_s=train_s,
            cpu_s=time.process_time() - cpu_started,
            tokens=tokens,
            loss=sum(window) / len(window) if window else math.nan,
            train_accuracy=train_scores.turns,
            heldout_accuracy=held_scores.turns,
            train_episode_accuracy=train_scores.episodes,
            heldout_episode_accuracy=held_scores.episodes,
            heldout_success=success,
            heldout_whole_accuracy=held_scores.whole_turns,
            heldout_whole_episode_accuracy=held_scores.whole_episodes,
            heldout_loss=held_scores.loss,
        )
        window.clear()
        history.append(point)
        eval_s = time.monotonic() - tick
        log.info("bc.eval", eval_s=round(eval_s, 1), **msgspec.structs.asdict(point))
        return point

    def step_s() -> float:
        """The mean optimizer step so far (0 before the first)."""
        return train_s / step if step else 0.0

    def eval_cost_s() -> float:
        """What the next evaluation will take: as long as the latest, or estimated."""
        if eval_s is not None:
            return eval_s
        return first_eval_estimate_s(
            step_s=step_s(), batch_size=config.batch_size, eval_turns=eval_turns
        )

    snapshots = sorted(config.snapshot_minutes)  # each > 0 (PositiveFloat)
    written: list[str] = []

    def report_now(stop: str, point: BCEval) -> BCReport:
        return BCReport(
            out=str(target),
            base_model=base_model,
            mode=mode,
            parameters=parameters,
            trainable_parameters=sum(p.numel() for p in params),
            train_examples=len(train),
            heldout_examples=len(held),
            steps=step,
            wall_s=time.monotonic() - started,
            tokens_per_s=tokens / train_s if train_s > 0 else 0.0,
            prompt_loss=prompt_loss,
            stop_reason=stop,
            train_accuracy=point.train_accuracy,
            heldout_accuracy=point.heldout_accuracy,
            heldout_episode_accuracy=point.heldout_episode_accuracy,
            heldout_success=point.heldout_success,
            heldout_whole_accuracy=point.heldout_whole_accuracy,
            heldout_whole_episode_accuracy=point.heldout_whole_episode_accuracy,
            heldout_loss=point.heldout_loss,
            history=list(history),
            snapshots=list(written),
        )

    def snapshot(minutes: float) -> None:
        point = history[-1] if history and history[-1].step == step else evaluate()
        path = snapshot_path(target, minutes)
        merged = copy.deepcopy(model)
        if mode == "lora":
            merged = merged.merge_and_unload()
        _save_model(merged, Path(base_model), path, report_now(f"snapshot {minutes:g}m", point))
        del merged
        written.append(str(path))
        log.info("bc.snapshot", out=str(path), step=step, minutes=minutes)

    while True:
        if snapshots and time.monotonic() - started >= 60 * snapshots[0]:
            snapshot(snapshots.pop(0))
        if should_stop is not None and should_stop():
            raise LearnerError(f"BC stopped at step {step} before its end: {target} not written")
        if config.max_steps and step >= config.max_steps:
            stop_reason = "max_steps"
            break
        if config.max_minutes and not another_step_fits(
            elapsed_s=time.monotonic() - started,
            budget_s=60 * config.max_minutes,
            step_s=step_s(),
            final_eval_s=eval_cost_s(),
        ):
            stop_reason = "max_minutes"
            break
        if len(order) < config.batch_size:
            fresh = list(train)
            rng.shuffle(fresh)
            order.extend(fresh)
        batch, order = order[: config.batch_size], order[config.batch_size :]
        progress = budget_progress(
            step=step,
            max_steps=config.max_steps,
            elapsed_s=time.monotonic() - started,
            budget_s=60 * config.max_minutes,
            final_eval_s=eval_cost_s(),
        )
        lr = config.learning_rate * schedule_factor(config.schedule, progress)
        lr *= lr_factor(step, warmup=config.warmup_steps, schedule="constant", total=0)
        for group in optimizer.param_groups:
            group["lr"] = lr
        tick = time.monotonic()
        loss, n = bc_step(
            model,
            optimizer,
            batch,
            config,
            pad_id=pad_id,
            device=device,
            prompt_loss=prompt_loss,
            autocast=autocast,
        )
        train_s += time.monotonic() - tick
        step += 1
        tokens += n
        window.append(loss)
        if on_step is not None:
            on_step(_progress(step, window, history, started, config, learning_rate=lr))
        if step % config.eval_every_steps == 0 and (
            not config.max_minutes
            or periodic_eval_fits(
                elapsed_s=time.monotonic() - started,
                budget_s=60 * config.max_minutes,
                step_s=step_s(),
                eval_s=eval_cost_s(),
                period_steps=config.eval_every_steps,
            )
        ):
            point = evaluate()
            if config.target_accuracy and point.heldout_accuracy >= config.target_accuracy:
                stop_reason = "target_accuracy"
                break
            success = point.heldout_success
            if config.target_success and success is not None and success >= config.target_success:
                stop_reason = "target_success"
                break
    final = history[-1] if history and history[-1].step == step else evaluate()
    if mode == "lora" and merge:
        model = model.merge_and_unload()
    report = report_now(stop_reason, final)
    _save_model(model, Path(base_model), target, report)
    log.info(
        "bc.done",
        out=str(target),
        steps=step,
        stop_reason=stop_reason,
        train_accuracy=report.train_accuracy,
        heldout_accuracy=report.heldout_accuracy,
        wall_s=round(report.wall_s, 2),
    )
    return report


def _save_model(model: Any, base: Path, target: Path, report: BCReport) -> None:
    """save_pretrained + the base's tokenizer files + bc.json, atomically at `target`."""

    def fill(tmp: Path) -> None:
        model.cpu().save_pretrained(str(tmp))
        if base.is_dir():
            for item in base.iterdir():
                if (
                    item.is_file()
                    and not item.name.endswith(_WEIGHT_SUFFIXES)
                    and item.name not in _MODEL_FILES
                    and not (tmp / item.name).exists()
                ):
                    shutil.copy2(item, tmp / item.name)
        (tmp / REPORT_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(report)))

    write_folder(target, fill, replace=True)
