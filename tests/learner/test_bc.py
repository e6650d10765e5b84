"""Behaviour cloning: rendering like rollouts, accuracy, the checkpoint, the CLI."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from learner.batch import think_mask
from learner.bc import (
    BCExample,
    another_step_fits,
    behaviour_clone,
    budget_progress,
    demo_examples,
    first_eval_estimate_s,
    periodic_eval_fits,
    read_demos,
    schedule_factor,
    split_heldout,
)
from learner.bc_scoring import teacher_forced_scores
from learner.demos import reply_ids
from learner.errors import DemonstrationError
from policy.profile import TINY_PROMPT_LOSS
from policy.prompt import PromptRenderer
from runtime.base.config import BCConfig, LearnerConfig
from runtime.base.messages import encode
from runtime.cli import main


def write_store(path: Path, groups: list[Any]) -> Path:
    path.write_bytes(b"".join(encode(g) + b"\n" for g in groups))
    return path


def test_examples_are_rendered_exactly_as_rollouts_render_them(
    command_task: Any, command_model_dir: Path
) -> None:
    renderer = PromptRenderer.from_model(command_model_dir)
    groups = command_task.demos(2, 0.5, seed=1)

    def decode(ids: Any) -> str:
        return renderer.decode(ids, skip_special_tokens=False)

    examples = demo_examples(groups, renderer, system_prompt=command_task.SYSTEM)
    assert len(examples) == 4 * 2 * 2
    eos = renderer.eos_token_id
    assert eos is not None
    for ex in examples:
        traj = next(t for g in groups for t in g.trajectories if t.episode_id == ex.episode_id)
        history = [t.text for t in traj.turns[: ex.turn]]
        command = traj.intent.removeprefix("Command ")
        messages = command_task.messages(command, history, ex.turn)
        assert list(ex.prompt_ids) == renderer.render(messages)
        text = traj.turns[ex.turn].text
        # the thought and the answer encoded apart (learner.demos.reply_ids), the text kept
        assert list(ex.completion_ids) == [*reply_ids(renderer, text), eos]
        assert renderer.decode(ex.completion_ids[:-1], skip_special_tokens=False) == text
        # scored: the tokens outside the thought (here ">ok" straddles the tag, so it
        # stays scored: see learner.batch.think_mask), the end token included
        assert ex.action_mask == tuple(think_mask(ex.completion_ids, decode))
        assert ex.action_mask[-1]


def test_heldout_split_is_by_task() -> None:
    from learner.bc import BCExample

    examples = [
        BCExample(t, f"e{t}-{i}", 0, (1,), (2,), (True,)) for t in range(10) for i in range(3)
    ]
    train, held = split_heldout(examples, 0.2, seed=0)
    assert len(held) == 6 and len(train) == 24
    assert not {e.task_id for e in train} & {e.task_id for e in held}
    assert split_heldout(examples, 0.0, seed=0) == (examples, [])
    one_task = examples[:3]
    assert split_heldout(one_task, 0.5, seed=0) == (one_task, [])  # never hold out everything


def test_demo_files_are_checked(tmp_path: Path, command_task: Any) -> None:
    groups = command_task.demos(1, 1.0, seed=0)
    path = write_store(tmp_path / "demos.jsonl", groups)
    with path.open("ab") as f:
        f.write(b'{"group_id": "torn')  # a crash in the middle of an append
    assert [g.group_id for g in read_demos(path)] == [g.group_id for g in groups]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(encode(groups[0]) + b"\n" + b'{"group_id": 3}\n')
    with pytest.raises(DemonstrationError, match=r"bad\.jsonl:2: not a trajectory group"):
        read_demos(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(DemonstrationError, match="no demonstrations"):
        read_demos(empty)
    with pytest.raises(DemonstrationError, match="cannot read"):
        read_demos(tmp_path / "missing.jsonl")


def test_a_template_that_does_not_end_turns_with_eos_is_refused(
    tmp_path: Path, command_task: Any, command_model_dir: Path
) -> None:
    odd = tmp_path / "odd"
    odd.mkdir()
    shutil.copy(command_model_dir / "tokenizer.json", odd)
    config = json.loads((command_model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace(
        "message['content'] + '<|im_end|>'", "message['content'] + '<|endoftext|>'"
    )
    (odd / "tokenizer_config.json").write_text(json.dumps(config))
    renderer = PromptRenderer.from_model(odd)
    with pytest.raises(DemonstrationError, match="end token"):
        demo_examples(command_task.demos(1, 1.0, 0), renderer, system_prompt=command_task.SYSTEM)


class _NextTokenModel:
    """Predicts the next input token (teacher forcing) except that it never predicts
    `miss`: the argmax is right at every position but those where `miss` comes next."""

    def __init__(self, vocab: int, miss: int) -> None:
        self.vocab, self.miss = vocab, miss

    def eval(self) -> _NextTokenModel:
        return self

    def __call__(self, *, input_ids: Any, logits_to_keep: int, **_: Any) -> Any:
        import torch

        following = torch.roll(input_ids, -1, dims=1)
        following[following == self.miss] = 0
        logits = torch.nn.functional.one_hot(following, self.vocab).float()
        return type("Out", (), {"logits": logits[:, -logits_to_keep:, :]})


def test_whole_turn_accuracy_counts_the_thought_action_accuracy_does_not() -> None:
    def turn(episode: str, index: int, completion: tuple[int, ...]) -> BCExample:
        # completion: <think> 5 6 </think> action action end; the action mask spares 5 6
        mask = (True, False, False, True, True, True, True)
        return BCExample(1, episode, index, (1, 2, 3), completion, mask)

    examples = [
        turn("a", 0, (4, 5, 6, 7, 8, 8, 9)),  # all right
        turn("a", 1, (4, 5, 13, 7, 8, 8, 9)),  # thought token 13 missed: action still right
        turn("b", 0, (4, 5, 6, 7, 8, 13, 9)),  # action token 13 missed
        turn("c", 0, (4, 5, 6, 7, 8, 8, 9)),  # all right
    ]
    scores = teacher_forced_scores(
        _NextTokenModel(16, miss=13), examples, 8192, pad_id=0, device="cpu"
    )
    assert scores.turns == 3 / 4 and scores.whole_turns == 2 / 4
    assert scores.episodes == 2 / 3 and scores.whole_episodes == 1 / 3
    # NLL per reply token: the one-hot logits give log(e + 15) - 1 where right, log(e + 15)
    # at the 2 misses, over 4 x 7 tokens (the prompts not counted)
    assert scores.loss == pytest.approx((28 * math.log(math.e + 15) - 26) / 28)

    # micro-batches sort samples longest first: episode scores must follow the samples,
    # not the input order (b's longer prompt puts it first; a's two misses stay in a)
    miss = (4, 5, 6, 7, 8, 13, 9)
    right = (4, 5, 6, 7, 8, 8, 9)
    reordered = [
        turn("a", 0, miss),
        turn("a", 1, miss),
        BCExample(1, "b", 0, (1, 2, 3, 3, 3), right, (True, False, False, True, True, True, True)),
        turn("c", 0, right),
    ]
    scores = teacher_forced_scores(
        _NextTokenModel(16, miss=13), reordered, 8192, pad_id=0, device="cpu"
    )
    assert scores.turns == 2 / 4 and scores.episodes == 2 / 3
    assert scores.whole_episodes == 2 / 3


def test_bc_learns_the_demonstrated_behaviour(command_bc: tuple[Path, Any]) -> None:
    out, report = command_bc
    print(
        f"BC: {report.steps} steps in {report.wall_s:.1f} s ({report.tokens_per_s:.0f} tok/s); "
        f"action accuracy train {report.train_accuracy:.2f}, "
        f"held-out {report.heldout_accuracy:.2f}"
    )
    assert (report.mode, report.steps, report.stop_reason) == ("full", 200, "max_steps")
    assert report.heldout_examples == 64 * 2 and report.train_examples == 3 * 64 * 2
    # the argmax action is the demonstrations' majority (right) action: ~70% of noisy
    # demonstrated turns; an untrained model scores 0
    assert [h.step for h in report.history] == [100, 200]
    assert 0.55 <= report.train_accuracy <= 0.85
    assert 0.55 <= report.heldout_accuracy <= 0.85
    assert report.history[-1].loss < 0.2
    # a full model folder that transformers (and vLLM) load, with its tokenizer
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert json.loads((out / "bc.json").read_text())["steps"] == 200
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out)
    assert PromptRenderer.from_model(out).eos_token_id is not None


def test_bc_needs_a_bound_and_a_free_target(
    tmp_path: Path, command_task: Any, command_model_dir: Path
) -> None:
    from learner.errors import LearnerError

    with pytest.raises(LearnerError, match="needs a bound"):
        behaviour_clone(
            command_task.demos(1, 1.0, 0),
            base_model=command_model_dir,
            out=tmp_path / "x",
            config=BCConfig(max_steps=0, max_minutes=0, prompt_loss=TINY_PROMPT_LOSS),
            system_prompt=command_task.SYSTEM,
        )
    (tmp_path / "taken").mkdir()
    with pytest.raises(LearnerError, match="exists"):
        behaviour_clone(
            command_task.demos(1, 1.0, 0), base_model=command_model_dir, out=tmp_path / "taken",
            config=BCConfig(prompt_loss=TINY_PROMPT_LOSS), system_prompt=command_task.SYSTEM,
        )  # fmt: skip


def test_the_minutes_budget_holds_the_final_evaluation() -> None:
    """The first run on an Ice Lake Xeon: an evaluation ended at 898.7 s of 900, then one
    more 15 s step and a second 108 s evaluation ran the stage 2 minutes over. The step
    after that evaluation no longer fits, and a step fits only while the final evaluation
    after it does too."""
    fits = another_step_fits
    assert not fits(elapsed_s=898.7, budget_s=900, step_s=15.0, final_eval_s=108.0)
    assert fits(elapsed_s=777.0, budget_s=900, step_s=15.0, final_eval_s=108.0)
    assert not fits(elapsed_s=778.0, budget_s=900, step_s=15.0, final_eval_s=108.0)
    # Before any evaluation its cost is estimated from the steps, from above: the Ice Lake
    # first run at b03c851 took 10.1 s a step of 4 turns, then 122 s to score 98 turns.
    first = first_eval_estimate_s(step_s=10.1, batch_size=4, eval_turns=98)
    assert 122.0 <= first <= 200.0
    assert fits(elapsed_s=700.0, budget_s=900, step_s=10.1, final_eval_s=first)
    assert not fits(elapsed_s=800.0, budget_s=900, step_s=10.1, final_eval_s=first)


def test_a_periodic_evaluation_runs_only_with_a_period_left_before_the_final_one() -> None:
    """The Ice Lake first run at 1cec4d9: step 100 came 688 s in (6.9 s a step), its
    evaluation took 120 s, and BC ended there with ~90 s unused. Skipped, those steps train;
    earlier in a budget a periodic evaluation still runs."""
    due = periodic_eval_fits
    assert not due(elapsed_s=688.0, budget_s=900, step_s=6.9, eval_s=120.0, period_steps=100)
    assert due(elapsed_s=100.0, budget_s=900, step_s=3.0, eval_s=120.0, period_steps=100)
    # the boundary: a period of steps and two evaluations exactly fill the budget
    assert due(elapsed_s=60.0, budget_s=900, step_s=6.0, eval_s=120.0, period_steps=100)
    assert not due(elapsed_s=61.0, budget_s=900, step_s=6.0, eval_s=120.0, period_steps=100)


def test_the_cosine_schedule_ends_with_the_bound_that_ends_first() -> None:
    """`bc.schedule = "cosine"` decays by the share of the run's bound already used: steps
    of max_steps, or minutes of those max_minutes leave before the final evaluation."""

    def progress(step: int, max_steps: int, elapsed_s: float, budget_s: float) -> float:
        return budget_progress(
            step=step, max_steps=max_steps, elapsed_s=elapsed_s, budget_s=budget_s,
            final_eval_s=100.0 if budget_s else 0.0,
        )  # fmt: skip

    assert progress(25, 100, 0.0, 0.0) == 0.25
    # 900 s less a 100 s final evaluation: 400 s in is half way
    assert progress(3, 0, 400.0, 900.0) == 0.5
    # both bounds: the nearer end counts; past it, 1
    assert progress(90, 100, 400.0, 900.0) == 0.9
    assert progress(9, 0, 850.0, 900.0) == 1.0
    assert schedule_factor("cosine", 0.0) == 1.0
    assert schedule_factor("cosine", 0.5) == pytest.approx(0.5)
    assert schedule_factor("cosine", 1.0) == pytest.approx(0.0)
    assert schedule_factor("constant", 0.9) == 1.0


def test_a_stop_request_abandons_bc_and_writes_nothing(
    tmp_path: Path, command_task: Any, command_model_dir: Path
) -> None:
    from learner.errors import LearnerError

    steps: list[int] = []

    def should_stop() -> bool:  # asked before each step: stop before the fourth
        steps.append(1)
        return len(steps) > 3

    with pytest.raises(LearnerError, match="stopped at step 3"):
        behaviour_clone(
            command_task.demos(4, 1.0, 0),
            base_model=command_model_dir,
            out=tmp_path / "bc",
            config=BCConfig(
                max_steps=50, batch_size=4, eval_every_steps=100, prompt_loss=TINY_PROMPT_LOSS
            ),
            system_prompt=command_task.SYSTEM,
            should_stop=should_stop,
        )
    assert not (tmp_path / "bc").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary folder left either


def test_each_step_reports_its_progress(
    tmp_path: Path, command_task: Any, command_model_dir: Path
) -> None:
    """`on_step` sees every step in order, the held-out accuracy once evaluated, and the
    time left by `max_steps`; the bootstrap's line shows the same."""
    from learner.bc import BCProgress
    from runtime.bootstrap import BootstrapProgress

    seen: list[BCProgress] = []
    behaviour_clone(
        command_task.demos(4, 1.0, 0),
        base_model=command_model_dir,
        out=tmp_path / "bc",
        config=BCConfig(max_steps=4, max_minutes=0, batch_size=4, eval_every_steps=2,
                        eval_examples=4, prompt_loss=TINY_PROMPT_LOSS, learning_rate=1e-3,
                        warmup_steps=2, schedule="cosine"),
        system_prompt=command_task.SYSTEM,
        on_step=seen.append,
    )  # fmt: skip
    assert [p.step for p in seen] == [1, 2, 3, 4]
    # warm-up over 2 steps times a cosine over the 4: 1/2 x 1, 2/2 x 0.854, 0.5, 0.146
    expected = [0.5, 0.8536, 0.5, 0.1464]
    assert [p.learning_rate for p in seen] == pytest.approx([1e-3 * f for f in expected], rel=1e-3)
    assert math.isnan(seen[0].heldout_accuracy) and math.isnan(seen[1].heldout_accuracy)
    assert not math.isnan(seen[2].heldout_accuracy)  # evaluated after step 2
    assert seen[-1].left_s == 0.0 and all(p.left_s is not None for p in seen)
    line = BootstrapProgress()
    line.enter("behaviour cloning")
    line.bc_step(seen[0])
    assert line.describe().startswith("behaviour cloning: step 1, loss ")
    assert "held-out turns right -" in line.describe() and "min left" in line.describe()
    line.enter("recording the oracle's demonstrations")
    line.demos(5, 20)
    assert line.describe().startswith("recording the oracle's demonstrations: 5/20 tasks, ")


def test_cli(
    tmp_path: Path,
    command_task: Any,
    command_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    demos = write_store(tmp_path / "demos.jsonl", command_task.demos(4, 1.0, seed=2))
    config = tmp_path / "bc.toml"
    config.write_text("[bc]\neval_examples = 8\nbatch_size = 4\nwarmup_steps = 1\n")
    out = tmp_path / "bc"
    args = ["bc", "--demos", str(demos), "--base", str(command_model_dir), "--out", str(out)]
    assert main([*args, "--config", str(config), "--max-steps", "3"]) == 0
    printed = capsys.readouterr().out
    assert "3 steps" in printed and "stopped by max_steps" in printed
    assert "held-out" in printed and "%" in printed
    assert (out / "model.safetensors").is_file()
    # bad input: exit 2 and a line that names the problem
    assert main([*args, "--max-steps", "1"]) == 2
    assert "exists" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nonsense\n")
    assert (
        main(
            [
                "bc",
                "--demos",
                str(bad),
                "--base",
                str(command_model_dir),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_stops_at_held_out_targets_and_lora_mode_merges(
    tmp_path: Path, command_task: Any, command_model_dir: Path
) -> None:
    demos = command_task.demos(4, 1.0, seed=3)
    small = BCConfig(
        max_steps=50, eval_every_steps=2, batch_size=4, warmup_steps=1, eval_examples=4,
        heldout_fraction=0.25, prompt_loss=TINY_PROMPT_LOSS,
    )  # fmt: skip
    seen: list[Any] = []

    def success(model: Any) -> float:
        seen.append(model)
        return 0.25 * len(seen)

    report = behaviour_clone(
        demos,
        base_model=command_model_dir,
        out=tmp_path / "s",
        config=msgspec.structs.replace(small, target_success=0.5),
        system_prompt=command_task.SYSTEM,
        evaluate_success=success,
    )
    assert (report.steps, report.stop_reason, report.heldout_success) == (4, "target_success", 0.5)
    assert [h.heldout_success for h in report.history] == [0.25, 0.5]

    report = behaviour_clone(
        demos,
        base_model=command_model_dir,
        out=tmp_path / "a",
        config=msgspec.structs.replace(small, max_steps=400, target_accuracy=0.5),
        system_prompt=command_task.SYSTEM,
    )
    assert report.stop_reason == "target_accuracy" and report.steps < 400
    assert report.history[-1].heldout_accuracy >= 0.5
    assert all(h.heldout_accuracy < 0.5 for h in report.history[:-1])

    report = behaviour_clone(
        demos,
        base_model=command_model_dir,
        out=tmp_path / "l",
        config=msgspec.structs.replace(small, max_steps=2, mode="lora"),
        lora=LearnerConfig(lora_rank=4, lora_alpha=8),
        system_prompt=command_task.SYSTEM,
    )
    assert report.mode == "lora" and report.trainable_parameters < report.parameters / 2
    from safetensors import safe_open

    with safe_open(str(tmp_path / "l" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and not any("lora" in k for k in keys)  # merged into a plain model


def test_a_snapshot_is_the_model_as_it_was_at_its_minute(
    tmp_path: Path, command_task: Any, command_model_dir: Path
) -> None:
    """A snapshot due before the first step is the untrained model (LoRA B is zero, so its
    merged weights are the base's), while the final model has moved; both are listed."""
    import torch
    from safetensors.torch import load_file

    config = BCConfig(
        max_steps=3, max_minutes=0, batch_size=4, warmup_steps=1, eval_examples=4,
        eval_every_steps=100, mode="lora", snapshot_minutes=(1e-9,), prompt_loss=TINY_PROMPT_LOSS,
    )  # fmt: skip
    report = behaviour_clone(
        command_task.demos(4, 1.0, seed=3),
        base_model=command_model_dir,
        out=tmp_path / "bc",
        config=config,
        lora=LearnerConfig(lora_rank=4, lora_alpha=8),
        system_prompt=command_task.SYSTEM,
    )
    snap = tmp_path / "bc-1e-09m"
    assert report.snapshots == [str(snap)] and report.steps == 3
    early = msgspec.json.decode((snap / "bc.json").read_bytes())
    assert (early["steps"], early["stop_reason"], early["snapshots"]) == (0, "snapshot 1e-09m", [])
    base = load_file(str(command_model_dir / "model.safetensors"))
    at_zero = load_file(str(snap / "model.safetensors"))
    final = load_file(str(tmp_path / "bc" / "model.safetensors"))
    assert set(at_zero) == set(final) and not any("lora" in k for k in at_zero)
    shared = [k for k in at_zero if k in base]
    assert shared and all(torch.equal(at_zero[k], base[k]) for k in shared)
    assert any(not torch.equal(final[k], base[k]) for k in shared)


def test_prompt_loss_scores_every_prompt_token_of_left_padded_rows(
    command_model_dir: Path,
) -> None:
    """`bc.prompt_loss`'s sum equals each example's own prompt log-likelihood, computed
    alone without padding; its completion log-probs equal the plain forward's."""
    import torch
    from transformers import AutoModelForCausalLM

    from learner.batch import collate
    from learner.bc_scoring import bc_samples, completion_logits, prompt_logprob_sum
    from learner.loss import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(command_model_dir, dtype=torch.float32).eval()
    examples = [
        BCExample(1, "a", 0, (5, 9, 14, 3, 8, 21), (7, 4, 2), (True, True, True)),
        BCExample(2, "b", 0, (11, 6, 9), (7, 30, 31, 4, 2), (True,) * 5),
    ]
    samples = bc_samples(examples, scoring=True)
    mb = collate(samples, pad_id=0)
    with torch.no_grad():
        completion, prompt_sum = prompt_logprob_sum(model, mb, [3, 5])
        plain = token_logprobs(completion_logits(model, mb), mb.targets)
        expected = 0.0
        for e in examples:
            ids = torch.tensor([list(e.prompt_ids + e.completion_ids)])
            logp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])
            expected += float(logp[0, : len(e.prompt_ids) - 1].sum())
    assert torch.allclose(completion * (mb.weights > 0), plain * (mb.weights > 0), atol=1e-5)
    assert float(prompt_sum) == pytest.approx(expected, abs=1e-3)


def test_prompt_loss_teaches_the_pages_too(
    tmp_path: Path, command_task: Any, command_model_dir: Path
) -> None:
    """With `prompt_loss` the prompts' likelihood rises much more than without it."""
    import torch
    from transformers import AutoModelForCausalLM

    from learner.batch import collate
    from learner.bc import bc_samples, prompt_logprob_sum

    demos = command_task.demos(2, 1.0, seed=1)
    renderer = PromptRenderer.from_model(command_model_dir)
    examples = demo_examples(demos, renderer, system_prompt=command_task.SYSTEM)[:8]
    mb = collate(bc_samples(examples, scoring=True), pad_id=0)
    completions = [len(e.completion_ids) for e in examples]

    def prompt_logp(folder: Path) -> float:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            return float(prompt_logprob_sum(model, mb, completions)[1])

    start = prompt_logp(command_model_dir)
    ends = {}
    for weight in (0.0, 1.0):
        behaviour_clone(
            demos, base_model=command_model_dir, out=tmp_path / f"bc{weight:g}",
            config=BCConfig(max_steps=8, batch_size=4, warmup_steps=1, eval_every_steps=100,
                            prompt_loss=weight),
            system_prompt=command_task.SYSTEM,
        )  # fmt: skip
        ends[weight] = prompt_logp(tmp_path / f"bc{weight:g}")
    assert ends[1.0] - start > 2 * (ends[0.0] - start) > 0, (start, ends)


def test_an_unsettled_prompt_loss_is_refused(
    tmp_path: Path, command_task: Any, command_model_dir: Path
) -> None:
    """BC reads a settled config: "auto" is the entry point's to decide (policy.profile)."""
    from learner.errors import LearnerError

    config = BCConfig(max_steps=1, batch_size=2, warmup_steps=1, eval_every_steps=100)
    assert config.prompt_loss == "auto"
    with pytest.raises(LearnerError, match=r"bc\.prompt_loss is 'auto'.*settle_auto"):
        behaviour_clone(
            command_task.demos(1, 1.0, seed=1),
            base_model=command_model_dir,
            out=tmp_path / "bc",
            config=config,
            system_prompt=command_task.SYSTEM,
        )
    assert not (tmp_path / "bc").exists()


@pytest.mark.anyio
async def test_the_first_run_trains_bc_in_a_process_of_its_own(
    tmp_path: Path, command_task: Any, command_model_dir: Path
) -> None:
    """runtime.bootstrap runs `webagent bc --json` as a child (on TCMalloc when installed):
    its progress comes back step by step, its log goes beside the checkpoint; a failing
    child is a TrainingError naming the cause; a cancelled one is killed, nothing written."""
    import anyio
    import psutil  # type: ignore[import-untyped]

    from learner.errors import TrainingError
    from runtime.base.config import Config, DaemonConfig, EndpointConfig
    from runtime.bootstrap import BootstrapPaths, behaviour_clone_process

    paths = BootstrapPaths(tmp_path / "data")
    paths.demos.parent.mkdir(parents=True)
    write_store(paths.demos, command_task.demos(4, 1.0, seed=2))
    shutil.copytree(command_model_dir, paths.base)
    small = BCConfig(max_steps=3, max_minutes=0, batch_size=4, warmup_steps=1, eval_examples=4)
    secret = "an-endpoint-token-only-the-daemon-needs-0123"
    config = Config(
        bc=small,
        daemon=DaemonConfig(data_dir=str(tmp_path / "data")),
        endpoint=EndpointConfig(token=secret),
    )
    seen: list[Any] = []
    summary = await behaviour_clone_process(config, paths, on_step=seen.append)
    assert [p.step for p in seen] == [1, 2, 3]
    assert summary["steps"] == 3 and summary["stop_reason"] == "max_steps"
    # the held-out reply NLL and whole-reply share cross the process boundary (NaN fails)
    loss, whole = summary["heldout_loss"], summary["heldout_whole_accuracy"]
    assert isinstance(loss, float) and isinstance(whole, float)
    assert loss > 0 and 0 <= whole <= 1
    assert (paths.bc / "model.safetensors").is_file() and (paths.bc / "bc.json").is_file()
    assert "bc.eval" in (paths.bc.parent / "bc.log").read_text()
    assert secret not in (paths.bc.parent / "bc-config.toml").read_text()

    shutil.rmtree(paths.bc)
    paths.demos.write_text("nonsense\n")
    with pytest.raises(TrainingError, match=r"code 2[\s\S]*train.jsonl:1"):
        await behaviour_clone_process(config, paths, on_step=seen.append)
    assert not paths.bc.exists()

    write_store(paths.demos, command_task.demos(4, 1.0, seed=2))
    slow = msgspec.structs.replace(config, bc=msgspec.structs.replace(small, max_steps=10_000))
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    async with anyio.create_task_group() as tg:

        def step(progress: Any) -> None:
            if progress.step == 2:
                tg.cancel_scope.cancel()

        tg.start_soon(lambda: behaviour_clone_process(slow, paths, on_step=step))
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert not paths.bc.exists()
    assert not [p for p in paths.bc.parent.iterdir() if p.name.startswith(".")]
