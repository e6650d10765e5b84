"""episode.Gate: closed while any reason holds it (a pause, an update), open when none do."""

from __future__ import annotations

import anyio
import pytest

from runtime.episode import Gate

pytestmark = pytest.mark.anyio


async def test_a_pause_outlasts_an_update_and_the_reverse() -> None:
    gate = Gate()
    gate.close("pause")
    gate.close("update")
    gate.open("update")
    assert not gate.is_open and gate.closed_for == {"pause"}
    gate.close("update")
    gate.open("pause")
    assert not gate.is_open and gate.closed_for == {"update"}
    gate.open("update")
    assert gate.is_open and gate.closed_for == frozenset()


async def test_waiters_pass_only_when_the_last_reason_goes() -> None:
    gate = Gate()
    gate.close("pause")
    gate.close("update")
    passed = anyio.Event()

    async def wait() -> None:
        await gate.wait_open()
        passed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        with anyio.fail_after(5):
            await gate.wait_held(1)
        gate.open("pause")
        await anyio.sleep(0.05)
        assert not passed.is_set()
        gate.open("update")
        with anyio.fail_after(5):
            await passed.wait()


async def test_open_all_clears_every_reason() -> None:
    gate = Gate()
    gate.close("pause")
    gate.close("update")
    gate.open_all()
    assert gate.is_open
    gate.close("update")
    assert gate.closed_for == {"update"}  # the old reasons did not come back


async def test_every_change_is_seen_and_a_copied_state_holds_waiters() -> None:
    """`on_change` is how the driver's gate reaches Ray's rollout workers; `set_reasons`
    is how a worker's gate takes the driver's state."""
    seen: list[frozenset[str]] = []
    driver = Gate(on_change=seen.append)
    driver.close("pause")
    driver.close("update")
    driver.open("pause")
    driver.open_all()
    assert seen == [{"pause"}, {"pause", "update"}, {"update"}, frozenset()]

    worker = Gate()
    worker.set_reasons(["update"])
    passed = anyio.Event()

    async def wait() -> None:
        await worker.wait_open()
        passed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        with anyio.fail_after(5):
            await worker.wait_held(1)
        worker.set_reasons(["pause"])
        await anyio.sleep(0.05)
        assert not passed.is_set() and worker.closed_for == {"pause"}
        worker.set_reasons([])
        with anyio.fail_after(5):
            await passed.wait()
