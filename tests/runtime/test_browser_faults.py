"""A dead browser, again and again: no hang, every episode ends with a status, runs go on.

Chromium is SIGKILLed at chosen moments of a rollout on the built-in sites with the
oracle policy: as an episode starts (its context is open, its tab opening), mid-rollout
(right after a turn), right after an episode finished (its context closing), and right
as a group is ready (the next groups' contexts opening). Every episode in flight must
end, as `error:browser` when the browser took it down, never hanging and never counted
as a plain failure; the pool relaunches and later groups succeed.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from pathlib import Path

import anyio
import pytest

from runtime.base.config import BrowserConfig, ObservationConfig, SitesConfig
from runtime.base.messages import (
    EpisodeFinished,
    EpisodeStarted,
    Event,
    Fault,
    GroupReady,
    TrajectoryGroup,
    TurnTaken,
)
from runtime.browser import BrowserPool
from runtime.environment import serve_builtin_environment
from runtime.episode import EpisodeSettings
from runtime.errors import BrowserError
from runtime.oracle import OraclePolicy
from runtime.rollout import Rollout
from runtime.scheduler import Scheduler

pytestmark = [pytest.mark.anyio, pytest.mark.browser, pytest.mark.slow]

HTML = ObservationConfig(style="html")
# The moments, in turn: the event after which Chromium is killed.
MOMENTS: tuple[type[Event], ...] = (EpisodeStarted, TurnTaken, EpisodeFinished, GroupReady) * 2


def _chromium_pids(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in args and not any(a.startswith(b"--type=") for a in args):
            pids.append(int(entry.name))
    return pids


class Killer:
    """Kills Chromium on the next event of the current moment's kind, once the pool has
    relaunched it after the previous kill (it relaunches for the next context)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.pool: BrowserPool | None = None
        self.kills: list[str] = []
        self.faults = 0

    def on_event(self, event: Event) -> None:
        if isinstance(event, Fault):
            self.faults += 1
            return
        if self.pool is None or len(self.kills) >= len(MOMENTS):
            return
        stats = self.pool.statistics()
        if not stats.connected or stats.launches <= len(self.kills):
            return  # not yet relaunched since the last kill
        if isinstance(event, MOMENTS[len(self.kills)]):
            for pid in _chromium_pids(self.marker):
                os.kill(pid, signal.SIGKILL)
            self.kills.append(type(event).__name__)


async def test_chromium_killed_at_every_moment_never_hangs_an_episode() -> None:
    marker = f"--webagent-test-pool={uuid.uuid4().hex}"
    config = BrowserConfig(
        extra_args=(marker,), action_timeout_s=3.0, navigation_timeout_s=8.0, close_timeout_s=3.0
    )
    killer = Killer(marker)
    groups: list[TrajectoryGroup] = []
    async with (
        serve_builtin_environment(SitesConfig()) as env,
        BrowserPool(config, on_event=killer.on_event) as pool,
    ):
        killer.pool = pool
        tasks = env.tasks("train")[:6]
        rollout = Rollout(
            environment=env,
            pool=pool,
            policy=OraclePolicy(),
            settings=EpisodeSettings(max_turns=6),
            max_episodes=8,
            on_event=killer.on_event,
        )
        send, receive = anyio.create_memory_object_stream[TrajectoryGroup](1)
        scheduler = Scheduler(
            rollout=rollout,
            tasks=tasks,
            send=send,
            group_size=4,
            max_groups=2,
            num_groups=40,
            shuffle=False,
        )
        # Each episode is bounded by its timeouts (a few turns of a few seconds each);
        # a hang shows as this limit. The run ends 3 groups after the last kill, so the
        # last group received began after it (on a slow machine the 8th kill may come late).
        after_last_kill = 0
        with anyio.fail_after(240):
            async with anyio.create_task_group() as tg, receive:
                tg.start_soon(scheduler.run)
                async for group in receive:
                    groups.append(group)
                    if len(killer.kills) == len(MOMENTS):
                        after_last_kill += 1
                        if after_last_kill > 2:
                            tg.cancel_scope.cancel()
                            break
        stats = pool.statistics()
    assert killer.kills == [m.__name__ for m in MOMENTS]
    assert stats.crashes == len(MOMENTS) and stats.launches == len(MOMENTS) + 1
    assert killer.faults == len(MOMENTS)
    assert after_last_kill == 3 and all(len(g.trajectories) == 4 for g in groups)
    statuses = Counter(t.status for g in groups for t in g.trajectories)
    assert set(statuses) <= {"exited", "max_turns", "error:browser"}, statuses
    assert statuses["error:browser"] > 0
    # After the last kill, the run goes on: the last groups all succeed.
    assert [t.reward for t in groups[-1].trajectories] == [1.0] * 4


async def test_tabs_opening_as_chromium_dies_fail_at_once() -> None:
    """Playwright's `new_page()` on a browser killed meanwhile never returns (with 8
    contexts opening tabs at the kill, most of them waited for good): every `open()`
    must instead fail with `BrowserError` as soon as the context closes, well within its
    navigation timeout, and the pool must relaunch for the next session."""
    marker = f"--webagent-test-pool={uuid.uuid4().hex}"
    config = BrowserConfig(extra_args=(marker,), navigation_timeout_s=120.0)
    outcomes: list[str] = []
    async with serve_builtin_environment(SitesConfig()) as env, BrowserPool(config) as pool:
        url = next(iter(env.urls.values()))

        async def episode(ready: anyio.Event, opened: list[int]) -> None:
            try:
                async with pool.session(allowed=[url]) as session:
                    opened.append(1)
                    if len(opened) == 8:
                        ready.set()
                    await ready.wait()
                    await session.open([url])
                    await session.observe(HTML)
                outcomes.append("ok")
            except BrowserError:
                outcomes.append("error:browser")

        for _ in range(3):
            ready, opened = anyio.Event(), list[int]()
            with anyio.fail_after(40):  # far below navigation_timeout_s
                async with anyio.create_task_group() as tg:
                    for _ in range(8):
                        tg.start_soon(episode, ready, opened)
                    await ready.wait()
                    # The moment of the kill (not a wait for a condition): 20 ms after
                    # the 8 episodes began to open their tabs, their new_page() calls
                    # are in flight.
                    await anyio.sleep(0.02)
                    for pid in _chromium_pids(marker):
                        os.kill(pid, signal.SIGKILL)
        async with pool.session(allowed=[url]) as session:
            await session.open([url])
            assert (await session.observe(HTML)).url.startswith(url)
        stats = pool.statistics()
    # An episode the machine let finish before every task blocked counts "ok".
    assert len(outcomes) == 24 and set(outcomes) <= {"ok", "error:browser"}
    assert Counter(outcomes)["error:browser"] >= 12, outcomes
    assert (stats.launches, stats.crashes) == (4, 3)
