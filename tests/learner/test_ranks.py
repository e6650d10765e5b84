"""The data-parallel learner on one host (`learner.data_parallel = 2`): rank 1 a real
process of its own (`python -m learner.ranks`), gloo, the tiny model. Its updates make the
adapter a one-process learner makes from the same groups; a rank that dies makes the next
update fail with an error that names it, within the collective's timeout."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
import msgspec
import psutil  # type: ignore[import-untyped]
import pytest
import torch
from safetensors.torch import load_file

from learner.errors import TrainingError
from learner.trainer import Learner
from runtime.base.config import LearnerConfig
from runtime.base.messages import TrajectoryGroup

MakeGroup = Callable[..., TrajectoryGroup]

# Micro-batches of at most 64 tokens: the 4 groups' turns make several, shared by the ranks.
CONFIG = LearnerConfig(
    batch_groups=2, lora_rank=4, lora_alpha=8, learning_rate=1e-2, optimizer_steps=1,
    micro_batch_tokens=64, recompute_logprobs=True, torch_threads=1,
    data_parallel_timeout_s=30.0,
)  # fmt: skip


async def _nothing(_: object) -> None:
    return None


def _learner(config: LearnerConfig, model: Path, out: Path) -> Learner:
    return Learner(config, base_model=model, out_dir=out, publish=_nothing, emit=_nothing)


def _groups(make_group: MakeGroup) -> list[TrajectoryGroup]:
    rewards = [[1, 0, 0], [0, 1], [0, 1, 1], [1, 0]]
    return [
        make_group(seed, group_id=f"g{seed}", rewards=r, vocab=500, version=0)
        for seed, r in enumerate(rewards)
    ]


async def _feed(learner: Learner, groups: Sequence[TrajectoryGroup]) -> None:
    """Run the learner over `groups`, queued before it starts; returns once it is done."""
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](len(groups))
    with send:
        for group in groups:
            send.send_nowait(group)
    await learner.run(receive)


def _weights(out: Path, version: int) -> dict[str, torch.Tensor]:
    return load_file(out / "adapters" / f"policy@v{version}" / "adapter_model.safetensors")


@pytest.mark.anyio
async def test_two_ranks_make_the_adapter_one_process_makes(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    groups = _groups(make_group)
    await _feed(_learner(CONFIG, tiny_model_dir, tmp_path / "one"), groups)
    two = _learner(
        msgspec.structs.replace(CONFIG, data_parallel=2), tiny_model_dir, tmp_path / "two"
    )
    await _feed(two, groups)
    assert two.version == 2
    for version in (1, 2):
        one, dp = _weights(tmp_path / "one", version), _weights(tmp_path / "two", version)
        assert one.keys() == dp.keys()
        diff = max(float((one[k] - dp[k]).abs().max()) for k in one)
        moved = max(float((one[k] - _weights(tmp_path / "one", 0)[k]).abs().max()) for k in one)
        print(f"v{version}: largest difference {diff:.2e}, largest change {moved:.2e}")
        assert diff < 1e-5 < moved
    # Only rank 0 wrote: one set of adapters and checkpoints, as one process makes.
    files = sorted(p.relative_to(tmp_path / "two") for p in (tmp_path / "two").rglob("*"))
    assert files == sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*"))


@pytest.mark.anyio
async def test_a_rank_that_dies_fails_the_next_update_naming_it(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    groups = _groups(make_group)
    learner = _learner(
        msgspec.structs.replace(CONFIG, data_parallel=2), tiny_model_dir, tmp_path / "dp"
    )
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](0)
    started = time.monotonic()
    with pytest.raises(BaseExceptionGroup) as info:
        async with anyio.create_task_group() as tg, send:
            await tg.start(learner.run, receive)
            for group in groups[:2]:
                await send.send(group)
            while learner.version < 1:  # noqa: ASYNC110 - the first update, then the kill
                await anyio.sleep(0.05)
            assert learner.ranks is not None
            (pid,) = learner.ranks.pids
            os.kill(pid, signal.SIGKILL)
            with anyio.fail_after(10):  # dead, not reaped: its parent is to see the code
                while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            for group in groups[2:]:
                await send.send(group)
    (error,) = info.value.exceptions
    assert isinstance(error, TrainingError), error
    assert "rank 1 exited with code -9" in str(error)
    assert time.monotonic() - started < 120
    assert learner.version == 1  # v1 stays the newest checkpoint: nothing half-written


def test_a_rank_exits_once_rank_0_is_gone(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Rank 0 SIGKILLed: the rank, waiting to join (here: for a rank 0 that never comes),
    exits by itself instead of waiting out the collective's timeout."""
    import subprocess
    import sys

    from runtime.base.http import free_port

    parent = subprocess.Popen(["sleep", "1"])
    config = msgspec.json.encode(msgspec.structs.replace(CONFIG, data_parallel=2)).decode()
    rank = subprocess.Popen(
        [
            sys.executable, "-m", "learner.ranks", "--config", config,
            "--base-model", str(tiny_model_dir), "--out-dir", str(tmp_path), "--adapter-prefix",
            "policy", "--temperature", "1.0", "--rank", "1", "--world-size", "2",
            "--init", f"tcp://127.0.0.1:{free_port()}", "--parent", str(parent.pid),
        ]
    )  # fmt: skip
    parent.wait()
    started = time.monotonic()
    assert rank.wait(timeout=20) == 1
    assert time.monotonic() - started < 10
