"""Free-running turn accuracy: the model writes its own thought after the demonstrated history.

    .venv/bin/python -m bench.freerun --model DIR --demos FILE [--turns 200]
        [--keep-thoughts | --no-keep-thoughts] [--dtype float32] [--out bench/out]

BC's own accuracy (`learner.bc`) is teacher-forced: the model is given the demonstrated
thought and scored on the action after it. Closed loop it writes the thought itself, and a
wrong thought leads to a wrong action. This benchmark sits between the two: for each turn
of the first demonstrations of `--demos` (shuffled with a fixed seed; the test split's,
`bench.recipe` caches them), the prompt the model would get after the demonstrated history
is rendered with its own chat template and profile, vLLM (offline, greedy) writes the reply,
and the action (the reply without its thought) is compared with the demonstrated one.
Accuracy by turn index and by action kind; prints the table last, writes the JSON.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.common import LoadSampler, finish, load_note
from policy.profile import model_profile
from policy.prompt import PromptRenderer, episode_messages, strip_thought, system_prompt
from runtime.actions import parse_completion
from runtime.base.config import SchedulerConfig
from runtime.errors import ParseError


def kind_of(reply: str) -> str:
    """The action's kind as the runtime parses it: "Click", "Type", ..., "exit",
    "go_backward", or "?" when the reply has no valid action."""
    try:
        action = parse_completion(reply).action
    except ParseError:
        return "?"
    return action.name if action.kind == "do" else action.kind


def turns_of(demos: Path, model: Path, turns: int, keep_thoughts: bool) -> list[dict[str, Any]]:
    """The first `turns` demonstrated turns (whole episodes, seeded order) with prompts."""
    from learner.demos import read_demos

    renderer = PromptRenderer.from_model(model)
    prompt = system_prompt(model_profile(model).system_prompt)
    groups = read_demos(demos)
    random.Random(0).shuffle(groups)
    out: list[dict[str, Any]] = []
    for group in groups:
        if len(out) >= turns:
            break
        traj = next((t for t in group.trajectories if t.reward > 0), None)
        if traj is None:
            continue
        sent = episode_messages(
            traj.intent, traj.turns, keep_thoughts=keep_thoughts, system_prompt=prompt
        )
        for turn, messages in zip(traj.turns, sent, strict=True):
            out.append(
                {
                    "task_id": traj.task_id,
                    "turn": turn.index,
                    "want": turn.text,
                    "prompt": renderer.render_text(messages, add_generation_prompt=True),
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model folder (a BC checkpoint)")
    parser.add_argument("--demos", required=True, help="demonstrations (trajectory store)")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--keep-thoughts", action=argparse.BooleanOptionalAction,
                        default=SchedulerConfig().keep_thoughts)  # fmt: skip
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-cache-gib", type=int, default=2)
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args(argv)
    model = Path(args.model)

    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    from vllm import LLM, SamplingParams

    items = turns_of(Path(args.demos), model, args.turns, args.keep_thoughts)
    with LoadSampler(interval_s=5.0) as load:
        llm = LLM(model=str(model), dtype=args.dtype, max_model_len=4096)
        started = time.monotonic()
        outputs = llm.generate(
            [i["prompt"] for i in items], SamplingParams(temperature=0.0, max_tokens=96)
        )
        seconds = time.monotonic() - started
    by_turn: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    replies = []
    for item, output in zip(items, outputs, strict=True):
        got = output.outputs[0].text
        action_right = strip_thought(got) == strip_thought(item["want"])
        whole_right = got.strip() == item["want"].strip()
        for counts, key in ((by_turn, str(min(item["turn"], 4))), (by_kind, kind_of(item["want"]))):
            row = counts[key]
            row[0] += 1
            row[1] += action_right
            row[2] += whole_right
        replies.append({"task_id": item["task_id"], "turn": item["turn"], "want": item["want"],
                        "got": got, "action_right": action_right})  # fmt: skip
    total = [sum(r[i] for r in by_turn.values()) for i in range(3)]
    rows: list[list[object]] = [
        ["all", total[0], f"{total[1] / total[0]:.3f}", f"{total[2] / total[0]:.3f}"]
    ]
    for name, counts in (("turn ", by_turn), ("", by_kind)):
        for key in sorted(counts):
            n, a, w = counts[key]
            label = f"{name}{key}{'+' if name and key == '4' else ''}"
            rows.append([label, n, f"{a / n:.3f}", f"{w / n:.3f}"])
    headers = ["turns", "n", "action right", "whole reply right"]
    notes = [
        f"model {model}; demonstrations {args.demos}; keep_thoughts={args.keep_thoughts}; "
        f"vLLM offline, greedy, dtype {args.dtype}: {seconds:.0f} s for {len(items)} turns",
        load_note(load),
    ]
    table = {"title": "Free-running turn accuracy", "headers": headers, "rows": rows}
    result = {"args": vars(args), "accuracy": total[1] / total[0], "replies": replies}
    finish(args.out, "freerun", result, table=table, notes=notes, load=load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
