"""WebArena site URLs, task files, state-changing tasks, storage-state names, columns."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from runtime.base.messages import TaskConfig, decode_task
from sites.errors import AuthError, SiteURLError, TaskFileError
from sites.tasks import start_urls, substitute_task
from sites.webarena import (
    changes_state,
    describe_tasks,
    load_webarena_tasks,
    site_urls,
    state_file_name,
    state_sites,
    table_columns,
    urls_from_environ,
)

SAMPLE = Path(__file__).parents[1] / "fixtures" / "webarena_tasks.json"

URLS = {
    "SHOPPING": "http://wa.example:7770",
    "SHOPPING_ADMIN": "http://wa.example:7780/admin",
    "REDDIT": "http://wa.example:9999",
    "GITLAB": "http://wa.example:8023",
    "MAP": "http://wa.example:3000",
    "WIKIPEDIA": "http://wa.example:8888/wikipedia_en_all_maxi_2022-05/A/User:Landing",
    "HOMEPAGE": "http://wa.example:4399",
}


def _task(**fields: object) -> TaskConfig:
    raw: dict[str, object] = {
        "task_id": 7,
        "intent": "x",
        "start_url": "__GITLAB__",
        "sites": ["gitlab"],
        "eval": {"eval_types": ["string_match"], "reference_answers": {"exact_match": "1"}},
    }
    raw.update(fields)
    return decode_task(raw)


def test_urls_from_environ_takes_webarena_names_only() -> None:
    environ = {
        "SHOPPING": " http://h:7770 ",
        "GITLAB": "",
        "PATH": "/usr/bin",
        "REDDIT": "http://h:9999",
    }
    assert urls_from_environ(environ) == {"SHOPPING": "http://h:7770", "REDDIT": "http://h:9999"}


def test_site_urls_merge_check_and_strip() -> None:
    merged = site_urls(
        {"SHOPPING": "http://a:1/", "MAP": "http://m:3000"}, {"SHOPPING": "http://b:2/"}
    )
    assert merged == {"SHOPPING": "http://b:2", "MAP": "http://m:3000"}
    with pytest.raises(SiteURLError, match=r"sites.urls: site URL GITLAB='gitlab:8023': expected"):
        site_urls({"GITLAB": "gitlab:8023"})
    with pytest.raises(SiteURLError, match="unknown site name"):
        site_urls({"CLASSIFIEDS": "http://c:9980"})
    with pytest.raises(SiteURLError, match="bad port"):
        site_urls({"MAP": "http://m:99999"}, source="env")


def test_official_format_file_loads_with_placeholders_kept() -> None:
    tasks = load_webarena_tasks(SAMPLE, urls=URLS)
    assert len(tasks) == 13 and describe_tasks(tasks) == "13 tasks"
    assert tasks[0].start_url == "__SHOPPING_ADMIN__"  # each episode substitutes its instance
    multi = next(t for t in tasks if t.task_id == 6)
    tabs = start_urls(substitute_task(multi, URLS))
    assert tabs == [
        "http://wa.example:7770/steel-kettle.html",
        "http://wa.example:7770/glass-kettle.html",
    ]


def test_an_unresolved_placeholder_names_task_and_field(tmp_path: Path) -> None:
    urls = {k: v for k, v in URLS.items() if k != "WIKIPEDIA"}
    with pytest.raises(
        TaskFileError, match=r"task 12: start_url: no URL for placeholder __WIKIPEDIA__"
    ):
        load_webarena_tasks(SAMPLE, urls=urls)


def test_official_sizes_are_named() -> None:
    task = _task()
    lite = [msgspec.structs.replace(task, task_id=i) for i in range(165)]
    full = [msgspec.structs.replace(task, task_id=i) for i in range(812)]
    assert describe_tasks(lite) == "WebArena-Lite (165 tasks)"
    assert describe_tasks(full) == "WebArena (812 tasks)"


def test_which_tasks_change_state() -> None:
    assert not changes_state(_task())
    assert not changes_state(
        _task(eval={"eval_types": ["url_match"], "reference_url": "__GITLAB__/x"})
    )
    assert changes_state(_task(require_reset=True))
    assert changes_state(_task(eval={"eval_types": ["orm"]}))  # nothing tells: assume it does
    assert not changes_state(_task(eval={"eval_types": ["orm"]}, require_reset=False))
    program = {"url": "last", "locator": "", "required_contents": {"must_include": ["a"]}}
    assert changes_state(
        _task(
            eval={
                "eval_types": ["url_match", "program_html"],
                "reference_url": "x",
                "program_html": [program],
            }
        )
    )
    sample = {t.task_id: t for t in load_webarena_tasks(SAMPLE)}
    assert [i for i, t in sorted(sample.items()) if changes_state(t)] == [6, 7, 8, 9]


def test_storage_state_names() -> None:
    assert state_sites(_task()) == ()
    assert state_sites(_task(storage_state=None)) == ()
    assert state_sites(_task(storage_state="./.auth/shopping_admin_state.json")) == (
        "shopping_admin",
    )
    assert state_sites(_task(storage_state="./.auth/gitlab.reddit_state.json")) == (
        "gitlab",
        "reddit",
    )
    assert state_sites(_task(storage_state="./.auth/wikipedia_state.json")) == ()  # no account
    with pytest.raises(
        AuthError, match=r"task 7: storage_state './.auth/cookies.json' is not named"
    ):
        state_sites(_task(storage_state="./.auth/cookies.json"))
    with pytest.raises(AuthError, match=r"unknown site\(s\) \['twitter'\]"):
        state_sites(_task(storage_state="./.auth/gitlab.twitter_state.json"))
    assert state_file_name(["reddit", "gitlab"]) == "gitlab.reddit_state.json"


def test_table_columns_count_a_multi_site_task_in_each_site() -> None:
    assert table_columns(_task(sites=["gitlab", "reddit"])) == ["Reddit", "GitLab"]
    assert table_columns(_task(sites=["shopping_admin"])) == ["CMS"]
    assert table_columns(_task(sites=["wikipedia", "map"])) == ["Map"]
    assert table_columns(_task(sites=["wikipedia"])) == []
