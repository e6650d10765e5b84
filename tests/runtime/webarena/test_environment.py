"""`WebArenaEnvironment` on the built-in sites served as WebArena instances: leases,
resets between the rollouts of a state-changing group, storage states, failures, and
the environment factory."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import httpx
import msgspec
import pytest
from structlog.testing import capture_logs

from policy.profile import settle_auto
from runtime.base.config import (
    BrowserConfig,
    Config,
    SitesConfig,
    WebArenaInstanceConfig,
)
from runtime.base.messages import PolicyReply, PolicyRequest, TaskConfig
from runtime.browser import BrowserPool
from runtime.oracle import OraclePolicy
from runtime.task_runs import run_tasks
from runtime.webarena_environment import (
    WebArenaEnvironment,
    instances_from_config,
    open_environment,
)
from sites.auth import StorageStates, accounts_from_config
from sites.builtin import BuiltinSites
from sites.errors import SiteURLError
from sites.pool import HttpResetter, Instance, InstancePool

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

CONFIG = settle_auto(Config(browser=BrowserConfig(action_timeout_s=5.0, max_contexts=8)))


class DoNothing:
    """A policy that exits at once: it changes nothing."""

    async def act(self, request: PolicyRequest) -> PolicyReply:
        return PolicyReply(text='<think>Done.</think><answer>exit(message="")</answer>')


def _task(suite: dict[str, list[TaskConfig]], task_id: int) -> TaskConfig:
    return next(t for t in suite["test"] if t.task_id == task_id)


def environment(
    instances: list[Instance],
    tasks: list[TaskConfig],
    auth_dir: Path,
    fakes: ModuleType,
    browser: BrowserPool,
) -> WebArenaEnvironment:
    states = StorageStates(auth_dir, accounts_from_config(fakes.BUILTIN_ACCOUNTS))
    pool = InstancePool(instances, on_reset=states.invalidate)
    return WebArenaEnvironment(pool, {"test": tasks}, states=states, browser=browser)


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.json"))


async def test_a_state_changing_group_is_reset_before_each_rollout(
    builtin_sites: BuiltinSites,
    fakes: ModuleType,
    suite: dict[str, list[TaskConfig]],
    tmp_path: Path,
    browser_pool: BrowserPool,
) -> None:
    # "Create a post in the books forum ...", checked by program_html on /f/books/365:
    # the id the first post of a fresh state gets.
    task = fakes.as_webarena(_task(suite, 100000))
    assert task.storage_state == "./.auth/reddit_state.json" and task.require_reset is True
    site = fakes.BuiltinInstance(builtin_sites, "wa-0")
    server = fakes.FakeResetServer(delay_s=0.05, on_reset=site.reset)
    async with httpx.AsyncClient() as client, fakes.serve_app(server.app) as reset_url:
        resetter = HttpResetter("wa-0", reset_url, client, poll_s=0.02, site_urls=[reset_url])
        env = environment([site.instance(resetter)], [task], tmp_path, fakes, browser_pool)
        with capture_logs() as logs:
            oracle = await run_tasks(
                CONFIG, env, OraclePolicy(), [task], group_size=2, concurrency=2, pool=browser_pool
            )
            [group] = oracle.groups
            cost = env.log_group(group)
        # Both rollouts succeed: each ran alone on a state reset right before it.
        assert [t.reward for t in group.trajectories] == [1.0, 1.0]
        assert server.completed == 2 and site.resets == 2
        assert cost is not None and cost.as_fields()["policy"] == "exclusive-reset"
        assert (cost.episodes, cost.resets) == (2, 2) and cost.reset_s >= 0.1
        line = next(e for e in logs if e["event"] == "webarena.group")
        assert line["group_id"] == group.group_id and line["resets"] == 2
        # The reset removed the logins: the storage state was checked and renewed.
        assert env.states is not None and env.states.statistics().logins >= 2

        # An agent that does nothing now gets the reward it deserves: 0.
        idle = await run_tasks(
            CONFIG, env, DoNothing(), [task], group_size=1, concurrency=1, pool=browser_pool
        )
        assert [t.reward for t in idle.groups[0].trajectories] == [0.0]


async def test_without_resets_a_do_nothing_agent_is_scored_on_an_earlier_rollout(
    builtin_sites: BuiltinSites,
    fakes: ModuleType,
    suite: dict[str, list[TaskConfig]],
    tmp_path: Path,
    browser_pool: BrowserPool,
) -> None:
    """What the reference implementations do (no reset between rollouts), and why not."""
    task = fakes.as_webarena(_task(suite, 100000))
    site = fakes.BuiltinInstance(builtin_sites, "wa-plain")
    env = environment([site.instance(None)], [task], tmp_path, fakes, browser_pool)
    await run_tasks(
        CONFIG, env, OraclePolicy(), [task], group_size=1, concurrency=1, pool=browser_pool
    )
    idle = await run_tasks(
        CONFIG, env, DoNothing(), [task], group_size=1, concurrency=1, pool=browser_pool
    )
    cost = env.log_group(idle.groups[0])
    assert [t.reward for t in idle.groups[0].trajectories] == [1.0]  # a wrong reward
    assert cost is not None and cost.as_fields()["policy"] == "exclusive-unreset"
    assert env.pool.statistics().unreset_exclusive == 2


async def test_episodes_get_their_instance_urls_cookies_and_storage_state(
    builtin_sites: BuiltinSites,
    fakes: ModuleType,
    suite: dict[str, list[TaskConfig]],
    tmp_path: Path,
    browser_pool: BrowserPool,
) -> None:
    reader = fakes.as_webarena(
        next(t for t in suite["test"] if t.require_login is True and not t.require_reset),
        sites=["gitlab", "reddit"],
    )
    a, b = fakes.BuiltinInstance(builtin_sites, "a"), fakes.BuiltinInstance(builtin_sites, "b")
    instances = [a.instance(None, max_episodes=1), b.instance(None, max_episodes=1)]
    env = environment(instances, [reader], tmp_path, fakes, browser_pool)
    async with env.episode(reader) as first, env.episode(reader) as second:
        assert {first.tenant, second.tenant} == {"a", "b"}  # one reader each (max 1)
        for setup, site in ((first, a if first.tenant == "a" else b), (second, None)):
            assert "__" not in setup.start_urls[0]
            assert setup.start_urls[0].startswith(setup.urls["SHOPPING"].rsplit(":", 1)[0])
            assert sorted(setup.allowed) == sorted(set(setup.urls.values()))
            if site is not None:
                assert {"name": "webagent_tenant", "value": site.tenant} in [
                    {"name": c["name"], "value": c["value"]} for c in setup.cookies
                ]
    assert _files(tmp_path) == ["a/gitlab.reddit_state.json", "b/gitlab.reddit_state.json"]


async def test_no_instance_left_fails_episodes_with_a_clear_error(
    builtin_sites: BuiltinSites,
    fakes: ModuleType,
    suite: dict[str, list[TaskConfig]],
    tmp_path: Path,
    browser_pool: BrowserPool,
) -> None:
    task = fakes.as_webarena(_task(suite, 100000))
    site = fakes.BuiltinInstance(builtin_sites, "broken")
    server = fakes.FakeResetServer(mode="failing")
    async with httpx.AsyncClient() as client, fakes.serve_app(server.app) as reset_url:
        resetter = HttpResetter("broken", reset_url, client, poll_s=0.02)
        env = environment([site.instance(resetter)], [task], tmp_path, fakes, browser_pool)
        run = await run_tasks(
            CONFIG, env, OraclePolicy(), [task], group_size=2, concurrency=2, pool=browser_pool
        )
        cost = env.log_group(run.groups[0])
    assert [t.status for t in run.groups[0].trajectories] == ["error:environment"] * 2
    assert cost is not None and cost.errors
    assert cost.errors[0].startswith("NoInstanceError: no WebArena instance is left")
    assert "Error executing reset script" in cost.errors[0]
    assert env.pool.statistics().failed.keys() == {"broken"}


async def test_instances_from_config_and_the_factory(
    tmp_path: Path, browser_pool: BrowserPool
) -> None:
    sites = SitesConfig(
        kind="webarena",
        urls={"SHOPPING": "http://shop:7770", "WIKIPEDIA": "http://wiki:8888/w"},
        instances=(
            WebArenaInstanceConfig(
                name="i0", urls={"SHOPPING": "http://i0:7770"}, reset_url="http://i0:7565"
            ),
            WebArenaInstanceConfig(
                name="i1", urls={"GITLAB": "http://i1:8023"}, reset_command="true"
            ),
        ),
    )
    async with httpx.AsyncClient() as client:
        i0, i1 = instances_from_config(sites, client, url_overrides={"WIKIPEDIA": "http://w:1"})
        assert i0.urls == {"SHOPPING": "http://i0:7770", "WIKIPEDIA": "http://w:1"}
        assert i1.urls["SHOPPING"] == "http://shop:7770" and i1.urls["GITLAB"] == "http://i1:8023"
        assert i0.resetter is not None and i0.resetter.describe() == "reset server http://i0:7565"
        assert i1.resetter is not None and i1.resetter.describe() == "command 'true'"
        [default] = instances_from_config(
            SitesConfig(kind="webarena"), client, url_overrides={"MAP": "http://m:3000/"}
        )
        assert (default.name, default.urls, default.resetter) == (
            "default",
            {"MAP": "http://m:3000"},
            None,
        )
        with pytest.raises(SiteURLError, match="no WebArena site URLs"):
            instances_from_config(SitesConfig(kind="webarena"), client)
        both = msgspec.structs.replace(sites.instances[0], reset_command="docker restart shopping")
        with pytest.raises(
            SiteURLError, match=r"sites.instances\[0\]: set reset_url or reset_command"
        ):
            instances_from_config(msgspec.structs.replace(sites, instances=(both,)), client)

    # The factory: WebArena tasks from sites.tasks serve every split; placeholders must
    # resolve on every instance.
    tasks_file = tmp_path / "tasks.json"
    tasks_file.write_text(
        '[{"task_id": 1, "intent": "x", "start_url": "__MAP__", "sites": ["map"],'
        ' "eval": {"eval_types": ["url_match"], "reference_url": "__MAP__/a"}}]'
    )
    config = Config(
        sites=SitesConfig(kind="webarena", tasks=str(tasks_file), auth_dir=str(tmp_path / "auth")),
        browser=CONFIG.browser,
    )
    async with open_environment(
        config, url_overrides={"MAP": "http://m:3000"}, browser=browser_pool
    ) as env:
        assert isinstance(env, WebArenaEnvironment)
        assert (
            [t.task_id for t in env.tasks("train")] == [1] == [t.task_id for t in env.tasks("test")]
        )
    with pytest.raises(SiteURLError, match=r"task 1 uses __MAP__"):
        async with open_environment(
            config, url_overrides={"SHOPPING": "http://s:1"}, browser=browser_pool
        ):
            pass
