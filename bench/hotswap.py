"""Adapter hot-swap under load: publish-to-serving latency and throughput around swaps.

    .venv/bin/python -m bench.hotswap [--model DIR | --url URL] [--concurrency 16]
                                      [--swaps 10] [--out bench/out]

16 workers (`--concurrency`) send greedy turns through `VLLMPolicy` back to back while
the adapter manager publishes `--swaps` new versions (LoRA adapters saved by the
learner's `save_adapter`, random B so that versions are distinguishable). Measured:

- publish latency: `AdapterManager.publish` from the call (manifest check, load,
  `/v1/models` check) until new requests are routed to the new version;
- first response: from the call until the first response served by the new version;
- requests/s and generated tokens/s before, during and after the swaps;
- failed requests, and mixed-version responses (a response whose tokens differ from the
  greedy reference of the version it was served by, computed one request at a time
  before the run).

Without `--model` or `--url` it makes the tiny model first (`webagent model init`). Prints
a table last and writes the figures as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import httpx

from policy.adapters import AdapterManager
from policy.client import CompletionClient, SamplingParams, VLLMPolicy
from policy.prompt import PromptRenderer, build_messages
from policy.server import VLLMServer
from runtime.base.config import LearnerConfig, PolicyConfig
from runtime.base.messages import PolicyRequest, TaskConfig
from runtime.logs import configure_logging

TASK = TaskConfig(task_id=0, intent="Find the price of the blue lamp", start_url="http://x/")


@dataclass
class Sample:
    start: float
    end: float
    adapter: str
    prompt: int
    tokens: int
    ok: bool
    matches: bool


def _requests(n: int) -> list[PolicyRequest]:
    out = []
    for i in range(n):
        page = f'<h1>Lamps {i}</h1>\n<a id="{i}">Blue lamp</a> $1{i}.99 <button id="9">Buy</button>'
        messages = build_messages(TASK.intent, [], page)
        out.append(PolicyRequest(episode_id=f"b{i}", turn=0, task=TASK, messages=messages))
    return out


def make_adapters(model: Path, root: Path, versions: int, b_std: float = 0.5) -> list[Path]:
    """v0 zero-initialised, v1.. with random B (normal, `b_std`): saved by the learner's
    own code path, on its default LoRA layers."""
    import torch
    from transformers import AutoModelForCausalLM

    from learner.lora import attach_lora, base_fingerprint, save_adapter

    config = LearnerConfig()
    fingerprint = base_fingerprint(model)
    folders = []
    for version in range(versions + 1):
        torch.manual_seed(version)
        peft_model = attach_lora(AutoModelForCausalLM.from_pretrained(model), config)
        if version:
            with torch.no_grad():
                for name, param in peft_model.named_parameters():
                    if "lora_B" in name:
                        param.normal_(0.0, b_std)
        folders.append(
            save_adapter(
                peft_model,
                root,
                version=version,
                base_model=str(model),
                fingerprint=fingerprint,
                step=version,
                config=config,
            )
        )
    return folders


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _references(
    client: CompletionClient,
    renderer: PromptRenderer,
    adapters: list[Path],
    requests: list[PolicyRequest],
    sampling: SamplingParams,
) -> dict[tuple[int, int], list[int]]:
    """Greedy tokens of every version on every prompt, one request at a time."""
    reference = {}
    for version, folder in enumerate(adapters):
        name = f"reference@v{version}"
        await client.load_adapter(name, str(folder))
        for i, request in enumerate(requests):
            out = await client.complete(
                renderer.render(request.messages), model=name, sampling=sampling
            )
            reference[version, i] = out.token_ids
        await client.unload_adapter(name)
    return reference


async def run(args: argparse.Namespace, model: Path, work: Path) -> dict[str, object]:
    adapters = await anyio.to_thread.run_sync(make_adapters, model, work / "adapters", args.swaps)
    renderer = PromptRenderer.from_model(model)
    requests = _requests(8)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    config = PolicyConfig(url=args.url, max_model_len=2048, max_loras=4)
    server = VLLMServer(config, model=str(model), log_path=Path(args.out) / "hotswap-vllm.log")
    async with server, httpx.AsyncClient() as http:
        client = CompletionClient(http, server.url)
        reference = await _references(client, renderer, adapters, requests, sampling)
        async with AdapterManager(client, staleness_window=1, max_loras=4) as manager:
            await manager.publish(adapters[0])
            policy = VLLMPolicy(
                client,
                renderer,
                manager,
                sampling=sampling,
                max_model_len=2048,
                max_concurrency=args.concurrency,
            )
            samples: list[Sample] = []
            stop = anyio.Event()

            async def worker(k: int) -> None:
                i = k
                while not stop.is_set():
                    idx = i % len(requests)
                    t0 = time.monotonic()
                    try:
                        reply = await policy.act(requests[idx])
                    except Exception:
                        samples.append(Sample(t0, time.monotonic(), "", idx, 0, False, False))
                    else:
                        ids = reply.completion_token_ids
                        same = ids == reference[reply.adapter_version, idx]
                        samples.append(
                            Sample(t0, time.monotonic(), reply.adapter, idx, len(ids), True, same)
                        )
                    i += 1

            swaps: list[dict[str, float]] = []
            async with anyio.create_task_group() as tg:
                for k in range(args.concurrency):
                    tg.start_soon(worker, k)
                t_begin = time.monotonic()
                await anyio.sleep(args.phase_s)
                t_during = time.monotonic()
                for folder in adapters[1:]:
                    started = time.monotonic()
                    swap = await manager.publish(folder)
                    swaps.append(
                        {"version": swap.version, "start": started, "publish_s": swap.latency_s}
                    )
                    await anyio.sleep(args.swap_interval_s)
                t_after = time.monotonic()
                await anyio.sleep(args.phase_s)
                stop.set()
            t_end = time.monotonic()
            stats = manager.statistics()

    for entry in swaps:
        name = f"policy@v{int(entry['version'])}"
        firsts = [s.end for s in samples if s.adapter == name and s.end >= entry["start"]]
        entry["first_response_s"] = min(firsts) - entry["start"] if firsts else float("nan")

    phases = {
        "before": (t_begin, t_during),
        "during": (t_during, t_after),
        "after": (t_after, t_end),
    }
    rows = {}
    for phase, (lo, hi) in phases.items():
        done = [s for s in samples if lo <= s.end < hi]
        seconds = hi - lo
        rows[phase] = {
            "seconds": seconds,
            "requests": len(done),
            "requests_per_s": len(done) / seconds,
            "tokens_per_s": sum(s.tokens for s in done) / seconds,
            "failed": sum(not s.ok for s in done),
            "mixed_version": sum(s.ok and not s.matches for s in done),
            "versions_served": len({s.adapter for s in done if s.ok}),
        }
    publish = [s["publish_s"] for s in swaps]
    first = [s["first_response_s"] for s in swaps]
    return {
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "swaps": len(swaps),
        "publish_s": {"median": statistics.median(publish), "p95": _pct(publish, 0.95)},
        "first_response_s": {"median": statistics.median(first), "p95": _pct(first, 0.95)},
        "phases": rows,
        "swap_log": swaps,
        "manager": {"resident_at_end": stats.resident, "swaps": stats.swaps},
        "total_failed": sum(not s.ok for s in samples),
        "total_mixed_version": sum(s.ok and not s.matches for s in samples),
        "samples": [asdict(s) for s in samples],
    }


def _table(result: dict[str, object]) -> str:
    phases = result["phases"]
    assert isinstance(phases, dict)
    lines = [
        f"{'phase':<8}{'seconds':>9}{'requests':>10}{'req/s':>8}{'tok/s':>8}"
        f"{'failed':>8}{'mixed':>7}{'versions':>10}"
    ]
    for phase, row in phases.items():
        lines.append(
            f"{phase:<8}{row['seconds']:>9.1f}{row['requests']:>10}{row['requests_per_s']:>8.1f}"
            f"{row['tokens_per_s']:>8.0f}{row['failed']:>8}{row['mixed_version']:>7}"
            f"{row['versions_served']:>10}"
        )
    pub, first = result["publish_s"], result["first_response_s"]
    assert isinstance(pub, dict) and isinstance(first, dict)
    lines.append(
        f"swaps {result['swaps']} at concurrency {result['concurrency']}: publish (call -> routed) "
        f"median {pub['median'] * 1000:.0f} ms, p95 {pub['p95'] * 1000:.0f} ms; "
        f"first response from the new version median {first['median'] * 1000:.0f} ms, "
        f"p95 {first['p95'] * 1000:.0f} ms"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: make the tiny model)")
    parser.add_argument("--url", default="", help="an already running vLLM server")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--swaps", type=int, default=10)
    parser.add_argument("--swap-interval-s", type=float, default=1.5)
    parser.add_argument("--phase-s", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", default="bench/out", help="folder for the JSON")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    configure_logging(level="warning")

    with tempfile.TemporaryDirectory(prefix="hotswap-") as tmp:
        work = Path(tmp)
        model = Path(args.model) if args.model else work / "tiny"
        if not args.model:
            from runtime.modelinit import init_tiny_model

            anyio.run(lambda: init_tiny_model(model, seed=0))
        result = anyio.run(run, args, model, work)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(args.out) / f"hotswap-{stamp}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    print(_table(result))


if __name__ == "__main__":
    main()
