"""The instance pool against fake reset servers on 127.0.0.1 (ok, slow, failing, hanging,
refusing) and shell-command resets: who gets which instance, when resets happen, and
what a failed reset does."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from types import ModuleType

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from structlog.testing import capture_logs

from sites.errors import NoInstanceError, ResetError
from sites.pool import (
    CommandResetter,
    HttpResetter,
    Instance,
    InstancePool,
    Lease,
    wait_sites,
)

pytestmark = pytest.mark.anyio

POLL_S = 0.02


def _instance(name: str, url: str, client: httpx.AsyncClient, timeout_s: float = 5.0) -> Instance:
    resetter = HttpResetter(name, url, client, timeout_s=timeout_s, poll_s=POLL_S, site_urls=[url])
    return Instance(name=name, urls={"SHOPPING": url}, resetter=resetter)


class Tracker:
    """Records leases and checks that nobody shares an instance with a writer."""

    def __init__(self) -> None:
        self.leases: list[Lease] = []
        self.readers: Counter[str] = Counter()
        self.writers: Counter[str] = Counter()
        self.peak_readers = 0
        self.order: list[str] = []

    async def hold(
        self, pool: InstancePool, *, exclusive: bool, label: str = "", s: float = 0.05
    ) -> None:
        async with pool.lease(exclusive=exclusive) as lease:
            self.leases.append(lease)
            self.order.append(label)
            counter = self.writers if exclusive else self.readers
            counter[lease.instance] += 1
            assert self.writers[lease.instance] <= 1
            assert not (self.writers[lease.instance] and self.readers[lease.instance])
            self.peak_readers = max(self.peak_readers, self.readers[lease.instance])
            await anyio.sleep(s)  # the episode's work
            counter[lease.instance] -= 1


async def test_a_group_of_state_changing_episodes_is_spread_and_reset(fakes: ModuleType) -> None:
    servers = [fakes.FakeResetServer(delay_s=0.05), fakes.FakeResetServer(delay_s=0.05)]
    async with (
        httpx.AsyncClient() as client,
        fakes.serve_app(servers[0].app) as url0,
        fakes.serve_app(servers[1].app) as url1,
    ):
        pool = InstancePool([_instance("a", url0, client), _instance("b", url1, client)])
        tracker = Tracker()
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                for _ in range(4):  # a group of 4 on 2 instances
                    tg.start_soon(lambda: tracker.hold(pool, exclusive=True))
    assert len(tracker.leases) == 4
    assert all(lease.exclusive and lease.reset for lease in tracker.leases)
    assert {lease.policy for lease in tracker.leases} == {"exclusive-reset"}
    assert {lease.instance for lease in tracker.leases} == {"a", "b"}
    assert all(lease.reset_s >= 0.05 for lease in tracker.leases)
    assert sum(1 for lease in tracker.leases if lease.wait_s > 0.04) >= 2  # queued
    assert servers[0].completed + servers[1].completed == 4
    stats = pool.statistics()
    assert (stats.resets, stats.leases_exclusive, stats.reset_failures) == (4, 4, 0)
    assert stats.reset_s >= 0.2
    assert stats.waiting == 0 and stats.exclusive == [] and stats.failed == {}
    lines = [e for e in logs if e["event"] == "webarena.lease"]
    assert len(lines) == 4 and all(e["policy"] == "exclusive-reset" for e in lines)


async def test_read_only_episodes_share_an_instance_without_reset(fakes: ModuleType) -> None:
    server = fakes.FakeResetServer()
    async with httpx.AsyncClient() as client, fakes.serve_app(server.app) as url:
        pool = InstancePool([_instance("a", url, client)])
        tracker = Tracker()
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(lambda: tracker.hold(pool, exclusive=False))
    assert [lease.policy for lease in tracker.leases] == ["shared"] * 5
    assert tracker.peak_readers == 5
    assert server.reset_requests == 0
    assert pool.statistics().leases_shared == 5


async def test_readers_avoid_a_changed_instance_and_a_fresh_one_is_not_reset_again(
    fakes: ModuleType,
) -> None:
    server = fakes.FakeResetServer(delay_s=0.1)  # slow
    async with httpx.AsyncClient() as client, fakes.serve_app(server.app) as url:
        pool = InstancePool([_instance("a", url, client)])
        async with pool.lease(exclusive=True) as first:
            pass
        async with pool.lease(exclusive=False) as reader:
            pass
        async with pool.lease(exclusive=True) as second:
            pass
    assert (first.policy, first.reset) == ("exclusive-reset", True)
    # The writer changed the instance: the reader resets it before reading ...
    assert (reader.policy, reader.reset) == ("shared", True)
    assert reader.reset_s >= 0.1
    # ... so the next writer finds it fresh and needs no reset of its own.
    assert (second.policy, second.reset) == ("exclusive-fresh", False)
    assert server.completed == 2


async def test_waiting_writers_go_before_later_readers(fakes: ModuleType) -> None:
    pool = InstancePool([Instance(name="a", urls={})])
    tracker = Tracker()
    started = anyio.Event()

    async def first_reader() -> None:
        async with pool.lease(exclusive=False):
            started.set()
            tracker.order.append("reader-1")
            with anyio.fail_after(5):
                await pool.wait_queued(2)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first_reader)
        await started.wait()
        tg.start_soon(lambda: tracker.hold(pool, exclusive=True, label="writer", s=0.01))
        with anyio.fail_after(5):
            await pool.wait_queued(1)
        tg.start_soon(lambda: tracker.hold(pool, exclusive=False, label="reader-2", s=0.01))
    assert tracker.order == ["reader-1", "writer", "reader-2"]


async def test_a_failing_reset_takes_the_instance_out(fakes: ModuleType) -> None:
    bad, good = fakes.FakeResetServer(mode="failing"), fakes.FakeResetServer()
    async with (
        httpx.AsyncClient() as client,
        fakes.serve_app(bad.app) as url_bad,
        fakes.serve_app(good.app) as url_good,
    ):
        pool = InstancePool(
            [_instance("bad", url_bad, client), _instance("good", url_good, client)]
        )
        with capture_logs() as logs:
            async with pool.lease(exclusive=True) as lease:
                assert lease.instance == "good"
            async with pool.lease(exclusive=False) as reader:
                assert reader.instance == "good"
    stats = pool.statistics()
    assert stats.healthy == 1 and stats.reset_failures == 1
    assert "Error executing reset script" in stats.failed["bad"]
    assert "instance 'bad': reset failed" in stats.failed["bad"]
    failed = [e for e in logs if e["event"] == "webarena.instance_failed"]
    assert failed and failed[0]["instance"] == "bad" and failed[0]["log_level"] == "error"
    assert lease.reset_s > 0  # the failed attempt counts in the cost


async def test_a_reset_that_times_out_fails_every_waiting_episode(fakes: ModuleType) -> None:
    server = fakes.FakeResetServer(mode="hanging")
    async with httpx.AsyncClient() as client, fakes.serve_app(server.app) as url:
        pool = InstancePool([_instance("only", url, client, timeout_s=0.5)])
        errors: list[Exception] = []

        async def episode(exclusive: bool) -> None:
            try:
                async with pool.lease(exclusive=exclusive):
                    raise AssertionError("no lease may be granted")
            except NoInstanceError as exc:
                errors.append(exc)

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(episode, True)
            await server.started.wait()  # the first one is resetting
            assert pool.statistics().resetting == ["only"]
            tg.start_soon(episode, False)
            tg.start_soon(episode, True)
    assert len(errors) == 3
    assert time.monotonic() - started < 3
    assert "no WebArena instance is left" in str(errors[0])
    assert "not ready within 0.5 s (last: 200 'Reset ongoing')" in str(errors[0])
    with pytest.raises(NoInstanceError):
        async with pool.lease(exclusive=False):
            pass


@pytest.mark.parametrize(
    ("mode", "message"),
    [("refusing", "answered 500"), ("closed", "cannot reach")],
)
async def test_a_reset_server_that_refuses_or_is_gone(
    fakes: ModuleType, mode: str, message: str
) -> None:
    server = fakes.FakeResetServer(mode="refusing")
    async with httpx.AsyncClient() as client:
        async with fakes.serve_app(server.app) as url:
            if mode == "refusing":
                with pytest.raises(ResetError, match=message):
                    await HttpResetter("x", url, client, timeout_s=2).reset()
        if mode == "closed":  # the server is gone: nothing listens on its port any more
            with pytest.raises(ResetError, match=message):
                await HttpResetter("x", url, client, timeout_s=2).reset()


async def test_reset_waits_for_the_sites_to_answer(fakes: ModuleType) -> None:
    answers = iter([503, 502, 200])
    seen: list[int] = []

    async def site(request: Request) -> PlainTextResponse:
        code = next(answers, 200)
        seen.append(code)
        return PlainTextResponse("site", status_code=code)

    app = Starlette(routes=[Route("/", site)])
    async with httpx.AsyncClient() as client, fakes.serve_app(app) as url:
        with anyio.fail_after(5):
            await wait_sites(client, [url + "/"], POLL_S)
    assert seen == [503, 502, 200]


async def test_command_reset_success_failure_and_timeout(tmp_path: Path) -> None:
    marker = tmp_path / "reset-done"
    await CommandResetter("i", f"echo resetting; touch {marker}", timeout_s=5).reset()
    assert marker.exists()

    with pytest.raises(ResetError, match=r"exited with status 3: 'docker: no such container'"):
        await CommandResetter("i", "echo 'docker: no such container'; exit 3", timeout_s=5).reset()

    pid_file = tmp_path / "child.pid"
    command = f"sleep 30 & echo $! > {pid_file}; wait"
    started = time.monotonic()
    with pytest.raises(ResetError, match=r"did not finish within 0.5 s"):
        await CommandResetter("i", command, timeout_s=0.5).reset()
    assert time.monotonic() - started < 5
    child = int(pid_file.read_text())
    with anyio.fail_after(5):  # the whole process group was killed, not just the shell
        while _alive(child):  # noqa: ASYNC110 - no event says when the kernel has reaped it
            await anyio.sleep(0.01)


def _alive(pid: int) -> bool:
    """Is `pid` a live process (not gone, not a zombie nobody reaped yet)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    pool = InstancePool([Instance(name="a", urls={})])
    async with pool.lease(exclusive=True):
        with anyio.move_on_after(0.05) as scope:
            async with pool.lease(exclusive=True):
                raise AssertionError("the instance is held")
        assert scope.cancelled_caught
        assert pool.statistics().waiting == 0
    async with pool.lease(exclusive=True) as lease:
        assert lease.instance == "a"
    assert pool.statistics().exclusive == []


async def test_an_instance_without_reset_hook_is_used_as_is_and_counted() -> None:
    pool = InstancePool([Instance(name="plain", urls={})])
    with capture_logs() as logs:
        async with pool.lease(exclusive=True) as writer:
            pass
        async with pool.lease(exclusive=False) as reader:
            pass
    assert writer.policy == "exclusive-unreset"
    assert reader.policy == "shared-dirty"
    stats = pool.statistics()
    assert (stats.unreset_exclusive, stats.dirty_reads, stats.resets) == (1, 1, 0)
    assert any(e["event"] == "webarena.unreset_exclusive" for e in logs)


def test_pool_needs_instances_with_unique_names() -> None:
    with pytest.raises(ValueError, match="at least one"):
        InstancePool([])
    with pytest.raises(ValueError, match="unique"):
        InstancePool([Instance(name="a", urls={}), Instance(name="a", urls={})])
