"""WebRL's in-breadth evolution on the built-in suite: new tasks from failed ones."""

from __future__ import annotations

import random

import msgspec
import pytest

from runtime.base.messages import TaskConfig
from sites.builtin import generate_suite, plan_for
from sites.builtin.evolve import EVOLVED_ID_BASE, PARENT_FIELD, PHASE_FIELD, Evolver
from sites.builtin.suite import spare_candidates, templates


def _key(task: TaskConfig) -> tuple[object, tuple[tuple[str, object], ...]]:
    params = task.instantiation_dict
    assert isinstance(params, dict)
    return task.intent_template_id, tuple(sorted(params.items()))


Suite = dict[str, list[TaskConfig]]


@pytest.fixture(scope="module")
def suite() -> Suite:
    return generate_suite(0)


def test_spare_instantiations_are_in_no_split(suite: Suite) -> None:
    in_suite = {_key(t) for split in suite.values() for t in split}
    spare = spare_candidates(0)
    assert not any(templates()[tid].ood for tid in spare)
    keys = {(tid, tuple(sorted(p.items()))) for tid, pool in spare.items() for p in pool}
    assert len(keys) > 1000
    assert not keys & in_suite


def test_children_of_failed_tasks_are_new_real_suite_tasks(suite: Suite) -> None:
    parents = [t for t in suite["train"] if t.sites[0] in ("shopping_admin", "reddit")][:6]
    evolver = Evolver(0, rng=random.Random(1))
    out = evolver.evolve(parents, phase=1, per_parent=3)
    assert out.skipped == [] and out.childless == []
    assert len(out.tasks) == 18
    in_suite = {_key(t) for split in suite.values() for t in split}
    by_id = {p.task_id: p for p in parents}
    assert [t.task_id for t in out.tasks] == list(range(EVOLVED_ID_BASE, EVOLVED_ID_BASE + 18))
    kinds = []
    for child in out.tasks:
        parent = by_id[child.extra_fields[PARENT_FIELD]]
        assert child.extra_fields[PHASE_FIELD] == 1
        assert _key(child) not in in_suite  # never a train, test or ood instantiation
        assert child.sites == parent.sites
        assert isinstance(child.intent_template_id, int)
        assert not templates()[child.intent_template_id].ood
        plan = plan_for(child)  # rebuilt from its seed: the oracle and evaluator are real
        kind = child.extra_fields["kind"]
        kinds.append(kind)
        if kind == "instance":
            assert child.intent_template_id == parent.intent_template_id
            assert child.intent != parent.intent
        else:
            assert child.intent_template_id != parent.intent_template_id
            shorter = len(plan) < len(plan_for(parent))
            assert shorter if kind == "easier" else len(plan) > len(plan_for(parent))
    assert set(kinds) == {"instance", "easier", "harder"}


def test_phases_never_reuse_an_instantiation_and_the_rng_decides() -> None:
    parents = generate_suite(0)["train"][:10]
    first, second = Evolver(0, rng=random.Random(5)), Evolver(0, rng=random.Random(5))
    a = [first.evolve(parents, phase=p, per_parent=2).tasks for p in (1, 2, 3)]
    b = [second.evolve(parents, phase=p, per_parent=2).tasks for p in (1, 2, 3)]
    assert a == b
    keys = [_key(t) for phase in a for t in phase]
    assert len(keys) == len(set(keys))
    assert [t.extra_fields[PHASE_FIELD] for t in a[2]] == [3] * len(a[2])


def test_a_template_runs_out_then_its_parent_gets_other_kinds() -> None:
    parent = next(t for t in generate_suite(0)["train"] if t.intent_template_id == 312)
    evolver = Evolver(0, rng=random.Random(0))
    spare = evolver.remaining(312)
    assert 0 < spare < 40
    out = evolver.evolve([parent] * spare, phase=1, per_parent=1)  # "instance" each time
    assert [t.intent_template_id for t in out.tasks] == [312] * spare
    assert evolver.remaining(312) == 0
    again = evolver.evolve([parent], phase=2, per_parent=1).tasks
    assert len(again) == 1 and again[0].intent_template_id != 312
    assert again[0].extra_fields["kind"] in ("easier", "harder")


def test_parents_not_from_the_suite_are_skipped_and_counted() -> None:
    good = generate_suite(0)["train"][0]
    no_seed = msgspec.structs.replace(good, task_id=7, extra_fields={})
    other_seed = msgspec.structs.replace(good, task_id=8, extra_fields={"builtin_seed": 3})
    edited = msgspec.structs.replace(good, task_id=9, intent="Do something else.")
    out = Evolver(0, rng=random.Random(0)).evolve(
        [no_seed, good, other_seed, edited], phase=1, per_parent=1
    )
    assert out.skipped == [7, 8, 9]
    assert [t.extra_fields[PARENT_FIELD] for t in out.tasks] == [good.task_id]


def test_tasks_read_back_after_a_restart_are_not_made_again() -> None:
    parents = generate_suite(0)["train"][:10]
    before = Evolver(0, rng=random.Random(1)).evolve(parents, phase=1, per_parent=2).tasks
    resumed = Evolver(0, rng=random.Random(1))
    for task in before:
        resumed.used(task)
    after = resumed.evolve(parents, phase=2, per_parent=2).tasks
    assert after and not {_key(t) for t in after} & {_key(t) for t in before}
    assert min(t.task_id for t in after) == max(t.task_id for t in before) + 1
