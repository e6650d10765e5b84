"""The oracle on the built-in suite through real Chromium, and isolation between tenants."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

from policy.profile import settle_auto
from runtime.base.config import BrowserConfig, Config, ObservationConfig, SitesConfig
from runtime.base.messages import PolicyReply, PolicyRequest, TaskConfig
from runtime.browser import BrowserPool
from runtime.environment import BuiltinEnvironment, serve_builtin_environment
from runtime.oracle import OraclePolicy
from runtime.task_runs import run_tasks

# The oracle reads WebArena-style HTML here (the default for a model made elsewhere).
HTML = settle_auto(msgspec.structs.replace(Config(), observation=ObservationConfig(style="html")))

pytestmark = [pytest.mark.anyio, pytest.mark.browser]


@pytest.fixture(scope="module")
async def pool(anyio_backend: str) -> AsyncIterator[BrowserPool]:
    """A browser with the product's action and navigation timeouts (the shared test pool's
    3 s made a search time out under load: 32 contexts at once on 2 busy cores)."""
    async with BrowserPool(BrowserConfig(wait_action_s=0.2)) as browser_pool:
        yield browser_pool


@pytest.fixture(scope="module")
async def environment(anyio_backend: str) -> AsyncIterator[BuiltinEnvironment]:
    async with serve_builtin_environment(SitesConfig()) as env:
        yield env


class _GiveUp:
    """Exits at once with an empty answer."""

    async def act(self, request: PolicyRequest) -> PolicyReply:
        del request
        return PolicyReply(text='<think>Stop.</think><answer>exit(message="")</answer>')


def _of_kind(tasks: list[TaskConfig], kind: str) -> list[TaskConfig]:
    return [t for t in tasks if t.extra_fields.get("kind") == kind]


def _one_per_site(tasks: list[TaskConfig]) -> list[TaskConfig]:
    seen: dict[str, TaskConfig] = {}
    for task in tasks:
        seen.setdefault(task.sites[0], task)
    return list(seen.values())


@pytest.mark.slow
async def test_oracle_solves_tasks_of_every_site_in_groups_of_8(
    environment: BuiltinEnvironment, pool: BrowserPool
) -> None:
    tasks = _one_per_site(environment.tasks("test")) + _one_per_site(environment.tasks("ood"))
    assert len(tasks) == 10
    result = await run_tasks(
        HTML, environment, OraclePolicy(), tasks, group_size=8, concurrency=32, pool=pool
    )
    assert len(result.groups) == 10
    failures = [
        (t.task_id, t.status, t.answer, t.evaluation)
        for g in result.groups
        for t in g.trajectories
        if t.reward != 1.0
    ]
    assert failures == []
    assert all(len(g.trajectories) == 8 for g in result.groups)


async def test_a_state_changing_task_succeeds_8_times_in_one_group(
    environment: BuiltinEnvironment, pool: BrowserPool
) -> None:
    writes = [
        t
        for t in environment.tasks("test")
        if t.require_reset is True and "program_html" in t.eval.eval_types
    ]
    task = writes[0]
    before = environment.sites.statistics()
    result = await run_tasks(
        HTML, environment, OraclePolicy(), [task], group_size=8, concurrency=8, pool=pool
    )
    [group] = result.groups
    assert [t.reward for t in group.trajectories] == [1.0] * 8
    # Each episode wrote to its own tenant, and every tenant was dropped afterwards.
    after = environment.sites.statistics()
    assert after["tenants_created"] - before["tenants_created"] == 8
    assert after["tenants_alive"] == before["tenants_alive"]
    assert after["tenant_rows_written"] >= before["tenant_rows_written"]


async def test_evolved_tasks_keep_real_evaluators(
    environment: BuiltinEnvironment, pool: BrowserPool
) -> None:
    """Tasks WebRL's evolution makes from failed ones are solved by the oracle's plan and
    scored by their template's evaluator: 1 for the plan, 0 for an empty answer."""
    import random

    from sites.builtin.evolve import Evolver

    parents = [t for t in environment.tasks("train") if t.sites[0] in ("shopping_admin", "map")]
    made = Evolver(0, rng=random.Random(2)).evolve(parents[:6], phase=1, per_parent=3).tasks
    # Two of each kind, as they came.
    children = [t for kind in ("instance", "easier", "harder") for t in _of_kind(made, kind)[:2]]
    assert len(children) == 6
    solved = await run_tasks(
        HTML, environment, OraclePolicy(), children, group_size=1, concurrency=6, pool=pool
    )
    assert [t.reward for g in solved.groups for t in g.trajectories] == [1.0] * 6
    given_up = await run_tasks(
        HTML, environment, _GiveUp(), children, group_size=1, concurrency=6, pool=pool
    )
    assert [t.reward for g in given_up.groups for t in g.trajectories] == [0.0] * 6
