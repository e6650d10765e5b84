"""How fast the tiny model's copy circuit forms when the training signal is all copying (issue 8).

    .venv/bin/python -m bench.copyform [--steps 300] [--batch 32] [--lr 1e-3] [--seed 0]
                                       [--models fresh planted] [--out bench/out]

Behaviour cloning on the oracle's demonstrations does not teach the tiny model to copy in
30 minutes (`bench.errors`: a third of the test turns write a frequent training entity
instead of the task's). Here the tiny model (`bench.common.tiny_model`) is trained on one
synthetic task at a time, from the same initial weights, for `--steps` steps each, on fresh
sequences every step (so the training accuracy is held-out accuracy), as two models:
"fresh" (random weights) and "planted" (one key-value head of each layer set as an
induction circuit, `policy.induction`, and kept frozen as BC keeps it):

    repeat   a run of 32 random word tokens, then the same run again; targets: the second
             run after its first token (31 a sequence). The textbook induction task, but
             the copy always stands 32 positions back, so attending by position fits it.
    shifted  the same copy at a random distance: 0-40 tokens before the run, a run of
             8-40, 0-120 tokens between the two; only attending by content (an induction
             head: find the earlier occurrence of this token, copy what followed it) fits.
    lookup   8-14 page lines as compact observations write them (`link Kelby Socks [7]`,
             1-2 of the sites' words, ids 1-59), then `click Kelby Socks [7]` for four of
             them; targets: the id after the words (4 a sequence). The element look-up of
             a Click.
    id-first the same with the id before the words on the page (`link [7] Kelby Socks`),
             the other placement the issue asks to measure: the id can then be read into
             the words' positions as the page is read, a content match away from the query.

The table says after how many steps the targets were right half and 90% of the time (a
seeded batch scored every 25 steps), and the accuracy at the end. Prints the table last;
writes the JSON to `--out`.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import LoadSampler, finish, load_note, tiny_model
from policy.induction import freeze_induction
from policy.tiny import induction_heads

TASKS = ("repeat", "shifted", "lookup", "id-first")
MODELS = {"fresh": 0, "planted": 1}  # name -> key-value heads planted as an induction circuit
RUN = 32
IGNORE = -100  # torch's cross-entropy ignore_index: not a target

Example = tuple[list[int], list[int]]  # token ids, labels (IGNORE where not a target)


def site_words() -> list[str]:
    """Entity words of the built-in sites, in a fixed order."""
    from sites.builtin import words

    pools = (words.FIRST_NAMES, words.LAST_NAMES, words.BRANDS, words.ADJECTIVES, words.COLORS)
    return sorted({w for pool in pools for w in pool if w.isalpha()})


def repeat_sequence(rng: random.Random, pool: Sequence[int], gap: int = 0) -> Example:
    """A run of RUN tokens of `pool`, `gap` other tokens, the run again; the second run's
    tokens after its first are the targets."""
    run = [rng.choice(pool) for _ in range(RUN)]
    filler = [rng.choice(pool) for _ in range(gap)]
    ids = run + filler + run
    labels = [IGNORE] * (RUN + gap + 1) + run[1:]
    return ids, labels


def shifted_sequence(rng: random.Random, pool: Sequence[int]) -> Example:
    """`repeat_sequence` at a random distance: 0-40 tokens, a run of 8-40, 0-120 tokens, the
    run again; the second run's tokens after its first are the targets."""
    before = [rng.choice(pool) for _ in range(rng.randint(0, 40))]
    run = [rng.choice(pool) for _ in range(rng.randint(8, 40))]
    between = [rng.choice(pool) for _ in range(rng.randint(0, 120))]
    ids = before + run + between + run
    labels = [IGNORE] * (len(ids) - len(run) + 1) + run[1:]
    return ids, labels


def lookup_sequence(
    rng: random.Random,
    encode: Callable[[str], list[int]],
    words: Sequence[str],
    queries: int = 4,
    id_first: bool = False,
) -> Example:
    """Page lines `role K [id]` (`role [id] K` if `id_first`), then `click K [id]` for
    `queries` of them (at most all of them); the ids of the queries are the targets."""
    n = rng.randint(8, 14)
    keys: list[str] = []
    pool = list(words)
    while len(keys) < n:
        key = " ".join(rng.sample(pool, rng.randint(1, 2)))
        if key not in keys:
            keys.append(key)
    numbers = rng.sample(range(1, 60), n)
    lines = (f"[{i}] {k}" if id_first else f"{k} [{i}]" for k, i in zip(keys, numbers, strict=True))
    page = "".join(f"{rng.choice(('link', 'button'))} {line}\n" for line in lines)
    ids = encode(page)
    labels = [IGNORE] * len(ids)
    newline = encode("\n")
    for j in rng.sample(range(n), min(queries, n)):
        query = encode(f"click {keys[j]}")
        answer = encode(f" [{numbers[j]}]")
        ids += query + answer + newline
        labels += [IGNORE] * len(query) + answer + [IGNORE] * len(newline)
    return ids, labels


def _batch(examples: Sequence[Example]) -> tuple[Any, Any]:
    import torch

    width = max(len(ids) for ids, _ in examples)
    ids = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for row, (i, lab) in enumerate(examples):
        ids[row, : len(i)] = torch.tensor(i)
        labels[row, : len(lab)] = torch.tensor(lab)
    return ids, labels


def train(
    base: Path,
    make: Callable[[random.Random], Example],
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
) -> dict[str, Any]:
    """Train a fresh copy of `base` on sequences from `make` for `steps` steps; the curve."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if planted := induction_heads(base):
        freeze_induction(model, planted)  # as BC keeps it
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    probe_ids, probe_labels = _batch([make(random.Random(seed + 10_000 + k)) for k in range(batch)])
    curve: list[tuple[int, float, float]] = []  # step, wall s, accuracy on the probe batch
    tokens = 0
    started = time.monotonic()
    step = 0
    while True:
        if step % 25 == 0:
            with torch.no_grad():
                logits = model(input_ids=probe_ids).logits[:, :-1]
            targets = probe_labels[:, 1:]
            scored = targets != IGNORE
            right = (logits.argmax(-1) == targets) & scored
            curve.append(
                (step, time.monotonic() - started, right.sum().item() / scored.sum().item())
            )
        if step >= steps:
            break
        ids, labels = _batch([make(rng) for _ in range(batch)])
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 50)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        tokens += ids.numel()
        step += 1
    wall = time.monotonic() - started

    def first(level: float) -> int | None:
        return next((s for s, _, acc in curve if acc >= level), None)

    return {
        "steps": step,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "sequence_tokens": int(probe_ids.shape[1]),
        "targets_per_sequence": int((probe_labels != IGNORE).sum().item()) / batch,
        "steps_to_50": first(0.5),
        "steps_to_90": first(0.9),
        "final_accuracy": curve[-1][2],
        "curve": curve,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per task")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument(
        "--models", nargs="+", choices=MODELS, default=list(MODELS),
        help="fresh: random weights; planted: with the induction circuit (policy.induction)",
    )  # fmt: skip
    parser.add_argument("--out", default="bench/out")
    args = parser.parse_args(argv)

    from policy.prompt import PromptRenderer

    bases = {name: tiny_model(args.out, args.seed, heads) for name, heads in MODELS.items()}
    renderer = PromptRenderer.from_model(bases["fresh"])  # the same tokenizer in both
    words = site_words()
    pool = sorted({t for w in words for t in renderer.encode(f" {w}")})
    makers: dict[str, Callable[[random.Random], Example]] = {
        "repeat": lambda rng: repeat_sequence(rng, pool),
        "shifted": lambda rng: shifted_sequence(rng, pool),
        "lookup": lambda rng: lookup_sequence(rng, renderer.encode, words),
        "id-first": lambda rng: lookup_sequence(rng, renderer.encode, words, id_first=True),
    }
    results: dict[str, dict[str, Any]] = {}
    with LoadSampler(interval_s=5.0) as load:
        for task in args.tasks:
            for name in args.models:
                done = results[f"{task} ({name})"] = train(
                    bases[name],
                    makers[task],
                    steps=args.steps,
                    batch=args.batch,
                    lr=args.lr,
                    seed=args.seed,
                )
                print(f"{task} ({name}): {done['steps']} steps, final {done['final_accuracy']:.3f}")
    rows = [
        [
            task,
            r["sequence_tokens"],
            r["targets_per_sequence"],
            r["steps"],
            round(r["tokens_per_s"]),
            "-" if r["steps_to_50"] is None else r["steps_to_50"],
            "-" if r["steps_to_90"] is None else r["steps_to_90"],
            r["final_accuracy"],
        ]
        for task, r in results.items()
    ]
    table = {
        "title": f"Copy tasks alone, the tiny model fresh and planted, {args.steps} steps each "
        f"(batch {args.batch}, lr {args.lr:g})",
        "headers": [
            "task",
            "tokens/seq",
            "targets/seq",
            "steps",
            "tokens/s",
            "steps to 50%",
            "steps to 90%",
            "final acc",
        ],
        "rows": rows,
    }
    models = ", ".join(f"{name} {bases[name]}" for name in args.models)
    notes = [f"models: {models}; '-': not reached", load_note(load)]
    finish(
        args.out,
        "copyform",
        {"args": vars(args), "models": {k: str(v) for k, v in bases.items()}, "results": results},
        table=table,
        notes=notes,
        load=load,
    )


if __name__ == "__main__":
    main()
