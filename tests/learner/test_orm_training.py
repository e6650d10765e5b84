"""Training WebRL's outcome reward model on labelled rollouts with BC's loop (tiny model)."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from learner.errors import LearnerError
from learner.orm_training import label_ids, orm_examples, train_orm
from policy.prompt import PromptRenderer
from runtime.base.config import BCConfig, LearnerConfig
from runtime.base.messages import Trajectory, TrajectoryGroup, Turn

PRODUCTS = ["Amber Lamp", "Birch Desk", "Cedar Chair", "Dune Rug", "Elm Shelf", "Fern Vase"]


def _rollouts(n: int, seed: int) -> list[TrajectoryGroup]:
    """Price edits: a success ends on the saved page, a failure before saving; one task and
    group each (so the held-out split is by rollout). A quarter are infrastructure errors."""
    rng = random.Random(seed)
    groups = []
    for i in range(n):
        product, price = rng.choice(PRODUCTS), f"{rng.randint(10, 99)}.{rng.randint(0, 99):02d}"
        saved = rng.random() < 0.5
        page = f'Edit Product: {product}\ninput price = "{price}" [8]\nbutton Save [11]'
        final = f"You saved the product.\n{page}" if saved else page
        turns = [
            Turn(index=0, url="http://x/", observation=page, observation_digest="",
                 text=f'<think>Set it.</think><answer>do(action="Type", argument="{price}", '
                 'element="8")</answer>'),
            Turn(index=1, url="http://x/", observation=final, observation_digest="",
                 text='<think>Done.</think><answer>exit(message="")</answer>'),
        ]  # fmt: skip
        status = "error:browser" if i % 4 == 3 else "exited"
        trajectory = Trajectory(
            episode_id=f"g{i}-0", group_id=f"g{i}", task_id=i,
            intent=f"Change the price of {product} to ${price}.", turns=turns,
            reward=1.0 if saved else 0.0, status=status,
        )  # fmt: skip
        groups.append(
            TrajectoryGroup(group_id=f"g{i}", task_id=i, trajectories=[trajectory], created_at=0.0)
        )
    return groups


def test_examples_label_the_first_token_and_leave_errors_out(tiny_model: Path) -> None:
    renderer = PromptRenderer.from_model(tiny_model)
    groups = _rollouts(16, seed=0)
    examples = orm_examples(groups, renderer)
    assert len(examples) == 12  # 4 of 16 were infrastructure errors
    yes, no = label_ids(renderer)
    assert yes != no
    for example, group in zip(
        examples, [g for i, g in enumerate(groups) if i % 4 != 3], strict=True
    ):
        success = group.trajectories[0].reward > 0
        assert example.completion_ids[0] == (yes if success else no)
        assert example.completion_ids[-1] == renderer.eos_token_id
        assert example.action_mask[0] and not any(example.action_mask[1:])


def test_the_judge_learns_the_evaluators_labels_and_is_written_as_an_adapter(
    tiny_model: Path, tmp_path: Path
) -> None:
    config = BCConfig(
        max_steps=80, batch_size=8, learning_rate=3e-3, warmup_steps=2, eval_every_steps=40,
        eval_examples=16, heldout_fraction=0.25, prompt_loss=0.0, seed=0,
    )  # fmt: skip
    report = train_orm(
        _rollouts(160, seed=1), base_model=tiny_model, out=tmp_path / "orm", config=config,
        lora=LearnerConfig(),
    )  # fmt: skip
    held = report.heldout
    assert held.examples == 30 and 0 < held.positives < held.examples
    assert held.accuracy >= 0.9, held
    assert held.precision >= 0.85 and held.recall >= 0.85, held
    assert report.bc.heldout_success == held.accuracy

    lora = train_orm(
        _rollouts(24, seed=2), base_model=tiny_model, out=tmp_path / "orm-lora",
        config=msgspec.structs.replace(config, max_steps=2, mode="lora"),
        lora=LearnerConfig(lora_rank=4, lora_alpha=8),
    )  # fmt: skip
    assert lora.bc.mode == "lora"
    written = {p.name for p in (tmp_path / "orm-lora").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "bc.json"} <= written
    assert "model.safetensors" not in written  # not merged: the policy's server serves it


def test_rollouts_of_one_label_are_refused(tiny_model: Path, tmp_path: Path) -> None:
    failures = [g for g in _rollouts(40, seed=3) if g.trajectories[0].reward == 0]
    with pytest.raises(LearnerError, match="both labels"):
        train_orm(
            failures, base_model=tiny_model, out=tmp_path / "x",
            config=BCConfig(max_steps=1, prompt_loss=0.0), lora=LearnerConfig(),
        )  # fmt: skip


def test_cli_trains_and_scores_a_judge(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from runtime.cli import main

    store = tmp_path / "rollouts.jsonl"
    store.write_bytes(b"".join(msgspec.json.encode(g) + b"\n" for g in _rollouts(40, seed=4)))
    out = tmp_path / "orm"
    args = ["orm", "train", "--rollouts", str(store), "--base", str(tiny_model), "--out", str(out)]
    assert main([*args, "--max-steps", "3"]) == 0
    printed = capsys.readouterr().out
    assert "3 steps" in printed and "held-out:" in printed and "precision" in printed
    assert main([*args, "--max-steps", "1"]) == 2  # the folder exists
    assert "exists" in capsys.readouterr().err
    assert main(["orm", "eval", "--model", str(out), "--rollouts", str(store)]) == 0
    assert "rollouts: 30 episodes" in capsys.readouterr().out  # 10 of 40 were errors
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nonsense\n")
    assert main(["orm", "eval", "--model", str(out), "--rollouts", str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    assert main(["orm", "eval", "--model", str(tmp_path), "--rollouts", str(store)]) == 2


@pytest.mark.browser
def test_eval_judges_its_episodes_with_the_orm(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`webagent eval --orm DIR`: the judge's verdicts on the evaluation's own episodes
    (the oracle's, on real Chromium: all successes), against the evaluators."""
    import json

    from runtime.cli import main

    store = tmp_path / "rollouts.jsonl"
    store.write_bytes(b"".join(msgspec.json.encode(g) + b"\n" for g in _rollouts(40, seed=5)))
    judge = tmp_path / "orm"
    train = ["orm", "train", "--rollouts", str(store), "--base", str(tiny_model)]
    assert main([*train, "--out", str(judge), "--max-steps", "1"]) == 0
    capsys.readouterr()
    out = tmp_path / "eval"
    args = ["eval", "--policy", "oracle", "--limit", "3", "--out", str(out)]
    assert main([*args, "--orm", str(tmp_path / "missing")]) == 2
    assert "--orm" in capsys.readouterr().err
    assert main([*args, "--orm", str(judge)]) == 0
    printed = capsys.readouterr().out
    assert "orm judge: 3 episodes (3 successes)" in printed
    scores = json.loads((out / "orm.json").read_text())
    assert scores["examples"] == 3 and scores["positives"] == 3
    assert scores["judge"] == str(judge)
    assert scores["accuracy"] == scores["recall"]  # every episode is a success
