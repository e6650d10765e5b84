"""Every template's plan solves a sample task in real Chromium, and the task's own
evaluators (sites.evaluators) give it reward 1; before the plan runs they give 0."""

from __future__ import annotations

import pytest
from playwright.async_api import BrowserContext

from runtime.base.messages import TaskConfig
from sites.builtin import plan_for
from sites.builtin.suite import templates
from sites.evaluators import evaluate

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

TEMPLATE_IDS = sorted(templates())


def _sample(suite: dict[str, list[TaskConfig]], template_id: int) -> TaskConfig:
    for split in ("test", "ood"):
        for task in suite[split]:
            if task.intent_template_id == template_id:
                return task
    raise AssertionError(f"template {template_id} has no test or ood task")


@pytest.mark.parametrize("template_id", TEMPLATE_IDS)
async def test_plan_solves_template(
    template_id: int,
    suite: dict[str, list[TaskConfig]],
    plan_runner,  # type: ignore[no-untyped-def]
    context: BrowserContext,
) -> None:
    task = _sample(suite, template_id)
    urls = plan_runner.sites.urls
    page, concrete = await plan_runner.start(context, task)

    before = await evaluate(concrete, answer="", page=page, urls=urls, settle_timeout_s=0)
    assert before.reward == 0.0, f"task {task.task_id} passes without doing anything"

    await page.goto(concrete.start_url)
    answer = await plan_runner.run(page, plan_for(task), where=f"task {task.task_id}")
    after = await evaluate(concrete, answer=answer, page=page, urls=urls, settle_timeout_s=0)
    assert after.reward == 1.0, (task.intent, answer, after.checks)
    assert not after.unjudged
