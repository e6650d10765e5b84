"""BC step time with and without torch.compile, side by side on the same minibatches.

    .venv/bin/python -m bench.bc_compile --model DIR --demos FILE [--pairs 9]
        [--batch-size 8] [--warmup-steps 3] [--out bench/out]

One process, one model (`policy.model`'s settled profile: its system prompt, LoRA on
`learner.lora_layers`), one optimizer. `torch.compile(model, dynamic=True)` wraps the same
modules, so both variants train the same weights. The compiled variant first runs
`--warmup-steps` BC steps (`learner.bc.bc_step`, float32) on their own minibatches: their
time is what compiling costs a run before it pays. Then each of `--pairs` fresh minibatches
of the demonstrations' turns is stepped eagerly and compiled, back to back, and the table
gives the median times and the median of the per-pair ratios. The last row estimates what
15 minutes of BC would do with each: steps = (900 s - compile overhead) / median step.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

from bench.common import LoadSampler, finish, load_note, median


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder")
    parser.add_argument("--demos", required=True, help="a demonstrations file (webagent demos)")
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from learner.bc import bc_step
    from learner.demos import demo_examples, read_demos
    from learner.lora import attach_lora
    from policy.profile import settle_auto
    from policy.prompt import PromptRenderer, system_prompt
    from runtime.base.config import Config

    config = settle_auto(Config(), args.model)
    renderer = PromptRenderer.from_model(args.model)
    examples = demo_examples(
        read_demos(args.demos), renderer, keep_thoughts=config.scheduler.keep_thoughts,
        system_prompt=system_prompt(config.policy.system_prompt),
    )  # fmt: skip
    random.Random(0).shuffle(examples)
    size = args.batch_size
    needed = (args.warmup_steps + args.pairs) * size
    if len(examples) < needed:
        parser.error(f"{args.demos} has {len(examples)} turns; {needed} are needed")
    batches = [examples[i * size : (i + 1) * size] for i in range(needed // size)]

    base = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model: Any = attach_lora(base, config.learner)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    pad = model.config.pad_token_id
    pad_id = int(pad) if isinstance(pad, int) else 0
    compiled = torch.compile(model, dynamic=True)

    def step(m: Any, batch: Any) -> tuple[float, int]:
        tick = time.monotonic()
        _, tokens = bc_step(m, optimizer, batch, config.bc, pad_id=pad_id, device="cpu")
        return time.monotonic() - tick, tokens

    with LoadSampler(interval_s=5.0) as load:
        warm = [step(compiled, b)[0] for b in batches[: args.warmup_steps]]
        eager: list[float] = []
        fast: list[float] = []
        ratios: list[float] = []
        tokens: list[int] = []
        for batch in batches[args.warmup_steps :]:
            e, n = step(model, batch)
            c, _ = step(compiled, batch)
            eager.append(e)
            fast.append(c)
            ratios.append(e / c)
            tokens.append(n)
    # Compiling costs its warm-up steps less what they would have taken compiled.
    overhead = sum(warm) - args.warmup_steps * median(fast)
    budget = 900.0
    rows = [
        ["eager", f"{median(eager):.2f}", f"{median(tokens) / median(eager):.0f}", "0",
         f"{budget / median(eager):.0f}"],
        ["torch.compile", f"{median(fast):.2f}", f"{median(tokens) / median(fast):.0f}",
         f"{overhead:.0f}", f"{(budget - overhead) / median(fast):.0f}"],
    ]  # fmt: skip
    table = {
        "title": f"BC steps of {size} turns, {Path(args.model).name}, float32",
        "headers": ["variant", "step s (median)", "tokens/s", "compile s", "steps in 15 min"],
        "rows": rows,
    }
    notes = [
        f"{args.pairs} pairs, each minibatch stepped eager then compiled; median ratio "
        f"{median(ratios):.2f} (eager / compiled); median {median(tokens)} tokens a step",
        f"compiled warm-up: {args.warmup_steps} steps in {sum(warm):.0f} s",
        load_note(load),
    ]
    result = {"eager_s": eager, "compiled_s": fast, "warmup_s": warm, "tokens": tokens}
    finish(args.out, "bc_compile", result, table=table, notes=notes, load=load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
