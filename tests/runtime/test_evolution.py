"""WebRL's curriculum on the built-in suite: children of failed tasks, the critic's filter
on their first state, the record of every child, and a restart that reads it back.

The critic is a seam here (`values`: any function of the prompts); the learner's own is
tested in tests/learner/test_webrl_engine.py, the whole loop in tests/runtime/test_daemon.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest
import structlog
from structlog.testing import capture_logs

from runtime.base.config import Config, WebRLConfig
from runtime.base.messages import TaskConfig, Trajectory, TrajectoryGroup, Turn
from runtime.evolution import EVOLVED_FILE, TaskEvolution, read_evolved
from sites.builtin import generate_suite

TRAIN = generate_suite(0)["train"]


def _group(task: TaskConfig, rewards: Sequence[float], page: str = "") -> TrajectoryGroup:
    turn = Turn(index=0, url="http://x/", observation=page or f"start of {task.start_url}",
                observation_digest="d", text="")  # fmt: skip
    trajectories = [
        Trajectory(episode_id=f"{task.task_id}-{i}", group_id=f"g{task.task_id}",
                   task_id=task.task_id, intent=task.intent, turns=[turn], reward=r)
        for i, r in enumerate(rewards)
    ]  # fmt: skip
    return TrajectoryGroup(
        group_id=f"g{task.task_id}", task_id=task.task_id, trajectories=trajectories, created_at=0
    )


class Critic:
    """Values by prompt: the first prompt is `len(observation)` ids long here."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.asked: list[list[int]] = []

    async def __call__(self, prompts: Sequence[Sequence[int]]) -> list[float]:
        self.asked.extend(list(p) for p in prompts)
        return [self.value] * len(prompts)


def _first_prompt(task: TaskConfig, observation: str) -> list[int]:
    return [task.task_id, len(observation)]


def _evolution(tmp_path: Path, critic: Critic, **webrl: float) -> TaskEvolution:
    config = Config(webrl=WebRLConfig(evolve_per_parent=2, **webrl))  # type: ignore[arg-type]
    return TaskEvolution(
        config, tasks=TRAIN, run_dir=tmp_path, values=critic, first_prompt=_first_prompt
    )


@pytest.mark.anyio
async def test_failed_tasks_get_children_the_critic_judges_by_their_start_page(
    tmp_path: Path,
) -> None:
    critic = Critic(0.4)
    evolution = _evolution(tmp_path, critic)
    added: list[TaskConfig] = []
    assert evolution.resume(added.extend) == []
    # Every start page of the suite seen once (as a running daemon would have by then).
    for task in TRAIN:
        evolution.observe(_group(task, [1.0]))
    failed, solved, lost = TRAIN[0], TRAIN[1], TRAIN[2]
    lost_group = _group(lost, [0.0])
    lost_group = msgspec.structs.replace(
        lost_group,
        trajectories=[msgspec.structs.replace(lost_group.trajectories[0], status="interrupted")],
    )
    await evolution.phase([_group(failed, [0.0, 0.0]), _group(solved, [0.0, 1.0]), lost_group], 3)
    records = read_evolved(tmp_path / EVOLVED_FILE)
    assert len(records) == 2  # only the failed task, 2 children
    assert {r.parent for r in records} == {failed.task_id}
    assert {r.phase for r in records} == {3}
    assert all(r.value == pytest.approx(0.4) and r.kept for r in records)
    assert added == [r.task for r in records]
    assert all(t.task_id >= 300_000 for t in added)
    # Each child's first prompt was built from the page its start URL showed.
    pages = {t.start_url: len(f"start of {t.start_url}") for t in TRAIN}
    assert critic.asked == [[t.task_id, pages[t.start_url]] for t in added]


@pytest.mark.anyio
async def test_the_critic_filter_drops_hopeless_and_solved_tasks_and_records_them(
    tmp_path: Path,
) -> None:
    for value, kept in ((0.01, False), (0.9, False), (0.5, True)):
        folder = tmp_path / str(value)
        folder.mkdir()
        evolution = _evolution(folder, Critic(value))
        added: list[TaskConfig] = []
        evolution.resume(added.extend)
        for task in TRAIN:
            evolution.observe(_group(task, [1.0]))
        await evolution.phase([_group(TRAIN[0], [0.0])], 1)
        records = read_evolved(folder / EVOLVED_FILE)
        assert [r.kept for r in records] == [kept, kept]
        assert len(added) == (2 if kept else 0)


@pytest.mark.anyio
async def test_a_child_with_an_unseen_start_page_runs_unfiltered(tmp_path: Path) -> None:
    critic = Critic(0.01)  # would drop every judged child
    evolution = _evolution(tmp_path, critic)
    added: list[TaskConfig] = []
    evolution.resume(added.extend)
    await evolution.phase([_group(TRAIN[0], [0.0])], 1)
    records = read_evolved(tmp_path / EVOLVED_FILE)
    seen = TRAIN[0].start_url
    for record in records:
        judged = record.task.start_url == seen
        assert (record.value is not None) == judged
        assert record.kept == (not judged)


@pytest.mark.anyio
async def test_a_restart_reads_the_children_back_and_never_makes_them_again(
    tmp_path: Path,
) -> None:
    first = _evolution(tmp_path, Critic(0.5))
    first.resume(lambda tasks: None)
    await first.phase([_group(TRAIN[0], [0.0]), _group(TRAIN[5], [0.0])], 1)
    before = read_evolved(tmp_path / EVOLVED_FILE)
    # A torn last line (a crash mid-append) is skipped, not read.
    with (tmp_path / EVOLVED_FILE).open("ab") as out:
        out.write(b'{"task": {"task_id"')
    again = _evolution(tmp_path, Critic(0.5))
    added: list[TaskConfig] = []
    assert again.resume(added.extend) == [r.task for r in before if r.kept]
    assert added == [r.task for r in before if r.kept]
    await again.phase([_group(TRAIN[0], [0.0]), _group(TRAIN[5], [0.0])], 2)
    after = read_evolved(tmp_path / EVOLVED_FILE)[len(before) :]
    assert after

    def key(task: TaskConfig) -> object:
        return task.intent_template_id, sorted((task.instantiation_dict or {}).items())

    assert not {str(key(r.task)) for r in after} & {str(key(r.task)) for r in before}
    assert min(r.task.task_id for r in after) > max(r.task.task_id for r in before)
    # A child of a child: evolved tasks are parents like any other.
    child = after[0].task
    await again.phase([_group(child, [0.0])], 3)
    assert read_evolved(tmp_path / EVOLVED_FILE)[-1].parent == child.task_id


@pytest.mark.anyio
async def test_a_failing_critic_is_logged_and_training_goes_on(tmp_path: Path) -> None:
    async def broken(prompts: Sequence[Sequence[int]]) -> list[float]:
        raise RuntimeError("critic down")

    evolution = TaskEvolution(
        Config(), tasks=TRAIN, run_dir=tmp_path, values=broken, first_prompt=_first_prompt
    )
    evolution.resume(lambda tasks: None)
    for task in TRAIN:
        evolution.observe(_group(task, [1.0]))
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        await evolution.phase([_group(TRAIN[0], [0.0])], 1)
    assert [e["error"] for e in logs if e["event"] == "evolution.failed"] == [
        "RuntimeError: critic down"
    ]


@pytest.mark.anyio
async def test_on_webarena_a_chat_model_writes_the_children(tmp_path: Path) -> None:
    """The maker is pluggable: WebArena's is a chat model (sites.generate), its children
    are "orm" tasks, judged by the critic and recorded as the suite's are."""
    import json

    import httpx

    from sites.chat import ChatModel
    from sites.errors import GeneratorError
    from sites.generate import IntentGenerator

    parent = TaskConfig(task_id=5, intent="Find the cheapest red mug.", start_url="__SHOPPING__/",
                        sites=["shopping"])  # fmt: skip

    def answer(request: httpx.Request) -> httpx.Response:
        user = json.loads(request.content)["messages"][1]["content"]
        text = (
            '{"intent": "Find the cheapest blue mug.", "kind": "easier"}\nnonsense'
            if "Write " in user
            else "Yes"
        )
        return httpx.Response(200, json={"choices": [{"message": {"content": text}}]})

    critic = Critic(0.3)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        maker = IntentGenerator(ChatModel(http, url="http://llm.test", model="m",
                                          error=GeneratorError))  # fmt: skip
        evolution = TaskEvolution(
            Config(), tasks=[parent], run_dir=tmp_path, values=critic,
            first_prompt=_first_prompt, maker=maker,
        )  # fmt: skip
        added: list[TaskConfig] = []
        evolution.resume(added.extend)
        evolution.observe(_group(parent, [0.0], page="the shop"))
        with capture_logs() as logs:
            await evolution.phase([_group(parent, [0.0])], 4)
    (record,) = read_evolved(tmp_path / EVOLVED_FILE)
    assert record.task.intent == "Find the cheapest blue mug."
    assert record.task.eval.eval_types == ["orm"] and record.parent == 5 and record.phase == 4
    assert record.value == pytest.approx(0.3) and record.kept and added == [record.task]
    assert critic.asked == [[record.task.task_id, len("the shop")]]
    (line,) = [e for e in logs if e["event"] == "evolution.phase"]
    assert line["dropped"] == {"not JSON": 1}
