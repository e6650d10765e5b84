"""`webagent eval` and `run_evaluation`: the paper's table, per-task results, the HTML
report (opened in Chromium), and the instance policy recorded per task on WebArena."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import anyio
import httpx
import msgspec
import pytest
from playwright.async_api import BrowserContext

from policy.profile import settle_auto
from runtime.base.config import BrowserConfig, Config
from runtime.base.messages import TaskConfig
from runtime.browser import BrowserPool
from runtime.cli import main
from runtime.evaluation import (
    EpisodeResult,
    TaskResult,
    run_evaluation,
    score_table,
)
from runtime.oracle import OraclePolicy
from runtime.webarena_environment import WebArenaEnvironment
from sites.auth import StorageStates, accounts_from_config
from sites.builtin import BuiltinSites
from sites.pool import HttpResetter, InstancePool

HEADER = "| Reddit | GitLab | CMS | Map | Shopping | Avg. |"


def _pick(suite: dict[str, list[TaskConfig]], fakes: ModuleType) -> list[TaskConfig]:
    """One task per site (a state-changing one for reddit) and one multi-site task."""
    test = suite["test"]
    chosen = [next(t for t in test if t.task_id == 100000)]  # reddit, program_html
    for site in ("gitlab", "shopping_admin", "map", "shopping"):
        chosen.append(next(t for t in test if t.sites == [site] and not t.require_reset))
    reader = next(t for t in test if t.sites == ["reddit"] and not t.require_reset)
    reader = msgspec.structs.replace(reader, require_login=True)
    multi = fakes.as_webarena(reader, sites=["gitlab", "reddit"])
    return [*(fakes.as_webarena(t) for t in chosen), multi]


@pytest.mark.anyio
@pytest.mark.browser
async def test_eval_cli_oracle_table_results_and_report(
    context: BrowserContext,
    wa_file: Callable[[Sequence[TaskConfig]], Path],
    suite: dict[str, list[TaskConfig]],
    fakes: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tasks = _pick(suite, fakes)
    path = wa_file(tasks)
    raw = path.read_text()
    assert "__REDDIT__" in raw and "./.auth/gitlab.reddit_state.json" in raw
    out = tmp_path / "eval"
    argv = [
        "--log-level", "warning",
        "eval", "--tasks", str(path), "--policy", "oracle", "--max-turns", "12",
        "--concurrency", "4", "--out", str(out),
    ]  # fmt: skip
    code = await anyio.to_thread.run_sync(main, argv)
    printed = capsys.readouterr().out
    assert code == 0
    assert HEADER in printed
    assert "| 100.0 | 100.0 | 100.0 | 100.0 | 100.0 | 100.0 |" in printed
    assert "| 2/2 | 2/2 | 1/1 | 1/1 | 1/1 | 6/6 |" in printed  # the multi-site task twice
    assert "multi-site tasks: 1" in printed

    lines = (out / "results.jsonl").read_text().splitlines()
    results = [msgspec.json.decode(line, type=TaskResult) for line in lines]
    assert sorted(r.task_id for r in results) == sorted(t.task_id for t in tasks)
    assert not (out / "results.jsonl.partial").exists()
    multi = next(r for r in results if r.sites == ["gitlab", "reddit"])
    assert multi.columns == ["Reddit", "GitLab"] and multi.successes == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["table"]["Avg."] == {"tasks": 6, "episodes": 6, "successes": 6, "unjudged": 0}
    assert (out / "trajectories.jsonl").stat().st_size > 0
    assert (out / "table.md").read_text().splitlines()[1] == HEADER

    # The report, in Chromium: one self-contained page listing every task and turn.
    requests: list[str] = []
    context.on("request", lambda request: requests.append(request.url))
    page = await context.new_page()
    await page.goto((out / "report.html").as_uri())
    listed = await page.eval_on_selector_all(
        "section[data-task-id]", "els => els.map(e => Number(e.dataset.taskId))"
    )
    assert sorted(listed) == sorted(t.task_id for t in tasks)
    index = await page.eval_on_selector_all("#tasks a", "els => els.map(e => e.textContent)")
    assert sorted(int(i) for i in index) == sorted(listed)
    rows = await page.locator("table.turns tr:has(td)").count()
    assert rows == sum(e.turns for r in results for e in r.episodes) > len(tasks)
    assert await page.locator("table#table th").all_inner_texts() == [
        "Reddit", "GitLab", "CMS", "Map", "Shopping", "Avg.",
    ]  # fmt: skip
    first = page.locator("section[data-task-id] table.turns tr:has(td)").first
    cells = await first.locator("td").all_text_contents()  # collapsed: no innerText
    assert cells[0] == "0" and cells[1].startswith("http://127.0.0.1:")
    assert cells[3].startswith(("do(", "exit(", "go_"))
    assert [url for url in requests if not url.startswith("file://")] == []


@pytest.mark.anyio
@pytest.mark.browser
async def test_run_evaluation_on_webarena_records_the_instance_policy(
    builtin_sites: BuiltinSites,
    fakes: ModuleType,
    suite: dict[str, list[TaskConfig]],
    browser_pool: BrowserPool,
    tmp_path: Path,
) -> None:
    writer = fakes.as_webarena(next(t for t in suite["test"] if t.task_id == 100000))
    reader = fakes.as_webarena(next(t for t in suite["test"] if t.sites == ["map"]))
    sites = [fakes.BuiltinInstance(builtin_sites, f"wa-{i}") for i in range(2)]
    servers = [fakes.FakeResetServer(delay_s=0.05, on_reset=s.reset) for s in sites]
    states = StorageStates(tmp_path / "auth", accounts_from_config(fakes.BUILTIN_ACCOUNTS))
    async with (
        httpx.AsyncClient() as client,
        fakes.serve_app(servers[0].app) as url0,
        fakes.serve_app(servers[1].app) as url1,
    ):
        instances = [
            site.instance(HttpResetter(site.name, url, client, poll_s=0.02))
            for site, url in zip(sites, (url0, url1), strict=True)
        ]
        pool = InstancePool(instances, on_reset=states.invalidate)
        env = WebArenaEnvironment(
            pool, {"test": [writer, reader]}, states=states, browser=browser_pool
        )
        made = await env.prepare([writer, reader])
        assert made == {"wa-0": ["reddit_state.json"], "wa-1": ["reddit_state.json"]}
        report = await run_evaluation(
            settle_auto(Config(browser=BrowserConfig(action_timeout_s=5.0))),
            env,
            OraclePolicy(),
            [writer, reader],
            out_dir=tmp_path / "out",
            group_size=2,
            concurrency=4,
            pool=browser_pool,
            title="oracle on WebArena-style instances",
        )
    assert report.successes == 4 and report.table["Reddit"].episodes == 2
    results = {
        r.task_id: r
        for r in (
            msgspec.json.decode(line, type=TaskResult)
            for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()
        )
    }
    spread = results[writer.task_id].environment
    assert spread["policy"] == "exclusive-reset" and spread["resets"] == 2
    assert set(spread["instances"]) <= {"wa-0", "wa-1"}
    assert results[reader.task_id].environment["policy"] == "shared"
    assert report.environment["pool"]["resets"] >= 2
    assert report.environment["pool"]["leases_exclusive"] == 2
    html = (tmp_path / "out" / "report.html").read_text()
    assert "instances: exclusive-reset" in html and "oracle on WebArena-style instances" in html


def test_the_table_counts_multi_site_tasks_in_each_column() -> None:
    def result(task_id: int, sites: list[str], columns: list[str], won: list[bool]) -> TaskResult:
        episodes = [
            EpisodeResult(
                episode_id=f"{task_id}-{i}", status="exited", reward=float(w), answer="",
                turns=1, seconds=1.0,
            )
            for i, w in enumerate(won)
        ]  # fmt: skip
        return TaskResult(
            task_id=task_id, intent="", sites=sites, columns=columns, group_id="g",
            episodes=episodes, successes=sum(won), success_rate=sum(won) / len(won),
        )  # fmt: skip

    results = [
        result(1, ["gitlab", "reddit"], ["Reddit", "GitLab"], [True, False]),
        result(2, ["gitlab"], ["GitLab"], [True, True]),
        result(3, ["wikipedia"], [], [False, False]),
    ]
    table = score_table(results)
    assert list(table) == ["Reddit", "GitLab", "CMS", "Map", "Shopping", "Avg."]
    assert (table["Reddit"].episodes, table["Reddit"].successes) == (2, 1)
    assert (table["GitLab"].tasks, table["GitLab"].episodes, table["GitLab"].successes) == (2, 4, 3)
    assert (table["Avg."].tasks, table["Avg."].episodes, table["Avg."].successes) == (3, 6, 3)
    assert table["CMS"].episodes == 0


def test_unjudged_episodes_are_counted_apart_not_as_failures() -> None:
    """An episode whose check no judge could score (here an "orm" check without an outcome
    reward model) has no score: the table, the rates and the report leave it out and
    name it, instead of counting a guessed 0 as a failure."""
    from runtime.base.messages import EvalCheck, Evaluation, Trajectory, TrajectoryGroup
    from runtime.evaluation import EvalReport, format_table, render_report, task_result

    def episode(n: int, reward: float, unjudged: bool) -> Trajectory:
        check = EvalCheck(kind="orm", passed=None if unjudged else reward > 0, detail="d")
        return Trajectory(
            episode_id=f"e{n}", group_id="g", task_id=7, intent="i", reward=reward,
            evaluation=Evaluation(reward=reward, checks=[check], unjudged=unjudged),
        )  # fmt: skip

    task = TaskConfig(task_id=7, intent="i", sites=["gitlab"], start_url="http://x/")
    group = TrajectoryGroup(
        group_id="g", task_id=7, created_at=0.0,
        trajectories=[episode(0, 1.0, False), episode(1, 0.0, False), episode(2, 0.0, True)],
    )  # fmt: skip
    result = task_result(task, group)
    assert (result.successes, result.unjudged, result.success_rate) == (1, 1, 0.5)
    assert [e.unjudged for e in result.episodes] == [False, False, True]
    # The template goes with the line where the task names one (comparisons group by it).
    assert result.intent_template_id is None
    templated = msgspec.structs.replace(task, intent_template_id=412)
    assert task_result(templated, group).intent_template_id == 412
    table = score_table([result])
    assert (table["GitLab"].judged, table["GitLab"].rate, table["Avg."].unjudged) == (2, 0.5, 1)
    report = EvalReport(
        title="t", tasks=1, episodes=3, successes=1, unjudged=1, table=table,
        multi_site_tasks=0, statuses={"exited": 3}, seconds=1.0, out_dir=".",
    )  # fmt: skip
    assert report.success_rate == 0.5
    text = format_table(report)
    assert "| - | 50.0 | - | - | - | 50.0 |" in text
    assert "| 0/0 | 1/2 +1? | 0/0 | 0/0 | 0/0 | 1/2 +1? |" in text
    assert "unjudged: 1 of 3 episodes" in text
    html = render_report(report, [result], [group], {7: task})
    assert "1/2 +1?" in html and "1 episodes had a check no judge could score" in html
    # Nothing judged: no rate at all, not 0%.
    alone = task_result(task, msgspec.structs.replace(group, trajectories=[episode(3, 0.0, True)]))
    assert (alone.success_rate, score_table([alone])["Avg."].judged) == (0.0, 0)
    none = EvalReport(
        title="t", tasks=1, episodes=1, successes=0, unjudged=1, table=score_table([alone]),
        multi_site_tasks=0, statuses={}, seconds=1.0, out_dir=".",
    )  # fmt: skip
    assert "| - | - | - | - | - | - |" in format_table(none)


def test_eval_cli_refuses_bad_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--policy", str(tmp_path / "nope")]) == 2
    assert "--policy: expected 'oracle', 'model' or an adapter folder" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('[{"task_id": 1, "intent": "x", "start_url": "__NOWHERE__"}]')
    assert main(["eval", "--tasks", str(bad)]) == 2
    assert f"{bad}: task 1: start_url: unknown placeholder __NOWHERE__" in capsys.readouterr().err
    assert main(["eval", "--group-size", "0"]) == 2
    assert "--group-size must be at least 1" in capsys.readouterr().err
    assert main(["eval", "--temperature", "-0.5"]) == 2
    assert "--temperature must be between 0 and 10, not -0.5" in capsys.readouterr().err


def test_eval_is_greedy_unless_told(tmp_path: Path) -> None:
    """`webagent eval` samples at daemon.eval_temperature (0: greedy, as the daemon's own
    evaluations), not at the training rollouts' policy.temperature; --temperature wins."""
    from runtime.cli import build_parser
    from runtime.cli.eval import _checked

    toml = tmp_path / "c.toml"
    toml.write_text("[policy]\ntemperature = 0.9\n[daemon]\neval_temperature = 0.25\n")
    parser = build_parser()
    config = _checked(parser.parse_args(["eval", "--config", str(toml)]))
    assert config.policy.temperature == 0.25
    config = _checked(parser.parse_args(["eval", "--config", str(toml), "--temperature", "0.7"]))
    assert config.policy.temperature == 0.7
    assert _checked(parser.parse_args(["eval"])).policy.temperature == 0.0
