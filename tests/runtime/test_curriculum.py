"""The training curriculum: the shuffled order, and draws toward groups with mixed rewards."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from runtime.base.messages import TaskConfig, Trajectory, TrajectoryGroup
from runtime.curriculum import Curriculum, CurriculumKind, mixed_probability, template_of
from runtime.guided import guided_variants, steps_left
from runtime.store import TrajectoryStore


def _task(task_id: int, template: int) -> TaskConfig:
    return TaskConfig(
        task_id=task_id, intent=f"task {task_id}", start_url="/", intent_template_id=template
    )


def _observe(
    curriculum: Curriculum, task: TaskConfig, rewards: list[float], status: str = "exited"
) -> None:
    curriculum.observe(task.task_id, [(reward, status) for reward in rewards])


@pytest.mark.parametrize(
    ("successes", "failures", "size", "prior", "ceiling"),
    [(0, 0, 4, (0.5, 0.5), 1.0), (0, 8, 4, (0.5, 0.5), 1.0), (3, 1, 8, (0.5, 0.5), 1.0),
     (0, 0, 4, (0.1, 0.9), 1.0), (2, 2, 4, (0.02, 0.98), 1.0), (0, 0, 4, (0.5, 0.5), 0.5),
     (10, 2, 4, (0.5, 0.5), 0.5), (1, 11, 4, (0.02, 0.98), 0.5), (3, 3, 4, (0.5, 0.5), 0.3)],
)  # fmt: skip
def test_mixed_probability_matches_sampling_the_posterior(
    successes: int, failures: int, size: int, prior: tuple[float, float], ceiling: float
) -> None:
    rng = random.Random(0)
    draws, mixed = 40_000, 0
    for _ in range(draws):
        p = rng.betavariate(prior[0] + successes, prior[1] + failures)
        outcomes = {rng.random() < p for _ in range(size)}
        mixed += len(outcomes) == 2 and p < ceiling
    got = mixed_probability(successes, failures, size, prior, ceiling)
    assert got == pytest.approx(mixed / draws, abs=0.01)


def test_a_ceiling_moves_draws_from_mostly_solved_templates_to_mostly_failed_ones() -> None:
    tasks = [_task(i, i) for i in range(2)]
    curricula = {
        ceiling: Curriculum(tasks, kind="signal", group_size=4, seed="0", ceiling=ceiling)
        for ceiling in (1.0, 0.5)
    }
    for curriculum in curricula.values():
        for _ in range(3):
            _observe(curriculum, tasks[0], [1, 1, 1, 0])  # solved 3 times in 4
            _observe(curriculum, tasks[1], [1, 0, 0, 0])  # 1 in 4
    whole, below = curricula[1.0].weights(), curricula[0.5].weights()
    assert whole["t:0"] == pytest.approx(whole["t:1"])  # mixed alike
    assert below["t:0"] < 0.1 * below["t:1"]
    assert below["t:1"] == pytest.approx(whole["t:1"], rel=0.1)
    with pytest.raises(ValueError, match="ceiling"):
        Curriculum(tasks, kind="signal", group_size=4, seed="0", ceiling=0.0)


def test_uniform_takes_every_task_once_per_epoch_in_a_seeded_order() -> None:
    tasks = [_task(i, i % 3) for i in range(12)]
    first = Curriculum(tasks, group_size=4, seed="0:train")
    drawn = [first.next().task_id for _ in range(24)]
    assert sorted(drawn[:12]) == list(range(12)) == sorted(drawn[12:])
    assert drawn[:12] != drawn[12:]  # a new shuffle each epoch
    assert first.epoch == 1
    again = Curriculum(tasks, group_size=4, seed="0:train")
    assert [again.next().task_id for _ in range(24)] == drawn
    in_order = Curriculum(tasks, group_size=4, seed="0:train", shuffle=False)
    assert [in_order.next().task_id for _ in range(12)] == list(range(12))


def test_short_first_takes_every_task_once_per_epoch_shortest_first() -> None:
    tasks = [_task(i, i % 3) for i in range(30)]
    lengths = {i: (None if i % 10 == 9 else 1 + i % 4) for i in range(30)}
    curriculum = Curriculum(
        tasks, kind="short_first", group_size=4, seed="0:train",
        length=lambda task: lengths[task.task_id],
    )  # fmt: skip
    for _ in range(2):
        epoch = [curriculum.next().task_id for _ in range(30)]
        assert sorted(epoch) == list(range(30))
        known = [lengths[i] for i in epoch if lengths[i] is not None]
        assert known == sorted(known)  # shortest first
        assert all(lengths[i] is None for i in epoch[len(known) :])  # unknown length last
        ones = [i for i in epoch if lengths[i] == 1]
        assert ones != sorted(ones)  # shuffled within a length
    assert curriculum.epoch == 1
    with pytest.raises(ValueError, match="short_first"):
        Curriculum(tasks, kind="short_first", group_size=4, seed="0:train")


def test_short_first_on_the_builtin_suite_starts_with_one_step_tasks() -> None:
    from sites.builtin import generate_suite, plan_for, plan_length

    train = generate_suite(0)["train"]
    curriculum = Curriculum(
        train, kind="short_first", group_size=4, seed="0:train", length=plan_length
    )
    first = [curriculum.next() for _ in range(len(train))]
    steps = [len(plan_for(task)) for task in first]
    assert steps[0] == 1 and steps == sorted(steps) and steps[-1] > 3
    webarena = TaskConfig(task_id=7, intent="Find the cheapest lamp", start_url="__SHOPPING__")
    assert plan_length(webarena) is None


def test_signal_draws_toward_templates_whose_groups_are_mixed() -> None:
    # Template 0 always fails, 1 always succeeds, 2 is mixed; 10 tasks each.
    tasks = [_task(10 * t + i, t) for t in range(3) for i in range(10)]
    curriculum = Curriculum(tasks, kind="signal", group_size=4, seed="0:train")
    before = curriculum.weights()
    assert before["t:0"] == before["t:1"] == before["t:2"] > 0  # unseen: task counts alone
    for _ in range(4):
        _observe(curriculum, tasks[0], [0, 0, 0, 0])
        _observe(curriculum, tasks[10], [1, 1, 1, 1])
        _observe(curriculum, tasks[20], [1, 0, 0, 1])
    after = curriculum.weights()
    assert after["t:2"] > 5 * after["t:0"] > 0
    assert after["t:1"] == pytest.approx(after["t:0"])
    templates = Counter(template_of(curriculum.next()) for _ in range(600))
    assert templates["t:2"] > 400
    assert 0 < templates["t:0"] < 100 and 0 < templates["t:1"] < 100


def test_signal_keeps_the_uniform_mixture_of_unseen_templates() -> None:
    tasks = [_task(i, 0) for i in range(30)] + [_task(100 + i, 1) for i in range(10)]
    curriculum = Curriculum(tasks, kind="signal", group_size=4, seed="1:train")
    drawn = [curriculum.next() for _ in range(400)]
    share = sum(template_of(t) == "t:0" for t in drawn) / len(drawn)
    assert share == pytest.approx(0.75, abs=0.07)
    # Within a template every task comes once before any comes twice.
    ones = [t.task_id for t in drawn if t.task_id >= 100][:10]
    assert sorted(ones) == list(range(100, 110))


def test_signal_forgets_old_groups_and_ignores_infrastructure_failures() -> None:
    tasks = [_task(0, 0), _task(1, 1)]
    curriculum = Curriculum(tasks, kind="signal", group_size=4, seed="0", window=8)
    fresh = curriculum.weight("t:0")
    _observe(curriculum, tasks[0], [0, 0, 0, 0], status="interrupted")
    _observe(curriculum, _task(7, 0), [0, 0, 0, 0])  # a task it does not draw from
    assert curriculum.weight("t:0") == fresh
    for _ in range(3):
        _observe(curriculum, tasks[0], [0, 0, 0, 0])
    failing = curriculum.weight("t:0")
    assert failing < fresh / 2
    _observe(curriculum, tasks[0], [1, 0, 1, 0])
    _observe(curriculum, tasks[0], [0, 1, 1, 0])  # the window now holds only these
    assert curriculum.weight("t:0") > failing * 2


def _store_groups(
    path: Path, task_ids: list[int], split: str = "train", rewards: tuple[float, ...] = (0,) * 4
) -> None:
    """One group of episodes with `rewards` (4 failed ones) a task id, in order, in the
    run's store."""
    with TrajectoryStore(path / "trajectories.jsonl") as store:
        for n, task_id in enumerate(task_ids):
            group_id = f"{split}{n}"
            episodes = [
                Trajectory(episode_id=f"{group_id}-{i}", group_id=group_id, task_id=task_id,
                           intent="", reward=reward, status="exited")
                for i, reward in enumerate(rewards)
            ]  # fmt: skip
            group = TrajectoryGroup(
                group_id=group_id, task_id=task_id, trajectories=episodes, created_at=0, split=split
            )
            store.append(group)


def test_a_resumed_run_draws_on_the_groups_in_its_store(tmp_path: Path) -> None:
    tasks = [_task(0, 0), _task(1, 1)]
    _store_groups(tmp_path, [0, 0])
    _store_groups(tmp_path, [0], split="test")
    curriculum = Curriculum(tasks, kind="signal", group_size=4, seed="0")
    fresh = curriculum.weight("t:0")
    assert curriculum.observe_store(tmp_path, "train") == 2
    # The two train groups (8 failures), not the test one.
    assert curriculum.weight("t:0") == pytest.approx(mixed_probability(0, 8, 4))
    assert curriculum.weight("t:0") < fresh
    assert curriculum.observe_store(tmp_path / "none", "train") == 0


@pytest.mark.parametrize("kind", ["uniform", "short_first"])
def test_a_resumed_run_goes_on_with_the_rest_of_its_epoch(
    tmp_path: Path, kind: CurriculumKind
) -> None:
    tasks = [_task(i, i % 3) for i in range(12)]
    lengths = {i: 1 + i % 4 for i in range(12)}

    def curriculum(seed: str) -> Curriculum:
        return Curriculum(tasks, kind=kind, group_size=4, seed=seed,
                          length=lambda task: lengths[task.task_id])  # fmt: skip

    first = curriculum("0:train")
    drawn = [first.next().task_id for _ in range(12 + 5)]  # an epoch and 5 of the next
    # The store: one task run twice (a lost group), a test group, a task from elsewhere.
    _store_groups(tmp_path, [*drawn[:3], drawn[1], *drawn[3:], 99])
    _store_groups(tmp_path, [drawn[-1]], split="test")
    resumed = curriculum("1:train")  # the daemon shifts the seed by the learner's version
    assert resumed.observe_store(tmp_path, "train") == 12 + 5 + 2
    rest = [resumed.next().task_id for _ in range(7)]
    assert sorted(rest) == sorted(set(range(12)) - set(drawn[12:]))
    assert resumed.epoch == 1
    if kind == "short_first":
        assert [lengths[i] for i in rest] == sorted(lengths[i] for i in rest)
    after = [resumed.next().task_id for _ in range(12)]  # then whole epochs again
    assert sorted(after) == list(range(12)) and resumed.epoch == 2
    # An empty store resumes nothing: the seeded order as before.
    fresh = curriculum("0:train")
    assert fresh.observe_store(tmp_path / "none", "train") == 0
    assert [fresh.next().task_id for _ in range(12)] == drawn[:12]


@pytest.mark.parametrize("kind", ["uniform", "signal"])
def test_a_task_lost_to_the_infrastructure_is_drawn_next(kind: CurriculumKind) -> None:
    tasks = [_task(i, template=i % 3) for i in range(9)]
    curriculum = Curriculum(tasks, kind=kind, group_size=4, seed="s")
    first = [curriculum.next() for _ in range(3)]
    curriculum.again(first[1])
    curriculum.again(first[0])
    assert [curriculum.next(), curriculum.next()] == [first[1], first[0]]
    # Then the order goes on: the uniform epoch still holds every task exactly once.
    if kind == "uniform":
        rest = [curriculum.next() for _ in range(6)]
        assert sorted(t.task_id for t in first + rest) == list(range(9))


@pytest.mark.parametrize("kind", ["uniform", "signal"])
def test_added_tasks_are_drawn_next_once_then_join_the_pool(kind: CurriculumKind) -> None:
    tasks = [_task(i, template=i % 2) for i in range(4)]
    curriculum = Curriculum(tasks, kind=kind, group_size=4, seed="s")
    curriculum.next()
    new = [_task(100, template=7), _task(101, template=0)]
    curriculum.add(new)
    lost = _task(2, template=0)
    curriculum.again(lost)
    assert [curriculum.next().task_id for _ in range(3)] == [2, 100, 101]
    drawn = Counter(curriculum.next().task_id for _ in range(600))
    assert set(drawn) == {0, 1, 2, 3, 100, 101}
    if kind == "uniform":  # every task once an epoch, the added ones included
        assert len(set(drawn.values())) <= 2


def test_signal_with_lengths_gives_a_template_its_lengths_pooled_prior() -> None:
    # Templates 0-2 are 5-step tasks, 3-5 one-step ones; 5 tasks each.
    tasks = [_task(10 * t + i, t) for t in range(6) for i in range(5)]
    curriculum = Curriculum(
        tasks, kind="signal", group_size=4, seed="0:train",
        length=lambda task: 5 if task.task_id < 30 else 1,
    )  # fmt: skip
    before = curriculum.weights()
    assert len(set(before.values())) == 1  # nothing pooled yet: Jeffreys' prior for all
    assert curriculum.prior("t:2") == (0.5, 0.5)
    for _ in range(3):
        _observe(curriculum, tasks[0], [0, 0, 0, 0])  # template 0: 5 steps, fails
        _observe(curriculum, tasks[5], [0, 0, 0, 0])  # template 1: 5 steps, fails
        _observe(curriculum, tasks[15], [1, 0, 0, 1])  # template 3: 1 step, mixed
    after = curriculum.weights()
    # Unseen, both: a 5-step template takes its length's failures as its prior.
    assert after["t:4"] > 10 * after["t:2"] > 0
    assert curriculum.prior("t:2")[0] == pytest.approx(0.5 / 25)
    # A template's own groups are not its prior's: template 3's comes from 4 and 5 only.
    assert curriculum.prior("t:3") == (0.5, 0.5)
    templates = Counter(template_of(curriculum.next()) for _ in range(600))
    five_steps = sum(templates[f"t:{t}"] for t in range(3))
    assert 0 < five_steps < 30
    # Without lengths the same groups leave the unseen templates alike.
    plain = Curriculum(tasks, kind="signal", group_size=4, seed="0:train")
    for _ in range(3):
        _observe(plain, tasks[0], [0, 0, 0, 0])
        _observe(plain, tasks[5], [0, 0, 0, 0])
        _observe(plain, tasks[15], [1, 0, 0, 1])
    assert plain.weight("t:2") == plain.weight("t:4")


def test_signal_draws_short_first_until_its_warmup_has_seen_mixed_groups(
    tmp_path: Path,
) -> None:
    # Templates 0-2 are 5-step tasks, 3-5 one-step ones; 5 tasks each.
    tasks = [_task(10 * t + i, t) for t in range(6) for i in range(5)]

    def length(task: TaskConfig) -> int:
        return 5 if task.task_id < 30 else 1

    curriculum = Curriculum(
        tasks, kind="signal", group_size=4, seed="0:train", length=length, warmup=2
    )
    first = [curriculum.next() for _ in range(12)]
    assert [length(task) for task in first] == [1] * 12  # 12 of the 15 one-step tasks
    for task in first[:6]:
        _observe(curriculum, task, [1, 1, 1, 1])  # solved groups do not end the warm-up
    _observe(curriculum, first[6], [1, 0, 0, 1])
    _observe(curriculum, first[7], [0, 0, 0, 0])
    assert curriculum.mixed_seen == 1
    assert length(curriculum.next()) == 1  # still the short ones
    _observe(curriculum, first[8], [0, 1, 1, 1])
    assert curriculum.mixed_seen == 2
    # Past the warm-up the draws are by weight: the unseen 5-step templates come in.
    drawn = Counter(length(curriculum.next()) for _ in range(300))
    assert drawn[5] > 30
    # A resumed run counts its store's mixed groups: past the warm-up at once.
    _store_groups(tmp_path, [first[6].task_id, first[8].task_id], rewards=(1, 0, 0, 1))
    resumed = Curriculum(
        tasks, kind="signal", group_size=4, seed="0:train", length=length, warmup=2
    )
    assert resumed.observe_store(tmp_path, "train") == 2 and resumed.mixed_seen == 2
    assert Counter(length(resumed.next()) for _ in range(300))[5] > 30
    # Other kinds ignore it: "uniform" stays shuffled.
    uniform = Curriculum(tasks, group_size=4, seed="0:train", length=length, warmup=2)
    assert [length(uniform.next()) for _ in range(12)] != [1] * 12


def test_a_guided_variant_is_a_template_of_its_own_with_the_prior_of_the_steps_it_leaves(
    tmp_path: Path,
) -> None:
    # Template 0: 5-step tasks; template 1: 2-step ones; variants of template 0 leave 1..4.
    tasks = [_task(i, 0) for i in range(4)] + [_task(10 + i, 1) for i in range(4)]
    lengths = {0: 5, 1: 2}

    def length(task: TaskConfig) -> int | None:
        return lengths[task.intent_template_id]  # type: ignore[index]

    variants = guided_variants(tasks, 3, length)
    curriculum = Curriculum(
        tasks + variants, kind="signal", group_size=4, seed="0", length=steps_left(length)
    )
    assert sorted(curriculum.weights()) == ["t:0", "t:0@1", "t:0@2", "t:0@3", "t:0@4", "t:1"]
    # The same task id: the guide says whose window a group goes to.
    curriculum.observe(0, [(0.0, "exited")] * 4, guide=3)
    assert curriculum.weight("t:0@3") < curriculum.weight("t:0") == curriculum.weight("t:0@1")
    # Leaving 2 steps, variant 3 is pooled with template 1 (2 steps), not with template 0.
    curriculum.observe(10, [(1.0, "exited")] * 4)
    assert curriculum.prior("t:0@3")[0] == pytest.approx(4.5 / 5)
    assert curriculum.prior("t:0") == (0.5, 0.5)
    # A resumed run puts a stored guided group back under its variant.
    with TrajectoryStore(tmp_path / "trajectories.jsonl") as store:
        episodes = [
            Trajectory(episode_id=f"g-{i}", group_id="g", task_id=1, intent="", status="exited")
            for i in range(4)
        ]
        stored = TrajectoryGroup(
            group_id="g", task_id=1, trajectories=episodes, created_at=0, split="train", guide=2
        )
        store.append(stored)
    resumed = Curriculum(
        tasks + variants, kind="signal", group_size=4, seed="0", length=steps_left(length)
    )
    assert resumed.observe_store(tmp_path, "train") == 1
    assert resumed.weight("t:0@2") < resumed.weight("t:0@1") == resumed.weight("t:0")
