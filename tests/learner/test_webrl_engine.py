"""The WebRL learner on a tiny real model: phases, what a phase trains on, replay by
perplexity, the curriculum's hook, a restart that resumes critic and buffer, and a run
switched from M-GRPO to WebRL."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from learner.checkpoint import STATE_FILE, latest_checkpoint
from learner.errors import CheckpointError
from learner.trainer import Learner
from learner.webrl_engine import CRITIC_HEAD, CRITIC_LORA, CRITIC_OPTIMIZER, REPLAY_FILE
from runtime.base.config import LearnerConfig, WebRLConfig
from runtime.base.messages import TrajectoryGroup, UpdateApplied
from tests.learner.test_trainer import Recorder, feed, start_only

MakeGroup = Callable[..., TrajectoryGroup]

CONFIG = LearnerConfig(
    algorithm="webrl",
    batch_groups=2,
    lora_rank=4,
    lora_alpha=8,
    learning_rate=1e-2,
    optimizer_steps=2,
    micro_batch_tokens=64,
)
WEBRL = WebRLConfig(critic_steps=3, critic_batch=4, replay_ratio=1.0)


PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13]]  # first prompts the critic values


async def _untrained_values(out: Path, model: Path) -> list[float]:
    """V(s_0) of PROMPTS by a critic no phase has trained (the seed makes it the same)."""
    fresh = _learner(out, model, Recorder())
    await start_only(fresh)
    return await fresh.task_values(PROMPTS)


def _group(make_group: MakeGroup, seed: int, gid: str, rewards: Sequence[float]) -> Any:
    return make_group(seed, group_id=gid, rewards=list(rewards), vocab=500, version=0)


def _learner(out: Path, model: Path, rec: Recorder, webrl: WebRLConfig = WEBRL, **kw: Any) -> Any:
    return Learner(
        CONFIG, base_model=model, out_dir=out, publish=rec.publish, emit=rec.emit,
        webrl=webrl, **kw,
    )  # fmt: skip


@pytest.mark.anyio
async def test_a_phase_trains_every_evaluated_episode_and_calls_the_curriculum(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    phases: list[tuple[list[str], int]] = []

    async def on_phase(groups: Sequence[TrajectoryGroup], version: int) -> None:
        phases.append(([g.group_id for g in groups], version))

    learner = _learner(tmp_path, tiny_model_dir, rec, on_phase=on_phase)
    lost = _group(make_group, 3, "lost", [1, 0])
    lost = msgspec.structs.replace(
        lost,
        trajectories=[msgspec.structs.replace(t, status="interrupted") for t in lost.trajectories],
    )
    groups = [
        _group(make_group, 1, "all-fail", [0, 0]),  # M-GRPO would set it aside
        _group(make_group, 2, "single", [1]),  # M-GRPO needs two
        lost,  # nothing evaluated: set aside
        _group(make_group, 4, "mixed", [1, 0, 1]),
        _group(make_group, 5, "all-win", [1, 1]),
    ]
    await feed(learner, groups)
    assert phases == [(["all-fail", "single"], 1), (["mixed", "all-win"], 2)]
    updates = [e for e in rec.events if isinstance(e, UpdateApplied)]
    assert [(u.version, u.groups_trained, u.groups_failed) for u in updates] == [
        (1, 2, 0),
        (2, 2, 1),
    ]
    first, second = updates[0].metrics, updates[1].metrics
    turns = [sum(len(t.turns) for t in g.trajectories) for g in groups]
    assert first["samples_new"] == turns[0] + turns[1]
    assert second["samples_new"] == turns[3] + turns[4]
    assert first["critic_loss"] > 0 and first["loss"] > 0
    # Phase 1's one success is the buffer phase 2 draws from (at most 1x its new actions);
    # a random tiny model's perplexity (~its vocabulary) is far above 1/0.5: none kept.
    assert first["replay_drawn"] == 0 and first["replay_buffer"] == 1
    assert second["replay_drawn"] == len(groups[1].trajectories[0].turns)
    assert second["replay_kept"] == 0
    assert second["replay_buffer"] == 1 + 2 + 2
    saved = latest_checkpoint(tmp_path / "checkpoints")
    assert saved is not None and saved.state.version == 2
    assert saved.state.ledger.trained == {"all-fail": 1, "single": 1, "mixed": 2, "all-win": 2}
    assert saved.state.ledger.failed == ["lost"]
    assert len((saved.path / REPLAY_FILE).read_bytes().splitlines()) == 5


@pytest.mark.anyio
async def test_replay_keeps_the_actions_within_the_perplexity_bounds(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    rec = Recorder()
    wide = msgspec.structs.replace(WEBRL, perplexity_low=1.0, perplexity_high=1e9, replay_ratio=2.0)
    learner = _learner(tmp_path, tiny_model_dir, rec, webrl=wide)
    groups = [
        _group(make_group, 11, "a", [1, 1]),
        _group(make_group, 12, "b", [0, 1]),
        _group(make_group, 13, "c", [0, 0]),
        _group(make_group, 14, "d", [1, 0]),
    ]
    await feed(learner, groups)
    second = [e for e in rec.events if isinstance(e, UpdateApplied)][1].metrics
    buffered = sum(len(t.turns) for g in groups[:2] for t in g.trajectories if t.reward > 0)
    new = sum(len(t.turns) for g in groups[2:] for t in g.trajectories)
    assert second["replay_drawn"] == min(buffered, 2 * new)
    assert second["replay_kept"] == second["replay_drawn"] > 0
    assert second["samples"] == new + second["replay_kept"]


@pytest.mark.anyio
async def test_a_restart_resumes_the_critic_and_the_buffer(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup
) -> None:
    before = await _untrained_values(tmp_path / "fresh", tiny_model_dir)

    learner = _learner(tmp_path / "run", tiny_model_dir, Recorder())
    await feed(
        learner,
        [_group(make_group, 21, "a", [1, 0]), _group(make_group, 22, "b", [0, 1])],
    )
    trained = await learner.task_values(PROMPTS)
    assert trained != pytest.approx(before, abs=1e-6)

    again = _learner(tmp_path / "run", tiny_model_dir, Recorder())
    await start_only(again)
    assert again.version == 1
    assert await again.task_values(PROMPTS) == pytest.approx(trained, abs=1e-6)
    engine = again._webrl
    assert engine is not None
    assert [s.group_id for s in engine.replay] == ["a", "b"]


@pytest.mark.anyio
@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "before-recording"])
async def test_a_run_switched_from_mgrpo_keeps_its_policy_and_starts_a_fresh_critic(
    tmp_path: Path, tiny_model_dir: Path, make_group: MakeGroup, recorded: bool
) -> None:
    untrained = await _untrained_values(tmp_path / "fresh", tiny_model_dir)

    mgrpo = Learner(
        msgspec.structs.replace(CONFIG, algorithm="mgrpo"),
        base_model=tiny_model_dir,
        out_dir=tmp_path / "run",
        publish=Recorder().publish,
    )
    await feed(mgrpo, [_group(make_group, 31, "a", [1, 0]), _group(make_group, 32, "b", [0, 1])])
    saved = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert saved is not None and saved.state.version == 1
    assert saved.state.algorithm == "mgrpo"
    assert not (saved.path / REPLAY_FILE).exists()
    if not recorded:  # a checkpoint written before the algorithm was recorded
        state = saved.path / STATE_FILE
        fields = msgspec.json.decode(state.read_bytes())
        del fields["algorithm"]
        state.write_bytes(msgspec.json.encode(fields))

    rec = Recorder()
    switched = _learner(tmp_path / "run", tiny_model_dir, rec)
    await start_only(switched)
    assert switched.version == 1
    assert [p.name for p in rec.published] == ["policy@v1"]
    assert await switched.task_values(PROMPTS) == pytest.approx(untrained, abs=1e-6)
    engine = switched._webrl
    assert engine is not None and engine.replay == []

    again = _learner(tmp_path / "run", tiny_model_dir, Recorder())
    await feed(again, [_group(make_group, 33, "c", [1, 1]), _group(make_group, 34, "d", [0, 0])])
    saved = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert saved is not None and saved.state.version == 2
    assert saved.state.algorithm == "webrl"
    assert len((saved.path / REPLAY_FILE).read_bytes().splitlines()) == 2

    (saved.path / CRITIC_HEAD).unlink()  # a WebRL checkpoint with part of it gone
    with pytest.raises(CheckpointError, match=r"critic_head\.pt missing"):
        await start_only(_learner(tmp_path / "run", tiny_model_dir, Recorder()))
    for name in (CRITIC_LORA, CRITIC_OPTIMIZER, REPLAY_FILE):  # all of it: refused too,
        (saved.path / name).unlink()  # not mistaken for an M-GRPO checkpoint
    with pytest.raises(CheckpointError, match=r"critic_lora\.safetensors, .* missing"):
        await start_only(_learner(tmp_path / "run", tiny_model_dir, Recorder()))


def test_webrl_needs_one_rank() -> None:
    with pytest.raises(msgspec.ValidationError, match="one rank"):
        msgspec.convert({"algorithm": "webrl", "data_parallel": 2}, LearnerConfig)
