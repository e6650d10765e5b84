"""The first run's choice of demonstration tasks (`runtime.bootstrap.demo_tasks`) and the
BC term's demonstrations (`runtime.bootstrap.bc_term_of`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.base.config import BCConfig, Config, ConfigError, load_config
from runtime.base.messages import TaskConfig
from runtime.bootstrap import bc_term_of, demo_tasks
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


def _config(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "config.toml"
    path.write_text(f'[daemon]\ndata_dir = "{tmp_path / "data"}"\n{text}')
    return load_config(path)


def test_auto_bc_demos_are_the_embedded_defaults_where_its_first_run_made_them(
    tmp_path: Path,
) -> None:
    demos = tmp_path / "data" / "demos" / "train.jsonl"
    default = _config(tmp_path, "")
    assert (default.learner.bc_coef, default.learner.bc_demos) == (1.0, "auto")
    # No demonstrations on disk yet: the term is off, not an error.
    unmade = bc_term_of(default).learner
    assert (unmade.bc_coef, unmade.bc_demos) == (0, "")
    demos.parent.mkdir(parents=True)
    demos.write_text("")
    settled = bc_term_of(default).learner
    assert (settled.bc_coef, settled.bc_demos) == (1.0, str(demos))
    assert settled.bc_turns == default.learner.bc_turns
    # A model of the user's own, WebRL, or several ranks: "auto" turns the term off.
    for text in (
        '[policy]\nmodel = "HuggingFaceTB/SmolLM2-135M-Instruct"\n',
        '[learner]\nalgorithm = "webrl"\n',
        "[learner]\ndata_parallel = 2\n",
    ):
        learner = bc_term_of(_config(tmp_path, text)).learner
        assert (learner.bc_coef, learner.bc_demos) == (0, ""), text
    # A path is kept as it is, even for a model of the user's own.
    own = _config(tmp_path, f'[policy]\nmodel = "m"\n[learner]\nbc_demos = "{demos}"\n')
    assert bc_term_of(own) == own
    off = _config(tmp_path, "[learner]\nbc_coef = 0\n")
    assert bc_term_of(off) == off


def test_a_named_bc_demos_must_be_a_term_of_mgrpo_on_one_rank(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="one rank"):
        _config(tmp_path, '[learner]\nalgorithm = "webrl"\nbc_demos = "d.jsonl"\n')
    webrl = _config(tmp_path, '[learner]\nalgorithm = "webrl"\n')  # "auto": no error
    assert webrl.learner.bc_demos == "auto"
