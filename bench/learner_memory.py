"""Learner memory: peak resident memory and time of M-GRPO updates, one process a setting.

    .venv/bin/python -m bench.learner_memory [--model DIR] [--micro-batch-tokens 4096,1024]
                                             [--checkpointing off,on]
                                             [--allocators system,tcmalloc]
                                             [--threads 1] [--updates 2]
                                             [--batch-groups 4] [--group-size 4] [--turns 4]
                                             [--prompt-tokens 700] [--completion-tokens 40]
                                             [--out bench/out]

Every combination of `--micro-batch-tokens` (learner.micro_batch_tokens),
`--checkpointing` (learner.gradient_checkpointing) and `--allocators` (glibc's malloc or
TCMalloc preloaded, `policy.allocator`) runs in a fresh child process: it opens a
`learner.engine.Engine` on the model (LoRA, AdamW, the v0 checkpoint), notes its resident
memory, then runs `--updates` updates of the same batch (bench.learner's synthetic groups:
random ids, rewards half 1 and half 0) and reports its peak resident memory
(`ru_maxrss`) and the median update time. The peak is the learner's own: no second model
beside it (bench.learner holds two). Settings run one after another, so their times share
the machine's load; the table is in the order given.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from itertools import product
from pathlib import Path
from typing import Any

from bench.common import LoadSampler, finish, load_note, median, tiny_model
from bench.learner import make_groups
from policy.allocator import preload_env, resident_bytes

GiB = 1024**3


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One setting, in this process."""
    import torch
    from transformers import AutoConfig

    from learner.checkpoint import Ledger
    from learner.engine import Engine
    from runtime.base.config import LearnerConfig
    from runtime.logs import configure_logging

    configure_logging(level="warning")
    torch.set_num_threads(args.threads)
    model = Path(args.model)
    vocab = int(AutoConfig.from_pretrained(model).vocab_size)
    groups = make_groups(args, vocab)
    config = LearnerConfig(
        device="cpu", torch_threads=args.threads, batch_groups=args.batch_groups,
        keep_checkpoints=1, micro_batch_tokens=args.micro_batch_tokens,
        gradient_checkpointing=args.checkpointing == "on",
    )  # fmt: skip
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-learner-memory-") as tmp:
        engine = Engine(config, base_model=model, out_dir=tmp)
        engine.open()
        opened = resident_bytes()
        for _ in range(args.updates):
            began = time.perf_counter()
            result = engine.update(groups, Ledger())
            times.append(time.perf_counter() - began)
    return {
        "opened_bytes": opened,
        "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "update_s": times,
        "micro_batches": int(result.metrics["micro_batches"]),
        "tokens": int(result.metrics["tokens"]),
    }


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: the tiny model)")
    parser.add_argument("--micro-batch-tokens", default="4096,1024")
    parser.add_argument("--checkpointing", default="off,on")
    parser.add_argument("--allocators", default="system,tcmalloc")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--batch-groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=700)
    parser.add_argument("--completion-tokens", type=int, default=40)
    parser.add_argument("--out", default="bench/out", help="folder for the JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        vars(args).update(json.loads(args.child))
        print(json.dumps(child(args)))
        return
    model = Path(args.model) if args.model else tiny_model(args.out)
    settings = list(
        product(
            [int(x) for x in _csv(args.micro_batch_tokens)],
            _csv(args.checkpointing),
            _csv(args.allocators),
        )
    )
    results: list[dict[str, Any]] = []
    with LoadSampler(interval_s=2.0) as load:
        for tokens, checkpointing, allocator in settings:
            if checkpointing not in ("on", "off"):
                raise SystemExit(f"--checkpointing takes on and off, not {checkpointing!r}")
            setting = {
                "micro_batch_tokens": tokens, "checkpointing": checkpointing,
                "model": str(model),
            }  # fmt: skip
            env = preload_env(os.environ, "tcmalloc" if allocator == "tcmalloc" else "system")
            proc = subprocess.run(
                [sys.executable, "-m", "bench.learner_memory", "--child", json.dumps(setting),
                 *(argv if argv is not None else sys.argv[1:])],
                env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(f"setting {setting} failed:\n{proc.stderr[-3000:]}")
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row.update(setting, allocator=allocator)
            results.append(row)
            print(
                f"{tokens} tokens, checkpointing {checkpointing}, {allocator}: peak "
                f"{row['peak_bytes'] / GiB:.2f} GiB, update {median(row['update_s']):.1f} s",
                flush=True,
            )
    first = median(results[0]["update_s"])
    rows: list[list[object]] = [
        [
            r["micro_batch_tokens"], r["checkpointing"], r["allocator"], r["micro_batches"],
            r["opened_bytes"] / GiB, r["peak_bytes"] / GiB, median(r["update_s"]),
            median(r["update_s"]) / first,
        ]
        for r in results
    ]  # fmt: skip
    table = {
        "title": (
            f"learner memory: {model.name}, {results[0]['tokens']} trained tokens an update, "
            f"torch threads {args.threads}, median of {args.updates} updates"
        ),
        "headers": [
            "micro_batch_tokens", "checkpointing", "allocator", "micro-batches",
            "GiB after open", "peak GiB", "update s", "x first",
        ],
        "rows": rows,
    }  # fmt: skip
    finish(args.out, "learner_memory", {"settings": results}, table=table,
           notes=[load_note(load)], load=load)  # fmt: skip


if __name__ == "__main__":
    main()
