"""Training WebRL's outcome reward model: the base model, a LoRA of its own, taught to
answer Yes or No to `policy.orm`'s question from rollouts that an evaluator labelled.

Each evaluated trajectory is one example (`orm_examples`): the judge's prompt, and the
label's one token then the end token as the completion. BC's loop trains it
(`learner.bc.train_examples`, the held-out split by task), and the LoRA is written as an
adapter, not merged, so the policy's server can serve it beside the policy's. The judge
reads the first reply token only, so the labels' first tokens must differ ("Yes" and "No"
are one token each for SmolLM2); a model where they do not is a `LearnerError`.

`score_orm` is the verdict offline, on the torch model: the next-token logits after the
prompt, Yes against No (the served judge compares the same two probabilities), with
accuracy, precision and recall of Yes against the evaluators' labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learner.bc import BCExample, BCReport, split_heldout, train_examples
from learner.errors import LearnerError
from policy.orm import first_tokens, orm_example
from policy.prompt import PromptRenderer
from runtime.base.config import BCConfig, LearnerConfig
from runtime.base.messages import TrajectoryGroup

__all__ = [
    "OrmReport",
    "OrmScores",
    "label_ids",
    "load_judge",
    "orm_examples",
    "score_orm",
    "train_orm",
]


@dataclass(frozen=True)
class OrmScores:
    """The judge against the evaluators on some examples (Yes is the positive class)."""

    examples: int
    positives: int  # examples the evaluator scored a success
    accuracy: float
    precision: float  # of the judge's Yes, the share the evaluator agrees with (0 if none)
    recall: float  # of the evaluator's successes, the share the judge says Yes to


@dataclass(frozen=True)
class OrmReport:
    bc: BCReport
    train: OrmScores
    heldout: OrmScores


def label_ids(renderer: PromptRenderer) -> tuple[int, int]:
    """The first token ids of Yes and No (`policy.orm.first_tokens`), a `LearnerError`
    where they are the same token."""
    try:
        return first_tokens(renderer)
    except ValueError as exc:
        raise LearnerError(f"the judge cannot be read from one token: {exc}") from exc


def orm_examples(groups: Sequence[TrajectoryGroup], renderer: PromptRenderer) -> list[BCExample]:
    """One example per evaluated trajectory (infrastructure failures are left out)."""
    label_ids(renderer)
    if renderer.eos_token_id is None:
        raise LearnerError("the model's tokenizer has no end token")
    out = []
    for group in groups:
        for trajectory in group.trajectories:
            made = orm_example(trajectory)
            if made is None:
                continue
            messages, label = made
            reply = renderer.encode(label)
            out.append(
                BCExample(
                    task_id=trajectory.task_id,
                    episode_id=trajectory.episode_id,
                    turn=0,
                    prompt_ids=tuple(renderer.render(messages)),
                    completion_ids=(*reply, renderer.eos_token_id),
                    action_mask=(True,) + (False,) * len(reply),  # what the verdict reads
                )
            )
    return out


def score_orm(model: Any, examples: Sequence[BCExample], yes: int, no: int) -> OrmScores:
    """Yes against No at the first reply position for each example, one at a time."""
    import torch

    hits = said_yes = true_yes = both = 0
    with torch.no_grad():
        for example in examples:
            ids = torch.tensor([example.prompt_ids], device=model.device)
            logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1]
            judged = bool(logits[yes] > logits[no])
            truth = example.completion_ids[0] == yes
            hits += judged == truth
            said_yes += judged
            true_yes += truth
            both += judged and truth
    n = len(examples)
    return OrmScores(
        examples=n,
        positives=true_yes,
        accuracy=hits / n if n else 0.0,
        precision=both / said_yes if said_yes else 0.0,
        recall=both / true_yes if true_yes else 0.0,
    )


def train_orm(
    groups: Sequence[TrajectoryGroup],
    *,
    base_model: str | Path,
    out: str | Path,
    config: BCConfig,
    lora: LearnerConfig,
) -> OrmReport:
    """Train the judge's LoRA on labelled rollouts and write it to `out` (an adapter for a
    LoRA, the whole model for a model small enough to train fully)."""
    renderer = PromptRenderer.from_model(base_model)
    examples = orm_examples(groups, renderer)
    if len({e.completion_ids[0] for e in examples}) < 2:
        raise LearnerError(
            f"the judge needs both labels among the rollouts: {len(examples)} evaluated "
            "trajectories, all with one label"
        )
    yes, no = label_ids(renderer)
    train, held = split_heldout(examples, config.heldout_fraction, config.seed)
    final: dict[str, OrmScores] = {}

    def scores(model: Any) -> float:
        final["train"] = score_orm(model, train[: config.eval_examples], yes, no)
        final["heldout"] = score_orm(model, held, yes, no)
        return final["heldout"].accuracy

    report = train_examples(
        train, held, base_model=str(base_model), target=Path(out), config=config, lora=lora,
        evaluate_success=scores, merge=False,
    )  # fmt: skip
    return OrmReport(bc=report, train=final["train"], heldout=final["heldout"])


def load_judge(folder: str | Path) -> tuple[Any, PromptRenderer, tuple[int, int]]:
    """A judge `train_orm` wrote, for `score_orm`: (the torch model in eval mode, its
    renderer, the Yes and No token ids). An adapter is put on the base model it names."""
    import json

    from transformers import AutoModelForCausalLM

    path = Path(folder)
    adapter = path / "adapter_config.json"
    model: Any
    try:
        if adapter.is_file():
            from peft import PeftModel

            base = json.loads(adapter.read_text())["base_model_name_or_path"]
            model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), path)
        else:
            model = AutoModelForCausalLM.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        raise LearnerError(f"{path} is not a judge from `webagent orm train`: {exc}") from exc
    renderer = PromptRenderer.from_model(path)
    return model.eval(), renderer, label_ids(renderer)
