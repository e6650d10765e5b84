"""The generated task suite: determinism, sizes, splits, ids, plans, and start URLs."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import msgspec
import pytest

from runtime.base.messages import TaskConfig, decode_tasks, encode_tasks
from sites.builtin import TENANT_COOKIE, BuiltinSites, generate_suite, plan_for
from sites.builtin.errors import NotInSuiteError
from sites.builtin.suite import ID_BASE, step_band, templates
from sites.tasks import check_task, substitute

SITES = ("shopping", "shopping_admin", "reddit", "gitlab", "map")
ACTIONS = {"Click", "Type", "Search", "Select Dropdown Option", "exit"}


def test_same_seed_same_suite_fast() -> None:
    started = time.perf_counter()
    one = generate_suite(0)
    elapsed = time.perf_counter() - started
    two = generate_suite(0)
    for split in ("train", "test", "ood"):
        assert encode_tasks(one[split]) == encode_tasks(two[split])
    assert encode_tasks(generate_suite(1)["test"]) != encode_tasks(one["test"])
    assert elapsed < 5.0


def test_split_sizes_and_sites(suite: dict[str, list[TaskConfig]]) -> None:
    assert len(suite["train"]) >= 1000
    assert len(suite["test"]) >= 165
    assert len(suite["ood"]) >= 100
    for split in ("test", "ood"):
        per_site = Counter(site for task in suite[split] for site in task.sites)
        assert set(per_site) == set(SITES)
    test_sites = Counter(site for task in suite["test"] for site in task.sites)
    assert min(test_sites.values()) >= 33
    all_templates = templates()
    assert len(all_templates) >= 40
    assert {t.site for t in all_templates.values()} == set(SITES)


def test_ood_templates_never_in_train_or_test(suite: dict[str, list[TaskConfig]]) -> None:
    ood_only = {tid for tid, t in templates().items() if t.ood}
    assert len(ood_only) >= 5
    in_ood = {t.intent_template_id for t in suite["ood"]}
    seen = {t.intent_template_id for split in ("train", "test") for t in suite[split]}
    assert in_ood == ood_only
    assert not in_ood & seen


def test_test_instances_are_not_in_train(suite: dict[str, list[TaskConfig]]) -> None:
    def keys(split: str) -> set[tuple[object, str]]:
        return {
            (
                t.intent_template_id,
                msgspec.json.encode(t.instantiation_dict, order="sorted").decode(),
            )
            for t in suite[split]
        }

    assert not keys("train") & keys("test")
    assert len(keys("train")) == len(suite["train"])  # no duplicates either
    assert len(keys("test")) == len(suite["test"])


def test_task_ids_unique_and_in_their_ranges(suite: dict[str, list[TaskConfig]]) -> None:
    ids = [t.task_id for split in suite.values() for t in split]
    assert len(ids) == len(set(ids))
    for split, tasks in suite.items():
        assert all(ID_BASE[split] <= t.task_id < ID_BASE[split] + 100_000 for t in tasks)


def test_plan_lengths_cover_short_and_long_tasks(suite: dict[str, list[TaskConfig]]) -> None:
    for split in ("train", "test"):
        bands = Counter(step_band(len(plan_for(t))) for t in suite[split])
        assert bands["1-3"] >= len(suite[split]) / 3
        assert bands["10+"] > 0 and bands["4-6"] > 0 and bands["7-9"] > 0
    lengths = [len(plan_for(t)) for split in suite.values() for t in split]
    assert min(lengths) == 1 and max(lengths) <= 14  # fits the default max_turns of 15


def test_tasks_are_wellformed_and_plans_survive_a_round_trip(
    suite: dict[str, list[TaskConfig]],
) -> None:
    for split, tasks in suite.items():
        decoded = decode_tasks(encode_tasks(tasks))
        assert decoded == tasks
        for task in decoded:
            check_task(task, source=split)
            assert task.intent_template.format(**task.instantiation_dict) == task.intent  # type: ignore[union-attr]
            plan = plan_for(task)
            assert plan[-1].action == "exit" and plan[-1].message is not None
            assert all(step.action in ACTIONS and step.thought for step in plan)
            assert task.require_reset == ("program_html" in task.eval.eval_types)


def test_plan_for_refuses_tasks_not_from_the_suite(suite: dict[str, list[TaskConfig]]) -> None:
    task = suite["test"][0]
    with pytest.raises(NotInSuiteError, match=f"task {task.task_id}"):
        plan_for(msgspec.structs.replace(task, extra_fields={}))
    with pytest.raises(NotInSuiteError, match="intent differs"):
        plan_for(msgspec.structs.replace(task, intent="Do something else."))
    with pytest.raises(NotInSuiteError):
        plan_for(msgspec.structs.replace(task, intent_template_id=999))
    with pytest.raises(NotInSuiteError, match="cannot be instantiated"):
        plan_for(msgspec.structs.replace(task, instantiation_dict={"nothing": "here"}))


@pytest.mark.anyio
async def test_every_start_url_loads(
    builtin_sites: BuiltinSites, suite: dict[str, list[TaskConfig]]
) -> None:
    tenant = builtin_sites.create_tenant(logged_in=SITES)
    starts = sorted({t.start_url for split in suite.values() for t in split})
    assert len(starts) > 100
    async with httpx.AsyncClient(cookies={TENANT_COOKIE: tenant}, timeout=10) as client:
        for start in starts:
            response = await client.get(substitute(start, builtin_sites.urls))
            assert response.status_code == 200, start
