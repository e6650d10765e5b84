"""Where a BC checkpoint's turns go wrong: greedy replies to demonstrated prompts.

    .venv/bin/python -m bench.errors --model DIR [--demos FILE] [--turns 400]
                                     [--seed 0] [--out bench/out]

For a seeded sample of whole episodes of `--demos` (default: the oracle's test split that
`bench.recipe` caches) holding about `--turns` turns, the checkpoint completes each turn's
prompt greedily; the prompt holds the demonstrated history, as under teacher forcing, so
every turn is judged on its own. Each reply lands in the first class that fits:

    same       the demonstrated thought and action
    thought    the demonstrated action, another thought
    unparsed   no valid action (the runtime's parser raises)
    command    another action kind or command (Type for Click, exit for do, ...)
    element    the demonstrated command on another element
    argument   command and element right, other text typed or another exit answer

The table splits the classes by the demonstrated action and tells, for the wrong actions,
how often the thought was wrong too: a wrong thought before a wrong action says the model
lost track of the plan or the entity, a right thought before a wrong action says it could
not find the element the thought names. Prints a table last; writes the JSON (with a few
examples of each class) to `--out`.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import LoadSampler, finish, load_note
from policy.prompt import episode_messages
from runtime.actions import parse_completion, thought_of
from runtime.base.messages import Action, ChatMessage
from runtime.errors import ParseError

CLASSES = ("same", "thought", "unparsed", "command", "element", "argument")


def classify(reply: str, demo_text: str, demo_action: Action) -> tuple[str, bool]:
    """(class, thought right) of a reply against the demonstrated turn."""
    thought_ok = thought_of(reply) == thought_of(demo_text)
    try:
        action = parse_completion(reply).action
    except ParseError:
        return "unparsed", thought_ok
    if (action.kind, action.name) != (demo_action.kind, demo_action.name):
        return "command", thought_ok
    if action.element != demo_action.element:
        return "element", thought_ok
    if _norm(action.argument) != _norm(demo_action.argument) or _norm(action.message) != _norm(
        demo_action.message
    ):
        return "argument", thought_ok
    return ("same" if thought_ok else "thought"), thought_ok


def _norm(text: str | None) -> str:
    return " ".join((text or "").split()).lower()


def demo_label(action: Action) -> str:
    """A demonstrated action's column: its command ("Click", "Type", ...) or "exit"."""
    return action.name if action.kind == "do" else action.kind


def _replies(
    model_dir: Path, prompts: Sequence[Sequence[int]], eos_id: int, max_new: int
) -> list[list[int]]:
    """Greedy completions of `prompts` by the model in `model_dir`, one prompt at a time."""
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    pad = model.config.pad_token_id
    pad_id = pad if isinstance(pad, int) else eos_id
    out = []
    with torch.no_grad():
        for ids in prompts:
            tensor = torch.tensor([list(ids)])
            generated = model.generate(
                tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=max_new,
                do_sample=False, eos_token_id=eos_id, pad_token_id=pad_id,
            )  # fmt: skip
            out.append(generated[0, tensor.shape[1] :].tolist())
    return out


class Case(NamedTuple):
    """One turn to reply to: its episode, prompt and demonstrated reply."""

    episode: str
    messages: list[ChatMessage]
    text: str
    action: Action


def demo_cases(demos: str, turns: int, seed: int, system_prompt: str) -> list[Case]:
    """The turns of a seeded sample of whole successful episodes of `demos` (~`turns`)."""
    from learner.demos import read_demos

    episodes = [t for g in read_demos(demos) for t in g.trajectories if t.reward > 0]
    random.Random(seed).shuffle(episodes)
    cases: list[Case] = []
    for traj in episodes:
        if len(cases) >= turns:
            break
        sent = episode_messages(traj.intent, traj.turns, system_prompt=system_prompt)
        for turn, messages in zip(traj.turns, sent, strict=True):
            assert turn.action is not None  # a successful demonstration's turns all acted
            cases.append(Case(traj.episode_id, messages, turn.text, turn.action))
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.errors", description=__doc__)
    parser.add_argument("--model", required=True, help="a BC checkpoint (a model folder)")
    parser.add_argument("--demos", default="bench/out/cache/demos-compact-test-0.jsonl")
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args(argv)

    from policy.profile import model_profile
    from policy.prompt import PromptRenderer
    from policy.prompt import system_prompt as named_prompt

    model_dir = Path(args.model)
    renderer = PromptRenderer.from_model(model_dir)
    eos_id = renderer.eos_token_id
    if eos_id is None:
        raise SystemExit(f"{model_dir}: the tokenizer has no eos_token")
    prompt_name = named_prompt(model_profile(model_dir).system_prompt)
    make_cases = demo_cases
    cases = make_cases(args.demos, args.turns, args.seed, prompt_name)
    prompts = [renderer.render(case.messages) for case in cases]
    started = time.monotonic()
    with LoadSampler(interval_s=5.0) as load:
        replies = [
            renderer.decode(ids) for ids in _replies(model_dir, prompts, eos_id, args.max_tokens)
        ]
    seconds = time.monotonic() - started

    counts: Counter[tuple[str, str]] = Counter()  # (class, column)
    wrong_thought: Counter[str] = Counter()  # class -> replies with the thought wrong too
    examples: dict[str, list[dict[str, str]]] = {c: [] for c in CLASSES}
    episode_ok: dict[str, bool] = {}
    for case, reply in zip(cases, replies, strict=True):
        cls, thought_ok = classify(reply, case.text, case.action)
        column = demo_label(case.action)
        counts[cls, column] += 1
        counts[cls, "all"] += 1
        wrong_thought[cls] += not thought_ok
        episode_ok[case.episode] = episode_ok.get(case.episode, True) and cls in (
            "same",
            "thought",
        )
        if len(examples[cls]) < 5:
            examples[cls].append({"demonstrated": case.text, "reply": reply})
    columns = ["all", *sorted({c for _, c in counts} - {"all"})]
    totals = {c: sum(counts[k, c] for k in CLASSES) for c in columns}
    headers = ["class", *[f"{c} (n={totals[c]})" for c in columns], "thought wrong too"]
    rows = [
        [cls, *[f"{counts[cls, c] / totals[c]:.1%}" if totals[c] else "-" for c in columns],
         f"{wrong_thought[cls]}/{counts[cls, 'all']}" if cls not in ("same", "thought") else "-"]
        for cls in CLASSES
    ]  # fmt: skip
    action_ok = sum(ok for ok in episode_ok.values())
    what = f"turns of {len(episode_ok)} test episodes"
    notes = [
        f"{len(cases)} {what}, greedy replies to the demonstrated prompts in {seconds:.0f} s; "
        f"{args.model}",
        f"episodes whose every action is right (thoughts aside): {action_ok}/{len(episode_ok)} "
        f"({action_ok / max(1, len(episode_ok)):.1%})",
        load_note(load),
    ]
    title = "Greedy replies of a BC checkpoint against the demonstrated turns (share of turns)"
    table = {"title": title, "headers": headers, "rows": rows}
    result = {"args": vars(args), "counts": {f"{k}|{c}": n for (k, c), n in counts.items()},
              "examples": examples}  # fmt: skip
    finish(args.out, "errors", result, table=table, notes=notes, load=load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
