"""The first run's choice of demonstration tasks (`runtime.bootstrap.demo_tasks`)."""

from __future__ import annotations

from runtime.base.config import BCConfig
from runtime.base.messages import TaskConfig
from runtime.bootstrap import demo_tasks
from sites.builtin import generate_suite, plan_length


def test_demo_tasks_keep_the_split_order_and_the_step_bound() -> None:
    train = generate_suite(0)["train"]
    assert demo_tasks(train, BCConfig(demo_tasks=100, demo_max_steps=0)) == train[:100]
    short = demo_tasks(train, BCConfig(demo_tasks=100, demo_max_steps=3))
    assert len(short) == 100
    assert all((plan_length(task) or 0) <= 3 for task in short)
    assert any((plan_length(task) or 0) > 3 for task in train[:100])  # the bound did something
    positions = [train.index(task) for task in short]
    assert positions == sorted(positions)  # the split's shuffled order, not re-sorted
    every_short = demo_tasks(train, BCConfig(demo_tasks=0, demo_max_steps=2))
    assert len(every_short) == sum((plan_length(task) or 99) <= 2 for task in train)


def test_demo_tasks_keep_a_task_of_unknown_length() -> None:
    webarena = TaskConfig(task_id=7, intent="Find the cheapest lamp", start_url="__SHOPPING__")
    assert demo_tasks([webarena], BCConfig(demo_max_steps=1)) == [webarena]
