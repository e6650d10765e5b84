"""Groups, the scheduler, stopping and pausing, and a browser killed in the middle of a run."""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime.base.config import BrowserConfig
from runtime.base.messages import (
    EpisodeStarted,
    EvalSpec,
    Event,
    Fault,
    OracleStep,
    PolicyReply,
    PolicyRequest,
    ReferenceAnswers,
    TaskConfig,
    TrajectoryGroup,
)
from runtime.browser import BrowserPool
from runtime.environment import SitesEnvironment
from runtime.episode import EpisodeSettings
from runtime.oracle import OraclePolicy
from runtime.rollout import Rollout
from runtime.scheduler import Scheduler
from runtime.store import TrajectoryStore, iter_groups

pytestmark = [pytest.mark.anyio, pytest.mark.browser]


def _task(task_id: int) -> TaskConfig:
    return TaskConfig(
        task_id=task_id,
        intent=f"Task {task_id}: say ok.",
        start_url="__SHOPPING__/form",
        sites=["shopping"],
        eval=EvalSpec(
            eval_types=["string_match"], reference_answers=ReferenceAnswers(exact_match="ok")
        ),
    )


SHORT, OTHER, LONG = _task(10), _task(11), _task(20)
PLANS = {
    10: [OracleStep(action="exit", message="ok")],
    11: [OracleStep(action="Scroll Down"), OracleStep(action="exit", message="ok")],
    20: [OracleStep(action="Wait")] * 6 + [OracleStep(action="exit", message="ok")],
}


def _oracle() -> OraclePolicy:
    return OraclePolicy(lambda task: PLANS[task.task_id])


class Stuck:
    """A policy whose calls never return (a server that hangs)."""

    def __init__(self) -> None:
        self.calls = 0
        self.called = anyio.Event()

    async def act(self, request: PolicyRequest) -> PolicyReply:
        self.calls += 1
        self.called.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


def _rollout(
    pool: BrowserPool, web: Any, policy: Any, *, on_event: Callable[[Event], None] | None = None
) -> Rollout:
    environment = SitesEnvironment({"SHOPPING": web.url}, {"test": [SHORT, OTHER, LONG]})
    return Rollout(
        environment=environment,
        pool=pool,
        policy=policy,
        settings=EpisodeSettings(max_turns=10),
        max_episodes=8,
        on_event=on_event,
    )


async def _collect(scheduler: Scheduler, receive: Any, groups: list[TrajectoryGroup]) -> None:
    async with anyio.create_task_group() as tg, receive:
        tg.start_soon(scheduler.run)
        async for group in receive:
            groups.append(group)


async def test_groups_flow_through_the_scheduler(pool: BrowserPool, web: Any) -> None:
    rollout = _rollout(pool, web, _oracle())
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](1)
    scheduler = Scheduler(
        rollout=rollout,
        tasks=[SHORT, OTHER],
        send=send,
        group_size=3,
        max_groups=2,
        split="test",
        num_groups=4,
    )
    groups: list[TrajectoryGroup] = []
    with anyio.fail_after(120):
        await _collect(scheduler, receive, groups)
    assert len(groups) == 4
    # Two epochs over two tasks: each task twice.
    assert Counter(g.task_id for g in groups) == {10: 2, 11: 2}
    episode_ids = set()
    for group in groups:
        assert group.split == "test"
        assert len(group.trajectories) == 3
        for trajectory in group.trajectories:
            assert trajectory.group_id == group.group_id
            assert (trajectory.status, trajectory.reward) == ("exited", 1.0)
            episode_ids.add(trajectory.episode_id)
    assert len(episode_ids) == 12
    stats = scheduler.statistics()
    assert (stats.groups_finished, stats.groups_in_flight, stats.episodes_in_flight) == (4, 0, 0)
    assert (stats.episodes_finished, stats.episodes_failed) == (12, 0)
    assert stats.turns == 3 * 2 * (1 + 2)
    assert stats.steps_per_s > 0 and stats.epoch == 1


async def test_stop_records_what_does_not_finish_as_interrupted(
    pool: BrowserPool, web: Any
) -> None:
    policy = Stuck()
    rollout = _rollout(pool, web, policy)
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](4)
    scheduler = Scheduler(
        rollout=rollout, tasks=[SHORT], send=send, group_size=2, max_groups=2, num_groups=None
    )
    groups: list[TrajectoryGroup] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_collect, scheduler, receive, groups)
        with anyio.fail_after(30):
            await policy.called.wait()
            await scheduler.stop(timeout_s=0.5)
    assert scheduler.statistics().stopping
    assert len(groups) == 2  # both groups in flight were sent, none started after stop
    statuses = Counter(t.status for g in groups for t in g.trajectories)
    assert statuses == {"interrupted": 4}
    assert scheduler.statistics().episodes_failed == 4


async def test_pause_holds_every_episode_before_its_next_turn(pool: BrowserPool, web: Any) -> None:
    started = anyio.Event()

    def on_event(event: Event) -> None:
        if isinstance(event, EpisodeStarted):
            started.set()

    rollout = _rollout(pool, web, _oracle(), on_event=on_event)
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](1)
    scheduler = Scheduler(
        rollout=rollout, tasks=[OTHER], send=send, group_size=3, max_groups=1, num_groups=1
    )
    groups: list[TrajectoryGroup] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_collect, scheduler, receive, groups)
        with anyio.fail_after(30):
            await started.wait()
            scheduler.pause()
            await rollout.gate.wait_held(3)
        assert scheduler.statistics().paused
        assert rollout.stats.turns == 0 and groups == []
        # An update's hold (max_staleness 0) outlasts the resume; `paused` is the pause's.
        scheduler.hold_for_update(True)
        scheduler.resume()
        await anyio.sleep(0.5)
        assert not scheduler.statistics().paused
        assert rollout.stats.turns == 0 and rollout.gate.waiting == 3
        # So does a policy server outage (runtime.supervisor); both are reported.
        scheduler.hold_for_policy(True)
        assert scheduler.statistics().held_for == ("policy", "update")
        scheduler.hold_for_update(False)
        await anyio.sleep(0.2)
        assert rollout.stats.turns == 0 and rollout.gate.waiting == 3
        scheduler.hold_for_policy(False)
        assert scheduler.statistics().held_for == ()
    assert [t.reward for t in groups[0].trajectories] == [1.0, 1.0, 1.0]


async def test_no_group_starts_while_admit_says_no(pool: BrowserPool, web: Any) -> None:
    """`admit` (the learner's `admits`, in training) holds new groups back, not the ones in
    flight, and the statistics say so."""
    allowed = {"groups": 1}
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](4)
    scheduler = Scheduler(
        rollout=_rollout(pool, web, _oracle()), tasks=[SHORT], send=send, group_size=2,
        max_groups=4, num_groups=3,
        admit=lambda: scheduler.statistics().groups_started < allowed["groups"],
    )  # fmt: skip
    groups: list[TrajectoryGroup] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_collect, scheduler, receive, groups)
        with anyio.fail_after(60):
            while len(groups) < 1:  # noqa: ASYNC110 - the collector's list
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)  # four slots free, yet no second group
        stats = scheduler.statistics()
        assert (stats.groups_started, stats.groups_in_flight) == (1, 0)
        assert stats.waiting_for_learner
        allowed["groups"] = 3
    assert len(groups) == 3 and not scheduler.statistics().waiting_for_learner


def _chromium_pid(marker: str) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in args and not any(a.startswith(b"--type=") for a in args):
            return int(entry.name)
    raise AssertionError("no Chromium process with the marker")


@pytest.mark.slow
async def test_killing_chromium_loses_no_group_and_the_run_goes_on(
    web: Any, tmp_path: Path
) -> None:
    marker = f"--webagent-test-pool={uuid.uuid4().hex}"
    config = BrowserConfig(extra_args=(marker,), wait_action_s=0.5, action_timeout_s=3.0)
    store_file = tmp_path / "trajectories.jsonl"
    groups: list[TrajectoryGroup] = []
    faults: list[Event] = []
    async with BrowserPool(config, on_event=faults.append) as pool:
        rollout = _rollout(pool, web, _oracle())
        send, receive = anyio.create_memory_object_stream[TrajectoryGroup](1)
        scheduler = Scheduler(
            rollout=rollout,
            tasks=[SHORT, LONG, SHORT, SHORT],
            send=send,
            group_size=2,
            max_groups=2,
            num_groups=4,
            shuffle=False,
        )
        with TrajectoryStore(store_file) as store, anyio.fail_after(120):
            async with anyio.create_task_group() as tg, receive:
                tg.start_soon(scheduler.run)
                async for group in receive:
                    store.append(group)
                    groups.append(group)
                    if len(groups) == 1:
                        assert rollout.stats.episodes_running > 0  # the long group runs
                        os.kill(_chromium_pid(marker), signal.SIGKILL)
        stats = pool.statistics()
    assert (stats.launches, stats.crashes) == (2, 1)
    assert [f.kind for f in faults if isinstance(f, Fault)] == ["browser"]
    assert len(groups) == 4
    assert all(len(g.trajectories) == 2 for g in groups)
    # The long group was running when Chromium died; the short ones before and after
    # the relaunch all succeeded (groups arrive in the order they finish).
    assert groups[0].task_id == SHORT.task_id
    [long] = [g for g in groups if g.task_id == LONG.task_id]
    assert [t.status for t in long.trajectories] == ["error:browser"] * 2
    for group in groups:
        if group.task_id == SHORT.task_id:
            assert [(t.status, t.reward) for t in group.trajectories] == [("exited", 1.0)] * 2
    assert list(iter_groups(store_file)) == groups
