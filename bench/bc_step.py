"""BC step time under variants, side by side on the same minibatches.

    .venv/bin/python -m bench.bc_step --model DIR --demos FILE
        [--variants 4096,1024,1024+compile] [--pairs 9] [--batch-size 4]
        [--warmup-steps 3] [--out bench/out]

A variant is a micro-batch budget (`bc.micro_batch_tokens`: padded tokens a forward and
backward hold at once; rows of one micro-batch are left-padded to its longest), optionally
`+compile` (`torch.compile(model, dynamic=True)` of the same modules, so every variant
trains the same weights). One process, one model (`policy.model`'s settled profile: its
system prompt, LoRA on `learner.lora_layers`), one optimizer at learning rate 0, so each
minibatch meets the same weights in every variant. A compiled variant first runs
`--warmup-steps` BC steps (`learner.bc.bc_step`, float32) on their own minibatches: their
time less what they take compiled is what compiling costs a run before it pays. Then each
of `--pairs` fresh minibatches of the demonstrations' turns is stepped by every variant,
the order rotating from one minibatch to the next; the table gives each variant's median
step, the median of its per-minibatch ratios to the first variant, and the steps 15
minutes of BC would take: (900 s - compile overhead) / median step.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import LoadSampler, finish, load_note, median


class Variant(NamedTuple):
    budget: int
    compiled: bool

    @property
    def name(self) -> str:
        return f"{self.budget}{' + compile' if self.compiled else ''}"


def parse_variants(text: str) -> list[Variant]:
    """Parse "4096,1024+compile": [Variant(4096, False), Variant(1024, True)]."""
    variants = []
    for item in text.split(","):
        budget, _, flag = item.strip().partition("+")
        if flag not in ("", "compile") or not budget.isdigit() or int(budget) < 1:
            raise ValueError(f"variant {item!r}: want BUDGET or BUDGET+compile, BUDGET >= 1")
        variants.append(Variant(int(budget), flag == "compile"))
    if not variants or len(set(variants)) != len(variants):
        raise ValueError(f"variants {text!r}: want one or more distinct ones")
    return variants


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder")
    parser.add_argument("--demos", required=True, help="a demonstrations file (webagent demos)")
    parser.add_argument("--variants", default="4096,1024", help="BUDGET[+compile],...")
    parser.add_argument("--pairs", type=int, default=9, help="minibatches each variant steps")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args(argv)
    try:
        variants = parse_variants(args.variants)
    except ValueError as exc:
        parser.error(str(exc))

    import msgspec
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
    compiling = any(v.compiled for v in variants)
    warmup = args.warmup_steps if compiling else 0
    needed = (warmup + args.pairs) * size
    if len(examples) < needed:
        parser.error(f"{args.demos} has {len(examples)} turns; {needed} are needed")
    batches = [examples[i * size : (i + 1) * size] for i in range(needed // size)]

    base = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model: Any = attach_lora(base, config.learner)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)
    pad = model.config.pad_token_id
    pad_id = int(pad) if isinstance(pad, int) else 0
    compiled = torch.compile(model, dynamic=True) if compiling else None

    def step(variant: Variant, batch: Any) -> tuple[float, int]:
        cfg = msgspec.structs.replace(config.bc, micro_batch_tokens=variant.budget)
        m = compiled if variant.compiled else model
        tick = time.monotonic()
        _, tokens = bc_step(m, optimizer, batch, cfg, pad_id=pad_id, device="cpu")
        return time.monotonic() - tick, tokens

    first_compiled = next((v for v in variants if v.compiled), None)
    times: dict[Variant, list[float]] = {v: [] for v in variants}
    tokens: list[int] = []
    with LoadSampler(interval_s=5.0) as load:
        warm = [step(first_compiled, b)[0] for b in batches[:warmup]] if first_compiled else []
        for i, batch in enumerate(batches[warmup:]):
            order = variants[i % len(variants) :] + variants[: i % len(variants)]
            for variant in order:
                seconds, n = step(variant, batch)
                times[variant].append(seconds)
            tokens.append(n)
    # Compiling costs its warm-up steps less what they would have taken compiled.
    overhead = sum(warm) - warmup * median(times[first_compiled]) if first_compiled else 0.0
    budget = 900.0
    reference = times[variants[0]]
    rows = []
    for variant in variants:
        spent = overhead if variant.compiled else 0.0
        ratio = median([r / t for r, t in zip(reference, times[variant], strict=True)])
        rows.append([
            variant.name, f"{median(times[variant]):.2f}",
            f"{median(tokens) / median(times[variant]):.0f}", f"{ratio:.2f}", f"{spent:.0f}",
            f"{(budget - spent) / median(times[variant]):.0f}",
        ])  # fmt: skip
    table = {
        "title": f"BC steps of {size} turns, {Path(args.model).name}, float32",
        "headers": ["micro-batch budget", "step s (median)", "tokens/s",
                    f"speed-up over {variants[0].name}", "compile s", "steps in 15 min"],
        "rows": rows,
    }  # fmt: skip
    notes = [
        f"{args.pairs} minibatches, each stepped by every variant in rotating order; "
        f"median {median(tokens)} tokens a step (padding excluded)",
        load_note(load),
    ]
    if first_compiled:
        notes.insert(1, f"compiled warm-up: {warmup} steps in {sum(warm):.0f} s")
    result = {
        "variants": [v.name for v in variants],
        "step_s": {v.name: times[v] for v in variants},
        "warmup_s": warm,
        "tokens": tokens,
    }
    finish(args.out, "bc_step", result, table=table, notes=notes, load=load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
