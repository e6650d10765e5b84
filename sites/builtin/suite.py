"""The built-in task suite: templates instantiated from the seeded data, with oracle plans.

The templates are written with `sites.builtin.template_kit` in `tasks_<site>.py`. A
`Template` lists its candidate instantiations (`candidates(world)`, deterministic, with
ambiguous ones left out) and turns one into a `Built` task: intent, start URL, WebArena
`eval` and the scripted plan. Reference answers are computed through the same query
functions the sites use, on a fresh tenant (the seeded data), so they agree with the pages.

Splits (`generate_suite(seed)`):
- test: about 40 tasks per site, spread over the site's in-distribution templates;
- train: the next candidates of the same templates (never the same instantiation), up to
  `Template.train_cap` each;
- ood: templates marked `ood` only; they never appear in train or test.

Task ids: train 0..99999, test 100000..199999, ood 200000..299999 (in generation order).
Every task carries `builtin_seed` (an extra field, kept by the task codecs) so that
`plan_for(task)` can rebuild its plan from `intent_template_id` and `instantiation_dict`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping

from runtime.base.messages import (
    OracleStep,
    TaskConfig,
)
from sites.builtin import tasks_admin, tasks_code, tasks_forum, tasks_map, tasks_shop
from sites.builtin.data import build_world
from sites.builtin.errors import NotInSuiteError
from sites.builtin.template_kit import PLACEHOLDER, Built, Template
from sites.builtin.tenants import Tenant

__all__ = [
    "ID_BASE",
    "SEED_FIELD",
    "generate_suite",
    "plan_for",
    "spare_candidates",
    "step_band",
    "suite_stats",
    "task_from",
    "templates",
]

ID_BASE = {"train": 0, "test": 100_000, "ood": 200_000}
SEED_FIELD = "builtin_seed"
TEST_PER_SITE = 40


def step_band(steps: int) -> str:
    """ "1-3", "4-6", "7-9" or "10+": the length band of a plan (its exit included)."""
    if steps <= 3:
        return "1-3"
    if steps <= 6:
        return "4-6"
    if steps <= 9:
        return "7-9"
    return "10+"


# --------------------------------------------------------------------------- the suite


def _templates() -> list[Template]:
    found = [
        *tasks_shop.TEMPLATES,
        *tasks_admin.TEMPLATES,
        *tasks_forum.TEMPLATES,
        *tasks_code.TEMPLATES,
        *tasks_map.TEMPLATES,
    ]
    ids = [t.id for t in found]
    if len(ids) != len(set(ids)):  # pragma: no cover - a programming error
        raise RuntimeError("duplicate template ids")
    return found


def templates() -> dict[int, Template]:
    """Every template by id."""
    return {t.id: t for t in _templates()}


def _task(
    template: Template, built: Built, params: dict[str, str], task_id: int, seed: int
) -> TaskConfig:
    return TaskConfig(
        task_id=task_id,
        intent=built.intent,
        start_url=f"{PLACEHOLDER[template.site]}{built.start}",
        sites=[template.site],
        eval=built.eval,
        require_login=built.require_login,
        storage_state=None,
        geolocation=None,
        intent_template=template.intent_template,
        instantiation_dict=dict(params),
        require_reset=built.require_reset,
        intent_template_id=template.id,
        extra_fields={SEED_FIELD: seed},
    )


def _allotted(seed: int) -> Iterator[tuple[Template, list[dict[str, str]], int]]:
    """Each template with its candidates in their seeded shuffled order and how many of
    them go to test (0 for an ood template; the next `train_cap` go to train, or to ood)."""
    world = build_world(seed)
    base = Tenant("seeded-data")
    all_templates = _templates()
    per_site: dict[str, int] = {}
    for template in all_templates:
        if not template.ood:
            per_site[template.site] = per_site.get(template.site, 0) + 1
    for template in all_templates:
        candidates = template.candidates(world, base)
        random.Random(f"{seed}:template:{template.id}").shuffle(candidates)
        n_test = 0
        if not template.ood:
            n_test = min(math.ceil(TEST_PER_SITE / per_site[template.site]), len(candidates) // 2)
        yield template, candidates, n_test


def generate_suite(seed: int = 0) -> dict[str, list[TaskConfig]]:
    """{"train": [...], "test": [...], "ood": [...]}: deterministic for a seed."""
    world = build_world(seed)
    base = Tenant("seeded-data")
    splits: dict[str, list[tuple[Template, dict[str, str]]]] = {"train": [], "test": [], "ood": []}
    for template, candidates, n_test in _allotted(seed):
        if template.ood:
            splits["ood"].extend((template, c) for c in candidates[: template.train_cap])
            continue
        splits["test"].extend((template, c) for c in candidates[:n_test])
        splits["train"].extend(
            (template, c) for c in candidates[n_test : n_test + template.train_cap]
        )
    suite: dict[str, list[TaskConfig]] = {}
    for split, items in splits.items():
        random.Random(f"{seed}:split:{split}").shuffle(items)
        suite[split] = [
            _task(t, t.build(world, base, params), params, ID_BASE[split] + i, seed)
            for i, (t, params) in enumerate(items)
        ]
    return suite


def spare_candidates(seed: int) -> dict[int, list[dict[str, str]]]:
    """Per in-distribution template id, the instantiations `generate_suite(seed)` leaves
    out of every split (past its test share and `train_cap`), in its shuffled order: a
    task made from one is new and never a test or ood task. Ood templates are not listed."""
    return {
        template.id: candidates[n_test + template.train_cap :]
        for template, candidates, n_test in _allotted(seed)
        if not template.ood
    }


def task_from(
    template: Template, params: dict[str, str], *, task_id: int, seed: int
) -> tuple[TaskConfig, list[OracleStep]]:
    """A task of the built-in suite's form (`plan_for` rebuilds its plan) from one of
    `template`'s instantiations on the seeded data, and its plan."""
    built = template.build(build_world(seed), Tenant("seeded-data"), params)
    return _task(template, built, params, task_id, seed), built.plan


def plan_length(task: TaskConfig) -> int | None:
    """The number of steps of `task`'s scripted solution (its exit included), or None for
    a task the suite did not make (a WebArena task, an edited intent)."""
    try:
        return len(plan_for(task))
    except NotInSuiteError:
        return None


def plan_for(task: TaskConfig) -> list[OracleStep]:
    """The scripted solution of a task from the built-in suite.

    Rebuilt from the task's `builtin_seed`, `intent_template_id` and `instantiation_dict`;
    a task the suite did not generate (or whose intent no longer matches) raises
    NotInSuiteError naming the task.
    """
    seed = task.extra_fields.get(SEED_FIELD)
    template = (
        templates().get(task.intent_template_id)
        if isinstance(task.intent_template_id, int)
        else None
    )
    params = task.instantiation_dict
    if not isinstance(seed, int) or template is None or not isinstance(params, dict):
        raise NotInSuiteError(
            f"task {task.task_id} is not from the built-in suite (it needs "
            f"'{SEED_FIELD}', a built-in 'intent_template_id' and 'instantiation_dict')"
        )
    world = build_world(seed)
    try:
        built = template.build(world, Tenant("seeded-data"), {k: str(v) for k, v in params.items()})
    except (KeyError, ValueError, IndexError) as exc:
        raise NotInSuiteError(
            f"task {task.task_id}: template {template.id} cannot be instantiated with "
            f"{params!r} ({exc!r})"
        ) from exc
    if built.intent != task.intent:
        raise NotInSuiteError(
            f"task {task.task_id}: its intent differs from template {template.id}'s "
            f"({task.intent!r} != {built.intent!r})"
        )
    return built.plan


def suite_stats(suite: Mapping[str, list[TaskConfig]]) -> dict[str, dict[str, int]]:
    """Counts per split: total, per site, per plan length band, per template kind."""
    stats: dict[str, dict[str, int]] = {}
    for split, tasks in suite.items():
        counts: dict[str, int] = {"total": len(tasks)}
        for task in tasks:
            for site in task.sites:
                counts[f"site:{site}"] = counts.get(f"site:{site}", 0) + 1
            band = step_band(len(plan_for(task)))
            counts[f"steps:{band}"] = counts.get(f"steps:{band}", 0) + 1
        counts["templates"] = len({t.intent_template_id for t in tasks})
        stats[split] = dict(sorted(counts.items()))
    return stats
