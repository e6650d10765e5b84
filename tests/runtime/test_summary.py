"""runtime/summary.py: success by site over the judged episodes; unjudged ones apart."""

from __future__ import annotations

from runtime.base.messages import (
    EvalCheck,
    Evaluation,
    TaskConfig,
    Trajectory,
    TrajectoryGroup,
)
from runtime.summary import format_summary, summarize


def _episode(n: int, task: int, reward: float, *, unjudged: bool = False) -> Trajectory:
    check = EvalCheck(kind="fuzzy_match", passed=None if unjudged else reward > 0)
    return Trajectory(
        episode_id=f"e{n}", group_id=f"g{task}", task_id=task, intent="i", reward=reward,
        status="exited", evaluation=Evaluation(reward=reward, checks=[check], unjudged=unjudged),
    )  # fmt: skip


def test_unjudged_episodes_are_left_out_of_the_rates() -> None:
    tasks = {
        1: TaskConfig(task_id=1, intent="i", sites=["gitlab"], start_url="http://x/"),
        2: TaskConfig(task_id=2, intent="i", sites=["map"], start_url="http://x/"),
    }
    groups = [
        TrajectoryGroup(group_id="g1", task_id=1, created_at=0.0, trajectories=[
            _episode(0, 1, 1.0), _episode(1, 1, 0.0), _episode(2, 1, 0.0, unjudged=True),
        ]),
        TrajectoryGroup(group_id="g2", task_id=2, created_at=0.0, trajectories=[
            _episode(3, 2, 0.0, unjudged=True),
        ]),
    ]  # fmt: skip
    summary = summarize(groups, tasks=tasks, seconds=2.0)
    assert (summary.episodes, summary.successes, summary.unjudged) == (4, 1, 2)
    assert summary.success_rate == 0.5
    assert summary.by_site == {"gitlab": [1, 2], "map": [0, 0]}
    text = format_summary(summary)
    assert "gitlab                   1         2   50.0%" in text
    assert "map                      0         0       -" in text
    assert "all                      1         2   50.0%" in text
    assert "unjudged: 2 episodes" in text
    clean = TrajectoryGroup(group_id="g3", task_id=1, created_at=0.0,
                            trajectories=[_episode(4, 1, 1.0)])  # fmt: skip
    assert "unjudged" not in format_summary(summarize([clean], tasks=tasks))
