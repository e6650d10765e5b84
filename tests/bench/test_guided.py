"""bench.guided: a run's groups by kind and steps left, from its store."""

from __future__ import annotations

from pathlib import Path

from bench.guided import rows
from runtime.base.messages import Action, Trajectory, TrajectoryGroup, Turn
from runtime.store import TrajectoryStore
from sites.builtin import plan_length
from sites.builtin.suite import generate_suite


def _turn(index: int, action: Action, own: bool) -> Turn:
    return Turn(
        index=index, url="/", observation="", observation_digest="", text="", action=action,
        completion_token_ids=[1] if own else [], prompt_token_ids=[1] if own else [],
    )  # fmt: skip


def test_groups_are_counted_by_kind_and_steps_left(tmp_path: Path) -> None:
    task = next(t for t in generate_suite(0)["train"] if plan_length(t) == 4)
    click, answer = Action(kind="do", name="Click", element=1), Action(kind="exit", message="x")

    def episode(gid: str, i: int, turns: list[Turn], reward: float) -> Trajectory:
        return Trajectory(episode_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id,
                          intent="", turns=turns, reward=reward)  # fmt: skip

    # Guided by 2: the oracle clicks twice; one episode answers at once, one acts first.
    oracle = [_turn(0, click, False), _turn(1, click, False)]
    guided = [
        episode("g", 0, [*oracle, _turn(2, answer, True)], 0.0),
        episode("g", 1, [*oracle, _turn(2, click, True), _turn(3, answer, True)], 1.0),
    ]
    plain = [episode("p", i, [_turn(0, click, True), _turn(1, answer, True)], 0.0) for i in (0, 1)]
    with TrajectoryStore(tmp_path / "trajectories.jsonl") as store:
        store.append(TrajectoryGroup(group_id="g", task_id=task.task_id, trajectories=guided,
                                     created_at=0, guide=2))  # fmt: skip
        store.append(TrajectoryGroup(group_id="p", task_id=task.task_id, trajectories=plain,
                                     created_at=0))  # fmt: skip
    assert rows(tmp_path, 0) == [
        ["guided", 2, 1, 1, "1/2", "1/2"],
        ["plain", 4, 1, 0, "0/2", "0/2"],
    ]
