"""bench/recipe.py: the demonstrations it trains on are the ones the first run records."""

from __future__ import annotations

import json
from pathlib import Path

from bench.recipe import chosen_demos, eval_config
from runtime.base.config import load_config
from sites.builtin.suite import generate_suite, plan_length


def _group(task_id: int) -> str:
    return json.dumps({"task_id": task_id, "trajectories": [{"task_id": task_id, "turns": []}]})


def test_chosen_demos_keeps_the_tasks_the_first_run_records(tmp_path: Path) -> None:
    train = generate_suite(0)["train"]
    every = tmp_path / "demos.jsonl"
    every.write_text("".join(f"{_group(t.task_id)}\n" for t in reversed(train)))

    chosen = chosen_demos(every, 0, tasks=5, max_steps=2)

    kept = [json.loads(line)["task_id"] for line in chosen.read_text().splitlines()]
    short = [t for t in train if (plan_length(t) or 99) <= 2][:5]
    assert sorted(kept) == sorted(t.task_id for t in short)
    assert all((plan_length(t) or 99) <= 2 for t in short) and len(kept) == 5
    # the bound mattered: a longer task comes before the last one kept
    assert any((plan_length(t) or 0) > 2 for t in train[: train.index(short[-1])])


def test_prefixes_of_longer_tasks_keep_their_first_turns(tmp_path: Path) -> None:
    train = generate_suite(0)["train"]
    every = tmp_path / "demos.jsonl"
    turns = [{"index": i} for i in range(6)]
    every.write_text(
        "".join(
            json.dumps(
                {"task_id": t.task_id, "trajectories": [{"task_id": t.task_id, "turns": turns}]}
            )
            + "\n"
            for t in train
        )
    )
    chosen = chosen_demos(every, 0, tasks=5, max_steps=2, prefixes=3)
    groups = [json.loads(line) for line in chosen.read_text().splitlines()]
    longer = [t.task_id for t in train if (plan_length(t) or 0) > 2][:3]
    assert [g["task_id"] for g in groups[5:]] == longer and len(groups) == 8
    assert all(len(g["trajectories"][0]["turns"]) == 2 for g in groups[5:])
    assert all(len(g["trajectories"][0]["turns"]) == 6 for g in groups[:5])  # whole
    assert chosen.name == "demos-5x2p3.jsonl"


def test_chosen_demos_with_no_bounds_is_every_demonstration(tmp_path: Path) -> None:
    every = tmp_path / "demos.jsonl"
    every.write_text(f"{_group(1)}\n")
    assert chosen_demos(every, 0, tasks=0, max_steps=0) == every


def test_the_closed_loop_evaluation_runs_on_the_suite_bc_trained_on(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(eval_config(tmp_path / "run", tmp_path / "m", 3, "compact", "short", False))
    config = load_config(path)
    assert config.sites.seed == 3
    assert config.policy.model == str(tmp_path / "m") and config.policy.temperature == 0.0
    assert config.observation.style == "compact" and not config.scheduler.keep_thoughts
