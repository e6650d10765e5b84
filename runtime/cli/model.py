"""`webagent model init`: make the embedded default's tiny model locally."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from runtime.errors import UsageError


def register(sub: Any) -> None:
    parser = sub.add_parser("model", help="make the policy model")
    cmds = parser.add_subparsers(title="model commands", metavar="ACTION", required=True)

    init = cmds.add_parser(
        "init",
        help="make a tiny Qwen2 model and a BPE tokenizer trained on the built-in sites",
        description=(
            "Make a tiny Qwen2 model (random weights from --seed) and a byte-level BPE "
            "tokenizer with a ChatML template, trained on the system prompt, DSL examples "
            "and the built-in sites' pages and task intents; saved so that vLLM serves it "
            "and transformers loads it. Deterministic for a seed."
        ),
    )
    init.add_argument("--out", required=True, metavar="DIR", help="folder to create")
    init.add_argument("--seed", type=int, default=0, help="seed of the weights and the corpus")
    init.add_argument("--force", action="store_true", help="replace DIR if it exists")
    init.add_argument(
        "--induction-heads",
        type=int,
        default=None,
        metavar="N",
        help="key-value heads per layer set as a look-up-and-copy (induction) circuit, kept "
        "frozen in BC (policy.induction; default: the recipe's)",
    )
    init.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    import msgspec

    from policy.tiny import TinyModelSpec
    from runtime.modelinit import init_tiny_model

    out = Path(args.out)
    if out.exists() and not args.force:
        raise UsageError(f"{out} exists; pass --force to replace it")
    spec = TinyModelSpec()
    if args.induction_heads is not None:
        if not 0 <= args.induction_heads <= spec.num_kv_heads:
            raise UsageError(
                f"--induction-heads {args.induction_heads}: the tiny model has "
                f"{spec.num_kv_heads} key-value heads a layer (0 to {spec.num_kv_heads})"
            )
        spec = msgspec.structs.replace(spec, induction_heads=args.induction_heads)
    started = time.monotonic()
    info = anyio.run(lambda: init_tiny_model(out, seed=args.seed, spec=spec, overwrite=args.force))
    print(
        f"made {out}: Qwen2 {info.spec.num_layers} layers x {info.spec.hidden_size}, "
        f"{info.parameters / 1e6:.2f}M parameters, vocabulary {info.vocab_size}, "
        f"seed {info.seed}, {info.spec.induction_heads} induction heads "
        f"({time.monotonic() - started:.1f} s)",
        file=sys.stdout,
    )
    return 0
